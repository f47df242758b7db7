"""Fused multi-tensor optimizer steps with a per-layer lr read from a device array.

One launch updates every parameter of the model: SGD (momentum, Nesterov, weight decay) or
AdamW, with each parameter group's lr read from a device array (the curvature controller's
eta_l), the GradScaler's unscale (grad / scale) folded in, and the whole update skipped when
``found_inf`` is set, exactly as ``torch.optim.SGD`` / ``torch.optim.AdamW`` driven by a
``GradScaler`` would. The found_inf test happens on the device: no host sync.

The optimizers declare ``_step_supports_amp_scaling``: ``GradScaler.step`` then hands them
``grad_scale`` and ``found_inf`` tensors instead of unscaling and checking for them. With one
param group per layer, torch's own fused/foreach optimizers launch once per group; these
launch once per step.

References: ``reference.sgd_step_ref`` / ``adamw_step_ref`` (and torch.optim itself in tests).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from triaccel.kernels._table import BlockTable
from triaccel.kernels.reference import adamw_step_ref, sgd_step_ref
from triaccel.kernels.stats import _dense

BLOCK = 2048
ALIGNED = False  # alignment hints in the SGD kernel (bench/sgd_state_bench.py measures them; off: not proven)


@triton.jit
def _bf16_rne(x):
    """fp32 -> bf16, rounded to nearest even, by integer arithmetic: the interpreter's cast (CI)
    truncates toward zero, and a truncated momentum drifts toward zero step after step. A NaN
    stays a NaN (quieted, then truncated): the rounding carry would turn 0x7FFFFFFF, the NaN a GPU's
    arithmetic produces, into -0.0, and a NaN momentum would restart from zero unseen."""
    bits = x.to(tl.uint32, bitcast=True)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    bits = tl.where(nan, bits | 0x00400000, bits + 0x7FFF + ((bits >> 16) & 1))
    return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _to_bf16(x, HW: tl.constexpr):
    """fp32 -> bf16 rounded to nearest even: the GPU's own conversion (one instruction) where ``HW``,
    else ``_bf16_rne``'s integer arithmetic (the interpreter, whose cast truncates). Both give the same
    bits, NaN included (tests/test_kernels.py; the CUDA test compares them)."""
    if HW:
        return x.to(tl.bfloat16, fp_downcast_rounding="rtne")
    else:
        return _bf16_rne(x)


def hw_bf16() -> bool:
    """The kernels' bf16 stores use the GPU's conversion, except under the interpreter (TRITON_INTERPRET=1).
    ``HW_BF16`` set to True or False overrides it (bench/sgd_state_bench.py compares the two)."""
    return HW_BF16 if HW_BF16 is not None else os.environ.get("TRITON_INTERPRET") != "1"


HW_BF16: bool | None = None

ROUNDINGS = {"nearest": 0, "stochastic": 1, "kahan": 2}  # how an update is stored in bf16 master weights


@triton.jit
def _mix32(x):
    """A 32-bit integer hash (lowbias32): the random bits of stochastic rounding, a pure function of
    (seed, tensor, element offset), so the kernel and its reference (``reference.mix32_ref``) draw the
    same. Its multiplications wrap by design: Triton's debug mode (TRITON_DEBUG) flags them as overflows."""
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    x = x ^ (x >> 16)
    return x


@triton.jit
def _bf16_sr(x, seed, seg, offs):
    """fp32 -> bf16, rounded stochastically: up with probability equal to the fraction of a bf16 step
    the value lies above the lower neighbour, so a rounded update is exact in expectation and a step
    smaller than half a bf16 step still moves the weight (nearest rounding drops it every time). A NaN
    stays a NaN, as in ``_bf16_rne``."""
    key = _mix32(seed.to(tl.uint32) ^ _mix32(seg.to(tl.uint32) + 1))
    r = _mix32(offs.to(tl.uint32) ^ key)
    bits = x.to(tl.uint32, bitcast=True)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    bits = tl.where(nan, bits | 0x00400000, bits + (r & 0xFFFF))
    return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _store_param(p_ptr, c_ptr, offs, mask, new, seed, seg, PARAM_BF16: tl.constexpr, ROUND: tl.constexpr,
                 HW_BF16: tl.constexpr):
    """The updated weight ``new`` (fp32) stored as the master weight is kept: fp32 as it is; bf16
    rounded to nearest, stochastically, or to nearest with the rounding error kept in a bf16
    compensation buffer (Kahan) that the next update adds back."""
    if PARAM_BF16:
        if ROUND == 1:
            tl.store(p_ptr + offs, _bf16_sr(new, seed, seg, offs), mask=mask)
        else:
            pb = _to_bf16(new, HW_BF16)
            tl.store(p_ptr + offs, pb, mask=mask)
            if ROUND == 2:
                tl.store(c_ptr + offs, _to_bf16(new - pb.to(tl.float32), HW_BF16), mask=mask)
    else:
        tl.store(p_ptr + offs, new, mask=mask)


@triton.jit
def _sgd_kernel(table_ptr, lr_ptr, lr_mult, scale_ptr, found_inf_ptr, seed_ptr, momentum, weight_decay,
                HAS_MOMENTUM: tl.constexpr, NESTEROV: tl.constexpr, HAS_SCALE: tl.constexpr,
                HAS_INF: tl.constexpr, STATE_BF16: tl.constexpr, BLOCK: tl.constexpr, HW_BF16: tl.constexpr = False,
                ALIGNED: tl.constexpr = False, PARAM_BF16: tl.constexpr = False, ROUND: tl.constexpr = 0):
    # a row: p, g, momentum, [compensation where ROUND == 2], start, n, segment, group
    W: tl.constexpr = 8 if ROUND == 2 else 7
    pid = tl.program_id(0).to(tl.int64)
    row = table_ptr + pid * W
    if PARAM_BF16:  # bf16 master weights and gradients; the update computes in fp32
        p_ptr = tl.load(row).to(tl.pointer_type(tl.bfloat16))
        g_ptr = tl.load(row + 1).to(tl.pointer_type(tl.bfloat16))
    else:
        p_ptr = tl.load(row).to(tl.pointer_type(tl.float32))
        g_ptr = tl.load(row + 1).to(tl.pointer_type(tl.float32))
    if STATE_BF16:  # the buffer is stored in bf16; the update computes in fp32
        m_ptr = tl.load(row + 2).to(tl.pointer_type(tl.bfloat16))
    else:
        m_ptr = tl.load(row + 2).to(tl.pointer_type(tl.float32))
    c_ptr = tl.load(row + 3).to(tl.pointer_type(tl.bfloat16))  # read only where ROUND == 2
    if ALIGNED:  # every tensor 16-byte aligned (measured only: bench/sgd_state_bench.py)
        p_ptr = tl.multiple_of(p_ptr, 16)
        g_ptr = tl.multiple_of(g_ptr, 16)
        m_ptr = tl.multiple_of(m_ptr, 16)
    start = tl.load(row + W - 4)
    n = tl.load(row + W - 3)
    seg = tl.load(row + W - 2)
    group = tl.load(row + W - 1)
    if HAS_INF:
        n = tl.where(tl.load(found_inf_ptr) == 0, n, 0)  # skipped step: nothing read, nothing written
    offs = start + tl.arange(0, BLOCK)
    mask = offs < n
    lr = tl.load(lr_ptr + group) * lr_mult
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_SCALE:
        g = g / tl.load(scale_ptr)
    p = tl.load(p_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if ROUND == 2:
        p = p + tl.load(c_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    g = g + weight_decay * p
    if HAS_MOMENTUM:
        m = tl.load(m_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        m = momentum * m + g
        if STATE_BF16:
            tl.store(m_ptr + offs, _to_bf16(m, HW_BF16), mask=mask)
        else:
            tl.store(m_ptr + offs, m, mask=mask)
        if NESTEROV:
            g = g + momentum * m
        else:
            g = m
    seed = tl.load(seed_ptr)  # the stochastic rounding's step counter (unused unless ROUND == 1)
    _store_param(p_ptr, c_ptr, offs, mask, p - lr * g, seed, seg, PARAM_BF16, ROUND, HW_BF16)


@triton.jit
def _adamw_kernel(table_ptr, lr_ptr, lr_mult, scale_ptr, found_inf_ptr, step_ptr, seed_ptr, beta1, beta2, eps,
                  weight_decay, HAS_SCALE: tl.constexpr, HAS_INF: tl.constexpr, STATE_BF16: tl.constexpr,
                  BLOCK: tl.constexpr, HW_BF16: tl.constexpr = False, PARAM_BF16: tl.constexpr = False,
                  ROUND: tl.constexpr = 0):
    # a row: p, g, exp_avg, exp_avg_sq, [compensation where ROUND == 2], start, n, segment, group
    W: tl.constexpr = 9 if ROUND == 2 else 8
    pid = tl.program_id(0).to(tl.int64)
    row = table_ptr + pid * W
    if PARAM_BF16:
        p_ptr = tl.load(row).to(tl.pointer_type(tl.bfloat16))
        g_ptr = tl.load(row + 1).to(tl.pointer_type(tl.bfloat16))
    else:
        p_ptr = tl.load(row).to(tl.pointer_type(tl.float32))
        g_ptr = tl.load(row + 1).to(tl.pointer_type(tl.float32))
    if STATE_BF16:
        m_ptr = tl.load(row + 2).to(tl.pointer_type(tl.bfloat16))
        v_ptr = tl.load(row + 3).to(tl.pointer_type(tl.bfloat16))
    else:
        m_ptr = tl.load(row + 2).to(tl.pointer_type(tl.float32))
        v_ptr = tl.load(row + 3).to(tl.pointer_type(tl.float32))
    c_ptr = tl.load(row + 4).to(tl.pointer_type(tl.bfloat16))  # read only where ROUND == 2
    start = tl.load(row + W - 4)
    n = tl.load(row + W - 3)
    seg = tl.load(row + W - 2)
    group = tl.load(row + W - 1)
    if HAS_INF:
        n = tl.where(tl.load(found_inf_ptr) == 0, n, 0)
    offs = start + tl.arange(0, BLOCK)
    mask = offs < n
    lr = tl.load(lr_ptr + group) * lr_mult
    step = tl.load(step_ptr)
    bc1 = 1.0 - tl.exp(step * tl.log(beta1))
    bc2_sqrt = tl.sqrt(1.0 - tl.exp(step * tl.log(beta2)))
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_SCALE:
        g = g / tl.load(scale_ptr)
    p = tl.load(p_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if ROUND == 2:
        p = p + tl.load(c_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    m = tl.load(m_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    p = p * (1.0 - lr * weight_decay)
    m = m + (1.0 - beta1) * (g - m)
    v = beta2 * v + (1.0 - beta2) * g * g
    p = p - (lr / bc1) * m / (tl.sqrt(v) / bc2_sqrt + eps)
    if STATE_BF16:
        tl.store(m_ptr + offs, _to_bf16(m, HW_BF16), mask=mask)
        tl.store(v_ptr + offs, _to_bf16(v, HW_BF16), mask=mask)
    else:
        tl.store(m_ptr + offs, m, mask=mask)
        tl.store(v_ptr + offs, v, mask=mask)
    seed = tl.load(seed_ptr)  # the stochastic rounding's step counter (unused unless ROUND == 1)
    _store_param(p_ptr, c_ptr, offs, mask, p, seed, seg, PARAM_BF16, ROUND, HW_BF16)


def _common_ratio(new: list[float], ref: list[float] | None, rtol: float = 1e-9) -> float | None:
    """k with new[i] == k * ref[i] for every i (zeros only where ref is zero), or None."""
    if ref is None or len(ref) != len(new):
        return None
    k = None
    for a, r in zip(new, ref):
        if r == 0.0:
            if a != 0.0:
                return None
            continue
        c = a / r
        if k is None:
            k = c
        elif abs(c - k) > rtol * abs(k):
            return None
    return 1.0 if k is None else k


def triton_usable(device: torch.device) -> bool:
    import os

    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same element at every flat offset: strides agree on each dimension longer than one (a
    length-one dimension's stride is never used: a channels_last conv weight with one input
    channel has strides (9, 1, 3, 1) where its contiguous gradient has (9, 9, 3, 1))."""
    return a.shape == b.shape and all(sa == sb for n, sa, sb in zip(a.shape, a.stride(), b.stride()) if n > 1)


@torch.no_grad()
def set_master_dtype(p: torch.Tensor, dtype: torch.dtype, state: dict | None = None, rounding: str = "nearest") -> None:
    """``_FusedBase.set_master_dtype``; ``state`` the weight's optimizer state, if any."""
    if p.dtype == dtype:
        return
    comp = state.pop("kahan_comp", None) if state is not None else None
    w = p.data.float() + (comp.float() if comp is not None else 0.0)
    p.data = w.to(dtype)
    if dtype == torch.bfloat16 and rounding == "kahan" and state is not None:
        state["kahan_comp"] = (w - p.data.float()).to(torch.bfloat16)
    p.grad = None


class _Part:
    """The parameters of one master-weight dtype with gradients, as one launch reads them: their
    gradients, group ids, per-name state buffers and, for Kahan-rounded bf16 weights, the
    compensation buffers."""

    def __init__(self, dtype, ps, gid, state, comps):
        self.dtype, self.ps, self.gid, self.state, self.comps = dtype, ps, gid, state, comps
        self.table: BlockTable | None = None  # built on first launch

    @property
    def bf16(self) -> bool:
        return self.dtype == torch.bfloat16


class _FusedBase(torch.optim.Optimizer):
    _step_supports_amp_scaling = True  # GradScaler hands us grad_scale / found_inf tensors
    _buffers: tuple = ()  # the per-parameter state buffers, kept in ``state_dtype``

    def __init__(self, params, defaults, backend: str, state_dtype: torch.dtype = torch.float32,
                 rounding: str = "stochastic"):
        if backend not in ("auto", "triton", "torch"):
            raise ValueError(f"backend must be auto, triton or torch, got {backend!r}")
        if state_dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"state_dtype must be torch.float32 or torch.bfloat16, got {state_dtype}")
        if rounding not in ROUNDINGS:
            raise ValueError(f"rounding must be one of {', '.join(ROUNDINGS)}, got {rounding!r}")
        super().__init__(params, defaults)
        self.backend = backend
        # bf16: the state buffers (momentum; AdamW's two moments) are stored in bf16 and the update
        # computes in fp32 (one rounding per store): half the state's memory.
        self.state_dtype = state_dtype
        # Master weights are kept in their parameter's dtype: fp32, or bf16 (their gradients then bf16
        # too), each dtype one launch. A bf16 weight's update computes in fp32 and is stored as
        # ``rounding`` says (``_store_param``).
        self.rounding = rounding
        self._dummy: torch.Tensor | None = None
        self._lr_cache: list | None = None
        self._lr_dev: torch.Tensor | None = None
        self._plan_key: tuple | None = None
        self._plan_val: list[_Part] = []
        self.plan_builds = 0  # how often the plan was (re)built: once per address set in a steady loop

    def _use_triton(self, device) -> bool:
        return self.backend == "triton" or (self.backend == "auto" and triton_usable(device))

    @torch.no_grad()
    def set_master_dtype(self, p: torch.Tensor, dtype: torch.dtype) -> None:
        """Store the weight ``p`` in ``dtype`` (fp32 or bf16) from now on, between steps. To fp32 a
        Kahan-compensated weight takes its compensation back in; to bf16 it rounds to nearest and, under
        Kahan, keeps the rounding error (in bf16) as its compensation: the pair holds about 16 of fp32's
        24 significant bits. The gradient goes (the next backward makes one of the new dtype); the
        state buffers stay."""
        set_master_dtype(p, dtype, self.state.get(p) if p in self.state else None, self.rounding)
        self._plan_key = None

    def _round(self, part: _Part) -> int:
        return ROUNDINGS[self.rounding] if part.bf16 else 0

    def _seed(self, device) -> torch.Tensor:
        """The stochastic rounding's step counter, on the device (the step never reads it back); in the
        state of the first parameter, so a resumed run draws as the uninterrupted one."""
        st = self.state[self.param_groups[0]["params"][0]]
        if "sr_seed" not in st or st["sr_seed"].device != device:
            st["sr_seed"] = torch.zeros(1, dtype=torch.int64, device=device)
        return st["sr_seed"]

    def _lrs(self, device) -> tuple[torch.Tensor, float]:
        """(per-group lr array on the device, scalar multiplier): lr_g = array[g] * multiplier.

        A schedule scales every group's lr by the same factor each step; that factor travels as
        a kernel argument, so the array is uploaded only when the lrs' proportions change (a
        curvature refresh). A per-step upload from pageable memory would wait for the GPU to
        drain the stream every step.
        """
        lrs = [float(g["lr"]) for g in self.param_groups]
        if self._lr_dev is not None and self._lr_dev.device == device:
            k = _common_ratio(lrs, self._lr_cache)
            if k is not None:
                return self._lr_dev, k
        host = torch.tensor(lrs, dtype=torch.float32)
        if device.type == "cuda":
            host = host.pin_memory()  # the caching host allocator keeps it until the copy ran
        self._lr_dev = host.to(device, non_blocking=True)
        self._lr_cache = lrs
        return self._lr_dev, 1.0

    def _plan(self, *state_names) -> list[_Part]:
        """The parameters with gradients, one part per master-weight dtype (fp32 first), validated
        once per memory layout.

        The plan is keyed by the parameters' storage and which of them have gradients, not by
        the gradients' addresses: gradients set to None between steps come back elsewhere every
        step, and each part's block table refreshes their column in place (``BlockTable.update``).
        Their layout is checked when the plan is built; autograd's gradient layout contract (a dense
        parameter's gradient takes its strides) keeps it. New parameter storage, a gradient that
        appears or disappears, or a loaded state builds the plan again.
        """
        key = tuple((p.data_ptr(), p.grad is None) for g in self.param_groups for p in g["params"])
        if key != self._plan_key:
            parts = []
            for dtype, (ps, gid) in self._collect().items():
                comps = None
                if dtype == torch.bfloat16 and self.rounding == "kahan":
                    comps = self._state(ps, "kahan_comp", dtype=torch.bfloat16)[0]
                parts.append(_Part(dtype, ps, gid, self._state(ps, *state_names), comps))
            self._plan_val = parts
            self._plan_key = key
            self.plan_builds += 1
        return self._plan_val

    def load_state_dict(self, state_dict):
        """torch.optim casts loaded floating state to its parameter's dtype: bf16 buffers of fp32 weights
        would come back as fp32 (which the kernels would read as bf16 pairs), and fp32 state of bf16
        weights (momentum, AdamW's moments and step count) rounded to bf16. Each buffer is set again
        from the saved tensor, in the dtype this optimizer keeps it in."""
        self._plan_key = None  # state buffers are replaced
        saved = state_dict["state"]
        ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        super().load_state_dict(state_dict)
        keep = {**{k: self.state_dtype for k in self._buffers}, "fused_step": torch.float32,
                "kahan_comp": torch.bfloat16, "sr_seed": torch.int64}
        for i, p in zip(ids, [p for g in self.param_groups for p in g["params"]]):
            st = self.state.get(p)
            for k, dtype in keep.items():
                if st is not None and k in st and torch.is_tensor(saved.get(i, {}).get(k)):
                    st[k] = saved[i][k].to(device=p.device, dtype=dtype)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Gradients zeroed in place by one multi-tensor launch per dtype, as torch's fused and
        foreach optimizers do. ``torch.optim.Optimizer.zero_grad`` launches one fill per
        parameter unless the defaults name foreach or fused: with captured micro-batches
        (gradients kept, ``set_to_none=False``) that is 62 launches a step for ResNet-18, each
        shorter on the GPU than on the host, enough to put the captured Tri-Accel step 5% behind the
        captured static one (an H200, bench/results/archive/step_gap/h200_step_gap.json)."""
        if set_to_none:
            return super().zero_grad(set_to_none=True)
        if not hasattr(self, "_zero_grad_profile_name"):  # as torch.optim does (an unpickled optimizer)
            self._patch_step_function()
        # in torch's range: profiles and traces name the zeroing as they do for torch.optim's own
        with torch.autograd.profiler.record_function(self._zero_grad_profile_name):
            by_dtype: dict = {}
            for g in self.param_groups:
                for p in g["params"]:
                    if p.grad is None:
                        continue
                    if p.grad.grad_fn is not None:
                        p.grad.detach_()
                    else:
                        p.grad.requires_grad_(False)
                    if p.grad.is_sparse:
                        p.grad.zero_()
                    else:
                        by_dtype.setdefault((p.grad.device, p.grad.dtype), []).append(p.grad)
            for grads in by_dtype.values():
                torch._foreach_zero_(grads)

    def _collect(self) -> dict:
        """{master-weight dtype: (params with gradients, their group ids)}, fp32 first."""
        parts: dict = {torch.float32: ([], []), torch.bfloat16: ([], [])}
        for i, g in enumerate(self.param_groups):
            for p in g["params"]:
                if p.grad is not None:
                    if p.dtype not in parts or p.grad.dtype != p.dtype:
                        raise TypeError("fused optimizers keep fp32 or bf16 master weights, each with a gradient "
                                        f"of its dtype (got a {p.dtype} weight with a {p.grad.dtype} gradient)")
                    if not (_same_layout(p.grad, p) and _dense(p)):
                        # the kernels walk p, grad and state by flat offset: one dense layout for all
                        raise ValueError("fused optimizers need each gradient in its parameter's dense layout "
                                         f"(param strides {p.stride()}, grad strides {p.grad.stride()})")
                    parts[p.dtype][0].append(p)
                    parts[p.dtype][1].append(i)
        return {d: v for d, v in parts.items() if v[0]}

    def _state(self, ps, *names, dtype: torch.dtype | None = None) -> list[list[torch.Tensor]]:
        """Per-parameter state buffers (created as zeros on first use) in ``dtype`` (default the
        state dtype), one list per name."""
        dtype = dtype or self.state_dtype
        out = [[] for _ in names]
        for p in ps:
            st = self.state[p]
            for lst, n in zip(out, names):
                if n not in st:
                    st[n] = torch.zeros_like(p, dtype=dtype)
                if st[n].dtype != dtype or not _same_layout(st[n], p):
                    raise TypeError(f"{type(self).__name__}: state {n!r} is {st[n].dtype} {tuple(st[n].stride())}, "
                                    f"expected {dtype} in its parameter's layout")
                lst.append(st[n])
        return out

    def _shared(self, *keys):
        """Hyperparameters the one launch applies to every group: only lr may differ per group."""
        first = self.param_groups[0]
        for g in self.param_groups[1:]:
            for k in keys:
                if g[k] != first[k]:
                    raise ValueError(f"{type(self).__name__}: param groups differ in {k!r}; only lr may differ")
        return [first[k] for k in keys]

    def _flags(self, device):
        scale = getattr(self, "grad_scale", None)
        found = getattr(self, "found_inf", None)
        if self._dummy is None or self._dummy.device != device:  # allocated once, not a launch every step
            self._dummy = torch.zeros(1, device=device)
        dummy = self._dummy
        return scale, found, (scale if scale is not None else dummy), (found if found is not None else dummy)


class FusedSGD(_FusedBase):
    """``torch.optim.SGD`` (dampening 0) with per-group lr, in one launch per step (per master-weight
    dtype)."""

    _buffers = ("momentum_buffer",)

    def __init__(self, params, lr: float, momentum: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False,
                 backend: str = "auto", state_dtype: torch.dtype = torch.float32, rounding: str = "stochastic"):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov), backend,
                         state_dtype, rounding)

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        parts = self._plan("momentum_buffer")  # zeros = torch's clone(g) at step 1 (dampening 0)
        if not parts:
            return loss
        mom, wd, nest = self._shared("momentum", "weight_decay", "nesterov")
        dev = parts[0].ps[0].device
        scale, found, scale_t, found_t = self._flags(dev)
        stochastic = any(self._round(part) == 1 for part in parts)
        seed_t = self._seed(dev) if stochastic else scale_t  # read only where a part rounds stochastically
        for part in parts:
            (bufs,), rnd = part.state, self._round(part)
            gs = [p.grad for p in part.ps]
            if self._use_triton(dev):
                if part.table is None:
                    cols = [part.ps, gs, bufs] + ([part.comps] if rnd == 2 else [])
                    part.table = BlockTable(cols, BLOCK, extra=part.gid, dynamic=(1,))
                table = part.table.update(1, gs)
                lr_dev, lr_mult = self._lrs(dev)
                _sgd_kernel[(table.shape[0],)](table, lr_dev, float(lr_mult), scale_t, found_t, seed_t, float(mom),
                                               float(wd), HAS_MOMENTUM=mom != 0, NESTEROV=bool(nest),
                                               HAS_SCALE=scale is not None, HAS_INF=found is not None,
                                               STATE_BF16=self.state_dtype == torch.bfloat16, BLOCK=BLOCK,
                                               HW_BF16=hw_bf16(), ALIGNED=ALIGNED, PARAM_BF16=part.bf16, ROUND=rnd,
                                               num_warps=4)
            else:
                lrs = [self.param_groups[i]["lr"] for i in part.gid]
                sgd_step_ref(part.ps, gs, bufs, lrs, momentum=mom, weight_decay=wd, nesterov=nest,
                             inv_scale=None if scale is None else 1.0 / scale, found_inf=found,
                             rounding=self.rounding, comps=part.comps, seed=seed_t)
        if stochastic:
            seed_t.add_(1)
        return loss


class FusedAdamW(_FusedBase):
    """``torch.optim.AdamW`` (no amsgrad) with per-group lr, in one launch per step (per master-weight
    dtype).

    The step count lives on the device and advances only on steps that were not skipped.
    """

    _buffers = ("exp_avg", "exp_avg_sq")

    def __init__(self, params, lr: float, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2,
                 backend: str = "auto", state_dtype: torch.dtype = torch.float32, rounding: str = "stochastic"):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay), backend,
                         state_dtype, rounding)

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        parts = self._plan("exp_avg", "exp_avg_sq")
        if not parts:
            return loss
        (b1, b2), eps, wd = self._shared("betas", "eps", "weight_decay")
        dev = parts[0].ps[0].device
        scale, found, scale_t, found_t = self._flags(dev)
        stochastic = any(self._round(part) == 1 for part in parts)
        seed_t = self._seed(dev) if stochastic else scale_t  # read only where a part rounds stochastically
        st0 = self.state[self.param_groups[0]["params"][0]]
        if "fused_step" not in st0:
            st0["fused_step"] = torch.zeros(1, dtype=torch.float32, device=dev)
        step_t = st0["fused_step"]
        if found is not None:
            step_t.add_((found.reshape(-1)[:1] == 0).float())  # a skipped step does not count
        else:
            step_t.add_(1.0)
        for part in parts:
            (ms, vs), rnd = part.state, self._round(part)
            gs = [p.grad for p in part.ps]
            if self._use_triton(dev):
                if part.table is None:
                    cols = [part.ps, gs, ms, vs] + ([part.comps] if rnd == 2 else [])
                    part.table = BlockTable(cols, BLOCK, extra=part.gid, dynamic=(1,))
                table = part.table.update(1, gs)
                lr_dev, lr_mult = self._lrs(dev)
                _adamw_kernel[(table.shape[0],)](table, lr_dev, float(lr_mult), scale_t, found_t, step_t, seed_t,
                                                 float(b1), float(b2), float(eps), float(wd),
                                                 HAS_SCALE=scale is not None, HAS_INF=found is not None,
                                                 STATE_BF16=self.state_dtype == torch.bfloat16, BLOCK=BLOCK,
                                                 HW_BF16=hw_bf16(), PARAM_BF16=part.bf16, ROUND=rnd, num_warps=4)
            else:
                lrs = [self.param_groups[i]["lr"] for i in part.gid]
                adamw_step_ref(part.ps, gs, ms, vs, lrs, int(step_t.item()), beta1=b1, beta2=b2, eps=eps,
                               weight_decay=wd, inv_scale=None if scale is None else 1.0 / scale, found_inf=found,
                               rounding=self.rounding, comps=part.comps, seed=seed_t)
        if stochastic:
            seed_t.add_(1)
        return loss
