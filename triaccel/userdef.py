"""The user's own model and data, by reference: ``class_path`` + ``init_args``.

The convention is Lightning's and jsonargparse's: a section names a factory by import path and
passes it ``init_args``; the section's other keys stay ours (data.val_fraction, data.split_seed),
apart from the factory's arguments::

    model: {class_path: mypkg.models.build, init_args: {depth: 4}}
    data:  {class_path: mypkg.data.make, init_args: {n: 1000}, val_fraction: 0.1, split_seed: 0}

``mypkg.models:build`` is the same reference written with the module apart; a function handed to
the Python API (``triaccel.train(config, model=fn)``) is ``callable:NAME``. How a reference resolves,
and how a search ships it to its workers, is ``triaccel.userref`` (no torch there).

Data factory: ``factory(**init_args)`` returns a ``DataSplits``, a mapping or an object with
``train`` (required), ``val``, ``test`` (optional) and ``meta`` (an optional dict such as
{"num_classes": 65, "vocab_size": 65}). Each split is a map-style Dataset of (input, target)
pairs: a TensorDataset's two tensors are used as they are, any other is stacked into tensors once.
Inputs are float (images [C, H, W], features), uint8 images [C, H, W] (passed as they are: the model
converts them) or integer (token ids); targets are integer class
ids, one per example ([]) or one per position ([T], a sequence). Without ``val`` the validation
split is carved from train (data.val_fraction, data.split_seed): stratified for class labels, a
seeded random split for sequences. User data gets no augmentation or normalisation.

Model factory: ``factory(**init_args)`` plus, for each parameter its signature names that
init_args leaves unset, the value the data gives: num_classes (meta's, else max(target) + 1 over
train), in_channels and image_size (image inputs) and every key of ``meta``. It returns an
nn.Module.

Every failure (a module that is not there, a missing attribute, a factory that raises, a wrong
return) is one ConfigError naming the key (model.class_path, data.class_path).
"""
from __future__ import annotations

import inspect
import operator
import os
import sys
from dataclasses import dataclass
from typing import Any, Optional

import torch

from triaccel.errors import ConfigError, DataError
from triaccel.userref import call, resolve, said


@dataclass
class DataSplits:
    """What a data factory may return: Datasets of (input, target) pairs; val and test optional."""
    train: Any
    val: Any = None
    test: Any = None
    meta: Optional[dict] = None


# --------------------------------------------------------------------------- data
@dataclass
class UserSplits:
    """The user's data as tensors: (inputs, targets) per split (test may be None)."""
    train: tuple
    val: tuple
    test: Optional[tuple]
    meta: dict
    num_classes: int

    @property
    def images(self) -> bool:
        x = self.train[0]  # float, or uint8 pixels a model converts itself (a quarter of the memory resident)
        return x.dim() == 4 and (x.is_floating_point() or x.dtype == torch.uint8)

    @property
    def in_channels(self) -> Optional[int]:
        return int(self.train[0].shape[1]) if self.images else None

    @property
    def image_size(self) -> Optional[int]:
        return int(self.train[0].shape[-1]) if self.images else None

    @property
    def sequence(self) -> bool:
        return self.train[1].dim() == 2

    def model_info(self) -> dict:
        """What a model factory may be given (``build_model``)."""
        info = {"num_classes": self.num_classes, "in_channels": self.in_channels, "image_size": self.image_size}
        return {**{k: v for k, v in info.items() if v is not None}, **self.meta}


def _part(out: Any, name: str):
    if isinstance(out, dict):
        return out.get(name)
    return getattr(out, name, None)


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _example(ds: Any, i: int, where: str) -> Any:
    """``ds[i]``; the user's dataset raising there is one line naming the split, the example and the line of
    the user's code that raised (a length that overstates the data: IndexError at its last examples)."""
    try:
        return ds[i]
    except Exception as e:  # noqa: BLE001 -- the user's __getitem__: its error, where it came from, one line
        from triaccel.userref import said, user_frame

        at = user_frame(e)
        raise DataError(f"{where}: example {i} of {len(ds)} raised {said(e)}" + (f" (at {at})" if at else "")) \
            from None


def _pair(item: Any, where: str) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(item, (tuple, list)) or len(item) != 2:
        raise DataError(f"{where}: an example must be an (input, target) pair, got {type(item).__name__}"
                        + (f" of {len(item)}" if isinstance(item, (tuple, list)) else ""))
    try:
        return torch.as_tensor(item[0]), torch.as_tensor(item[1])
    except Exception as e:  # noqa: BLE001 -- a PIL image or a string: say what came
        raise DataError(f"{where}: an example's input and target must be tensors or arrays ({said(e)})") from None


WIDER = {torch.uint16: torch.int32, torch.uint32: torch.int64, torch.uint64: torch.int64}


def materialise(ds: Any, where: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A split as (inputs, targets) tensors: a TensorDataset's own, any other map-style Dataset stacked
    once (refused in one line when it would not fit in memory)."""
    if isinstance(ds, torch.utils.data.TensorDataset):
        if len(ds.tensors) != 2:
            raise DataError(f"{where}: a TensorDataset of (inputs, targets), got {len(ds.tensors)} tensors")
        x, y = ds.tensors
    else:
        if not (hasattr(ds, "__getitem__") and hasattr(ds, "__len__")):
            raise DataError(f"{where}: must be a map-style torch Dataset (with __len__ and __getitem__), got "
                            f"{type(ds).__name__}")
        n = len(ds)
        if n == 0:
            raise DataError(f"{where}: is empty")
        x0, y0 = _pair(_example(ds, 0, where), where)
        need, have = n * (x0.nbytes + y0.nbytes), _memory_bytes()
        if have is not None and need > have // 2:
            raise DataError(f"{where}: {n:,} examples of input {tuple(x0.shape)} take {need / 2**30:,.1f} GiB "
                            f"as tensors (this machine has {have / 2**30:,.0f} GiB): return a smaller split")
        xs, ys = [x0], [y0]
        for i in range(1, n):
            xi, yi = _pair(_example(ds, i, where), where)
            if xi.shape != x0.shape or yi.shape != y0.shape:
                raise DataError(f"{where}: example {i} has input {tuple(xi.shape)} and target {tuple(yi.shape)}, "
                                f"example 0 {tuple(x0.shape)} and {tuple(y0.shape)}: every example needs one shape")
            xs.append(xi)
            ys.append(yi)
        x, y = torch.stack(xs), torch.stack(ys)
    if len(x) != len(y) or len(x) == 0:
        raise DataError(f"{where}: {len(x)} inputs and {len(y)} targets (need as many, at least one)")
    # token ids kept as uint16 (nanoGPT's .bin files) or uint32: torch computes little in those types (no
    # min, no embedding lookup), so they are widened to the smallest signed type that holds every value
    x, y = (t.to(WIDER[t.dtype]) if t.dtype in WIDER else t for t in (x, y))
    if y.is_floating_point() or y.dtype == torch.bool or y.is_complex():
        raise DataError(f"{where}: targets must be integer class ids, got {y.dtype}")
    if y.dim() not in (1, 2):
        raise DataError(f"{where}: a target must be a class id ([]) or a sequence of them ([T]), got shape "
                        f"{tuple(y.shape[1:])}")
    if y.dim() == 2 and y.shape[1] == 1:  # read as sequences of one position, the model's logits then mismatch
        raise DataError(f"{where}: targets of shape [N, 1]: give class ids of shape [N] (y.squeeze(1)); [N, T] "
                        f"targets are read as sequences of T positions")
    if y.dim() == 2 and bool(((y == 0) | (y == 1)).all()) and bool((y.sum(1) == 1).all()):
        raise DataError(f"{where}: targets look one-hot ([N, {y.shape[1]}], a single 1 per row): give class ids "
                        f"(y.argmax(1)); [N, T] targets are read as sequences of T positions")
    if int(y.min()) < 0:
        ignore = ("; -100 is an ignore index (Hugging Face, CrossEntropyLoss's default), but here every position "
                  "is trained and scored: cut those positions from the examples") if int(y.min()) == -100 else ""
        raise DataError(f"{where}: targets must be class ids >= 0, got {int(y.min())}{ignore}")
    return x, y.long()


def window_stride(x: torch.Tensor, pairs: int = 8) -> int | None:
    """The stride s of sliding windows: each of the first ``pairs`` examples' inputs continue the one before,
    shifted by s < T positions (``x[i][s:] == x[i + 1][:T - s]``); None where they do not (independent
    examples, or windows that share no position)."""
    n, t = len(x), x.shape[1] if x.dim() > 1 else 0
    if n < 3 or t < 2:
        return None
    last = min(n - 1, pairs)
    for s in range(1, t):
        if all(torch.equal(x[i][s:], x[i + 1][:t - s]) for i in range(last)):
            return s
    return None


def carve_val(x: torch.Tensor, y: torch.Tensor, fraction: float, seed: int) -> tuple[tuple, tuple]:
    """(train, val) from one split: stratified for class labels; for sequences a seeded random split, except
    for sliding windows (consecutive examples overlapping, window_stride): a random split would validate on
    positions the training windows hold, so the validation split is the last ``fraction`` of the windows and
    the windows before it that share a position with it (inputs or shifted targets) are left out."""
    from triaccel.data import stratified_split

    n = len(y)
    n_held = min(max(int(round(fraction * n)), 1), n - 1)
    stride = window_stride(x) if y.dim() > 1 else None
    if y.dim() == 1:
        keep, held = stratified_split(y, fraction, seed)
    elif stride is None:
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
        held, keep = perm[:n_held].sort().values, perm[n_held:].sort().values
    else:  # window i spans positions [i*s, i*s + T] with its shifted targets: i and j share none once (j - i)*s > T
        cut = n - n_held
        held, keep = torch.arange(cut, n), torch.arange(max(cut - x.shape[1] // stride, 0))
    return (x[keep], y[keep]), (x[held], y[held])


def load_user_splits(dc, fingerprint: bool = False) -> UserSplits:
    """Call data.class_path's factory and bring what it returns to tensors, with the validation split.
    ``fingerprint``: also keep the hash of what it returned (data_fingerprint)."""
    key = "data.class_path"
    out = call(resolve(dc.class_path, key), dict(dc.init_args), key, dc.class_path)
    if isinstance(out, (torch.utils.data.Dataset, list, tuple)) or _part(out, "train") is None:
        raise ConfigError(f"{key}: {dc.class_path}(...) returned {type(out).__name__}; it must return a "
                          f"triaccel.DataSplits, or a mapping or object with train (and optional val, test, meta)")
    meta = _part(out, "meta") or {}
    if not isinstance(meta, dict) or not all(isinstance(k, str) for k in meta):
        raise ConfigError(f"{key}: its meta must be a dict with string keys, got {type(meta).__name__}")
    where = lambda s: f"{key} {dc.class_path}: its {s} split"
    train = materialise(_part(out, "train"), where("train"))
    val = _part(out, "val")
    test = _part(out, "test")
    test = materialise(test, where("test")) if test is not None else None
    if val is not None:
        val = materialise(val, where("val"))
    else:
        if len(train[1]) < 2:
            raise DataError(f"{where('train')} has {len(train[1])} example: too few to hold out a validation split")
        n = len(train[1])
        train, val = carve_val(*train, dc.val_fraction, dc.split_seed)
        if not len(val[1]) or not len(train[1]):
            raise DataError(f"{where('train')} has {n} examples: holding out data.val_fraction "
                            f"{dc.val_fraction:g} of them leaves {len(val[1])} to validate on and {len(train[1])} "
                            f"to train on; return a val split, or more examples")
    for name, s in (("val", val), ("test", test)):
        if s is not None and (s[0].shape[1:] != train[0].shape[1:] or s[1].shape[1:] != train[1].shape[1:]):
            raise DataError(f"{where(name)}: inputs {tuple(s[0].shape[1:])} and targets {tuple(s[1].shape[1:])}, "
                            f"the train split's {tuple(train[0].shape[1:])} and {tuple(train[1].shape[1:])}")
    nc = meta.get("num_classes")
    if nc is None:
        nc = int(train[1].max()) + 1
        classes = f"the train split's classes 0-{nc - 1} (meta's num_classes sets them otherwise)"
        seen = int(torch.unique(train[1]).numel()) if train[1].dim() == 1 else nc  # classes; not every token
        if seen <= nc // 2:  # one stray label sizes the head: say so, once per load
            print(f"triaccel: note: {key} {dc.class_path}: the train split's targets take {seen} values in 0-{nc - 1}, "
                  f"so the model gets num_classes={nc}; give meta's num_classes if that is not meant",
                  file=sys.stderr, flush=True)
    else:
        try:  # numpy's and 0-d tensors' integers too: operator.index takes what is an integer
            nc = operator.index(nc) if not isinstance(nc, bool) else None
        except TypeError:
            nc = None
        if nc is None or nc < 1:
            raise ConfigError(f"{key}: its meta's num_classes must be a whole number >= 1, got {meta['num_classes']!r}")
        meta = {**meta, "num_classes": nc}  # a plain int for the model factory
        classes = f"meta's num_classes {nc}"
    high = max(int(s[1].max()) for s in (train, val, test) if s is not None)
    if high >= nc:
        raise DataError(f"{key} {dc.class_path}: a target is {high}, outside {classes}")
    out = UserSplits(train, val, test, dict(meta), nc)
    if fingerprint:
        FINGERPRINTS[_data_key(dc)] = content_hash(out)
    return out


# data settings -> the hash of the splits they loaded (content_hash), for the baseline cache's key
FINGERPRINTS: dict[str, str] = {}


def _data_key(dc) -> str:
    import json

    return json.dumps([dc.class_path, dc.init_args, dc.val_fraction, dc.split_seed], sort_keys=True, default=str)


def content_hash(sp: UserSplits) -> str:
    """A hash of every split's tensors, bytes, shapes and types: what the data factory returned, wherever it
    read it from (a file it finds by itself, a download) and however it changed (in place, same size)."""
    import hashlib

    h = hashlib.blake2b(digest_size=16)
    for split in (sp.train, sp.val, sp.test):
        for t in split or ():
            t = t.detach().cpu().contiguous()
            h.update(f"{tuple(t.shape)}{t.dtype};".encode())
            h.update(memoryview(t.view(torch.uint8).numpy()) if t.numel() else b"")
    h.update(repr(sorted(sp.meta.items())).encode())
    return h.hexdigest()


def data_fingerprint(dc) -> str:
    """The content hash of the data ``dc`` loads: from this process's earlier load where it asked for one
    (a search's driver checks the user's code first), else loaded now."""
    key = _data_key(dc)
    if key not in FINGERPRINTS:
        load_user_splits(dc, fingerprint=True)
    return FINGERPRINTS[key]


class TensorData:
    """A user split held as tensors on the device (or pinned host memory), batched by index, as they
    are: the trainer's counterpart of ``triaccel.data.ResidentData`` with no augmentation."""

    def __init__(self, split: tuple, device: torch.device, resident: bool = True, seed: int = 0):
        self.device = device
        self.resident = resident or device.type == "cpu"
        store = device if self.resident else torch.device("cpu")
        self.x, self.y = split[0].to(store), split[1].to(store)
        if not self.resident and device.type == "cuda":
            self.x, self.y = self.x.pin_memory(), self.y.pin_memory()
        # no draws; its state is saved with checkpoints, as ResidentData's
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.channels_last = False  # set by the trainer (`channels_last`): applies to image batches
        self.augment = False

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def batch(self, idx: torch.Tensor, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        if self.resident:
            idx = idx.to(self.x.device, non_blocking=True)
            x, y = self.x[idx], self.y[idx]
        else:
            idx = idx.cpu()
            x = self.x[idx].to(self.device, non_blocking=True)
            y = self.y[idx].to(self.device, non_blocking=True)
        if self.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        return x, y


def check_model_takes(mc, sp) -> None:
    """A shipped or zoo model (``model.name``) takes float images; the user's uint8 images reach a model as
    they are, which only the user's own model (``model.class_path``) can convert: said in one line before
    it is built, not as a dtype error from the first step."""
    if mc.class_path is None and isinstance(sp, UserSplits) and sp.images and sp.train[0].dtype == torch.uint8:
        raise ConfigError(f"model.name: {mc.name} takes float images; the data's images are uint8, passed as they "
                          f"are: return float tensors from data.class_path (x.float() / 255), or name a model of "
                          f"your own that converts them in model.class_path")


def first_examples(sp, n: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``n`` training examples as the trainer batches them, on the CPU, without augmentation: the
    user's data (``UserSplits``) as it is, a shipped image set normalised (``triaccel.data.ResidentData``)."""
    if isinstance(sp, UserSplits):
        return sp.train[0][:n], sp.train[1][:n]
    from triaccel.data import ResidentData

    idx = torch.arange(min(n, len(sp.train)))
    data = ResidentData(sp.train.subset(idx), torch.device("cpu"), sp.mean, sp.std, augment=False, padding=0)
    return data.batch(torch.arange(len(idx)), train=False)


# --------------------------------------------------------------------------- model
def build_user_model(mc, info: dict) -> torch.nn.Module:
    key = "model.class_path"
    fn = resolve(mc.class_path, key)
    kwargs = dict(mc.init_args)
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature: init_args only
        params = {}
    for k, v in info.items():
        p = params.get(k)
        if k not in kwargs and p is not None and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            kwargs[k] = v
    # a parameter nothing gives (in_channels or image_size of a model over features or token ids, which the
    # data gives only for images [C, H, W]): said with what the data does give, not as the call's TypeError
    unmet = [k for k, p in params.items() if k not in kwargs and p.default is p.empty
             and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if unmet:
        gives = ", ".join(info) or "nothing"
        raise ConfigError(f"{key}: {mc.class_path} takes {', '.join(unmet)}, which neither model.init_args nor the "
                          f"data gives (the data gives {gives}; in_channels and image_size only for images "
                          f"[C, H, W]): give {'them' if len(unmet) > 1 else 'it'} in model.init_args or the data's meta")
    model = call(fn, kwargs, key, mc.class_path)
    if not isinstance(model, torch.nn.Module):
        raise ConfigError(f"{key}: {mc.class_path}(...) returned {type(model).__name__}, not a torch.nn.Module")
    return model


def _model_said(mc) -> str:
    return f"model.class_path: {mc.class_path}" if mc.class_path else f"model.name: {mc.name}"


def training_logits(out: Any, mc) -> torch.Tensor:
    """A training forward's output, where it is the logits tensor: what ``check_user_forward`` (eval mode) cannot
    see, a model that returns more in training mode (torchvision's googlenet: its auxiliary logits), is said
    in one line naming the model's key, not as a traceback from the loss."""
    if not isinstance(out, torch.Tensor):
        raise ConfigError(f"{_model_said(mc)}'s forward returned a {type(out).__name__} in training mode, not a "
                          f"tensor of logits: return the logits (a small wrapper module can pick them out)")
    return out


def check_loss_reaches_parameters(loss: torch.Tensor, mc) -> None:
    """A loss no trainable parameter reaches (a ``detach()`` in the forward, the layers it uses frozen) has
    nothing to backpropagate: said in one line naming the model's key, not torch's backward error."""
    if not loss.requires_grad:
        raise ConfigError(f"{_model_said(mc)}'s output reaches no parameter that requires a gradient (a detach() "
                          f"in the forward, or the layers it uses frozen): nothing would train")


def check_user_forward(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, num_classes: int, ref: str,
                       failure_is_final: bool = True, half: torch.dtype | None = None, mode: str = "amp",
                       key: str = "model.class_path") -> None:
    """The user's model (``ref``, model.class_path) on two training examples, without gradients and in eval
    mode, before anything trains: a model with nothing to train, a forward that fails on the data, or one
    that returns something other than the logits is said in one line naming the key, not as a traceback
    from the first training step. ``failure_is_final=False`` (a search's driver, checking on its CPU for
    runs on another device) lets a forward that raises pass: the run checks it again on its own device,
    where a model written for CUDA alone can run. ``half``: the 16-bit type the run's ``mode`` autocasts to,
    where the forward runs a second time (oneDNN's LSTM has no bf16 kernel on a CPU). ``key``: model.name for a
    torchvision or timm model named SOURCE/NAME, which the data may not fit (too small an image for its pooling)."""
    if not any(p.requires_grad for p in model.parameters()):
        raise ConfigError(f"{key}: {ref} has no parameter to train")
    was = model.training
    model.eval()
    try:
        try:
            with torch.no_grad():
                out = model(x)
        except Exception as e:  # noqa: BLE001 -- the user's code: any error is theirs to read, in one line
            if not failure_is_final:
                return
            hint = ("; the data's images are uint8, passed as they are: convert them in the model (x.float() / 255) "
                    "or return float tensors") if x.dtype == torch.uint8 and x.dim() == 4 else ""
            if isinstance(e, IndexError) and not x.is_floating_point() and x.numel():
                hint = (f"; its token ids go up to {int(x.max())}: the model's embedding must have more rows "
                        f"(its vocab_size, from model.init_args or the data's meta)")
            raise ConfigError(f"{key}: {ref}'s forward failed on a batch of the data (inputs {tuple(x.shape)} "
                              f"{str(x.dtype).replace('torch.', '')}): {said(e)}{hint}") from None
        kind = "[batch, positions, vocabulary] for a language model" if y.dim() > 1 else "[batch, classes]"
        if not isinstance(out, torch.Tensor):
            raise ConfigError(f"{key}: {ref}'s forward returned a {type(out).__name__}, not a tensor of logits "
                              f"{kind}: return the logits (a small wrapper module can pick them out)")
        if out.dim() != y.dim() + 1 or tuple(out.shape[:-1]) != tuple(y.shape) or out.shape[-1] < num_classes:
            raise ConfigError(f"{key}: {ref}'s forward returned logits of shape {tuple(out.shape)} for targets of "
                              f"shape {tuple(y.shape)} and {num_classes} classes; it must return {kind}")
        if half is None:
            return
        try:
            with torch.no_grad(), torch.autocast(x.device.type, dtype=half):
                model(x)
        except Exception as e:  # noqa: BLE001 -- the user's code under the run's autocast, in one line
            if failure_is_final:
                raise ConfigError(f"{key}: {ref}'s forward runs in fp32 but fails under mode {mode}'s "
                                  f"{str(half).replace('torch.', '')} autocast on {x.device.type}: {said(e)}; "
                                  f"mode: fp32 trains it") from None
    finally:
        model.train(was)

