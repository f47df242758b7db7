"""The training forward through torch.compile (``compile``, triaccel.compiled): the same training
as eager, one compile per shape and plan, a failed compile is one line and the run goes on eager.

Inductor compiles real C++ on the CPU here (tens of seconds the first time); the CUDA cases
(compiled, and compiled inside the captured step) skip in CI and run natively on the GPU.
"""
import os
import subprocess
import sys

import pytest
import torch

from conftest import DEVICES, small_cfg
from triaccel.control import build_trainer
from triaccel.errors import ConfigError
from triaccel.trainer import Decisions

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(autouse=True, scope="module")
def _own_inductor_cache(tmp_path_factory):
    """This module's compiles use a cache of their own, shared by its tests: the user's default cache
    may hold a file a killed compile left half-written (on the H200 a suite cut by `timeout` left a
    truncated .so, and the next run's compile failed loading it: 'file too short')."""
    # Triton's cache too: Inductor sets TRITON_CACHE_DIR (under its own cache) once per process, for good
    folder = tmp_path_factory.mktemp("inductor")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TORCHINDUCTOR_CACHE_DIR", str(folder))
        mp.setenv("TRITON_CACHE_DIR", str(folder / "triton"))
        yield


def _params(t):
    return torch.cat([p.detach().float().flatten() for p in t.model.parameters()])


def _steps(t, k=3, seed=0):
    """k training steps of 64 examples drawn by ``seed`` (the same for every trainer given it)."""
    g = torch.Generator().manual_seed(seed)
    return [float(t.train_step(torch.randperm(len(t.train_data), generator=g)[:64].to(t.train_data.y.device))[0])
            for _ in range(k)]


def _pair(**over):
    logs = []
    eager = build_trainer(small_cfg(**over), log=lambda *_: None)
    comp = build_trainer(small_cfg(compile="default", **over), log=logs.append)
    return eager, comp, logs


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_steps_match_eager_and_keep_the_module_as_it_was(device):
    over = dict(device=device, mode="amp", amp_dtype="bf16", cudnn_benchmark="false") if device == "cuda" else \
        dict(device=device, mode="amp", amp_dtype="bf16")
    eager, comp, logs = _pair(**over)
    le, lc = _steps(eager), _steps(comp)
    assert comp.compiled is not None and comp.compiled.disabled is None, logs
    s = comp.compiled.stats()
    assert s["compiled_graphs"] >= 1 and s["compile_s"] > 0
    # fused kernels round bf16 at other points than eager: close, not equal
    assert lc == pytest.approx(le, rel=2e-2)
    assert torch.allclose(_params(comp), _params(eager), atol=2e-3)
    # the module is untouched: same state_dict keys (checkpoints and exports read either way)
    assert list(comp.model.state_dict()) == list(eager.model.state_dict())
    # evaluation runs the eager module: no compile for eval mode
    n = comp.compiled.stats()["compiled_graphs"]
    comp.evaluate(comp.val_data)
    assert comp.compiled.stats()["compiled_graphs"] == n


def test_compiled_triaccel_compiles_once_per_plan_and_matches_eager():
    """A new per-layer precision plan is a new graph (guarded, recompiled); the same plan again
    is not; each plan trains as the eager per-layer regions do."""
    over = {"mode": "triaccel", "model.name": "mlp", "model.width": 32, "triaccel.batch.enabled": "false",
            "triaccel.control_every": 1000}
    eager, comp, logs = _pair(**over)
    le, lc = _steps(eager, 1), _steps(comp, 1)
    n_uniform = comp.compiled.stats()["compiled_graphs"]
    names = comp.precision.names
    mixed = Decisions(levels={names[0]: "fp32", **{n: "bf16" for n in names[1:]}})
    for t in (eager, comp):
        t.apply(mixed)
    le += _steps(eager, 2, seed=1)
    lc += _steps(comp, 2, seed=1)
    assert comp.compiled.disabled is None, logs
    assert comp.compiled.stats()["compiled_graphs"] == n_uniform + 1  # the mixed plan, once for both steps
    assert comp.precision.levels() == eager.precision.levels() == ["fp32"] + ["bf16"] * (len(names) - 1)
    assert lc == pytest.approx(le, rel=2e-2)
    assert torch.allclose(_params(comp), _params(eager), atol=2e-3)


def test_under_compile_a_plan_whose_compile_outweighs_the_run_is_held():
    """A new plan compiles a graph of its own. A run of a second or two cannot pay for a compile of
    seconds, so the plan the controller asks for is held (plan_budget, 5 %), said once, and every
    window trains the first plan."""
    logs = []
    t = build_trainer(small_cfg(**{"mode": "triaccel", "model.name": "mlp", "model.width": 32, "compile": "default",
                                   "epochs": 1, "triaccel.batch.enabled": "false", "triaccel.curvature.enabled": "false",
                                   "triaccel.control_every": 5, "triaccel.precision.min_dwell": 0,
                                   "triaccel.precision.tau_low": 0.5, "triaccel.precision.tau_high": 1.0}),
                      log=logs.append)
    first = list(t.precision.levels())
    t.fit()
    rows = t.loop.trajectory
    assert t.compiled.disabled is None, logs
    assert sum(r.get("precision_held", 0) for r in rows) > 0  # the controller asked to move layers above the median
    assert all(r["levels"] == first for r in rows) and t.precision.levels() == first
    assert sum("[precision] plan held: a new plan compiles in about" in m for m in logs) == 1, logs


@cuda
def test_compiled_forward_inside_the_captured_step_trains_as_eager():
    """compile: default with capture: true, the Inductor kernels recorded in the step's graph."""
    over = dict(device="cuda", mode="amp", amp_dtype="fp16", cudnn_benchmark="false", epochs=2)
    eager = build_trainer(small_cfg(**over), log=lambda *_: None)
    eager.fit()
    logs = []
    both = build_trainer(small_cfg(compile="default", capture="true", **over), log=logs.append)
    both.fit()
    assert both.compiled.disabled is None and both.graphs.disabled is None, logs
    assert both.graphs.replays > both.graphs.eager
    for e, c in zip(eager.history.epochs, both.history.epochs):
        assert c["train_loss"] == pytest.approx(e["train_loss"], rel=2e-2)
        assert c["val_acc"] == pytest.approx(e["val_acc"], abs=3.0)
    last = both.history.epochs[-1]
    assert last["compiled_graphs"] >= 1 and last["captures"] >= 1


def test_compile_modes_are_checked_by_key():
    with pytest.raises(ConfigError, match=r"(^|--set )compile: must be one of"):
        small_cfg(compile="fast")
    with pytest.raises(ConfigError, match=r"compile: reduce-overhead records its own CUDA graphs"):
        small_cfg(compile="reduce-overhead", capture="true")
    assert small_cfg(compile="reduce-overhead").compile == "reduce-overhead"


def test_a_compile_that_fails_is_one_line_and_the_run_goes_on_eager(tmp_path):
    """No working C++ compiler (a CPU machine without g++): Inductor fails at the first forward;
    the run says so once, trains eager from the same examples and finishes."""
    env = dict(os.environ, CXX=str(tmp_path / "no-such-g++"), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
               MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path}/mlflow.db")
    (tmp_path / "c.yaml").write_text("model: {name: small_cnn, width: 8}\nbatch_size: 64\n")
    r = subprocess.run([sys.executable, "-m", "triaccel.cli", "train", "--config", "c.yaml", "--set", "compile=default",
                        "--set", "epochs=1", "--set", "mode=amp", "--set", "amp_dtype=bf16", "--set", "device=cpu",
                        "--set", "evaluate_test=false"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    said = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.startswith("[compile]")]
    assert len(said) == 1 and "failed" in said[0] and "goes on eager" in said[0], r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    assert "epoch   1/1" in r.stdout


def _buffers(t):
    return torch.cat([b.float().flatten() for b in t.model.buffers()])


def test_checkpointed_blocks_compile_whole_and_update_batchnorm_once():
    """checkpointing: true under compile: each block is one traced checkpoint region (the eager
    wrapper's call counter broke the trace at every block, leaving the blocks eager without a word),
    and BatchNorm's running statistics move once a step, as in the plain model."""
    plain = build_trainer(small_cfg(mode="fp32"), log=lambda *_: None)
    logs = []
    both = build_trainer(small_cfg(mode="fp32", checkpointing="true", compile="default"), log=logs.append)
    lp, lb = _steps(plain), _steps(both)
    s = both.compiled.stats()
    assert s["graph_breaks"] == 0 and s["compiled_graphs"] == 1, (s, logs)
    assert lb == pytest.approx(lp, rel=1e-5)
    assert torch.allclose(_buffers(both), _buffers(plain), atol=1e-5)
    assert torch.allclose(_params(both), _params(plain), atol=1e-5)


def test_a_backward_compile_failure_retries_eager_with_batchnorm_statistics_put_back(monkeypatch):
    """AOTAutograd compiles the backward at the first backward, after the compiled forward has
    updated BatchNorm's running statistics; the eager retry of the window must start from the
    statistics as they were (they moved twice, and evaluation read them). The backward's compile
    is made to fail (Inductor's caches off, so it is really compiled)."""
    import torch._functorch.config as fcfg
    import torch._inductor.compile_fx as cfx
    import torch._inductor.config as icfg

    eager = build_trainer(small_cfg(mode="fp32", **{"data.augment": "false"}), log=lambda *_: None)
    le = _steps(eager)
    real = cfx.fx_codegen_and_compile

    def backward_fails(gm, example_inputs, *args, **kw):
        if kw.get("is_backward"):
            raise RuntimeError("injected: the backward cannot be lowered")
        return real(gm, example_inputs, *args, **kw)

    monkeypatch.setattr(icfg, "fx_graph_cache", False)
    monkeypatch.setattr(fcfg, "enable_autograd_cache", False)
    monkeypatch.setattr(cfx, "fx_codegen_and_compile", backward_fails)
    logs = []
    comp = build_trainer(small_cfg(mode="fp32", compile="default", **{"data.augment": "false"}), log=logs.append)
    lc = _steps(comp)
    said = [ln for ln in logs if ln.startswith("[compile]")]
    assert len(said) == 1 and "injected" in said[0] and comp.compiled.disabled, logs
    assert lc == pytest.approx(le, rel=1e-5)
    assert torch.equal(_buffers(comp), _buffers(eager))  # num_batches_tracked included: once a step
    assert torch.allclose(_params(comp), _params(eager), atol=1e-6)


def test_a_compile_failure_naming_inductors_cache_says_which_folder_to_remove():
    """A truncated file a killed compile left in Inductor's cache fails every later compile (seen on
    the H200): the one line names the folder; other failures get no such hint."""
    import torch.nn as nn
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    from triaccel.compiled import CompileError, CompiledForward

    logs = []
    cf = CompiledForward(nn.Linear(2, 2), "default", log=logs.append)
    cf.fail(CompileError(f"ImportError: {cache_dir()}/2u/c2uw.main.so: file too short"))
    other = CompiledForward(nn.Linear(2, 2), "default", log=logs.append)
    other.fail(CompileError("Unsupported: an operator Inductor cannot lower"))
    # a compiler error names the cache too (its command line), but removing the cache would not help
    cxx = CompiledForward(nn.Linear(2, 2), "default", log=logs.append)
    cxx.fail(CompileError(f"CppCompileError: g++ {cache_dir()}/ab/cabcd.main.cpp: error: 'vec' was not declared"))
    assert len(logs) == 3 and cf.disabled and other.disabled and cxx.disabled
    assert cache_dir() in logs[0] and "remove that folder" in logs[0] and "goes on eager" in logs[0]
    assert "remove" not in logs[1] and "remove" not in logs[2]
