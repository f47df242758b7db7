"""Gradient statistics and fused optimizer kernels against the torch paths, on the GPU.

    python3 bench/kernels_bench.py --out bench/results/kernels/h200_kernels.json

Per call (triton.testing.do_bench) includes the host's launch cost, as a training loop pays it;
``gpu_only_us`` replays each path from a CUDA graph, the device's time alone.
Tensors: ResNet-18's 62 parameter tensors (11.2 M values) and the same 62 tensors at 10x
the size (112 M values). Times are medians of CUDA-event timings (triton.testing.do_bench:
warm-up, L2 flushed between repeats). Bandwidth counts the bytes each operation must move.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write  # noqa: E402

from triaccel.kernels.fused_optim import FusedAdamW, FusedSGD  # noqa: E402
from triaccel.kernels.stats import grad_stats_triton  # noqa: E402
from triaccel.models import ResNet18Cifar  # noqa: E402


def timeit(fn) -> float:
    """Median microseconds."""
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3


def graph_time(fn) -> float | None:
    """Median microseconds of replaying ``fn`` captured in a CUDA graph: device time without host cost."""
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                fn()  # warm-up outside the capture (compiles, caches block tables)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        return timeit(g.replay)
    except Exception as e:  # report, do not lose the rest of the run
        print("graph capture failed:", repr(e), flush=True)
        return None


def tensors(scale: int, dev) -> list[torch.Tensor]:
    shapes = [p.shape for p in ResNet18Cifar(10, 3).parameters()]
    g = torch.Generator(device=dev).manual_seed(0)
    return [torch.randn(s.numel() * scale, device=dev, generator=g) for s in shapes]


def bench_stats(ts) -> dict:
    n = sum(t.numel() for t in ts)
    nbytes = 4 * n
    flat = torch.empty(n, device=ts[0].device)
    out = {"n_tensors": len(ts), "n_values": n}
    out["loop_var_mean_us"] = timeit(lambda: [torch.var_mean(t) for t in ts])
    out["foreach_norm_us"] = timeit(lambda: torch._foreach_norm(ts))
    sweep = {}
    configs = [(4096, 1, 8, True), (2048, 1, 4, True), (1024, 1, 4, True), (2048, 2, 4, True), (2048, 4, 4, True),
               (4096, 8, 8, True), (1024, 4, 4, False), (1024, 16, 4, False), (2048, 8, 4, False),
               (2048, 8, 8, False), (4096, 4, 8, False), (1024, 32, 4, False), (512, 32, 2, False)]
    for block, iters, warps, unroll in configs:
        key = f"B{block}_I{iters}_W{warps}_{'U' if unroll else 'L'}"
        sweep[key] = timeit(lambda: grad_stats_triton(ts, block=block, iters=iters, num_warps=warps, unroll=unroll))
    out["triton_sweep_us"] = sweep
    out["triton_default_us"] = timeit(lambda: grad_stats_triton(ts))
    # GPU time alone: each path captured once in a CUDA graph and replayed (no host launch cost)
    out["gpu_only_us"] = {name: graph_time(fn) for name, fn in (
        ("loop_var_mean", lambda: [torch.var_mean(t) for t in ts]), ("foreach_norm", lambda: torch._foreach_norm(ts)),
        ("triton_default", lambda: grad_stats_triton(ts)))}
    out["triton_best"] = min(sweep, key=sweep.get)
    out["triton_us"] = min(sweep.values())
    out["copy_us"] = timeit(lambda: flat.clone())
    out["copy_TBps"] = 2 * nbytes / out["copy_us"] / 1e6  # read + write
    out["triton_TBps"] = nbytes / out["triton_us"] / 1e6  # read once
    out["triton_vs_foreach_x"] = out["foreach_norm_us"] / out["triton_us"]
    out["triton_frac_of_copy_bw"] = out["triton_TBps"] / out["copy_TBps"]
    g = out["gpu_only_us"]
    if g["triton_default"] and g["foreach_norm"]:
        out["gpu_only_triton_vs_foreach_x"] = g["foreach_norm"] / g["triton_default"]
        out["gpu_only_triton_frac_of_copy_bw"] = nbytes / g["triton_default"] / 1e6 / out["copy_TBps"]
    return out


def bench_optim(ts, kind: str) -> dict:
    dev = ts[0].device
    ps = [t.clone().requires_grad_() for t in ts]
    for p in ps:
        p.grad = torch.randn_like(p) * 1e3  # "scaled" gradients
    groups = [{"params": [p], "lr": 0.1 / (1 + i)} for i, p in enumerate(ps)]  # one group per layer
    scale = torch.full((), 1024.0, device=dev)
    inv = torch.full((), 1.0, device=dev)  # same traffic as a real unscale; keeps magnitudes fixed across repeats
    found = torch.zeros((), device=dev)
    grads = [p.grad for p in ps]
    n = sum(p.numel() for p in ps)
    if kind == "sgd":
        ref = torch.optim.SGD(groups, lr=0.1, momentum=0.9, weight_decay=5e-4, foreach=True)
        fused = FusedSGD([{"params": [p], "lr": g["lr"]} for p, g in zip(ps, groups)], lr=0.1, momentum=0.9,
                         weight_decay=5e-4, backend="triton")
        bytes_per = 5 * 4  # read p, g, m; write p, m
    else:
        ref = torch.optim.AdamW(groups, lr=1e-3, weight_decay=1e-2, fused=True)
        fused = FusedAdamW([{"params": [p], "lr": g["lr"]} for p, g in zip(ps, groups)], lr=1e-3,
                           weight_decay=1e-2, backend="triton")
        bytes_per = 7 * 4  # read p, g, m, v; write p, m, v

    def torch_path():
        # what a GradScaler does beside a torch optimizer: unscale + inf check, then the step
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv)
        ref.step()

    def fused_path():
        fused.grad_scale, fused.found_inf = scale, found
        fused.step()

    ref.step()
    fused_path()  # allocate state
    out = {"n_values": n, "param_groups": len(groups)}
    out["torch_us"] = timeit(torch_path)
    out["fused_us"] = timeit(fused_path)
    out["speedup_x"] = out["torch_us"] / out["fused_us"]
    out["fused_TBps"] = bytes_per * n / out["fused_us"] / 1e6
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dev = torch.device("cuda")
    res = {}
    for scale in (1, 10):
        ts = tensors(scale, dev)
        key = "resnet18" if scale == 1 else "resnet18_x10"
        res[key] = {"stats": bench_stats(ts), "sgd": bench_optim(ts, "sgd"), "adamw": bench_optim(ts, "adamw")}
        print(key, res[key], flush=True)
        del ts
        torch.cuda.empty_cache()
    for k in res:
        res[k]["sgd"]["fused_frac_of_copy_bw"] = res[k]["sgd"]["fused_TBps"] / res[k]["stats"]["copy_TBps"]
        res[k]["adamw"]["fused_frac_of_copy_bw"] = res[k]["adamw"]["fused_TBps"] / res[k]["stats"]["copy_TBps"]
    write(args.out, {"what": "kernels vs torch paths; medians of CUDA-event timings", "results": res})


if __name__ == "__main__":
    main()
