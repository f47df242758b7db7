"""The search's result rules (triaccel.search.results) on fabricated MLflow rows: fast, no Ray."""
import pytest

from triaccel.errors import ConfigError
from triaccel.search import results as R


def run(rid, eff, acc, epoch=4, status="FINISHED", role="trial", t=1.0, mem=1.0, curve=None, **tags):
    m = {"efficiency": eff, "val_acc": acc, "epoch": epoch, "epoch_time_last5_s": t, "peak_mem_gib": mem,
         "wall_s": 10.0, "gpu_share": 0.25 if role == "trial" else 1.0}
    return {"run_id": rid, "status": status, "metrics": m, "values": {"x": eff}, "trial_id": rid,
            "tags": {"triaccel.baseline": rid, **tags}, "confirms": tags.get("confirms"), "role": role,
            "curve": curve}


BASE = [run("b256", 50.0, 84.0, role="baseline", curve=[60.0, 70.0, 80.0, 84.0]),
        run("b512", 70.0, 83.0, role="baseline", curve=[50.0, 65.0, 78.0, 83.0]),
        run("b768", 60.0, 82.0, role="baseline", curve=[45.0, 60.0, 75.0, 82.0]),
        run("b-dead", 999.0, 99.0, role="baseline", status="FAILED")]


def test_reference_is_the_best_complete_baseline_and_gaps_are_at_the_same_epoch():
    ref = R.reference(BASE, epochs=4)
    assert ref["run_id"] == "b512"  # best efficiency; a failed run never counts
    assert R.acc_gap({"val_acc": 80.0, "epoch": 3}, ref) == pytest.approx(2.0)  # vs 78 at epoch 3
    assert R.acc_gap({"val_acc": 80.0, "epoch": 4}, ref) == pytest.approx(-3.0)
    assert R.feasible({"val_acc": 82.5, "epoch": 4}, ref, margin=0.5)
    assert not R.feasible({"val_acc": 82.4, "epoch": 4}, ref, margin=0.5)
    assert R.feasible({"val_acc": 10.0, "epoch": 4}, None)  # no baseline: no constraint


def test_infeasible_and_stopped_trials_are_never_best():
    rows = [run("fast-but-worse", 200.0, 77.0), run("ok", 80.0, 83.2), run("slow", 40.0, 85.0),
            run("asha-stopped", 500.0, 83.0, epoch=2), run("failed", 0.0, 0.0, status="FAILED")]
    o = R.outcome(rows, [], BASE, epochs=4)
    assert [x.row["run_id"] for x in o.ranked] == ["fast-but-worse", "ok", "slow"]
    assert [x.feasible for x in o.ranked] == [False, True, True]
    assert [r["run_id"] for r in o.stopped] == ["asha-stopped"] and len(o.failed) == 1
    assert o.best.row["run_id"] == "ok" and o.best.ratio == pytest.approx(80 / 70)
    p = R.pick(o, "efficiency", "best")
    assert p.kind == "trial" and p.row["run_id"] == "ok"


def test_confirmed_figures_decide_and_can_make_a_trial_infeasible():
    rows = [run("a", 90.0, 83.5), run("b", 85.0, 83.5), run("c", 75.0, 83.5)]
    confirms = [run("ca", 72.0, 82.0, role="confirm", confirms="a"),  # alone: below the margin
                run("cb", 80.0, 83.4, role="confirm", confirms="b")]
    for c in confirms:
        c["confirms"] = c["tags"]["confirms"]
    o = R.outcome(rows, confirms, BASE, epochs=4)
    assert o.best.row["run_id"] == "b" and o.best.confirmed and o.best.measured["efficiency"] == 80.0
    assert not next(x for x in o.ranked if x.row["run_id"] == "a").feasible


def test_nothing_feasible_beats_the_baseline_exports_the_baseline():
    o = R.outcome([run("worse", 60.0, 83.5), run("inacc", 300.0, 70.0)], [], BASE, epochs=4)
    p = R.pick(o, "efficiency", "best")
    assert p.kind == "baseline" and p.row["run_id"] == "b512" and "beat the baseline" in p.reason
    o = R.outcome([], [], BASE, epochs=4)
    assert R.pick(o, "efficiency", "best").kind == "baseline"
    with pytest.raises(ConfigError, match="no finished trial"):
        R.pick(R.outcome([], [], [], epochs=4), "efficiency", "best")



def test_pick_baseline_is_the_reference_static_run_even_when_a_trial_wins():
    o = R.outcome([run("fast", 300.0, 85.0)], [], BASE, epochs=4)
    assert R.pick(o, "efficiency", "best").kind == "trial"
    p = R.pick(o, "efficiency", "baseline")
    assert p.kind == "baseline" and p.row["run_id"] == o.reference["run_id"] and "--pick baseline" in p.reason
    with pytest.raises(ConfigError, match="--pick baseline: no static baseline of this search finished"):
        R.pick(R.outcome([run("fast", 300.0, 85.0)], [], [], epochs=4), "efficiency", "baseline")


def test_a_baseline_stopped_as_dominated_is_never_the_reference_and_the_summary_says_why(capsys):
    from triaccel.search.space import parse_space
    from triaccel.search.summary import print_table

    why = "at most 40.00, below b512's 70.00"
    dom = run("b64", 900.0, 50.0, epoch=2, role="baseline", **{R.TAG_DOMINATED: why})  # its epoch-2 figures
    o = R.outcome([run("a", 90.0, 83.5)], [], BASE + [dom], epochs=4)
    assert o.reference["run_id"] == "b512" and [b["run_id"] for b in o.dominated] == ["b64"]
    assert "b64" not in [b["run_id"] for b in o.baselines]
    space = parse_space({"train": {"epochs": 4}, "params": {"optim.lr": {"distribution": "uniform", "low": 0.1, "high": 1}}},
                        source="s.yaml")
    print_table(o, space)
    assert f"b64 stopped after epoch 2: {why}" in capsys.readouterr().out


def test_pareto_picks_only_feasible_members():
    rows = [run("acc", 50.0, 86.0, t=2.0), run("fast", 90.0, 83.0, t=0.5), run("inacc", 300.0, 60.0, t=0.1)]
    o = R.outcome(rows, [], BASE, epochs=4)
    assert R.pick(o, "pareto", "pareto-0").row["run_id"] == "acc"
    assert R.pick(o, "pareto", "pareto-1").row["run_id"] == "fast"
    with pytest.raises(ConfigError, match=r"2 feasible trials \(pareto-0 \.\. pareto-1\)"):
        R.pick(o, "pareto", "pareto-2")
    for bad in ("pareto-+0", "pareto- 1", "pareto-", "pareto-٣"):  # +0 was taken as entry 0
        with pytest.raises(ConfigError, match="expected best, baseline or pareto-N"):
            R.pick(o, "pareto", bad)
    one = R.outcome(rows[:1], [], BASE, epochs=4)  # was "(pareto-0 .. pareto-0)"
    with pytest.raises(ConfigError, match=r"has 1 feasible trial \(pareto-0\)$"):
        R.pick(one, "pareto", "pareto-1")


def test_search_cost_and_payback():
    rows = [run("t1", 1, 1), run("t2", 1, 1)] + BASE[:1]
    assert R.gpu_seconds(rows) == pytest.approx(10 * 0.25 * 2 + 10 * 1.0)
    p = R.payback(100.0, ref_epoch_s=1.0, tuned_epoch_s=0.8)
    assert p["payback_epochs"] == pytest.approx(500.0)
    assert R.payback(100.0, 1.0, 1.2)["payback_epochs"] is None  # slower per epoch: never repaid


def test_trainable_reports_the_same_rule_to_asha_and_optuna():
    from triaccel.search.trainable import accuracy_terms

    curve = [50.0, 65.0, 78.0, 83.0]
    ok = accuracy_terms({"efficiency": 40.0, "val_acc": 77.6, "epoch": 3}, curve, 0.5)
    bad = accuracy_terms({"efficiency": 400.0, "val_acc": 70.0, "epoch": 3}, curve, 0.5)
    assert ok["feasible"] == 1.0 and ok["acc_constraint"] <= 0 and ok["search_score"] == 40.0
    assert bad["feasible"] == 0.0 and bad["acc_constraint"] == pytest.approx(7.5)
    assert bad["search_score"] < 0 < ok["search_score"]  # infeasible ranks under every feasible trial
    assert R.feasible({"val_acc": 77.6, "epoch": 3}, {"curve": curve, "metrics": {}}) is True
    assert accuracy_terms({"efficiency": 5.0, "val_acc": 1.0, "epoch": 1}, None, 0.5)["search_score"] == 5.0


def test_summary_cells_show_categorical_choices_as_they_are():
    from triaccel.search.summary import cell

    assert cell(0.123456) == "0.123" and cell("none") == "none" and cell(96) == "96" and cell(None) == "None"


def test_the_ratio_says_what_it_is_made_of():
    """A config can win the score by memory while being slower: the export says which."""
    ref = {"epoch_time_last5_s": 1.21, "peak_mem_gib": 0.413}
    t = R.trade({"epoch_time_last5_s": 1.58, "peak_mem_gib": 0.290}, ref)
    assert t["epoch_time_ratio"] == pytest.approx(1.58 / 1.21) and t["peak_mem_ratio"] == pytest.approx(0.290 / 0.413)
    assert R.trade_words(t) == "epochs 1.31x as long at 0.70x the peak memory"
    assert R.trade_words(R.trade({"epoch_time_last5_s": 0.6, "peak_mem_gib": 0.413}, ref)).startswith("epochs 0.50x the time")
    assert R.trade_words(R.trade(dict(ref), ref)) == "epochs as long at 1.00x the peak memory"


def test_confirm_takes_the_top_k_feasible_and_every_feasible_start_point():
    # shared scores: the start point "s" ranks 4th (sharing ranked the checkpointing start point under
    # the plain one on the H200), an infeasible start point "si" is never re-run
    rows = [run("a", 90.0, 83.5), run("b", 88.0, 83.5), run("c", 85.0, 83.5),
            run("s", 78.0, 83.5, **{"triaccel.start": "true"}), run("d", 70.0, 83.5),
            run("si", 95.0, 70.0, **{"triaccel.start": "true"})]
    o = R.outcome(rows, [], BASE, epochs=4)
    assert [x.row["run_id"] for x in R.to_confirm(o, 3)] == ["a", "b", "c", "s"]
    assert [x.row["run_id"] for x in R.to_confirm(o, 5)] == ["a", "b", "c", "s", "d"]  # no repeat
    assert [x.row["run_id"] for x in R.to_confirm(o, 1)] == ["a", "s"]
    assert R.to_confirm(o, 0) == []  # --confirm 0 re-runs nothing
    assert R.is_start(rows[3]) and not R.is_start(rows[0])


def test_console_numbers_go_on_after_a_resume(capsys):
    """A resumed search's trial lines continue from the trials its first run finished (Tune hands
    the callback every trial, the restored finished ones TERMINATED or ERROR); they restarted at 1."""
    from types import SimpleNamespace

    from triaccel.search.callbacks import ConsoleReporter

    done = [SimpleNamespace(status=s, trial_id=f"t{i}", last_result={}) for i, s in
            enumerate(["TERMINATED", "ERROR", "TERMINATED"])]
    rest = [SimpleNamespace(status="RUNNING", trial_id=f"r{i}", last_result={}) for i in range(2)]
    trials = done + rest
    c = ConsoleReporter(total=5)  # a fresh reporter, as on resume
    c.on_trial_complete(0, trials, rest[0])
    rest[0].status = "TERMINATED"
    c.on_trial_complete(0, trials, rest[1])
    lines = [ln.split()[1] for ln in capsys.readouterr().out.splitlines()]
    assert lines == ["4/5", "5/5"]
    fresh = ConsoleReporter(total=2)  # a search from the start counts 1, 2 as before
    t = [SimpleNamespace(status="RUNNING", trial_id=f"f{i}", last_result={}) for i in range(2)]
    fresh.on_trial_complete(0, t, t[0])
    t[0].status = "TERMINATED"
    fresh.on_trial_complete(0, t, t[1])
    assert [ln.split()[1] for ln in capsys.readouterr().out.splitlines()] == ["1/2", "2/2"]


def _recheck(rid, eff, acc, confirms=None, curve=None, status="FINISHED", label="b512"):
    r = run(rid, eff, acc, role="recheck", curve=curve, status=status, **({"confirms": confirms} if confirms else {}))
    if confirms is None:
        r["tags"]["triaccel.baseline"] = label  # a reference's second seed
    else:
        del r["tags"]["triaccel.baseline"]
    return r


def _confirm(rid, eff, acc, confirms):
    r = run(rid, eff, acc, role="confirm", confirms=confirms)
    r["confirms"] = confirms
    return r


def test_a_trial_infeasible_by_a_hair_gets_a_second_seed_and_the_mean_gap_decides():
    # reference b512: 83.0 at epoch 4; margin 0.5, second look within 1.0 pp beyond it (down to -1.5)
    rows = [run("near", 90.0, 82.2), run("far", 95.0, 81.0), run("ok", 80.0, 83.2),
            run("slow-near", 40.0, 82.3), run("start-near", 30.0, 81.8, **{"triaccel.start": "true"})]
    o = R.outcome(rows, [], BASE, epochs=4)
    assert [x.row["run_id"] for x in o.feasible] == ["ok"]
    # top 2 among the feasible and the near misses by score, and every near-miss start point;
    # "far" (-2.0 pp) is past the band, "ok" needs no second look
    assert [x.row["run_id"] for x in R.to_recheck(o, 2)] == ["near", "start-near"]
    assert [x.row["run_id"] for x in R.to_recheck(o, 5)] == ["near", "slow-near", "start-near"]
    assert R.to_recheck(o, 0) == [] and R.to_recheck(R.outcome(rows, [], BASE, epochs=4, band=0.0), 3) == []
    assert R.pick(o, "efficiency", "best").row["run_id"] == "ok"

    # the second look confirms each alone at its seed, then runs it and the reference at the next seed
    confirms = [_confirm("c-near", 120.0, 82.2, "near"), _confirm("c-start", 110.0, 81.8, "start-near")]
    ref2 = _recheck("b512-seed1", 500.0, 84.0, curve=[50.0, 66.0, 79.0, 84.0])  # never the reference
    looks = [_recheck("near-seed1", 88.0, 84.1, confirms="near"),  # -0.8 and +0.1: mean -0.35, feasible
             _recheck("start-near-seed1", 35.0, 84.1, confirms="start-near")]  # -1.2 and +0.1: mean -0.55
    noise = [_recheck("b512-cut", 1.0, 99.0, status="RUNNING", curve=[99.0] * 4),  # a crash's leftovers
             _recheck("b512-failed", 1.0, 99.0, status="FAILED", curve=[99.0] * 4),
             _recheck("b768-seed1", 1.0, 70.0, label="b768", curve=[70.0] * 4),  # another baseline's second seed
             _recheck("start-near-cut", 1.0, 99.0, confirms="start-near", status="RUNNING")]
    o = R.outcome(rows, confirms, BASE, epochs=4, rechecks=[*noise, ref2, *looks])
    assert o.reference["run_id"] == "b512"
    near = next(x for x in o.ranked if x.row["run_id"] == "near")
    assert near.feasible and near.confirmed and near.gaps == pytest.approx((-0.8, 0.1))
    # judged by the mean (the first seed alone says infeasible), by its figures at its own seed
    assert near.gap == pytest.approx(-0.35) and near.measured["efficiency"] == 120.0
    assert near.measured["val_acc"] == 82.2
    start = next(x for x in o.ranked if x.row["run_id"] == "start-near")
    # the mean again: the second seed alone, or the better of the two, would say feasible
    assert start.gaps == pytest.approx((-1.2, 0.1)) and start.gap == pytest.approx(-0.55) and not start.feasible
    assert [x.row["run_id"] for x in R.to_recheck(o, 5)] == ["slow-near"]  # looked at once only
    p = R.pick(o, "efficiency", "best")
    assert p.kind == "trial" and p.row["run_id"] == "near" and p.measured["efficiency"] == 120.0
    assert all(r in o.runs for r in [ref2, *looks])  # their device time is the search's cost

    # without the reference's second seed (or with only a cut-short one) a trial's own decides nothing
    for rechecks in (looks, [noise[0], *looks]):
        o = R.outcome(rows, confirms, BASE, epochs=4, rechecks=rechecks)
        near = next(x for x in o.ranked if x.row["run_id"] == "near")
        assert not near.feasible and near.gaps == () and near.gap == pytest.approx(-0.8)


# --------------------------------------------------------------------------- the judge at the production length
def _seeds(effs, accs):
    return {s: {"efficiency": e, "val_acc": a, "epoch_time_last5_s": 1.0, "peak_mem_gib": 1.0}
            for s, (e, a) in enumerate(zip(effs, accs))}


REF = _seeds([100.0, 110.0, 90.0], [80.0, 80.0, 80.0])


def test_t95_matches_the_table_and_refuses_zero_degrees():
    assert R.t95(1) == pytest.approx(6.314) and R.t95(2) == pytest.approx(2.920) and R.t95(1000) == 1.645
    with pytest.raises(ValueError, match="degrees of freedom"):
        R.t95(0)


def test_paired_ratio_mean_std_and_one_sided_lower_bound():
    # ratios 1.03, 1.02, 1.04 against a reference that moves with the seed: pairing cancels that move
    p = R.paired("a", _seeds([103.0, 112.2, 93.6], [80.1, 79.9, 80.0]), REF, margin=0.5)
    assert p.seeds == (0, 1, 2) and p.ratios == pytest.approx((1.03, 1.02, 1.04))
    assert p.mean == pytest.approx(1.03) and p.std == pytest.approx(0.01)
    assert p.lower == pytest.approx(1.03 - 2.920 * 0.01 / 3 ** 0.5)
    assert p.acc_mean == pytest.approx(0.0) and p.preferred and "lower bound 1.013 > 1.0" in p.why


def test_a_higher_mean_with_seed_noise_is_not_preferred():
    # mean ratio 1.03, but one seed lost: the lower bound falls below 1.0 and the static run is exported
    p = R.paired("noisy", _seeds([112.0, 105.6, 95.4], [80.0, 80.0, 80.0]), REF, margin=0.5)
    assert p.mean == pytest.approx((1.12 + 0.96 + 1.06) / 3)
    assert p.lower < 1.0 and not p.preferred and "<= 1.0" in p.why
    assert R.verdict([p]) is None


def test_accuracy_beyond_the_margin_loses_whatever_the_ratio():
    p = R.paired("fast", _seeds([150.0, 165.0, 135.0], [79.0, 79.2, 79.4]), REF, margin=0.5)
    assert p.lower > 1.0 and p.acc_mean == pytest.approx(-0.8) and not p.preferred and "margin" in p.why


def test_one_seed_has_no_bound_and_unpaired_seeds_are_left_out():
    one = R.paired("one", {0: REF[0] | {"efficiency": 200.0}, 7: REF[0]}, REF, margin=0.5)
    assert one.seeds == (0,) and one.lower is None and not one.preferred
    assert R.paired("none", {9: REF[0]}, REF, margin=0.5) is None


def test_verdict_takes_the_preferred_with_the_best_mean():
    a = R.paired("a", _seeds([103.0, 112.2, 93.6], [80.0] * 3), REF, margin=0.5)
    b = R.paired("b", _seeds([105.0, 115.5, 94.5], [80.0] * 3), REF, margin=0.5)
    c = R.paired("c", _seeds([300.0, 110.0, 90.0], [80.0] * 3), REF, margin=0.5)  # mean 1.67, not preferred
    assert R.verdict([a, c, b]).key == "b"
    assert "ratio 1.050 ± 0.000 over 3 seeds, 95 % lower bound 1.050, d.acc +0.00 pp" == R.paired_words(b)


def _judged_outcome(cand_effs):
    from triaccel.search import judge as J

    rows = [run("t1", 80.0, 83.0), run("t2", 75.0, 83.0)]
    o = R.outcome(rows, [], BASE, epochs=4)
    jr = [run(f"j-b{s}", e, 84.0, epoch=8, role="judge", judges="baseline", **{"triaccel.seed": str(s)})
          for s, e in enumerate([100.0, 110.0, 90.0])]
    jr += [run(f"j-t1{s}", e * r, 84.0, epoch=8, role="judge", judges="t1", **{"triaccel.seed": str(s)})
           for s, (e, r) in enumerate(zip([100.0, 110.0, 90.0], cand_effs))]
    runs = J.judged_runs([dict(x, tags={**x["tags"], J.TAG_JUDGES: x["tags"]["judges"]}) for x in jr], 8)
    pairs = [R.paired("t1", runs["t1"], runs["baseline"], 0.5)]
    return o, J.Judged(8, [0, 1, 2], "b512", pairs, R.verdict(pairs), runs, rows=jr)


def test_the_judged_pick_is_the_static_reference_unless_a_trial_beats_it_at_the_bound():
    from triaccel.search.judge import final_pick

    space = type("S", (), {"objective": "efficiency"})()
    o, j = _judged_outcome([0.95, 0.94, 0.96])  # the search's best trial loses at the production length
    p = final_pick(o, space, j)
    assert p.kind == "baseline" and p.row["run_id"] == "b512" and "95 % lower bound" in p.reason
    assert p.measured["efficiency"] == pytest.approx(100.0)  # the reference's mean over the judged seeds
    assert j.provenance()["exported"] == "baseline" and j.provenance()["candidates"][0]["preferred"] is False
    o, j = _judged_outcome([1.05, 1.04, 1.06])
    p = final_pick(o, space, j)
    assert p.kind == "trial" and p.row["run_id"] == "t1"
    assert p.measured["efficiency"] == pytest.approx((105.0 + 114.4 + 95.4) / 3)  # its mean at 8 epochs
    assert final_pick(o, space, None).row["run_id"] == "t1"  # not judged: the search's own pick


def test_the_searchs_cost_that_faster_epochs_repay_counts_its_judge_runs():
    """The payback and export's "in runs of N device-seconds" counted trials, confirms and baselines but
    not the judge's runs at the production length, which a judged search spends most of its time on."""
    from triaccel.search.export import baseline_provenance
    from triaccel.search.judge import final_pick

    space = type("S", (), {"objective": "efficiency", "margin": 0.5})()
    o, j = _judged_outcome([1.05, 1.04, 1.06])
    b = baseline_provenance(space, o, j, final_pick(o, space, j))
    searched = R.gpu_seconds(o.runs)  # two trials at a quarter of the GPU, four baselines alone: 45 s
    assert searched == pytest.approx(2 * 10.0 * 0.25 + 4 * 10.0)
    assert b["search_gpu_s"] == pytest.approx(searched + 6 * 10.0)  # and six judge runs alone


def test_the_judge_measures_how_the_searchs_verdicts_held_at_the_production_length():
    """Issue 31: judge at the length that matters, and measure the rank agreement rather than assume it. The
    search scored t1 above the reference and t2 below; at 8 epochs t1 fell below it (a verdict that changed
    side) and t2 stayed below: Kendall's tau over t1, t2 and the reference (1.0 at both lengths)."""
    from scipy.stats import kendalltau

    from triaccel.search import judge as J

    o, j = _judged_outcome([0.95, 0.94, 0.96])
    t2 = R.paired("t2", {s: dict(m, efficiency=m["efficiency"] * 0.9) for s, m in j.runs["baseline"].items()},
                  j.runs["baseline"], 0.5)
    j = J.Judged(8, [0, 1, 2], "b512", [*j.pairs, t2], None, j.runs, 4, {"t1": 1.04, "t2": 0.97})
    a = j.agreement()
    want = kendalltau([1.04, 0.97, 1.0], [j.pairs[0].mean, 0.9, 1.0]).statistic
    assert a == {"search_epochs": 4, "production_epochs": 8, "runs": 3, "kendall_tau": pytest.approx(want),
                 "flipped": ["t1"]}
    assert j.provenance()["rank_agreement"] == a and j.provenance()["candidates"][0]["search_ratio"] == 1.04
    lines = J.summary_lines(j, o)
    assert lines[1].startswith("  t1: 1.040 at 4 epochs, then ratio 0.950 ± ")
    assert lines[-2] == (f"  rank agreement, 4 against 8 epochs (the reference included): Kendall tau {want:+.2f} "
                         f"over 3 runs; 1 verdict(s) changed side of 1.0 (t1)")
    # one trial judged: two runs rank nothing, and a verdict that held is said to have held
    one = J.Judged(8, [0, 1, 2], "b512", [t2], None, j.runs, 4, {"t2": 0.97})
    assert one.agreement()["kendall_tau"] is None and one.agreement()["flipped"] == []
    assert not any("rank agreement" in x for x in J.summary_lines(one, o))


def test_the_summary_lists_every_trial_and_says_what_asha_did(capsys):
    """The summary listed only the top 8 ranked trials: a stopped or failed trial was in no row, and its
    columns were cut (grow_facto). Every trial has a row; a stopped one says 'stopped early at epoch 2 (ASHA)';
    a start point is marked; the score is defined once."""
    from triaccel.search.space import START, parse_space
    from triaccel.search.summary import print_table

    space = parse_space({"train": {"epochs": 4}, "params": {
        "triaccel.batch.grow_factor": {"distribution": "uniform", "low": 1.1, "high": 2.0}}})
    rows = [run(f"t{i}", 10.0 + i, 83.5, **({START: "true"} if i == 0 else {})) for i in range(10)]
    rows += [run("asha", 500.0, 83.0, epoch=2), run("bad", 0.0, 0.0, status="FAILED", failure_reason="Diverged: x")]
    for r in rows:
        r["values"] = {"triaccel.batch.grow_factor": 1.5}
    print_table(R.outcome(rows, [], BASE, epochs=4), space)
    out = capsys.readouterr().out
    assert "grow_factor" in out.splitlines()[0]
    assert all(f" t{i} " in out for i in range(10))
    assert "asha stopped early at epoch 2 (ASHA)" in out and "bad failed: Diverged: x" in out
    assert next(ln for ln in out.splitlines() if " t0 " in ln).split()[0].endswith("s")
    assert "efficiency score" in out


def test_importances_name_the_parameter_that_decides_and_none_where_every_trial_scored_alike():
    """Optuna gives every parameter the same share, and warns on stderr, where every trial scored
    the same: the parent run then records no importances for that target."""
    import random
    import warnings

    from _harness import DIGITS_SPACE
    from triaccel.search.callbacks import param_importances
    from triaccel.search.space import parse_space

    space = parse_space(dict(DIGITS_SPACE), source="x", sha256="0")
    rnd = random.Random(0)
    rows = []
    for _ in range(12):
        values = {k: rnd.uniform(p.low, p.high) for k, p in space.params.items()}
        rows.append({"values": values, "metrics": {"efficiency": 100 * values["triaccel.batch.rho_low"],
                                                   "val_acc": 90.0}})
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        imp = param_importances(space, rows)
    assert max(imp["efficiency"], key=imp["efficiency"].get) == "triaccel.batch.rho_low"
    assert "val_acc" not in imp and not [str(w.message) for w in said]
    assert param_importances(space, rows[:2]) == {}  # too few trials to rank anything
