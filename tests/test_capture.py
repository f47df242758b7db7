"""Captured micro-batches (``capture: true``, triaccel.capture): the same training as eager.

The CUDA tests skip in CI (no GPU) and run natively on the H200 through tests/run_gpu.sh.
"""
import pytest
import torch

from conftest import small_cfg
from triaccel.control import TriAccelLoop
from triaccel.errors import ConfigError
from triaccel.trainer import Trainer

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")


def fit(cfg, **kw):
    logs = []
    cbs = [TriAccelLoop(cfg.triaccel, log=logs.append)] if cfg.mode == "triaccel" else []
    t = Trainer(cfg, callbacks=cbs, log=logs.append, **kw).setup()
    t.fit()
    return t, logs


def test_capture_on_cpu_says_so_and_trains_as_eager():
    t0, _ = fit(small_cfg(mode="amp", amp_dtype="bf16", epochs=1))
    t1, logs = fit(small_cfg(mode="amp", amp_dtype="bf16", epochs=1, capture="true"))
    assert t1.graphs is None
    assert any("[capture]" in line and "eager" in line for line in logs)
    assert t1.history.epochs[-1]["train_loss"] == t0.history.epochs[-1]["train_loss"]


def test_capture_cap_is_checked():
    with pytest.raises(ConfigError, match="capture_cap"):
        small_cfg(capture_cap=0)


def _params(t):
    return torch.cat([p.detach().float().flatten() for p in t.model.parameters()])


@cuda
@pytest.mark.parametrize("mode,dtype,accum", [("amp", "bf16", 1), ("amp", "fp16", 1), ("amp", "bf16", 2),
                                              ("triaccel", "fp16", 1)])
def test_captured_training_matches_eager(mode, dtype, accum):
    over = dict(device="cuda", mode=mode, amp_dtype=dtype, accum_steps=accum, epochs=2, cudnn_benchmark="false")
    if mode == "triaccel":
        over.update({"triaccel.batch.enabled": "false", "triaccel.curvature.method": "fisher",
                     "triaccel.curvature.every": 5, "triaccel.control_every": 5})
    torch.backends.cudnn.deterministic = True
    try:
        eager, _ = fit(small_cfg(**over))
        capt, _ = fit(small_cfg(capture="true", **over))
    finally:
        torch.backends.cudnn.deterministic = False
    g = capt.graphs
    assert g.disabled is None
    # one key per (micro-batch shape, plan); the epoch's short last batch is a second shape
    assert 1 <= g.captures <= capt.cfg.capture_cap and g.replays > g.eager
    for e, c in zip(eager.history.epochs, capt.history.epochs):
        assert c["train_loss"] == pytest.approx(e["train_loss"], rel=2e-3)
        assert abs(c["val_acc"] - e["val_acc"]) <= 2.0
    assert torch.allclose(_params(capt), _params(eager), rtol=1e-2, atol=1e-3)


@cuda
@pytest.mark.parametrize("rounding,compiled", [("stochastic", False), ("kahan", False), ("stochastic", True)])
def test_captured_training_with_bf16_master_weights_matches_eager(rounding, compiled):
    """triaccel.precision.master_weights: bf16 under capture (and compile): the graphs hold bf16
    weights and gradients, the stochastic rounding's counter advances on replay as in eager steps,
    and training follows the eager run; the weights stay bf16."""
    over = {"device": "cuda", "mode": "triaccel", "amp_dtype": "fp16", "epochs": 2, "cudnn_benchmark": "false",
            "triaccel.batch.enabled": "false", "triaccel.curvature.method": "fisher", "triaccel.curvature.every": 5,
            "triaccel.control_every": 5, "triaccel.precision.master_weights": "bf16",
            "triaccel.precision.rounding": rounding}
    torch.backends.cudnn.deterministic = True
    try:
        eager, _ = fit(small_cfg(**over))
        capt, _ = fit(small_cfg(capture="true", **({"compile": "default"} if compiled else {}), **over))
    finally:
        torch.backends.cudnn.deterministic = False
    assert capt.graphs.disabled is None and capt.graphs.replays > capt.graphs.eager
    assert all(p.dtype == torch.bfloat16 for ps in capt.precision.layer_params for p in ps)
    for e, c in zip(eager.history.epochs, capt.history.epochs):
        assert c["train_loss"] == pytest.approx(e["train_loss"], rel=2e-2)
        assert abs(c["val_acc"] - e["val_acc"]) <= 3.0
    if rounding == "stochastic":
        seeds = [int(t.optimizer.state[t.optimizer.param_groups[0]["params"][0]]["sr_seed"]) for t in (eager, capt)]
        assert seeds[0] == seeds[1] > 0  # one draw per optimizer step, replayed or not


@cuda
@pytest.mark.parametrize("dtype,accum", [("bf16", 1), ("fp16", 1), ("bf16", 2)])
def test_fresh_gradients_train_as_zeroed_and_accumulated_ones(dtype, accum):
    """A window's first full micro-batch replays a graph that writes the gradients instead of
    adding into zeroed buffers (no zeroing, no per-parameter add): training must not change. With
    accum_steps=2 the window's second micro-batch adds into the fresh graph's gradients, and the
    epoch's short last batch starts from zeroed ones."""
    over = dict(device="cuda", mode="amp", amp_dtype=dtype, accum_steps=accum, epochs=2, cudnn_benchmark="false",
                capture="true")
    torch.backends.cudnn.deterministic = True
    try:
        cfg = small_cfg(**over)
        old = Trainer(cfg, log=lambda *a: None).setup()
        old.graphs.fresh_grads = False  # the micro-batch graphs add into zeroed buffers, as before
        old.fit()
        new, _ = fit(small_cfg(**over))
    finally:
        torch.backends.cudnn.deterministic = False
    g = new.graphs
    assert g.disabled is None and g.captures > 0 and g.replays > g.eager
    assert not any(k[-1] == "fresh" for k in old.graphs.seen)
    assert any(k[-1] == "fresh" for k in g.seen)
    assert new.skipped_steps == old.skipped_steps
    for e, c in zip(old.history.epochs, new.history.epochs):
        assert c["train_loss"] == pytest.approx(e["train_loss"], rel=1e-4)
    assert torch.allclose(_params(new), _params(old), rtol=1e-4, atol=1e-5)


@cuda
def test_a_fresh_graph_owns_the_gradients_and_a_new_one_replaces_every_graph():
    """The fresh graph's gradient tensors are the parameters' .grad and every replay writes the same
    ones. A new plan records a new fresh graph: it drops every live graph (they add into the old
    gradients) and records into a new pool (recording again into a pool whose graphs were all dropped
    trips torch's allocator). Training equals the same steps without fresh gradients throughout."""
    from triaccel.trainer import Decisions

    over = {"device": "cuda", "mode": "triaccel", "amp_dtype": "bf16", "epochs": 1, "batch_size": 256,
            "accum_steps": 2, "capture": "true", "cudnn_benchmark": "false",
            "triaccel.precision.enabled": "false", "triaccel.curvature.enabled": "false",
            "triaccel.batch.enabled": "false"}
    torch.backends.cudnn.deterministic = True
    try:
        ts = [Trainer(small_cfg(**over), log=lambda *a: None).setup() for _ in range(2)]
        ts[1].graphs.fresh_grads = False
        idx = torch.arange(256, device="cuda")
        for t in ts:  # eager, recorded, replayed: a fresh graph (first half) and an adding one (second)
            for _ in range(3):
                t.train_step(idx)
        g = ts[0].graphs
        assert len(g.graphs) == 2 and sum(k[-1] == "fresh" for k in g.graphs) == 1
        assert g.owner is not None and all(p.grad is q for p, q in zip(g.params, g.owner.grads))
        ptrs = [p.grad.data_ptr() for p in g.params]
        pool = g.pool
        for t in ts:
            t.train_step(idx)
        assert [p.grad.data_ptr() for p in g.params] == ptrs  # replays write the same tensors
        for t in ts:  # a new precision plan: new keys at a shape already recorded (recorded at once)
            t.apply(Decisions(levels={t.precision.names[0]: "fp32"}))
            for _ in range(3):
                t.train_step(idx)
        assert g.disabled is None and g.captures == 4 and len(g.graphs) == 2 and g.pool != pool
        assert all(p.grad is q for p, q in zip(g.params, g.owner.grads))
        assert torch.allclose(_params(ts[0]), _params(ts[1]), rtol=1e-4, atol=1e-5)
        g.reset()  # a batch change: the gradients are unset so the old pool goes back whole
        assert g.owner is None and all(p.grad is None for p in g.params) and not g.graphs
        for _ in range(3):
            ts[0].train_step(idx)
        assert g.captures == 6 and g.owner is not None and len(g.graphs) == 2
        assert g.stats()["graph_keys"] == 4  # the same two keys again: captures count them, graph_keys not
    finally:
        torch.backends.cudnn.deterministic = False


@cuda
def test_captured_peak_counts_the_graph_pool():
    over = dict(device="cuda", mode="amp", amp_dtype="bf16", epochs=3, batch_size=256)
    eager, _ = fit(small_cfg(**over))
    capt, _ = fit(small_cfg(capture="true", **over))
    m = capt.history.epochs[-1]
    assert m["graph_pool_gib"] > 0
    # a replay allocates nothing: without the pool the captured peak would be params + grads only
    assert m["peak_mem_gib"] >= 0.8 * eager.history.epochs[-1]["peak_mem_gib"]


@cuda
def test_failed_capture_goes_on_eager_and_says_why():
    cfg = small_cfg(device="cuda", mode="amp", amp_dtype="bf16", epochs=1, capture="true")
    t = Trainer(cfg, log=(logs := []).append).setup()

    class SyncInForward(torch.nn.Module):  # .item() synchronises: not allowed while recording
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, x):
            out = self.m(x)
            if torch.cuda.is_current_stream_capturing():
                out.sum().item()
            return out

    t.model = SyncInForward(t.model)
    t.fit()
    assert t.graphs.disabled is not None and t.graphs.replays == 0
    assert any("[capture]" in line and "eager" in line for line in logs)
    assert t.history.epochs[-1]["val_acc"] > 20


def test_a_space_declares_eager_and_captured_baselines():
    """baseline.capture lists the static steps a search trains as baselines: eager (what a user
    runs without us; the default) and captured. Trials must beat the best of them."""
    from triaccel.config import TrainConfig, from_dict
    from triaccel.search.space import parse_space

    lr = {"optim.lr": {"distribution": "uniform", "low": 0.1, "high": 0.2}}
    s = parse_space({"train": {"epochs": 2, "capture": True}, "params": lr,
                     "baseline": {"batch_sizes": [64], "capture": [False, True]}}, source="s.yaml")
    runs = dict(s.baseline_runs())
    assert set(runs) == {"amp-bf16-B64", "amp-bf16-B64-captured"}
    assert [from_dict(TrainConfig, runs[k]).capture for k in ("amp-bf16-B64", "amp-bf16-B64-captured")] == [False, True]
    default = parse_space({"train": {"epochs": 2, "capture": True}, "params": lr}, source="s.yaml")
    assert all(not d["capture"] for _, d in default.baseline_runs())  # the user's eager step by default
    with pytest.raises(ConfigError, match="s.yaml: baseline.capture: must be a non-empty list of true / false"):
        parse_space({"train": {"epochs": 2}, "params": lr, "baseline": {"capture": "yes"}}, source="s.yaml")


def test_a_space_declares_compiled_baselines():
    """baseline.compile adds the torch.compile'd forward to the static runs (on the H200 the strongest
    static run was captured + compiled, bench/results/h200_compile.json): each combination is one
    baseline, labelled; none is the eager forward; by default the baselines compile as the trials do."""
    from triaccel.config import TrainConfig, from_dict
    from triaccel.search.space import parse_space

    lr = {"optim.lr": {"distribution": "uniform", "low": 0.1, "high": 0.2}}
    s = parse_space({"train": {"epochs": 2}, "params": lr,
                     "baseline": {"batch_sizes": [64], "capture": [False, True],
                                  "compile": ["none", "default", "max-autotune-no-cudagraphs"]}}, source="s.yaml")
    runs = dict(s.baseline_runs())
    assert set(runs) == {"amp-bf16-B64", "amp-bf16-B64-captured", "amp-bf16-B64-compiled",
                         "amp-bf16-B64-captured-compiled", "amp-bf16-B64-compiled-max-autotune-no-cudagraphs",
                         "amp-bf16-B64-captured-compiled-max-autotune-no-cudagraphs"}
    cfg = {k: from_dict(TrainConfig, d) for k, d in runs.items()}
    assert (cfg["amp-bf16-B64-captured-compiled"].compile, cfg["amp-bf16-B64-captured-compiled"].capture) == \
        ("default", True)
    assert cfg["amp-bf16-B64"].compile is None and cfg["amp-bf16-B64-compiled"].capture is False
    # the default follows the trials' train.compile, labelled so
    same = parse_space({"train": {"epochs": 2, "compile": "default"}, "params": lr,
                        "baseline": {"batch_sizes": [64]}}, source="s.yaml")
    assert [k for k, _ in same.baseline_runs()] == ["amp-bf16-B64-compiled"]
    plain = parse_space({"train": {"epochs": 2, "compile": "default"}, "params": lr,
                         "baseline": {"batch_sizes": [64], "compile": [None]}}, source="s.yaml")
    assert [(k, d["compile"]) for k, d in plain.baseline_runs()] == [("amp-bf16-B64", None)]
    for bad, say in (("default", "must be a non-empty list"), ([], "must be a non-empty list"),
                     (["fast"], "'fast' is not one of none, default")):
        with pytest.raises(ConfigError, match=f"^s.yaml: baseline.compile: {say}"):
            parse_space({"train": {"epochs": 2}, "params": lr, "baseline": {"compile": bad}}, source="s.yaml")
    # reduce-overhead records its own graphs: with the captured step the baseline cannot be built, at load
    with pytest.raises(ConfigError, match="amp-bf16-B64-captured-compiled-reduce-overhead .* is not a valid config"):
        parse_space({"train": {"epochs": 2}, "params": lr, "baseline": {"batch_sizes": [64], "capture": [True],
                                                                          "compile": ["reduce-overhead"]}},
                    source="s.yaml")


def test_a_baseline_is_found_by_its_label_from_before_baseline_compile():
    """A search started before baseline.compile labelled its compiled baselines without the suffix;
    export and the second look look baselines up by that label (a KeyError traceback, found in review)."""
    from triaccel.search.space import parse_space

    lr = {"optim.lr": {"distribution": "uniform", "low": 0.1, "high": 0.2}}
    s = parse_space({"train": {"epochs": 2, "compile": "default"}, "params": lr,
                     "baseline": {"batch_sizes": [64]}}, source="s.yaml")
    assert s.baseline_train("amp-bf16-B64-compiled")["compile"] == "default"
    assert s.baseline_train("amp-bf16-B64") == s.baseline_train("amp-bf16-B64-compiled")
    with pytest.raises(ConfigError, match=r"^s.yaml: baseline: the search's baseline amp-fp16-B96 is not among "
                                          r"this space's \(amp-bf16-B64-compiled\)"):
        s.baseline_train("amp-fp16-B96")
    with pytest.raises(ConfigError, match=r"baseline.compile: 0 is not one of none"):
        parse_space({"train": {"epochs": 2}, "params": lr, "baseline": {"compile": [0]}}, source="s.yaml")


def test_checkpointed_blocks_save_rng_state_only_where_they_draw_random_numbers():
    """Blocks without dropout or stochastic depth skip the RNG-state copy (which a CUDA graph
    recording cannot make); EfficientNet-B0's blocks, which draw, keep it."""
    from triaccel.config import ModelConfig
    from triaccel.models import _draws_random, build_model, enable_checkpointing

    res = build_model(ModelConfig(name="resnet18"), 10, 3, 32)
    eff = build_model(ModelConfig(name="efficientnet_b0"), 10, 3, 32)
    assert not any(_draws_random(m) for b in res.blocks() for m in b.modules())
    assert any(_draws_random(m) for b in eff.blocks() for m in b.modules())
    assert enable_checkpointing(res) > 0
    x = torch.randn(2, 3, 32, 32, requires_grad=True)
    res(x).sum().backward()  # recomputation without a saved RNG state still gives gradients
    assert x.grad is not None and torch.isfinite(x.grad).all()


@cuda
def test_deferred_skip_with_a_captured_fp16_step_matches_the_synchronous_check():
    over = dict(device="cuda", mode="amp", amp_dtype="fp16", epochs=2, capture="true", cudnn_benchmark="false")
    torch.backends.cudnn.deterministic = True
    try:
        sync, _ = fit(small_cfg(**over))
        deferred, _ = fit(small_cfg(deferred_skip="true", **over))
    finally:
        torch.backends.cudnn.deterministic = False
    assert deferred.graphs.replays > 0 and deferred.skipped_steps == sync.skipped_steps
    assert deferred.schedule.done == sync.schedule.done
    # fused SGD against the default one: equal up to summation order
    assert torch.allclose(_params(deferred), _params(sync), rtol=1e-3, atol=1e-4)


@cuda
def test_a_batch_change_drops_the_graphs_and_releases_their_pool():
    """A shared pool keeps the largest working set any graph ever needed: after the batch moves,
    the old graphs are dropped and the pool released, so the peak reflects the new size only."""
    from triaccel.trainer import Decisions

    cfg = small_cfg(device="cuda", mode="amp", amp_dtype="bf16", epochs=1, batch_size=256, capture="true",
                    cudnn_benchmark="false")
    t = Trainer(cfg, log=lambda *a: None).setup()
    idx = torch.arange(256, device="cuda")
    for _ in range(3):  # eager, recorded, replayed
        t.train_step(idx)
    big = t.graphs.extra_bytes
    assert t.graphs.captures == 1 and big > 0
    t.apply(Decisions(batch_size=16, micro_batch=16))
    assert t.graphs.resets == 1 and not t.graphs.graphs and t.graphs.extra_bytes == 0
    small = torch.arange(16, device="cuda")
    for _ in range(3):
        t.train_step(small)
    assert t.graphs.captures == 2 and t.graphs.replays >= 2
    assert 0 < t.graphs.extra_bytes < big  # the new pool holds the small batch's activations only
    t.apply(Decisions(batch_size=16))  # no change: the graphs stay
    assert t.graphs.resets == 1 and len(t.graphs.graphs) == 1


# ---- cublas_workspace_mib: cuBLAS's per-stream workspaces were 130 MiB of a captured ResNet-18
# step's 0.52 GiB peak on the H200 (bench/results/h200_mem_breakdown.json)
def test_cublas_workspace_is_set_while_the_block_runs_and_put_back_after(monkeypatch):
    import os

    from triaccel.trainer import cublas_workspace

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    with cublas_workspace(4) as sized:
        assert sized and os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:1"
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ  # a later run (a Ray worker started after) sees none
    with pytest.raises(RuntimeError):
        with cublas_workspace(0):
            assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":0:1"
            raise RuntimeError("a failed run")
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    with cublas_workspace(None) as sized:
        assert not sized and "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    # the user's own setting wins (deterministic cuBLAS needs :4096:8 or :16:8), and the run says so
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    lines = []
    with cublas_workspace(4, log=lines.append) as sized:
        assert not sized and os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    assert len(lines) == 1 and "cublas_workspace_mib: 4 not applied" in lines[0] and ":16:8" in lines[0]


@pytest.mark.parametrize("bad", [-1, 4097, 2.5, "4MiB"])
def test_cublas_workspace_mib_out_of_range_names_the_key(bad):
    with pytest.raises(ConfigError, match="cublas_workspace_mib"):
        small_cfg(cublas_workspace_mib=bad)


@cuda
def test_cublas_workspace_mib_sizes_the_workspace_a_matmul_allocates(monkeypatch):
    """On the GPU: the first matmul on a stream allocates the workspace; inside a 4 MiB block it
    is smaller than torch's default after it (H200: 9 against 65 MiB). A run applies it while it
    trains, releases its graphs and puts the environment back."""
    import os

    from triaccel.trainer import Callback, cublas_workspace

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    a = torch.randn(64, 64, device="cuda")

    def workspace_bytes():
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        c = a @ a
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated() - before - c.numel() * c.element_size()

    with cublas_workspace(4):
        small = workspace_bytes()
    default = workspace_bytes()  # the block's end dropped its workspaces: a new one, torch's size
    assert 0 < small <= 2 * 4 * 2**20 + 2 * 2**20 < default

    class Seen(Callback):
        def __init__(self):
            self.env = []

        def on_epoch_end(self, trainer, metrics):
            self.env.append(os.environ.get("CUBLAS_WORKSPACE_CONFIG"))

    seen = Seen()
    t = Trainer(small_cfg(device="cuda", mode="amp", amp_dtype="bf16", cublas_workspace_mib=4, epochs=2,
                          capture="true"), callbacks=[seen]).setup()
    t.fit()
    assert seen.env == [":4096:1", ":4096:1"] and "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    assert t.graphs.captures > 0 and not t.graphs.graphs  # recorded while training, released at its end
