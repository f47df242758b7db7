"""triaccel.optim.GradScaler: bf16 gradients (bf16 master weights beside fp16 layers) unscaled and
checked as torch's own CPU kernel does; torch's fused CUDA op has no bf16 kernel."""
import pytest
import torch

from conftest import DEVICES
from triaccel.optim import GradScaler

# where a bad value goes (parameter index, value); "mixed" holds fp32 and bf16 parameters side by
# side, as a trainer with bf16 master weights does (norms and fp32-level layers stay fp32)
CASES = {
    "finite": None,
    "inf-in-bf16": (1, float("inf")),
    "nan-in-bf16": (2, float("nan")),
    "neg-inf-in-first": (0, float("-inf")),  # fp32 in "mixed", bf16 in "all-bf16"
}


def _params(device, dtypes):
    g = torch.Generator().manual_seed(0)
    shapes = [(33,), (7, 5), (4, 3, 3, 3)]
    return [torch.randn(s, generator=g).to(device=device, dtype=dt).requires_grad_()
            for s, dt in zip(shapes, dtypes)]


def _scaled_step(scaler_cls, device, dtypes, bad):
    """One SGD step of the three parameters through a scaler at 2**10: (grads after unscale_,
    found_inf summed over devices, params after the step, the scale after update)."""
    ps = _params(device, dtypes)
    opt = torch.optim.SGD(ps, lr=0.1, momentum=0.9)
    sc = scaler_cls(device, init_scale=1024.0)
    g = torch.Generator().manual_seed(1)
    loss = sum((p * torch.randn(p.shape, generator=g).to(device=device, dtype=p.dtype)).sum() for p in ps)
    sc.scale(loss).backward()
    if bad is not None:
        i, v = bad
        with torch.no_grad():
            ps[i].grad.view(-1)[3] = v
    sc.unscale_(opt)
    grads = [p.grad.detach().cpu().clone() for p in ps]
    found = float(sum(v.cpu() for v in sc._found_inf_per_device(opt).values()))
    sc.step(opt)
    sc.update()
    return grads, found, [p.detach().cpu() for p in ps], sc.get_scale()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtypes", [(torch.float32, torch.bfloat16, torch.bfloat16), (torch.bfloat16,) * 3],
                         ids=["mixed", "all-bf16"])
@pytest.mark.parametrize("case", list(CASES))
def test_bf16_gradients_unscale_skip_and_rescale_as_torchs_cpu_kernel_does(device, dtypes, case):
    """Against torch.amp.GradScaler on the CPU, whose fused op handles bf16: the unscaled gradients
    and the found-inf flag bit for bit, the step taken or skipped, and the next scale. With every gradient
    bf16 torch's loop sees none, so the per-device flag must be made here."""
    bad = CASES[case]
    want = _scaled_step(torch.amp.GradScaler, "cpu", dtypes, bad)
    got = _scaled_step(GradScaler, device, dtypes, bad)
    for a, b in zip(got[0], want[0]):
        assert a.dtype == b.dtype and torch.equal(a.view(-1).isnan(), b.view(-1).isnan())
        assert torch.equal(a.nan_to_num(), b.nan_to_num())
    assert got[1] == want[1] == (0.0 if bad is None else 1.0)
    # the step itself is torch.optim's, whose CUDA arithmetic (foreach) rounds other than its CPU loop
    # does (bf16 weights differed in the last bit on an H200): taken or skipped as torch's CPU step
    before = _params("cpu", dtypes)
    for a, b, p0 in zip(got[2], want[2], before):
        assert torch.equal(a, p0) == torch.equal(b, p0) == (bad is not None)
        assert torch.allclose(a.float(), b.float(), rtol=1e-2, atol=1e-3) if bad is None else torch.equal(a, b)
    assert got[3] == want[3] == (1024.0 if bad is None else 512.0)


def test_a_scaler_with_no_bf16_gradient_is_torchs_own_path(monkeypatch):
    """Only bf16 gradients take the foreach path: with none, torch's loop is called with the optimizer
    itself (and its result returned as is)."""
    seen = []
    orig = torch.amp.GradScaler._unscale_grads_

    def spy(self, optimizer, *a):
        seen.append(optimizer)
        return orig(self, optimizer, *a)

    monkeypatch.setattr(torch.amp.GradScaler, "_unscale_grads_", spy)
    p = torch.randn(5, requires_grad=True)
    opt = torch.optim.SGD([p], lr=0.1)
    sc = GradScaler("cpu", init_scale=8.0)
    sc.scale((p * 2).sum()).backward()
    sc.unscale_(opt)
    assert seen == [opt] and torch.allclose(p.grad, torch.full((5,), 2.0))
