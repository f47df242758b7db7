"""Reading a config: YAML files and ``--set`` overrides (strict: no key twice, bounded size and
depth), and the generic dict <-> dataclass conversion every section goes through. Every failure is
one ``ConfigError`` line that names the dotted key or the file. The sections themselves, and
``load_config``, are in ``triaccel.config``.
"""
from __future__ import annotations

import dataclasses
import math
import typing
from pathlib import Path
from typing import Any, Callable, Literal, Union, get_args, get_origin

import yaml

from triaccel.errors import ConfigError


def check(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"{key}: {msg}")


# section class -> what fills its data in before conversion (triaccel.config registers TriAccelConfig's policy)
PREPARE: dict[type, Callable[[dict], dict]] = {}


# --------------------------------------------------------------------------- conversion
def _type_name(tp) -> str:
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin is Union:
        args = [a for a in get_args(tp) if a is not type(None)]
        if value is None:
            check(type(None) in get_args(tp), key, "must not be null")
            return None
        return _coerce(value, args[0], key)
    if origin is Literal:
        choices = get_args(tp)
        check(value in choices, key, f"must be one of {', '.join(map(str, choices))}; got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        check(isinstance(value, dict), key, f"must be a mapping, got {type(value).__name__}")
        return from_dict(tp, value, prefix=key + ".")
    if tp is bool:
        check(isinstance(value, bool), key, f"must be true or false, got {value!r}")
        return value
    if tp is int:
        check(isinstance(value, int) and not isinstance(value, bool), key, f"must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads "1e-7" as a string
            try:
                value = float(value)
            except ValueError:
                pass
        check(isinstance(value, (int, float)) and not isinstance(value, bool), key, f"must be a number, got {value!r}")
        try:
            f = float(value)
        except OverflowError:  # an integer too large for a float (400 digits)
            raise ConfigError(f"{key}: must be a number within float32's range (|x| <= {FLOAT32_MAX:.3g}), "
                              f"got an integer of about {int(value.bit_length() * 0.30103) + 1} digits") from None
        # within float32's range: torch takes these as float32 scalars (lr=1e300 fails at step one);
        # inf and nan are left to each key's own check (some keys take inf: "never")
        check(not math.isfinite(f) or abs(f) <= FLOAT32_MAX, key,
               f"must be a number within float32's range (|x| <= {FLOAT32_MAX:.3g}), got {value!r}")
        return f
    if tp is str:
        check(isinstance(value, str), key, f"must be a string, got {value!r}")
        return value
    if tp is tuple or origin is tuple:
        check(isinstance(value, (list, tuple)), key, f"must be a list, got {value!r}")
        return tuple(value)
    if tp is dict or origin is dict:
        check(isinstance(value, dict), key, f"must be a mapping, got {value!r}")
        return value
    raise ConfigError(f"{key}: unsupported type {_type_name(tp)}")


def did_you_mean(name, valid) -> str:
    """', did you mean X?' for the nearest valid name where one is near (a typo), else ''."""
    import difflib

    near = difflib.get_close_matches(str(name), sorted(valid), n=1, cutoff=0.75)
    return f", did you mean {near[0]}?" if near else ""


def unknown_key(key, valid) -> str:
    """The words for a key no section has: the nearest valid key where one is near (a typo), then all."""
    return f"unknown key{did_you_mean(key, valid)} (valid: {', '.join(sorted(valid))})"


def from_dict(cls, data: dict, prefix: str = ""):
    """Build dataclass ``cls`` from ``data``; every failure names the dotted key."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: must be a mapping")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for k in data:
        if k not in names:
            beside = ("class_path" in names and data.get("class_path") is not None and "init_args" in names
                      and not did_you_mean(k, names))
            # a factory's argument written beside its path, as Hydra and Lightning's CLI write it
            hint = f"; {prefix}class_path's arguments go in {prefix}init_args ({prefix}init_args.{k})" if beside else ""
            raise ConfigError(f"{prefix}{k}: {unknown_key(k, names)}{hint}")
    if cls in PREPARE:  # a section whose keys fill in others (triaccel.policy)
        data = PREPARE[cls](data)
    kwargs = {k: _coerce(v, hints[k], prefix + k) for k, v in data.items()}
    try:
        obj = cls(**kwargs)
    except TypeError as e:  # pragma: no cover - guarded by the checks above
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: {e}") from None
    # nan and inf pass most range checks (inf >= 0): optim.warmup_epochs=.inf would overflow in the
    # trainer, optim.weight_decay=inf trains to a nan loss. After the section's own
    # checks, so a key with its own wording (optim.lr) keeps it.
    for k, v in kwargs.items():
        if isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(f"{prefix}{k}: must be a finite number, got {v}")
    return obj


def to_dict(cfg) -> dict:
    def conv(v):
        if isinstance(v, tuple):
            return list(v)
        if isinstance(v, dict):
            return {k: conv(x) for k, x in v.items()}
        if isinstance(v, list):
            return [conv(x) for x in v]
        return v
    return conv(dataclasses.asdict(cfg))


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def set_dotted(d: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    cur = d
    for p in parts[:-1]:
        nxt = cur.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"{dotted}: {p} is not a section")
        cur = nxt
    cur[parts[-1]] = value


def parse_overrides(items: list[str]) -> list[tuple[str, Any]]:
    out = []
    for item in items or []:
        if "=" not in item:
            raise ConfigError(f"--set {item}: expected key=value")
        k, v = item.split("=", 1)
        if not all(part.strip() for part in k.split(".")):  # `--set =5`, `--set .epochs=1`: an empty key part
            raise ConfigError(f"--set {item}: expected key=value with a dotted key such as optim.lr=0.1")
        if not v.strip():  # an unset shell variable (`--set model.class_path=$REF`): not a silent null
            raise ConfigError(f"--set {k.strip()}=: no value (write {k.strip()}=null to set it to null)")
        try:
            value = yaml.safe_load(v)
        except yaml.YAMLError:
            raise ConfigError(f"--set {item[:80]}: value is not valid YAML") from None
        except RecursionError:
            value = TOO_DEEP
        problem = _yaml_problem(value)
        if problem:
            raise ConfigError(f"--set {k.strip()}: value {problem}")
        out.append((k.strip(), value))
    return out


TOO_DEEP = object()
MAX_YAML_DEPTH = 64  # a config nests 4 levels; deeper nesting would hit Python's recursion limit
# a config holds ~150 values, an exported one with its provenance a few hundred; nine levels of anchors
# of nine aliases each ("billion laughs") expand to 387 million, which the walk below would take minutes over
MAX_YAML_VALUES = 100_000
FLOAT32_MAX = 3.4028234663852886e38


def _yaml_problem(value) -> str | None:
    """What makes a loaded YAML value unusable as config (too deep to load, or a shape it cannot hold), or None."""
    return f"nested more than {MAX_YAML_DEPTH} levels deep" if value is TOO_DEEP else _shape_problem(value)


def _shape_problem(data: Any) -> str | None:
    """What makes ``data`` no config: nested deeper than MAX_YAML_DEPTH, or more than MAX_YAML_VALUES
    values once aliases are expanded (walked without recursion, stopping at the limit)."""
    stack = [(data, 0)]
    seen = 0
    while stack:
        d, depth = stack.pop()
        seen += 1
        if seen > MAX_YAML_VALUES:
            return f"expands to more than {MAX_YAML_VALUES:,} values (anchors repeated inside anchors?)"
        if isinstance(d, (dict, list)):
            if depth >= MAX_YAML_DEPTH:
                return f"nested more than {MAX_YAML_DEPTH} levels deep"
            stack.extend((v, depth + 1) for v in (d.values() if isinstance(d, dict) else d))
    return None


MAX_YAML_BYTES = 16 * 2**20  # a config or space is a few KiB


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key, first: int, second: int):
        super().__init__(f"{key} given twice")
        self.key, self.first, self.second = key, first, second


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping: PyYAML keeps the last silently, so
    `epochs: 1` ... `epochs: 50` would train 50 epochs and a space's second `params` entry for a key would
    replace the first without a word. Merge keys (``<<: *base``) may still be overridden."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for k, _ in node.value:
                if k.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(k, deep=True)
                try:
                    if key in seen:
                        raise _DuplicateKey(key, seen[key], k.start_mark.line + 1)
                    seen[key] = k.start_mark.line + 1
                except TypeError:  # an unhashable key: SafeLoader's own error says so
                    pass
        return super().construct_mapping(node, deep)


def path_kind(p: Path) -> tuple[bool, bool, bool]:
    """(is a folder, exists, is a link) of ``p``; a path the system will not look at (a name over 255
    bytes, a folder on the way that cannot be entered) is one line naming it, not an OSError traceback
    (pathlib swallows only 'no such file' and its kin)."""
    try:
        return p.is_dir(), p.exists(), p.is_symlink()
    except OSError as e:
        raise ConfigError(f"{p}: cannot read it ({e.strerror or e})") from None


def read_yaml(path: str | Path) -> dict:
    p = Path(path)
    is_dir, exists, is_link = path_kind(p)
    if is_dir:  # a folder that is there is no YAML file, not a missing one
        raise ConfigError(f"{p}: is a folder, not a YAML file")
    if not exists:
        if is_link:  # a link loop or a dangling link: the link is there, its target is not
            raise ConfigError(f"{p}: a symbolic link that leads to no file (a loop, or its target is missing)")
        raise ConfigError(f"{p}: no such file")
    try:
        # not only regular files: `--config <(sed ... c.yaml)` and other pipes (/dev/fd/N, a FIFO) are
        # read too; read once (a pipe cannot be read twice), and never without end (/dev/zero)
        with open(p, "rb") as f:
            raw = f.read(MAX_YAML_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"{p}: cannot read it ({e.strerror or e})") from None
    if len(raw) > MAX_YAML_BYTES:
        raise ConfigError(f"{p}: more than {MAX_YAML_BYTES // 2**20} MiB: not a config file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p}: not a YAML text file (not UTF-8: byte 0x{raw[e.start]:02x} at offset {e.start})") \
            from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)
    except _DuplicateKey as e:
        raise ConfigError(f"{p}: {e.key} is given twice in one mapping (lines {e.first} and {e.second}): "
                          f"keep one") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise ConfigError(f"{p}: not valid YAML{where}") from None
    except RecursionError:
        data = TOO_DEEP
    problem = _yaml_problem(data)
    if problem:
        raise ConfigError(f"{p}: {problem}: not a config file")
    if data is None:  # an empty file, only comments or `null`: most likely the wrong file, never "all defaults"
        raise ConfigError(f"{p}: is empty (no settings)")
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: top level must be a mapping")
    return data
