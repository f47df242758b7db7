"""Triton kernels, each beside a plain-torch reference (importable as triaccel.kernels)."""
