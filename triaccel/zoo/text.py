"""Character-level language-model data from a corpus that ships with the install.

``char_corpus(corpus="shakespeare", block_size=128)`` is a data factory (``data.class_path:
triaccel.zoo.text.char_corpus``): it returns the train / val / test splits as TensorDatasets of
(inputs int64 [N, T], targets int64 [N, T]) and ``meta`` with the vocabulary size.

- Tokens: one per character; the vocabulary is the corpus's distinct characters, sorted (Tiny
  Shakespeare: 65), so token ids are the same in every run and on every machine.
- Splits by position, never shuffled: the first ``1 - val_fraction - test_fraction`` of the
  text trains, the next ``val_fraction`` validates, the last ``test_fraction`` tests. A window
  never crosses a split boundary, targets included, so no validation or test character is ever
  an input or a target of training.
- Examples: windows of ``block_size`` tokens, inputs t..t+T-1 and targets t+1..t+T. Training
  windows start every ``stride`` characters (default ``block_size``: non-overlapping windows that
  cover the training text once; a larger stride leaves gaps and makes a shorter epoch, for CPU
  runs and tests). Validation and test windows are always non-overlapping, so each of their
  characters after the first is predicted exactly once and the next-token accuracy is over a fixed
  set of positions for every run with the same block size.
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset

from triaccel.errors import ConfigError, DataError

CORPORA_DIR = Path(__file__).resolve().parent / "corpora"
CORPORA = {"shakespeare": "tinyshakespeare.txt"}  # name -> file in CORPORA_DIR (see its NOTICE.md)
MAX_BLOCK_SIZE = 8192  # tokens per window: far above what the shipped corpus's validation span can check
KEY = "data.init_args"  # how the config names this factory's arguments


@functools.lru_cache(maxsize=4)
def load_corpus(name: str) -> tuple[str, np.ndarray]:
    """(vocabulary as one string of sorted characters, token ids uint8 [len(text)]) of a shipped corpus.
    The shipped corpora are ASCII: one byte is one character, so the ids come from the bytes directly."""
    if name not in CORPORA:
        raise ConfigError(f"{KEY}.corpus: unknown corpus {name!r} (shipped: {', '.join(sorted(CORPORA))})")
    path = CORPORA_DIR / CORPORA[name]
    try:
        raw = np.frombuffer(path.read_bytes(), dtype=np.uint8)
    except OSError as e:
        raise DataError(f"{path}: cannot read the {name} corpus ({e.strerror or e}); reinstall triaccel") from None
    if raw.size == 0 or raw.max() > 127:
        raise DataError(f"{path}: not the shipped ASCII corpus (empty, or bytes above 127); reinstall triaccel")
    chars = np.unique(raw)  # sorted byte values: the sorted characters
    table = np.zeros(128, dtype=np.uint8)
    table[chars] = np.arange(len(chars), dtype=np.uint8)
    ids = table[raw]
    ids.flags.writeable = False
    return bytes(chars.tolist()).decode("ascii"), ids


def encode(text: str, vocab: str) -> torch.Tensor:
    index = {c: i for i, c in enumerate(vocab)}
    try:
        return torch.tensor([index[c] for c in text], dtype=torch.int64)
    except KeyError as e:
        raise ValueError(f"character {e.args[0]!r} is not in the vocabulary") from None


def decode(ids, vocab: str) -> str:
    return "".join(vocab[int(i)] for i in ids)


def split_bounds(n: int, val_fraction: float, test_fraction: float) -> tuple[int, int]:
    """(end of train, end of val) in characters: train [0, a), val [a, b), test [b, n)."""
    n_val, n_test = int(n * val_fraction), int(n * test_fraction)
    return n - n_val - n_test, n - n_test


def windows(ids: np.ndarray, block_size: int, stride: int) -> TensorDataset:
    """Windows starting at 0, stride, 2 stride, ... whose inputs and targets (one token later) lie in ``ids``."""
    n_win = (len(ids) - block_size - 1) // stride + 1 if len(ids) > block_size else 0
    starts = np.arange(n_win, dtype=np.int64)[:, None] * stride
    pos = starts + np.arange(block_size + 1, dtype=np.int64)[None, :]
    seq = torch.from_numpy(ids[pos].astype(np.int64))
    return TensorDataset(seq[:, :-1].contiguous(), seq[:, 1:].contiguous())


def _check(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"{KEY}.{key}: {msg}")


def _number(v, key: str, integer: bool) -> None:
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    _check(ok and not isinstance(v, bool), key, f"must be {'an integer' if integer else 'a number'}, got {v!r}")


def char_corpus(corpus: str = "shakespeare", block_size: int = 128, stride: int | None = None,
                val_fraction: float = 0.05, test_fraction: float = 0.05) -> dict:
    """The splits of ``corpus`` as character windows (module docstring); a mapping with train, val,
    test and meta = {vocab_size, num_classes, block_size}."""
    _check(isinstance(corpus, str), "corpus", f"must be a corpus name, got {corpus!r}")
    _number(block_size, "block_size", integer=True)
    _check(1 <= block_size <= MAX_BLOCK_SIZE, "block_size", f"must be in [1, {MAX_BLOCK_SIZE}], got {block_size}")
    stride = block_size if stride is None else stride
    _number(stride, "stride", integer=True)
    _check(stride >= 1, "stride", f"must be >= 1 (null: block_size), got {stride}")
    _number(val_fraction, "val_fraction", integer=False)
    _number(test_fraction, "test_fraction", integer=False)
    _check(0 < val_fraction < 0.5, "val_fraction", f"must be in (0, 0.5), got {val_fraction}")
    _check(0 <= test_fraction < 0.5, "test_fraction", f"must be in [0, 0.5), got {test_fraction}")
    vocab, ids = load_corpus(corpus)
    a, b = split_bounds(len(ids), val_fraction, test_fraction)
    spans = {"train": (ids[:a], stride), "val": (ids[a:b], block_size), "test": (ids[b:], block_size)}
    out = {}
    for split, (part, step) in spans.items():
        if split == "test" and test_fraction == 0:
            out[split] = None
            continue
        ds = windows(part, block_size, step)
        fraction = {"train": "the rest", "val": "val_fraction", "test": "test_fraction"}[split]
        _check(len(ds) > 0, "block_size", f"{block_size} leaves no {split} window: the {split} split "
                                          f"({fraction}) holds {len(part)} characters of {corpus}")
        out[split] = ds
    out["meta"] = {"vocab_size": len(vocab), "num_classes": len(vocab), "block_size": block_size}
    return out
