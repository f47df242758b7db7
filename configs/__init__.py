"""Training configs shipped with Tri-Accel Search (YAML files)."""
