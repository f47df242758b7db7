"""The shared harness in tests/conftest.py: the template MLflow store is a real, migrated store
that MLflow opens without migrating again."""
import shutil

from conftest import template_store


def test_a_copy_of_the_template_is_a_store_mlflow_opens_without_migrating(tmp_path, monkeypatch):
    import mlflow.store.db.utils as db_utils
    from mlflow.tracking import MlflowClient

    shutil.copyfile(template_store(), tmp_path / "mlflow.db")

    def no_migrations(engine):
        raise AssertionError("a copy of the template was migrated again")

    monkeypatch.setattr(db_utils, "_initialize_tables", no_migrations)
    c = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    exp = c.create_experiment("x")
    run = c.create_run(exp)
    c.log_metric(run.info.run_id, "m", 1.0)
    assert [m.value for m in c.get_metric_history(run.info.run_id, "m")] == [1.0]
