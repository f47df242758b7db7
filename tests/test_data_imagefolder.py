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


# --------------------------------------------------------------------------- 4: links, empty splits, paths, 16 bits
def _refused(tmp_path, capsys, *sets):
    """``triaccel train`` on the ImageFolder under tmp_path/data: exit 2 and the one error line."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"data: {{name: imagefolder, data_dir: {tmp_path / 'data'}, cache_dir: {tmp_path / 'cache'}, "
                   "image_size: 8}\ntracking: {enabled: false}\nepochs: 1\n")
    args = ["train", "--config", str(cfg)]
    for s in sets:
        args += ["--set", s]
    rc = main(args)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err and err.startswith("triaccel: error: ")
    return err


def test_folder_link_to_an_ancestor_is_refused_not_walked(tmp_path, capsys):
    root = tmp_path / "data"
    _tree(root, train="abc", test="abc")
    (root / "train" / "a" / "root").symlink_to("../..")  # every class and test/ would be labelled "a"
    err = _refused(tmp_path, capsys)
    assert f"{root / 'train' / 'a' / 'root'}: a folder link to {root.resolve()}, which holds its class folder" in err
    assert not (tmp_path / "cache").exists()  # refused before any decode


@pytest.mark.parametrize("target", ["..", "../../../test/a", "../../b"])  # loop, the test split, another class
def test_folder_links_leaving_the_class_folder_are_refused(tmp_path, target):
    root = tmp_path / "data"
    _tree(root, train="abc", test="abc")
    (root / "train" / "a" / "sub").mkdir()
    (root / "train" / "a" / "sub" / "link").symlink_to(target)
    with pytest.raises(DataError, match=f"^{root / 'train' / 'a' / 'sub' / 'link'}: a folder link to ") as ei:
        load_splits(_cfg(tmp_path))
    assert "\n" not in str(ei.value)


def test_links_inside_the_class_folder_and_file_links_from_outside_still_work(tmp_path):
    root = tmp_path / "data"
    _tree(root, train="ab", test="ab")
    (root / "train" / "a" / "sub").mkdir()
    _write(root / "train" / "a" / "sub" / "x.png", COLOURS["a"])
    (root / "train" / "a" / "alias").symlink_to("sub")  # the same folder twice: walked once
    _write(tmp_path / "elsewhere" / "b.png", COLOURS["b"])
    (root / "train" / "b" / "linked.png").symlink_to(tmp_path / "elsewhere" / "b.png")  # an image kept elsewhere
    sp = load_splits(_cfg(tmp_path))
    assert len(sp.train) + len(sp.val) == 10
    labels = torch.cat([sp.train.labels, sp.val.labels])
    images = torch.cat([sp.train.images, sp.val.images])
    assert labels.tolist() == _class_of_pixels(images, sp.classes)


def test_file_link_into_another_class_or_the_test_split_is_refused(tmp_path):
    root = tmp_path / "data"
    _tree(root, train="ab", test="ab")
    link = root / "train" / "a" / "leak.png"
    link.symlink_to(root / "test" / "a" / "0.png")  # a test image trained on
    with pytest.raises(DataError, match=f"^{link}: a link to {root.resolve() / 'test' / 'a' / '0.png'}, an image"):
        load_splits(_cfg(tmp_path))
    link.unlink()
    link.symlink_to(root / "train" / "b" / "0.png")  # a "b" image labelled "a"
    with pytest.raises(DataError, match=f"^{link}: a link to .*, an image of another class folder"):
        load_splits(_cfg(tmp_path))


def test_class_folder_links_into_the_data_set_are_refused(tmp_path):
    root = tmp_path / "data"
    _tree(root, train="ab", test="ab")
    (root / "train" / "c").symlink_to("b")  # class "c" would be class "b"'s images
    with pytest.raises(DataError, match=f"^{root / 'train' / 'c'}: a class folder link to .*inside the data set"):
        load_splits(_cfg(tmp_path))
    (root / "train" / "c").unlink()
    _tree(tmp_path / "shared", train="", test="", n=0)
    for i in range(4):
        _write(tmp_path / "shared" / "c" / f"{i}.png", COLOURS["c"])
    (root / "train" / "c").symlink_to(tmp_path / "shared" / "c")  # a class kept elsewhere: fine on its own
    assert load_splits(_cfg(tmp_path)).classes == ["a", "b", "c"]
    (root / "test" / "c").symlink_to(tmp_path / "shared" / "c")  # ... but not as both train and test
    with pytest.raises(DataError, match=r"resolves to .*shared/c, which is also class folder .*: the same images"):
        load_splits(_cfg(tmp_path))


def test_empty_validation_split_is_refused(tmp_path, capsys):
    _tree(tmp_path / "data", train="ab", test="ab", n=1)  # one image per class: nothing to hold out
    err = _refused(tmp_path, capsys)
    assert "data.val_fraction: 0.1 of 2 training images leaves 2 to train and 0 to validate on" in err


def test_empty_validation_split_is_refused_for_any_dataset(monkeypatch):
    import triaccel.data as data

    x = torch.zeros(3, 1, 8, 8, dtype=torch.uint8)
    one_each = lambda cfg: (data.ImageSet(x, torch.tensor([0, 1, 2])), data.ImageSet(x, torch.tensor([0, 1, 2])),
                            ["0", "1", "2"])
    monkeypatch.setitem(data.DATASETS, "digits", one_each)
    with pytest.raises(DataError, match=r"^data\.val_fraction: 0\.1 of 3 training images leaves 3 to train and 0"):
        load_splits(DataConfig(name="digits"))


def test_cache_dir_that_is_a_file_warns_and_trains_without_it(tmp_path):
    _tree(tmp_path / "data", train="ab", test="ab")
    (tmp_path / "cache").write_text("keep me")
    with pytest.warns(UserWarning, match=f"data.cache_dir: {tmp_path / 'cache'}: cannot write the decoded-image "
                                         "cache \\(not a folder\\); training goes on without it"):
        sp = load_splits(_cfg(tmp_path))
    assert len(sp.test) == 8 and (tmp_path / "cache").read_text() == "keep me"  # nothing lost
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "file").write_text("x")
    with pytest.warns(UserWarning, match="cannot write the decoded-image cache"):  # a file above cache_dir
        assert len(load_splits(_cfg(tmp_path, cache="dir/file/cache")).test) == 8


@pytest.mark.parametrize("key", ["data_dir", "cache_dir"])
def test_tilde_of_an_unknown_user_names_the_key(tmp_path, capsys, key):
    _tree(tmp_path / "data", train="ab", test="ab")
    err = _refused(tmp_path, capsys, f"data.{key}=~nosuchuser-triaccel/x")
    assert err.startswith(f"triaccel: error: data.{key}: cannot expand '~nosuchuser-triaccel/x'")


def test_data_dir_that_is_a_file_says_so(tmp_path):
    (tmp_path / "data").write_text("x")
    with pytest.raises(DataError, match=f"^{tmp_path / 'data'}: data_dir is not a folder"):
        load_splits(_cfg(tmp_path))
    with pytest.raises(DataError, match=f"^{tmp_path / 'nope'}: data_dir does not exist"):
        load_splits(DataConfig(name="imagefolder", data_dir=str(tmp_path / "nope")))


@pytest.mark.parametrize("mode", ["I;16", "I;16B", "I"])
def test_high_bit_depth_grayscale_is_rescaled_not_clipped(tmp_path, mode):
    from triaccel.data import _decode

    ramp = np.linspace(0, 65535, 32 * 32).reshape(32, 32)
    if mode == "I;16":
        im = Image.fromarray(ramp.astype(np.uint16))
    elif mode == "I;16B":
        im = Image.frombytes("I;16B", (32, 32), ramp.astype(">u2").tobytes())
    else:
        im = Image.fromarray(ramp.astype(np.int32))
    assert im.mode == mode
    path = tmp_path / ("x.png" if mode == "I;16" else "x.tif")
    im.save(path)
    got = _decode(path, 32)
    assert got.shape == (32, 32, 3) and got.dtype == np.uint8
    assert got.min() < 10 and got.max() > 245
    rows = got[:, :, 0].astype(float).mean(axis=1)
    assert np.all(np.diff(rows) >= 0) and 100 < rows.mean() < 155  # a ramp, not almost all white


def test_grayscale_scaling_is_one_range_for_every_image_and_float_is_refused(tmp_path):
    """Each 16-bit image is scaled by the same range, not by its own values (float images scaled by their own
    range decoded 0.99 and 1.01 to 252 and 1: a reviewer's find); a float image's range is unknown: refused."""
    from triaccel.data import _decode

    for v, want in ((65535, 255), (32768, 128), (4095, 16)):  # 12-bit data in 16 bits: dark, as documented
        Image.fromarray(np.full((8, 8), v, np.uint16)).save(tmp_path / f"{v}.png")
        assert int(_decode(tmp_path / f"{v}.png", 8).max()) == want
    Image.fromarray(np.full((8, 8), 0.99, np.float32)).save(tmp_path / "f.tif")
    with pytest.raises(DataError, match=r"f.tif: cannot read image .*32-bit float image"):
        _decode(tmp_path / "f.tif", 8)


def test_a_sub_folder_linked_in_from_outside_is_labelled_by_its_class_and_a_pool_image_in_both_splits_is_refused(
        tmp_path):
    """train/a/batch2 -> a folder elsewhere on disk (a common layout) was refused for a while (a reviewer's find);
    and train/a/x.png and test/a/x.png both linking one pool image loaded a test image into training."""
    root = tmp_path / "data"
    _tree(root, train="ab", test="ab")
    for i in range(3):
        _write(tmp_path / "disk2" / "a_batch2" / f"{i}.png", COLOURS["a"])
    (root / "train" / "a" / "batch2").symlink_to(tmp_path / "disk2" / "a_batch2")
    sp = load_splits(_cfg(tmp_path))
    assert len(sp.train) + len(sp.val) == 11
    assert torch.cat([sp.train.labels, sp.val.labels]).tolist() == \
        _class_of_pixels(torch.cat([sp.train.images, sp.val.images]), sp.classes)
    _write(tmp_path / "pool" / "x.png", COLOURS["b"])
    (root / "train" / "b" / "x.png").symlink_to(tmp_path / "pool" / "x.png")
    (root / "test" / "b" / "x.png").symlink_to(tmp_path / "pool" / "x.png")
    with pytest.raises(DataError, match=f"^{root / 'test' / 'b' / 'x.png'}: the same image file .* in train/"):
        load_splits(_cfg(tmp_path))
