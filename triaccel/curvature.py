"""§3.2 sparse second-order signals: top-k eigenvalues of each layer's Hessian block.

Subspace (block power) iteration with Rayleigh-Ritz, per layer l:

    W_l = H_ll V_l,   T_l = V_l^T W_l,   (theta, Q) = eigh(T_l),   V_l <- orth(W_l Q)

theta converges to the k eigenvalues of H_ll of largest magnitude. Products are Pearlmutter's
(the vector-Jacobian product of the gradient, autograd's double backward): the Hessian autograd
differentiates, so the eigvalsh test holds exactly. What keeps it cheap:

- CUDA graphs (``graphs``, on by default on CUDA): forward, ``create_graph`` backward and all
  products of one iteration are captured once and replayed per iteration. An eager product
  is hundreds of small launches (48.5 ms at b=32 on an H200, host-bound); replayed, it costs
  its GPU time. The probe batch lives in fixed tensors (``static_inputs``) for this.
- warm start: V is kept between refreshes (every ``every`` steps the Hessian moves little),
  so a few iterations suffice; iteration stops when every layer's theta moved less than ``tol``
  (relative) or after ``max_iters``;
- ``mode="batched"``: one product serves every layer. With v = sum_l s_l v_l and independent
  random signs s_l = +-1, s_l (Hv)_l = H_ll v_l + sum_{m != l} s_l s_m H_lm v_m: the block
  product plus zero-mean cross terms. k products per iteration for the whole model instead of
  k per layer; noisy (a single draw can be far off), which only the controller's EMA over
  refreshes averages. ``mode="exact"`` differentiates layer l's gradient by layer l's weights
  only (one product per layer and vector; what the eigvalsh test checks).
- the small algebra of every layer (k x k Rayleigh quotient and Gram matrix, eigh, Cholesky)
  runs on the host in float64 after one device-to-host copy per iteration, and the new bases
  go back in one copy: one synchronisation per iteration, not one per layer.
- BatchNorm stays in train mode (the probe sees the training loss, not the eval-mode function
  PyHessian differentiates), and its running statistics are snapshotted and restored, so the
  probe leaves no trace in the model.

Not finite differences of gradients: on ReLU networks a difference of gradients jumps wherever
an activation changes sign, and the estimate grows without bound as the step shrinks (a small
ReLU CNN: lambda_max 0.56 by autograd, 4.7 / 40 / 105 by forward differences at relative steps
1e-3 / 1e-4 / 1e-5). The Fisher alternative costs nothing extra: the control loop accumulates
n * ||g_l||^2 from the gradient statistics it already has (``triaccel.kernels.variance_ema``).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn


def vmap_by_default(device: torch.device, params: list[torch.Tensor]) -> bool:
    """Autograd products: one vmapped backward per chunk on GPUs, except for NHWC (channels_last)
    weights: cuDNN's convolution backward asks for their memory format inside vmap, which torch
    2.11 does not implement (RuntimeError "NYI: querying is_contiguous inside of vmap"). Those
    probes run one backward per vector instead."""
    nhwc = any(p.dim() == 4 and not p.is_contiguous() and p.is_contiguous(memory_format=torch.channels_last)
               for p in params)
    return device.type == "cuda" and not nhwc


class HessianProbe:
    def __init__(self, model: nn.Module, layer_params: list[list[torch.nn.Parameter]], top_k: int = 5,
                 max_iters: int = 20, tol: float = 1e-3, mode: str = "batched", seed: int = 0,
                 graphs: bool | None = None, vmap: bool | None = None, chunk: int = 32, log: Callable[[str], None] = print):
        if mode not in ("batched", "exact"):
            raise ValueError(f"mode must be batched or exact, got {mode!r}")
        self.model = model
        self.layer_params = layer_params
        self.params = [p for ps in layer_params for p in ps]
        self.k = top_k
        self.max_iters = max_iters
        self.tol = tol
        self.mode = mode
        self.log = log
        self.gen = torch.Generator().manual_seed(seed)
        self.last_iters = 0
        self.last_hvps = 0
        self.device = self.params[0].device
        self.dims = [sum(p.numel() for p in ps) for ps in layer_params]
        self.rows = [0]  # layer l owns rows rows[l]:rows[l+1] of the stacked bases
        for d in self.dims:
            self.rows.append(self.rows[-1] + d)
        self.ks = [min(top_k, d) for d in self.dims]
        self.kmax = max(self.ks)
        self.V: torch.Tensor | None = None  # (sum of dims, kmax): every layer's basis, stacked
        self.vmap = vmap_by_default(self.device, self.params) if vmap is None else vmap
        self.chunk = max(1, chunk)
        self.graphs = self.device.type == "cuda" if graphs is None else graphs
        self._graph = None
        self._graph_out: torch.Tensor | None = None
        self._cot: torch.Tensor | None = None

    # ------------------------------------------------------------------ public
    def estimate(self, loss_fn: Callable[[], torch.Tensor], static_inputs: bool = False) -> list[list[float]]:
        """Top-k eigenvalues (largest magnitude first) of every layer's Hessian block.

        ``static_inputs``: ``loss_fn`` reads the same input tensors on every call (their values
        may change), so an iteration may be captured once in a CUDA graph and replayed."""
        buffers = {n: b.detach().clone() for n, b in self.model.named_buffers()}
        try:
            return self._estimate(loss_fn, static_inputs)
        finally:
            with torch.no_grad():
                for n, b in self.model.named_buffers():
                    b.copy_(buffers[n])

    def drop_graph(self) -> None:
        """Forget the captured probe (its input tensors are about to change)."""
        self._graph, self._graph_out = None, None

    def layer_basis(self, li: int) -> torch.Tensor:
        return self.V[self.rows[li]:self.rows[li + 1], :self.ks[li]]

    # ------------------------------------------------------------------ iteration
    def _estimate(self, loss_fn, static_inputs: bool) -> list[list[float]]:
        if self.V is None:
            self.V = torch.zeros(self.rows[-1], self.kmax, device=self.device)
            for li in range(len(self.dims)):
                v = torch.randn(self.dims[li], self.ks[li], generator=self.gen, dtype=torch.float64)
                self.layer_basis(li).copy_(torch.linalg.qr(v).Q)
        products = self._autograd_products(loss_fn, static_inputs)
        theta_prev: list[torch.Tensor | None] = [None] * len(self.dims)
        thetas: list[torch.Tensor] = []
        hvps = 0
        it = 0
        for it in range(self.max_iters):
            W = products()
            hvps += self.kmax if self.mode == "batched" else sum(self.ks)
            thetas, done = self._rayleigh_ritz(W, theta_prev)
            theta_prev = thetas
            if done and it > 0:
                break
        self.last_iters, self.last_hvps = it + 1, hvps
        return [t.tolist() for t in thetas]

    def _rayleigh_ritz(self, W: torch.Tensor, theta_prev) -> tuple[list[torch.Tensor], bool]:
        """theta_l = eig(V_l^T W_l); V_l <- orthonormal basis of W_l Q_l (Cholesky QR).

        Per layer two k x k products on the device, then one copy to the host for all layers;
        eigh and Cholesky in float64 there; one copy back of the k x k maps C_l with
        V_l <- W_l C_l. A layer whose products are (numerically) rank deficient falls back to
        a Householder QR on the device."""
        L, K = len(self.dims), self.kmax
        small = torch.zeros(L, 2, K, K, device=self.device, dtype=torch.float64)
        for li in range(L):
            r0, r1, k = self.rows[li], self.rows[li + 1], self.ks[li]
            V, Wl = self.V[r0:r1, :k].double(), W[r0:r1, :k].double()
            small[li, 0, :k, :k] = V.T @ Wl
            small[li, 1, :k, :k] = Wl.T @ Wl
        small = small.cpu()
        C = torch.zeros(L, K, K, dtype=torch.float64)
        qr_layers, thetas, done = [], [], True
        for li in range(L):
            k = self.ks[li]
            T, G = small[li, 0, :k, :k], small[li, 1, :k, :k]
            theta, Q = torch.linalg.eigh(0.5 * (T + T.T))
            order = theta.abs().argsort(descending=True)
            theta, Q = theta[order], Q[:, order]
            thetas.append(theta)
            chol, info = torch.linalg.cholesky_ex(Q.T @ G @ Q)
            if int(info) != 0 or not bool(torch.isfinite(chol).all()) or \
                    float(chol.diagonal().min()) < 1e-7 * float(chol.diagonal().max()):
                qr_layers.append((li, Q))
            else:
                C[li, :k, :k] = Q @ torch.linalg.inv(chol.T)
            prev = theta_prev[li]
            # converged when no Ritz value moved by more than tol x the layer's largest |lambda|
            # (compared sorted, so two values swapping places is not a move; a near-zero value
            # is not held to a tolerance relative to itself)
            if prev is None or bool((theta.sort().values - prev.sort().values).abs().max()
                                    > self.tol * theta.abs().max().clamp_min(1e-12)):
                done = False
        C = C.to(self.device, torch.float32, non_blocking=True)
        for li in range(L):
            r0, r1, k = self.rows[li], self.rows[li + 1], self.ks[li]
            self.V[r0:r1, :k] = W[r0:r1, :k] @ C[li, :k, :k]
        for li, Q in qr_layers:
            r0, r1, k = self.rows[li], self.rows[li + 1], self.ks[li]
            Z = W[r0:r1, :k] @ Q.to(self.device, torch.float32)
            self.V[r0:r1, :k] = torch.linalg.qr(Z).Q
        return thetas, done

    # ------------------------------------------------------------------ products
    # Every iteration: the cotangents of its products are written as the rows of COT (K x D, row
    # j: sign_l * V_l[:, j] on every layer's rows), ``run`` fills OUT (K x D) with the products,
    # and W_l = sign_l * OUT[:, rows_l]^T. ``batched``: product j is H @ COT[j] for all layers at
    # once; ``exact``: for each layer l and column j, H_ll @ V_l[:, j] alone, into OUT[j, rows_l].
    def _products(self, cot: torch.Tensor, run: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
        L, K, D = len(self.dims), self.kmax, self.rows[-1]

        def products(signs: torch.Tensor | None = None) -> torch.Tensor:
            """``signs`` (L x K of +-1): batched mode's draw, fresh from the probe's generator when None."""
            if self.mode == "exact":
                signs = torch.ones(L, K)
            elif signs is None:
                signs = (torch.randint(0, 2, (L, K), generator=self.gen) * 2 - 1).float()
            signs = signs.to(self.device, non_blocking=True)
            for li in range(L):
                r0, r1 = self.rows[li], self.rows[li + 1]
                torch.mul(self.V[r0:r1].T, signs[li][:, None], out=cot[:, r0:r1])
            out = run()
            W = torch.empty(D, K, device=self.device)
            for li in range(L):
                r0, r1 = self.rows[li], self.rows[li + 1]
                torch.mul(out[:, r0:r1].T, signs[li], out=W[r0:r1])
            return W

        return products

    def _param_views(self, row: torch.Tensor) -> list[torch.Tensor]:
        views, i = [], 0
        for p in self.params:
            views.append(row[i:i + p.numel()].view_as(p))
            i += p.numel()
        return views

    def _layer_param_index(self) -> list[list[int]]:
        out, i = [], 0
        for ps in self.layer_params:
            out.append(list(range(i, i + len(ps))))
            i += len(ps)
        return out

    def _captured(self, fn: Callable[[], torch.Tensor], static_inputs: bool) -> Callable[[], torch.Tensor]:
        """``fn`` as is, or, on CUDA with static inputs, captured once in a CUDA graph and
        replayed (the returned tensor is the graph's output, overwritten by the next replay)."""
        if not (self.graphs and static_inputs and self.device.type == "cuda"):
            return fn
        if self._graph is None:
            try:
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):  # warm-up outside capture: cuDNN autotuning, lazy inits
                    for _ in range(2):
                        fn()
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    out = fn()
                self._graph, self._graph_out = graph, out
            except Exception as e:  # noqa: BLE001 - any capture failure: say so, run eagerly from now on
                torch.cuda.synchronize()
                self.graphs = False
                self._graph, self._graph_out = None, None
                self.log(f"[curvature] CUDA graph capture failed ({type(e).__name__}: {str(e).splitlines()[0]}); "
                         "the probe runs eagerly")
                return fn
        graph, out = self._graph, self._graph_out

        def replay() -> torch.Tensor:
            graph.replay()
            return out

        return replay

    def _autograd_products(self, loss_fn, static_inputs: bool) -> Callable[[], torch.Tensor]:
        """Pearlmutter's product: the vector-Jacobian product of the gradient with cotangent v
        (H is symmetric). ``exact`` differentiates only layer l's gradient with respect to
        layer l's weights (autograd prunes the rest of the graph). Eagerly, the ``create_graph``
        backward is taken once per refresh and every product is one more backward through it; on
        CUDA the products of a chunk run as one vmapped backward (``is_grads_batched``). With a
        CUDA graph (static inputs), forward, first backward and all products of an iteration
        are captured once and replayed per iteration."""
        params = self.params
        by_layer = self._layer_param_index()
        L = len(self.dims)
        if self.mode == "exact":
            groups = [(by_layer[li], self.ks[li]) for li in range(L)]
        else:
            groups = [(list(range(len(params))), self.kmax)]

        def products_into(out: torch.Tensor, cot: torch.Tensor, flat_g) -> torch.Tensor:
            cviews = [self._param_views(cot[j]) for j in range(self.kmax)]
            oviews = [self._param_views(out[j]) for j in range(self.kmax)]
            for idx, k in groups:
                # a parameter the loss does not reach (unused by the forward, or only on some calls) has no
                # gradient, and one whose gradient is constant has no graph: their products are zero
                live = [pi for pi in idx if flat_g[pi] is not None and flat_g[pi].requires_grad]
                if not live:
                    continue
                outs, ins = [flat_g[pi] for pi in live], [params[pi] for pi in idx]
                if self.vmap:
                    try:
                        for c0 in range(0, k, self.chunk):
                            js = range(c0, min(k, c0 + self.chunk))
                            hv = torch.autograd.grad(outs, ins, grad_outputs=[torch.stack([cviews[j][pi] for j in js])
                                                                              for pi in live],
                                                     retain_graph=True, is_grads_batched=True, allow_unused=True)
                            for h, pi in zip(hv, idx):
                                if h is not None:
                                    for b, j in enumerate(js):
                                        oviews[j][pi].copy_(h[b])
                        continue
                    except RuntimeError as e:  # an op without a batching rule: one backward per vector from now on
                        if "vmap" not in str(e):
                            raise
                        self.vmap = False
                for j in range(k):
                    hv = torch.autograd.grad(outs, ins, grad_outputs=[cviews[j][pi] for pi in live], retain_graph=True,
                                             allow_unused=True)
                    for h, pi in zip(hv, idx):
                        if h is not None:
                            oviews[j][pi].copy_(h)
            return out

        if self._cot is None:  # kept across refreshes: a captured graph reads it
            self._cot = torch.zeros(self.kmax, self.rows[-1], device=self.device)
        cot = self._cot
        if self.graphs and static_inputs and self.device.type == "cuda":
            def whole() -> torch.Tensor:  # forward, first backward and products: one graph per iteration
                flat_g = torch.autograd.grad(loss_fn(), params, create_graph=True, allow_unused=True)
                return products_into(torch.zeros_like(cot), cot, flat_g)

            run = self._captured(whole, static_inputs)
        else:  # the first backward once per refresh, one more backward per product
            flat_g = torch.autograd.grad(loss_fn(), params, create_graph=True, allow_unused=True)
            out = torch.zeros_like(cot)

            def run() -> torch.Tensor:
                return products_into(out.zero_(), cot, flat_g)

        return self._products(cot, run)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        gen = self.gen.get_state()  # the batched probe's random signs: a resumed run draws the same ones
        if self.V is None:
            return {"V": [None] * len(self.dims), "gen": gen}
        return {"V": [self.layer_basis(li).cpu() for li in range(len(self.dims))], "gen": gen}

    def load_state_dict(self, s: dict) -> None:
        if s.get("gen") is not None:
            self.gen.set_state(s["gen"])
        Vs = list(s["V"])
        if any(v is None for v in Vs):
            self.V = None
            return
        self.V = torch.zeros(self.rows[-1], self.kmax, device=self.device)
        for li, v in enumerate(Vs):
            self.layer_basis(li).copy_(v.to(self.device))
