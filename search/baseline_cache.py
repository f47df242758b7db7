"""Baselines measured once: a static baseline another search already trained is reused, not re-trained.

A baseline run carries ``triaccel.baseline_key``: a hash of everything that decides its figures --
the resolved training config (model, data, epochs, seed, dtype, batch, capture, compile, optimizer,
every key but tracking, names and the exported provenance), the device model (the GPU's name, or
'cpu' with the CPU's model and torch's thread count), the torch, CUDA and project versions (the
package version and git revision, or a hash of the package source where the tree has no clean
revision), the user's model and data code where a class_path names it (``user_code``: the
package's sources, or a handed function's script, source and plain globals), and the data files
(``data_files``: each file's path under its folder, size and modification time, for ``data.data_dir``
and every path the model's and data's ``init_args`` name) and, for the user's data factory, a hash of the
tensors it returned (``data_content``: a file it finds by itself counts too). A built-in dataset's file
changed in place with its size and time kept is not seen: ``--fresh-baselines`` re-measures. A new search looks in its MLflow store for a FINISHED baseline run of the same key that
reached its epochs, and logs a child run of its own that copies the source's params and every
metric's history, tagged ``triaccel.reused_from`` (the run first trained), ``..._search`` and
``..._date``: the rules, the summary and the UI read it as a baseline trained today. The store is
the one source of truth; ``--fresh-baselines`` trains them again.
"""
from __future__ import annotations

import datetime
import functools
import hashlib
import json
import platform
from pathlib import Path

KEY_TAG = "triaccel.baseline_key"
REUSED_FROM = "triaccel.reused_from"
REUSED_SEARCH, REUSED_DATE = "triaccel.reused_from_search", "triaccel.reused_from_date"
# settings that name or record a run without changing what it measures
NOT_TRAINING = ("tracking", "provenance", "evaluate_test")


def settings(cfg) -> dict:
    """The resolved config as training sees it, less the keys that do not change its figures."""
    from triaccel.config import to_dict

    d = to_dict(cfg)
    for k in NOT_TRAINING:
        d.pop(k, None)
    return d


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_model(device: str) -> str:
    """The device a config trains on, by model: the GPU's name, or cpu with its model and threads."""
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and torch.cuda.is_available():
        idx = int(device.split(":", 1)[1]) if ":" in device else torch.cuda.current_device()
        return f"cuda:{torch.cuda.get_device_name(idx)}"
    return f"cpu:{_cpu_model()}:threads={torch.get_num_threads()}"


@functools.lru_cache(maxsize=1)
def source_hash() -> str:
    """A hash of the installed package's Python and kernel sources (its code, whatever git says)."""
    import triaccel
    import triaccel.kernels
    import triaccel.search

    h = hashlib.sha256()
    for pkg in (triaccel, triaccel.search, triaccel.kernels):
        root = Path(pkg.__file__).resolve().parent
        for p in sorted(root.glob("*.py")) + sorted(root.glob("*/*.py")):
            h.update(str(p.relative_to(root)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def versions() -> dict:
    import torch

    from triaccel import __version__
    from triaccel.tracking import git_revision

    rev = git_revision()
    out = {"torch": torch.__version__, "cuda": torch.version.cuda or "none", "triaccel": __version__}
    # a clean checkout is named by its revision; a modified or unversioned tree by its code
    out["code"] = rev if not (rev.endswith("-dirty") or rev.startswith("release-")) else f"src-{source_hash()}"
    return out


MAX_PACKAGE_FILES = 2000  # a user package hashed whole up to this many .py files; beyond, never reused


def _simple_globals(fn) -> list:
    """The plain values (numbers, text, tuples of them) a function's code reads as globals, nested code
    included: a script that sets WIDTH = 1024 instead of 8 builds another model from the same source."""
    import types

    names, todo = set(), [getattr(fn, "__code__", None)]
    while todo:
        code = todo.pop()
        if code is None:
            continue
        names.update(code.co_names)
        todo += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    g = getattr(fn, "__globals__", {})
    return sorted((n, repr(g[n])) for n in names
                  if n in g and isinstance(g[n], (int, float, str, bool, bytes, tuple, type(None))))


def _code_of(fn) -> str | None:
    """What a factory handed from Python is made of: its module's file where it has one (a script), its own
    source, defaults, closure and the plain globals it reads; a partial's function and arguments. None for
    anything else (a bound method's or a callable object's state is not read): its baseline is never reused."""
    import functools
    import inspect
    import marshal
    import sys
    import types

    if isinstance(fn, functools.partial):
        inner = _code_of(fn.func)
        return None if inner is None else "\n".join([inner, repr(fn.args), repr(sorted(fn.keywords.items()))])
    if not isinstance(fn, (types.FunctionType, type)):
        return None
    parts = []
    mod = sys.modules.get(getattr(fn, "__module__", None) or "")
    f = getattr(mod, "__file__", None)
    if f and Path(f).is_file():
        parts.append(Path(f).read_bytes().hex())
    if hasattr(fn, "__code__"):  # a function, also one typed at `python -c` or a REPL, which has no source
        parts.append(marshal.dumps(fn.__code__).hex())
    else:  # a class: its source, where it is in a file or a notebook cell
        try:
            parts.append(inspect.getsource(fn))
        except (OSError, TypeError):
            pass
    if not parts:
        return None
    cells = [repr(c.cell_contents) for c in (getattr(fn, "__closure__", None) or ()) if _filled(c)]
    parts += [repr(getattr(fn, "__defaults__", None)), repr(getattr(fn, "__kwdefaults__", None)), *cells,
              repr(_simple_globals(fn))]
    return "\n".join(parts)


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # a cell not yet assigned
        return False
    return True


def _package_code(ref: str) -> str | None:
    """The source of the package (or lone module) an import path names: every .py file under its top-level
    package, so an edit anywhere in that package is seen (code it imports from elsewhere is not). None where it
    cannot be read whole."""
    import importlib.metadata
    import importlib.util

    from triaccel.userref import _cwd_on_path, module_of

    top = module_of(ref).split(".")[0]
    _cwd_on_path()  # where the search's own import looks first
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    where = [*(spec.submodule_search_locations or ()), spec.origin or ""]
    if any(part in ("site-packages", "dist-packages") for w in where for part in Path(w).parts):
        # an installed library (torch.nn:Linear, a team's released package): named by its version
        dists = importlib.metadata.packages_distributions().get(top, [])
        try:
            return ";".join(f"{d}=={importlib.metadata.version(d)}" for d in sorted(dists)) or None
        except importlib.metadata.PackageNotFoundError:
            return None
    import itertools

    if spec.submodule_search_locations:
        found = (f for d in spec.submodule_search_locations for f in Path(d).rglob("*.py"))
        files = list(itertools.islice(found, MAX_PACKAGE_FILES + 1))  # a package folder that also holds data
    elif spec.origin and Path(spec.origin).is_file():
        files = [Path(spec.origin)]
    else:
        return None
    if len(files) > MAX_PACKAGE_FILES:
        return None
    roots = [Path(d) for d in spec.submodule_search_locations or ()] or [Path(spec.origin).parent]
    h = hashlib.sha256()
    try:
        for f in sorted(files):
            if not f.is_file():  # an editor's lock link (.#models.py), a folder named *.py
                continue
            # by its place in the package, not its absolute path: a clone elsewhere is the same code
            h.update(str(next((f.relative_to(r) for r in roots if f.is_relative_to(r)), f.name)).encode())
            h.update(f.read_bytes())
    except OSError:  # a file that cannot be read: the code is unknown, and the baseline never reused
        return None
    return h.hexdigest()


def user_code(cfg) -> dict:
    """A fingerprint of the user's model and data code, for the sections that name it (class_path): two
    searches with one config and another model behind ``model=`` (or an edited package) reused each other's
    baseline. A factory whose code cannot be read gets a fresh token: its baseline is never reused."""
    import uuid

    from triaccel.userref import CALLABLES, is_callable_ref

    out = {}
    for section in ("model", "data"):
        ref = getattr(cfg, section).class_path
        if ref is None:
            continue
        if is_callable_ref(ref):
            fn = CALLABLES.get(ref)
            code = _code_of(fn) if fn is not None else None
        else:
            code = _package_code(ref)
        out[section] = hashlib.sha256(code.encode()).hexdigest() if code is not None else f"unread-{uuid.uuid4()}"
    return out


# a data folder beyond these gets no fingerprint (said in one line): its baselines are never reused
MAX_DATA_FILES = 500_000
MAX_DATA_WALK_S = 20.0
# torchvision's CIFAR folders under data_dir: the files a run reads, not the rest of a shared data root
CIFAR_FOLDERS = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python"}


@functools.lru_cache(maxsize=32)
def _files_fingerprint(path: str) -> str | None:
    """A hash of every file under ``path`` (or of the file itself), linked folders followed as the image
    loader follows them: each file's path below ``path``, size and modification time, so that an added,
    removed, replaced or edited file changes it. None where it cannot be read whole or is beyond
    MAX_DATA_FILES / MAX_DATA_WALK_S. Cached: a search's baselines share their data, and a walk of CIFAR-10's
    60 000 JPEGs takes a second; ``run_baselines`` clears it, so each search reads the files as they are then."""
    import os
    import time

    root = Path(path)
    h, n, t0, seen = hashlib.sha256(), 0, time.monotonic(), set()
    try:
        if root.is_file():
            st = root.stat()
            h.update(f"{root.name}|{st.st_size}|{st.st_mtime_ns}\n".encode())
            return h.hexdigest()
        for d, dirs, files in os.walk(root, onerror=_raise, followlinks=True):
            real = os.path.realpath(d)
            if real in seen:  # a link back up the tree: walked once
                dirs[:] = []
                continue
            seen.add(real)
            dirs.sort()
            for f in sorted(files):
                n += 1
                if n > MAX_DATA_FILES or (n % 4096 == 0 and time.monotonic() - t0 > MAX_DATA_WALK_S):
                    raise OSError("too many files")
                full = os.path.join(d, f)
                try:
                    st = os.stat(full)
                except FileNotFoundError:  # a dangling link: no data, but part of the folder as it is
                    st = os.lstat(full)
                h.update(f"{os.path.relpath(full, root)}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    except OSError:
        pass
    else:
        return h.hexdigest()
    print(f"baselines: {path} cannot be read whole within {MAX_DATA_FILES} files and {MAX_DATA_WALK_S:g} s: "
          f"its baselines are measured, never reused", flush=True)
    return None


def clear_file_fingerprints() -> None:
    _files_fingerprint.cache_clear()


def _raise(e: OSError):
    raise e


def _existing(value: str) -> Path | None:
    """The resolved file or folder a string names, or None: no such path, not a path at all (a NUL, too
    long, ``~user`` of no user), or a folder too broad to be data (the file system's root, the home or
    working folder or one above them, which hold the search's own store)."""
    if not value:
        return None
    try:
        p = Path(value).expanduser().resolve()
        if not p.exists():
            return None
        broad = {Path("/").resolve(), Path.home().resolve(), Path.cwd().resolve()}
    except (OSError, ValueError, RuntimeError):
        return None
    if p.is_dir() and any(p == b or p in b.parents for b in broad):
        return None
    return p


def _named_paths(value) -> list[Path]:
    """The existing files and folders a config value names: a string, or the strings in a list or dict."""
    if isinstance(value, str):
        p = _existing(value)
        return [p] if p is not None else []
    if isinstance(value, dict):
        return [p for v in value.values() for p in _named_paths(v)]
    if isinstance(value, (list, tuple)):
        return [p for v in value for p in _named_paths(v)]
    return []


def named_paths(cfg) -> dict:
    """The existing files and folders a run's settings name, by setting: ``data.data_dir`` (for CIFAR, its
    torchvision folder; a factory reads no data_dir) and the paths in the model's and data's ``init_args``."""
    named = {}
    if cfg.data.class_path is None and cfg.data.data_dir:
        d = cfg.data.data_dir
        if cfg.data.name in CIFAR_FOLDERS:
            d = str(Path(d).expanduser() / CIFAR_FOLDERS[cfg.data.name])
        named["data.data_dir"] = _named_paths(d)
    for section in ("model", "data"):
        for key, value in (getattr(cfg, section).init_args or {}).items():
            named[f"{section}.init_args.{key}"] = _named_paths(value)
    return named


def data_files(cfg) -> dict:
    """A fingerprint of the data on disk that a run reads: ``data.data_dir`` (for CIFAR, its torchvision
    folder) and every existing path the model's and data's ``init_args`` name (a user's factory reading its
    own files). Keyed by the setting that names it; a folder that cannot be read whole gets a fresh token,
    said in one line, so its baseline is never reused."""
    import uuid

    out = {}
    for setting, paths in named_paths(cfg).items():
        for i, p in enumerate(paths):
            fp = _files_fingerprint(str(p))
            out[setting + (f"[{i}]" if len(paths) > 1 else "")] = fp if fp is not None else f"unread-{uuid.uuid4()}"
    return out


def reuse_key(cfg) -> str:
    """The hash two baseline runs share exactly when one's figures stand for the other's."""
    doc = {"settings": settings(cfg), "device": device_model(cfg.device), **versions()}
    if code := user_code(cfg):  # the shipped models and data: their code is the project's (versions)
        doc["user_code"] = code
    if cfg.data.class_path is not None:  # what the user's factory returned, wherever it read it from; first:
        from triaccel.userdef import data_fingerprint  # a factory that fetches its files has them after this

        doc["data_content"] = data_fingerprint(cfg.data)
    if files := data_files(cfg):  # the shipped data sets without a folder (digits, the corpora): none
        doc["data_files"] = files
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:32]


def rekey(c, run_id: str, cfg, key: str, named_before: dict) -> None:
    """Key a baseline trained here by the data as its run left it, where the run made a path its settings
    name (``named_before``: ``named_paths`` before it ran): it fetched its data (``download: true``, a
    factory making its folder), read what is there now, and ``key`` saw none of it. The next search's key
    sees it. Otherwise nothing is read again (a walk of a large folder takes seconds)."""
    if named_paths(cfg) == named_before:
        return
    clear_file_fingerprints()
    after = reuse_key(cfg)
    if after != key:
        c.set_tag(run_id, KEY_TAG, after)


def find_source(c, exp: str, key: str, search: str, epochs: int) -> dict | None:
    """The most efficient finished, complete baseline run of ``key`` in another search, as a plain row (the
    newest of equals). Another search's trials on the same machine or cluster only slow a baseline or grow its
    peak, never the other way: the best measurement is the least disturbed one, and the hardest reference to
    beat."""
    from triaccel.search.results import is_complete

    runs = c.search_runs([exp], filter_string=f"tags.`{KEY_TAG}` = '{key}' and tags.`triaccel.role` = 'baseline' "
                                              f"and attributes.status = 'FINISHED'",
                         order_by=["attributes.start_time DESC"], max_results=50)
    rows = [{"run_id": r.info.run_id, "status": r.info.status, "metrics": dict(r.data.metrics),
             "tags": dict(r.data.tags), "params": dict(r.data.params), "start_time": r.info.start_time}
            for r in runs if r.data.tags.get("triaccel.search") != search]

    def rank(row):
        eff = row["metrics"].get("efficiency", float("nan"))
        return (eff if eff == eff else float("-inf"), row["start_time"])  # NaN: last

    return max((row for row in rows if is_complete(row, epochs)), key=rank, default=None)


def origin(src: dict) -> tuple[str, str, str]:
    """(run id, search, date) of the run that trained the figures (a reused run points at its own source)."""
    t = src["tags"]
    if t.get(REUSED_FROM):
        return t[REUSED_FROM], t.get(REUSED_SEARCH, "?"), t.get(REUSED_DATE, "?")
    date = datetime.datetime.fromtimestamp(src["start_time"] / 1000).isoformat(timespec="seconds")
    return src["run_id"], t.get("triaccel.search", "?"), date


def copy_run(c, exp: str, src: dict, tags: dict, run_name: str) -> str:
    """A new FINISHED run holding ``src``'s params and every metric's full history, with ``tags``."""
    from mlflow.entities import Metric, Param

    keep = {k: v for k, v in src["tags"].items() if k in ("device", "mode", "mem_source", "git_revision")}
    run = c.create_run(exp, run_name=run_name, tags={**keep, **tags})
    rid = run.info.run_id
    params = [Param(k, v) for k, v in src["params"].items()]
    for i in range(0, len(params), 100):
        c.log_batch(rid, params=params[i:i + 100])
    hist = [Metric(m.key, m.value, m.timestamp, m.step) for k in src["metrics"]
            for m in c.get_metric_history(src["run_id"], k)]
    for i in range(0, len(hist), 1000):
        c.log_batch(rid, metrics=hist[i:i + 1000])
    c.set_terminated(rid, status="FINISHED")
    return rid


def reuse(c, exp: str, search: str, label: str, cfg, tags: dict, epochs: int) -> dict | None:
    """Log ``label`` of ``search`` as a copy of a matching earlier baseline; its metrics, or None
    where the store holds none. ``tags``: the baseline run's own tags (parent, role, label...)."""
    src = find_source(c, exp, tags[KEY_TAG], search, epochs)
    if src is None:
        return None
    rid, where, date = origin(src)
    tags = {**{k: v for k, v in tags.items() if k != "parent"}, "mlflow.parentRunId": tags["parent"],
            REUSED_FROM: rid, REUSED_SEARCH: where, REUSED_DATE: date}
    copy_run(c, exp, src, tags, f"{search}-{label}")
    print(f"baseline {label}: reused from search '{where}' run {rid} ({date}); same settings, device and "
          f"versions (--fresh-baselines trains it again)", flush=True)
    return src["metrics"]


def reused_lines(baselines: list[dict]) -> list[str]:
    """The summary's word on each reused baseline: where its figures came from."""
    return [f"  base {b['tags'].get('triaccel.baseline', '?')}: reused from search "
            f"'{b['tags'].get(REUSED_SEARCH, '?')}' run {b['tags'][REUSED_FROM]} ({b['tags'].get(REUSED_DATE, '?')})"
            for b in baselines if b["tags"].get(REUSED_FROM)]


def provenance(row: dict) -> dict:
    """For an export's provenance: where a reused reference baseline's figures were measured."""
    t = row.get("tags", {})
    if not t.get(REUSED_FROM):
        return {}
    return {"reused_from": {"mlflow_run_id": t[REUSED_FROM], "search": t.get(REUSED_SEARCH), "date": t.get(REUSED_DATE)}}

