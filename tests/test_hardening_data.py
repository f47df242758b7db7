"""Issue #14: the ImageFolder cache, data the user did not mean, and `triaccel ui` on a port in use."""
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from triaccel.cli import main
from triaccel.config import DataConfig
from triaccel.data import load_splits
from triaccel.errors import DataError

# one colour per class name: a decoded image tells which folder it came from
COLOURS = {"a": (250, 10, 10), "b": (10, 250, 10), "c": (10, 10, 250), "z": (250, 250, 10)}


def _write(path, colour, size=(8, 8)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((size[1], size[0], 3), colour, dtype=np.uint8)).save(path)


def _tree(root, train, test, n=4, ext="png"):
    for split, classes in (("train", train), ("test", test)):
        for c in classes:
            for i in range(n):
                _write(root / split / c / f"{i}.{ext}", COLOURS[c])


def _cfg(tmp_path, cache="cache", **kw):
    return DataConfig(name="imagefolder", data_dir=str(tmp_path / "data"), image_size=8, val_fraction=0.25,
                      cache_dir=str(tmp_path / cache), **kw)


def _class_of_pixels(images, classes):
    """The class each image's colour belongs to, as indices into ``classes``."""
    px = images[:, :, 0, 0].tolist()
    return [classes.index(next(c for c, col in COLOURS.items() if list(col) == p)) for p in px]


# --------------------------------------------------------------------------- 1: stale cache
def test_cache_relabels_test_split_after_a_class_is_added_to_train(tmp_path):
    _tree(tmp_path / "data", train="bc", test="bc")
    before = load_splits(_cfg(tmp_path))
    assert before.classes == ["b", "c"]
    assert before.test.labels.tolist() == [0] * 4 + [1] * 4

    _tree(tmp_path / "data", train="a", test="")  # train/a appears; test/ unchanged
    after = load_splits(_cfg(tmp_path))  # same cache_dir
    fresh = load_splits(_cfg(tmp_path, cache="fresh-cache"))
    assert after.classes == fresh.classes == ["a", "b", "c"]
    assert after.test.labels.tolist() == fresh.test.labels.tolist() == [1] * 4 + [2] * 4
    # the labels agree with the images: every test image is labelled with the class of its colour
    assert after.test.labels.tolist() == _class_of_pixels(after.test.images, after.classes)
    assert torch.equal(after.test.images, fresh.test.images)


def test_cache_is_not_served_for_a_replaced_image_of_same_size_and_mtime(tmp_path):
    _tree(tmp_path / "data", train="ab", test="ab", ext="bmp")  # BMP: same byte size whatever the colour
    load_splits(_cfg(tmp_path))
    target = tmp_path / "data" / "test" / "a" / "0.bmp"
    st = target.stat()
    new = target.with_name("new.tmp.bmp")
    _write(new, COLOURS["z"])
    assert new.stat().st_size == st.st_size
    os.utime(new, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(new, target)  # e.g. an archive re-extracted over the folder: same name, size and mtime
    sp = load_splits(_cfg(tmp_path))
    assert sp.test.images[0, :, 0, 0].tolist() == list(COLOURS["z"])


def test_size_change_and_broken_cache_file_are_decoded_again(tmp_path):
    _tree(tmp_path / "data", train="ab", test="ab")
    assert load_splits(_cfg(tmp_path)).image_size == 8
    cfg16 = DataConfig(name="imagefolder", data_dir=str(tmp_path / "data"), image_size=16, val_fraction=0.25,
                       cache_dir=str(tmp_path / "cache"))
    sp16 = load_splits(cfg16)
    assert sp16.image_size == 16 and sp16.test.images.shape[-1] == 16
    caches = sorted((tmp_path / "cache").glob("*.pt"))
    assert len(caches) == 4  # 2 splits x 2 sizes
    for p in caches:  # truncated files (a full disk, a killed copy): decoded again, not a traceback
        p.write_bytes(p.read_bytes()[:50])
    again = load_splits(cfg16)
    assert torch.equal(again.test.images, sp16.test.images) and torch.equal(again.test.labels, sp16.test.labels)
    assert not list((tmp_path / "cache").glob("*.tmp"))


# --------------------------------------------------------------------------- 2: data the user did not mean
def test_one_class_is_refused(tmp_path):
    _tree(tmp_path / "data", train="a", test="a")
    with pytest.raises(DataError, match=r"data/train: only one class folder \(a\); a classifier needs at least 2"):
        load_splits(_cfg(tmp_path))


def test_one_class_through_the_cli_is_one_line_and_exit_2(tmp_path, capsys):
    _tree(tmp_path / "data", train="a", test="a")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"data: {{name: imagefolder, data_dir: {tmp_path / 'data'}, cache_dir: {tmp_path / 'cache'}}}\n"
                   "tracking: {enabled: false}\n")
    rc = main(["train", "--config", str(cfg)])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("triaccel: error: ") and f"{tmp_path / 'data' / 'train'}: only one class folder" in err


def test_test_classes_missing_from_train_are_named(tmp_path):
    _tree(tmp_path / "data", train="ab", test="abcz")
    with pytest.raises(DataError) as ei:
        load_splits(_cfg(tmp_path))
    msg = str(ei.value)
    assert "\n" not in msg
    assert msg.startswith(f"{tmp_path / 'data' / 'test'}: class folders c, z not in {tmp_path / 'data' / 'train'}")
    assert not (tmp_path / "cache").exists()  # refused before any decode


def test_test_may_lack_a_train_class(tmp_path):
    _tree(tmp_path / "data", train="abc", test="ac")
    sp = load_splits(_cfg(tmp_path))
    assert sp.classes == ["a", "b", "c"]
    assert sp.test.labels.tolist() == [0] * 4 + [2] * 4


def test_images_in_nested_subfolders_are_included(tmp_path):
    root = tmp_path / "data"
    _tree(root, train="ab", test="ab", n=2)
    for split in ("train", "test"):
        _write(root / split / "a" / "sub" / "x.png", COLOURS["a"])
        _write(root / split / "b" / "sub" / "deeper" / "y.jpg", COLOURS["b"])
        (root / split / "b" / "sub" / "notes.txt").write_text("not an image: ignored")
    sp = load_splits(_cfg(tmp_path))
    assert len(sp.train) + len(sp.val) == 6 and len(sp.test) == 6
    assert sorted(sp.test.labels.tolist()) == [0, 0, 0, 1, 1, 1]
    # JPEG is lossy: compare the nearest class colour, not exact pixels
    got = sp.test.images[:, :, 0, 0].float()
    cols = torch.tensor([COLOURS["a"], COLOURS["b"]], dtype=torch.float32)
    assert torch.cdist(got, cols).argmin(1).tolist() == sp.test.labels.tolist()


def test_empty_class_folder_is_named(tmp_path):
    _tree(tmp_path / "data", train="abc", test="abc")
    for p in (tmp_path / "data" / "train" / "b").iterdir():
        p.unlink()
    (tmp_path / "data" / "train" / "b" / "readme.txt").write_text("x")
    with pytest.raises(DataError, match=f"^{tmp_path / 'data' / 'train' / 'b'}: class folder without image files$"):
        load_splits(_cfg(tmp_path))


def test_split_without_images_is_named(tmp_path):
    _tree(tmp_path / "data", train="ab", test="")
    (tmp_path / "data" / "test" / "a").mkdir(parents=True)
    (tmp_path / "data" / "test" / "b").mkdir()
    with pytest.raises(DataError, match=f"^{tmp_path / 'data' / 'test'}: no image files in its class folders"):
        load_splits(_cfg(tmp_path))


def test_split_with_loose_images_but_no_class_folders_says_where_they_go(tmp_path):
    _tree(tmp_path / "data", train="ab", test="")
    for i in range(3):
        _write(tmp_path / "data" / "test" / f"{i}.png", COLOURS["a"])
    with pytest.raises(DataError, match=r"data/test: no class folders .*its 3 image files must sit in .*/test/<class>/"):
        load_splits(_cfg(tmp_path))


# --------------------------------------------------------------------------- 3: `triaccel ui` on a port in use
def _ui(tmp_path, *args):
    env = dict(os.environ, MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    try:
        return subprocess.run([sys.executable, "-m", "triaccel.cli", "ui", *args], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("`triaccel ui` started a server instead of refusing")


def test_ui_on_a_port_in_use_is_one_line_and_exit_2(tmp_path):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        r = _ui(tmp_path, "--port", str(port))
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr[-500:])
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith(f"triaccel: error: --port {port}: 127.0.0.1:{port} is already in use (")
    assert "MLflow UI" not in r.stdout  # refused before announcing a server


def test_ui_rejects_a_port_out_of_range(tmp_path):
    r = _ui(tmp_path, "--port", "70000")
    assert r.returncode == 2
    assert r.stderr == "triaccel: error: --port 70000: not a TCP port (1-65535)\n"
