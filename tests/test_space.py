"""Search spaces: every shipped file loads, bad files are one clear line, constraints hold by construction."""
import random
import subprocess
import sys

import pytest
import yaml

from conftest import ROOT
from triaccel.config import from_dict
from triaccel.errors import ConfigError
from triaccel.search.space import FOLLOWS, FRAC_SUFFIX, load_space, parse_space, start_points

SPACES = sorted((ROOT / "spaces").glob("*.yaml"))


def test_the_four_required_spaces_ship():
    names = {p.stem for p in SPACES}
    assert {"quickstart", "cifar10_resnet18", "cifar10_efficientnet_b0", "cifar100_resnet18"} <= names


@pytest.mark.parametrize("path", SPACES, ids=lambda p: p.name)
def test_every_shipped_space_loads_and_searches_the_paper_keys(path):
    s = load_space(str(path))
    policy = s.train_config({}).triaccel.batch.policy
    # the batch keys each policy reads: the score policy has no rho_low / delta_up (the budget is a cap)
    batch = (("triaccel.batch.rho_high", "triaccel.batch.delta_down", "triaccel.batch.grow_factor")
             if policy == "score" else ("triaccel.batch.rho_low", "triaccel.batch.rho_high",
                                        "triaccel.batch.delta_up", "triaccel.batch.delta_down"))
    for k in ("triaccel.precision.tau_low", "triaccel.precision.tau_high", "triaccel.curvature.tau_curv",
              "triaccel.curvature.alpha") + batch:
        assert k in s.params


@pytest.mark.parametrize("path", SPACES, ids=lambda p: p.name)
def test_every_shipped_start_point_sets_every_searched_key(path):
    """A start point runs "as given": Optuna samples any key it leaves out, and on the H200 one
    shipped point, its batch keys sampled, scored 0.72x to 0.99x of the static reference from one
    search to the next (bench/results/h200_search_bf16.log) where the same point with them set
    scored 1.04x in eight-epoch runs."""
    s = load_space(str(path))
    assert s.start
    for point in start_points(s, None)[0]:  # as written: no reference baseline
        assert set(point) == set(s.optuna_distributions()), sorted(set(s.optuna_distributions()) - set(point))


@pytest.mark.parametrize("path", SPACES, ids=lambda p: p.name)
def test_every_draw_satisfies_the_ordered_pairs(path):
    """1000 draws from each space's Optuna box: tau_low < tau_high and rho_low < rho_high, inside the bounds."""
    s = load_space(str(path))
    rng = random.Random(0)
    dists = s.optuna_distributions()
    for _ in range(1000):
        sample = {}
        for k, d in dists.items():
            if hasattr(d, "choices"):
                sample[k] = rng.choice(d.choices)
            elif type(d).__name__ == "IntDistribution":
                sample[k] = rng.randrange(d.low, d.high + 1, d.step)
            else:
                sample[k] = rng.choice([d.low, d.high, rng.uniform(d.low, d.high)])
        v = s.resolve(sample)
        assert v["triaccel.precision.tau_low"] < v["triaccel.precision.tau_high"]
        if "triaccel.batch.rho_low" in v:
            assert v["triaccel.batch.rho_low"] < v["triaccel.batch.rho_high"]
        for k, p in s.params.items():
            if p.low is not None:
                assert p.low <= v[k] <= p.high, (k, v[k])
        s.train_config(v)  # the trainer accepts every draw


def _space(**params):
    return {"train": {"epochs": 2}, "params": params}


@pytest.mark.parametrize("data,match", [
    ({"train": {}, "params": {"optim.lr": {"distribution": "uniform", "low": 0.1, "high": 0.2}}, "colour": 1},
     "s.yaml: colour: unknown key"),
    (_space(**{"optim.lr": {"distribution": "uniform", "low": 0.3, "high": 0.2}}), "params.optim.lr: low (0.3) > high (0.2)"),
    (_space(**{"optim.lr": {"distribution": "loguniform", "low": 0.0, "high": 0.2}}), "params.optim.lr: a log range must be above 0"),
    (_space(**{"optim.lr": {"distribution": "gaussian", "low": 0.1, "high": 0.2}}), "params.optim.lr: unknown distribution 'gaussian'"),
    (_space(**{"optim.lrr": {"distribution": "uniform", "low": 0.1, "high": 0.2}}), "params.optim.lrr: not a training config key"),
    (_space(**{"triaccel.precision.tau_low": {"distribution": "loguniform", "low": 1e-3, "high": 1e-2},
               "triaccel.precision.tau_high": {"distribution": "loguniform", "low": 1e-5, "high": 1e-3,
                                               "above": "triaccel.precision.tau_low"}}),
     "params.triaccel.precision.tau_high.above: high (0.001) must exceed"),
    (_space(**{"triaccel.batch.rho_low": {"distribution": "uniform", "low": 0.3, "high": 0.8},
               "triaccel.batch.rho_high": {"distribution": "uniform", "low": 0.5, "high": 0.9}}),
     "params.triaccel.batch.rho_high: ranges overlap"),
    ({"params": {}}, "s.yaml: train: missing"),
    # a misspelled name: refused with the space, before the search takes its name (it failed after its header)
    ({"train": {"epochs": 2, "data": {"name": "digitz"}}, "params": {}}, "s.yaml: train.data.name: unknown dataset 'digitz', did you mean digits?"),
    ({"train": {"epochs": 2, "model": {"name": "resnt18"}}, "params": {}}, "s.yaml: train.model.name: unknown model 'resnt18', did you mean resnet18?"),
    # a training config given as a space: named as one, not as `mode: unknown key`
    ({"mode": "triaccel", "epochs": 2, "model": {"name": "small_cnn"}},
     "s.yaml: a training config, not a search space (it has no train: and params:): `triaccel train --config s.yaml`"),
    ({"train": {"epochs": 0}, "params": {"optim.lr": {"distribution": "uniform", "low": 0.1, "high": 0.2}}},
     "s.yaml: train.epochs: must be >= 1"),
])
def test_bad_space_is_one_line_naming_key_and_file(data, match):
    with pytest.raises(ConfigError, match=match.replace("(", r"\(").replace(")", r"\)")):
        parse_space(data, source="s.yaml")


def test_a_named_models_key_beside_class_path_in_a_new_space_is_refused_and_a_saved_space_is_read_as_accepted():
    """As in a config file (tests/test_config.py): `model: {class_path: ..., width: 4}` trained width 32."""
    data = {"train": {"model": {"class_path": "torch.nn:Linear", "width": 4}},
            "params": {"optim.lr": {"distribution": "uniform", "low": 0.1, "high": 0.2}}}
    with pytest.raises(ConfigError, match=r"^s\.yaml: train\.model\.width: is for the named models and not read with "
                                          r"model\.class_path"):
        parse_space(data, source="s.yaml", strict=True)
    assert parse_space(data, source="s.yaml").train_settings["model"]["width"] == 4


def test_cli_rejects_bad_space_before_ray_starts(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(_space(**{"optim.lr": {"distribution": "loguniform", "low": -1, "high": 1}})))
    r = subprocess.run([sys.executable, "-m", "triaccel.cli", "search", "--space", str(p)], cwd=tmp_path,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 2
    assert r.stderr.strip() == f"triaccel: error: {p}: params.optim.lr: a log range must be above 0, got low=-1"
    assert not (tmp_path / "mlruns" / "tune").exists()  # nothing started, nothing written


@pytest.mark.parametrize("content,match", [
    (b"\x1f\x8b\x08\x00\x00\x00", "not a YAML text file (not UTF-8: byte 0x8b at offset 1)"),  # a gzip file
    (b"# tau ranges to try\n", "is empty (no settings)"),
])
def test_cli_rejects_binary_or_empty_space_before_ray_starts(tmp_path, content, match):
    p = tmp_path / "s.yaml"
    p.write_bytes(content)
    r = subprocess.run([sys.executable, "-m", "triaccel.cli", "search", "--space", str(p)], cwd=tmp_path,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [f"triaccel: error: {p}: {match}"]
    assert not (tmp_path / "mlruns").exists()  # nothing started, nothing written


def test_frac_parameter_is_what_optuna_sees():
    s = load_space(str(ROOT / "spaces" / "quickstart.yaml"))
    d = s.optuna_distributions()
    assert "triaccel.precision.tau_high" + FRAC_SUFFIX in d and "triaccel.precision.tau_high" not in d
    v = s.resolve({**{k: (x.low if hasattr(x, "low") else x.choices[0]) for k, x in d.items()},
                   "triaccel.precision.tau_high" + FRAC_SUFFIX: 1.0})
    assert v["triaccel.precision.tau_high"] == pytest.approx(s.params["triaccel.precision.tau_high"].high)


def _with(**top):
    return {"train": {"epochs": 2}, "params": {"optim.lr": {"distribution": "uniform", "low": 0.1, "high": 0.2}},
            **top}


_EVERY = "triaccel.control_every"


@pytest.mark.parametrize("data,match", [
    # bounds and steps that reached Optuna, Tune or numpy and failed there with a traceback, or passed silently
    (_space(**{_EVERY: {"distribution": "int", "low": 2, "high": 8, "step": "x"}}),
     f"params.{_EVERY}.step: must be an integer >= 1, got 'x'"),
    (_space(**{_EVERY: {"distribution": "int", "low": 2, "high": 8, "step": 1.5}}),
     f"params.{_EVERY}.step: must be an integer >= 1, got 1.5"),
    (_space(**{_EVERY: {"distribution": "int", "low": 2, "high": 8, "step": 0}}),
     f"params.{_EVERY}.step: must be an integer >= 1, got 0"),
    (_space(**{_EVERY: {"distribution": "int", "low": 2, "high": 8, "step": -2}}),
     f"params.{_EVERY}.step: must be an integer >= 1, got -2"),
    (_space(**{_EVERY: {"distribution": "int", "low": 2, "high": 8, "step": True}}),
     f"params.{_EVERY}.step: must be an integer >= 1, got True"),
    (_space(**{_EVERY: {"distribution": "int", "low": 2, "high": float("inf")}}),
     f"params.{_EVERY}: high must be a finite number, got inf"),
    (_space(**{"optim.lr": {"distribution": "loguniform", "low": 0.01, "high": float("inf")}}),
     "params.optim.lr: high must be a finite number, got inf"),
    (_space(**{"optim.lr": {"distribution": "uniform", "low": "nan", "high": 0.2}}),
     "params.optim.lr: low must be a finite number, got nan"),
    (_space(**{"optim.lr": {"distribution": "uniform", "low": "abc", "high": 0.2}}),
     "params.optim.lr: low must be a number, got 'abc'"),
    (_space(**{"optim.lr": {"distribution": "categorical", "choices": []}}),
     "params.optim.lr: categorical needs a non-empty list of choices"),
    (_space(**{"optim.lr": {"distribution": "uniform", "low": 0.1, "high": 0.2, "above": ["optim.lr"]}}),
     "params.optim.lr.above: must name another searched key, got ['optim.lr']"),
    (_space(**{"optim.lr": {"distribution": "uniform", "low": 0.1, "high": 0.2, "above": "optim.lr"}}),
     "params.optim.lr.above: a key cannot be ordered above itself"),
    ({"train": {"epochs": 2}, "params": {5: {"distribution": "uniform", "low": 0.1, "high": 0.2}}},
     "params.5: a searched key must be a dotted config key (text)"),
    (_with(trials=0), "trials: must be in [1, 10000]"),
    (_with(trials=10**30), "trials: must be in [1, 10000]"),
    (_with(concurrency=0), "concurrency: must be >= 1"),
    (_with(near_best=1.5), "near_best: must be in [0, 1] (the share of sampled trials drawn near the best)"),
    (_with(near_best="half"), "near_best: near_best must be a number, got 'half'"),
    (_with(gpus_per_trial=0), "gpus_per_trial: must be in (0, 8]"),
    (_with(gpus_per_trial=float("nan")), "gpus_per_trial: gpus_per_trial must be a finite number, got nan"),
    (_with(gpus_per_trial="x"), "gpus_per_trial: gpus_per_trial must be a number, got 'x'"),
    (_with(cpus_per_trial=float("inf")), "cpus_per_trial: cpus_per_trial must be a finite number, got inf"),
    (_with(seed=-1), "seed: must be in [0, 2**32)"),  # numpy refused it in the sampler, after the baselines
    (_with(seed=2**32), "seed: must be in [0, 2**32)"),
    (_with(baseline={"accuracy_margin": float("nan")}),
     "baseline.accuracy_margin: accuracy_margin must be a finite number, got nan"),
    (_with(baseline={"second_look": -1}), "baseline.second_look: must be in [0, 100] (percentage points), got -1"),
    (_with(baseline={"second_look": "x"}), "baseline.second_look: second_look must be a number, got 'x'"),
    (_with(baseline={"stop_dominated": "yes"}), "baseline.stop_dominated: must be true or false, got 'yes'"),
    # its captured baselines could not be built, and were only after the eager ones had trained
    ({"train": {"epochs": 2, "compile": "reduce-overhead"}, "baseline": {"batch_sizes": [64], "capture": [False, True]},
      "params": {"optim.lr": {"distribution": "uniform", "low": 0.1, "high": 0.2}}},
     "baseline: the static baseline amp-bf16-B64-captured-compiled-reduce-overhead (train settings in amp mode) is not "
     "a valid config: "
     "compile: reduce-overhead records its own CUDA graphs"),
])
def test_bad_bounds_steps_and_counts_are_one_line_naming_the_key(data, match):
    with pytest.raises(ConfigError) as e:
        parse_space(data, source="s.yaml")
    assert str(e.value).startswith("s.yaml: " + match), str(e.value)
    assert "\n" not in str(e.value)


def test_int_step_written_as_a_whole_float_is_the_integer():
    s = parse_space(_space(**{_EVERY: {"distribution": "int", "low": 2, "high": 8, "step": 2.0}}), source="s.yaml")
    assert s.params[_EVERY].step == 2 and isinstance(s.params[_EVERY].step, int)
    assert s.optuna_distributions()[_EVERY].step == 2


def test_start_points_reach_optuna_in_its_names_and_resolve_back():
    s = parse_space(_with(params={
        "triaccel.precision.tau_low": {"distribution": "loguniform", "low": 1e-2, "high": 1e3},
        "triaccel.precision.tau_high": {"distribution": "loguniform", "low": 1e-1, "high": 1e4,
                                        "above": "triaccel.precision.tau_low"},
        "batch_size": {"distribution": "categorical", "choices": [96, 192]},
        "triaccel.batch.delta_down": {"distribution": "int", "low": 16, "high": 128, "step": 16}},
        start=[{"triaccel.precision.tau_high": 500.0, "triaccel.precision.tau_low": 3.0, "batch_size": 192,
                "triaccel.batch.delta_down": 48.0}]), source="s.yaml")
    (pt,) = s.start
    assert set(pt) == {"triaccel.precision.tau_low", "triaccel.precision.tau_high" + FRAC_SUFFIX, "batch_size",
                       "triaccel.batch.delta_down"}
    assert 0 < pt["triaccel.precision.tau_high" + FRAC_SUFFIX] < 1
    assert pt["triaccel.batch.delta_down"] == 48 and isinstance(pt["triaccel.batch.delta_down"], int)
    back = s.resolve(pt)
    assert back["triaccel.precision.tau_high"] == pytest.approx(500.0)
    assert back["triaccel.precision.tau_low"] == 3.0 and back["batch_size"] == 192
    s.train_config(back)  # a start point is a config the trainer accepts


_TAU = {"triaccel.precision.tau_low": {"distribution": "loguniform", "low": 1e-2, "high": 1e3},
        "triaccel.precision.tau_high": {"distribution": "loguniform", "low": 1e-1, "high": 1e4,
                                        "above": "triaccel.precision.tau_low"}}


@pytest.mark.parametrize("start,match", [
    ({"a": 1}, "start: must be a list of points"),
    ([{}], r"start\[0\]: must be a non-empty mapping"),
    ([{"optim.lr": 0.1}], r"start\[0\].optim.lr: not a searched key"),
    ([{"triaccel.precision.tau_low": 5e3}], r"start\[0\].triaccel.precision.tau_low: 5000.0 is outside the range"),
    ([{"triaccel.precision.tau_low": "high"}], r"start\[0\].triaccel.precision.tau_low: the value must be a number"),
    ([{"triaccel.precision.tau_high": 50.0}], r"start\[0\].triaccel.precision.tau_high: needs triaccel.precision.tau_low"),
    ([{"triaccel.precision.tau_low": 60.0, "triaccel.precision.tau_high": 50.0}],
     r"start\[0\].triaccel.precision.tau_high: 50.0 must be above triaccel.precision.tau_low"),
    # above it, but by less than the sampler can place it: it ran at tau_low * (1 + 1e-6), not as written
    ([{"triaccel.precision.tau_low": 60.0, "triaccel.precision.tau_high": 60.00001}],
     r"start\[0\].triaccel.precision.tau_high: 60.00001 must be above .* by at least 1e-06"),
])
def test_bad_start_points_are_one_line_naming_the_point_and_key(start, match):
    with pytest.raises(ConfigError, match="s.yaml: " + match):
        parse_space(_with(params=dict(_TAU), start=start), source="s.yaml")


_FOLLOWED = {**_TAU, "batch_size": {"distribution": "categorical", "choices": [96, 192]},
             "triaccel.precision.half": {"distribution": "categorical", "choices": ["fp16", "bf16"]},
             "compile": {"distribution": "categorical", "choices": [None, "default"]}}
_AS_WRITTEN = {"triaccel.precision.tau_low": 3.0, "batch_size": 192, "triaccel.precision.half": "bf16",
               "compile": "default"}


def test_a_start_point_that_follows_the_reference_takes_its_type_batch_and_forward_where_the_space_can():
    """What the user would have run decides the 16-bit type and the step: the shipped bf16 start points lost
    0.28x to static fp16 captured + compiled on EfficientNet-B0 (H100)."""
    s = parse_space(_with(params=dict(_FOLLOWED), start=[dict(_AS_WRITTEN, reference=True), dict(_AS_WRITTEN)]),
                    source="s.yaml")
    fp16 = {"mode": "amp", "amp_dtype": "fp16", "batch_size": 96, "capture": True, "compile": None}
    (follows, plain), said = start_points(s, fp16)
    assert follows == {"triaccel.precision.tau_low": 3.0, "batch_size": 96, "triaccel.precision.half": "fp16",
                       "compile": None}  # an eager reference: compile null is a value, not a missing one
    assert plain == _AS_WRITTEN and FOLLOWS not in follows  # Optuna gets searched keys only
    assert said == ["start point 0 follows the reference baseline: triaccel.precision.half fp16, batch_size 96, "
                    "compile null"]
    # a batch outside the space's choices keeps the point's own; an fp32 reference has no 16-bit type
    (follows, _), said = start_points(s, dict(fp16, mode="fp32", batch_size=512, compile="default"))
    assert follows == _AS_WRITTEN
    assert said == ["start point 0 follows the reference baseline: compile default (its own "
                    "triaccel.precision.half, batch_size: the reference's do not fit the space)"]
    (follows, _), said = start_points(s, None)  # no baseline finished: as written, and said
    assert follows == _AS_WRITTEN and said == ["start point 0 follows the reference baseline, and none "
                                               "finished: it runs as written"]


@pytest.mark.parametrize("params,reference,match", [
    (_FOLLOWED, "yes", r"start\[0\].reference: must be true or false, got 'yes'"),
    (_TAU, True, r"start\[0\].reference: the space searches none of the keys the reference decides"),
])
def test_a_bad_reference_in_a_start_point_is_one_line(params, reference, match):
    with pytest.raises(ConfigError, match="s.yaml: " + match):
        parse_space(_with(params=dict(params), start=[{"triaccel.precision.tau_low": 3.0, "reference": reference}]),
                    source="s.yaml")


def test_relative_precision_thresholds_default_to_every_layer_16_bit_on_resnet18_ratios():
    """Unset, relative tau keeps a layer 16-bit up to 200x the median layer's variance (ResNet-18/CIFAR-10
    ratios at the start of training: 0.08 .. 112); absolute keeps the paper's kind of value."""
    from triaccel.config import PrecisionConfig
    from triaccel.controllers import PrecisionController, WindowStats

    rel = from_dict(PrecisionConfig, {"scale": "relative"})
    assert (rel.tau_low, rel.tau_high) == (200.0, 1e4)
    assert (from_dict(PrecisionConfig, {}).tau_low, from_dict(PrecisionConfig, {}).tau_high) == (200.0, 1e4)  # default
    ab = from_dict(PrecisionConfig, {"scale": "absolute"})
    assert (ab.tau_low, ab.tau_high) == (1e-7, 1e-4)
    ratios = [44.2, 12.0, 8.97, 6.12, 4.28, 2.06, 1.51, 1.0, 0.5, 0.24, 0.11, 0.08, 111.8]
    dec = PrecisionController(rel, len(ratios), initial="fp16").decide(WindowStats(1, 0, variance=tuple(ratios)))
    assert set(dec.levels) == {"fp16"}


def test_a_categorical_choice_listed_twice_is_refused_naming_it():
    """[power, power, fisher] drew power twice as often as fisher: a weight nobody wrote down."""
    ch = {"triaccel.curvature.method": {"distribution": "categorical", "choices": ["power", "power", "fisher"]}}
    with pytest.raises(ConfigError, match=r"s.yaml: params.triaccel.curvature.method.choices: 'power' is listed twice"):
        parse_space(_with(params=ch), source="s.yaml")
    ok = {"checkpointing": {"distribution": "categorical", "choices": [False, True]}}  # distinct, whatever == says
    assert parse_space(_with(params=ok), source="s.yaml").params["checkpointing"].choices == [False, True]


def test_a_start_point_at_the_least_above_value_resolves_to_it():
    s = parse_space(_with(params=dict(_TAU), start=[{"triaccel.precision.tau_low": 60.0,
                                                     "triaccel.precision.tau_high": 60.0 * (1 + 1e-6)}]),
                    source="s.yaml")
    assert s.resolve({**s.start[0]})["triaccel.precision.tau_high"] == pytest.approx(60.0 * (1 + 1e-6), rel=1e-12)


@pytest.mark.parametrize("high", [10.0, 1e3])
def test_an_above_range_the_partner_can_outgrow_is_refused(high):
    """tau_high up to 10 above tau_low up to 1000 passed the check (high above the partner's low); draws of tau_low
    above 10 clamped tau_high to 10, below it, and every such trial failed with a traceback (a tester's report)."""
    params = {"triaccel.precision.tau_low": {"distribution": "loguniform", "low": 1.0, "high": 1e3},
              "triaccel.precision.tau_high": {"distribution": "loguniform", "low": 0.1, "high": high,
                                              "above": "triaccel.precision.tau_low"}}
    with pytest.raises(ConfigError, match=r"s.yaml: params.triaccel.precision.tau_high.above: high \((10|1000)\) "
                                          r"must exceed triaccel.precision.tau_low's high \(1000\)"):
        parse_space(_with(params=params), source="s.yaml", strict=True)  # a new search's space
    # a search saved before the rule is read as it was accepted: its finished trials still resume and export
    assert parse_space(_with(params=params), source="s.yaml").params["triaccel.precision.tau_high"].high == high
    params["triaccel.precision.tau_high"]["high"] = 1e4  # room above every draw: every resolved pair is ordered
    s = parse_space(_with(params=params), source="s.yaml")
    for u in (0.0, 0.5, 1.0):
        v = s.resolve({"triaccel.precision.tau_low": 1e3, "triaccel.precision.tau_high" + FRAC_SUFFIX: u})
        assert v["triaccel.precision.tau_high"] > v["triaccel.precision.tau_low"]


@pytest.mark.parametrize("params,match", [
    ({"batch_size": {"distribution": "categorical", "choices": [32, 64, 128]},
      "triaccel.batch.max_batch": {"distribution": "int", "low": 64, "high": 256}},
     "batch_size can be 128, above triaccel.batch.max_batch's least value 64"),
    ({"batch_size": {"distribution": "categorical", "choices": [16, 64]},
      "triaccel.batch.min_batch": {"distribution": "int", "low": 8, "high": 32, "step": 8}},
     "batch_size can be 16, below triaccel.batch.min_batch's greatest value 32"),
])
def test_a_batch_size_its_searched_bounds_can_refuse_is_said_at_the_start(params, match):
    """The trainer refuses a batch_size outside [min_batch, max_batch] (it clamped it silently): a space whose
    draws can cross them was accepted and failed trial by trial (a reviewer's find)."""
    data = {"train": {"mode": "triaccel", "epochs": 2, "batch_size": 48}, "params": params}
    with pytest.raises(ConfigError, match="s.yaml: params: " + match):
        parse_space(data, source="s.yaml", strict=True)
    ok = {"train": {"mode": "triaccel", "epochs": 2, "batch_size": 64},
          "params": {"batch_size": {"distribution": "categorical", "choices": [64, 128]},
                     "triaccel.batch.max_batch": {"distribution": "int", "low": 128, "high": 256}}}
    parse_space(ok, source="s.yaml", strict=True)
    for f in sorted((ROOT / "spaces").glob("*.yaml")):  # every shipped space passes
        load_space(str(f))


def test_ignored_data_keys_are_refused_in_a_new_space_not_in_a_saved_one():
    """data.data_dir with digits (and download with imagefolder) would be ignored: a new search's
    space is refused naming the key; a search saved before the rule still resumes and exports."""
    from triaccel.errors import ConfigError
    from triaccel.search.space import parse_space

    lr = {"optim.lr": {"distribution": "uniform", "low": 0.1, "high": 0.2}}
    for data, key in (({"data_dir": "/x"}, "data.data_dir"), ({"name": "imagefolder", "data_dir": "/x",
                                                                "download": True}, "data.download")):
        with pytest.raises(ConfigError, match=f"s.yaml: train.{key}: "):
            parse_space({"train": {"data": data}, "params": lr}, source="s.yaml", strict=True)
        saved = parse_space({"train": {"data": data}, "params": lr}, source="s.yaml")
        assert saved.train["data"] == data


def test_production_epochs_and_judge_seeds_are_read_and_bad_values_named():
    base = yaml.safe_load((ROOT / "spaces" / "quickstart.yaml").read_text())
    s = parse_space(dict(base, production_epochs=12, judge_seeds=4))
    assert (s.production_epochs, s.judge_seeds) == (12, 4)
    s = parse_space(base)
    assert (s.production_epochs, s.judge_seeds) == (None, 3)  # undeclared: no judging at another length
    for key, bad, why in (("production_epochs", 2, r"must be in \[train.epochs \(4\), 100000\]"),
                          ("production_epochs", "8", "must be int"), ("judge_seeds", 1, r"must be in \[2, 20\]")):
        with pytest.raises(ConfigError, match=f"^<dict>: {key}: {why}"):
            parse_space(dict(base, **{key: bad}))


def test_a_parsed_space_is_frozen_and_an_override_is_a_new_checked_space():
    import dataclasses

    s = parse_space(_with(train={"epochs": 2, "mode": "triaccel"}, params=dict(_TAU),
                          start=[{"triaccel.precision.tau_low": 60.0}]), source="s.yaml")
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.trials = 3
    with pytest.raises(TypeError):
        s.params["optim.lr"] = None
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.params["triaccel.precision.tau_low"].high = 1.0
    s.train["epochs"], s.raw["trials"] = 99, 99  # copies: the space is as parsed
    assert s.train["epochs"] == 2 and "trials" not in s.raw and s.trials == 12
    t = s.with_options(trials=3, seed=7)
    assert (t.trials, t.seed, t.raw["trials"], t.raw["seed"]) == (3, 7, 3, 7) and (s.trials, s.seed) == (12, 0)
    assert t.start == s.start and t.source == "s.yaml"
    with pytest.raises(ConfigError, match=r"^s.yaml: trials: must be in \[1, 10000\]$"):
        s.with_options(trials=0)


_WIDTH = {"model.width": {"distribution": "int", "low": 8, "high": 64}}


@pytest.mark.parametrize("train,params,match", [
    # the user's model reads model.init_args.*: every trial trained width 32 under its own label
    ({"epochs": 2, "mode": "triaccel", "model": {"class_path": "pkg.build"}}, _WIDTH,
     r"^s.yaml: params.model.width: the run never reads it: train.model.class_path builds the model; its own "
     r"arguments are model.init_args.\*$"),
    ({"epochs": 2, "mode": "amp"}, dict(_TAU),
     r"^s.yaml: params.triaccel.precision.tau_low: the run never reads it: train.mode is amp"),
    ({"epochs": 2, "mode": "triaccel"}, {"triaccel.curvature.top_k": {"distribution": "int", "low": 1, "high": 4}},
     r"params.triaccel.curvature.top_k: the run never reads it: train.triaccel.curvature.method is fisher"),
    ({"epochs": 2, "mode": "triaccel", "data": {"class_path": "pkg.data"}},
     {"data.image_size": {"distribution": "categorical", "choices": [16, 32]}},
     r"params.data.image_size: the run never reads it: train.data.class_path builds the data"),
    # one optimizer's keys under the other: AdamW has no momentum, SGD no betas
    ({"epochs": 2, "optim": {"name": "adamw"}}, {"optim.momentum": {"distribution": "uniform", "low": 0.8, "high": 0.95}},
     r"^s.yaml: params.optim.momentum: the run never reads it: train.optim.name is adamw: optim.momentum is read "
     r"only under optim.name sgd$"),
    ({"epochs": 2}, {"optim.betas": {"distribution": "categorical", "choices": [[0.9, 0.95], [0.9, 0.999]]}},
     r"params.optim.betas: the run never reads it: train.optim.name is sgd"),
])
def test_a_searched_key_the_run_never_reads_is_refused(train, params, match):
    with pytest.raises(ConfigError, match=match):
        parse_space({"train": train, "params": params}, source="s.yaml", strict=True)


@pytest.mark.parametrize("key,spec", [
    ("data.init_args.block_size", {"distribution": "categorical", "choices": [16, 32]}),
    ("data.val_fraction", {"distribution": "uniform", "low": 0.1, "high": 0.2}),
    ("data.split_seed", {"distribution": "int", "low": 0, "high": 3}),
])
def test_a_searched_key_that_changes_the_data_or_its_validation_split_is_refused(key, spec):
    """A space searching the user's data factory's block_size ran, and its block-16 trial (19.6 % next-token
    accuracy on its own windows) was ranked 2.36x against the block-32 baseline and exported: the trials were
    scored on other validation sets than the reference. Augmentation stays searchable."""
    train = {"epochs": 2, "mode": "triaccel", "data": {"class_path": "pkg.data", "init_args": {"block_size": 32}}}
    with pytest.raises(ConfigError, match=rf"^s.yaml: params.{key}: the data and its validation split are the same "
                                          r"for every trial and baseline .*: set it under train.data$"):
        parse_space({"train": train, "params": {key: spec}}, source="s.yaml", strict=True)
    parse_space({"train": {"epochs": 2}, "params": {"data.crop_padding": {"distribution": "int", "low": 0, "high": 4}}},
                source="s.yaml", strict=True)


def test_a_searched_key_is_read_where_the_key_that_decides_is_searched_too():
    mode = {"mode": {"distribution": "categorical", "choices": ["amp", "triaccel"]}}
    parse_space({"train": {"epochs": 2, "mode": "amp"}, "params": {**_TAU, **mode}}, source="s.yaml", strict=True)
    parse_space({"train": {"epochs": 2, "mode": "triaccel"}, "params": {**_WIDTH}}, source="s.yaml", strict=True)
    opt = {"optim.name": {"distribution": "categorical", "choices": ["sgd", "adamw"]},
           "optim.momentum": {"distribution": "uniform", "low": 0.8, "high": 0.95}}
    parse_space({"train": {"epochs": 2, "optim": {"name": "adamw"}}, "params": opt}, source="s.yaml", strict=True)


@pytest.mark.parametrize("params,match", [
    # an ordered key's bound is judged by its own rules, its order against the partner's range
    ({"triaccel.batch.rho_high": {"distribution": "uniform", "low": 0.5, "high": 1.5}},
     r"params.triaccel.batch.rho_high: bound 1.5 is not a valid value: .*rho_high: must be in"),
    ({"triaccel.precision.tau_low": {"distribution": "uniform", "low": -1.0, "high": 5.0}},
     r"params.triaccel.precision.tau_low: bound -1.0 is not a valid value: .*tau_low: must be > 0"),
    ({"optim.lrr": {"distribution": "uniform", "low": 0.1, "high": 0.2}},
     r"params.optim.lrr: not a training config key \(optim.lrr: unknown key"),
])
def test_a_bound_is_judged_by_its_value_not_by_its_partner(params, match):
    with pytest.raises(ConfigError, match=match):
        parse_space(_with(params=params), source="s.yaml")
    # bounds of a pair key beyond the partner's fixed or default value: the order is the partner range's to judge
    ok = {"triaccel.batch.rho_low": {"distribution": "uniform", "low": 0.5, "high": 0.9},
          "triaccel.precision.tau_high": {"distribution": "loguniform", "low": 1e-3, "high": 1e5}}
    parse_space(_with(params=ok, train={"epochs": 2, "triaccel": {"precision": {"tau_low": 1.0}}}), source="s.yaml")


def test_a_searched_epochs_is_refused_at_the_start_naming_what_sets_the_length():
    """A searched `epochs` ran trials of unequal length: ranked against baselines of another length, shown
    as 'stopped early (ASHA)' without a scheduler, and exported at a length ASHA never let train."""
    data = {"train": {"mode": "triaccel", "epochs": 2, "batch_size": 64},
            "params": {"epochs": {"distribution": "int", "low": 1, "high": 3}}}
    with pytest.raises(ConfigError, match=r"^s\.yaml: params\.epochs: the trials' length is not searched: "
                                          r"train\.epochs sets it .*production_epochs"):
        parse_space(data, source="s.yaml", strict=True)


@pytest.mark.parametrize("spec", [{"distribution": "loguniform", "low": 0.1, "high": 0.1},
                                  {"distribution": "categorical", "choices": [0.1]}])
def test_a_searched_key_of_one_value_is_refused_in_a_new_space_and_read_in_a_saved_one(spec):
    """A range of one value (low = high) or one choice was accepted: trials spent searching nothing."""
    data = _space(**{"optim.lr": spec})
    with pytest.raises(ConfigError, match=r"^s\.yaml: params\.optim\.lr: searches one value \(0\.1\); set it "
                                          r"under train instead"):
        parse_space(data, source="s.yaml", strict=True)
    assert parse_space(data, source="s.yaml").params["optim.lr"].key == "optim.lr"  # a saved search still resumes


@pytest.mark.parametrize("fixed,ok", [(1e-3, False), (0.1, True)])
def test_a_searched_key_reaching_its_partner_fixed_under_train_is_refused(fixed, ok):
    """tau_low searched over 1e-4..1e-2 beside tau_high 1e-3 fixed under train was accepted: every trial that
    drew tau_low >= 1e-3 failed in the trainer. (The refusal of a one-value range points users there.)"""
    data = {"train": {"mode": "triaccel", "epochs": 2, "triaccel": {"precision": {"tau_high": fixed}}},
            "params": {"triaccel.precision.tau_low": {"distribution": "loguniform", "low": 1e-4, "high": 1e-2}}}
    if ok:
        parse_space(data, source="s.yaml", strict=True)
        return
    with pytest.raises(ConfigError, match=r"^s\.yaml: params\.triaccel\.precision\.tau_low: its range reaches "
                                          r"triaccel\.precision\.tau_high = 0\.001, fixed under train: a draw there "
                                          r"fails in the trainer; keep the range below it"):
        parse_space(data, source="s.yaml", strict=True)
    parse_space(data, source="s.yaml")  # a saved search's space is read as it was accepted


@pytest.mark.parametrize("path", SPACES, ids=lambda p: p.name)
def test_the_benchs_static_runs_train_what_the_searchs_baselines_train(path):
    """bench/search_vs_static.py's static runs are the search's own baselines: the same data, model and
    optimizer, warm-up included, differing only where the bench sets the run's length, its test span and
    checkpointing (the same arithmetic). Its static runs once forced a 2-epoch warm-up, where the GPT
    space and its export warm up for 1: the 16-epoch GPT comparison's accuracy gap was partly that."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("search_vs_static", ROOT / "bench" / "search_vs_static.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    s = load_space(str(path))
    static = bench.static_runs(yaml.safe_load(path.read_text()), s.epochs)
    for label, base in s.baseline_runs():
        dt, b = label.split("-")[1], label.split("-")[2][1:]
        spec = f"{dt}:{b}" + (":captured" if base["capture"] else "") + (":compiled" if base["compile"] else "")
        if base["compile"] not in (None, "default"):
            continue  # the bench compiles in torch's default mode only
        _, mine = static(spec)
        for key in ("epochs", "checkpointing", "evaluate_test", "accum_steps"):
            mine.pop(key, None), base.pop(key, None)
        assert mine == base, label
