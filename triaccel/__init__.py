"""Tri-Accel Search: a self-adapting training loop and a search service for its thresholds."""
__version__ = "0.1.0"


def __getattr__(name):
    # the API on first use: `import triaccel` stays cheap (torch, Ray and MLflow load when a function needs them)
    if name == "search":  # the package triaccel.search, callable as the API's search (search/__init__.py)
        import importlib

        return importlib.import_module("triaccel.search")
    if name in ("train", "resume", "extend", "TrainResult", "SearchResult"):
        from triaccel import api

        return getattr(api, name)
    if name == "DataSplits":
        from triaccel.userdef import DataSplits

        return DataSplits
    if name == "load_model":
        from triaccel.saving import load_model

        return load_model
    raise AttributeError(f"module 'triaccel' has no attribute {name!r}")


__all__ = ["train", "search", "resume", "extend", "load_model", "DataSplits", "TrainResult", "SearchResult"]
