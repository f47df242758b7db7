"""Errors that the CLI turns into one clear line and a non-zero exit (never a traceback)."""


class TriAccelError(Exception):
    """Base class: a user-facing problem (bad input, missing data), not a bug."""


class ConfigError(TriAccelError):
    """A config or search-space value is wrong; the message names the key (and file)."""


class Interrupted(TriAccelError):
    """The user stopped the work (Ctrl-C) before it finished; the message says how to continue it."""


class DataError(TriAccelError):
    """A dataset cannot be found or read; the message names the path or file."""
