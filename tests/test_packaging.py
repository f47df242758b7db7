"""The wheel holds every package under the triaccel name and nothing at the top level but triaccel."""
import subprocess
import sys
import zipfile

from conftest import ROOT


def test_wheel_contents(tmp_path):
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                        str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    (whl,) = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(whl).namelist()
    tops = {n.split("/")[0] for n in names if ".dist-info" not in n}
    assert tops == {"triaccel"}  # no generic top-level `search` or `kernels`
    # every source package is in the wheel, under its triaccel.* name
    mapping = {"triaccel": "triaccel", "kernels": "triaccel/kernels", "search": "triaccel/search",
               "spaces": "triaccel/spaces", "configs": "triaccel/configs"}
    for src, dst in mapping.items():
        for init in (ROOT / src).rglob("__init__.py"):
            rel = init.relative_to(ROOT / src).as_posix()
            assert f"{dst}/{rel}" in names, f"{dst}/{rel} missing from the wheel"
    for space in (ROOT / "spaces").glob("*.yaml"):
        assert f"triaccel/spaces/{space.name}" in names
    for cfg in (ROOT / "configs").glob("*.yaml"):
        assert f"triaccel/configs/{cfg.name}" in names
    # the language model's corpus ships as data of triaccel.zoo, with its notice (no download)
    assert {"triaccel/zoo/corpora/tinyshakespeare.txt", "triaccel/zoo/corpora/NOTICE.md"} <= set(names)
