"""§3.2 sparse second-order signals: top-k eigenvalues of each layer's Hessian block.

Subspace (block power) iteration with Rayleigh-Ritz, per layer l:

    W_l = H_ll V_l,   T_l = V_l^T W_l,   (theta, Q) = eigh(T_l),   V_l <- orth(W_l)

theta converges to the k eigenvalues of H_ll of largest magnitude. What keeps it cheap:

- one forward and one first backward per refresh (``create_graph``); every Hessian-vector
  product after that is one more backward through that graph (no new forward);
- warm start: V_l is kept between refreshes (every ``every`` steps the Hessian moves little),
  so a few iterations suffice; iteration stops when every layer's theta moved less than ``tol``
  (relative);
- ``mode="batched"``: one HVP serves every layer. With v = sum_l s_l v_l and independent random
  signs s_l = +-1, s_l (Hv)_l = H_ll v_l + sum_{m != l} s_l s_m H_lm v_m: the block product plus
  zero-mean cross terms. k HVPs per iteration for the whole model instead of k per layer;
  noisier, which the controller's EMA over refreshes absorbs. ``mode="exact"`` runs one HVP per
  layer and vector (what the eigvalsh test checks).
- BatchNorm stays in train mode (the probe sees the training loss, not the eval-mode function
  PyHessian differentiates), and its running statistics are snapshotted and restored, so the
  probe leaves no trace in the model.

The Fisher alternative costs nothing extra: the control loop accumulates n * ||g_l||^2 from
the gradient statistics it already has (``triaccel.kernels.variance_ema``).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn


def vmap_by_default(device: torch.device, params: list[torch.Tensor]) -> bool:
    """One vmapped backward per chunk of HVPs on GPUs, except for NHWC (channels_last) weights:
    cuDNN's convolution backward asks for their memory format inside vmap, which torch 2.11 does
    not implement (RuntimeError "NYI: querying is_contiguous inside of vmap", seen on the H200).
    Those probes run one backward per vector instead."""
    nhwc = any(p.dim() == 4 and not p.is_contiguous() and p.is_contiguous(memory_format=torch.channels_last)
               for p in params)
    return device.type == "cuda" and not nhwc


class HessianProbe:
    def __init__(self, model: nn.Module, layer_params: list[list[torch.nn.Parameter]], top_k: int = 5,
                 max_iters: int = 20, tol: float = 1e-3, mode: str = "batched", seed: int = 0,
                 vmap: bool | None = None, chunk: int = 32):
        if mode not in ("batched", "exact"):
            raise ValueError(f"mode must be batched or exact, got {mode!r}")
        self.model = model
        self.layer_params = layer_params
        self.k = top_k
        self.max_iters = max_iters
        self.tol = tol
        self.mode = mode
        self.V: list[torch.Tensor | None] = [None] * len(layer_params)
        self.gen = torch.Generator().manual_seed(seed)
        self.last_iters = 0
        self.last_hvps = 0
        dev = next(p for ps in layer_params for p in ps).device
        params = [p for ps in layer_params for p in ps]
        self.vmap = vmap_by_default(dev, params) if vmap is None else vmap
        self.chunk = max(1, chunk)

    def _init_v(self, d: int, k: int, like: torch.Tensor) -> torch.Tensor:
        v = torch.randn(d, k, generator=self.gen).to(like.device, torch.float32)
        return torch.linalg.qr(v).Q

    def estimate(self, loss_fn: Callable[[], torch.Tensor]) -> list[list[float]]:
        """Top-k eigenvalues (largest magnitude first) of every layer's Hessian block."""
        buffers = {n: b.detach().clone() for n, b in self.model.named_buffers()}
        try:
            return self._estimate(loss_fn)
        finally:
            with torch.no_grad():
                for n, b in self.model.named_buffers():
                    b.copy_(buffers[n])

    def _estimate(self, loss_fn) -> list[list[float]]:
        params = [p for ps in self.layer_params for p in ps]
        loss = loss_fn()
        grads = torch.autograd.grad(loss, params, create_graph=True)
        g_layers, i = [], 0
        for ps in self.layer_params:
            g_layers.append(list(grads[i:i + len(ps)]))
            i += len(ps)
        dims = [sum(p.numel() for p in ps) for ps in self.layer_params]
        ks = [min(self.k, d) for d in dims]
        for li, (d, k) in enumerate(zip(dims, ks)):
            if self.V[li] is None or self.V[li].shape != (d, k):
                self.V[li] = self._init_v(d, k, params[0])
        theta_prev: list[torch.Tensor | None] = [None] * len(dims)
        thetas = [None] * len(dims)
        hvps = 0
        for it in range(self.max_iters):
            W = self._products(g_layers, params, dims, ks)
            hvps += max(ks) if self.mode == "batched" else sum(ks)
            done = True
            for li in range(len(dims)):
                V, Wl = self.V[li], W[li]
                T = V.T @ Wl
                T = 0.5 * (T + T.T)
                theta, Q = torch.linalg.eigh(T)
                order = theta.abs().argsort(descending=True)
                theta = theta[order]
                thetas[li] = theta
                # next subspace: orthonormalised products, rotated onto the Ritz vectors
                self.V[li] = torch.linalg.qr(Wl @ Q[:, order]).Q
                prev = theta_prev[li]
                # converged when no Ritz value moved by more than tol x the layer's largest |lambda|
                # (compared sorted, so two values swapping places is not a move; a near-zero value
                # is not held to a tolerance relative to itself). Note: while training moves the
                # model between refreshes, k=5 refreshes still ran max_iters=8 at tol 1e-2..1e-1
                # (small CNN on digits, CPU): the cost is max_iters x the HVPs, as benchmarked.
                if prev is None or bool((theta.sort().values - prev.sort().values).abs().max()
                                        > self.tol * theta.abs().max().clamp_min(1e-12)):
                    done = False
                theta_prev[li] = theta
            if done and it > 0:
                break
        self.last_iters, self.last_hvps = it + 1, hvps
        return [t.tolist() for t in thetas]

    def _products(self, g_layers, params, dims, ks) -> list[torch.Tensor]:
        """W_l = H_ll V_l for every layer: exactly, or through shared sign-mixed HVPs.

        An HVP is the vector-Jacobian product of the gradient with cotangent v (H is
        symmetric). Each probe vector is a cotangent over all parameters: ``exact`` puts
        v_lj on layer l and zeros elsewhere (one product per layer and vector; its l-block is
        exactly H_ll v_lj); ``batched`` puts s_l v_lj on every layer at once (one product per
        vector j for the whole model). On CUDA the products of an iteration run as one
        vmapped backward (``is_grads_batched``), ``chunk`` cotangents at a time.
        """
        L = len(dims)
        dev = params[0].device
        W = [torch.zeros(d, k, device=dev) for d, k in zip(dims, ks)]
        offsets = [0]
        for ps in self.layer_params:
            offsets.append(offsets[-1] + len(ps))
        jobs = []  # (cotangent per layer: {layer: (flat vector, sign)}, [(layer, column, sign)])
        if self.mode == "exact":
            for li in range(L):
                for j in range(ks[li]):
                    jobs.append(({li: (self.V[li][:, j], 1.0)}, [(li, j, 1.0)]))
        else:
            for j in range(max(ks)):
                signs = (torch.randint(0, 2, (L,), generator=self.gen) * 2 - 1).tolist()
                jobs.append(({li: (self.V[li][:, j], signs[li]) for li in range(L) if j < ks[li]},
                             [(li, j, signs[li]) for li in range(L) if j < ks[li]]))
        flat_g = [g for gl in g_layers for g in gl]
        for c0 in range(0, len(jobs), self.chunk):
            chunk = jobs[c0:c0 + self.chunk]
            cot = []
            for li, ps in enumerate(self.layer_params):
                for pi, p in enumerate(ps):
                    t = torch.zeros(len(chunk), *p.shape, device=dev)
                    start = sum(q.numel() for q in ps[:pi])
                    for b, (vecs, _) in enumerate(chunk):
                        if li in vecs:
                            v, sgn = vecs[li]
                            t[b] = sgn * v[start:start + p.numel()].view_as(p)
                    cot.append(t)
            rows = None
            if self.vmap:
                try:
                    hv = torch.autograd.grad(flat_g, params, grad_outputs=cot, retain_graph=True,
                                             is_grads_batched=True, allow_unused=True)
                    hv = [torch.zeros_like(c) if h is None else h for h, c in zip(hv, cot)]
                    rows = [[h[b] for h in hv] for b in range(len(chunk))]
                except RuntimeError as e:  # an op without a batching rule: one backward per vector from now on
                    if "vmap" not in str(e):
                        raise
                    self.vmap = False
            if rows is None:
                rows = []
                for b in range(len(chunk)):
                    out = torch.autograd.grad(flat_g, params, grad_outputs=[c[b] for c in cot], retain_graph=True,
                                              allow_unused=True)
                    rows.append([torch.zeros_like(p) if h is None else h for h, p in zip(out, params)])
            for b, (_, targets) in enumerate(chunk):
                for li, j, sgn in targets:
                    block = torch.cat([h.reshape(-1) for h in rows[b][offsets[li]:offsets[li + 1]]])
                    W[li][:, j] = sgn * block.detach()
        return W

    def state_dict(self) -> dict:
        return {"V": [None if v is None else v.cpu() for v in self.V]}

    def load_state_dict(self, s: dict) -> None:
        self.V = list(s["V"])
        dev = next(p for ps in self.layer_params for p in ps).device
        self.V = [None if v is None else v.to(dev) for v in self.V]


def _unflatten(flat: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    out, i = [], 0
    for p in like:
        out.append(flat[i:i + p.numel()].view_as(p))
        i += p.numel()
    return out
