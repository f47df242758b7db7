"""The search service: Ray Tune + Optuna over the Tri-Accel thresholds, logged to MLflow."""

import sys as _sys
import types as _types


class _CallableSearch(_types.ModuleType):
    """``triaccel.search`` is this package and the API's search function at once: importing a
    submodule (triaccel.search.runner) sets the package as the attribute ``search`` of triaccel,
    which a plain function of that name in triaccel/__init__ would lose to."""

    def __call__(self, *args, **kwargs):
        from triaccel.api import search

        return search(*args, **kwargs)


_sys.modules[__name__].__class__ = _CallableSearch
