"""The small causal language model: the shipped corpus, its character windows, the GPT, and the
trainer's next-token loss and accuracy."""
import hashlib
import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
import yaml

from _harness import child_env
from conftest import ROOT
from triaccel.errors import ConfigError
from triaccel.precision import PrecisionRuntime, layer_modules
from triaccel.metrics import correct_count, example_loss_sum
from triaccel.zoo.gpt import GPT
from triaccel.zoo.text import CORPORA_DIR, char_corpus, decode, load_corpus, split_bounds


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread: on a machine whose cores other processes keep busy, two threads contending
    ran a tiny GPT's step 25x slower than one (2.5 s against 0.1 s, B=32 x 32 tokens)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# ------------------------------------------------------------------ corpus and windows
def test_the_corpus_ships_byte_for_byte_with_its_notice():
    raw = (CORPORA_DIR / "tinyshakespeare.txt").read_bytes()
    assert len(raw) == 1_115_394
    assert hashlib.md5(raw).hexdigest() == "6fb458f1232090904fb40fe944165e91"
    assert "public domain" in (CORPORA_DIR / "NOTICE.md").read_text()


def test_vocabulary_is_the_sorted_characters_and_ids_decode_back():
    vocab, ids = load_corpus("shakespeare")
    text = (CORPORA_DIR / "tinyshakespeare.txt").read_text()
    assert vocab == "".join(sorted(set(text))) and len(vocab) == 65
    assert decode(ids[:200], vocab) == text[:200]
    d = char_corpus(block_size=16)
    assert d["meta"] == {"vocab_size": 65, "num_classes": 65, "block_size": 16}


def test_splits_are_by_position_and_share_no_text():
    T = 64
    d = char_corpus(block_size=T)  # stride = T: non-overlapping training windows
    _, ids = load_corpus("shakespeare")
    ids = torch.from_numpy(ids.astype("int64"))
    a, b = split_bounds(len(ids), 0.05, 0.05)
    assert (a, b) == (len(ids) - 2 * 55_769, len(ids) - 55_769)
    for split, start, stride in (("train", 0, T), ("val", a, T), ("test", b, T)):
        x, y = d[split].tensors
        assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape and x.shape[1] == T
        n = len(x)
        pos = start + torch.arange(n)[:, None] * stride + torch.arange(T)[None, :]
        assert torch.equal(x, ids[pos]) and torch.equal(y, ids[pos + 1])  # targets: the next token
        last = start + (n - 1) * stride + T  # the last character a window of this split reads (its last target)
        assert last < {"train": a, "val": b, "test": len(ids)}[split]  # no window reaches into the next split
        assert (start + n * stride + T) >= {"train": a, "val": b, "test": len(ids)}[split]  # and none is left out
    assert len(d["train"]) == (a - T - 1) // T + 1


def test_a_larger_stride_makes_a_shorter_epoch_and_keeps_validation_whole():
    full, sparse = char_corpus(block_size=32), char_corpus(block_size=32, stride=512)
    a, _ = split_bounds(1_115_394, 0.05, 0.05)
    assert len(sparse["train"]) == (a - 33) // 512 + 1 == 1961 and len(full["train"]) == (a - 33) // 32 + 1
    assert torch.equal(sparse["train"].tensors[0][1], full["train"].tensors[0][16])  # window 1 starts at 512
    assert torch.equal(sparse["val"].tensors[0], full["val"].tensors[0])  # validation does not depend on the stride
    assert char_corpus(block_size=32, test_fraction=0)["test"] is None


@pytest.mark.parametrize("kwargs,match", [
    ({"corpus": "wikipedia"}, r"data\.init_args\.corpus: unknown corpus 'wikipedia' \(shipped: shakespeare\)"),
    ({"block_size": 0}, r"data\.init_args\.block_size: must be in \[1, 8192\]"),
    ({"block_size": 8000, "val_fraction": 0.001}, r"data\.init_args\.block_size: 8000 leaves no val window"),
    ({"block_size": "64"}, r"data\.init_args\.block_size: must be an integer"),
    ({"stride": 0}, r"data\.init_args\.stride: must be >= 1"),
    ({"val_fraction": 0.7}, r"data\.init_args\.val_fraction: must be in \(0, 0\.5\)"),
])
def test_bad_arguments_are_one_line_naming_the_key(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        char_corpus(**kwargs)


# ------------------------------------------------------------------ the model
def tiny_gpt(**kw) -> GPT:
    torch.manual_seed(0)
    return GPT(**{"vocab_size": 65, "block_size": 16, "n_layer": 2, "n_head": 2, "n_embd": 32, **kw})


def test_forward_shapes_causality_and_tied_weights():
    m = tiny_gpt().eval()
    idx = torch.randint(0, 65, (3, 16))
    out = m(idx)
    assert out.shape == (3, 16, 65)
    assert m.lm_head.weight is m.wte.weight  # one parameter, counted once
    assert sum(p.numel() for p in m.parameters()) == sum(p.numel() for p in set(m.parameters()))
    # causal: a change at position 10 leaves the logits of positions 0..9 alone and moves position 10's
    idx2 = idx.clone()
    idx2[:, 10] = (idx2[:, 10] + 1) % 65
    out2 = m(idx2)
    assert torch.allclose(out[:, :10], out2[:, :10], atol=1e-6)
    assert not torch.allclose(out[:, 10], out2[:, 10], atol=1e-4)
    # the tied matrix gets the gradient of both uses (embedding rows and output scores)
    m.train()
    F.cross_entropy(m(idx).reshape(-1, 65), idx.reshape(-1)).backward()
    assert m.wte.weight.grad is not None and m.wte.weight.grad.abs().sum() > 0
    assert m.blocks() == list(m.h)


def test_model_arguments_are_checked_naming_the_key():
    with pytest.raises(ConfigError, match=r"model\.init_args\.n_embd: must be a multiple of n_head \(3\)"):
        GPT(vocab_size=65, n_head=3, n_embd=32)
    with pytest.raises(ConfigError, match=r"model\.init_args\.block_size: the model has 16 positions, the data's "
                                          r"windows hold 32 tokens"):
        tiny_gpt()(torch.zeros(1, 32, dtype=torch.long))


def test_the_precision_runtime_sees_every_projection_and_mixed_levels_run():
    m = tiny_gpt()
    names = [n for n, _ in layer_modules(m)]
    # every projection is a layer; the tied output head is one too, or (layer discovery that owns each
    # parameter once) runs at the level of the token embedding whose weight it shares
    projections = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
    assert {f"h.{i}.{n}" for i in (0, 1) for n in projections} <= set(names)
    head = "lm_head" if "lm_head" in names else "wte"
    assert head in names
    rt = PrecisionRuntime(m, torch.device("cpu"), initial="bf16", log=lambda *a: None)
    idx = torch.randint(0, 65, (2, 16))
    with rt.region():  # every layer bf16: one autocast region
        assert m(idx).dtype == torch.bfloat16
    rt.set(head, "fp32")  # the output head promoted: its logits are fp32, the blocks stay bf16
    rt.set("h.0.attn.c_attn", "fp32")  # attention's q, k, v (and so its logits) in fp32
    with rt.region():
        out = m(idx)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    F.cross_entropy(out.reshape(-1, 65), idx.reshape(-1)).backward()
    assert all(p.grad is not None for p in m.parameters())


# ------------------------------------------------------------------ loss and accuracy
def test_next_token_accuracy_and_loss_by_hand():
    # two windows of three positions over a vocabulary of four
    logits = torch.tensor([[[2.0, 0.0, 0.0, 0.0], [0.0, 3.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]],
                           [[0.0, 0.0, 5.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 2.0]]])
    targets = torch.tensor([[0, 1, 2], [2, 3, 3]])
    # arg-maxes 0, 1, 3 | 2, 0, 3: right at positions (0,0), (0,1), (1,0), (1,2): 4 of 6
    assert int(correct_count(logits, targets)) == 4
    nll = [math.log(sum(math.exp(v) for v in row)) - row[t]
           for win, tw in zip(logits.tolist(), targets.tolist()) for row, t in zip(win, tw)]
    # per window the mean over its positions, summed over windows: / 2 windows = the mean per token
    assert float(example_loss_sum(logits, targets)) / 2 == pytest.approx(sum(nll) / 6, rel=1e-6)
    # a classifier's batch is unchanged, bit for bit: summed per image, top-1 per image
    cls, y = torch.tensor([[1.0, 0.0], [0.0, 2.0]]), torch.tensor([0, 0])
    assert int(correct_count(cls, y)) == 1
    torch.manual_seed(0)
    cls, y = torch.randn(96, 10), torch.randint(0, 10, (96,))
    assert torch.equal(example_loss_sum(cls, y), F.cross_entropy(cls, y, reduction="sum"))
    assert torch.equal(correct_count(cls, y), (cls.argmax(1) == y).sum())


# ------------------------------------------------------------------ through the trainer
def tiny_cfg(*sets):
    from triaccel.config import load_config

    base = ["device=cpu", "tracking.enabled=false", "evaluate_test=false", "epochs=2"]
    return load_config(ROOT / "configs" / "shakespeare_gpt_tiny.yaml", base + list(sets))


@pytest.mark.parametrize("mode", ["amp", "triaccel"])
def test_a_few_epochs_of_training_lower_the_next_token_loss(mode):
    from triaccel.control import build_trainer

    # windows every 1,024 characters: 980 of them, 31 steps an epoch; validation on 2 % of the text (697 windows)
    t = build_trainer(tiny_cfg(f"mode={mode}", "data.init_args.stride=1024", "data.init_args.val_fraction=0.02"),
                      log=lambda *a: None)
    acc0, loss0 = t.evaluate(t.val_data)
    assert loss0 == pytest.approx(math.log(65), abs=0.3)  # an untrained model: about uniform over 65 characters
    t.fit()
    first, last = t.history.epochs[0], t.history.epochs[-1]
    assert last["train_loss"] < first["train_loss"] and last["val_loss"] < loss0 - 0.8
    assert last["val_acc"] > acc0 + 10 and last["val_acc"] > 20  # chance is 1.5 %; the commonest character ~15 %
    assert last["val_ppl"] == pytest.approx(math.exp(last["val_loss"]))
    assert last["efficiency"] > 0 and last["examples"] == 1013  # every training window once an epoch
    if mode == "triaccel":
        assert t.loop.trajectory and len(t.precision.names) >= 9  # the controllers saw the GPT's layers
        assert {"h.0.attn.c_attn", "h.1.mlp.c_proj"} <= set(t.precision.names)


def test_bf16_master_weights_keep_the_tied_embedding_one_bf16_matrix_and_train_as_fp32_masters_do():
    """The GPT space's bf16-master start point: the token embedding and the output head share one weight
    (tied), stored once in bf16 while its layer runs in 16 bits; the run learns as the fp32-master run does."""
    from triaccel.control import build_trainer

    accs = {}
    for mw in ("fp32", "bf16"):
        t = build_trainer(tiny_cfg("mode=triaccel", "data.init_args.stride=1024", "data.init_args.val_fraction=0.02",
                                   "triaccel.precision.half=bf16", "triaccel.precision.tau_low=1000",
                                   "triaccel.precision.tau_high=10000", "triaccel.precision.optimizer_state=bf16",
                                   f"triaccel.precision.master_weights={mw}"), log=lambda *a: None)
        t.fit()
        m = t.model
        assert m.lm_head.weight is m.wte.weight
        assert m.wte.weight.dtype == (torch.bfloat16 if mw == "bf16" else torch.float32)
        assert m.h[0].attn.c_attn.weight.dtype == m.wte.weight.dtype
        assert m.ln_f.weight.dtype == torch.float32  # norms keep fp32 masters
        accs[mw] = t.history.epochs[-1]["val_acc"]
    assert accs["bf16"] > 20 and abs(accs["bf16"] - accs["fp32"]) < 3.0, accs


def test_evaluate_scores_every_validation_position_once():
    """The trainer's val_acc is next-token accuracy: the share of all validation target positions whose
    arg-max is the target, recomputed here from the model's logits (eval batches of 500 over 1,742
    windows: a short last batch)."""
    from triaccel.control import build_trainer

    t = build_trainer(tiny_cfg("mode=fp32", "eval_batch_size=500"), log=lambda *a: None)
    for _ in range(20):  # a few steps, so that the arg-maxes are not all one character
        t.train_step(t.sampler.take(32))
    acc, loss = t.evaluate(t.val_data)
    x, y = char_corpus(block_size=32, stride=512)["val"].tensors
    t.model.eval()
    with torch.no_grad():
        out = t.model(x)
    assert acc == pytest.approx(100.0 * int((out.argmax(-1) == y).sum()) / y.numel(), abs=1e-9)
    assert loss == pytest.approx(float(F.cross_entropy(out.reshape(-1, 65), y.reshape(-1))), rel=1e-5)


# ------------------------------------------------------------------ search, export, train
def cli(*args, cwd):
    env = child_env("MLFLOW_TRACKING_URI", "TRIACCEL_TUNE_DIR", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "triaccel.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=1500, env=env)


@pytest.mark.slow
def test_a_search_of_the_tiny_space_ends_with_a_summary_and_an_export_that_trains(tmp_path):
    from mlflow.tracking import MlflowClient

    space = yaml.safe_load((ROOT / "spaces" / "shakespeare_gpt_tiny.yaml").read_text())
    space["train"]["data"]["init_args"].update(stride=2048, val_fraction=0.02)  # 490 windows an epoch
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space, sort_keys=False))
    r = cli("search", "--space", "space.yaml", "--trials", "2", "--confirm", "0", "--name", "lm", cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "search 'lm':" in r.stdout and "baseline amp-bf16-B32" in r.stdout
    assert len([ln for ln in r.stdout.splitlines() if ln.startswith("trial ")]) == 2
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    c = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    exp = c.get_experiment_by_name("triaccel-search")
    runs = c.search_runs([exp.experiment_id], filter_string="tags.`triaccel.role` = 'trial'")
    assert runs and all("val_ppl" in run.data.metrics for run in runs if run.info.status == "FINISHED")

    r = cli("export", "lm", "--out", "tuned.yaml", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    tuned = yaml.safe_load((tmp_path / "tuned.yaml").read_text())
    assert tuned["model"]["class_path"] == "triaccel.zoo.gpt.GPT"
    assert tuned["data"]["class_path"] == "triaccel.zoo.text.char_corpus"
    # only keys the run reads: no built-in dataset's name (digits) or model's (small_cnn) beside the class_paths
    assert not {"name", "data_dir", "augment", "kernel"} & set(tuned["data"]), tuned["data"]
    assert not {"name", "width", "kwargs"} & set(tuned["model"]), tuned["model"]
    assert tuned["data"]["val_fraction"] == space["train"]["data"].get("val_fraction", 0.1)
    r = cli("train", "--config", "tuned.yaml", "--set", "epochs=1", "--set", "tracking.enabled=false", cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "epoch   1/1" in r.stdout + r.stderr
