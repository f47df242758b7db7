"""The shared harness in tests/conftest.py: the template MLflow store is a real, migrated store
that MLflow opens without migrating again, and only default-store searches get a copy."""
import shutil
import sys

import pytest

from conftest import _is_default_store_search, seed_store, template_store


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


def test_only_searches_on_the_default_store_are_seeded(tmp_path):
    py = sys.executable
    assert _is_default_store_search([py, "-m", "triaccel.cli", "search", "--space", "s.yaml"], {"cwd": tmp_path, "env": {}})
    assert not _is_default_store_search([py, "-m", "triaccel.cli", "search"],
                                        {"cwd": tmp_path, "env": {"MLFLOW_TRACKING_URI": "sqlite:///x.db"}})
    assert not _is_default_store_search([py, "-m", "triaccel.cli", "export", "x"], {"cwd": tmp_path, "env": {}})
    assert not _is_default_store_search([py, "-m", "triaccel.cli", "search"], {"env": {}})  # no folder of its own
    assert seed_store(tmp_path) == tmp_path / "mlruns" / "mlflow.db"
    assert seed_store(tmp_path) is None  # an existing store is never replaced
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "mlruns").write_text("a file where the store folder goes")
    assert seed_store(tmp_path / "b") is None


TRUE_AS_SEARCH = ["true", "-m", "triaccel.cli", "search", "--space", "s.yaml"]  # a search's argv; `true` runs it


def test_a_search_subprocess_finds_the_template_copy_in_its_folder(tmp_path):
    import subprocess

    subprocess.run(TRUE_AS_SEARCH, cwd=tmp_path, env={"PATH": "/usr/bin:/bin"}, check=True)
    assert (tmp_path / "mlruns" / "mlflow.db").read_bytes() == template_store().read_bytes()


@pytest.mark.real_store_creation
def test_a_marked_test_gets_no_seeded_store(tmp_path):
    import subprocess

    subprocess.run(TRUE_AS_SEARCH, cwd=tmp_path, env={"PATH": "/usr/bin:/bin"}, check=True)
    assert not (tmp_path / "mlruns").exists()
