"""Shared bits of the benchmark scripts: environment facts and JSON output."""
from __future__ import annotations

import datetime
import json
import platform
import sys
from pathlib import Path

import torch


def env() -> dict:
    out = {"date": datetime.date.today().isoformat(), "torch": torch.__version__, "python": platform.python_version(),
           "command": " ".join(["python3"] + sys.argv)}
    if torch.cuda.is_available():
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
