"""Tri-Accel Search: a self-adapting training loop and a search service for its thresholds."""
__version__ = "0.1.0"
