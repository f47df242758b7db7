"""The Tri-Accel mode end to end on the CPU: runtime dtypes, the control loop, OOM, ablations."""
import json

import pytest
import torch

from conftest import DEVICES, small_cfg
from triaccel.control import TriAccelLoop
from triaccel.precision import PrecisionRuntime
from triaccel.models import SmallCNN
from triaccel.trainer import Trainer

TRI = {"mode": "triaccel", "triaccel.policy": "paper", "triaccel.control_every": 4, "triaccel.curvature.every": 8,
       "triaccel.curvature.top_k": 2, "triaccel.curvature.max_iters": 3, "triaccel.batch.budget_gb": 0.004,
       "triaccel.batch.min_batch": 16, "triaccel.batch.delta_down": 16,
       "triaccel.precision.tau_low": 1e-6, "triaccel.precision.tau_high": 1e-3}


def tri_trainer(log=lambda *a: None, oom_probe=None, **over):
    cfg = small_cfg(**{**TRI, **over})
    loop = TriAccelLoop(cfg.triaccel, log=log)
    return Trainer(cfg, callbacks=[loop], log=log, oom_probe=oom_probe).setup(), loop


def test_runtime_runs_each_layer_in_its_dtype():
    m = SmallCNN(10, 1, 8)
    rt = PrecisionRuntime(m, torch.device("cpu"), initial="bf16", cpu_fp16=True)
    plan = dict(zip(rt.names, ["fp16", "fp32", "bf16", "fp32"]))
    for n, lvl in plan.items():
        rt.set(n, lvl)
    seen = {}
    for n, mod in rt.layers:
        mod.register_forward_hook(lambda mod, i, o, n=n: seen.__setitem__(n, o.dtype))
    out = m(torch.randn(4, 1, 8, 8))
    want = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
    assert seen == {n: want[l] for n, l in plan.items()}
    out.float().sum().backward()
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in m.parameters())
    with rt.force(torch.float32):
        seen.clear()
        m(torch.randn(2, 1, 8, 8))
        assert set(seen.values()) == {torch.float32}


def test_fp16_runs_as_bf16_on_a_cpu_unless_asked_and_says_so():
    """On a CPU fp16 is the slow 16-bit type: the controller's fp16 layers run in bf16 there (one
    line says so) and no GradScaler runs; cpu_fp16: true keeps real fp16 and its scaler."""
    for keep, want in ((False, torch.bfloat16), (True, torch.float16)):
        said = []
        t = Trainer(small_cfg(**{**TRI, "amp_dtype": "fp16", "triaccel.precision.cpu_fp16": str(keep).lower()}),
                    callbacks=[], log=said.append).setup()
        m = t.model
        seen = set()
        for _, mod in t.precision.layers:
            mod.register_forward_hook(lambda mod, i, o: seen.add(o.dtype))
        with t.precision.region():
            m(torch.randn(2, 1, 8, 8))
        assert seen == {want}
        assert t.precision.levels() == [("fp16" if keep else "bf16")] * len(t.precision.names)
        assert t.scaler_active() is keep
        assert any("fp16 is slow on a CPU" in str(x) for x in said) is not keep


def test_half_bf16_runs_the_fp16_level_in_bf16_with_no_grad_scaler_and_says_so():
    """triaccel.precision.half: bf16 makes the ladder bf16 / bf16 / fp32. cpu_fp16: true would keep
    real fp16 on this CPU (the test above), so only half can have moved the level; fp32 stays fp32."""
    said = []
    t = Trainer(small_cfg(**{**TRI, "amp_dtype": "fp16", "triaccel.precision.cpu_fp16": "true",
                             "triaccel.precision.half": "bf16"}), callbacks=[], log=said.append).setup()
    seen = set()
    for _, mod in t.precision.layers:
        mod.register_forward_hook(lambda mod, i, o: seen.add(o.dtype))
    with t.precision.region():
        t.model(torch.randn(2, 1, 8, 8))
    assert seen == {torch.bfloat16}
    assert t.precision.levels() == ["bf16"] * len(t.precision.names)
    assert not t.scaler.is_enabled() and not t.scaler_active()
    assert any("fp16 is set to bf16 (triaccel.precision.half)" in str(x) for x in said)
    name = t.precision.names[0]
    t.precision.set(name, "fp32")
    assert t.precision.level(name) == "fp32"


def test_bf16_master_weights_store_the_layers_in_bf16_and_an_fp32_level_computes_with_fp32_copies():
    """triaccel.precision.master_weights: bf16. The layers' weights (not the norms') are stored in bf16,
    the same parameter objects; their gradients are bf16. A layer set to FP32, or every layer under
    force(fp32) (the curvature probes), computes in fp32 from fp32 copies and its gradient still reaches
    the bf16 weight: the same gradient, to bf16 rounding, as the model with fp32 weights computes."""
    said = []
    t = Trainer(small_cfg(**{**TRI, "amp_dtype": "bf16", "triaccel.precision.master_weights": "bf16"}), callbacks=[],
                log=said.append).setup()
    ref = Trainer(small_cfg(**{**TRI, "amp_dtype": "bf16"}), callbacks=[], log=lambda *a: None).setup()
    with torch.no_grad():
        for p, q in zip(ref.model.parameters(), t.model.parameters()):
            p.copy_(q.float())  # the same values: bf16-representable fp32
    layer_ids = {id(p) for ps in t.precision.layer_params for p in ps}
    dtypes = {id(p): p.dtype for p in t.model.parameters()}
    assert layer_ids and all(dtypes[i] == torch.bfloat16 for i in layer_ids)
    assert {d for i, d in dtypes.items() if i not in layer_ids} == {torch.float32}  # norms stay fp32
    assert type(t.optimizer).__name__ == "FusedSGD" and t.optimizer.rounding == "stochastic"
    assert any("master weights in bf16 where a layer computes in 16 bits, updates rounded stochastic" in str(x)
               for x in said)
    x = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    y = torch.tensor([0, 1, 2, 3])

    def grads(tr, fp32_layer: str | None, force: bool):
        tr.model.zero_grad(set_to_none=True)
        for n in tr.precision.names:
            tr.precision.set(n, "fp32" if n == fp32_layer else "bf16")
        seen = {}
        hooks = [m.register_forward_hook(lambda m, i, o, n=n: seen.__setitem__(n, o.dtype))
                 for n, m in tr.precision.layers]
        ctx = tr.precision.force(torch.float32) if force else tr.precision.region()
        with ctx:
            torch.nn.functional.cross_entropy(tr.model(x).float(), y).backward()
        for h in hooks:
            h.remove()
        return [p.grad.float().clone() for p in tr.model.parameters()], seen, [p.grad.dtype for p in tr.model.parameters()]

    first = t.precision.names[0]
    for fp32_layer, force in ((first, False), (None, True)):
        g, seen, gdt = grads(t, fp32_layer, force)
        g_ref, _, _ = grads(ref, fp32_layer, force)
        want = torch.float32 if force else None
        assert seen[first] == torch.float32 and all(seen[n] == (want or torch.bfloat16) for n in t.precision.names[1:])
        assert [d for p, d in zip(t.model.parameters(), gdt) if id(p) in layer_ids] == [torch.bfloat16] * len(layer_ids)
        for a, b in zip(g, g_ref):
            assert torch.allclose(a, b, rtol=2e-2, atol=2e-2 * float(b.abs().max())), (fp32_layer, force)
    # every layer at FP32: the one region of a uniform forward would meet bf16 weights; it runs per layer
    g, seen, _ = grads(t, None, False)
    for n in t.precision.names:
        t.precision.set(n, "fp32")
    with t.precision.region():
        out = t.model(x)
    assert out.dtype == torch.float32


@pytest.mark.parametrize("rounding", ["kahan", "nearest"])
def test_bf16_master_weights_follow_the_level_the_controller_decides(rounding):
    """The storage follows the precision controller: a layer it puts at FP32 (Trainer.apply, the one
    writer) gets fp32 master weights, back at 16 bits bf16 again; the optimizer steps on after each move.
    Under Kahan the round trip keeps about 16 significant bits (the rounding error, itself in bf16, is the
    compensation, taken back in); rounded to nearest it keeps bf16's 8. A checkpoint loads each weight
    in the dtype saved."""
    from triaccel.hooks import Decisions

    t = Trainer(small_cfg(**{**TRI, "amp_dtype": "bf16", "triaccel.precision.master_weights": "bf16",
                             "triaccel.precision.rounding": rounding}), callbacks=[], log=lambda *a: None).setup()
    name, (w, *_) = t.precision.names[0], t.precision.layer_params[0]
    x, y = torch.randn(8, 1, 8, 8), torch.arange(8) % 10

    def step():
        t.optimizer.zero_grad(set_to_none=True)
        with t.precision.region():
            torch.nn.functional.cross_entropy(t.model(x).float(), y).backward()
        t.optimizer.step()

    step()
    assert w.dtype == torch.bfloat16
    v = t.weights_version
    t.apply(Decisions(levels={name: "fp32"}))
    assert w.dtype == torch.float32 and w.grad is None
    assert t.weights_version == v + 1  # what captured the old storage (graphs, the probe's) drops it
    other = t.precision.names[1]  # one layer up, another down, in one decision: still a move
    t.apply(Decisions(levels={name: "bf16", other: "fp32"}))
    assert t.weights_version == v + 2 and w.dtype == torch.bfloat16
    t.apply(Decisions(levels={name: "fp32", other: "bf16"}))
    assert w.dtype == torch.float32
    step()  # the fp32 master takes a small update exactly
    exact = w.detach().clone()
    assert not torch.equal(exact, exact.to(torch.bfloat16).float())  # more than bf16 holds
    sd = t.state_dict()  # a checkpoint taken at FP32
    t.apply(Decisions(levels={name: "bf16"}))
    assert w.dtype == torch.bfloat16
    assert ("kahan_comp" in t.optimizer.state[w]) == (rounding == "kahan")
    t.apply(Decisions(levels={name: "fp32"}))
    assert w.dtype == torch.float32 and "kahan_comp" not in t.optimizer.state[w]
    rel = float(((w.detach() - exact).abs() / exact.abs().clamp_min(1e-3)).max())
    assert rel <= (2 ** -15 if rounding == "kahan" else 2 ** -8) and rel > 0, rel
    step()
    fresh = Trainer(small_cfg(**{**TRI, "amp_dtype": "bf16", "triaccel.precision.master_weights": "bf16",
                                 "triaccel.precision.rounding": rounding}), callbacks=[], log=lambda *a: None).setup()
    fresh.load_state_dict(sd)  # loads the weight in fp32 into a run that starts with bf16 weights
    w2 = fresh.precision.layer_params[0][0]
    assert w2.dtype == torch.float32 and torch.equal(w2.detach(), exact)
    assert fresh.precision.level(name) == "fp32"


@pytest.mark.parametrize("rounding", ["stochastic", "kahan", "nearest"])
def test_bf16_master_weights_train_as_fp32_masters_do(rounding):
    """Two epochs of the digits CNN with bf16 master weights learn as the fp32-master run does, each
    rounding (the run's seeds and data equal), and the weights stay bf16 throughout."""
    base = {**TRI, "amp_dtype": "bf16", "epochs": 3}
    r32 = Trainer(small_cfg(**base), callbacks=[], log=lambda *a: None).setup().fit()
    t = Trainer(small_cfg(**{**base, "triaccel.precision.master_weights": "bf16",
                             "triaccel.precision.rounding": rounding}), callbacks=[], log=lambda *a: None).setup()
    r16 = t.fit()
    assert r32["val_acc"] > 30 and abs(r16["val_acc"] - r32["val_acc"]) < 8, (r16["val_acc"], r32["val_acc"])
    assert all(p.dtype == torch.bfloat16 for ps in t.precision.layer_params for p in ps)
    comps = [st for st in t.optimizer.state.values() if "kahan_comp" in st]
    assert bool(comps) == (rounding == "kahan")


@pytest.mark.parametrize("overflow_scale, moved", [(1.0, False), (1e6, True)])
def test_an_fp16_overflow_moves_its_layer_only_where_the_loss_scale_has_fallen_to_the_overflow_scale(
        overflow_scale, moved):
    """One overflow at step 6 halves the scale from 65536: the scaler's own search, which the skipped
    step handles, unless triaccel.precision.overflow_scale is above the scale it fell to. A layer moved
    on an overflow restarts the scale, with a line that says so."""
    cfg = small_cfg(**{**TRI, "amp_dtype": "fp16", "epochs": 1, "triaccel.precision.cpu_fp16": "true",
                       "triaccel.precision.tau_low": 1e6, "triaccel.precision.tau_high": 1e7,
                       "triaccel.batch.enabled": "false", "triaccel.curvature.enabled": "false",
                       "triaccel.precision.overflow_scale": overflow_scale, "triaccel.stats_every": 1,
                       "data.augment": "false"})
    logs = []
    loop = TriAccelLoop(cfg.triaccel, log=logs.append)
    t = Trainer(cfg, callbacks=[loop], log=lambda *a: None).setup()
    assert t.scaler_active()
    first = loop.names[0]
    weight = next(m for n, m in t.precision.layers if n == first).weight
    for step in range(8):  # a control window every 4 steps: the overflow lands in the second
        h = weight.register_hook(lambda g: g * float("inf")) if step == 5 else None
        t.train_step(torch.arange(step * 32, step * 32 + 32))
        if h is not None:
            h.remove()
        t._settle_skip()
    assert t.skipped_steps == 1
    assert len(loop.trajectory) == 2 and loop.trajectory[0]["levels"][0] == "fp16"
    assert (loop.trajectory[1]["levels"][0] == "bf16") is moved
    # a move restarts the scale where the run's started: the fp16 layers left are not held at the scale
    # the overflows drove it to
    assert t.scaler.get_scale() == (65536.0 if moved else 32768.0)
    said = [m for m in logs if "on fp16 overflow" in m]
    assert said == (["[precision] 1 layer(s) moved to bf16 on fp16 overflow at loss scale 32768: scale reset to 65536"]
                    if moved else [])
    assert set(loop.trajectory[1]["levels"][1:]) == {"fp16"}


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_master_weights_beside_fp16_layers_train_through_the_grad_scaler(device, monkeypatch):
    """fp16 layers with bf16 master weights: the GradScaler runs and the layers' gradients are bf16
    (torch's own unscale has no bf16 CUDA kernel: triaccel.optim.GradScaler). cpu_fp16 keeps real
    fp16 here, and torch's op refuses bf16 as on CUDA, so this path runs in CI as on a GPU."""
    from test_scaler import cuda_like_unscale

    cuda_like_unscale(monkeypatch)
    base = {**TRI, "device": device, "amp_dtype": "fp16", "epochs": 2, "triaccel.precision.cpu_fp16": "true"}
    t = Trainer(small_cfg(**{**base, "triaccel.precision.master_weights": "bf16"}), callbacks=[],
                log=lambda *a: None).setup()
    assert t.scaler_active()
    r = t.fit()
    assert all(p.dtype == torch.bfloat16 and p.grad.dtype == torch.bfloat16
               for ps in t.precision.layer_params for p in ps)
    assert r["val_acc"] > 30 and t.skipped_steps < t.step_count // 4, (r["val_acc"], t.skipped_steps)


@pytest.mark.slow
def test_control_loop_acts_and_logs_every_window(tmp_path):
    t, loop = tri_trainer(**{"epochs": 3})
    s = t.fit()
    assert s["val_acc"] > 30  # chance is 10 %: it learns while the controllers act
    traj = loop.trajectory
    assert len(traj) == t.step_count // 4
    r = traj[-1]
    assert len(r["levels"]) == len(loop.names) == 4
    assert all(v >= 0 for v in r["variance"]) and any(v > 0 for v in r["variance"])
    assert any(x > 0 for x in r["lam"]) and all(0 < s <= 1 for s in r["lr_scale"])
    assert {row["batch_size"] for row in traj} != {64}  # the batch moved under a 4 MB budget
    ts = [row["t_s"] for row in traj]  # each window says when it ran: where a run's time went
    assert ts == sorted(ts) and ts[-1] > ts[0] >= 0
    files = {p.name for p in loop.write_artifacts(tmp_path)}
    assert files == {"trajectory.json", "trajectory.csv", "batch_memory.png", "precision_heatmap.png",
                     "curvature_lr.png"}
    assert json.loads((tmp_path / "trajectory.json").read_text())["layers"] == loop.names
    # a search trial writes only the data with each checkpoint; the driver draws the same plots from it
    from triaccel.report import plots_from_json

    data_only = {p.name for p in loop.write_artifacts(tmp_path / "trial", plots=False)}
    assert data_only == {"trajectory.json", "trajectory.csv"}
    drawn = plots_from_json(tmp_path / "trial" / "trajectory.json", tmp_path / "drawn")
    assert {p.name for p in drawn} == files - data_only and all(p.stat().st_size > 1000 for p in drawn)
    # the per-layer lr scales reach the optimizer
    g = t.optimizer.param_groups
    assert g[0]["lr"] > 0
    for i in range(1, 4):
        assert g[i]["lr"] / g[0]["lr"] == pytest.approx(t.lr_scales[i] / t.lr_scales[0], rel=1e-9)


@pytest.mark.slow
def test_triaccel_accuracy_close_to_amp():
    """Margin: the triaccel run is within 5 pp of the static bf16 AMP run on the digits set."""
    over = {"epochs": 8, "model.width": 16}
    amp = Trainer(small_cfg(**{**over, "mode": "amp"}), log=lambda *a: None).setup().fit()
    t, _ = tri_trainer(**over)
    tri = t.fit()
    assert tri["val_acc"] >= amp["val_acc"] - 5.0, (tri["val_acc"], amp["val_acc"])


@pytest.mark.parametrize("mode", ["paper", "constant"])
def test_oom_with_elastic_batch_trains_every_sample_once(mode):
    budget = 40

    def probe(micro):
        if micro > budget:
            raise torch.OutOfMemoryError(f"fake {micro}")

    t, loop = tri_trainer(oom_probe=probe, **{"epochs": 1, "batch_size": 96, "triaccel.batch.mode": mode,
                                               "triaccel.batch.budget_gb": 1.0})
    seen = []
    real = t.train_data.batch
    # record the training batches (the curvature probe draws its own examples with train=False)
    t.train_data.batch = lambda idx, train: (train and seen.append(idx.clone()), real(idx, train))[1]
    t.fit()
    assert sorted(torch.cat(seen).tolist()) == list(range(len(t.train_data)))
    # ceilings come only from real OOMs, and the controller never grows back to one
    assert loop.batch.ceiling is not None and budget < loop.batch.ceiling <= 96
    assert t.micro_batch < loop.batch.ceiling and t.oom_events >= 1
    if mode == "constant":
        assert t.batch_size == 96  # only the micro-batch is elastic


@pytest.mark.parametrize("mode", ["paper", "constant"])
def test_after_an_injected_oom_no_later_step_climbs_back_to_the_failed_size(mode):
    """An injected memory wall at 40 examples, B0 = 96, two epochs, memory readings far under rho_low
    (the rule wants to grow all along): 96 fails, its retry at 48 fails, 24 runs; from then on the
    sizes stay at or below 0.75 * 48 = 36, so there is no third OOM. (Stepping back to the failed size
    minus one ran 47, 46, ..., 41: an OOM each.) Every example trains once an epoch."""
    from triaccel.controllers.batch import oom_limit

    budget, calls = 40, []

    def probe(micro):
        calls.append((t.oom_events, micro))
        if micro > budget:
            raise torch.OutOfMemoryError(f"fake {micro}")

    t, loop = tri_trainer(oom_probe=probe, **{"epochs": 2, "batch_size": 96, "triaccel.batch.mode": mode,
                                               "triaccel.batch.budget_gb": 1.0, "triaccel.batch.delta_up": 16})
    seen = []
    real = t.train_data.batch
    t.train_data.batch = lambda idx, train: (train and seen.append(idx.clone()), real(idx, train))[1]
    t.fit()
    assert sorted(torch.cat(seen).tolist()) == sorted(list(range(len(t.train_data))) * 2)
    assert t.oom_events == 2 and loop.batch.ceiling == 48 and loop.batch.limit == oom_limit(48) == 36
    assert max(m for k, m in calls if k == 1) <= 48  # after the OOM at 96: its retry's split and below
    after = [m for k, m in calls if k == 2]
    assert len(after) > 10 and max(after) <= 36  # after the OOM at 48: never back above the limit
    if mode == "paper":
        assert t.batch_size <= 36
    else:
        assert t.batch_size == 96


@pytest.mark.parametrize("mode", ["paper", "constant"])
def test_bucket_moves_and_an_oom_split_train_every_sample_once(mode):
    """With the step captured (eager on a CPU, the buckets are the same) the elastic batch and the
    out-of-memory split move between buckets only; every example is trained exactly once an epoch."""
    from triaccel.controllers.batch import bucket_ladder

    budget = 40
    micro_seen, batch_seen = set(), set()

    def probe(micro):
        micro_seen.add(t.micro_batch)
        batch_seen.add(t.batch_size)
        if micro > budget:
            raise torch.OutOfMemoryError(f"fake {micro}")

    t, loop = tri_trainer(oom_probe=probe, **{"epochs": 2, "batch_size": 96, "triaccel.batch.mode": mode,
                                               "triaccel.batch.budget_gb": 1.0, "triaccel.batch.delta_up": 16,
                                               "capture": "true"})
    assert t.buckets is not None and set(loop.batch.buckets.sizes) <= set(t.buckets.sizes)
    seen = []
    real = t.train_data.batch
    t.train_data.batch = lambda idx, train: (train and seen.append(idx.clone()), real(idx, train))[1]
    t.fit()
    n = len(t.train_data)
    assert sorted(torch.cat(seen).tolist()) == sorted(list(range(n)) * 2)  # each example once per epoch
    assert t.oom_events >= 1 and loop.batch.ceiling is not None
    ladder = set(bucket_ladder(4096)) | {96}
    assert micro_seen <= ladder and batch_seen <= ladder, (micro_seen, batch_seen)
    assert len(micro_seen) >= 2  # it moved (96 split to 48, then 32 or 24 under the 40-example budget)
    if mode == "constant":
        assert batch_seen == {96}


def test_constant_mode_buckets_leave_no_off_bucket_micro_batch_inside_a_window():
    """B=200 fixed, the micro-batch elastic under an injected memory limit: every full window's
    micro-batches are buckets (a micro-batch of 128 would leave 72 in each window)."""
    from triaccel.controllers.batch import bucket_ladder

    windows = []

    def probe(micro):
        windows[-1].append(micro)
        if micro > 150:
            raise torch.OutOfMemoryError(f"fake {micro}")

    t, loop = tri_trainer(oom_probe=probe, **{"epochs": 1, "batch_size": 200, "triaccel.batch.mode": "constant",
                                               "triaccel.batch.budget_gb": 1.0, "triaccel.batch.delta_up": 32,
                                               "triaccel.batch.max_batch": 4096, "capture": "true"})
    real = t.train_step
    t.train_step = lambda idx: (windows.append([]), real(idx))[1]
    t.fit()
    ladder = set(bucket_ladder(4096)) | {200, 16}
    full = [w for w in windows if sum(x for x in w if x <= 150) >= 200 or len(w) > 1]
    assert t.oom_events >= 1 and full
    for w in windows[:-1]:  # the epoch's last window is short: its remainder keeps its own size
        assert set(w) <= ladder, (w, t.micro_batch)


def test_batch_buckets_are_checked_and_can_be_turned_off():
    from triaccel.errors import ConfigError
    from triaccel.trainer import resolve_buckets

    assert resolve_buckets(small_cfg(**{"batch_size": 100})) is None  # eager: free sizes
    assert resolve_buckets(small_cfg(**{"batch_size": 100, "compile": "default"})).sizes[:6] == (1, 2, 4, 8, 12, 16)
    assert 100 in resolve_buckets(small_cfg(**{"batch_size": 100, "capture": "true"}))
    own = resolve_buckets(small_cfg(**{"batch_size": 100, "accum_steps": 2, "batch_buckets": "[16, 32]"}))
    assert own.sizes == (16, 32, 50, 100)  # the configured batch and micro-batch are buckets too
    tri = resolve_buckets(small_cfg(**{"mode": "triaccel", "capture": "true", "triaccel.batch.min_batch": 10}))
    assert 10 in tri  # a shrink stops at min_batch: a bucket
    assert resolve_buckets(small_cfg(**{"capture": "true", "batch_buckets": "[]"})) is None
    for bad in ("[0, 16]", "[16, 2.5]", "[true]"):
        with pytest.raises(ConfigError, match=r"batch_buckets: must be null \(automatic\) or a list of batch sizes"):
            small_cfg(**{"batch_buckets": bad})


@pytest.mark.parametrize("off", ["precision", "curvature", "batch"])
def test_each_controller_switches_off_alone(off):
    t, loop = tri_trainer(**{"epochs": 1, f"triaccel.{off}.enabled": False})
    t.fit()
    if off == "precision":
        assert loop.prec is None and set(t.precision.levels()) == {"bf16"}
    if off == "curvature":
        assert loop.curv is None and set(t.lr_scales) == {1.0}
    if off == "batch":
        assert loop.batch is None and t.batch_size == 64


def test_fisher_mode_costs_no_probe():
    t, loop = tri_trainer(**{"epochs": 1, "triaccel.curvature.method": "fisher"})
    t.fit()
    assert loop.probe is None and any(x > 0 for x in loop.lam)


@pytest.mark.parametrize("channels_last", [False, True])
def test_kernels_and_references_give_the_same_training(channels_last):
    """triaccel.kernels=triton (interpreter on CPU) vs torch references: same parameters after an epoch,
    also with NHWC weights and gradients (dense, not contiguous: the CUDA default)."""
    import os

    # Triton runs on CUDA, or on the CPU under its interpreter (CI); never CPU tensors on a CUDA machine
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs Triton")
    results, levels = [], []
    for kern in ("torch", "triton"):
        t, loop = tri_trainer(**{"epochs": 1, "triaccel.kernels": kern, "triaccel.curvature.method": "fisher",
                                  "data.augment": False, "channels_last": channels_last, "device": device,
                                  "cudnn_benchmark": False})
        t.fit()
        results.append([p.detach().clone() for p in t.model.parameters()])
        levels.append([r["levels"] for r in loop.trajectory])
    assert levels[0] == levels[1]  # the same precision decisions, window by window
    # Tolerance: 20 steps of bf16 forward passes amplify last-bit differences of the optimizer
    # (the kernel's summation order) to ~1e-4 in the weights.
    diff = max(float((a - b).abs().max()) for a, b in zip(*results))
    assert diff < 5e-4, diff


def test_triton_kernels_on_a_device_triton_cannot_use_is_one_line(monkeypatch):
    """A CPU run asking for Triton kernels without the interpreter (a CPU run on a CUDA
    machine, say) stops at setup naming the key, instead of failing inside a kernel launch."""
    from triaccel.errors import TriAccelError

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for key in ("triaccel.kernels", "data.kernel"):
        with pytest.raises(TriAccelError, match=key.replace(".", r"\.") + ": triton needs a CUDA device"):
            tri_trainer(**{"epochs": 1, key: "triton", "device": "cpu"})


def test_checkpoint_roundtrip_keeps_controller_state(tmp_path):
    t, loop = tri_trainer(**{"epochs": 2})
    t.fit()
    t.save(tmp_path / "ck.pt")
    t2, loop2 = tri_trainer(**{"epochs": 2})
    t2.load(tmp_path / "ck.pt")
    assert loop2.trajectory == loop.trajectory and loop2.window == loop.window
    assert t2.precision.levels() == t.precision.levels() and t2.batch_size == t.batch_size
    assert loop2.prec.state_dict() == loop.prec.state_dict()


def test_uniform_levels_use_one_region_mixed_levels_use_per_layer_regions():
    m = SmallCNN(10, 1, 8)
    rt = PrecisionRuntime(m, torch.device("cpu"), initial="bf16")
    seen, inside = {}, []
    def hook(mod, i, o, n):
        seen[n] = o.dtype
        inside.append(rt._global)  # returns None: the output is left alone

    for n, mod in rt.layers:
        mod.register_forward_hook(lambda mod, i, o, n=n: hook(mod, i, o, n))
    with rt.region():
        m(torch.randn(2, 1, 8, 8))
    assert set(seen.values()) == {torch.bfloat16} and set(inside) == {torch.bfloat16}  # the one region
    rt.set(rt.names[1], "fp32")
    seen.clear(), inside.clear()
    with rt.region():
        m(torch.randn(2, 1, 8, 8))
    assert seen[rt.names[1]] == torch.float32 and seen[rt.names[0]] == torch.bfloat16 and set(inside) == {None}
    rt.set(rt.names[1], "bf16")
    with rt.region(), rt.force(torch.float32):  # the curvature probe inside a uniform forward: fp32 wins
        seen.clear()
        m(torch.randn(2, 1, 8, 8))
    assert set(seen.values()) == {torch.float32}
    rt.uniform_fast_path = False
    seen.clear(), inside.clear()
    with rt.region():
        m(torch.randn(2, 1, 8, 8))
    assert set(seen.values()) == {torch.bfloat16} and set(inside) == {None}


def _aten_ops_per_step(t, steps=3):
    t.model.train()
    t.sampler.start_epoch(0)
    for _ in range(2):
        t.train_step(t.sampler.take(t.batch_size))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p:
        for _ in range(steps):
            t.train_step(t.sampler.take(t.batch_size))
    return sum(1 for e in p.events() if e.name.startswith("aten::")) / steps


def test_controllers_off_dispatch_exactly_what_static_amp_dispatches():
    """With every controller off, a Tri-Accel step issues static AMP's operators and no more: the
    loop's bookkeeping adds nothing per step. (Gradients kept in place once made autograd add each
    new gradient into the old buffer, one extra operator per parameter; the H200 profile found it.)"""
    off = {f"triaccel.{c}.enabled": False for c in ("precision", "curvature", "batch")}
    amp = Trainer(small_cfg(mode="amp", amp_dtype="bf16"), log=lambda *a: None).setup()
    tri, _ = tri_trainer(**off, **{"triaccel.control_every": 1000})  # per-step cost, no window in between
    assert _aten_ops_per_step(tri) == _aten_ops_per_step(amp)


@pytest.mark.parametrize("over", [{"triaccel.curvature.method": "fisher", "triaccel.curvature.every": 7},
                                  {"triaccel.curvature.every": 7, "triaccel.curvature.probe": "batched"},
                                  {"triaccel.curvature.method": "fisher", "triaccel.batch.policy": "score"},
                                  {"triaccel.curvature.method": "fisher", "triaccel.precision.master_weights": "bf16"}],
                         ids=["fisher", "power-batched", "score-batch", "bf16-masters-stochastic"])
def test_resume_mid_run_continues_exactly(tmp_path, monkeypatch, over):
    """Killed after epoch 2 and resumed from its checkpoint, a run ends with the same weights as
    one never interrupted (#14 case 5): RNG streams, the probe's sign stream, mid-window
    statistics (Fisher accumulator, overflow counts) and the controllers travel in the checkpoint.
    The score policy chooses the batch on measured step times, which on a GPU vary between two
    runs by more than its ties: every run here reads one clock that advances a fixed amount per
    reading, so two uninterrupted runs decide alike and the comparison is about the checkpoint."""
    import itertools
    import time

    from triaccel.trainer import Callback

    ticks = itertools.count()
    monkeypatch.setattr(time, "perf_counter", lambda: next(ticks) * 1e-3)

    class StopAfter(Callback):
        def __init__(self, n):
            self.n = n

        def on_epoch_end(self, tr, m):
            tr.stop = self.n is not None and tr.epoch == self.n

    def run(stop=None, load=None):
        cfg = small_cfg(**{**TRI, "epochs": 3, "triaccel.control_every": 5, **over})
        t = Trainer(cfg, callbacks=[TriAccelLoop(cfg.triaccel, log=lambda *a: None), StopAfter(stop)],
                    log=lambda *a: None).setup()
        if load:
            t.load(load)
        t.fit()
        return t

    full = run()
    run(stop=2).save(tmp_path / "ck.pt")
    resumed = run(load=tmp_path / "ck.pt")
    assert [e["val_acc"] for e in resumed.history.epochs] == [e["val_acc"] for e in full.history.epochs]
    for a, b in zip(full.model.parameters(), resumed.model.parameters()):
        assert torch.equal(a.detach(), b.detach())


def test_out_of_memory_in_the_hessian_probe_degrades_and_the_run_goes_on():
    """#14 case 13: an OOM inside the curvature probe skips that refresh, halves the probe batch
    and says so; at a probe batch of one the refreshes stop. The run finishes every epoch."""
    logs = []
    t, loop = tri_trainer(log=logs.append, **{"epochs": 2, "triaccel.curvature.batch": 16})
    real = loop.probe.estimate

    def budget(limit):  # an injected memory budget, as the trainer's oom_probe does for steps
        def estimate(loss_fn, **kw):
            if len(loop.probe_batch[0]) > limit:
                raise torch.OutOfMemoryError("injected: probe batch over budget")
            return real(loss_fn, **kw)
        return estimate

    loop.probe.estimate = budget(4)
    t.fit()
    assert len(t.history.epochs) == 2
    assert loop.probe_bs == 4 and loop.probe_ooms == 2  # 16 -> 8 -> 4, then refreshes succeed
    assert any("[curvature] out of memory in the Hessian probe at batch 16" in m for m in logs)
    assert any(x > 0 for x in loop.lam)  # a refresh at batch 4 ran

    t, loop = tri_trainer(log=(logs := []).append, **{"epochs": 1, "triaccel.curvature.batch": 2})
    loop.probe.estimate = budget(0)  # nothing fits
    t.fit()
    assert loop.probe_bs == 0 and len(t.history.epochs) == 1
    assert any("curvature refreshes are off" in m for m in logs)


def test_probe_auto_is_exact_for_shallow_models_and_batched_for_deep_ones():
    """#14 case 15: the default probe must leave every shipped model usable. Exact probes cost one
    Hessian-vector product per layer (EfficientNet-B0: 82 layers, no epoch in 170 s at 224 px on
    the H200); auto keeps them for shallow models and says when it switches to batched."""
    t, loop = tri_trainer(**{"epochs": 1})
    assert t.cfg.triaccel.curvature.probe == "auto" and loop.probe.mode == "exact"
    logs = []
    t, loop = tri_trainer(log=logs.append, **{"epochs": 1, "model.name": "efficientnet_b0", "data.image_size": 32})
    assert loop.L > 32 and loop.probe.mode == "batched"
    assert any("probe auto: batched for" in m for m in logs)


@pytest.mark.parametrize("every,samples", [(1, 19), (5, 4), (None, 2)])  # 1: step 1 fed the first refresh
def test_gradient_statistics_are_sampled_every_stats_every_steps(every, samples):
    """The statistics launch runs on every stats_every-th step only (unset: min(10, control_every)),
    and each window still gets a sample: the precision controller reads a filled EMA at step 10."""
    over = {"mode": "triaccel", "triaccel.batch.enabled": "false", "triaccel.curvature.method": "fisher",
            "triaccel.curvature.every": 1000, "triaccel.control_every": 10}
    if every is not None:
        over["triaccel.stats_every"] = every
    cfg = small_cfg(**over)
    loop = TriAccelLoop(cfg.triaccel, log=lambda *a: None)
    t = Trainer(cfg, callbacks=[loop], log=lambda *a: None).setup()
    for i in range(20):
        t.train_step(torch.arange(16 * i, 16 * i + 16))
    assert loop.fisher_n == samples
    assert all(v > 0 for v in loop.trajectory[0]["variance"])


def test_stats_every_above_control_every_is_refused():
    from triaccel.errors import ConfigError

    with pytest.raises(ConfigError, match=r"triaccel.stats_every: must be in \[1, control_every \(10\)\]"):
        small_cfg(**{"mode": "triaccel", "triaccel.control_every": 10, "triaccel.stats_every": 20})


@pytest.mark.parametrize("off", [None, "precision", "curvature"])
def test_loop_timing_counts_host_seconds_of_each_part_it_runs(off):
    """``timing`` (reported as ctrl_stats_s, ctrl_curvature_s, ctrl_window_s): host seconds in the statistics
    launches, the curvature refreshes and the windows; a part that never runs adds nothing."""
    over = {"epochs": 1, "triaccel.curvature.method": "fisher", "triaccel.batch.enabled": False}
    if off:
        over[f"triaccel.{off}.enabled"] = False
    t, loop = tri_trainer(**over)
    s = t.fit()
    m = t.history.epochs[-1]
    assert loop.timing["window_s"] > 0 and m["ctrl_window_s"] == loop.timing["window_s"]
    assert (loop.timing["curvature_s"] > 0) == (off != "curvature")
    # the statistics feed the precision controller and the Fisher proxy: off only when neither reads them
    assert loop.timing["stats_s"] > 0
    assert s["efficiency"] > 0


@pytest.mark.parametrize("rule", ["normalized", "paper"])
def test_curvature_promotion_compares_tau_curv_with_the_lr_rules_quantity(rule):
    """config.py: tau_curv is compared with the quantity the lr rule uses, lambda (paper) or lambda / median
    lambda (normalized). Every layer at lambda 500 and one at 1e5, tau_curv 100: the paper rule promotes
    every layer, the normalized one only the outlier (its ratio is 200; the others' is 1)."""
    t, loop = tri_trainer(**{"epochs": 1, "triaccel.curvature.method": "fisher", "triaccel.curvature.lr_rule": rule,
                             "triaccel.curvature.tau_curv": 100.0, "triaccel.curvature.every": 10 ** 6,
                             "triaccel.precision.tau_low": 1e30, "triaccel.precision.tau_high": 1e31,
                             "triaccel.batch.enabled": False})
    t.train_step(torch.arange(16))  # step 1: the statistics and a first refresh exist
    loop.fisher_acc.fill_(500.0)
    loop.fisher_acc[0] = 1e5
    loop.fisher_n = 1
    loop.curv.lam = [None] * loop.L  # the EMA starts from these values
    loop._refresh_curvature(t)
    assert loop.lam[0] == 1e5 and set(loop.lam[1:]) == {500.0}
    loop._control_window(t, 4)
    promoted = [e > b for e, b in zip(loop.prec.effective, loop.prec.base)]
    assert promoted == ([True] * loop.L if rule == "paper" else [True] + [False] * (loop.L - 1)), promoted


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a real CUDA out-of-memory error")
def test_a_real_cuda_oom_settles_below_the_failed_size_and_loses_no_example():
    """The H200 case in small: under torch.cuda.set_per_process_memory_fraction (memory_limit_fraction)
    of 1.5 GiB, the first step of 1,024 digits at 64 px (about 6 MiB of activations an example) really
    runs out of memory. The run finishes, trains every example once an epoch, and after each OOM no
    micro-batch goes above OOM_MARGIN of the smallest size that failed. A window that runs out of memory
    fetches its examples again: only the windows that finished count."""
    from triaccel.controllers.batch import oom_limit
    from triaccel.trainer import Callback

    total = torch.cuda.get_device_properties(0).total_memory
    frac = 1.5 * 2**30 / total
    failed, calls = [], []

    pending, seen = [], []  # the examples fetched in the window under way; those of finished windows

    class Failures(Callback):
        def on_oom(self, tr, micro_batch):  # the window starts again with the same examples
            failed.append(micro_batch)
            pending.clear()

        def on_step_end(self, tr, step):
            seen.extend(pending)
            pending.clear()

    cfg = small_cfg(**{"mode": "triaccel", "device": "cuda", "epochs": 2, "batch_size": 1024,
                       "eval_batch_size": 64, "data.image_size": 64, "model.width": 32,
                       "memory_limit_fraction": frac, "triaccel.batch.max_batch": 4096})
    loop = TriAccelLoop(cfg.triaccel, log=lambda *a: None)
    torch.cuda.empty_cache()
    try:
        t = Trainer(cfg, callbacks=[loop, Failures()], log=lambda *a: None,
                    oom_probe=lambda micro: calls.append((len(failed), micro))).setup()
        real = t.train_data.batch
        t.train_data.batch = lambda idx, train: (train and pending.append(idx.clone()), real(idx, train))[1]
        t.fit()
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)  # the limit is per process: the next tests run without it
        torch.cuda.empty_cache()
    assert failed and failed[0] == 1024 and t.oom_events == len(failed)
    assert sorted(torch.cat(seen).tolist()) == sorted(list(range(len(t.train_data))) * 2)
    for k in range(1, len(failed) + 1):
        after = [m for j, m in calls if j == k]
        assert after and max(after) <= oom_limit(min(failed[:k])) < min(failed[:k]), (failed, k, max(after))
    assert loop.batch.limit == oom_limit(min(failed), loop.batch.buckets) and t.micro_batch <= loop.batch.limit


def test_a_batch_window_in_which_a_new_precision_plan_took_effect_is_not_measured():
    """The first steps under a new plan carry its new kernels (and, into fp16, the GradScaler's skipped
    steps): on the H200 such a window made B=64 look 17x costlier than B=96 and decided the exploration.
    The window after a plan change is not measured; the batch controller measures that size again."""
    t, loop = tri_trainer(**{"epochs": 1, "triaccel.policy": "score", "triaccel.control_every": 10,
                             "triaccel.batch.explore_steps": 5, "triaccel.batch.cooldown": 0,
                             "triaccel.batch.budget_gb": 8, "triaccel.precision.tau_low": 1e9,
                             "triaccel.precision.tau_high": 2e9, "triaccel.precision.scale": "absolute"})
    t.fit()
    traj = loop.trajectory
    changed = [i for i, r in enumerate(traj) if r.get("precision_changed")]
    assert changed, "every layer goes to fp16 at the first control window (amp_dtype bf16)"
    nxt = [r for r in traj[changed[0] + 1:] if "batch_action" in r]
    assert nxt and nxt[0]["batch_action"] == "hold" and nxt[0]["window_s"] != nxt[0]["window_s"]  # NaN: unmeasured
    measured = [r for r in traj if "batch_action" in r and r["window_s"] == r["window_s"]]
    assert measured and not loop.win_disturbed


def test_the_loop_budgets_exploring_by_the_runs_length_and_its_first_step():
    """The batch controller sees the run's length (epochs x the training split) and its first step's
    seconds (what a new size costs once, predicted): with no budget it never leaves B0, with a large
    one it explores as before."""
    sizes = {}
    for budget in (0.0, 1e6):
        logs = []
        t, loop = tri_trainer(log=logs.append, **{"epochs": 1, "triaccel.policy": "score", "triaccel.control_every": 10,
                                                  "triaccel.batch.explore_steps": 5, "triaccel.batch.cooldown": 0,
                                                  "triaccel.batch.budget_gb": 8,
                                                  "triaccel.batch.explore_budget": budget})
        t.fit()
        b = loop.batch
        assert b.run_examples == len(t.train_data) and loop.first_step_s > 0 and b.switch_s is not None
        sizes[budget] = {r["batch_size"] for r in loop.trajectory}
        assert b.over_budget is (budget == 0.0) and not b.exploring
        assert any("exploring stopped" in m for m in logs) is (budget == 0.0)
    assert sizes[0.0] == {t.cfg.batch_size} and len(sizes[1e6]) > 1, sizes


@pytest.mark.skipif(not torch.cuda.is_available(), reason="cuDNN autotuning is a CUDA setting")
def test_cudnn_autotuning_is_on_from_the_first_step_and_waits_only_for_the_paper_batch_rule():
    """Turning autotuning on later tunes nothing already met (torch's plan cache keeps the untuned choice):
    under the score policy a run is tuned from its first step, as static AMP is. Under the paper's batch
    rule (a new size every window) it is off until the plan has settled."""
    logs = []
    cfg = small_cfg(**{"mode": "triaccel", "device": "cuda", "epochs": 1, "triaccel.control_every": 8,
                       "triaccel.batch.explore_steps": 4})
    loop = TriAccelLoop(cfg.triaccel, log=logs.append)
    Trainer(cfg, callbacks=[loop], log=logs.append).setup().fit()
    assert torch.backends.cudnn.benchmark is True and not loop.autotune_due
    assert not [m for m in logs if "cuDNN autotuning on" in m]

    logs.clear()
    cfg = small_cfg(**{"mode": "triaccel", "device": "cuda", "epochs": 2, "triaccel.control_every": 8,
                       "triaccel.batch.policy": "paper"})
    loop = TriAccelLoop(cfg.triaccel, log=logs.append)
    t = Trainer(cfg, callbacks=[loop], log=logs.append).setup()
    assert torch.backends.cudnn.benchmark is False and loop.autotune_due
    t.fit()
    on = [m for m in logs if "cuDNN autotuning on" in m]
    assert len(on) == 1 and torch.backends.cudnn.benchmark is True and not loop.autotune_due
    first_decision = next(r for r in loop.trajectory if "precision_changed" in r)
    assert first_decision["window"] == 1  # the plan's first decision came before autotuning, not after
