"""Each Triton kernel against its plain-torch reference (CPU: TRITON_INTERPRET=1; GPU: native)."""
import copy

import pytest
import torch

from conftest import DEVICES
from triaccel.kernels import grad_stats_ref
from triaccel.kernels.fused_optim import FusedAdamW, FusedSGD
from triaccel.kernels.stats import grad_stats_triton
from triaccel.optim import GradScaler

# relative tolerance of the sums per input dtype (inputs are exact in their dtype; fp32 accumulation
# order differs between one sum and many block partials)
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-5, torch.float16: 1e-5}

SHAPES = {
    "odd": [(3, 5, 7), (13,), (1023,), (4097,)],
    "empty_and_single": [(0,), (1,), (2, 0), (1, 1)],
    "many_tiny": [(i % 7 + 1,) for i in range(150)],
    "one_huge": [(300_001,)],
}


def _device_ok(dev):
    return dev == "cuda" or __import__("os").environ.get("TRITON_INTERPRET") == "1"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shapes", list(SHAPES), ids=list(SHAPES))
def test_grad_stats_matches_reference(device, dtype, shapes):
    if not _device_ok(device):
        pytest.skip("Triton needs CUDA or TRITON_INTERPRET=1")
    g = torch.Generator().manual_seed(0)
    ts = [(torch.randn(*s, generator=g) * 3).to(device=device, dtype=dtype) for s in SHAPES[shapes]]
    got, ref = grad_stats_triton(ts), grad_stats_ref(ts)
    assert got.shape == (len(ts), 3)
    scale = ref[:, :2].abs() + torch.tensor([[float(t.numel()) ** 0.5 * 3, 1.0] for t in ts], device=ref.device)
    assert torch.all((got[:, :2] - ref[:, :2]).abs() <= TOL[dtype] * scale + 1e-4), (got, ref)
    assert torch.equal(got[:, 2], ref[:, 2])


@pytest.mark.parametrize("device", DEVICES)
def test_grad_stats_counts_nonfinite_and_excludes_them(device):
    if not _device_ok(device):
        pytest.skip()
    a = torch.tensor([1.0, float("inf"), 2.0, float("nan"), -float("inf")], device=device)
    b = torch.ones(5000, device=device)
    b[4321] = float("nan")
    got = grad_stats_triton([a, b])
    assert got[0].tolist() == [3.0, 5.0, 3.0]
    assert got[1].tolist() == [4999.0, 4999.0, 1.0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block,iters,unroll", [(1024, 3, False), (512, 4, True), (4096, 1, True), (512, 1, True)])
def test_grad_stats_block_shapes_agree(device, block, iters, unroll):
    """Every launch shape the benchmark sweeps (looped or unrolled, blocks spanning tensor ends) is exact."""
    if not _device_ok(device):
        pytest.skip()
    g = torch.Generator().manual_seed(3)
    ts = [torch.randn(s, generator=g).to(device) for s in (1, 511, 513, 3 * 1024 + 7, 9000)]
    got = grad_stats_triton(ts, block=block, iters=iters, unroll=unroll, num_warps=4)
    ref = grad_stats_ref(ts)
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-3)


def _opt_pair(kind, device, lrs, **kw):
    g = torch.Generator().manual_seed(1)
    shapes = [(37,), (5, 3), (1,), (2049,), (8, 3, 3, 3)]
    p1 = [torch.randn(*s, generator=g).to(device).requires_grad_() for s in shapes]
    p2 = [p.detach().clone().requires_grad_() for p in p1]
    groups = lambda ps: [{"params": [p], "lr": lr} for p, lr in zip(ps, lrs)]
    if kind == "sgd":
        return p1, p2, FusedSGD(groups(p1), lr=0.1, backend="triton", **kw), torch.optim.SGD(groups(p2), lr=0.1, **kw)
    return p1, p2, FusedAdamW(groups(p1), lr=0.1, backend="triton", **kw), torch.optim.AdamW(groups(p2), lr=0.1, **kw)


@pytest.mark.parametrize("device", DEVICES)
def test_fused_step_takes_a_gradient_whose_strides_differ_only_on_length_one_dims(device):
    """A channels_last conv weight with one input channel (H200: the first conv on 1-channel digits)
    has strides (9, 1, 3, 1); autograd may hand back its gradient contiguous, (9, 9, 3, 1): the
    same flat layout, which the fused step must accept and update like torch.optim.SGD."""
    if not _device_ok(device):
        pytest.skip()
    w = torch.randn(4, 1, 3, 3, generator=torch.Generator().manual_seed(0)).to(device)
    p1 = w.clone().to(memory_format=torch.channels_last).requires_grad_()
    p2 = w.clone().requires_grad_()
    assert p1.stride() != p2.stride()
    g = torch.randn(4, 1, 3, 3, generator=torch.Generator().manual_seed(1)).to(device)
    p1.grad, p2.grad = g.clone(), g.clone()  # contiguous gradients
    o1 = FusedSGD([p1], lr=0.1, momentum=0.9, backend="triton")
    o2 = torch.optim.SGD([p2], lr=0.1, momentum=0.9)
    for _ in range(2):
        o1.step()
        o2.step()
    assert torch.allclose(p1, p2, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="dense layout"):  # a real mismatch is still refused
        p3 = torch.randn(4, 2, 3, 3, device=device).to(memory_format=torch.channels_last).requires_grad_()
        p3.grad = torch.randn(4, 2, 3, 3, device=device)
        FusedSGD([p3], lr=0.1, momentum=0.9, backend="triton").step()


CASES = [
    ("sgd", dict(momentum=0.9, weight_decay=5e-4, nesterov=False)),
    ("sgd", dict(momentum=0.9, weight_decay=1e-3, nesterov=True)),
    ("sgd", dict(momentum=0.0, weight_decay=0.0)),
    ("adamw", dict(weight_decay=1e-2, betas=(0.9, 0.999))),
    ("adamw", dict(weight_decay=0.0, betas=(0.8, 0.99), eps=1e-6)),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind,kw", CASES)
def test_fused_optimizer_matches_torch_step_by_step_with_overflow(device, kind, kw):
    """Six steps through a GradScaler; step 3 has an inf gradient and must be skipped by both."""
    if not _device_ok(device):
        pytest.skip()
    lrs = [0.1, 0.05, 0.2, 0.01, 0.1]
    p1, p2, o1, o2 = _opt_pair(kind, device, lrs, **kw)
    s1 = torch.amp.GradScaler(device, init_scale=1024.0, growth_interval=2)
    s2 = torch.amp.GradScaler(device, init_scale=1024.0, growth_interval=2)
    g = torch.Generator().manual_seed(2)
    for step in range(6):
        grads = [torch.randn(p.shape, generator=g).to(device) for p in p1]
        if step == 3:
            grads[1][0, 0] = float("inf")
        for ps, opt, sc in ((p1, o1, s1), (p2, o2, s2)):
            loss = sum((p * gr).sum() for p, gr in zip(ps, grads))
            sc.scale(loss).backward()
            sc.step(opt)
            sc.update()
            opt.zero_grad(set_to_none=False)
        assert s1.get_scale() == s2.get_scale()
        # AdamW's bias corrections are computed in fp32 on the device (torch: Python doubles) and its
        # normalised step amplifies last-bit differences of sqrt(v): a looser absolute tolerance.
        atol = 1e-5 if kind == "adamw" else 1e-6
        for a, b in zip(p1, p2):
            assert torch.allclose(a, b, rtol=1e-5, atol=atol), (step, float((a - b).abs().max().detach()))
    assert s1.get_scale() < 1024.0 * 4  # the overflow halved the scale once


@pytest.mark.parametrize("device", DEVICES)
def test_fused_optimizer_unscaled_path_and_reference_backend(device):
    """Without a GradScaler (bf16/fp32 steps) and with the torch backend, same results as torch.optim."""
    if not _device_ok(device):
        pytest.skip()
    for backend in ("triton", "torch"):
        p1, p2, o1, o2 = _opt_pair("sgd", device, [0.1, 0.2, 0.3, 0.4, 0.5], momentum=0.9, weight_decay=1e-4)
        o1.backend = backend
        for _ in range(3):
            for ps in (p1, p2):
                for p in ps:
                    p.grad = torch.ones_like(p) * 0.5
            o1.step()
            o2.step()
        assert all(torch.allclose(a, b, rtol=1e-6, atol=1e-6) for a, b in zip(p1, p2))


def test_fused_optimizer_refuses_groups_that_differ_beyond_lr():
    a, b = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    opt = FusedSGD([{"params": [a], "momentum": 0.9}, {"params": [b], "momentum": 0.5}], lr=0.1, backend="torch")
    a.grad, b.grad = torch.ones(3), torch.ones(3)
    with pytest.raises(ValueError, match="differ in 'momentum'"):
        opt.step()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind,kw", [CASES[0], CASES[3]])
def test_fused_optimizer_follows_a_schedule_without_reuploading_lrs(device, kind, kw):
    """A schedule scales every group's lr each step (warm-up from 0, decay): the fused step follows
    torch.optim exactly, and the lr array is re-uploaded only when the groups' proportions change."""
    if not _device_ok(device):
        pytest.skip()
    base = [0.1, 0.05, 0.2, 0.01, 0.1]
    p1, p2, o1, o2 = _opt_pair(kind, device, base, **kw)
    g = torch.Generator().manual_seed(4)
    uploads, last = 0, None
    for step, factor in enumerate([0.0, 0.25, 0.5, 1.0, 0.9, 0.7, 0.7, 0.3]):
        scales = [1.0] * 5 if step < 6 else [1.0, 0.5, 1.0, 1.0, 2.0]  # step 6: a curvature refresh
        for opt in (o1, o2):
            for grp, lr, s in zip(opt.param_groups, base, scales):
                grp["lr"] = lr * factor * s
        grads = [torch.randn(p.shape, generator=g).to(device) for p in p1]
        for ps, opt in ((p1, o1), (p2, o2)):
            for p, gr in zip(ps, grads):
                p.grad = gr.clone()
            opt.step()
        if o1._lr_dev is not last:
            uploads, last = uploads + 1, o1._lr_dev
        for a, b in zip(p1, p2):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-5), (step, float((a - b).abs().max().detach()))
    assert uploads == 3  # all-zero warm-up start, first non-zero lrs, the proportions' change


@pytest.mark.parametrize("device", DEVICES)
def test_grad_stats_segments_and_variance_ema_match_references(device):
    """Per-layer rows (tensors summed into their group's row, mixed dtypes) and the EMA update."""
    if not _device_ok(device):
        pytest.skip()
    from triaccel.kernels.reference import variance_ema_ref
    from triaccel.kernels.stats import variance_ema_triton

    g = torch.Generator().manual_seed(5)
    ts = [torch.randn(s, generator=g).to(device=device, dtype=dt)
          for s, dt in ((300, torch.float32), (7, torch.float32), (5000, torch.bfloat16), (2, torch.float32))]
    ts[2][17] = float("inf")
    seg = [0, 0, 2, 1]
    got, ref = grad_stats_triton(ts, segments=seg, n_segments=3), grad_stats_ref(ts, seg, 3)
    assert got.shape == (3, 3)
    assert torch.allclose(got, ref, rtol=1e-4, atol=1e-2), (got, ref)
    assert got[2, 2] == 1 and got[0, 2] == 0
    numel = torch.tensor([307.0, 2.0, 5000.0], device=device)
    state = [[torch.rand(3, generator=g).to(device) for _ in range(3)] for _ in range(2)]
    state[1] = [s.clone() for s in state[0]]
    for beta in (0.0, 0.9):  # beta 0 starts the average from this window's variance
        variance_ema_triton(ref, numel, *state[0], beta=beta, n_examples=96)
        variance_ema_ref(ref, numel, *state[1], beta=beta, n_examples=96)
        for a, b in zip(*state):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
    var = (ref[:, 1] / numel - (ref[:, 0] / numel) ** 2).clamp_min(0)
    assert torch.allclose(state[1][0], var, rtol=1e-5, atol=1e-6)  # beta 0, then 0.9 on the same statistics: the variance itself


@pytest.mark.parametrize("device", DEVICES)
def test_fused_optimizer_follows_gradients_that_move_and_replans_on_new_state(device):
    """Gradients set to None and re-created every step (the training loop's way) land at new
    addresses: the plan is kept and only the block table's gradient column is refreshed; a
    gradient updated in place needs no refresh; a loaded state dict builds a new plan. Results
    follow torch.optim throughout."""
    if not _device_ok(device):
        pytest.skip()
    p1, p2, o1, o2 = _opt_pair("sgd", device, [0.1, 0.2, 0.3, 0.4, 0.5], momentum=0.9, weight_decay=1e-4)
    g = torch.Generator().manual_seed(6)
    plans, keep = [], []
    for step in range(6):
        grads = [torch.randn(p.shape, generator=g).to(device) for p in p1]
        for ps, opt in ((p1, o1), (p2, o2)):
            if step != 4:
                opt.zero_grad(set_to_none=True)  # new gradient storage every step ...
            for p, gr in zip(ps, grads):
                if p.grad is None:
                    p.grad = gr.clone()
                else:
                    p.grad.copy_(gr)  # ... except step 4: in place
            if step == 3:
                opt.load_state_dict(opt.state_dict())  # state buffers replaced: a new plan
            opt.step()
        keep.append([p.grad for p in p1])  # hold the old gradients: the next ones cannot reuse their memory
        plans.append(o1._plan_val)
        assert all(torch.allclose(a, b, rtol=1e-6, atol=1e-6) for a, b in zip(p1, p2)), step
    assert plans[0] is plans[1] is plans[2] and plans[2] is not plans[3] and plans[3] is plans[4] is plans[5]
    assert o1.plan_builds == 2
    if o1._plan_val[0].table is not None:  # Triton path: the second plan's table (built at step 3) was refreshed
        assert o1._plan_val[0].table.uploads == 1  # for step 5's new gradients, not for step 4's in-place ones



@pytest.mark.parametrize("kind", ["sgd", "adamw"])
def test_fused_zero_grad_keeps_storage_and_zeroes_in_one_multi_tensor_op(kind):
    """Captured micro-batches keep the gradient buffers (set_to_none=False): they are zeroed in
    place, by one multi-tensor op per dtype, not one fill per parameter (62 launches a step for
    ResNet-18: the captured Tri-Accel step ran 5% behind static on the H200). set_to_none=True
    still drops them, as torch.optim does."""
    from torch.profiler import ProfilerActivity, profile

    p1, _, o1, _ = _opt_pair(kind, "cpu", [0.1, 0.05, 0.2, 0.01, 0.1])
    sum((p * 3.0).sum() for p in p1).backward()
    ptrs = [p.grad.data_ptr() for p in p1]
    assert all(float(p.grad.abs().sum()) > 0 for p in p1)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        o1.zero_grad(set_to_none=False)
    # ops called by the optimizer itself (on the CPU, _foreach_zero_ runs zero_ per tensor inside it)
    names = [e.name for e in prof.events() if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")]
    assert names.count("aten::_foreach_zero_") == 1, names
    assert "aten::zero_" not in names and "aten::fill_" not in names
    assert [p.grad.data_ptr() for p in p1] == ptrs
    assert all(float(p.grad.abs().sum()) == 0 for p in p1)
    o1.zero_grad()
    assert all(p.grad is None for p in p1)


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
def test_fused_zero_grad_keeps_torch_profiler_range(kind):
    """The in-place zeroing runs inside torch.optim's ``Optimizer.zero_grad#<class>.zero_grad``
    range, as both of torch's paths do: `triaccel profile`'s tables and traces name it (the
    override had dropped it for set_to_none=False, the captured step's path)."""
    from torch.profiler import ProfilerActivity, profile

    p1, _, o1, _ = _opt_pair(kind, "cpu", [0.1, 0.05, 0.2, 0.01, 0.1])
    sum((p * 3.0).sum() for p in p1).backward()
    for set_to_none in (False, True):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            o1.zero_grad(set_to_none=set_to_none)
        names = [e.name for e in prof.events()]
        assert f"Optimizer.zero_grad#{type(o1).__name__}.zero_grad" in names, (set_to_none, names)
        if not set_to_none:
            sum((p * 3.0).sum() for p in p1).backward()


def _bf16_pair(kind, device, backend, **kw):
    """The same parameters under a bf16-state fused optimizer and under torch.optim (fp32 state)."""
    lrs = [0.1, 0.05, 0.2, 0.01, 0.1]
    p1, p2, _, o2 = _opt_pair(kind, device, lrs, **kw)
    cls = FusedSGD if kind == "sgd" else FusedAdamW
    o1 = cls([{"params": [p], "lr": lr} for p, lr in zip(p1, lrs)], lr=0.1, backend=backend,
             state_dtype=torch.bfloat16, **kw)
    return p1, p2, o1, o2


def _run_scaled(pairs, device, steps, seed=2, inf_at=3):
    # triaccel's GradScaler, as the trainer's: torch's has no bf16-gradient unscale on CUDA
    g = torch.Generator().manual_seed(seed)
    scalers = [GradScaler(device, init_scale=1024.0, growth_interval=2) for _ in pairs]
    for step in range(steps):
        grads = [torch.randn(p.shape, generator=g).to(device) for p in pairs[0][0]]
        if step == inf_at:
            grads[1][0, 0] = float("inf")
        for (ps, opt), sc in zip(pairs, scalers):
            loss = sum((p * gr).sum() for p, gr in zip(ps, grads))
            sc.scale(loss).backward()
            sc.step(opt)
            sc.update()
            opt.zero_grad(set_to_none=False)
    return scalers


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind,kw", [CASES[0], CASES[1], CASES[3]])
def test_bf16_state_kernel_matches_its_reference_and_stays_near_fp32_sgd(device, kind, kw):
    """triaccel.precision.optimizer_state: bf16. The kernel stores the state in bf16 and computes in
    fp32, as its reference does (to fp32 rounding); the trajectory stays near torch.optim's fp32 one
    (bf16 keeps 8 bits: the state's relative error is ~2^-9 a step, and decays with momentum); the
    overflow step is skipped by all three; the state takes half the bytes."""
    if not _device_ok(device):
        pytest.skip()
    p1, p2, o1, o2 = _bf16_pair(kind, device, "triton", **kw)
    p3, _, o3, _ = _bf16_pair(kind, device, "torch", **kw)
    before = [p.detach().clone() for p in p1]
    s1, s2, s3 = _run_scaled([(p1, o1), (p2, o2), (p3, o3)], device, steps=6)
    assert s1.get_scale() == s2.get_scale() == s3.get_scale() < 1024.0 * 4  # the inf step skipped everywhere
    # kernel == reference. Interpreted (CI) both round the same fp32 values: equal to fp32 rounding.
    # On the GPU the kernel's fused multiply-adds can land an fp32 value on the other side of a bf16
    # rounding boundary (one bf16 step, 2^-8 relative), which AdamW's normalised step carries into
    # the weights (H200: over 1e-5): there the bound is a bf16 step of the update.
    ktol = 1e-5 if device == "cpu" or kind == "sgd" else 2e-3
    for a, b, c, a0 in zip(p1, p2, p3, before):
        assert torch.allclose(a, c, rtol=1e-5, atol=ktol), float((a - c).abs().max().detach())
        moved = float((b - a0).abs().max())
        assert moved > 0.01  # the optimizers did move the weights
        assert float((a - b).abs().max()) < 0.02 * moved, (float((a - b).abs().max()), moved)  # near fp32
    for st1, st2 in zip(o1.state.values(), o2.state.values()):
        for k, v in st1.items():
            if k == "fused_step":
                continue
            assert v.dtype == torch.bfloat16
            assert v.numel() * v.element_size() * 2 == st2[k].numel() * st2[k].element_size()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind,kw", [CASES[0], CASES[3]])
def test_bf16_state_survives_a_checkpoint_bit_for_bit(device, kind, kw):
    """torch.optim's load_state_dict casts state to the parameter's dtype (fp32); the fused
    optimizer puts it back in bf16, so a resumed run reads the same bits (read as fp32 by a bf16
    kernel, it would be garbage) and continues exactly as the uninterrupted one."""
    if not _device_ok(device):
        pytest.skip()
    p1, _, o1, _ = _bf16_pair(kind, device, "triton", **kw)
    _run_scaled([(p1, o1)], device, steps=3, inf_at=-1)
    saved = copy.deepcopy(o1.state_dict())
    p4 = [p.detach().clone().requires_grad_() for p in p1]
    cls = FusedSGD if kind == "sgd" else FusedAdamW
    o4 = cls([{"params": [p], "lr": g["lr"]} for p, g in zip(p4, o1.param_groups)], lr=0.1, backend="triton",
             state_dtype=torch.bfloat16, **kw)
    o4.load_state_dict(saved)
    for a, b in zip(o1.state.values(), o4.state.values()):
        for k in a:
            assert b[k].dtype == a[k].dtype and torch.equal(a[k], b[k]), k
    _run_scaled([(p1, o1)], device, steps=3, seed=5, inf_at=-1)
    _run_scaled([(p4, o4)], device, steps=3, seed=5, inf_at=-1)
    assert all(torch.equal(a, b) for a, b in zip(p1, p4))


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_state_rounds_every_float_as_torch_does_and_keeps_nans(device):
    """The kernel's fp32 -> bf16 rounding (the GPU's conversion on CUDA, integer arithmetic under the
    interpreter: kernels/fused_optim.py's _to_bf16) against torch's cast, through the
    momentum buffer (zero, so it stores the gradient): random bit patterns, exponent carries, the
    largest finite values, infinities, subnormals, and NaNs of every kind (0x7FFFFFFF, the NaN a
    GPU's arithmetic makes, came out as -0.0 before the NaN guard)."""
    if not _device_ok(device):
        pytest.skip()
    special = [0x7FFFFFFF, 0xFFFFFFFF, 0x7F800001, 0xFF800001, 0x7FC00000, 0xFFFF8000, 0x7F800000, 0xFF800000,
               0x7F7FFFFF, 0xFF7FFFFF, 0x3F807FFF, 0x3F808000, 0x3F818000, 0x3FFFFFFF, 0x00000001, 0x80000001,
               0x007FFFFF, 0x00008000, 0x3F800000]
    rnd = torch.randint(0, 2**32, (20000,), generator=torch.Generator().manual_seed(7), dtype=torch.int64)
    bits = torch.cat([torch.tensor(special, dtype=torch.int64), rnd])
    g = bits.to(torch.int32, copy=True).view(torch.float32)  # the low 32 bits, reinterpreted
    p = torch.zeros_like(g).to(device).requires_grad_()
    p.grad = g.to(device)
    opt = FusedSGD([p], lr=0.0, momentum=0.9, backend="triton", state_dtype=torch.bfloat16)
    opt.step()
    got = opt.state[p]["momentum_buffer"].float().cpu()
    want = (torch.zeros_like(g) * 0.9 + g).bfloat16().float()  # what the kernel stores, rounded by torch
    assert torch.equal(got.isnan(), want.isnan())
    # a GPU may flush a subnormal sum to zero before the rounding sees it: that is the arithmetic's mode
    flushed = (want.abs() < torch.finfo(torch.float32).tiny) & (got == 0)
    ok = ~want.isnan() & ~flushed
    assert torch.equal(got[ok], want[ok]), [hex(int(b)) for b in bits[ok][got[ok] != want[ok]][:8]]
    assert int(ok.sum()) > 19000  # nearly every pattern compared (NaNs are ~0.4 %, subnormals ~0.4 %)


def _bf16_master_pair(kind, device, rounding, **kw):
    """Four weights kept in bf16 and one in fp32 (two launches a step), under the Triton kernel and
    under its reference, from the same values."""
    g = torch.Generator().manual_seed(4)
    # bf16: a short one, a 2-d one, a channels_last conv weight, one of three blocks; fp32: one
    shapes = [(37,), (5, 3), (3 * 1024 + 7,), (8, 3, 3, 3), (5000,)]
    made = []
    for _ in range(2):
        ps = [torch.randn(*s, generator=torch.Generator().manual_seed(i)).to(device) for i, s in enumerate(shapes)]
        ps = [p.to(torch.bfloat16) if i != 2 else p for i, p in enumerate(ps)]
        ps[3] = ps[3].to(memory_format=torch.channels_last)
        made.append([p.requires_grad_() for p in ps])
    cls = FusedSGD if kind == "sgd" else FusedAdamW
    lrs = [0.1, 0.05, 0.2, 0.01, 0.1]
    opts = [cls([{"params": [p], "lr": lr} for p, lr in zip(ps, lrs)], lr=0.1, backend=b, rounding=rounding, **kw)
            for ps, b in zip(made, ("triton", "torch"))]
    return made, opts, g


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rounding", ["nearest", "stochastic", "kahan"])
@pytest.mark.parametrize("kind,kw", [CASES[0], CASES[3]])
def test_bf16_master_weights_kernel_matches_its_reference_bit_for_bit(device, rounding, kind, kw):
    """triaccel.precision.master_weights: bf16. bf16 weights (bf16 gradients) and an fp32 one in one
    optimizer: one launch per dtype; the kernel stores each bf16 update as its reference does, the
    stochastic draws included (the same hash of step, tensor and element), through a skipped step."""
    if not _device_ok(device):
        pytest.skip()
    (p1, p2), (o1, o2), g = _bf16_master_pair(kind, device, rounding, **kw)
    before = [p.detach().clone() for p in p1]
    _run_scaled([(p1, o1), (p2, o2)], device, steps=5)
    equal, near = [], []
    for a, b, a0 in zip(p1, p2, before):
        assert a.dtype == b.dtype and a.grad.dtype == a.dtype and a.stride() == b.stride()
        assert not torch.equal(a, a0)  # the weights moved
        if a.dtype == torch.float32:
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-5)
            continue
        step = torch.maximum(a.detach().float().abs(), b.detach().float().abs()).clamp_min(2 ** -20) * 2 ** -7
        near.append(((a.float() - b.float()).abs() <= step).reshape(-1))  # within a bf16 step
        equal.append((a == b).reshape(-1))
        assert int((a != b).sum()) <= max(2, 0.02 * a.numel()), (rounding, tuple(a.shape), int((a != b).sum()))
    # the kernel divides by the loss scale where the reference multiplies by its inverse: an fp32
    # value one ulp apart can round to the neighbouring bf16 value, rarely (AdamW's normalised step
    # can carry that further); the same draws keep every other element equal, the channels_last
    # weight's included (draws by another element order would part about half of them)
    assert float(torch.cat(equal).float().mean()) >= 0.98, rounding
    assert float(torch.cat(near).float().mean()) >= 0.999, rounding
    seeds = [o.state[o.param_groups[0]["params"][0]].get("sr_seed") for o in (o1, o2)]
    if rounding == "stochastic":
        assert int(seeds[0]) == int(seeds[1]) == 5  # one draw a step, skipped steps included
    else:
        assert seeds == [None, None]
    comps = [st.get("kahan_comp") for st in o1.state.values()]
    assert sum(c is not None for c in comps) == (4 if rounding == "kahan" else 0)


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_master_weights_keep_small_updates_only_when_rounded_stochastically_or_compensated(device):
    """An update far below half a bf16 step (1e-4 at 1.0, where a step is 2^-8): rounded to nearest
    it is lost every step and the weight never moves; rounded stochastically the weights follow the
    fp32 trajectory on average; Kahan-compensated each weight stays within a bf16 step of it."""
    if not _device_ok(device):
        pytest.skip()
    steps, lr, n = 100, 0.1, 4096
    finals = {}
    for rounding in ("nearest", "stochastic", "kahan"):
        p = torch.ones(n, device=device, dtype=torch.bfloat16, requires_grad=True)
        opt = FusedSGD([p], lr=lr, backend="triton", rounding=rounding)
        for _ in range(steps):
            p.grad = torch.full_like(p, 1e-3)
            opt.step()
        finals[rounding] = p.detach().float()
    fp32 = 1.0 - steps * lr * 1e-3  # 0.99
    assert torch.all(finals["nearest"] == 1.0)
    assert abs(float(finals["stochastic"].mean()) - fp32) < 5e-4
    assert float(finals["stochastic"].std()) > 0  # rounded up and down, element by element
    assert float((finals["kahan"] - fp32).abs().max()) <= 2 ** -8


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["sgd", "adamw"])
def test_bf16_master_weights_resume_bit_for_bit(device, kind):
    """A checkpoint of bf16 weights: torch.optim's load_state_dict casts floating state to the
    parameter's dtype; the fused optimizer puts AdamW's step count back in fp32 (in bf16 it stops
    counting at 256), and the stochastic rounding's counter is restored, so the resumed run draws
    and steps as the uninterrupted one."""
    if not _device_ok(device):
        pytest.skip()
    kw = dict(momentum=0.9) if kind == "sgd" else {}
    (p1, p2), (o1, _), g = _bf16_master_pair(kind, device, "stochastic", **kw)
    _run_scaled([(p1, o1)], device, steps=3, inf_at=-1)
    saved_w, saved_o = [p.detach().clone() for p in p1], copy.deepcopy(o1.state_dict())
    _run_scaled([(p1, o1)], device, steps=3, inf_at=-1, seed=9)
    with torch.no_grad():
        for p, w in zip(p2, saved_w):
            p.copy_(w)
    cls = FusedSGD if kind == "sgd" else FusedAdamW
    o3 = cls([{"params": [p], "lr": lr} for p, lr in zip(p2, [0.1, 0.05, 0.2, 0.01, 0.1])], lr=0.1,
             backend="triton", rounding="stochastic", **kw)
    o3.load_state_dict(saved_o)
    if kind == "adamw":
        assert all(st["fused_step"].dtype == torch.float32 for st in o3.state.values() if "fused_step" in st)
    _run_scaled([(p2, o3)], device, steps=3, inf_at=-1, seed=9)
    for a, b in zip(p1, p2):
        assert torch.equal(a, b)


def test_every_optimizer_kernel_variant_passes_tritons_code_generator_for_a_gpu_target():
    """Under TRITON_INTERPRET=1 (CI) the kernels run as Python, which accepts code Triton's compiler
    would refuse (typing of integer literals, constexpr assignments). Each variant of the two optimizer
    kernels (master weights fp32/bf16, every rounding) goes here through Triton's own code generator to
    TTIR for an sm_90 target (no GPU needed); the unsigned hash must stay unsigned (logical shifts)."""
    import os
    import subprocess
    import sys

    code = r'''
import os, re
os.environ.pop("TRITON_INTERPRET", None)
from triton.compiler import ASTSource
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import CUDABackend
from triton._C.libtriton import ir
from triaccel.kernels import fused_optim as fo
target = GPUTarget("cuda", 90, 32)
backend = CUDABackend(target)
def ttir(fn, sig, consts):
    ctx = ir.context(); ir.load_dialects(ctx); backend.load_dialects(ctx)
    opts = backend.parse_options({})
    src = ASTSource(fn=fn, signature={**sig, **{k: "constexpr" for k in consts}}, constexprs=consts)
    return str(src.make_ir(target, opts, backend.get_codegen_implementation(opts), backend.get_module_map(), ctx))
common = {"table_ptr": "*i64", "lr_ptr": "*fp32", "lr_mult": "fp32", "scale_ptr": "*fp32", "found_inf_ptr": "*fp32"}
for rnd in (0, 1, 2):
    for pbf in (False, True):
        seed = {"seed_ptr": "*i64" if rnd == 1 else "*fp32"}
        sgd = ttir(fo._sgd_kernel, {**common, **seed, "momentum": "fp32", "weight_decay": "fp32"},
                   {"HAS_MOMENTUM": True, "NESTEROV": False, "HAS_SCALE": True, "HAS_INF": True, "STATE_BF16": True,
                    "BLOCK": 2048, "HW_BF16": True, "ALIGNED": False, "PARAM_BF16": pbf, "ROUND": rnd})
        adamw = ttir(fo._adamw_kernel, {**common, "step_ptr": "*fp32", **seed, "beta1": "fp32", "beta2": "fp32",
                     "eps": "fp32", "weight_decay": "fp32"},
                     {"HAS_SCALE": True, "HAS_INF": True, "STATE_BF16": False, "BLOCK": 2048, "HW_BF16": True,
                      "PARAM_BF16": pbf, "ROUND": rnd})
        for name, t in (("sgd", sgd), ("adamw", adamw)):
            shifts = set(re.findall(r"arith\.shr[us]i", t))
            print(name, rnd, pbf, "bf16" in t, ",".join(sorted(shifts)))
'''
    try:
        import triton.backends.nvidia.compiler  # noqa: F401
        from triton.compiler import ASTSource  # noqa: F401
    except Exception as e:  # noqa: BLE001 -- a Triton without its CUDA backend or this API
        pytest.skip(f"Triton's CUDA code generator is not importable here: {e}")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [ln.split() for ln in r.stdout.splitlines()]
    assert len(rows) == 12, r.stdout
    for kind, rnd, pbf, has_bf16, *shifts in rows:
        if pbf == "True":
            assert has_bf16 == "True"
        if rnd == "1" and pbf == "True":  # the stochastic rounding's hash: unsigned shifts only
            assert shifts and set(shifts[0].split(",")) == {"arith.shrui"}, (kind, shifts)
