"""The results ledger: one folder per question under bench/results/, an index, README's headline.

    python bench/ledger.py              # rewrite bench/results/INDEX.md from the folders
    python bench/ledger.py --check      # exit 1 if INDEX.md is stale or a file lacks its facts
    python bench/ledger.py --headline   # README's headline table (tests/test_docs.py compares them)
    python bench/ledger.py --stamp FILE...  # fill a result JSON's missing git facts from `git log`

Layout. ``bench/results/<question>/question.yaml`` states the question and lists its current
files (``current``); ``bench/results/archive/<question>/`` holds the files they superseded,
each listed under ``superseded`` with the file that replaced it and why. Every file carries
its date, git revision, dirty flag, GPU and command: a JSON file in its ``env`` block (what
``bench/_common.py`` writes), any other file (a console log, an exported YAML) under
``meta`` in question.yaml. A file recorded before revisions were written takes the commit
that added it (``git_rev_source: commit-that-added-file``), with ``git_dirty`` unknown (null).
Machine paths appear as placeholders: $REPO (the checkout), $DATA (the dataset folder),
$OUT (the output folder), $WORK (a scratch folder), $SITE (the GPU machine's extra packages).

A folder without question.yaml (a new question) is listed with its files and no figures.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
FACTS = ("date", "git_rev", "git_dirty", "gpu", "command")
# README's headline: the latest judgements of shipped spaces' exports against the best static runs measured
# beside them, at each length: (folder, file, epochs, the run compared, its label in the table)
SHIPPED = "ResNet-18, CIFAR-10 JPEG: the export of `spaces/cifar10_jpeg_resnet18.yaml`"
GPT = "GPT, Tiny Shakespeare: the export of `spaces/shakespeare_gpt.yaml`"
# A comparison whose runs differ in more than the loop carries a caveat, and its ratio is not bolded as a win
GPT_16_WARMUP = ("static warmed up 2 epochs, the export 1 (bench/search_vs_static.py before 2026-12-06's fix): "
                 "the accuracy gap includes the schedule")
HEADLINE = (("export_vs_static", "h200_search_bf16masters_judge_8ep.json", 8, "exported", SHIPPED, None),
            ("export_vs_static", "h200_search_bf16masters_16ep.json", 16, "exported", SHIPPED, None),
            ("export_vs_static", "h200_search_bf16masters_16ep_fp16ref.json", 16, "exported", SHIPPED, None),
            ("lm", "h200_lm_search_judge_8ep.json", 8, "exported", GPT, None),
            ("lm", "h100_lm_16ep_state_variants.json", 16, "exported", GPT, GPT_16_WARMUP))
METRICS = (("efficiency", "efficiency", 1), ("val_acc", "val %", 2), ("epoch_time_last5_s", "s/epoch", 3),
           ("peak_mem_gib", "peak GiB", 3))


def questions() -> list[Path]:
    return sorted(p for p in RESULTS.iterdir() if p.is_dir() and p.name != "archive")


def load_question(folder: Path) -> dict:
    f = folder / "question.yaml"
    return yaml.safe_load(f.read_text()) if f.exists() else {}


def files_of(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and p.name != "question.yaml")


def facts(folder: Path, name: str, q: dict) -> dict:
    """The file's date, revision, dirty flag, GPU and command: a JSON's env, else question.yaml's meta."""
    p = folder / name
    if p.suffix == ".json":
        try:
            env = json.loads(p.read_text()).get("env")
        except (json.JSONDecodeError, AttributeError):
            env = None
        if isinstance(env, dict) and "git_rev" in env:
            return env
    return (q.get("meta") or {}).get(name, {})


def missing_facts(folder: Path, name: str, q: dict) -> list[str]:
    f = facts(folder, name, q)
    return [k for k in FACTS if k not in f]


def fmt(stat: dict, digits: int) -> str:
    if stat.get("n", 1) > 1:
        return f"{stat['mean']:.{digits}f} ± {stat['std']:.{digits}f}"
    return f"{stat['mean']:.{digits}f}"


def summary_rows(data: dict) -> list[tuple[str, dict]]:
    """(run, metrics) for a file with a per-run ``summary`` of mean/std/n (search_vs_static's format)."""
    s = data.get("summary")
    if not isinstance(s, dict):
        return []
    rows = [(k, v) for k, v in s.items() if isinstance(v, dict) and isinstance(v.get("efficiency"), dict)]
    return sorted(rows, key=lambda r: -r[1]["efficiency"]["mean"])


def figures_table(data: dict, ratio_to: str | None = None) -> list[str]:
    rows = summary_rows(data)
    if not rows:
        return []
    ref = dict(rows).get(ratio_to) if ratio_to else None
    head = "| run | n | " + " | ".join(label for _, label, _ in METRICS) + (" | export / run |" if ref else " |")
    out = [head, "|" + " --- |" * (len(METRICS) + 2 + bool(ref))]
    exported = dict(rows).get("exported")
    for name, m in rows:
        cells = [fmt(m[key], d) if key in m else "" for key, _, d in METRICS]
        line = f"| {name} | {m['efficiency'].get('n', 1)} | " + " | ".join(cells) + " |"
        if ref:
            line += f" {exported['efficiency']['mean'] / m['efficiency']['mean']:.3f}× |" if exported else " |"
        out.append(line)
    return out


def headline() -> str:
    lines = ["| run, alone | epochs | seeds | efficiency | val % | s/epoch | peak GiB | the export / run |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    sources = []
    for folder, name, epochs, run_name, label, caveat in HEADLINE:
        data = json.loads((RESULTS / folder / name).read_text())
        env = data["env"]
        rows = [r for r in summary_rows(data) if r[0] == run_name or r[0].startswith("static")]
        ours = dict(rows)[run_name]
        margin = data.get("accuracy_margin_pp")
        for run, m in sorted(rows, key=lambda r: r[0] != run_name):
            ratio = "–" if run == run_name else f"**{ours['efficiency']['mean'] / m['efficiency']['mean']:.3f}×**"
            gap = ours["val_acc"]["mean"] - m["val_acc"]["mean"]
            beyond = margin is not None and gap < -margin  # no win: below the accuracy margin
            if run != run_name and (beyond or caveat):
                ratio = (f"{ratio.strip('*')} at {gap:+.2f} pp" + (f", beyond the {margin:g} pp margin" if beyond else "")
                         + (f"; {caveat}" if caveat else ""))
            lines.append(f"| {label if run == run_name else run.replace('static amp', 'static AMP')} | {epochs} | "
                         f"{m['efficiency']['n']} | {fmt(m['efficiency'], 1)} | "
                         f"{fmt(m['val_acc'], 2)} | {m['epoch_time_last5_s']['mean']:.3f} | "
                         f"{m['peak_mem_gib']['mean']:.3f} | {ratio} |")
        sources.append(f"`bench/results/{folder}/{name}` ({env['gpu']}, {env['date']}, git {env['git_rev']})")
    lines.append("")
    lines.append("From " + ", ".join(sources) + " (generated by `python bench/ledger.py --headline`).")
    return "\n".join(lines)


def index() -> str:
    out = ["# Results ledger", "",
           "Generated by `python bench/ledger.py` from the question folders; do not edit by hand.",
           "Each folder answers one question; its `question.yaml` lists the current files, and",
           "`archive/<question>/` holds what they superseded. Figures are mean ± std over seeds where",
           "a file has seeds. Placeholders in commands: $REPO (the checkout), $DATA (the dataset),",
           "$OUT (the output folder), $WORK (scratch), $SITE (extra packages on the GPU machine).", ""]
    out += ["| question | folder | current files | latest |", "| --- | --- | --- | --- |"]
    qs = [(f, load_question(f)) for f in questions()]
    for f, q in qs:
        cur = q.get("current") or files_of(f)
        dates = [str(facts(f, c["file"] if isinstance(c, dict) else c, q).get("date", "")) for c in cur]
        out.append(f"| {q.get('question', '(no question.yaml)')} | [{f.name}/](#{f.name.replace('_', '-')}) | "
                   f"{len(cur)} | {max(dates) if dates else ''} |")
    for f, q in qs:
        out += ["", f"## {f.name}", "", q.get("question", "(no question.yaml: files listed as found)"), ""]
        cur = q.get("current") or [{"file": n} for n in files_of(f)]
        for c in cur:
            c = c if isinstance(c, dict) else {"file": c}
            name = c["file"]
            env = facts(f, name, q)
            dirty = {True: " (dirty)", False: "", None: " (dirty: unknown)"}.get(env.get("git_dirty"), "")
            src = f", {env['git_rev_source']}" if env.get("git_rev_source") not in (None, "checkout") else ""
            out.append(f"- `{f.name}/{name}`: {env.get('date', '?')}, git {env.get('git_rev', '?')}{dirty}{src}, "
                       f"{env.get('gpu') or 'CPU'}")
            if c.get("says"):
                out.append(f"  {c['says']}")
            if env.get("command"):
                out.append(f"  command: `{env['command']}`")
            if name.endswith(".json"):
                data = json.loads((f / name).read_text())
                table = figures_table(data, ratio_to=data.get("best_static"))
                if table:
                    out += ["", *["  " + t for t in table], ""]
        sup = q.get("superseded") or []
        if sup:
            out += ["", "Superseded (in `archive/" + f.name + "/`):", ""]
            for s in sup:
                out.append(f"- `{s['file']}` → `{s['by']}`: {s['why']}")
    return "\n".join(out) + "\n"


def problems() -> list[str]:
    """Files without their facts, listed files that are not there, files no question lists."""
    bad = []
    for f in questions():
        q = load_question(f)
        if not q:
            continue
        listed = {c["file"] if isinstance(c, dict) else c for c in q.get("current", [])}
        for name in listed:
            if not (f / name).exists():
                bad.append(f"{f.name}/{name}: listed in question.yaml but missing")
        for name in files_of(f):
            top = name.split("/")[0]
            if name not in listed and top not in listed:
                bad.append(f"{f.name}/{name}: not listed in question.yaml")
        for name in listed:
            if (f / name).is_file():
                miss = missing_facts(f, name, q)
                if miss:
                    bad.append(f"{f.name}/{name}: lacks {', '.join(miss)}")
        for s in q.get("superseded", []):
            if not (RESULTS / "archive" / f.name / s["file"]).exists():
                bad.append(f"archive/{f.name}/{s['file']}: listed as superseded but missing")
    return bad


def added_by(path: Path) -> tuple[str | None, str | None]:
    """The commit that added ``path`` (following renames) and its date."""
    r = subprocess.run(["git", "-C", str(ROOT), "log", "--follow", "--diff-filter=A", "--format=%h %ad",
                        "--date=short", "--", str(path)], capture_output=True, text=True)
    lines = r.stdout.split("\n") if r.returncode == 0 else []
    lines = [line for line in lines if line.strip()]
    if not lines:
        return None, None
    rev, date = lines[-1].split()
    return rev, date


def stamp(path: Path) -> bool:
    """Fill a result JSON's missing git facts from the commit that added it; True if it changed."""
    data = json.loads(path.read_text())
    env = data.setdefault("env", {})
    if env.get("git_rev"):
        return False
    rev, date = added_by(path)
    if rev is None:
        return False
    env.update(git_rev=rev, git_dirty=None, git_rev_source="commit-that-added-file")
    env.setdefault("date", date)
    path.write_text(json.dumps(data, indent=1))
    return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if INDEX.md is stale or a file lacks its facts")
    ap.add_argument("--headline", action="store_true", help="print README's headline table")
    ap.add_argument("--stamp", nargs="+", metavar="FILE", help="fill result JSONs' missing git facts from git log")
    a = ap.parse_args(argv)
    if a.headline:
        print(headline())
        return 0
    if a.stamp:
        for p in a.stamp:
            print(f"{p}: {'stamped' if stamp(Path(p)) else 'unchanged'}")
        return 0
    bad = problems()
    for b in bad:
        print(b, file=sys.stderr)
    text = index()
    target = RESULTS / "INDEX.md"
    if a.check:
        if not target.exists() or target.read_text() != text:
            print(f"{target} is stale: run python bench/ledger.py", file=sys.stderr)
            return 1
        return 1 if bad else 0
    target.write_text(text)
    print(f"wrote {target}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
