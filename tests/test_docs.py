"""The generated parts of the documentation are what their generators write now: the
configuration reference (docs/config.md), the results index (bench/results/INDEX.md) and
README's headline table. Each fails when the code or a result file changed without them."""
import importlib.util
import json
import re
import sys

from conftest import ROOT


def _module(path, name):
    spec = importlib.util.spec_from_file_location(name, ROOT / path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_config_reference_is_what_the_config_dataclasses_say():
    gen = _module("docs/gen_config_reference.py", "gen_config_reference")
    text = gen.render()
    assert (ROOT / "docs" / "config.md").read_text() == text, "run: python docs/gen_config_reference.py"
    from triaccel.config import TrainConfig, TriAccelConfig

    # every key is there with its default, nested sections included
    assert "| `epochs` | int | 10 |" in text
    assert f"| `triaccel.control_every` | int | {TriAccelConfig().control_every} |" in text
    assert "| `cublas_workspace_mib` | int \\| null | null | cuBLAS's workspace per (handle, stream), in MiB" in text
    assert text.count("\n| `") == sum(1 for _ in _keys(TrainConfig))


def _keys(cls, prefix=""):
    import dataclasses
    import typing

    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        yield prefix + f.name
        if dataclasses.is_dataclass(hints[f.name]):
            yield from _keys(hints[f.name], prefix + f.name + ".")


def test_readme_headline_is_the_ledgers_table():
    ledger = _module("bench/ledger.py", "ledger")
    readme = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- headline: python bench/ledger.py --headline -->\n(.*?)\n<!-- /headline -->", readme, re.S)
    assert m, "README.md has no generated headline block"
    assert m.group(1) == ledger.headline(), "run: python bench/ledger.py --headline, and paste it into README.md"


def test_results_index_is_current_and_every_result_records_its_facts():
    ledger = _module("bench/ledger.py", "ledger")
    assert ledger.problems() == []
    assert (ROOT / "bench" / "results" / "INDEX.md").read_text() == ledger.index(), "run: python bench/ledger.py"


def test_a_new_result_records_revision_dirty_flag_and_placeholders(tmp_path, monkeypatch):
    common = _module("bench/_common.py", "_common")
    monkeypatch.setattr(sys, "argv", ["bench/x.py", "--out", str(ROOT / "bench" / "results" / "x.json")])
    common.write(str(tmp_path / "x.json"), {"what": "a test"})
    env = json.loads((tmp_path / "x.json").read_text())["env"]
    assert re.fullmatch(r"[0-9a-f]{7,}", env["git_rev"]) and env["git_dirty"] in (True, False)
    assert env["command"] == "python3 bench/x.py --out $REPO/bench/results/x.json"
    assert {"date", "gpu", "torch"} <= set(env)


def test_a_judge_table_says_what_trained_its_runs_not_what_read_them(monkeypatch):
    # read on an H200, a store of CPU-trained runs claimed the H200 (the GPU suite, 2026-12-05)
    sys.path.insert(0, str(ROOT / "bench"))
    judge = _module("bench/judge_table.py", "judge_table")
    monkeypatch.setattr(judge, "env", lambda: {"gpu": "NVIDIA H200", "torch": "reader", "git_rev": "abc1234"})
    cpu = judge.trained_env({"gpu": {"cpu"}, "torch": {"2.0"}, "git_revision": {"def5678-dirty"}})
    assert cpu["gpu"] is None and "not a GPU figure" in cpu["note"] and cpu["torch"] == "2.0"
    assert cpu["git_rev"] == "def5678" and cpu["git_dirty"] is True
    gpu = judge.trained_env({"gpu": {"NVIDIA H100"}, "torch": {"2.0"}, "git_revision": {"def5678"}})
    assert gpu["gpu"] == "NVIDIA H100" and "read_on" in gpu and "note" not in gpu
    mixed = judge.trained_env({"gpu": {"cpu", "NVIDIA H100"}, "torch": {"2.0"}, "git_revision": {"def5678"}})
    assert mixed["gpu"] is None and "NVIDIA H100, cpu" in mixed["note"]  # runs that disagree: no one GPU


def test_readme_example_is_the_file_the_tests_run():
    """README's Python example is docs/examples/notebook.py's code (tests/test_usercode.py runs the file)."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("<!-- example: docs/examples/notebook.py -->\n```python\n", 1)[1].split("```\n<!-- /example -->")[0]
    code = (ROOT / "docs" / "examples" / "notebook.py").read_text()
    assert block == code[code.index("import torch"):].rstrip() + "\n"


def test_readme_commands_block_names_every_option_of_every_command():
    """README's Commands block is the user's summary of the CLI: each command's options there are its parser's
    (it had lost --storage of four commands, extend's --address and profile's --set)."""
    from triaccel.cli import build_parser

    text = (ROOT / "README.md").read_text()
    block = re.search(r"## Commands\n+```bash\n(.*?)```", text, re.S).group(1)
    said: dict[str, set] = {}
    cmd = None
    for line in block.splitlines():
        if line.startswith("triaccel "):
            cmd = line.split()[1]
        said.setdefault(cmd, set()).update(re.findall(r"--[a-z][a-z-]*", line))
    parsers = build_parser().commands
    assert set(said) == set(parsers), (sorted(said), sorted(parsers))
    for name, p in parsers.items():
        flags = {s for a in p._actions for s in a.option_strings if s.startswith("--") and s != "--help"}
        assert said[name] == flags, (name, sorted(said[name] ^ flags))
