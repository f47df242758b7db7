"""The user's own model and data: class_path references, zoo models by name, the Python API, and the
per-layer machinery on any nn.Module (tied and frozen parameters)."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import yaml
from torch.utils.data import TensorDataset

from _harness import child_env

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent / "triaccel"  # the console script: the current folder is not on its path

# A user package written into a temporary folder. The test process never imports it: the CLI finds it
# in the folder it starts in, a search's Ray workers through runtime_env.
PKG = {
    "__init__.py": "",
    "models.py": '''
import torch.nn as nn


def mlp(num_classes, in_channels, image_size, width=16):
    return nn.Sequential(nn.Flatten(), nn.Linear(in_channels * image_size * image_size, width), nn.ReLU(),
                         nn.Linear(width, num_classes))


def not_a_model(num_classes):
    return "a string"


class _Pair(nn.Module):  # a Hugging Face-style forward: (logits, extra)
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x), None


def returns_a_tuple(num_classes, in_channels, image_size):
    return _Pair(mlp(num_classes, in_channels, image_size))


class _Detached(nn.Module):  # trains nothing: its output is cut from the graph
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x).detach()


def detached(num_classes, in_channels, image_size):
    return _Detached(mlp(num_classes, in_channels, image_size))


class _FailsLater(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner, self.calls = inner, 0

    def forward(self, x):
        self.calls += 1
        if self.calls > 8:
            raise RuntimeError(f"boom at call {self.calls}")
        return self.inner(x)


def fails_later(num_classes, in_channels, image_size, width=16):
    return _FailsLater(mlp(num_classes, in_channels, image_size, width))
''',
    "data.py": '''
import torch
from torch.utils.data import Dataset, TensorDataset

from triaccel.data import digits_arrays


class Pairs(Dataset):  # a map-style Dataset other than a TensorDataset: stacked into tensors once
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], int(self.y[i])


def digits(n=600, tensors=True):
    x, y = digits_arrays()
    x = torch.tensor(x[:n], dtype=torch.float32).unsqueeze(1) / 16
    y = torch.tensor(y[:n])
    cut = n * 4 // 5
    mk = TensorDataset if tensors else Pairs
    return {"train": mk(x[:cut], y[:cut]), "test": mk(x[cut:], y[cut:])}


def features(n=400):  # feature vectors [N, 64], not images: the data gives no in_channels or image_size
    x, y = digits_arrays()
    return {"train": TensorDataset(torch.tensor(x[:n], dtype=torch.float32) / 16, torch.tensor(y[:n]))}


def saved(path):  # a file the user keeps beside the space, named by a relative path
    x, y = torch.load(path)
    cut = len(y) * 4 // 5
    return {"train": TensorDataset(x[:cut], y[:cut]), "test": TensorDataset(x[cut:], y[cut:])}


def broken(n=1):
    raise RuntimeError("no such table")


class _Overstated(Pairs):  # says it holds more examples than it does
    def __len__(self):
        return len(self.y) + 5


def overstated(n=100):
    x, y = digits_arrays()
    return {"train": _Overstated(torch.tensor(x[:n], dtype=torch.float32).unsqueeze(1) / 16, torch.tensor(y[:n]))}
''',
}

CONFIG = {"epochs": 1, "batch_size": 64, "device": "cpu", "mode": "fp32", "eval_batch_size": 512,
          "model": {"class_path": "ucpkg.models.mlp", "init_args": {"width": 16}},
          "data": {"class_path": "ucpkg.data.digits", "init_args": {"n": 400}},
          "optim": {"lr": 0.05, "warmup_epochs": 0.5}}


def project(tmp_path: Path) -> Path:
    d = tmp_path / "proj"
    (d / "ucpkg").mkdir(parents=True)
    for name, text in PKG.items():
        (d / "ucpkg" / name).write_text(text)
    return d


def cli(*args, cwd, timeout=600):
    env = child_env("MLFLOW_TRACKING_URI", "TRIACCEL_TUNE_DIR", "PYTHONPATH")
    return subprocess.run([str(BIN), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def test_the_users_code_failing_mid_run_is_one_line_naming_its_line(tmp_path):
    """A dataset whose __getitem__ raises (a length that overstates it) and a model whose forward raises
    after some steps ended `triaccel train` in a 25-line traceback through the trainer: now one line naming
    the section, where it happened and the user's line, exit 2; the MLflow run is closed FAILED."""
    d = project(tmp_path)
    (d / "c.yaml").write_text(yaml.safe_dump({**CONFIG, "tracking": {"tracking_uri": f"sqlite:///{d}/m.db"}}))
    r = cli("train", "--config", "c.yaml", "--set", "data.class_path=ucpkg.data.overstated",
            "--set", "data.init_args={n: 100}", cwd=d)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.stderr.strip().splitlines() == [
        f"triaccel: error: data.class_path ucpkg.data.overstated: its train split: example 100 of 105 raised "
        f"IndexError: index 100 is out of bounds for dimension 0 with size 100 (at {d / 'ucpkg' / 'data.py'}:"
        f"{(d / 'ucpkg' / 'data.py').read_text().splitlines().index('        return self.x[i], int(self.y[i])') + 1} "
        f"in __getitem__)"], r.stderr
    r = cli("train", "--config", "c.yaml", "--set", "model.class_path=ucpkg.models.fails_later", "--set", "epochs=3",
            cwd=d)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    line = r.stderr.strip().splitlines()[-1]
    models = (d / "ucpkg" / "models.py").read_text().splitlines()
    at = next(i for i, ln in enumerate(models, 1) if 'raise RuntimeError(f"boom at call' in ln)
    assert line.startswith("triaccel: error: model.class_path ucpkg.models.fails_later: raised RuntimeError: "
                           "boom at call 9 in epoch 2, step 6 ") and \
        line.endswith(f"(at {d / 'ucpkg' / 'models.py'}:{at} in forward; TRIACCEL_TRACEBACK=1 shows the traceback)"), line
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=f"sqlite:///{d}/m.db")
    (run,) = c.search_runs([c.get_experiment_by_name("triaccel-train").experiment_id],
                           filter_string="params.`model.class_path` = 'ucpkg.models.fails_later'")
    assert run.info.status == "FAILED", run.info.status


def test_an_error_is_the_users_only_where_the_nearest_frame_to_it_outside_the_libraries_is():
    """The user's line is named where torch refused what the user's code asked (a matmul of the wrong shapes:
    torch's frames are passed over); an error raised in this package's code, called from the user's (the
    precision wrapper around a user's layer, say), is not the user's and keeps its traceback."""
    from triaccel.userref import _import, user_frame

    def users_forward():
        return torch.zeros(2, 3) @ torch.zeros(2, 3)

    def users_call_into_ours():
        return _import("nopkg_xyz_abc.models.build", "model.class_path")

    for fn, theirs in ((users_forward, True), (users_call_into_ours, False)):
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            at = user_frame(e)
        assert (at is not None and at.startswith(f"{__file__}:") and at.endswith(f" in {fn.__name__}")) if theirs \
            else at is None, (fn.__name__, at)


# --------------------------------------------------------------------------- bad references
BAD = {
    "missing module": ({"model": {"class_path": "nopkg_xyz.models.mlp"}}, "model.class_path: no module named 'nopkg_xyz'"),
    "missing attribute": ({"model": {"class_path": "ucpkg.models.nothing"}},
                          "model.class_path: module ucpkg.models has no attribute 'nothing'"),
    "factory raises": ({"data": {"class_path": "ucpkg.data.broken"}},
                       "data.class_path: ucpkg.data.broken(...) raised RuntimeError: no such table"),
    "model not a Module": ({"model": {"class_path": "ucpkg.models.not_a_model", "init_args": {}}},
                           "model.class_path: ucpkg.models.not_a_model(...) returned str, not a torch.nn.Module"),
    "data of the wrong kind": ({"data": {"class_path": "ucpkg.models.mlp", "init_args": {}}},
                               "data.class_path: ucpkg.models.mlp(...) raised TypeError"),
    "unknown zoo model": ({"model": {"name": "torchvision/resnet_nine", "class_path": None, "init_args": {}}},
                          "torchvision.models.list_models"),
    # an image model's factory over feature vectors: was the call's TypeError ("missing 2 required positional
    # arguments"), which did not say that the data gives these only for images
    "image sizes of features": ({"data": {"class_path": "ucpkg.data.features", "init_args": {}}},
                                "model.class_path: ucpkg.models.mlp takes in_channels, image_size, which neither "
                                "model.init_args nor the data gives (the data gives num_classes; in_channels and "
                                "image_size only for images [C, H, W])"),
    # a model that builds but cannot train on the data: the search takes no name for it
    "forward returns a tuple": ({"model": {"class_path": "ucpkg.models.returns_a_tuple", "init_args": {}}},
                                "model.class_path: ucpkg.models.returns_a_tuple's forward returned a tuple, not a tensor"),
    "output with no gradient": ({"model": {"class_path": "ucpkg.models.detached", "init_args": {}}},
                                "model.class_path: ucpkg.models.detached's output reaches no parameter that requires a "
                                "gradient"),
}


@pytest.mark.parametrize("kind", list(BAD))
def test_bad_reference_is_one_line_before_anything_is_written(tmp_path, kind):
    d = project(tmp_path)
    over, said = BAD[kind]
    train = {**CONFIG, **{k: {**CONFIG[k], **v} for k, v in over.items()}}
    space = {"name": "bad", "trials": 2, "train": train,
             "params": {"optim.lr": {"distribution": "loguniform", "low": 0.01, "high": 0.1}}}
    (d / "space.yaml").write_text(yaml.safe_dump(space))
    r = cli("search", "--space", "space.yaml", cwd=d)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("triaccel: error: ") and said in lines[0], r.stderr[-2000:]
    assert not (d / "mlruns").exists()  # no MLflow store, no Tune folder


# --------------------------------------------------------------------------- user data, in process
def tiny_data(n=300, tensors=False):
    from triaccel.data import digits_arrays

    x, y = digits_arrays()
    x = torch.tensor(x[:n], dtype=torch.float32).unsqueeze(1) / 16
    y = torch.tensor(y[:n])
    if tensors:
        return {"train": TensorDataset(x, y)}

    class Pairs(torch.utils.data.Dataset):
        def __len__(self):
            return n

        def __getitem__(self, i):
            return x[i].numpy(), int(y[i])

    return {"train": Pairs()}


def test_references_are_checked_and_shipped_without_torch_until_user_code_is_built(tmp_path):
    """A search's driver imports torch only to build the user's data or model (triaccel.userref)."""
    code = ("import sys; from triaccel.userref import check_references, runtime_env_for, search_references; "
            "train = {'model': {'name': 'small_cnn'}, 'data': {'name': 'digits'}}; check_references(train); "
            "runtime_env_for(search_references(train)); print('torch' in sys.modules); "
            "check_references({'model': {'class_path': 'umodel:linear'}, 'data': {'name': 'digits'}}); "
            "print('torch' in sys.modules)")
    (tmp_path / "umodel.py").write_text("import torch.nn as nn\n\n\ndef linear(num_classes, in_channels, image_size):\n"
                                        "    return nn.Sequential(nn.Flatten(), nn.Linear(in_channels * image_size ** 2, "
                                        "num_classes))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env=child_env())
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["False", "True"]


def test_any_dataset_is_stacked_and_val_carved_stratified():
    from triaccel.config import DataConfig
    from triaccel.userdef import load_user_splits
    from triaccel.userref import reference_of

    dc = DataConfig(class_path=reference_of(tiny_data, "data"), val_fraction=0.2, split_seed=3)
    sp = load_user_splits(dc)
    (xt, yt), (xv, yv) = sp.train, sp.val
    assert xt.dtype == torch.float32 and tuple(xt.shape[1:]) == (1, 8, 8) and yt.dtype == torch.int64
    assert len(yt) + len(yv) == 300 and sp.test is None
    assert sp.num_classes == 10 and sp.in_channels == 1 and sp.image_size == 8
    # stratified: every class is held out in proportion
    for c in range(10):
        n_c = int((yt == c).sum() + (yv == c).sum())
        assert int((yv == c).sum()) == round(0.2 * n_c)
    # the same split_seed carves the same split; another seed another
    again = load_user_splits(dc)
    assert torch.equal(again.val[1], yv) and torch.equal(again.val[0], xv)
    dc.split_seed = 4
    assert not torch.equal(load_user_splits(dc).val[0], xv)


class TiedFrozen(nn.Module):
    """Token ids -> an embedding tied to the output head, a custom module with its own parameter,
    a LayerNorm, and a frozen projection."""

    def __init__(self, vocab_size, num_classes, dim=16):
        super().__init__()
        assert vocab_size == num_classes
        self.emb = nn.Embedding(vocab_size, dim)
        self.scale = Scale(dim)
        self.norm = nn.LayerNorm(dim)
        self.frozen = nn.Linear(dim, dim)
        self.frozen.requires_grad_(False)
        self.head = nn.Linear(dim, vocab_size, bias=False)
        self.head.weight = self.emb.weight  # tied

    def forward(self, x):
        h = self.emb(x).mean(1)
        return self.head(self.frozen(self.norm(self.scale(h))))


class Scale(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.g = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * self.g


def token_data(n=256, T=6, vocab=12):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, vocab, (n, T), generator=g)
    y = x[:, 0]  # the first token: learnable through the mean of the embeddings
    return {"train": TensorDataset(x, y), "meta": {"vocab_size": vocab, "num_classes": vocab}}


def test_tied_and_frozen_parameters_under_the_controllers():
    from triaccel.api import load
    from triaccel.control import build_trainer
    from triaccel.trainer import Decisions

    cfg = load({"mode": "triaccel", "epochs": 2, "batch_size": 32, "device": "cpu", "eval_batch_size": 256,
                "optim": {"lr": 0.1, "warmup_epochs": 0}, "tracking": {"enabled": False},
                "triaccel": {"control_every": 4, "batch": {"enabled": False}}},
               model=TiedFrozen, data=token_data)
    t = build_trainer(cfg, [], log=lambda *a: None)
    m = t.model
    ids = [id(p) for g in t.optimizer.param_groups for p in g["params"]]
    assert len(ids) == len(set(ids))  # no parameter twice in the optimizer
    trainable = {id(p) for p in m.parameters() if p.requires_grad}
    assert set(ids) == trainable  # every trainable parameter once; the frozen ones in none
    assert id(m.frozen.weight) not in ids and id(m.frozen.bias) not in ids
    names = t.group_names
    assert names[:2] == ["emb", "scale"] and "head" not in names and "norm" not in names
    assert t.precision.names == names[:2]
    assert names[-1] == "_other"  # the LayerNorm's parameters
    frozen_before = m.frozen.weight.detach().clone()
    # the layers at different levels: the tied head runs in its owner's precision, the LayerNorm as it comes
    t.apply(Decisions(levels={"emb": "fp32", "scale": "bf16"}))
    s = t.fit()
    assert torch.isfinite(torch.tensor(s["val_acc"]))
    assert torch.equal(m.frozen.weight, frozen_before)
    assert m.head.weight is m.emb.weight



class Outputs(nn.Module):
    """A user's model whose forward returns what nanoGPT or Hugging Face models do, fails, or owns nothing."""

    def __init__(self, num_classes, in_channels, image_size, out="tensor"):
        super().__init__()
        self.out = out
        self.fc = nn.Linear(in_channels * image_size ** 2, num_classes) if out != "no-params" else nn.Identity()

    def forward(self, x):
        if self.out == "fails":
            return self.fc(x)  # [B, 1, 8, 8] into a Linear of 64: mat1 and mat2 shapes cannot be multiplied
        y = self.fc(x.flatten(1))
        return {"tuple": (y, None), "dict": {"logits": y}, "flat": y.flatten()}.get(self.out, y)


@pytest.mark.parametrize("out,said", [
    ("tuple", "forward returned a tuple, not a tensor of logits [batch, classes]: return the logits"),
    ("dict", "forward returned a dict, not a tensor of logits [batch, classes]"),
    ("flat", "forward returned logits of shape (20,) for targets of shape (2,) and 10 classes; it must return "
             "[batch, classes]"),
    ("fails", "forward failed on a batch of the data (inputs (2, 1, 8, 8) float32): RuntimeError: mat1 and mat2 "
              "shapes cannot be multiplied"),
    ("no-params", "has no parameter to train"),
])
def test_a_model_that_cannot_train_on_the_data_is_one_line_before_its_first_step(out, said):
    """These failed at the first training step, as tracebacks from the trainer's loss or the optimizer."""
    from triaccel.api import load
    from triaccel.control import build_trainer
    from triaccel.errors import ConfigError

    cfg = load({"mode": "amp", "epochs": 1, "batch_size": 32, "device": "cpu", "tracking": {"enabled": False},
                "model": {"init_args": {"out": out}}}, model=Outputs, data=tiny_data)
    with pytest.raises(ConfigError) as e:
        build_trainer(cfg, [], log=lambda *a: None)
    assert str(e.value).startswith("model.class_path: ") and said in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


class TrainingOnly(nn.Module):
    """A linear model whose training forward differs from its eval forward, which the check before the first
    step runs: ``out`` picks how."""

    def __init__(self, num_classes, in_channels, image_size, out="tuple"):
        super().__init__()
        self.fc, self.out = nn.Linear(in_channels * image_size ** 2, num_classes), out
        self.unused = nn.Parameter(torch.zeros(3))  # something to train, for the check before the first step
        if out == "frozen":
            self.fc.requires_grad_(False)

    def forward(self, x):
        y = self.fc(x.flatten(1))
        if not self.training:
            return y
        return {"tuple": (y, y), "detached": y.detach(), "frozen": y}[self.out]


@pytest.mark.parametrize("model,out,said", [
    (TrainingOnly, "tuple", "'s forward returned a tuple in training mode, not a tensor of logits: return the logits"),
    (TrainingOnly, "detached", "'s output reaches no parameter that requires a gradient (a detach() in the forward"),
    (TrainingOnly, "frozen", "'s output reaches no parameter that requires a gradient"),
    ("torchvision/googlenet", None, "model.name: torchvision/googlenet's forward returned a GoogLeNetOutputs in "
                                    "training mode"),  # its auxiliary logits
])
def test_a_model_that_cannot_train_only_in_training_mode_is_one_line_at_its_first_step(model, out, said):
    """These ended `triaccel train` at the first step in a traceback from the loss or from torch's backward."""
    from triaccel.api import train
    from triaccel.errors import ConfigError

    cfg = {"mode": "fp32", "epochs": 1, "batch_size": 32, "device": "cpu", "tracking": {"enabled": False}}
    if isinstance(model, str):
        x = torch.rand(64, 3, 32, 32, generator=torch.Generator().manual_seed(0))
        cfg["model"] = {"name": model}
        kw = {"data": lambda: {"train": TensorDataset(x, torch.arange(64) % 4)}}
    else:
        cfg["model"] = {"init_args": {"out": out}}
        kw = {"model": model, "data": tiny_data}
    with pytest.raises(ConfigError) as e:
        train(cfg, **kw)
    assert said in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert str(e.value).startswith("model.class_path: " if out else "model.name: "), str(e.value)


def exits(**kw):
    sys.exit(0)


def raises_base(**kw):
    raise BaseException("weird")


@pytest.mark.parametrize("factory,said", [(exits, "raised SystemExit: 0: a factory returns its object, not exit"),
                                          (raises_base, "raised BaseException: weird")])
def test_a_factory_that_exits_or_raises_a_base_exception_is_one_line(factory, said):
    """A model factory's sys.exit(0) ended `triaccel train` with exit 0 and no output, as if it had trained; a
    BaseException was a traceback."""
    from triaccel.api import train
    from triaccel.errors import ConfigError

    cfg = {"mode": "fp32", "epochs": 1, "batch_size": 32, "device": "cpu", "tracking": {"enabled": False}}
    with pytest.raises(ConfigError) as e:
        train(cfg, model=factory, data=tiny_data)
    assert str(e.value).startswith("model.class_path: ") and said in str(e.value), str(e.value)


@pytest.mark.parametrize("n", [5, 10])
def test_a_user_dataset_too_small_to_carve_a_validation_split_is_one_line(n):
    from triaccel.config import DataConfig
    from triaccel.errors import DataError
    from triaccel.userdef import load_user_splits
    from triaccel.userref import reference_of

    dc = DataConfig(class_path=reference_of(tiny_data, "data"), init_args={"n": n}, val_fraction=0.1)
    with pytest.raises(DataError, match=rf"its train split has {n} examples: holding out data.val_fraction 0.1 of "
                                        rf"them leaves 0 to validate on"):
        load_user_splits(dc)


def test_checkpointing_finds_blocks_or_steps_aside():
    from triaccel.models import enable_checkpointing, find_blocks

    seq = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    assert find_blocks(seq) == [seq[0], seq[2]]  # top-level children with parameters

    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = nn.Linear(4, 8)
            self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(4))

        def forward(self, x):
            x = self.inp(x)
            for layer in self.layers:
                x = torch.relu(layer(x))
            return x

    st = Stack()
    assert find_blocks(st) == list(st.layers)  # the repeated blocks holding most parameters
    x = torch.randn(3, 4)
    want = st(x)
    said = []
    assert enable_checkpointing(st, log=said.append) == 4
    got = st(x)
    got.sum().backward()
    assert torch.allclose(got, want) and st.inp.weight.grad is not None

    class Bare(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(3))

        def forward(self, x):
            return x * self.w

    assert enable_checkpointing(Bare(), log=said.append) == 0
    assert len(said) == 1 and "activation checkpointing is off" in said[0]


# --------------------------------------------------------------------------- zoo models by name
def test_torchvision_model_by_name_follows_the_data():
    from triaccel.api import train

    r = train({"epochs": 1, "batch_size": 100, "device": "cpu", "mode": "fp32", "evaluate_test": False,
               "model": {"name": "torchvision/mobilenet_v3_small", "kwargs": {"width_mult": 0.25}},
               "tracking": {"enabled": False}}, data=lambda: tiny_data(200, tensors=True))
    assert r.summary["epochs"] == 1 and r.config["model"]["name"] == "torchvision/mobilenet_v3_small"

    from triaccel.config import ModelConfig
    from triaccel.hub import build_zoo_model

    m = build_zoo_model(ModelConfig(name="torchvision/mobilenet_v3_small", kwargs={"width_mult": 0.25}), 7, 1)
    first = next(x for x in m.modules() if isinstance(x, nn.Conv2d))
    assert first.in_channels == 1  # one-channel data: the first conv rebuilt
    assert m(torch.randn(2, 1, 8, 8)).shape == (2, 7)  # the head follows num_classes


def test_a_hub_model_the_datas_images_are_too_small_for_is_one_line_before_it_trains():
    """torchvision's googlenet on 8x8 digits: its pooling's "Output size is too small" was a traceback from the
    first step; now the check a user's model gets, naming model.name."""
    from triaccel.api import train
    from triaccel.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        train({"epochs": 1, "batch_size": 32, "device": "cpu", "mode": "fp32", "tracking": {"enabled": False},
               "model": {"name": "torchvision/googlenet"}}, data=lambda: tiny_data(100, tensors=True))
    assert str(e.value).startswith("model.name: torchvision/googlenet's forward failed on a batch of the data "
                                   "(inputs (2, 1, 8, 8) float32): RuntimeError: ") and "\n" not in str(e.value), \
        str(e.value)


def test_timm_model_by_name():
    timm = pytest.importorskip("timm")
    from triaccel.config import ModelConfig
    from triaccel.errors import ConfigError
    from triaccel.hub import build_zoo_model

    name = "test_resnet" if timm.is_model("test_resnet") else "resnet10t"
    m = build_zoo_model(ModelConfig(name=f"timm/{name}"), 5, 1)
    assert m(torch.randn(2, 1, 16, 16)).shape == (2, 5)
    with pytest.raises(ConfigError, match=r"timm\.list_models\(\)"):
        build_zoo_model(ModelConfig(name="timm/not_a_model_xyz"), 5, 1)


# --------------------------------------------------------------------------- end to end on Ray
@pytest.mark.slow
def test_user_package_search_export_train(tmp_path):
    """The workers import the package only through the search's runtime_env; the export keeps the references.
    The data is a file named by a path relative to the folder the search runs in: the trials read it there too
    (Tune starts each in a folder of its own, where every trial failed on it after the baselines had trained)."""
    d = project(tmp_path)
    import torch

    from triaccel.data import digits_arrays

    x, y = digits_arrays()
    torch.save((torch.tensor(x[:400], dtype=torch.float32).unsqueeze(1) / 16, torch.tensor(y[:400])),
               d / "digits400.pt")
    train = {**CONFIG, "epochs": 2, "mode": "triaccel",
             "data": {"class_path": "ucpkg.data.saved", "init_args": {"path": "digits400.pt"}},
             "triaccel": {"control_every": 4, "batch": {"enabled": False}}}
    space = {"name": "uc", "trials": 2, "concurrency": 2, "scheduler": "none", "sampler": "random", "seed": 1,
             "baseline": {"batch_sizes": [64], "accuracy_margin": 100.0}, "train": train,
             "params": {"optim.lr": {"distribution": "loguniform", "low": 0.01, "high": 0.1}}}
    (d / "space.yaml").write_text(yaml.safe_dump(space))
    r = cli("search", "--space", "space.yaml", "--confirm", "0", cwd=d)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "2 finished" in r.stdout and "0 failed" in r.stdout, r.stdout[-2000:]  # the workers imported ucpkg
    state = yaml.safe_load((d / "mlruns" / "tune" / "uc" / "triaccel_search.json").read_text())
    assert state["runtime_env"]["py_modules"] == [str(d / "ucpkg")]
    r = cli("export", "uc", "--out", "tuned.yaml", cwd=d)
    assert r.returncode == 0, r.stderr[-2000:]
    tuned = yaml.safe_load((d / "tuned.yaml").read_text())
    assert tuned["model"]["class_path"] == "ucpkg.models.mlp" and tuned["data"]["class_path"] == "ucpkg.data.saved"
    assert tuned["data"]["init_args"] == {"path": "digits400.pt"}
    r = cli("train", "--config", "tuned.yaml", "--set", "epochs=1", cwd=d)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "ucpkg.models.mlp on ucpkg.data.saved" in r.stdout and "test acc" in r.stdout
    # the package changed since: extend says so in one line before Ray starts, as resume does (it ran a trial
    # certain to fail, which stayed in the search's table, and exited 0)
    with open(d / "ucpkg" / "models.py", "a") as f:
        f.write("\n\ndef mlp(**kw):\n    raise RuntimeError('refactored away')\n")
    r = cli("extend", "uc", "--trials", "1", cwd=d)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "triaccel: error: model.class_path: ucpkg.models.mlp(...) raised RuntimeError: refactored away"], \
        (r.stdout[-2000:], r.stderr[-2000:])
    assert not (d / "mlruns" / "tune" / "uc" / "extend-1").exists() and "trial" not in r.stdout


@pytest.mark.slow
def test_readme_notebook_example_runs_as_written(tmp_path):
    """docs/examples/notebook.py is the README's example: run as it is, in an empty folder. Its functions
    live in __main__ (no import path): the search ships them to the workers by value."""
    r = subprocess.run([sys.executable, str(ROOT / "docs" / "examples" / "notebook.py")], cwd=tmp_path,
                       capture_output=True, text=True, timeout=900,
                       env=child_env("MLFLOW_TRACKING_URI", "TRIACCEL_TUNE_DIR"))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    trained = next(ln for ln in r.stdout.splitlines() if ln.startswith("trained:"))
    assert float(trained.split()[1]) > 0
    searched = next(ln for ln in r.stdout.splitlines() if ln.startswith("searched:"))
    assert "'best':" in searched and "0 failed, 4 trials in MLflow" in r.stdout
    state = yaml.safe_load((tmp_path / "mlruns" / "tune" / "notebook-digits" / "triaccel_search.json").read_text())
    assert state["callables"] == {"model.class_path": "callable:make_model", "data.class_path": "callable:make_data"}
    # its export is trained from Python, handing the functions again: the CLI command would be refused
    r = cli("export", "notebook-digits", "--out", "nb.yaml", cwd=tmp_path)
    how = "triaccel.train('nb.yaml', model=make_model, data=make_data) from Python, handing the search's functions again"
    assert r.returncode == 0 and f"train with `{how}`" in r.stdout and "triaccel train --config" not in r.stdout, \
        r.stdout + r.stderr
    assert f"# Train with: {how}\n" in (tmp_path / "nb.yaml").read_text()
    # the search has finished: a resume runs nothing, so it needs nothing handed again
    r = cli("resume", "notebook-digits", cwd=tmp_path)
    assert r.returncode == 0 and "the search has finished; nothing was left to run" in r.stdout, r.stderr
    # its confirm step again would train, and another process does not know those functions: one line
    # says they must be handed again
    r = cli("resume", "notebook-digits", "--confirm", "1", cwd=tmp_path)
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1
    assert "hand them again: triaccel.resume(NAME, model=make_model, data=make_data)" in r.stderr, r.stderr  # both
    r = cli("extend", "notebook-digits", "--trials", "1", cwd=tmp_path)  # so does extend, naming its own form
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "triaccel.extend" in r.stderr, r.stderr
    assert not (tmp_path / "mlruns" / "tune" / "notebook-digits" / "extend-1").exists()
    # and from Python, handed the functions again, another process extends it: the notebook's functions, as
    # a new session defines them again (exec'd from its source; the search itself is not run again)
    again = ("import ast, sys, triaccel\n"
             "src = open(sys.argv[1]).read()\n"
             "tree = ast.parse(src)\n"
             "tree.body = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom, ast.FunctionDef))]\n"
             "exec(compile(tree, sys.argv[1], 'exec'))\n"
             "r = triaccel.extend('notebook-digits', 1, model=make_model, data=make_data)\n"
             "print('extended:', r.counts)\n")
    r = subprocess.run([sys.executable, "-c", again, str(ROOT / "docs" / "examples" / "notebook.py")], cwd=tmp_path,
                       capture_output=True, text=True, timeout=900,
                       env=child_env("MLFLOW_TRACKING_URI", "TRIACCEL_TUNE_DIR"))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "trial   1/1 " in r.stdout and "0 failed, 5 trials in MLflow" in r.stdout, r.stdout[-2000:]
    assert "extended: {" in r.stdout and "'failed': 0" in r.stdout, r.stdout[-2000:]


def test_api_import_is_cheap_and_search_stays_callable():
    code = ("import sys, triaccel; assert not {'torch', 'ray', 'mlflow'} & set(sys.modules), sys.modules.keys(); "
            "assert callable(triaccel.train) and triaccel.DataSplits(train=1).val is None; "
            "import triaccel.search.runner; assert callable(triaccel.search) and triaccel.search.runner")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]


class NextToken(nn.Module):
    def __init__(self, vocab_size, num_classes):
        super().__init__()
        self.emb, self.head = nn.Embedding(vocab_size, 8), nn.Linear(8, num_classes)

    def forward(self, x):
        return self.head(self.emb(x))  # [B, T, V]


def sequence_data(n=64, T=6, vocab=12):
    x = torch.randint(0, vocab, (n, T + 1), generator=torch.Generator().manual_seed(0))
    return {"train": TensorDataset(x[:, :-1], x[:, 1:]), "meta": {"vocab_size": vocab, "num_classes": vocab}}


@pytest.mark.parametrize("model,data,unit", [(TiedFrozen, token_data, "ex/s"), (NextToken, sequence_data, "seq/s"),
                                             (Outputs, tiny_data, "img/s")])
def test_the_epoch_line_counts_the_examples_the_data_holds(model, data, unit):
    """A language model's epoch line said 'img/s' for its windows."""
    from triaccel.api import load
    from triaccel.control import build_trainer

    cfg = load({"mode": "amp", "epochs": 1, "batch_size": 32, "device": "cpu", "tracking": {"enabled": False},
                "evaluate_test": False}, model=model, data=data)
    lines = []
    build_trainer(cfg, [], log=lines.append).fit()
    epoch = next(x for x in lines if x.startswith("epoch"))
    assert f" {unit} " in epoch and sum(u in epoch for u in ("img/s", "seq/s", "ex/s")) == 1, epoch


def windows(stride, T=32, n_tokens=2000, dtype=torch.int64):
    """nanoGPT-style windows over one token stream: example i is tokens [i*stride, i*stride + T), its targets
    the same shifted by one."""
    tok = torch.randint(0, 50, (n_tokens,), generator=torch.Generator().manual_seed(1)).to(dtype)
    starts = range(0, n_tokens - T - 1, stride)
    x = torch.stack([tok[i:i + T] for i in starts])
    y = torch.stack([tok[i + 1:i + T + 1] for i in starts])
    return {"train": TensorDataset(x, y), "meta": {"vocab_size": 50}}


@pytest.mark.parametrize("stride", [1, 8])
def test_validation_carved_from_sliding_windows_shares_no_position_with_training(stride):
    """Without a val split, the held-out windows were drawn at random from overlapping training windows:
    with stride 8 and block 32 every validation character was also trained on. Sliding windows are found
    (consecutive examples continue each other) and validated on the tail; the windows before it that share a
    position with it are left out. Independent sequences keep the seeded random split."""
    from triaccel.config import DataConfig
    from triaccel.userdef import carve_val, load_user_splits, window_stride
    from triaccel.userref import reference_of

    sp = load_user_splits(DataConfig(class_path=reference_of(windows, "data"), init_args={"stride": stride},
                                     val_fraction=0.1))
    (_, yt), (xv, yv) = sp.train, sp.val
    n = len(windows(stride)["train"])
    assert len(yv) == round(0.1 * n) and len(yt) == n - len(yv) - 32 // stride
    # positions in the token stream: window k starts at k*stride; train and val share none
    pos = lambda first, count: set(range(first * stride, (first + count - 1) * stride + 32 + 1))  # noqa: E731
    assert not pos(0, len(yt)) & pos(n - len(yv), len(yv))
    assert torch.equal(xv, windows(stride)["train"].tensors[0][-len(yv):])
    assert window_stride(windows(stride)["train"].tensors[0]) == stride
    # independent sequences (no window continues another) and windows that share no input position (stride
    # T: a window's last target is the next one's first input, never a target trained on): a seeded random
    # split, as before
    assert window_stride(windows(32)["train"].tensors[0]) is None
    seqs = sequence_data(n=200)["train"].tensors
    assert window_stride(seqs[0]) is None
    (_, _), (xv2, _) = carve_val(*seqs, 0.1, 0)
    assert not torch.equal(xv2, seqs[0][-len(xv2):])


def test_token_ids_kept_as_uint16_train_as_any_integer_ids():
    """nanoGPT keeps its tokens as uint16 (.bin files): a Dataset over them was a traceback from the targets'
    check (torch has no min for uint16). They are widened to int32, every value kept."""
    from triaccel.config import DataConfig
    from triaccel.userdef import load_user_splits
    from triaccel.userref import reference_of

    sp = load_user_splits(DataConfig(class_path=reference_of(windows, "data"),
                                     init_args={"stride": 32, "dtype": torch.uint16}))
    want = windows(32)["train"].tensors
    assert sp.train[0].dtype == torch.int32 and sp.train[1].dtype == torch.int64
    got = torch.cat([sp.train[0], sp.val[0]]).long()
    assert len(got) == len(want[0]) and bool((got[:, None, :] == want[0][None]).all(-1).any(1).all())


def uint8_images(n=40):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (n, 3, 8, 8), dtype=torch.uint8, generator=g)
    return {"train": TensorDataset(x, torch.arange(n) % 4)}


class ConvertsPixels(nn.Module):
    def __init__(self, num_classes, in_channels, image_size, convert=True):
        super().__init__()
        self.convert = convert
        self.fc = nn.Linear(in_channels * image_size ** 2, num_classes)

    def forward(self, x):
        return self.fc((x.float() / 255 if self.convert else x).flatten(1))


def test_uint8_images_are_images_to_the_model_and_a_model_that_cannot_take_them_is_told_why():
    """uint8 [N, C, H, W] inputs were taken as token ids: the model factory got no in_channels or image_size."""
    from triaccel.api import load
    from triaccel.control import build_trainer
    from triaccel.errors import ConfigError

    base = {"mode": "amp", "epochs": 1, "batch_size": 16, "device": "cpu", "tracking": {"enabled": False}}
    t = build_trainer(load(base, model=ConvertsPixels, data=uint8_images), [], log=lambda *a: None)
    assert t.splits.model_info() == {"num_classes": 4, "in_channels": 3, "image_size": 8}
    assert t.train_data.x.dtype == torch.uint8  # resident as given: a quarter of float32's bytes
    assert t.fit()["val_acc"] >= 0
    with pytest.raises(ConfigError, match=r"forward failed on a batch of the data \(inputs \(2, 3, 8, 8\) uint8\): "
                                          r".*the data's images are uint8, passed as they are: convert them"):
        build_trainer(load({**base, "model": {"init_args": {"convert": False}}}, model=ConvertsPixels,
                           data=uint8_images), [], log=lambda *a: None)
    # a shipped model takes float images: refused by name before it is built, not a dtype error at the first step
    with pytest.raises(ConfigError, match=r"^model\.name: small_cnn takes float images; the data's images are uint8"):
        build_trainer(load({**base, "model": {"name": "small_cnn"}}, data=uint8_images), [], log=lambda *a: None)


def test_a_vocabulary_smaller_than_the_token_ids_is_named(tmp_path):
    """--set model.init_args.vocab_size=20 over ids up to 49 was 'IndexError: index out of range in self'."""
    from triaccel.api import load
    from triaccel.control import build_trainer
    from triaccel.errors import ConfigError

    base = {"mode": "amp", "epochs": 1, "batch_size": 16, "device": "cpu", "tracking": {"enabled": False},
            "model": {"init_args": {"vocab_size": 20, "num_classes": 50}}, "data": {"init_args": {"stride": 8}}}
    with pytest.raises(ConfigError, match=r"IndexError: index out of range in self; its token ids go up to 4\d: the "
                                          r"model's embedding must have more rows \(its vocab_size"):
        build_trainer(load(base, model=NextToken, data=windows), [], log=lambda *a: None)


def test_a_stray_label_that_sizes_the_head_is_said(capsys):
    """One label of 50 among 0-9 made a 51-way head without a word."""
    from triaccel.config import DataConfig
    from triaccel.userdef import load_user_splits
    from triaccel.userref import reference_of

    def labelled(stray):
        def make():
            y = torch.arange(100) % 10
            y[7] = stray
            return {"train": TensorDataset(torch.randn(100, 4), y)}
        return make

    sp = load_user_splits(DataConfig(class_path=reference_of(labelled(50), "data")))
    assert sp.num_classes == 51
    err = capsys.readouterr().err
    assert "targets take 11 values in 0-50, so the model gets num_classes=51; give meta's num_classes" in err, err
    load_user_splits(DataConfig(class_path=reference_of(labelled(3), "data")))  # every class present: no note
    assert "note" not in capsys.readouterr().err


def test_two_lambdas_handed_at_once_stay_apart_and_a_later_call_replaces_its_own():
    """model=lambda, data=lambda: both were `callable:_lambda_`, and the data factory replaced the model's
    ("returned dict, not a torch.nn.Module")."""
    import triaccel
    from triaccel.userref import CALLABLES

    base = {"mode": "fp32", "epochs": 1, "batch_size": 32, "device": "cpu", "tracking": {"enabled": False}}
    for width in (8, 16):  # a notebook cell run twice: the second call's functions are the ones trained
        r = triaccel.train(base, model=lambda num_classes, in_channels, image_size: nn.Sequential(
            nn.Flatten(), nn.Linear(in_channels * image_size ** 2, width), nn.ReLU(), nn.Linear(width, num_classes)),
            data=lambda: tiny_data(tensors=True))
        assert r.summary["val_acc"] >= 0
        model_ref, data_ref = r.config["model"]["class_path"], r.config["data"]["class_path"]
        assert model_ref != data_ref and CALLABLES[model_ref] is not CALLABLES[data_ref]
    assert model_ref.endswith("._lambda_") and data_ref == "callable:data." + model_ref[len("callable:"):]


def test_a_bad_space_handed_to_the_python_api_is_named_as_the_user_handed_it(tmp_path, monkeypatch):
    """A dict, or a file with functions, is written to a temporary YAML for the search: its errors named that
    file (/tmp/triaccel-space-.../apibad.yaml), which the user never wrote."""
    import triaccel
    from triaccel.errors import ConfigError

    monkeypatch.chdir(tmp_path)
    space = {"name": "apibad", "trials": 2, "bogus": 1, "train": {"device": "cpu"},
             "params": {"optim.lr": {"distribution": "loguniform", "low": 0.01, "high": 0.1}}}
    with pytest.raises(ConfigError) as e:
        triaccel.search(space)
    assert str(e.value).startswith("space 'apibad' (a dict handed to triaccel.search): bogus: unknown key"), e.value
    (tmp_path / "apibad.yaml").write_text(yaml.safe_dump(space))
    with pytest.raises(ConfigError) as e:
        triaccel.search("apibad.yaml", model=lambda num_classes: nn.Linear(4, num_classes))
    assert str(e.value).startswith("apibad.yaml (with the functions handed to triaccel.search): bogus: unknown key"), \
        e.value
    assert not (tmp_path / "mlruns").exists()


def test_a_built_model_handed_as_the_factory_is_one_line_naming_the_fix(tmp_path, monkeypatch):
    """model=nn.Linear(20, 4), a notebook's natural slip: it was called as its own factory and failed with
    "Linear.forward() missing 1 required positional argument"; also where resume and extend take it again."""
    import json

    import triaccel
    from triaccel.errors import ConfigError

    said = ("model: got a built Linear; hand the class or function that builds it (each run builds its own, sized "
            "to the data: model=Linear or model=make_model)")
    base = {"mode": "fp32", "epochs": 1, "batch_size": 32, "device": "cpu", "tracking": {"enabled": False}}
    with pytest.raises(ConfigError) as e:
        triaccel.train(base, model=nn.Linear(64, 10), data=lambda: tiny_data(tensors=True))
    assert str(e.value) == said
    # a container's class builds nothing from num_classes: the fix named is a function that returns it
    with pytest.raises(ConfigError) as e:
        triaccel.train(base, model=nn.Sequential(nn.Linear(64, 10)), data=lambda: tiny_data(tensors=True))
    assert str(e.value).endswith("(each run builds its own, sized to the data: model=make_model, a function that "
                                 "returns the Sequential)"), str(e.value)
    # a search started from a notebook, its model handed again to another process
    monkeypatch.setenv("TRIACCEL_TUNE_DIR", str(tmp_path / "tune"))
    (tmp_path / "tune" / "nb").mkdir(parents=True)
    (tmp_path / "tune" / "nb" / "triaccel_search.json").write_text(json.dumps(
        {"space": {"name": "nb", "trials": 2, "train": {"model": {"class_path": "callable:make_model"}}},
         "source": "nb", "sha256": "0" * 64, "tracking_uri": f"sqlite:///{tmp_path}/none.db"}))
    for again in (lambda: triaccel.resume("nb", model=nn.Linear(64, 10)),
                  lambda: triaccel.extend("nb", 2, model=nn.Linear(64, 10))):
        with pytest.raises(ConfigError) as e:
            again()
        assert str(e.value) == said
    assert not (tmp_path / "none.db").exists()


@pytest.mark.parametrize("targets,said", [
    (lambda y: y.unsqueeze(1), r"targets of shape \[N, 1\]: give class ids of shape \[N\] \(y\.squeeze\(1\)\)"),
    (lambda y: torch.nn.functional.one_hot(y, 10), r"targets look one-hot \(\[N, 10\], a single 1 per row\): give "
                                                    r"class ids \(y\.argmax\(1\)\)"),
    (lambda y: torch.where(torch.arange(60)[:, None] % 3 == 0, -100, y[:, None].expand(60, 8)),
     r"targets must be class ids >= 0, got -100; -100 is an ignore index .*cut those positions"),
])
def test_targets_of_one_column_or_one_hot_or_an_ignore_index_are_refused_naming_the_fix(targets, said):
    """They were read as sequences: a 'language model' error from the model's output, or num_classes 2."""
    from triaccel.config import DataConfig
    from triaccel.errors import DataError
    from triaccel.userdef import load_user_splits
    from triaccel.userref import reference_of

    def make():
        y = torch.arange(60) % 10
        return {"train": TensorDataset(torch.randn(60, 4), targets(y))}

    with pytest.raises(DataError, match=said):
        load_user_splits(DataConfig(class_path=reference_of(make, "data")))


@pytest.mark.parametrize("kind", ["numpy", "tensor"])
def test_a_numpy_or_tensor_num_classes_in_meta_is_the_integer_it_holds(kind):
    """meta's num_classes of np.int64(10) was refused: 'must be a whole number >= 1, got np.int64(10)'."""
    import numpy as np

    from triaccel.config import DataConfig
    from triaccel.userdef import load_user_splits
    from triaccel.userref import reference_of

    nc = np.int64(10) if kind == "numpy" else torch.tensor(10)

    def make():
        return {"train": TensorDataset(torch.randn(40, 4), torch.arange(40) % 4), "meta": {"num_classes": nc}}

    sp = load_user_splits(DataConfig(class_path=reference_of(make, "data")))
    assert sp.num_classes == 10 and type(sp.meta["num_classes"]) is int


class ThroughNumpy(nn.Module):
    """A forward that leaves torch for numpy between layers: fine in fp32, a TypeError on a bf16 tensor."""

    def __init__(self, num_classes, in_channels, image_size):
        super().__init__()
        self.a = nn.Linear(in_channels * image_size ** 2, 16)
        self.b = nn.Linear(16, num_classes)

    def forward(self, x):
        h = self.a(x.flatten(1))
        h = h + torch.from_numpy(h.detach().numpy() * 0.0)
        return self.b(h)


def test_a_model_that_fails_only_under_the_runs_autocast_is_one_line_naming_the_mode():
    """oneDNN's LSTM without a bf16 kernel (a tester's CPU), or numpy inside a forward: the check ran in fp32
    only, and the first autocast step raised a 30-line traceback."""
    from triaccel.api import load
    from triaccel.control import build_trainer
    from triaccel.errors import ConfigError

    base = {"epochs": 1, "batch_size": 32, "device": "cpu", "tracking": {"enabled": False}, "amp_dtype": "bf16"}
    for mode in ("amp", "triaccel"):
        with pytest.raises(ConfigError, match=rf"^model\.class_path: .*'s forward runs in fp32 but fails under mode "
                                              rf"{mode}'s bfloat16 autocast on cpu: TypeError: .*; mode: fp32 trains it"):
            build_trainer(load({**base, "mode": mode}, model=ThroughNumpy, data=tiny_data), [], log=lambda *a: None)
    assert build_trainer(load({**base, "mode": "fp32"}, model=ThroughNumpy, data=tiny_data), [],
                         log=lambda *a: None).fit()["val_acc"] >= 0
