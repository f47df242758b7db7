"""The guide's own checks (seed 001) against this trainer, on the CPU."""
import copy

import pytest
import torch

from conftest import small_cfg
from triaccel.models import build_model, enable_checkpointing
from triaccel.config import ModelConfig
from triaccel.errors import TriAccelError
from triaccel.trainer import Callback, Decisions, Trainer


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


def _same(a, b) -> bool:
    """Nested dicts, lists and tensors equal exactly (tensors on any device)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if torch.is_tensor(a):
        return torch.is_tensor(b) and a.shape == b.shape and torch.equal(a.cpu(), b.cpu())
    return a == b


def _maxdiff(a, b):
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


def test_accumulation_windows_9_and_1_match_combined_window():
    """Ten examples, micro-batches of 3, windows of 9 and 1 == one batch of 9 then one of 1."""
    runs = []
    for accum in (3, 1):
        cfg = small_cfg(**{"model.name": "mlp", "batch_size": 9, "accum_steps": accum, "data.augment": False,
                           "optim.weight_decay": 0.0})
        t = Trainer(cfg).setup()
        assert t.micro_batch == (3 if accum == 3 else 9)
        idx = torch.arange(10)
        t.train_step(idx[:9])
        t.train_step(idx[9:])  # the short last window updates too
        runs.append(_params(t.model))
        assert t.schedule.done == 10
    assert _maxdiff(*runs) < 1e-6


def test_accumulation_is_normalised_by_real_count_not_micro_batches():
    """A window of 9 in micro-batches 4+4+1 still gives the mean gradient of the 9 examples."""
    cfg = small_cfg(**{"model.name": "mlp", "batch_size": 9, "accum_steps": 3, "data.augment": False})
    t = Trainer(cfg).setup()
    t.apply(Decisions(micro_batch=4))
    ref = copy.deepcopy(t.model)
    grads = {}

    class Grab(Callback):
        def on_grads_ready(self, tr, n):
            grads["acc"] = [p.grad.clone() for p in tr.model.parameters()]

    t.callbacks.append(Grab())
    idx = torch.arange(9)
    t.train_step(idx)
    x, y = t.train_data.batch(idx, train=False)
    torch.nn.functional.cross_entropy(ref(x), y).backward()
    assert _maxdiff(grads["acc"], [p.grad for p in ref.parameters()]) < 1e-6


@pytest.mark.parametrize("deferred", [False, True])
def test_fp16_overflow_skips_update_keeps_schedule_halves_scale(deferred):
    cfg = small_cfg(**{"mode": "amp", "amp_dtype": "fp16", "data.augment": False,
                       "deferred_skip": str(deferred).lower()})
    t = Trainer(cfg).setup()
    assert t.scaler.is_enabled()
    t.train_step(torch.arange(32))  # one good step first
    t._settle_skip()
    before, done, scale = _params(t.model), t.schedule.done, t.scaler.get_scale()
    p0 = next(t.model.parameters())
    h = p0.register_hook(lambda g: g * float("inf"))
    _, info = t.train_step(torch.arange(32, 64))
    h.remove()
    assert info.skipped is (None if deferred else True)  # deferred: known at the next step
    assert _maxdiff(before, _params(t.model)) == 0.0
    assert t.scaler.get_scale() == scale / 2
    _, info = t.train_step(torch.arange(64, 96))
    t._settle_skip()
    assert t.skipped_steps == 1 and t.schedule.done == done + 32  # the skipped step did not advance it
    assert info.skipped is (None if deferred else False)


@pytest.mark.parametrize("deferred", [False, True])
def test_an_fp16_forward_that_overflows_every_step_stops_saying_the_updates_were_skipped(deferred):
    """A forward past fp16's range gives an inf loss at every step; the GradScaler skips every update and
    the weights never move, so the run can only stop. Its line counts the skipped updates and names bf16."""
    from triaccel.trainer import Diverged

    cfg = small_cfg(**{"mode": "amp", "amp_dtype": "fp16", "data.augment": False, "triaccel.control_every": 5,
                       "deferred_skip": str(deferred).lower()})
    t = Trainer(cfg).setup()
    with torch.no_grad():
        for p in t.model.parameters():
            p.mul_(1e4)  # activations past 65504 within the first layers
    before = _params(t.model)
    with pytest.raises(Diverged) as e:
        t.train_epoch()
    assert str(e.value) == ("train loss became non-finite at step 5 (5 of its 5 updates skipped by the GradScaler: "
                            "fp16 overflows; amp_dtype: bf16 keeps fp32's range)"), str(e.value)
    assert _maxdiff(before, _params(t.model)) == 0.0


def test_checkpointed_model_matches_plain():
    torch.manual_seed(3)
    plain = build_model(ModelConfig(name="small_cnn", width=8), 10, 1, 8)
    ckpt = copy.deepcopy(plain)
    assert enable_checkpointing(ckpt) == 3
    x = torch.randn(6, 1, 8, 8)
    a, b = plain(x), ckpt(x)
    a.square().mean().backward()
    b.square().mean().backward()
    assert torch.allclose(a, b)
    assert all(torch.allclose(p.grad, q.grad) for p, q in zip(plain.parameters(), ckpt.parameters()))


def test_checkpoint_blocks_recomputes_only_the_first_blocks_and_saves_less():
    """checkpoint_blocks: N wraps the first N blocks; the gradients are the plain model's, and the
    bytes autograd keeps for backward fall with each block checkpointed."""
    from triaccel.errors import ConfigError

    torch.manual_seed(3)
    plain = build_model(ModelConfig(name="small_cnn", width=8), 10, 1, 8)
    x = torch.randn(6, 1, 8, 8)

    def saved_bytes(m):
        seen = {}

        def pack(t):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = m(x)
        return out, sum(seen.values())

    out0, full = saved_bytes(plain)
    out0.square().mean().backward()
    sizes = []
    for first in (1, 2, 3):
        m = copy.deepcopy(plain)
        m.zero_grad(set_to_none=True)
        assert enable_checkpointing(m, first) == first
        out, nbytes = saved_bytes(m)
        out.square().mean().backward()
        assert torch.allclose(out, out0)
        assert all(torch.allclose(p.grad, q.grad) for p, q in zip(plain.parameters(), m.parameters()))
        sizes.append(nbytes)
    assert full > sizes[0] > sizes[1] > sizes[2]
    with pytest.raises(ConfigError, match="checkpoint_blocks: SmallCNN has 3 blocks, got 4"):
        enable_checkpointing(copy.deepcopy(plain), 4)
    # read only with checkpointing: a search that turns checkpointing off around it, or a profile's
    # checkpointing-off variant, trains every block plainly
    t = Trainer(small_cfg(checkpoint_blocks=2), log=lambda *_: None).setup()
    assert not any(hasattr(b.forward, "__wrapped__") or b.forward.__class__.__name__ == "function"
                   for b in t.model.blocks())
    with pytest.raises(ConfigError, match="checkpoint_blocks: must be null"):
        small_cfg(checkpoint_blocks=0)


@pytest.mark.parametrize("momentum", [0.1, None])  # None: a cumulative average over num_batches_tracked
def test_checkpointed_recomputation_does_not_update_batchnorm_statistics_twice(momentum):
    """The recomputation in backward runs each block's BatchNorm again: without care its running
    statistics move twice per step (momentum 0.1 acting like 0.19), so evaluation sees other
    statistics than the plain model's. Checked over three steps, the buffers must match."""
    torch.manual_seed(4)
    plain = build_model(ModelConfig(name="small_cnn", width=8), 10, 1, 8)
    for m in plain.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.momentum = momentum
    ckpt = copy.deepcopy(plain)
    enable_checkpointing(ckpt)
    for _ in range(3):
        x = torch.randn(6, 1, 8, 8)
        plain(x).square().mean().backward()
        ckpt(x).square().mean().backward()
    bufs = lambda m: {k: v for k, v in m.state_dict().items() if "running" in k or "num_batches" in k}  # noqa: E731
    a, b = bufs(plain), bufs(ckpt)
    assert a.keys() == b.keys() and a
    for k in a:
        assert torch.allclose(a[k].float(), b[k].float()), k
    assert plain.training and ckpt.training


def test_checkpointed_backward_of_a_frozen_batchnorm_model_leaves_its_counters_alone():
    """In eval mode (frozen BatchNorm, as when fine-tuning) BatchNorm updates nothing in the
    forward; the recomputation must not wind its counters back either (they went to -3 in three
    steps, and a momentum=None norm then divided by zero)."""
    torch.manual_seed(5)
    m = build_model(ModelConfig(name="small_cnn", width=8), 10, 1, 8)
    enable_checkpointing(m)
    m.eval()
    before = copy.deepcopy(m.state_dict())
    for _ in range(3):
        m(torch.randn(6, 1, 8, 8)).square().mean().backward()
    after = m.state_dict()
    for k, v in before.items():
        if "running" in k or "num_batches" in k:
            assert torch.equal(v, after[k]), k


def test_oom_recovery_loses_no_sample():
    """A memory budget that a micro-batch above 24 would exceed: every example still trains once."""
    cfg = small_cfg(**{"batch_size": 100, "epochs": 1})
    budget = 24

    def probe(micro):
        if micro > budget:
            raise torch.OutOfMemoryError(f"fake: {micro} > {budget}")

    t = Trainer(cfg, oom_probe=probe, log=lambda *a: None).setup()
    seen = []
    real_batch = t.train_data.batch

    def spy(idx, train):
        seen.append(idx.clone())
        return real_batch(idx, train)

    t.train_data.batch = spy
    t.fit()
    trained = torch.cat(seen).tolist()
    assert sorted(trained) == list(range(len(t.train_data)))
    assert t.oom_events >= 1 and t.micro_batch <= budget
    assert t.history.epochs[0]["examples"] == len(t.train_data)


def test_oom_beyond_recovery_is_a_clear_error():
    from triaccel.trainer import OutOfMemoryBeyondRecovery

    def probe(micro):
        raise torch.OutOfMemoryError("fake")

    t = Trainer(small_cfg(), oom_probe=probe, log=lambda *a: None).setup()
    with pytest.raises(OutOfMemoryBeyondRecovery, match="micro-batch of 1"):
        t.fit()


@pytest.mark.parametrize("state", ["fp32", "bf16"])
@pytest.mark.parametrize("device", [
    "cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))])
def test_resume_from_checkpoint_is_identical(tmp_path, device, state):
    """A resumed run takes up exactly the state it saved: weights, optimizer, sampler and every
    generator (on CUDA, load() maps the checkpoint to the device: the generator states went along
    and a resumed search failed every trial). On the CPU the finished run equals an uninterrupted
    one; on CUDA the state is compared, not the trajectory (cuDNN's backward sums in a different
    order from run to run: 8e-3 apart after 3 epochs on the H200, resumed or not). With the
    optimizer's state in bf16 (Tri-Accel), it comes back in bf16, bit for bit."""
    extra = {"mode": "triaccel", "triaccel.precision.optimizer_state": "bf16"} if state == "bf16" else {}
    cfg = small_cfg(**{"epochs": 3, "device": device, **extra})
    full = Trainer(cfg, log=lambda *a: None).setup()
    full.fit()

    class StopAfter2(Callback):
        def on_epoch_end(self, tr, m):
            tr.stop = tr.epoch == 2

    part = Trainer(cfg, callbacks=[StopAfter2()], log=lambda *a: None).setup()
    part.fit()
    assert part.epoch == 2
    part.save(tmp_path / "ck.pt")
    saved = {"data": part.train_data.gen.get_state(), "torch": torch.get_rng_state(),
             "cuda": torch.cuda.get_rng_state() if device == "cuda" else None,
             "order": part.sampler.state_dict(), "opt": part.optimizer.state_dict()["state"]}
    torch.manual_seed(12345)  # the process's generators move on; load must put them back
    resumed = Trainer(cfg, log=lambda *a: None).setup()
    resumed.load(tmp_path / "ck.pt")
    assert _maxdiff(_params(part.model), _params(resumed.model)) == 0
    assert torch.equal(resumed.train_data.gen.get_state(), saved["data"])
    assert torch.equal(torch.get_rng_state(), saved["torch"])
    if device == "cuda":
        assert torch.equal(torch.cuda.get_rng_state(), saved["cuda"])
    assert _same(resumed.sampler.state_dict(), saved["order"])
    assert saved["opt"] and _same(resumed.optimizer.state_dict()["state"], saved["opt"])
    bufs = [v for st in resumed.optimizer.state.values() for v in st.values() if torch.is_tensor(v) and v.numel() > 1]
    assert bufs and {v.dtype for v in bufs} == {torch.bfloat16 if state == "bf16" else torch.float32}
    resumed.fit()
    assert resumed.epoch == 3 and len(resumed.history.epochs) == 3
    if device == "cpu":
        assert _maxdiff(_params(full.model), _params(resumed.model)) < 1e-6


def test_a_checkpoint_of_another_optimizer_is_refused_in_one_line(tmp_path):
    """On a CPU, fp32 state is torch.optim.SGD and bf16 state the fused optimizers' reference loop:
    their states do not read each other (a resume failed later with KeyError 'dampening'). Loading
    one into the other is a clear error before anything is changed."""
    cfg = small_cfg(**{"epochs": 1, "mode": "triaccel"})
    t = Trainer(cfg, log=lambda *a: None).setup()
    t.fit()
    t.save(tmp_path / "ck.pt")
    other = Trainer(small_cfg(**{"epochs": 1, "mode": "triaccel", "triaccel.precision.optimizer_state": "bf16"}),
                    log=lambda *a: None).setup()
    before = _params(other.model)
    with pytest.raises(TriAccelError, match=r"^checkpoint: its optimizer is SGD, this run's is FusedSGD \(mode or "
                                            r"triaccel.precision.optimizer_state differ\)"):
        other.load(tmp_path / "ck.pt")
    assert _maxdiff(before, _params(other.model)) == 0


@pytest.mark.parametrize("mode", ["fp32", "amp"])
def test_end_to_end_learns_digits(mode):
    cfg = small_cfg(**{"epochs": 8, "mode": mode, "evaluate_test": True, "model.width": 16})
    t = Trainer(cfg, log=lambda *a: None).setup()
    s = t.fit()
    assert s["val_acc"] > 85.0 and s["test_acc"] > 80.0
    e = t.history.epochs[-1]
    for k in ("train_loss", "val_acc", "epoch_time_s", "peak_mem_gib", "images_per_s", "efficiency"):
        assert e[k] > 0
    assert t.history.epochs[0]["train_loss"] > e["train_loss"]


def test_channels_last_trains_the_same_model():
    runs = []
    for cl in (False, True):
        t = Trainer(small_cfg(**{"channels_last": cl, "epochs": 1}), log=lambda *a: None).setup()
        t.fit()
        runs.append(_params(t.model))
    assert _maxdiff(*runs) < 1e-4


def test_channels_last_auto_is_off_on_cpu_and_explicit_setting_wins():
    t = Trainer(small_cfg(epochs=1), log=lambda *a: None).setup()
    assert t.cfg.channels_last is None and t.channels_last is False  # auto: NHWC only for conv models on CUDA
    t = Trainer(small_cfg(channels_last=True, epochs=1), log=lambda *a: None).setup()
    t.sampler.start_epoch(0)
    x, _ = t.train_data.batch(t.sampler.take(4), train=True)
    assert t.channels_last and x.is_contiguous(memory_format=torch.channels_last)


def test_cudnn_autotuning_is_off_at_the_start_only_under_the_paper_batch_rule():
    """Autotuning on later tunes nothing already met (torch's cuDNN plan cache keeps the untuned
    choice): a run is tuned from its first step as static AMP is, unless its batch moves every window."""
    from triaccel.trainer import cudnn_benchmark_for

    assert cudnn_benchmark_for(small_cfg(mode="amp"))
    assert cudnn_benchmark_for(small_cfg(mode="triaccel"))  # the score policy's batch: tuned once per size
    assert cudnn_benchmark_for(small_cfg(**{"mode": "triaccel", "triaccel.batch.enabled": False}))
    assert not cudnn_benchmark_for(small_cfg(**{"mode": "triaccel", "triaccel.batch.policy": "paper"}))
    assert not cudnn_benchmark_for(small_cfg(**{"mode": "triaccel", "triaccel.policy": "paper"}))
    assert cudnn_benchmark_for(small_cfg(**{"mode": "triaccel", "triaccel.policy": "paper",
                                            "triaccel.batch.enabled": False}))
    assert cudnn_benchmark_for(small_cfg(**{"mode": "triaccel", "triaccel.batch.policy": "paper",
                                            "cudnn_benchmark": True}))
    assert not cudnn_benchmark_for(small_cfg(mode="amp", cudnn_benchmark=False))


def test_apply_is_the_only_writer_of_the_adaptive_state():
    """Controllers return Decisions; a callback writing the trainer's knobs directly is refused,
    and a decision returned from a hook takes effect at the next step."""
    t = Trainer(small_cfg(epochs=1)).setup()
    for name, value in (("batch_size", 32), ("micro_batch", 8), ("batch_lr_factor", 2.0), ("lr_scales", (0.5,))):
        with pytest.raises(AttributeError, match=f"Trainer.{name} changes only through Trainer.apply"):
            setattr(t, name, value)
    with pytest.raises(TypeError):
        t.lr_scales[0] = 0.5  # a tuple: no writes in place either

    seen = []

    class Halve(Callback):
        def on_step_end(self, tr, info):
            seen.append(tr.batch_size)
            return Decisions(batch_size=tr.batch_size // 2) if info.step == 2 else None

    t = Trainer(small_cfg(epochs=1, batch_size=64), callbacks=[Halve()]).setup()
    t.fit()
    assert seen[:4] == [64, 64, 32, 32]
    assert Decisions(batch_size=4, levels={"a": "fp16"}).merged(Decisions(levels={"b": "fp32"}, micro_batch=2)) == \
        Decisions(batch_size=4, micro_batch=2, levels={"a": "fp16", "b": "fp32"})


@pytest.mark.parametrize("mode", ["amp", "triaccel"])
def test_deferred_skip_trains_exactly_as_the_synchronous_check(mode):
    """deferred_skip learns a step's GradScaler skip one step later (no host sync per step); the
    lr schedule must not move: same weights, same schedule position, same skip count as the
    synchronous check, with overflows injected at chosen steps (one is the epoch's last step)."""
    def run(deferred):
        over = {"mode": mode, "amp_dtype": "fp16", "epochs": 2, "data.augment": False,
                "deferred_skip": str(deferred).lower(), "optim.warmup_epochs": 1}
        if mode == "triaccel":
            over.update({"triaccel.batch.enabled": "false", "triaccel.curvature.method": "fisher",
                         "triaccel.precision.enabled": "false", "triaccel.precision.cpu_fp16": "true"})
        t = Trainer(small_cfg(**over), log=lambda *a: None).setup()
        steps_per_epoch = -(-len(t.train_data) // t.batch_size)
        bad = {3, 7, steps_per_epoch, steps_per_epoch + 2}
        p0 = next(t.model.parameters())
        p0.register_hook(lambda g: g * float("inf") if t.step_count + 1 in bad else g)
        t.fit()
        return t

    sync, deferred = run(False), run(True)
    assert deferred.skipped_steps == sync.skipped_steps == 4
    assert [e["skipped_steps"] for e in deferred.history.epochs] == [e["skipped_steps"] for e in sync.history.epochs]
    assert deferred.schedule.done == sync.schedule.done
    for a, b in zip(sync.model.parameters(), deferred.model.parameters()):
        assert torch.equal(a.detach(), b.detach())


def test_every_example_trains_exactly_once_per_epoch_across_batch_moves_and_an_oom_split():
    """The batch moves between sizes every step and one window runs out of memory: within each
    epoch every training example reaches an optimizer update exactly once (a retried window's
    first attempt counts for nothing: its gradients are dropped)."""
    sizes = [64, 40, 96, 24, 96, 56]
    trained, attempt, fired = [], [], []

    def probe(micro):  # one out-of-memory micro-batch of 96, as the allocator would raise it
        if micro == 96 and not fired:
            fired.append(micro)
            raise torch.OutOfMemoryError("injected")

    class Moves(Callback):
        def on_step_end(self, tr, info):
            trained.extend(torch.cat(attempt).tolist())
            attempt.clear()
            s = sizes[info.step % len(sizes)]
            return Decisions(batch_size=s, micro_batch=s)

        def on_oom(self, tr, micro_batch):
            attempt.clear()  # the window is re-run from its first example

    t = Trainer(small_cfg(mode="amp", amp_dtype="bf16", epochs=2), callbacks=[Moves()], log=lambda *a: None,
                oom_probe=probe).setup()
    batch = t.train_data.batch

    def recording(chunk, train=True):
        attempt.append(chunk.detach().clone())
        return batch(chunk, train=train)

    t.train_data.batch = recording
    n = len(t.train_data)
    for epoch in range(2):
        before = len(trained)
        t.history.epochs.append(t.train_epoch())
        t.epoch += 1
        assert sorted(trained[before:]) == list(range(n)), f"epoch {epoch + 1}"
    assert fired and t.oom_events == 1


def test_padded_eval_batches_give_the_same_accuracy_and_loss():
    """Padding the short last eval batch (one shape for cuDNN to tune) drops the padded outputs:
    the same accuracy and loss as the unpadded split, on a split that is no multiple of the batch."""
    t = Trainer(small_cfg(**{"mode": "fp32", "epochs": 1, "eval_batch_size": 50}), log=lambda *a: None).setup()
    t.fit()
    assert len(t.val_data) % 50 and len(t.val_data) > 50
    seen = []
    h = t.model.register_forward_hook(lambda m, i, o: seen.append(i[0].shape[0]))
    plain = t.evaluate(t.val_data, pad=False)
    n_plain, seen[:] = list(seen), []
    padded = t.evaluate(t.val_data, pad=True)
    h.remove()
    assert set(seen) == {50} and n_plain[-1] == len(t.val_data) % 50  # one shape, against a short last batch
    assert padded[0] == pytest.approx(plain[0]) and padded[1] == pytest.approx(plain[1], rel=1e-5)
    assert t.evaluate(t.val_data) == plain  # on a CPU it does not pad


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA allocator's peak")
def test_peak_memory_leaves_out_what_the_process_held_before_the_run():
    """A search's baselines run one after another in one process: another run's tensors, still
    held, are not this run's memory (on the H200 one baseline read 0.65 GiB against 0.39 alone)."""
    cfg = small_cfg(**{"epochs": 1, "device": "cuda"})
    Trainer(cfg, log=lambda *a: None).setup().fit()  # cuDNN's autotuning (its trial workspaces) done once
    alone = Trainer(cfg, log=lambda *a: None).setup().fit()["peak_mem_gib"]
    hog = torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda")  # 64 MiB held by "an earlier run"
    beside = Trainer(cfg, log=lambda *a: None).setup().fit()["peak_mem_gib"]
    del hog
    assert abs(beside - alone) * 2**30 < 8 * 2**20, (alone, beside)


def test_a_triaccel_section_in_another_mode_is_said_unused():
    """An exported config run with --set mode=amp keeps its triaccel section; its optimizer_state:
    bf16 (say) does not apply to the static run, and the run says so once, naming the keys."""
    logs = []
    Trainer(small_cfg(mode="amp", amp_dtype="bf16", **{"triaccel.precision.optimizer_state": "bf16"}),
            log=logs.append).setup()
    said = [ln for ln in logs if ln.startswith("[config]")]
    assert said == ["[config] mode amp: the triaccel section is not used (triaccel.precision.optimizer_state set); "
                    "it applies in mode: triaccel"]
    logs.clear()
    Trainer(small_cfg(mode="amp", amp_dtype="bf16"), log=logs.append).setup()
    assert not [ln for ln in logs if ln.startswith("[config]")]
    # the keys set, not those a policy fills in or stats_every following control_every
    logs.clear()
    Trainer(small_cfg(mode="amp", amp_dtype="bf16", **{"triaccel.policy": "paper", "triaccel.control_every": 5}),
            log=logs.append).setup()
    assert [ln for ln in logs if ln.startswith("[config]")] == [
        "[config] mode amp: the triaccel section is not used (triaccel.policy, triaccel.control_every set); "
        "it applies in mode: triaccel"]
