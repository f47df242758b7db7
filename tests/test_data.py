import numpy as np
import pytest
import numpy as np
import torch
from PIL import Image

from triaccel.config import DataConfig
from triaccel.data import ElasticSampler, ResidentData, load_splits, stratified_split
from triaccel.kernels.reference import gather_augment_ref
from triaccel.errors import DataError


def test_stratified_split_is_deterministic_disjoint_and_stratified():
    labels = torch.arange(10).repeat_interleave(50)  # 10 classes x 50
    keep, held = stratified_split(labels, 0.2, seed=3)
    keep2, held2 = stratified_split(labels, 0.2, seed=3)
    assert torch.equal(held, held2) and torch.equal(keep, keep2)
    assert len(set(keep.tolist()) & set(held.tolist())) == 0
    assert len(keep) + len(held) == 500
    assert torch.bincount(labels[held], minlength=10).tolist() == [10] * 10
    _, held3 = stratified_split(labels, 0.2, seed=4)
    assert not torch.equal(held, held3)


def test_digits_read_from_the_shipped_file_are_scikit_learns():
    """The digits come from the file scikit-learn ships (no scikit-learn import): the same arrays."""
    from sklearn.datasets import load_digits

    from triaccel.data import digits_arrays

    images, target = digits_arrays()
    d = load_digits()
    assert images.shape == (1797, 8, 8) and np.array_equal(images, d.images)
    assert np.array_equal(target, d.target)


def test_digits_splits_keep_test_apart():
    sp = load_splits(DataConfig(name="digits", val_fraction=0.1))
    assert sp.num_classes == 10 and sp.in_channels == 1 and sp.image_size == 8
    n = len(sp.train) + len(sp.val) + len(sp.test)
    assert n == 1797
    assert sp.train.images.dtype == torch.uint8


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_elastic_sampler_never_loses_or_repeats(seed):
    rng = np.random.default_rng(seed)
    s = ElasticSampler(1000, seed=seed)
    for epoch in range(3):
        s.start_epoch(epoch)
        got = []
        while s.remaining:
            got.append(s.take(int(rng.integers(1, 200))))
        allidx = torch.cat(got)
        assert sorted(allidx.tolist()) == list(range(1000))
    # the order is a function of (seed, epoch): state_dict resumes mid-epoch exactly
    s.start_epoch(5)
    s.take(123)
    st = s.state_dict()
    rest = s.take(1000)
    s2 = ElasticSampler(1000, seed=seed)
    s2.load_state_dict(st)
    assert torch.equal(s2.take(1000), rest)


def _raw(x):  # undo the normalisation of gather_augment_ref with mean 0, inv_std 1
    return (x * 255).round().to(torch.uint8)


def test_crop_flip_shapes_and_content():
    x = torch.randint(0, 255, (16, 3, 8, 8), dtype=torch.uint8)
    idx = torch.arange(16)
    zero, one = torch.zeros(3), torch.ones(3)
    g = torch.Generator().manual_seed(0)
    oy, ox = torch.randint(0, 5, (16,), generator=g), torch.randint(0, 5, (16,), generator=g)
    flip = torch.rand(16, generator=g) < 0.5
    y = _raw(gather_augment_ref(x, idx, (oy, ox, flip), zero, one, padding=2))
    assert y.shape == x.shape
    for i in range(16):  # each output is its image shifted by (oy-2, ox-2), zero-filled, then maybe mirrored
        img = y[i].flip(2) if flip[i] else y[i]
        dy, dx = int(oy[i]) - 2, int(ox[i]) - 2
        for r in range(8):
            for c in range(8):
                sr, sc = r + dy, c + dx
                want = x[i, :, sr, sc] if 0 <= sr < 8 and 0 <= sc < 8 else torch.zeros(3, dtype=torch.uint8)
                assert torch.equal(img[:, r, c], want)
    # without padding, each image is itself or its mirror
    z = _raw(gather_augment_ref(x, idx, (oy * 0, ox * 0, flip), zero, one, padding=0))
    for a, b in zip(x, z):
        assert torch.equal(a, b) or torch.equal(a.flip(2), b)
    assert gather_augment_ref(x, idx[:0], None, zero, one, padding=2).shape[0] == 0


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("train", [True, False])
def test_triton_batch_assembly_matches_the_torch_path(channels_last, train):
    """kernels/augment.py (interpreter on CPU) against the reference: same draws, same batch."""
    import os

    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        pytest.skip("needs Triton")
    sp = load_splits(DataConfig(name="digits"))
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rds = [ResidentData(sp.train, dev, sp.mean, sp.std, augment=True, padding=3, seed=5, kernel=k)
           for k in ("torch", "triton")]
    idx = torch.tensor([0, 17, 5, 1000, 3, 3])
    outs = []
    for rd in rds:
        rd.channels_last = channels_last
        outs.append(rd.batch(idx, train=train))
    (xa, ya), (xb, yb) = outs
    assert torch.equal(ya, yb)
    assert xb.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    assert torch.allclose(xa, xb, rtol=1e-6, atol=1e-5), float((xa - xb).abs().max())


def test_resident_batch_normalises():
    sp = load_splits(DataConfig(name="digits"))
    rd = ResidentData(sp.train, torch.device("cpu"), sp.mean, sp.std, augment=False, padding=0)
    x, y = rd.batch(torch.arange(len(rd)), train=False)
    assert x.dtype == torch.float32 and abs(float(x.mean())) < 0.05 and abs(float(x.std()) - 1) < 0.05


def _write_tree(root, sizes=((10, 12), (32, 32), (40, 20))):
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for c in ("cat", "dog"):
            d = root / split / c
            d.mkdir(parents=True)
            for i, (w, h) in enumerate(sizes * 3):
                Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(d / f"{i}.png")


def test_imagefolder_any_size_resized_and_cached(tmp_path, monkeypatch):
    _write_tree(tmp_path / "data")
    cfg = DataConfig(name="imagefolder", data_dir=str(tmp_path / "data"), image_size=16, val_fraction=0.2,
                     cache_dir=str(tmp_path / "cache"))
    sp = load_splits(cfg)
    assert sp.classes == ["cat", "dog"] and sp.image_size == 16 and sp.in_channels == 3
    assert len(sp.train) + len(sp.val) == 18 and len(sp.test) == 18
    caches = list((tmp_path / "cache").glob("*.pt"))
    assert len(caches) == 2
    # the second load reads the cache: same tensors, and no image is decoded again
    import triaccel.data as data_mod

    def no_decode(*a):
        raise AssertionError("decoded again despite the cache")

    monkeypatch.setattr(data_mod, "_decode", no_decode)
    sp2 = load_splits(cfg)
    assert torch.equal(sp2.train.images, sp.train.images)


def test_unreadable_image_is_named(tmp_path):
    _write_tree(tmp_path / "data")
    bad = tmp_path / "data" / "train" / "dog" / "broken.png"
    bad.write_bytes(b"not an image")
    cfg = DataConfig(name="imagefolder", data_dir=str(tmp_path / "data"), cache_dir=str(tmp_path / "c"))
    with pytest.raises(DataError, match="broken.png: cannot read image"):
        load_splits(cfg)


@pytest.mark.parametrize("cfg,match", [
    (DataConfig(name="cifar10"), "data.data_dir: CIFAR-10 needs a data_dir"),
    (DataConfig(name="imagenet"), "data.name: unknown dataset 'imagenet'"),
    (DataConfig(name="imagefolder", data_dir="/nonexistent/x"), "/nonexistent/x: data_dir does not exist"),
])
def test_data_errors(cfg, match):
    with pytest.raises(DataError, match=match):
        load_splits(cfg)


def test_cifar_offline_without_files_says_how(tmp_path):
    with pytest.raises(DataError, match="no CIFAR-100 files found .set data.download: true"):
        load_splits(DataConfig(name="cifar100", data_dir=str(tmp_path)))


def test_a_failed_cifar_download_is_one_error_and_leaves_no_folder(tmp_path, monkeypatch):
    """No network (here: a proxy where nothing listens, so the test never downloads for real): one
    DataError naming the folder, and the folders the download made are gone, not left empty for
    the next run to read as a data set."""
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for var in ("https_proxy", "http_proxy", "HTTPS_PROXY", "HTTP_PROXY"):
        monkeypatch.setenv(var, f"http://127.0.0.1:{port}")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    # urlopen's global opener reads the proxies once, when first built: built before, it ignores the dead
    # proxy (and would download for real); built here, every later urlopen of this process went through
    # it (the UI test's health check never got an answer). A fresh one now, and none left after.
    monkeypatch.setattr(urllib.request, "_opener", None)
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "mine.txt").write_text("a user's file\n")
    for root, gone in ((tmp_path / "new" / "cifar", tmp_path / "new"), (tmp_path / "keep" / "cifar", None),
                       (tmp_path / "a" / ".." / "b" / "cifar", tmp_path / "b")):  # makes both a and b
        with pytest.raises(DataError, match=f"{root}: could not download CIFAR-10"):
            load_splits(DataConfig(name="cifar10", data_dir=str(root), download=True))
        assert not root.exists()
        if gone is not None:
            assert not gone.exists()
    assert not (tmp_path / "a").exists()
    assert (tmp_path / "keep" / "mine.txt").read_text() == "a user's file\n"  # a folder it did not make stays
