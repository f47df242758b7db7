"""Datasets, the held-out validation split, the device-resident pipeline and the elastic sampler.

Every dataset is brought to one shape: ``ImageSet(images uint8 [N,C,H,W], labels int64 [N])``.
Datasets this small (CIFAR is 150 MB as uint8) live on the training device; augmentation
(pad-and-random-crop, horizontal flip, normalisation) runs there too, so a step never waits
on a host worker.

Sources:
- ``digits``: scikit-learn's handwritten digits (1,797 real 8x8 images that ship inside the
  scikit-learn wheel): the offline default for CPU runs and tests.
- ``cifar10`` / ``cifar100``: torchvision's on-disk format under ``data_dir``; downloaded by
  torchvision only when ``download: true``.
- ``imagefolder``: ``data_dir/train/<class>/**`` and ``data_dir/test/<class>/**`` (sub-folders of a
  class folder included), any image size, decoded once, resized, and cached on disk. train/ defines the
  classes (at least 2); a test/ class folder that train/ lacks is an error, not silently dropped. Links are
  followed only where each image keeps the label of the folder it belongs to (``_walk_images``): a folder link
  out of its class folder, or a link into another class or split, is refused, naming the link.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from triaccel.config import DataConfig, check_crop_padding
from triaccel.kernels.reference import gather_augment_ref
from triaccel.errors import ConfigError, DataError

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".pgm", ".tif", ".tiff", ".webp")


@dataclass
class ImageSet:
    images: torch.Tensor  # uint8 [N, C, H, W]
    labels: torch.Tensor  # int64 [N]

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def subset(self, idx: torch.Tensor) -> "ImageSet":
        return ImageSet(self.images[idx], self.labels[idx])


@dataclass
class Splits:
    train: ImageSet
    val: ImageSet
    test: ImageSet
    classes: list
    mean: tuple  # per channel, in [0, 1] units
    std: tuple

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def in_channels(self) -> int:
        return int(self.train.images.shape[1])

    @property
    def image_size(self) -> int:
        return int(self.train.images.shape[-1])


# --------------------------------------------------------------------------- splits
def stratified_split(labels: torch.Tensor, fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic stratified split: (keep_idx, held_idx); each class contributes round(fraction * n_c)."""
    g = torch.Generator().manual_seed(seed)
    keep, held = [], []
    for c in torch.unique(labels).tolist():
        idx = torch.nonzero(labels == c).flatten()
        idx = idx[torch.randperm(len(idx), generator=g)]
        n_held = int(round(fraction * len(idx)))
        n_held = min(max(n_held, 1 if len(idx) > 1 else 0), len(idx) - 1) if len(idx) > 1 else 0
        held.append(idx[:n_held])
        keep.append(idx[n_held:])
    keep_t, held_t = torch.cat(keep).sort().values, torch.cat(held).sort().values
    return keep_t, held_t


# --------------------------------------------------------------------------- sources
def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits (1,797 8x8 images, values 0-16, and their labels), read from the file
    scikit-learn ships without importing scikit-learn: its import takes 1-2 s of every quickstart
    process (each search trial is one), the file 20 ms. Falls back to ``load_digits`` if the file moved."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    f = next((Path(p) / "datasets" / "data" / "digits.csv.gz" for p in (spec.submodule_search_locations or [])),
             None) if spec else None
    if f is not None and f.is_file():
        raw = np.loadtxt(f, delimiter=",")
        return raw[:, :-1].reshape(-1, 8, 8), raw[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits

    d = load_digits()
    return d.images, d.target.astype(np.int64)


def _digits() -> tuple[ImageSet, ImageSet, list]:
    images, target = digits_arrays()
    x = torch.from_numpy((images * (255.0 / 16.0)).round().astype(np.uint8)).unsqueeze(1)
    y = torch.from_numpy(target)
    # scikit-learn ships no test split: a fixed stratified 20 % (seed 0, independent of the run seed).
    train_idx, test_idx = stratified_split(y, 0.2, seed=0)
    full = ImageSet(x, y)
    return full.subset(train_idx), full.subset(test_idx), [str(i) for i in range(10)]


def _cifar(cfg: DataConfig, hundred: bool) -> tuple[ImageSet, ImageSet, list]:
    import torchvision

    name = "CIFAR-100" if hundred else "CIFAR-10"
    if not cfg.data_dir:
        raise DataError(f"data.data_dir: {name} needs a data_dir (the folder holding its files, or where to download them)")
    root = _expand("data.data_dir", cfg.data_dir)
    cls = torchvision.datasets.CIFAR100 if hundred else torchvision.datasets.CIFAR10
    # the outermost folders a download would make, as written and as resolved (new/../other makes both
    # new and other): a download that fails (no network, a corrupt archive, Ctrl-C) leaves none behind
    made = [m for m in {_first_missing(root), _first_missing(Path(os.path.abspath(root)))} if m] if cfg.download else []
    out = []
    try:
        for train in (True, False):
            try:
                ds = cls(root=str(root), train=train, download=cfg.download)
            except RuntimeError as e:
                hint = "" if cfg.download else " (set data.download: true to fetch it)"
                raise DataError(f"{root}: no {name} files found{hint}: {e}") from None
            except OSError as e:  # network failures during download
                raise DataError(f"{root}: could not download {name}: {e}") from None
            x = torch.from_numpy(np.ascontiguousarray(ds.data)).permute(0, 3, 1, 2).contiguous()
            y = torch.tensor(ds.targets, dtype=torch.int64)
            out.append(ImageSet(x, y))
            classes = list(ds.classes)
    except BaseException:
        for m in made:  # everything under it is this download's (an empty folder, a partial archive)
            shutil.rmtree(m, ignore_errors=True)
        raise
    return out[0], out[1], classes


def _first_missing(p: Path) -> Path | None:
    """The outermost folder of ``p`` that does not exist yet (None: all of it exists)."""
    return next((q for q in reversed([p, *p.parents]) if not q.exists()), None)


def _expand(key: str, value) -> Path:
    """``value`` with ``~`` expanded; a ``~user`` that names no user is refused naming the key."""
    try:
        return Path(value).expanduser()
    except RuntimeError as e:  # "Could not determine home directory."
        raise DataError(f"{key}: cannot expand {str(value)!r} (no such user, or no home directory: {e})") from None


def _class_dirs(split_dir: Path) -> list[str]:
    if not split_dir.is_dir():
        raise DataError(f"{split_dir}: missing (an ImageFolder root needs train/ and test/)")
    return sorted(p.name for p in split_dir.iterdir() if p.is_dir())


def _is_image(name: str) -> bool:
    return Path(name).suffix.lower() in IMG_EXTENSIONS


def _inside(path: str, folder: str) -> bool:
    """Whether the resolved ``path`` is ``folder`` or lies under it."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _walk_images(class_dir: Path, data_real: tuple = ()) -> list[Path]:
    """Image files of a class folder, its sub-folders included (as torchvision's ImageFolder), in a fixed order.

    Links are followed, within limits that keep every image labelled by the folder it belongs to: a link (to a
    folder or an image file) may point anywhere but to the class folder itself or an ancestor (a loop, or every
    class and the test split under one label) and into another class folder or split of the data set
    (``data_real``: the resolved train/ and test/ folders). A link that breaks these rules is refused, naming it
    and where it points; an image reached from both splits is refused in ``_imagefolder``."""
    def fail(e: OSError):
        raise DataError(f"{e.filename}: cannot list folder ({e.strerror})")

    home = os.path.realpath(class_dir)

    def check_link(link: Path, is_dir: bool) -> None:
        target = os.path.realpath(link)
        if is_dir:
            if target == home:
                raise DataError(f"{link}: a folder link to its own class folder {target} (a loop): remove the link")
            if _inside(home, target):
                raise DataError(f"{link}: a folder link to {target}, which holds its class folder {class_dir} (every "
                                f"image there, other classes and test/ included, would be labelled "
                                f"{class_dir.name!r}): remove the link")
            # a sub-folder linked in from elsewhere on disk (train/cat/batch2 -> /disk2/cat_batch2) is labelled by the
            # class folder holding the link, as its image files linked one by one are; one into the data set's
            # own train/ or test/ (or holding them) would relabel another class's or split's images
            if not _inside(target, home) and any(_inside(target, d) or _inside(d, target) for d in data_real):
                raise DataError(f"{link}: a folder link to {target}, inside (or holding) the data set's train/ or "
                                f"test/ folder (another class's or split's images would be labelled "
                                f"{class_dir.name!r}): remove the link")
        elif not _inside(target, home) and any(_inside(target, d) for d in data_real):
            raise DataError(f"{link}: a link to {target}, an image of another class folder or split (it would also "
                            f"be labelled {class_dir.name!r} here): remove the link")

    out, seen = [], set()
    for dirpath, dirnames, filenames in os.walk(class_dir, onerror=fail, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in seen:  # a folder linked twice inside the class folder: walk it once
            dirnames[:] = []
            continue
        seen.add(real)
        dirnames.sort()
        for d in dirnames:
            if os.path.islink(os.path.join(dirpath, d)):
                check_link(Path(dirpath) / d, is_dir=True)
        images = [Path(dirpath) / f for f in sorted(filenames) if _is_image(f)]
        for f in images:
            if f.is_symlink():
                check_link(f, is_dir=False)
        out.extend(images)
    return out


def _check_class_links(split_dir: Path, found: list, data_real: tuple) -> None:
    """A class folder that is a link must not lead to the data set's own train/ or test/ folders (or an
    ancestor of them): its images would be another class's, or the other split's, under this label."""
    for c in found:
        link = split_dir / c
        if not link.is_symlink():
            continue
        target = os.path.realpath(link)
        if any(_inside(d, target) for d in data_real):
            raise DataError(f"{link}: a class folder link to {target}, which holds the data set's train/ or test/ "
                            f"folder (every class would be labelled {c!r}): remove the link")
        if any(_inside(target, d) for d in data_real):
            raise DataError(f"{link}: a class folder link to {target}, inside the data set's train/ or test/ folder "
                            f"(another class's or split's images would be labelled {c!r}): remove the link")


def _check_no_shared_folders(folders: list[Path]) -> None:
    """No two class folders (of either split) may resolve to the same folder, or one inside another."""
    reals = {}
    for f in folders:
        real = os.path.realpath(f)
        if real in reals:
            raise DataError(f"{f}: resolves to {real}, which is also class folder {reals[real]} (through a link): "
                            f"the same images would be in two classes or in both splits")
        reals[real] = f
    for real, f in reals.items():
        for parent in map(str, Path(real).parents):
            other = reals.get(parent)
            if other is not None:
                raise DataError(f"{f}: resolves to {real}, inside class folder {other} (through a link): "
                                f"the same images would be in two classes or in both splits")


def _list_images(split_dir: Path, classes: list | None, data_real: tuple = ()) -> tuple[list[Path], list[int], list]:
    """Files and labels of one split. ``classes`` None: the training split, whose folders define the classes;
    otherwise the test split, labelled by the training split's class list."""
    found = _class_dirs(split_dir)
    if not found:
        loose = sum(1 for p in split_dir.iterdir() if p.is_file() and _is_image(p.name))
        hint = f"; its {loose} image files must sit in {split_dir}/<class>/" if loose else ""
        raise DataError(f"{split_dir}: no class folders (an ImageFolder split holds one folder per class{hint})")
    if classes is None:
        if len(found) < 2:
            raise DataError(f"{split_dir}: only one class folder ({found[0]}); a classifier needs at least 2 classes")
        classes = found
    else:
        extra = [c for c in found if c not in classes]
        if extra:
            them = "them" if len(extra) > 1 else "it"
            raise DataError(f"{split_dir}: class folder{'s' if len(extra) > 1 else ''} {', '.join(extra)} not in "
                            f"{split_dir.parent / 'train'} (the model has no output for {them}: add {them} to "
                            f"train/ or remove {them} from test/)")
    _check_class_links(split_dir, found, data_real)
    index = {c: i for i, c in enumerate(classes)}
    files, labels, empty = [], [], []
    for c in found:
        got = _walk_images(split_dir / c, data_real)
        if not got:
            empty.append(c)
        files.extend(got)
        labels.extend([index[c]] * len(got))
    if not files:
        raise DataError(f"{split_dir}: no image files in its class folders ({', '.join(IMG_EXTENSIONS)})")
    if empty:
        more = f" (as are {', '.join(empty[1:])})" if len(empty) > 1 else ""
        raise DataError(f"{split_dir / empty[0]}: class folder without image files{more}")
    return files, labels, classes


def _to_8bit(im):
    """A 16-bit grayscale image (``I;16*``, or ``I``: the mode of 16-bit PNGs in older PIL versions) rescaled
    0..65535 -> 0..255 as 8-bit ``L``: PIL's ``convert`` clips such values at 255 (a 16-bit image comes out almost
    all white). Values above 65535 clip. A float image (``F``) is refused. Other modes are returned as they are."""
    from PIL import Image

    if not (im.mode.startswith("I;16") or im.mode in ("I", "F")):
        return im
    if im.mode == "F":  # its range is the producer's choice (0..1, 0..255, ...): guessing it per image mislabels
        raise ValueError("a 32-bit float image: its value range is unknown; convert it to 8 or 16 bits")
    # one fixed range for every image of a data set (scaling each by its own values would decode 0.99 and 1.01
    # to 252 and 1): 16-bit, PNG's grayscale depth; 12-bit data stored in 16 bits comes out dark
    a = np.asarray(im).astype(np.float64)
    return Image.fromarray(np.clip(np.rint(a * (255.0 / 65535.0)), 0, 255).astype(np.uint8), "L")


def _decode(path: Path, size: int) -> np.ndarray:
    from PIL import Image

    try:
        with Image.open(path) as im:
            im = _to_8bit(im).convert("RGB")
            if im.size != (size, size):
                im = im.resize((size, size), Image.BILINEAR)
            return np.asarray(im, dtype=np.uint8)
    except Exception as e:  # PIL raises many types for broken files
        raise DataError(f"{path}: cannot read image ({type(e).__name__}: {e})") from None


def _cache_key(files: list[Path], labels: list[int], classes: list, size: int) -> str:
    """Everything a cached split depends on: the image side, the class list, and each file's path, label and
    identity on disk (size, mtime, inode), so that a new class, a re-labelled or an edited image is decoded anew."""
    # v3: the decoding's version (16-bit grayscale rescaled, not clipped white): a cache that another
    # decoding wrote is not reused
    h = hashlib.sha1(f"v3|{size}|{len(files)}|{len(classes)}\n".encode())
    for c in classes:
        h.update(f"class|{c}\n".encode())
    for p, y in zip(files, labels):
        try:
            st = p.stat()
        except OSError as e:  # a dangling symlink, or a file removed while listing
            raise DataError(f"{p}: cannot read image ({e.strerror})") from None
        h.update(f"{os.path.abspath(p)}|{y}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}\n".encode())
    return h.hexdigest()[:16]


def _load_cache(cache: Path, n: int, size: int, labels: torch.Tensor) -> ImageSet | None:
    """The cached split, or None when it is missing, unreadable or does not match the listing."""
    if not cache.is_file():
        return None
    try:
        blob = torch.load(cache, weights_only=True)
        x, y = blob["images"], blob["labels"]
        ok = (x.dtype == torch.uint8 and x.dim() == 4 and tuple(x.shape[:1]) + tuple(x.shape[2:]) == (n, size, size)
              and torch.equal(y, labels))
    except Exception:  # a truncated or foreign file: decode again and overwrite it
        return None
    return ImageSet(x, y) if ok else None


def _decode_folder(files: list[Path], labels: list[int], classes: list, size: int, cache_dir: Path) -> ImageSet:
    y = torch.tensor(labels, dtype=torch.int64)
    cache = cache_dir / f"imagefolder-{_cache_key(files, labels, classes, size)}.pt"
    cached = _load_cache(cache, len(files), size, y)
    if cached is not None:
        return cached
    from triaccel.progress import bar

    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as ex, \
            bar(len(files), f"decoding {len(files)} images ({size}px, cached afterwards)", "img") as pb:
        arrays = []
        for a in ex.map(lambda p: _decode(p, size), files):
            arrays.append(a)
            pb.update()
    x = torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).contiguous()
    # a private temporary name (concurrent trials may decode the same split), then an atomic rename: a crash
    # mid-write never leaves a half cache. The cache only saves time: failing to write it is not an error.
    tmp = cache.with_name(f"{cache.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        if cache_dir.exists() and not cache_dir.is_dir():
            raise NotADirectoryError(20, "not a folder", str(cache_dir))
        cache_dir.mkdir(parents=True, exist_ok=True)
        torch.save({"images": x, "labels": y}, tmp)
        os.replace(tmp, cache)
    except OSError as e:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:  # cache_dir (or a folder above it) is not a folder: there is no temporary file
            pass
        warnings.warn(f"data.cache_dir: {cache_dir}: cannot write the decoded-image cache ({e.strerror or e}); "
                      f"training goes on without it", stacklevel=2)
    return ImageSet(x, y)


def _imagefolder(cfg: DataConfig) -> tuple[ImageSet, ImageSet, list]:
    if not cfg.data_dir:
        raise DataError("data.data_dir: imagefolder needs a data_dir holding train/ and test/")
    root = _expand("data.data_dir", cfg.data_dir)
    if not root.is_dir():
        what = "is not a folder" if root.exists() else "does not exist"
        raise DataError(f"{root}: data_dir {what} (data.data_dir: a folder holding train/ and test/)")
    size = cfg.image_size or 32
    cache_dir = _expand("data.cache_dir", cfg.cache_dir or "~/.cache/triaccel")
    # both splits are listed and checked before anything is decoded: bad data fails in seconds, not after a decode
    data_real = (os.path.realpath(root / "train"), os.path.realpath(root / "test"))
    train_files, train_labels, classes = _list_images(root / "train", None, data_real)
    test_files, test_labels, _ = _list_images(root / "test", classes, data_real)
    _check_no_shared_folders([root / s / c for s in ("train", "test") for c in _class_dirs(root / s)])
    # one file reached from both splits (train/cat/x.png and test/cat/x.png linking one pool image): a test
    # image the model trained on
    in_train = {os.path.realpath(f): f for f in train_files}
    both = next((f for f in test_files if os.path.realpath(f) in in_train), None)
    if both is not None:
        raise DataError(f"{both}: the same image file ({os.path.realpath(both)}) as {in_train[os.path.realpath(both)]} "
                        f"in train/: a test image would be trained on; remove one of the links")
    _check_fits(len(train_files) + len(test_files), 3, size)
    train = _decode_folder(train_files, train_labels, classes, size, cache_dir)
    test = _decode_folder(test_files, test_labels, classes, size, cache_dir)
    return train, test, classes


DATASETS = {
    "digits": lambda cfg: _digits(),
    "cifar10": lambda cfg: _cifar(cfg, hundred=False),
    "cifar100": lambda cfg: _cifar(cfg, hundred=True),
    "imagefolder": _imagefolder,
}


def load_splits(cfg: DataConfig) -> Splits:
    """Load a dataset and carve the stratified validation split from its training set."""
    if cfg.name not in DATASETS:
        raise DataError(f"data.name: unknown dataset {cfg.name!r} (valid: {', '.join(sorted(DATASETS))})")
    train_full, test, classes = DATASETS[cfg.name](cfg)
    if cfg.image_size and cfg.name != "imagefolder" and train_full.images.shape[-1] != cfg.image_size:
        _check_fits(len(train_full) + len(test), train_full.images.shape[1], cfg.image_size, as_float=True)
        train_full = ImageSet(_resize_u8(train_full.images, cfg.image_size), train_full.labels)
        test = ImageSet(_resize_u8(test.images, cfg.image_size), test.labels)
    bad = check_crop_padding(cfg, min(train_full.images.shape[-2:]))  # the dataset's own side when image_size is unset
    if bad:
        raise ConfigError(f"data.crop_padding: {bad}")
    keep, held = stratified_split(train_full.labels, cfg.val_fraction, seed=cfg.split_seed)
    train, val = train_full.subset(keep), train_full.subset(held)
    if len(val) == 0 or len(train) == 0:
        raise DataError(f"data.val_fraction: {cfg.val_fraction} of {len(train_full)} training images leaves "
                        f"{len(train)} to train and {len(val)} to validate on (the split is made per class, and a "
                        f"class of one image cannot be split): each class needs at least 2 training images")
    # per-channel statistics from (at most) 10,000 training images: a float copy of all of CIFAR is 550 MB
    sample = train.images[torch.randperm(len(train), generator=torch.Generator().manual_seed(0))[:10_000]]
    xf = sample.float().div_(255)
    mean = tuple(xf.mean(dim=(0, 2, 3)).tolist())
    std = tuple(xf.std(dim=(0, 2, 3)).clamp_min(1e-3).tolist())
    return Splits(train, val, test, classes, mean, std)


def _check_fits(n_images: int, channels: int, size: int, as_float: bool = False) -> None:
    """data.image_size: refuse, in one line, a size whose decoded dataset cannot fit in this
    machine's memory (instead of an allocator traceback minutes later)."""
    need = n_images * channels * size * size * (4 if as_float else 1)
    try:
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return
    if need > have:
        raise DataError(f"data.image_size: {size} px needs {need / 2**30:,.0f} GiB for {n_images:,} images "
                        f"(this machine has {have / 2**30:,.0f} GiB)")


def _resize_u8(x: torch.Tensor, size: int) -> torch.Tensor:
    y = F.interpolate(x.float(), size=(size, size), mode="bilinear", align_corners=False, antialias=True)
    return y.round_().clamp_(0, 255).to(torch.uint8)


# --------------------------------------------------------------------------- device pipeline
class ResidentData:
    """A split held as uint8 on the device (or pinned host memory), batched by index.

    ``batch(idx, train=True)`` gathers the examples, then on the device: zero-pad and random
    crop, random horizontal flip, scale to [0, 1] and normalise. Random draws come from a
    seeded device generator, so a run is reproducible.
    """

    def __init__(self, data: ImageSet, device: torch.device, mean, std, *, augment: bool,
                 padding: int, resident: bool = True, seed: int = 0, kernel: str = "torch"):
        self.device = device
        self.resident = resident or device.type == "cpu"
        store = device if self.resident else torch.device("cpu")
        self.x = data.images.to(store)
        self.y = data.labels.to(store)
        if not self.resident and device.type == "cuda":
            self.x, self.y = self.x.pin_memory(), self.y.pin_memory()
        c = self.x.shape[1]
        self.mean = torch.tensor(mean, device=device).view(1, c, 1, 1)
        self.inv_std = (1.0 / torch.tensor(std, device=device)).view(1, c, 1, 1)
        self.augment = augment
        self.padding = padding
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.channels_last = False  # set by the trainer (`channels_last`)
        # "triton": one launch per batch (kernels/augment.py); "torch": the reference's dozen launches;
        # "auto": triton for a dataset resident on a CUDA device, torch elsewhere
        if kernel not in ("triton", "torch", "auto"):
            raise ValueError(f"kernel must be auto, triton or torch, got {kernel!r}")
        if kernel == "auto":
            kernel = "triton" if device.type == "cuda" else "torch"
        self.use_triton = self.resident and kernel == "triton"
        if self.use_triton:
            from triaccel.kernels.augment import gather_augment_triton as assemble
        else:
            assemble = gather_augment_ref
        self._assemble = assemble

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def draws(self, n: int):
        """This batch's random crop offsets and flips, from the split's seeded generator."""
        dev = self.gen.device
        if self.padding > 0:
            oy = torch.randint(0, 2 * self.padding + 1, (n,), device=dev, generator=self.gen)
            ox = torch.randint(0, 2 * self.padding + 1, (n,), device=dev, generator=self.gen)
        else:
            oy = ox = torch.zeros(n, dtype=torch.long, device=dev)
        flip = torch.rand(n, device=dev, generator=self.gen) < 0.5
        return oy, ox, flip

    def batch(self, idx: torch.Tensor, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        draws = self.draws(len(idx)) if train and self.augment and len(idx) else None
        if self.resident:
            idx = idx.to(self.x.device, non_blocking=True)
            return self._assemble(self.x, idx, draws, self.mean, self.inv_std, self.padding, self.channels_last), \
                self.y[idx]
        x = self.x[idx].to(self.device, non_blocking=True)
        y = self.y[idx].to(self.device, non_blocking=True)
        local = torch.arange(len(idx), device=self.device)
        return gather_augment_ref(x, local, draws, self.mean, self.inv_std, self.padding, self.channels_last), y


# --------------------------------------------------------------------------- elastic sampler
class ElasticSampler:
    """An epoch's shuffled order, handed out in pieces of any size.

    ``take(k)`` returns the next ``k`` indices (fewer at the end of the epoch). Whatever sizes
    are asked for, within an epoch every example is handed out exactly once: the
    memory-elastic controller may change the batch at any step without losing or repeating
    a sample. The order is a pure function of (seed, epoch), so ``state_dict`` is two integers.
    """

    def __init__(self, n: int, seed: int, shuffle: bool = True, device: torch.device | None = None):
        if n <= 0:
            raise DataError("the training split is empty")
        self.n, self.seed, self.shuffle = n, seed, shuffle
        # The epoch's order is copied to the device once per epoch: taking a batch is then a
        # slice on the device, not a host-to-device copy that would stall the host every step.
        self.device = device
        self.epoch, self.pos = 0, 0
        self._perm = self._order(0)

    def _order(self, epoch: int) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(self.n, device=self.device)
        g = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        perm = torch.randperm(self.n, generator=g)
        return perm.to(self.device) if self.device is not None else perm

    def start_epoch(self, epoch: int) -> None:
        self.epoch, self.pos = epoch, 0
        self._perm = self._order(epoch)

    @property
    def remaining(self) -> int:
        return self.n - self.pos

    def take(self, k: int) -> torch.Tensor:
        if k < 1:
            raise ValueError(f"batch size must be >= 1, got {k}")
        idx = self._perm[self.pos:self.pos + k]
        self.pos += len(idx)
        return idx

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, s: dict) -> None:
        self.start_epoch(s["epoch"])
        self.pos = s["pos"]
