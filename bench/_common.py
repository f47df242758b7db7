"""Shared bits of the benchmark scripts: the facts every result file records, and JSON output.

Every result file's ``env`` holds the date, the command, the GPU, the git revision of the
checkout and whether it had uncommitted changes (``git_dirty``), so a figure can be traced
to the code that produced it. Machine paths in the command are written as placeholders
(``$REPO`` for this checkout, ``$HOME``), so files from different machines compare.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def git_state(repo: Path = REPO) -> dict:
    """The checkout's revision and dirty flag; both None outside a git checkout (a copied tree)
    unless ``BENCH_GIT_REV`` (and ``BENCH_GIT_DIRTY=0|1``) name them, as a device copy needs."""
    if os.environ.get("BENCH_GIT_REV"):
        dirty = os.environ.get("BENCH_GIT_DIRTY")
        return {"git_rev": os.environ["BENCH_GIT_REV"], "git_dirty": None if dirty is None else dirty == "1",
                "git_rev_source": "BENCH_GIT_REV"}

    def git(*args):
        r = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=30)
        return r.stdout.strip() if r.returncode == 0 else None

    try:
        rev = git("rev-parse", "--short=7", "HEAD")
        status = git("status", "--porcelain", "--untracked-files=no") if rev else None
    except (OSError, subprocess.SubprocessError):
        rev, status = None, None
    return {"git_rev": rev, "git_dirty": None if status is None else bool(status),
            "git_rev_source": "checkout" if rev else None}


def placeholders(text: str) -> str:
    """Machine paths in ``text`` as placeholders: this checkout as $REPO, the home folder as $HOME."""
    text = text.replace(str(REPO), "$REPO")
    home = os.path.expanduser("~")
    if home not in ("", "/"):
        text = text.replace(home, "$HOME")
    return text


def command() -> str:
    return placeholders(" ".join(["python3"] + sys.argv))


def env() -> dict:
    out = {"date": datetime.date.today().isoformat(), "torch": None, "python": platform.python_version(),
           "command": command(), **git_state()}
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        out["torch"] = torch.__version__
        if os.environ.get("BENCH_GPU"):  # a parent of runs in their own processes, kept off CUDA
            out["gpu"] = os.environ["BENCH_GPU"]
        elif torch.cuda.is_available():
            out["gpu"] = torch.cuda.get_device_name()
        else:
            out["gpu"] = None
            out["note"] = "CPU run: not a GPU figure"
    try:
        import triton

        out["triton"] = triton.__version__
    except Exception:
        pass
    return out


def write(path: str, data: dict) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps({"env": env(), **data}, indent=1))
    print(f"wrote {p}")
