"""triaccel.optim.GradScaler: bf16 gradients (bf16 master weights beside fp16 layers) unscaled and
checked as torch's own CPU kernel does; torch's fused CUDA op has no bf16 kernel."""
import inspect

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


def cuda_like_unscale(monkeypatch):
    """torch's fused check-and-unscale as it is on CUDA: no bf16 kernel (NotImplementedError)."""
    real = torch._amp_foreach_non_finite_check_and_unscale_

    def no_bf16(grads, found_inf, inv_scale):
        if any(g.dtype == torch.bfloat16 for g in grads):
            raise NotImplementedError('"_amp_foreach_non_finite_check_and_unscale_cuda" not implemented for \'BFloat16\'')
        return real(grads, found_inf, inv_scale)

    monkeypatch.setattr(torch, "_amp_foreach_non_finite_check_and_unscale_", no_bf16)


@pytest.mark.parametrize("case", ["finite", "inf-in-bf16"])
def test_bf16_gradients_unscale_where_torchs_kernel_has_no_bf16_as_on_cuda(monkeypatch, case):
    """With torch's op refusing bf16, as its CUDA kernel does, torch's own scaler fails and this one
    gives what torch's CPU kernel gave before the refusal."""
    want = _scaled_step(torch.amp.GradScaler, "cpu", (torch.float32, torch.bfloat16, torch.bfloat16), CASES[case])
    cuda_like_unscale(monkeypatch)
    with pytest.raises(NotImplementedError):
        _scaled_step(torch.amp.GradScaler, "cpu", (torch.float32, torch.bfloat16, torch.bfloat16), CASES[case])
    got = _scaled_step(GradScaler, "cpu", (torch.float32, torch.bfloat16, torch.bfloat16), CASES[case])
    assert all(torch.equal(a.nan_to_num(), b.nan_to_num()) for a, b in zip(got[0], want[0]))
    assert (got[1], got[3]) == (want[1], want[3])
    assert all(torch.equal(a, b) for a, b in zip(got[2], want[2]))  # both on the CPU: the same step


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("where", ["late-in-a-large-tensor", "behind-many-tensors"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_a_bad_value_anywhere_among_bf16_gradients_is_found(device, where, bad):
    """The check reduces across blocks and chunks of the multi-tensor kernel on CUDA: a bad value far
    from the start is found as one at the start is; an empty bf16 gradient is passed over."""
    shapes = [(3_000_001,)] if where == "late-in-a-large-tensor" else [(17,)] * 500
    ps = [torch.zeros(s, device=device, dtype=torch.bfloat16, requires_grad=True) for s in shapes]
    ps.append(torch.zeros(0, device=device, dtype=torch.bfloat16, requires_grad=True))
    for p in ps:
        p.grad = torch.ones_like(p) * 64
    ps[-2].grad.view(-1)[-1] = bad
    opt = torch.optim.SGD(ps, lr=0.1)
    sc = GradScaler(device, init_scale=64.0)
    sc.scale(torch.zeros((), device=device))  # the scale tensor is made on first use
    sc.unscale_(opt)
    assert float(sum(v.cpu() for v in sc._found_inf_per_device(opt).values())) == 1.0
    assert float(ps[0].grad.view(-1)[0]) == 1.0  # unscaled all the same, as torch's kernel does
    ps[-2].grad.view(-1)[-1] = 64.0
    for p in ps:
        p.grad = torch.ones_like(p) * 64
    sc2, opt2 = GradScaler(device, init_scale=64.0), torch.optim.SGD(ps, lr=0.1)
    sc2.scale(torch.zeros((), device=device))
    sc2.unscale_(opt2)
    assert float(sum(v.cpu() for v in sc2._found_inf_per_device(opt2).values())) == 0.0


def test_a_sparse_bf16_gradient_is_unscaled_by_its_values(monkeypatch):
    cuda_like_unscale(monkeypatch)
    emb = torch.nn.Embedding(10, 4, sparse=True).to(torch.bfloat16)
    opt = torch.optim.SGD(emb.parameters(), lr=0.1)
    sc = GradScaler("cpu", init_scale=8.0)
    sc.scale(emb(torch.tensor([1, 3])).float().sum()).backward()
    assert emb.weight.grad.is_sparse
    sc.unscale_(opt)
    assert torch.equal(emb.weight.grad.coalesce().values(), torch.ones(2, 4, dtype=torch.bfloat16))


def test_the_private_hook_this_scaler_overrides_is_still_torchs():
    """GradScaler overrides torch's private _unscale_grads_: if torch renames it or changes its
    arguments, unscale_ would stop reaching the bf16 path and this says so first."""
    params = list(inspect.signature(torch.amp.GradScaler._unscale_grads_).parameters)
    assert params == ["self", "optimizer", "inv_scale", "found_inf", "allow_fp16"]
    assert "_unscale_grads_" in inspect.getsource(torch.amp.GradScaler.unscale_)
    assert "_unscale_grads_" in inspect.getsource(torch.amp.GradScaler._check_inf_per_device)


@pytest.mark.parametrize("device", DEVICES)
def test_a_fused_sgd_whose_first_step_the_scaler_skips_takes_torchs_first_step_next(device, monkeypatch):
    """torch's fused SGD makes its momentum buffers with empty_like at the first step and, when the
    GradScaler skips that step, never writes them: the next step read that memory as momentum (NaN
    weights on an H100, EfficientNet-B0 static fp16). empty_like is made to hand back NaN, as reused
    memory can; the buffers made beforehand as zeros keep the next step equal to unfused SGD's."""
    from types import SimpleNamespace

    from triaccel.optim import torch_sgd

    oc = SimpleNamespace(lr=0.1, momentum=0.9, nesterov=False, weight_decay=5e-4)
    ps = {name: _params(device, [torch.float32] * 3) for name in ("fused", "unfused")}
    opts = {"fused": torch_sgd([{"params": ps["fused"]}], oc, fused=True),
            "unfused": torch_sgd([{"params": ps["unfused"]}], oc, fused=None)}
    scalers = {name: GradScaler(device, init_scale=2.0 ** 16) for name in opts}
    empty_like = torch.empty_like
    monkeypatch.setattr(torch, "empty_like", lambda t, *a, **k: torch.full_like(empty_like(t, *a, **k), float("nan")))
    for grad_value in (float("inf"), 1.0):  # an overflow at the first step (skipped), then a finite one
        for name, opt in opts.items():
            sc = scalers[name]
            loss = sum((p * grad_value).sum() for p in ps[name])
            sc.scale(loss).backward()
            sc.unscale_(opt)
            sc.step(opt)
            sc.update()
            opt.zero_grad()
    assert scalers["fused"].get_scale() == scalers["unfused"].get_scale() == 2.0 ** 15  # one skip each
    for a, b, start in zip(ps["fused"], ps["unfused"], _params(device, [torch.float32] * 3)):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b)
        assert not torch.equal(a, start)  # the second step was taken
