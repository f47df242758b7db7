"""Searched values (search/params.py, search/space.py) end to end: list-valued choices, values the
command refuses in one line, a searched section. Real subprocesses, real local Ray, a real sqlite
MLflow store."""
import os

import pytest
import yaml

from _harness import SPACE, cli, run_search, runs, with_store


@pytest.mark.slow
def test_list_valued_choices_search_end_to_end(tmp_path):
    """optim.betas is a pair, so a categorical over it has list choices: the search runs, the summary
    and the parent's plot show them, the parent run finishes and the export trains as it is."""
    with_store(tmp_path)  # a copy of the migrated template (the store's creation: elsewhere)
    from triaccel.config import load_config

    betas = [[0.9, 0.999], [0.8, 0.99]]
    space = dict(SPACE, trials=2, params={**SPACE["params"],
                                          "optim.betas": {"distribution": "categorical", "choices": betas}})
    space["train"] = dict(SPACE["train"], optim={"name": "adamw", "lr": 0.005, "warmup_epochs": 1})
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    r = cli("search", "--space", "space.yaml", "--name", "b", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "UserWarning" not in r.stderr
    table = r.stdout[r.stdout.index("\nsearch 'b':") + 1:]
    assert "betas" in table.splitlines()[1] and any(str(b) in table for b in betas)
    c, parents = runs(tmp_path, "b", role="parent")
    assert [p.info.status for p in parents] == ["FINISHED"]
    assert "trials_vs_params.png" in {a.path for a in c.list_artifacts(parents[0].info.run_id)}
    _, trials = runs(tmp_path, "b", role="trial")
    assert len(trials) == 2 and all(t.info.status == "FINISHED" for t in trials)
    import json

    assert all(json.loads(t.data.tags["triaccel.values"])["optim.betas"] in betas for t in trials)
    r = cli("export", "b", "--out", "tuned.yaml", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert list(load_config(tmp_path / "tuned.yaml").optim.betas) in betas


@pytest.mark.slow
@pytest.mark.parametrize("args,space,line", [
    (["--name", ""], {}, "--name '': use 1 to 100 letters, digits, '-' and '_'"),  # was: the space's name, silently
    (["--name", "a/b"], {}, "--name 'a/b': use 1 to 100 letters, digits, '-' and '_'"),
    (["--name", ".."], {}, "--name '..': use 1 to 100 letters, digits, '-' and '_'"),
    ([], {"name": "../x"}, "space.yaml: name '../x': use 1 to 100 letters, digits, '-' and '_'"),
    ([], {"seed": -1}, "space.yaml: seed: must be in [0, 2**32) (the samplers' seed range)"),
    ([], {"cpus_per_trial": 1e9}, "space.yaml: cpus_per_trial: 1e+09 is more than this machine's {cpus} CPUs: "
                                  "no trial could start"),  # Tune waited for it forever
    (["--trials", str(10**30)], {}, "--trials: invalid value 1000000000000000000000000000000 (must be in [1, 10000])"),
    (["--gpus-per-trial", "nan"], {}, "--gpus-per-trial: invalid value nan (must be in (0, 8])"),
])
def test_bad_search_values_are_one_line_and_write_nothing(tmp_path, args, space, line):
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(dict(SPACE, **space)))
    r = run_search(tmp_path, "--space", "space.yaml", *args)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.strip().splitlines() == [f"triaccel: error: {line.format(cpus=os.cpu_count())}"]
    assert not (tmp_path / "mlruns").exists()


@pytest.mark.parametrize("key,spec,example", [
    ("triaccel.batch", {"distribution": "categorical", "choices": [{"min_batch": 16}, {"min_batch": 32}]},
     "params.triaccel.batch.min_batch: {distribution: categorical, choices: [16, 32]}"),
    ("optim", {"distribution": "categorical", "choices": [{"lr": 0.1}, {"lr": 0.01, "momentum": 0.8}]},
     "params.optim.lr: {distribution: categorical, choices: [0.1, 0.01]}"),
    ("triaccel.precision", {"distribution": "categorical", "choices": [{}, {"tau_low": 1.0}]},
     "params.triaccel.precision.KEY"),
])
def test_a_searched_section_is_refused_not_replaced(tmp_path, key, spec, example):
    """A categorical over mappings at a section's key replaced the section: its other keys (budget_gb fixed in
    train:, the defaults) were dropped from every trial while the summary and provenance.searched showed the
    mapping as if merged. A new search refuses it in one line naming the key; a saved search's space is read
    as it was accepted (its export writes what its trials trained)."""
    from triaccel.errors import ConfigError
    from triaccel.search.space import parse_space

    space = dict(SPACE, params={key: spec})
    with pytest.raises(ConfigError) as ei:
        parse_space(space, source="s.yaml", strict=True)
    assert str(ei.value) == (f"s.yaml: params.{key}: names a section, not a key: a searched value would replace "
                             f"the whole section (its other keys dropped); search the section's keys themselves, "
                             f"e.g. {example}")
    parse_space(space, source="s.yaml")
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    r = cli("search", "--space", "space.yaml", cwd=tmp_path, timeout=600)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]
    assert f"params.{key}: names a section" in r.stderr and not (tmp_path / "mlruns").exists()
