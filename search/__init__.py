"""The search service: Ray Tune + Optuna over the Tri-Accel thresholds, logged to MLflow."""
