"""The user's code by reference: ``class_path`` resolved to its factory, and shipped to a search's workers.

A reference is an import path (``mypkg.models.build`` or ``mypkg.models:build``), or
``callable:NAME`` for a function handed to the Python API that has no import path (defined in a
notebook or a script's ``__main__``): this process knows it (``CALLABLES``), a search ships it to its
Ray workers by value, and any other process must be handed it again. What a factory is called with
and must return is ``triaccel.userdef``'s, which builds the data and the model.

This module imports no torch: a search's driver checks and ships references without it, and imports
``triaccel.userdef`` only when the user's data or model has to be built (``check_references``).
Every failure is one ConfigError naming the key (model.class_path, data.class_path).
"""
from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Callable

from triaccel.errors import ConfigError

CALLABLE_PREFIX = "callable:"
# functions handed to the Python API in this process (and, in a search's workers, shipped to them)
CALLABLES: dict[str, Callable] = {}
_HANDED_AS: dict[str, str] = {}  # the section (model, data) each CALLABLES entry was handed for


def reference_of(fn: Callable | str, what: str) -> str:
    """The class_path for ``fn``: a string as given; a function importable by its module and
    qualified name as ``module.name``; any other (a notebook's, a lambda) as ``callable:NAME``,
    remembered in CALLABLES."""
    if isinstance(fn, str):
        return fn
    check_factory(fn, what)
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
    if CALLABLES.get(ref, fn) is not fn and _HANDED_AS.get(ref) != what:
        # another section's function of this name (two lambdas, two closures named `make`): the data factory
        # must not replace the model's; a later call's function of the same section does replace it
        ref = f"{CALLABLE_PREFIX}{what}.{name}"
    CALLABLES[ref] = fn
    _HANDED_AS[ref] = what
    return ref


def check_factory(fn: Callable, what: str) -> None:
    """``fn`` can be handed as the factory of ``what`` (model, data): a callable, and not a built model, which
    is callable too and would be called as its own factory."""
    if not callable(fn):
        raise ConfigError(f"{what}: must be a callable or an import path string, got {type(fn).__name__}")
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(fn, torch.nn.Module):
        cls = type(fn)
        # a container's class cannot build this model from the arguments a factory gets (num_classes, ...)
        container = cls.__module__.startswith("torch.nn") and cls.__name__ in ("Sequential", "ModuleList",
                                                                               "ModuleDict")
        how = (f"{what}=make_{what}, a function that returns the {cls.__name__}" if container else
               f"{what}={cls.__name__} or {what}=make_{what}")
        raise ConfigError(f"{what}: got a built {cls.__name__}; hand the class or function that builds it "
                          f"(each run builds its own, sized to the data: {how})")


def handed_again(refs: dict) -> str:
    """'model=make_model, data=make_data': the arguments that hand again the functions ``refs`` name
    ({'model.class_path' or 'model': 'callable:make_model'}), as the Python API takes them."""
    out = []
    for key, ref in refs.items():
        section = key.split(".")[0]
        out.append(f"{section}={ref[len(CALLABLE_PREFIX):].removeprefix(section + '.')}")
    return ", ".join(out)


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
        raise ConfigError(f"{key}: importing {mod_name} failed: {said(e)}") from None
    except Exception as e:  # noqa: BLE001 -- the user's module raised at import: one line naming it
        raise ConfigError(f"{key}: importing {mod_name} failed: {said(e)}") from None
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
                              f"triaccel.resume(NAME, {key.split('.')[0]}={name}), "
                              f"triaccel.extend(NAME, TRIALS, {key.split('.')[0]}={name}))")
        return fn
    return _import(ref, key)


def _ours() -> tuple[str, ...]:
    """The folders of this package's code: triaccel/, and kernels/ and search/ where an editable install maps
    triaccel.kernels and triaccel.search outside it."""
    import importlib.util

    out = [os.path.dirname(os.path.abspath(__file__))]
    for sub in ("triaccel.kernels", "triaccel.search"):
        try:
            spec = importlib.util.find_spec(sub)
        except (ImportError, ValueError):
            continue
        out += [os.path.abspath(d) for d in (spec.submodule_search_locations or ()) if spec is not None]
    return tuple(out)


def user_frame(e: BaseException) -> str | None:
    """'file.py:LINE in func' where ``e`` came from the user's code, else None. Read from the raise upwards,
    past the libraries' frames (torch's own, anything installed, the standard library, generated code): the
    first frame that is not a library's decides. The user's (a forward whose matmul torch refused: the
    user's line) gives its place; this package's (the precision wrapper around the user's layer) gives None,
    and the error keeps its traceback."""
    import sysconfig
    import traceback

    ours = _ours()
    paths = sysconfig.get_paths()
    libs = {os.path.abspath(paths[k]) for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}

    def library(fr) -> bool:
        f = os.path.abspath(fr.filename)
        parts = f.split(os.sep)
        return (any(f.startswith(lib + os.sep) for lib in libs) or "site-packages" in parts or "dist-packages" in parts
                or any(x.startswith("torchinductor") for x in parts)
                or (fr.filename.startswith("<") and not fr.filename.startswith(("<string>", "<stdin>", "<ipython-input"))))

    for fr in reversed(traceback.extract_tb(e.__traceback__)):
        if library(fr):
            continue
        f = os.path.abspath(fr.filename)
        if any(f == d or f.startswith(d + os.sep) for d in ours):
            return None
        return f"{fr.filename}:{fr.lineno} in {fr.name}"
    return None


def said(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300]}" if text else type(e).__name__


def call(fn: Callable, kwargs: dict, key: str, ref: str) -> Any:
    try:
        return fn(**kwargs)
    except Exception as e:  # noqa: BLE001 -- the user's factory failed: its type and message, one line
        raise ConfigError(f"{key}: {ref}(...) raised {said(e)}") from None
    except (SystemExit, GeneratorExit) as e:  # its sys.exit(0) would end the run as a success, having trained nothing
        raise ConfigError(f"{key}: {ref}(...) raised {said(e)}: a factory returns its object, not exit") from None
    except KeyboardInterrupt:  # Ctrl-C: the run's stop, as anywhere else
        raise
    except BaseException as e:  # noqa: BLE001 -- any other BaseException of the user's: one line, not a traceback
        raise ConfigError(f"{key}: {ref}(...) raised {said(e)}") from None


# --------------------------------------------------------------------------- before a search
def check_references(train: dict) -> None:
    """Resolve and call the model and data a config names, once, in this process: a bad reference is
    one line naming its key before Ray starts or anything is written (``check_user_code``)."""
    from triaccel.config import TrainConfig, from_dict

    cfg = from_dict(TrainConfig, train)
    if cfg.model.class_path is None and "/" not in cfg.model.name and cfg.data.class_path is None:
        return  # the shipped models and data: nothing of the user's to check
    missing = {k: r for k in ("model", "data") if is_callable_ref(r := getattr(cfg, k).class_path)
               and r not in CALLABLES}
    if len(missing) > 1:  # every function to hand again in one line, not the first of them
        names = handed_again(missing)
        refs = " and ".join(f"{k}.class_path {r!r}" for k, r in missing.items())
        raise ConfigError(f"{refs} are functions handed to triaccel's Python API in another process; hand them "
                          f"again: triaccel.resume(NAME, {names}) (or triaccel.extend(NAME, TRIALS, {names}), "
                          f"triaccel.train(config, {names}))")
    from triaccel.data import load_splits
    from triaccel.models import build_model
    from triaccel.userdef import check_model_takes, load_user_splits

    if cfg.data.class_path is not None:  # its hash kept: the baselines' reuse key (search.baseline_cache)
        sp = load_user_splits(cfg.data, fingerprint=True)
        info = (sp.num_classes, sp.in_channels, sp.image_size, sp.meta)
    else:
        sp = load_splits(cfg.data)
        info = (sp.num_classes, sp.in_channels, sp.image_size, None)
    check_model_takes(cfg.model, sp)
    model = build_model(cfg.model, *info[:3], meta=info[3])
    if cfg.model.class_path is not None or "/" in cfg.model.name:  # its output too: a search must not take its name
        # for a model that cannot train (a hub model's pooling the data's images are too small for)
        import torch

        from triaccel.precision import first_half
        from triaccel.userdef import check_user_forward, first_examples

        # final only where the runs train on this CPU too; another device's failures and autocast are the run's check
        on_cpu = cfg.device == "cpu" or (cfg.device == "auto" and not torch.cuda.is_available())
        x, y = first_examples(sp)
        check_user_forward(model, x, y, info[0], cfg.model.label(), failure_is_final=on_cpu,
                           half=first_half(cfg, torch.device("cpu")) if on_cpu else None, mode=cfg.mode,
                           key="model.class_path" if cfg.model.class_path else "model.name")
        # and in training mode, which the run's own check before its first step cannot take (its model's
        # batch-norm statistics would move; this one is built for the check): the logits, reaching a parameter
        from triaccel.metrics import example_loss_sum
        from triaccel.userdef import check_loss_reaches_parameters, training_logits

        try:
            out = model.train()(x)
        except Exception:  # noqa: BLE001 -- a training forward that fails is the run's to say, at its first step
            return
        check_loss_reaches_parameters(example_loss_sum(training_logits(out, cfg.model).float(), y), cfg.model)


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


def use_runtime_env(env: dict | None, verb: str = "resume") -> None:
    """This process imports what ``env`` ships (a resumed search started in another folder); code that
    has gone since is one line naming it, not a traceback from Ray's upload. ``verb``: what the user runs."""
    for p in (env or {}).get("py_modules", []):
        if not os.path.exists(p):
            raise ConfigError(f"{p}: the search's own code (model.class_path / data.class_path) is gone from "
                              f"there (moved or deleted): put it back to {verb} the search")
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
