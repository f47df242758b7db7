"""Search spaces shipped with Tri-Accel Search (YAML files)."""
