"""The user's own model and data, by reference: ``class_path`` + ``init_args``.

The convention is Lightning's and jsonargparse's: a section names a factory by import path and
passes it ``init_args``; the section's other keys stay ours (data.val_fraction, data.split_seed),
apart from the factory's arguments::

    model: {class_path: mypkg.models.build, init_args: {depth: 4}}
    data:  {class_path: mypkg.data.make, init_args: {n: 1000}, val_fraction: 0.1, split_seed: 0}

``mypkg.models:build`` is the same reference written with the module apart. A function handed to
the Python API (``triaccel.train(config, model=fn)``) that has no import path (defined in a notebook
or a script's ``__main__``) is ``callable:NAME``: this process knows it (``CALLABLES``), a search
ships it to its Ray workers by value, and any other process must be handed it again.

Data factory: ``factory(**init_args)`` returns a ``DataSplits``, a mapping or an object with
``train`` (required), ``val``, ``test`` (optional) and ``meta`` (an optional dict such as
{"num_classes": 65, "vocab_size": 65}). Each split is a map-style Dataset of (input, target)
pairs: a TensorDataset's two tensors are used as they are, any other is stacked into tensors once.
Inputs are float (images [C, H, W], features) or integer (token ids); targets are integer class
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

import importlib
import inspect
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

from triaccel.errors import ConfigError, DataError

if TYPE_CHECKING:  # torch is imported where data or a model is built: a search's driver checks references without it
    import torch

CALLABLE_PREFIX = "callable:"
# functions handed to the Python API in this process (and, in a search's workers, shipped to them)
CALLABLES: dict[str, Callable] = {}


@dataclass
class DataSplits:
    """What a data factory may return: Datasets of (input, target) pairs; val and test optional."""
    train: Any
    val: Any = None
    test: Any = None
    meta: Optional[dict] = None


# --------------------------------------------------------------------------- references
def reference_of(fn: Callable | str, what: str) -> str:
    """The class_path for ``fn``: a string as given; a function importable by its module and
    qualified name as ``module.name``; any other (a notebook's, a lambda) as ``callable:NAME``,
    remembered in CALLABLES."""
    if isinstance(fn, str):
        return fn
    if not callable(fn):
        raise ConfigError(f"{what}: must be a callable or an import path string, got {type(fn).__name__}")
    mod, qual = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if mod and qual and mod != "__main__" and "<" not in qual and getattr(sys.modules.get(mod), "__file__", None):
        ref = f"{mod}:{qual}"
        try:
            if _import(ref, what) is fn:
                return ref
        except ConfigError:
            pass
    name = "".join(ch if ch.isalnum() or ch in "._" else "_" for ch in (qual or type(fn).__name__))
    ref = f"{CALLABLE_PREFIX}{name}"
    CALLABLES[ref] = fn
    return ref


def is_callable_ref(ref: str | None) -> bool:
    return bool(ref) and ref.startswith(CALLABLE_PREFIX)


def module_of(ref: str) -> str:
    """The module part of an import-path reference."""
    return ref.partition(":")[0] if ":" in ref else ref.rpartition(".")[0]


def _cwd_on_path() -> None:
    """The folder a command was started in is where user code is looked up (the `triaccel` script's
    own folder is on sys.path, the current one is not)."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)


def _import(ref: str, key: str) -> Callable:
    mod_name = module_of(ref)
    attr = ref.partition(":")[2] if ":" in ref else ref.rpartition(".")[2]
    if not mod_name:
        raise ConfigError(f"{key}: {ref!r} names no module: write package.module.factory")
    _cwd_on_path()
    try:
        obj = importlib.import_module(mod_name)
    except ModuleNotFoundError as e:
        if e.name and (mod_name == e.name or mod_name.startswith(e.name + ".")):
            raise ConfigError(f"{key}: no module named {e.name!r} (looked in {os.getcwd()} and the Python path) "
                              f"for {ref!r}") from None
        raise ConfigError(f"{key}: importing {mod_name} failed: {_said(e)}") from None
    except Exception as e:  # noqa: BLE001 -- the user's module raised at import: one line naming it
        raise ConfigError(f"{key}: importing {mod_name} failed: {_said(e)}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"{key}: module {mod_name} has no attribute {part!r} (from {ref!r})") from None
    if not callable(obj):
        raise ConfigError(f"{key}: {ref} is a {type(obj).__name__}, not a function or class to call")
    return obj


def resolve(ref: str, key: str) -> Callable:
    """The factory ``ref`` names; a ConfigError naming ``key`` when there is none."""
    if is_callable_ref(ref):
        fn = CALLABLES.get(ref)
        if fn is None:
            name = ref[len(CALLABLE_PREFIX):]
            raise ConfigError(f"{key}: {ref!r} is a function handed to triaccel's Python API in another process; "
                              f"hand it again: triaccel.train(config, {key.split('.')[0]}={name}) (or "
                              f"triaccel.resume(NAME, {key.split('.')[0]}={name}))")
        return fn
    return _import(ref, key)


def _said(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300]}" if text else type(e).__name__


def call(fn: Callable, kwargs: dict, key: str, ref: str) -> Any:
    try:
        return fn(**kwargs)
    except Exception as e:  # noqa: BLE001 -- the user's factory failed: its type and message, one line
        raise ConfigError(f"{key}: {ref}(...) raised {_said(e)}") from None


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
        return self.train[0].is_floating_point() and self.train[0].dim() == 4

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


def _pair(item: Any, where: str) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    if not isinstance(item, (tuple, list)) or len(item) != 2:
        raise DataError(f"{where}: an example must be an (input, target) pair, got {type(item).__name__}"
                        + (f" of {len(item)}" if isinstance(item, (tuple, list)) else ""))
    try:
        return torch.as_tensor(item[0]), torch.as_tensor(item[1])
    except Exception as e:  # noqa: BLE001 -- a PIL image or a string: say what came
        raise DataError(f"{where}: an example's input and target must be tensors or arrays ({_said(e)})") from None


def materialise(ds: Any, where: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A split as (inputs, targets) tensors: a TensorDataset's own, any other map-style Dataset stacked
    once (refused in one line when it would not fit in memory)."""
    import torch

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
        x0, y0 = _pair(ds[0], where)
        need, have = n * (x0.nbytes + y0.nbytes), _memory_bytes()
        if have is not None and need > have // 2:
            raise DataError(f"{where}: {n:,} examples of input {tuple(x0.shape)} take {need / 2**30:,.1f} GiB "
                            f"as tensors (this machine has {have / 2**30:,.0f} GiB): return a smaller split")
        xs, ys = [x0], [y0]
        for i in range(1, n):
            xi, yi = _pair(ds[i], where)
            if xi.shape != x0.shape or yi.shape != y0.shape:
                raise DataError(f"{where}: example {i} has input {tuple(xi.shape)} and target {tuple(yi.shape)}, "
                                f"example 0 {tuple(x0.shape)} and {tuple(y0.shape)}: every example needs one shape")
            xs.append(xi)
            ys.append(yi)
        x, y = torch.stack(xs), torch.stack(ys)
    if len(x) != len(y) or len(x) == 0:
        raise DataError(f"{where}: {len(x)} inputs and {len(y)} targets (need as many, at least one)")
    if y.is_floating_point() or y.dtype == torch.bool or y.is_complex():
        raise DataError(f"{where}: targets must be integer class ids, got {y.dtype}")
    if y.dim() not in (1, 2):
        raise DataError(f"{where}: a target must be a class id ([]) or a sequence of them ([T]), got shape "
                        f"{tuple(y.shape[1:])}")
    if int(y.min()) < 0:
        raise DataError(f"{where}: targets must be class ids >= 0, got {int(y.min())}")
    return x, y.long()


def carve_val(x: torch.Tensor, y: torch.Tensor, fraction: float, seed: int) -> tuple[tuple, tuple]:
    """(train, val) from one split: stratified for class labels, a seeded random split for sequences."""
    import torch

    from triaccel.data import stratified_split

    if y.dim() == 1:
        keep, held = stratified_split(y, fraction, seed)
    else:
        perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
        n_held = min(max(int(round(fraction * len(y))), 1), len(y) - 1)
        held, keep = perm[:n_held].sort().values, perm[n_held:].sort().values
    return (x[keep], y[keep]), (x[held], y[held])


def load_user_splits(dc) -> UserSplits:
    """Call data.class_path's factory and bring what it returns to tensors, with the validation split."""
    import torch

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
        train, val = carve_val(*train, dc.val_fraction, dc.split_seed)
    for name, s in (("val", val), ("test", test)):
        if s is not None and (s[0].shape[1:] != train[0].shape[1:] or s[1].shape[1:] != train[1].shape[1:]):
            raise DataError(f"{where(name)}: inputs {tuple(s[0].shape[1:])} and targets {tuple(s[1].shape[1:])}, "
                            f"the train split's {tuple(train[0].shape[1:])} and {tuple(train[1].shape[1:])}")
    nc = meta.get("num_classes")
    if nc is None:
        nc = int(train[1].max()) + 1
    elif not isinstance(nc, int) or isinstance(nc, bool) or nc < 1:
        raise ConfigError(f"{key}: its meta's num_classes must be a whole number >= 1, got {nc!r}")
    high = max(int(s[1].max()) for s in (train, val, test) if s is not None)
    if high >= nc:
        raise DataError(f"{key} {dc.class_path}: a target is {high}, outside meta's num_classes {nc}")
    return UserSplits(train, val, test, dict(meta), nc)


class TensorData:
    """A user split held as tensors on the device (or pinned host memory), batched by index, as they
    are: the trainer's counterpart of ``triaccel.data.ResidentData`` with no augmentation."""

    def __init__(self, split: tuple, device: torch.device, resident: bool = True, seed: int = 0):
        import torch

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
        import torch

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


# --------------------------------------------------------------------------- model
def build_user_model(mc, info: dict) -> torch.nn.Module:
    import torch

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
    model = call(fn, kwargs, key, mc.class_path)
    if not isinstance(model, torch.nn.Module):
        raise ConfigError(f"{key}: {mc.class_path}(...) returned {type(model).__name__}, not a torch.nn.Module")
    return model


# --------------------------------------------------------------------------- before a search
def check_references(train: dict) -> None:
    """Resolve and call the model and data a config names, once, in this process: a bad reference is
    one line naming its key before Ray starts or anything is written (``check_user_code``)."""
    from triaccel.config import TrainConfig, from_dict

    cfg = from_dict(TrainConfig, train)
    if cfg.model.class_path is None and "/" not in cfg.model.name and cfg.data.class_path is None:
        return  # the shipped models and data: nothing of the user's to check
    from triaccel.data import load_splits
    from triaccel.models import build_model

    if cfg.data.class_path is not None:
        sp = load_user_splits(cfg.data)
        info = (sp.num_classes, sp.in_channels, sp.image_size, sp.meta)
    else:
        sp = load_splits(cfg.data)
        info = (sp.num_classes, sp.in_channels, sp.image_size, None)
    build_model(cfg.model, *info[:3], meta=info[3])


SHIP_EXCLUDES = ["__pycache__", "*.pyc", ".git", "mlruns", ".ipynb_checkpoints"]
SHIP_MAX_BYTES = 100 * 2**20  # Ray's upload limit for one runtime_env package


def _installed(path: str) -> bool:
    """Whether ``path`` lies in this interpreter's installation (site-packages, the standard library):
    a worker's interpreter imports it as the driver does."""
    import sysconfig

    roots = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, *(sysconfig.get_paths().values()))}
    real = os.path.realpath(path)
    return any(real == r or real.startswith(r.rstrip(os.sep) + os.sep) for r in roots)


def _size(path: str, limit: int) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    total = 0
    for d, dirs, files in os.walk(path):
        dirs[:] = [x for x in dirs if x not in ("__pycache__", ".git", "mlruns", ".ipynb_checkpoints")]
        total += sum(os.path.getsize(os.path.join(d, f)) for f in files if not f.endswith(".pyc"))
        if total > limit:
            break
    return total


def runtime_env_for(refs: dict) -> dict | None:
    """Ray's runtime_env that lets every worker import the user code ``refs`` (key -> reference) names:
    the top-level package (or single module file) holding each referenced module, as ``py_modules``,
    uploaded by ``ray.init`` to the local instance or the cluster alike. Code installed in this
    interpreter (site-packages) and triaccel itself are not shipped."""
    from importlib.util import find_spec

    mods = []
    for key, ref in refs.items():
        if not ref or is_callable_ref(ref):
            continue
        top = module_of(ref).split(".")[0]
        if top in ("triaccel", "torch", "torchvision", "timm"):
            continue
        _cwd_on_path()
        spec = find_spec(top)
        if spec is None:
            raise ConfigError(f"{key}: no module named {top!r} (looked in {os.getcwd()} and the Python path)")
        locs = list(spec.submodule_search_locations or [])
        path = locs[0] if locs else spec.origin
        if not path or not os.path.exists(path) or _installed(path):
            continue
        size = _size(path, SHIP_MAX_BYTES)
        if size > SHIP_MAX_BYTES:
            raise ConfigError(f"{key}: {path} holds more than {SHIP_MAX_BYTES // 2**20} MiB; Ray ships it to every "
                              f"worker (runtime_env py_modules): keep data files out of the package and read them "
                              f"from a path in init_args")
        if path not in mods:
            mods.append(path)
    return {"py_modules": mods, "excludes": list(SHIP_EXCLUDES)} if mods else None


def use_runtime_env(env: dict | None) -> None:
    """This process imports what ``env`` ships (a resumed search started in another folder); code that
    has gone since is one line naming it, not a traceback from Ray's upload."""
    for p in (env or {}).get("py_modules", []):
        if not os.path.exists(p):
            raise ConfigError(f"{p}: the search's own code (model.class_path / data.class_path) is gone from "
                              f"there (moved or deleted): put it back to resume the search")
        parent = os.path.dirname(p.rstrip(os.sep))
        if parent and parent not in sys.path:
            sys.path.append(parent)


def search_references(train: dict) -> dict:
    """{key: reference} of the user code a search's fixed settings name."""
    return {f"{s}.class_path": (train.get(s) or {}).get("class_path") for s in ("model", "data")
            if isinstance(train.get(s), dict) and (train.get(s) or {}).get("class_path")}


def check_user_code(space) -> tuple[dict | None, dict]:
    """Before a search starts Ray or writes anything: its model and data resolve and build here, once.
    (runtime_env for the workers, {key: reference} of the functions handed from Python)."""
    check_references(dict(space.train))
    refs = search_references(space.train)
    return runtime_env_for(refs), {k: r for k, r in refs.items() if is_callable_ref(r)}


def shipped() -> dict:
    """The functions handed to the Python API in this process, to ship to a search's workers."""
    return dict(CALLABLES)
