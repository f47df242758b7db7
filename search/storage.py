"""``--storage PATH_OR_URI``: where Tune's state and the searches' own state live, for one command.

Every command that reads or writes a search (search, resume, extend, export, searches) takes it,
so a search started in one working folder is resumed, extended or exported from any other (or
from another machine, through a shared folder). It sets the root ``state.tune_root()`` reads
(TRIACCEL_TUNE_DIR), absolute; the MLflow store is recorded absolute in each search's state, so
the working folder never decides which store is read. A ``file://`` URI names a folder; other
URIs (s3://, gs://...) are refused in one line: the search's state file, listing and locks are
read as files, through the OS.
"""
from __future__ import annotations

import os
from pathlib import Path

from triaccel.errors import ConfigError


def storage_root(value: str) -> Path:
    """The folder ``--storage`` names (checked, not created)."""
    if not value.strip():
        raise ConfigError(f"--storage {value!r}: empty; give a folder (or file:// URI) for the searches' state")
    raw = value
    if "://" in value:
        scheme, _, rest = value.partition("://")
        if scheme.lower() != "file":
            raise ConfigError(f"--storage {raw}: {scheme}:// is not supported (the search's own state is read as "
                              f"files): give a folder, a shared one to reach it from other machines, or file://PATH")
        value = rest
        if not value.startswith("/"):
            raise ConfigError(f"--storage {raw}: a file:// URI needs an absolute path (file:///folder)")
    p = Path(value).expanduser().resolve()
    if p.exists() and not p.is_dir():
        raise ConfigError(f"--storage {raw}: is a file, not a folder")
    return p


def use_storage(value: str | None) -> None:
    """Make ``--storage`` the root of this command's searches (nothing is created here)."""
    if value is not None:
        os.environ["TRIACCEL_TUNE_DIR"] = str(storage_root(value))
