"""``--storage PATH_OR_URI``: where Tune's state and the searches' own state live, for one command.

Every command that reads or writes a search (search, resume, extend, export, searches) takes it,
so a search started in one working folder is resumed, extended or exported from any other (or
from another machine, through a shared folder). It sets the root ``state.tune_root()`` reads
(TRIACCEL_TUNE_DIR), absolute; the MLflow store is recorded absolute in each search's state, so
the working folder never decides which store is read.

A URI is read by pyarrow (``pyarrow.fs.FileSystem.from_uri``), as Tune reads its storage:
- one pyarrow opens as the local file system (``file:///folder``, ``local:///folder``) names
  that folder;
- one pyarrow cannot open (an unknown scheme, a relative ``file://``) is one line, and so is a
  remote one that does not answer within ``REACH_TIMEOUT_S`` (a bucket that does not exist, no
  network, no credentials);
- a remote one that answers (``s3://``, ``gs://``, ``hdfs://``...) is refused in one line: a
  search's state file, listing and one-driver lock (``flock``) are read and locked through the
  OS, so remote storage is used mounted (NFS, s3fs, gcsfuse), as a folder.
Nothing is created here; a refused ``--storage`` writes nothing.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

from triaccel.errors import ConfigError
from triaccel.tracking import first_line

# pyarrow's S3 and GCS clients retry an unreachable endpoint for minutes: a remote URI that has not
# answered by then is reported as unreachable
REACH_TIMEOUT_S = 15.0


def _bounded(fn, raw: str):
    """``fn()``, or one line if it fails or has not answered within REACH_TIMEOUT_S."""
    out: dict = {}

    def call():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - reported below, in one line
            out["error"] = e

    t = threading.Thread(target=call, daemon=True)  # a hung client is left behind; the command ends
    t.start()
    t.join(REACH_TIMEOUT_S)
    if t.is_alive():
        raise ConfigError(f"--storage {raw}: cannot reach it (no answer within {REACH_TIMEOUT_S:.0f} s)")
    e = out.get("error")
    if e is None:
        return out["value"]
    if isinstance(e, OSError):  # pyarrow knows the scheme but could not open it (no network, no such bucket)
        raise ConfigError(f"--storage {raw}: cannot reach it ({first_line(e)})")
    raise ConfigError(f"--storage {raw}: not a file system pyarrow can open ({first_line(e)}); give a folder, "
                      f"file:///folder, or a URI pyarrow reads (s3://, gs://...)")


def _from_uri(raw: str) -> str:
    """The local folder a URI names, through pyarrow's file systems; anything else is a ConfigError."""
    scheme, _, rest = raw.partition(":")
    if scheme.lower() in ("file", "local") and rest.startswith("//") and not rest.startswith("///"):
        raise ConfigError(f"--storage {raw}: a {scheme}:// URI needs an absolute path ({scheme}:///folder)")
    try:
        import pyarrow.fs as pafs
    except ImportError:  # pyarrow comes with ray[tune]; without it only file:///folder is read
        if scheme.lower() != "file" or not rest.startswith("///"):
            raise ConfigError(f"--storage {raw}: only file:///folder can be read without pyarrow") from None
        return rest[2:]
    fs, path = _bounded(lambda: pafs.FileSystem.from_uri(raw), raw)
    if isinstance(fs, pafs.LocalFileSystem):
        return path
    _bounded(lambda: fs.get_file_info(path), raw)
    raise ConfigError(f"--storage {raw}: {scheme}:// answers, but a search keeps its state, listing and "
                      f"one-driver lock as files locked through the OS: mount it (NFS, s3fs, gcsfuse) and give "
                      f"the folder")


def storage_root(value: str) -> Path:
    """The folder ``--storage`` names (checked, not created)."""
    if not value.strip():
        raise ConfigError(f"--storage {value!r}: empty; give a folder (or file:// URI) for the searches' state")
    raw = value
    if "://" in value or value.startswith("file:"):
        value = _from_uri(value)
    p = Path(value).expanduser().resolve()
    if p.exists() and not p.is_dir():
        raise ConfigError(f"--storage {raw}: is a file, not a folder")
    return p


def use_storage(value: str | None) -> None:
    """Make ``--storage`` the root of this command's searches (nothing is created here)."""
    if value is not None:
        os.environ["TRIACCEL_TUNE_DIR"] = str(storage_root(value))
