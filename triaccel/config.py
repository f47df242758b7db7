"""Typed training configuration, validated at the edge.

YAML (or a dict) -> frozen-ish dataclasses. Unknown keys, wrong types and impossible values
fail with a ``ConfigError`` that names the dotted key, e.g. ``optim.lr: must be > 0``.
One generic converter (``from_dict``) walks the dataclass fields, so every section gets the
same checks; each section's ``__post_init__`` adds the value checks that types cannot say.
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

# the reading and conversion helpers are named here too: ``from triaccel.config import read_yaml`` and the rest
from triaccel.config_io import (FLOAT32_MAX, MAX_YAML_BYTES, MAX_YAML_DEPTH, MAX_YAML_VALUES,  # noqa: F401
                                PREPARE, TOO_DEEP, did_you_mean, flatten, from_dict, parse_overrides, path_kind,
                                read_yaml, set_dotted, to_dict)
from triaccel.config_io import check as _check
from triaccel.errors import ConfigError


MAX_BATCH = 2**24  # far above any batch that fits a device; larger values overflow inside torch
# model.width: small_cnn's first-conv channels (its last conv has 4x), mlp's hidden units. small_cnn at
# 1024 has 4096 channels in its last conv (8x ResNet-18's widest) and 94 M parameters; shipped configs
# use 16. At 4096 (1.5 G parameters, 18 GiB with grads and momentum) a digits run does not fit a
# 23 GiB machine; far larger widths fail in the allocator while the model is built.
MAX_WIDTH = 1024
# triaccel.curvature.top_k: Hessian eigenvalues per layer (paper: 5). The probe holds k vectors the
# size of the whole model two or three times over (ResNet-18 at k=64: 2.9 GB each, in fp32) and the
# exact probe does k Hessian-vector products per layer and iteration; a huge top_k exhausts memory.
MAX_TOP_K = 64
# model.resize: at most 2048 px a side (EfficientNet-B7 trains at 600); a larger side would pass
# set-up and fail allocating activations later. (data.image_size is checked against the data set's size
# when it loads: triaccel.data.)
MAX_IMAGE_SIDE = 2048
# data.image_size: the smallest side each model can take (triaccel.models.MODELS). small_cnn max-pools
# by 2 once (a 1 px image fails in torch: "Output size is too small"); resnet18 and efficientnet_b0 pad
# every strided conv and pool adaptively, mlp flattens: any side >= 1 runs.
MIN_IMAGE_SIZE = {"small_cnn": 2}
DEFAULT_WARMUP_EPOCHS = 5.0  # optim.warmup_epochs when unset (at most the run's length)


def check_crop_padding(dc, side: int) -> Optional[str]:
    """What is wrong with data.crop_padding for images of ``side`` px, or None. The random crop pads
    every side by crop_padding and cuts a side x side window: from crop_padding = side on, a crop may hold
    no image pixel at all, and the padded batch grows as (side + 2 * padding)^2
    (data.crop_padding=100000 would ask the allocator for 2.5 TB at the first batch)."""
    if dc.augment and dc.crop_padding >= side:
        return f"must be < the image side ({side} px) for the random crop, got {dc.crop_padding}"
    return None


def check_image_size(mc, side: int) -> Optional[str]:
    """What is wrong with images of ``side`` px for model ``mc``, or None (model.resize takes any)."""
    least = 1 if mc.resize else MIN_IMAGE_SIZE.get(mc.name, 1)
    return None if side >= least else f"{mc.name} needs images of at least {least} px, got {side}"


# --------------------------------------------------------------------------- sections
REFERENCE = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*(:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*)?|callable:[\w.<>]+")


def _check_reference(section, key: str) -> None:
    """class_path is a dotted import path (``mypkg.models.build`` or ``mypkg.models:build``), or
    ``callable:NAME`` for a function handed to the Python API (triaccel.userdef); init_args go to it."""
    cp = section.class_path
    _check(cp is None or REFERENCE.fullmatch(cp) is not None, f"{key}.class_path",
           f"must be an import path such as mypkg.models.build, got {cp!r}")
    _check(not section.init_args or cp is not None, f"{key}.init_args",
           f"are the arguments of {key}.class_path, which is not set")


KNOWN_DATASETS = {"digits", "cifar10", "cifar100", "imagefolder"}  # triaccel.data.DATASETS' names


def unknown_name(what: str, name, valid) -> str:
    """'unknown dataset 'digitz', did you mean digits? (valid: ...)': the nearest name where one is near."""
    return f"unknown {what} {name!r}{did_you_mean(name, valid)} (valid: {', '.join(sorted(valid))})"


@dataclass
class DataConfig:
    name: str = "digits"  # digits | cifar10 | cifar100 | imagefolder (ignored when class_path is set)
    # the user's data (triaccel.userdef): a factory called as factory(**init_args) returning a DataSplits,
    # or a mapping or object with train (required), val, test and meta; read instead of name
    class_path: Optional[str] = None
    init_args: dict = field(default_factory=dict)
    data_dir: Optional[str] = None  # root for cifar*/imagefolder (imagefolder: holds train/ and test/)
    download: bool = False  # cifar*: let torchvision download when the files are missing
    val_fraction: float = 0.1  # share of the training set held out, stratified, for validation
    split_seed: int = 0  # the validation split's seed: fixed, so every trial is judged on the same images
    image_size: Optional[int] = None  # resize images to this side (None: the dataset's own)
    augment: bool = True  # pad-and-random-crop + horizontal flip (on the device)
    crop_padding: int = 4  # pixels, for the random crop
    device_resident: bool = True  # keep the whole uint8 dataset on the training device
    cache_dir: Optional[str] = None  # decoded-image cache (default ~/.cache/triaccel)
    # batch assembly on the device: "torch" (gather, pad, crop, flip, normalise: about a dozen launches),
    # "triton" (one launch, kernels/augment.py, same batch as torch) or "auto" (triton on CUDA)
    kernel: Literal["torch", "triton", "auto"] = "torch"

    def __post_init__(self):
        _check(0.0 < self.val_fraction < 1.0, "data.val_fraction", f"must be in (0, 1), got {self.val_fraction}")
        _check(self.image_size is None or self.image_size > 0, "data.image_size", "must be > 0")
        _check(self.crop_padding >= 0, "data.crop_padding", "must be >= 0")
        # as `seed`: torch.Generator takes no seed past 64 bits ("Overflow when unpacking long long")
        _check(0 <= self.split_seed < 2**32, "data.split_seed", f"must be in [0, 2**32), got {self.split_seed}")
        # with the config, not when the data loads: a search whose space misspells it took its name first
        _check(self.class_path is not None or self.name in KNOWN_DATASETS, "data.name",
               unknown_name("dataset", self.name, KNOWN_DATASETS))
        _check_reference(self, "data")

    def unread(self) -> tuple[str, ...]:
        """The keys a run never reads: with class_path, the built-in datasets' (left out of an export)."""
        return () if self.class_path is None else (
            "name", "data_dir", "download", "image_size", "augment", "crop_padding", "cache_dir", "kernel")

    def check_read(self) -> None:
        """Keys this dataset would ignore (as model.resize): a user who set data_dir for digits meant
        another dataset. Checked where a config is written by hand (``load_config``, a new search's
        space), not in a saved search's space, which is read as it was accepted."""
        if self.class_path is not None:  # the factory reads its own data, as it is, with no augmentation
            for key, unused in (("name", self.name != DataConfig.name), ("data_dir", self.data_dir is not None),
                                ("download", self.download),
                                ("image_size", self.image_size is not None), ("cache_dir", self.cache_dir is not None)):
                _check(not unused, f"data.{key}", f"is for the built-in datasets; data.class_path's factory reads "
                                                  f"its own data (pass what it needs in data.init_args)")
            return
        _check(self.data_dir is None or self.name != "digits", "data.data_dir",
               "digits ships with the install and reads no folder; data_dir is for cifar10, cifar100 and imagefolder "
               "(set data.name, or data.data_dir: null)")
        _check(not self.download or self.name not in ("digits", "imagefolder"), "data.download",
               f"only cifar10 and cifar100 download (through torchvision); {self.name} would ignore it")


RESIZING_MODELS = {"efficientnet_b0"}  # the models that read model.resize (triaccel.models.MODELS)
KNOWN_MODELS = {"resnet18", "efficientnet_b0", "small_cnn", "mlp"}  # triaccel.models.MODELS' names
ZOO_SOURCES = ("torchvision", "timm")  # model.name: SOURCE/NAME (triaccel.hub)


@dataclass
class ModelConfig:
    # triaccel.models.MODELS, or a zoo model: torchvision/NAME (any classification model of
    # torchvision.models.list_models()) or timm/NAME (pip install -e '.[timm]'); ignored when class_path is set
    name: str = "small_cnn"
    kwargs: dict = field(default_factory=dict)  # a zoo model's constructor arguments (torchvision/..., timm/...)
    # the user's model (triaccel.userdef): factory(**init_args, plus num_classes, in_channels, image_size and
    # the data's meta keys where its signature takes them and init_args leaves them unset) -> nn.Module
    class_path: Optional[str] = None
    init_args: dict = field(default_factory=dict)
    resize: Optional[int] = None  # resize inputs inside the model (EfficientNet-B0 at 224 as in the paper)
    width: int = 32  # small_cnn only: channels of the first conv

    def __post_init__(self):
        _check(self.resize is None or 0 < self.resize <= MAX_IMAGE_SIDE, "model.resize",
               f"must be in [1, {MAX_IMAGE_SIDE}] px, got {self.resize}")
        # only EfficientNet-B0 resizes its input: another model would ignore resize, and the model's
        # least image size would go unchecked (data.image_size=1 fails inside max_pool2d)
        own = self.class_path is not None or "/" in self.name  # the user's model, a zoo model: no resize either
        _check(self.resize is None or self.name in RESIZING_MODELS or (self.name not in KNOWN_MODELS and not own),
               "model.resize", f"only {' and '.join(sorted(RESIZING_MODELS))} resizes its input; "
                               f"{self.label()} would ignore it")
        _check(0 < self.width <= MAX_WIDTH, "model.width",
               f"must be in [1, {MAX_WIDTH}] (small_cnn's first-conv channels, mlp's hidden units), got {self.width}")
        _check_reference(self, "model")
        if self.class_path is None:  # with the config, not when the model is built (as data.name)
            source, slash, arch = self.name.partition("/")
            _check(slash or self.name in KNOWN_MODELS, "model.name", unknown_name("model", self.name, KNOWN_MODELS))
            _check(not slash or (source in ZOO_SOURCES and arch), "model.name",
                   f"unknown model {self.name!r} (a zoo model is torchvision/NAME or timm/NAME)")
        _check(not self.kwargs or "/" in self.name, "model.kwargs",
               f"are a zoo model's arguments (model.name: torchvision/NAME or timm/NAME); {self.name} takes none")

    def unread(self) -> tuple[str, ...]:
        """The keys a run never reads: with class_path, the named models' (see DataConfig.unread)."""
        return () if self.class_path is None else ("name", "kwargs", "resize", "width")

    @staticmethod
    def check_written(section: Any, set_keys: tuple[str, ...] = ()) -> None:
        """A named model's key written beside class_path, in one hand-written section (``section``, a
        config file's or a new space's ``model``) or given with ``--set`` (``set_keys``, the keys under
        model.), would be ignored: ``model: {class_path: pkg.build, width: 4}``, the factory's argument
        written beside its path as Hydra does, trained width 32. A class_path given with ``--set`` on a
        shipped config that sets width is not this: the file's width was never the factory's."""
        beside = isinstance(section, dict) and section.get("class_path") is not None
        for key in ("name", "width"):  # kwargs and resize: refused by __post_init__ whatever wrote them
            if (beside and key in section) or key in set_keys:
                raise ConfigError(f"model.{key}: is for the named models and not read with model.class_path; "
                                  f"the factory takes its arguments in model.init_args (model.init_args.{key})")

    def label(self) -> str:
        """The model as a person names it: the factory's reference, or the name."""
        return self.class_path or self.name


def _float_or_same(v: Any) -> Any:
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            pass
    return v


@dataclass
class OptimConfig:
    name: Literal["sgd", "adamw"] = "sgd"
    lr: float = 0.05  # base lr eta_0, per `batch_size` examples
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 5e-4
    betas: tuple = (0.9, 0.999)  # adamw
    # linear warm-up, then cosine decay to 0; at most `epochs` (longer, the lr would never reach optim.lr).
    # Unset: 5 epochs, or the whole run when it is shorter.
    warmup_epochs: Optional[float] = None
    clip_grad_norm: Optional[float] = None  # None: no clipping

    def __post_init__(self):
        _check(self.lr > 0 and math.isfinite(self.lr), "optim.lr", f"must be > 0 and finite, got {self.lr}")
        _check(0 <= self.momentum < 1, "optim.momentum", "must be in [0, 1)")
        _check(self.weight_decay >= 0, "optim.weight_decay", "must be >= 0")
        _check(self.warmup_epochs is None or self.warmup_epochs >= 0, "optim.warmup_epochs", "must be >= 0")
        _check(self.clip_grad_norm is None or self.clip_grad_norm > 0, "optim.clip_grad_norm", "must be > 0")
        # torch raises "Nesterov momentum requires a momentum and zero dampening" only at the first step
        _check(not (self.nesterov and self.name == "sgd" and self.momentum == 0), "optim.nesterov",
               "needs optim.momentum > 0 (Nesterov momentum with no momentum is plain SGD)")
        # YAML 1.1 reads 9e-1 (no dot) as a string; a float key takes it (optim.lr=5e-2), so betas do too
        self.betas = tuple(_float_or_same(b) for b in self.betas) if isinstance(self.betas, (list, tuple)) else \
            self.betas
        # each beta a number, checked here so a string beta is named by its key, not by a TypeError
        _check(len(self.betas) == 2 and all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1
                                            for b in self.betas), "optim.betas",
               f"two numbers in [0, 1), got {list(self.betas)!r}")
        self.betas = tuple(float(b) for b in self.betas)


PRECISION_TAU_DEFAULTS = {"absolute": (1e-7, 1e-4), "relative": (200.0, 1e4)}  # (tau_low, tau_high) when unset


@dataclass
class PrecisionConfig:
    """§3.1: per-layer FP16/BF16/FP32 from an EMA of gradient variance."""

    enabled: bool = True
    # absolute: the paper's rule, tau in units of the gradient variance itself (model-dependent);
    # relative (default; triaccel.policy: paper makes it absolute): tau in units of this window's
    # median layer variance, so a tau range means the same for any model (tau_low above every
    # ratio: every layer FP16; tau_high below every ratio: every layer FP32). On ResNet-18/CIFAR the
    # layers' variances span ~4 decades (README). EfficientNet-B0 at 224 px with the absolute
    # defaults places 54 of 82 layers in FP32: 5x the epoch time (bench/results/effnet224/h200_effnet224_diag.json).
    scale: Literal["absolute", "relative"] = "relative"
    # v < tau_low -> FP16; v >= tau_high -> FP32 (between: BF16). Unset: the scale's default,
    # absolute 1e-7 / 1e-4 (the paper's kind of value); relative 200 / 1e4: FP16 unless a layer's
    # variance is 200x the median layer's. ResNet-18/CIFAR-10 at the start of training (CPU, B=96):
    # ratios 0.08 .. 112, the fc layer highest, the stem conv 44; every 16-bit plan is the fastest
    # measured on an H200 (fp16 captured B=96: 1.19 s/epoch, bf16 1.37, all FP32 1.86 and 1.5x the memory).
    tau_low: Optional[float] = None
    # unset: the scale's default, or 10x tau_low where tau_low is set at or above that default (a tau_low
    # of 1e5 under the relative scale makes tau_high 1e6: every layer below both, FP16); unset tau_low
    # beside a set tau_high is the default or tau_high / 10, whichever is lower
    tau_high: Optional[float] = None
    beta: float = 0.9  # EMA smoothing of the per-layer gradient variance
    hysteresis: float = 0.1  # relative band around each threshold a layer must cross to move
    min_dwell: int = 2  # control windows a layer keeps a dtype before it may move again
    overflow_promote: bool = True  # a GradScaler overflow promotes the FP16 layers with non-finite grads
    # The loss scale at or below which an fp16 overflow moves its layer to BF16 (overflow_promote): there
    # the gradients themselves are past fp16's range (a forward that overflows fp16 brings it there in ~16 skipped steps from 65536). Above it an
    # overflow is the scaler finding its scale (its first steps down from 65536, then a probe every
    # growth_interval steps), which the skipped step already handles: promoting there moved an
    # EfficientNet-B0 layer to bf16 and back twice in 16 epochs, each move a recompile (60 s on an H100)
    # and a transient peak 58 % above the run's (bench/results/effnet_b0/h100_start3_16ep.json). A move
    # restarts the scale at the GradScaler's initial value (said in a line): the fp16 layers left would
    # otherwise train under the scale the overflows drove down, their small gradients flushed to zero.
    overflow_scale: float = 1.0
    # On a CPU, fp16 is the slow 16-bit type (a 3x3 conv's forward + backward: 9.8 ms in fp16 autocast,
    # 0.56 ms in bf16, 0.87 ms in fp32; torch 2.14, 2-core EPYC): layers at fp16 run in bf16 there,
    # said once at set-up. true keeps fp16 on a CPU (tests of the fp16 path: GradScaler, overflows).
    cpu_fp16: bool = False
    # The 16-bit type of the lowest level (the paper's FP16). bf16 makes the ladder bf16 / bf16 / fp32:
    # no layer runs fp16 and no GradScaler runs. On a GPU whose bf16 is as fast as its fp16, the fp16
    # level buys nothing and its loss scaling (unscale, checks, skipped steps) costs time.
    half: Literal["fp16", "bf16"] = "fp16"
    # The optimizer's state (SGD momentum; AdamW's two moments) in bf16: the fused kernels compute
    # each update in fp32 and store the state rounded once; master weights and gradients stay
    # fp32. Half the state's memory (ResNet-18: 21 of 43 MiB), which the efficiency score's peak
    # memory sees. fp32 (default) is torch.optim's arithmetic.
    optimizer_state: Literal["fp32", "bf16"] = "fp32"
    # The layers' master weights (and so their gradients) in bf16 while the precision controller has a
    # layer compute in 16 bits, fp32 while it is at FP32: half their memory twice over, and no
    # per-forward cast of a weight to bf16. Norms and parameters of no layer stay fp32. The fused
    # kernels compute each update in fp32 and store it as ``rounding`` says: stochastic (exact in
    # expectation), kahan (nearest, the rounding error kept in a bf16 buffer per weight and added back:
    # the weights' memory of fp32 again, the gradients' saving kept), nearest (an update below half a
    # bf16 step is lost).
    master_weights: Literal["fp32", "bf16"] = "fp32"
    rounding: Literal["stochastic", "kahan", "nearest"] = "stochastic"
    # What new precision plans may cost once, as a fraction of the run's predicted training time. Under
    # compile each plan is a graph of its own, compiled when first met (GPT, B0 32, on an H200: epochs of
    # 23-28 s against 0.3 s where the plan kept moving). A new plan is taken while the compile seconds
    # spent on new plans, and the next one's (predicted from the last compile), stay within this share;
    # past it the plan holds, and only an fp16 overflow still moves a layer. Eager and captured runs
    # compile nothing, so this never holds them, except 0, which takes no new plan on any run.
    plan_budget: float = 0.05

    def __post_init__(self):
        lo, hi = PRECISION_TAU_DEFAULTS.get(self.scale, PRECISION_TAU_DEFAULTS["absolute"])
        if self.tau_low is None:
            self.tau_low = lo if self.tau_high is None else min(lo, self.tau_high / 10)
        if self.tau_high is None:
            self.tau_high = max(hi, self.tau_low * 10)
        _check(self.tau_low > 0, "triaccel.precision.tau_low", "must be > 0")
        _check(self.tau_low < self.tau_high, "triaccel.precision.tau_high",
               f"must be > tau_low ({self.tau_low}), got {self.tau_high}")
        _check(0 <= self.beta < 1, "triaccel.precision.beta", "must be in [0, 1)")
        _check(0 <= self.hysteresis < 1, "triaccel.precision.hysteresis", "must be in [0, 1)")
        _check(self.min_dwell >= 0, "triaccel.precision.min_dwell", "must be >= 0")
        _check(self.overflow_scale > 0, "triaccel.precision.overflow_scale",
               "must be > 0 (a GradScaler's scale is positive; overflow_promote: false turns the moves off)")
        _check(self.plan_budget >= 0, "triaccel.precision.plan_budget", "must be >= 0 (a fraction of the run's time)")


@dataclass
class CurvatureConfig:
    """§3.2: top-k per-layer Hessian eigenvalues, per-layer lr eta_l = eta_0 / (1 + alpha * lambda_max)."""

    enabled: bool = True
    # power (triaccel.policy: paper): Hessian subspace iteration; fisher (default): a proxy from the
    # gradient statistics the precision controller samples anyway, ~free (power's probe at 224 px on
    # EfficientNet-B0 does not finish an epoch in 170 s on an H200)
    method: Literal["power", "fisher"] = "fisher"
    # power: exact (one HVP per layer and vector: accurate, cost grows with the layer count), batched
    # (sign-mixed HVPs shared by all layers: k per iteration whatever the depth, biased ~1.4x), or auto:
    # exact up to 32 layers (ResNet-18: 21), batched above (EfficientNet-B0: 82 layers; exact at 224 px
    # does not finish an epoch in 170 s on an H200)
    probe: Literal["auto", "exact", "batched"] = "auto"
    probe_dtype: Literal["fp32", "bf16"] = "fp32"  # precision of the probe's forward and products
    graphs: bool = True  # power on CUDA: capture one probe iteration in a CUDA graph, replay it (no host cost)
    alpha: float = 0.01
    # paper: eta_l = eta_0 / (1 + alpha * lambda_l), lambda in the probe's own units (a Hessian
    # eigenvalue and the Fisher proxy differ by orders of magnitude, so alpha's meaning moves with
    # the method and the model); normalized: r_l = lambda_l / median over layers, eta_l = eta_0 /
    # (1 + alpha * max(0, r_l - 1)) floored at min_lr_scale: layers at or below the median curvature
    # keep eta_0, sharper ones are damped, none below min_lr_scale * eta_0 (no layer starves).
    # tau_curv is compared with the same quantity (lambda, or r).
    lr_rule: Literal["paper", "normalized"] = "normalized"  # triaccel.policy: paper -> paper
    min_lr_scale: float = 0.1  # normalized: the smallest lr scale any layer gets
    # a layer whose curvature exceeds tau_curv runs one precision level higher: compared with lr_rule's
    # quantity, r_l = lambda_l / median (normalized) or lambda_l (paper)
    tau_curv: float = 100.0
    top_k: int = 5  # paper: k = 5
    every: int = 200  # T_curv, optimizer steps between refreshes (paper: 200)
    batch: int = 32  # b_curv (paper: 32)
    max_iters: int = 8  # iteration cap per refresh (warm-started from the last refresh)
    tol: float = 1e-2  # relative change of every lambda that stops the iteration
    ema: float = 0.5  # smoothing of lambda across refreshes

    def __post_init__(self):
        _check(self.alpha >= 0, "triaccel.curvature.alpha", "must be >= 0")
        _check(self.tau_curv > 0, "triaccel.curvature.tau_curv", "must be > 0")
        _check(0 < self.min_lr_scale <= 1, "triaccel.curvature.min_lr_scale", "must be in (0, 1]")
        _check(1 <= self.top_k <= MAX_TOP_K, "triaccel.curvature.top_k",
               f"must be in [1, {MAX_TOP_K}] (Hessian eigenvalues per layer; the paper uses 5), got {self.top_k}")
        _check(self.every >= 1, "triaccel.curvature.every", "must be >= 1")
        _check(self.batch >= 1, "triaccel.curvature.batch", "must be >= 1")
        _check(self.max_iters >= 1, "triaccel.curvature.max_iters", "must be >= 1")
        _check(self.tol > 0, "triaccel.curvature.tol", "must be > 0")
        _check(0 <= self.ema < 1, "triaccel.curvature.ema", "must be in [0, 1)")

    def unread(self) -> tuple[str, ...]:
        """The keys a run never reads (left out of an export): the Hessian probe's under the Fisher proxy."""
        return () if self.method == "power" else ("probe", "probe_dtype", "graphs", "top_k", "batch", "max_iters", "tol")


@dataclass
class BatchConfig:
    """§3.3: memory-elastic batch between rho_low and rho_high of the budget."""

    enabled: bool = True
    mode: Literal["paper", "constant"] = "paper"  # paper: B changes, lr follows lr_rule; constant: only micro-batch
    # paper: fill the memory budget (grow below rho_low, shrink above rho_high, steps delta_up/down);
    # score: find the size with the lowest time x peak memory per example (the efficiency score's
    # denominator) early in the run, in short windows of explore_steps: a smaller size first (B0 /
    # grow_factor), on down while the cost falls, else growing by grow_factor only where the sizes
    # measured predict a lower cost; then hold it (cuDNN autotuning is on from the first step: each
    # size explored is tuned once, within the cost exploring measures). The budget (rho_high of it) stays a cap; delta_down is the step under it.
    policy: Literal["paper", "score"] = "score"  # triaccel.policy: paper -> paper
    grow_factor: float = 1.5  # score: size ladder B0 * grow_factor^k (multiples of 8)
    explore_steps: int = 10  # score: optimizer steps per measuring window while exploring
    explore_tol: float = 0.03  # score: a size must cut the cost by this fraction to count as better
    # score: a new size costs once (its kernels chosen or tuned: EfficientNet-B0 at 224 px, 7-15 s on an
    # H200); exploring moves to one only while those one-off seconds stay within this fraction of the
    # run's predicted training time (epochs x examples at B0's measured rate); 0 never leaves B0
    explore_budget: float = 0.05
    rho_low: float = 0.6
    rho_high: float = 0.85
    delta_up: int = 16
    delta_down: int = 32
    min_batch: int = 8
    max_batch: int = 4096
    budget_gb: Optional[float] = None  # MemMax in GiB; None -> budget_fraction of the device
    budget_fraction: float = 0.9
    lr_rule: Literal["linear", "sqrt", "none"] = "sqrt"  # paper mode: lr * (B/B0) or sqrt(B/B0)
    cooldown: int = 1  # control windows to wait after a change

    def __post_init__(self):
        _check(0 < self.rho_low < 1, "triaccel.batch.rho_low", "must be in (0, 1)")
        _check(self.rho_low < self.rho_high <= 1, "triaccel.batch.rho_high",
               f"must be in (rho_low={self.rho_low}, 1], got {self.rho_high}")
        _check(self.delta_up >= 1, "triaccel.batch.delta_up", "must be >= 1")
        _check(self.delta_down >= 1, "triaccel.batch.delta_down", "must be >= 1")
        _check(1 <= self.min_batch <= self.max_batch, "triaccel.batch.min_batch", "must be in [1, max_batch]")
        _check(self.budget_gb is None or self.budget_gb > 0, "triaccel.batch.budget_gb", "must be > 0")
        _check(0 < self.budget_fraction <= 1, "triaccel.batch.budget_fraction", "must be in (0, 1]")
        _check(self.cooldown >= 0, "triaccel.batch.cooldown", "must be >= 0")
        _check(1 < self.grow_factor <= 4, "triaccel.batch.grow_factor", "must be in (1, 4]")
        _check(self.explore_steps >= 2, "triaccel.batch.explore_steps", "must be >= 2")
        _check(0 <= self.explore_tol < 1, "triaccel.batch.explore_tol", "must be in [0, 1)")
        _check(self.explore_budget >= 0, "triaccel.batch.explore_budget", "must be >= 0 (a fraction of the run's time)")


# triaccel.policy: which rules the controllers follow where a config leaves them unset. score (the
# defaults of the sections below): the rules aimed at the efficiency score, which the shipped spaces
# search; paper: the paper's rules, these keys set where the config does not set them itself.
PAPER_POLICY = {"precision": {"scale": "absolute"}, "curvature": {"method": "power", "lr_rule": "paper"},
                "batch": {"policy": "paper"}}


def apply_policy(data: dict) -> dict:
    """``data`` (a triaccel section) with the keys its ``policy`` sets filled in where unset."""
    if not isinstance(data, dict) or data.get("policy") != "paper":
        return data
    data = dict(data)
    for section, keys in PAPER_POLICY.items():
        sub = data.get(section, {})
        if isinstance(sub, dict):  # anything else is refused, naming the key, by from_dict
            data[section] = {**keys, **sub}
    return data


@dataclass
class TriAccelConfig:
    # score (default) or paper: the controllers' rules where a config leaves them unset (PAPER_POLICY)
    policy: Literal["score", "paper"] = "score"
    control_every: int = 50  # T_ctrl, optimizer steps per control window
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    curvature: CurvatureConfig = field(default_factory=CurvatureConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    kernels: Literal["auto", "triton", "torch"] = "auto"  # auto: Triton on CUDA, torch references elsewhere
    uniform_fast_path: bool = True  # one autocast region while every layer has the same level
    # Gradient statistics (the variance EMA, the Fisher proxy, the overflow flags) are sampled every
    # stats_every optimizer steps, not every step: the controllers read them once per window, and an
    # every-step launch is host time the captured step cannot hide (an H200, ResNet-18, captured fp16
    # B=96: 1.25 s/epoch with the loop's controllers off, 1.48 with statistics every step).
    # Unset: min(10, control_every). 1: every step, as the paper.
    stats_every: Optional[int] = None

    def __post_init__(self):
        _check(self.control_every >= 1, "triaccel.control_every", "must be >= 1")
        if self.stats_every is None:
            self.stats_every = min(10, self.control_every)
        _check(1 <= self.stats_every <= self.control_every, "triaccel.stats_every",
               f"must be in [1, control_every ({self.control_every})]: every window needs a sample, "
               f"got {self.stats_every}")


PREPARE[TriAccelConfig] = apply_policy


def changed_keys(default, given, prefix: str) -> list[str]:
    """The dotted keys where dataclass ``given`` differs from ``default``."""
    out = []
    for f in dataclasses.fields(default):
        a, b = getattr(default, f.name), getattr(given, f.name)
        if dataclasses.is_dataclass(a):
            out += changed_keys(a, b, f"{prefix}{f.name}.")
        elif a != b:
            out.append(prefix + f.name)
    return out


def set_triaccel_keys(given: TriAccelConfig) -> list[str]:
    """The triaccel keys a config set: its policy (when not the default) and the keys that differ from
    what that policy fills in, leaving out stats_every where it follows control_every."""
    base = from_dict(TriAccelConfig, {"policy": given.policy, "control_every": given.control_every})
    keys = (["triaccel.policy"] if given.policy != TriAccelConfig().policy else []) + sorted(
        changed_keys(base, given, "triaccel."))
    if given.control_every != TriAccelConfig().control_every:
        keys.append("triaccel.control_every")
    return keys


@dataclass
class TrackingConfig:
    enabled: bool = True
    tracking_uri: Optional[str] = None  # None: $MLFLOW_TRACKING_URI or sqlite:///mlruns/mlflow.db
    experiment: str = "triaccel-train"
    run_name: Optional[str] = None

    def __post_init__(self):
        _check(bool(self.experiment and self.experiment.strip()), "tracking.experiment", "must be a non-empty name")
        # MLflow refuses experiment names over 500 characters (with a traceback after the store opened);
        # a line break split the run's closing line in two
        _check(len(self.experiment) <= 500, "tracking.experiment",
               f"must be at most 500 characters (MLflow's limit), got {len(self.experiment)}")
        for key, v in (("tracking.experiment", self.experiment), ("tracking.run_name", self.run_name)):
            _check(v is None or not any(ord(ch) < 32 or ord(ch) == 127 for ch in v), key,
                   "must be one line without control characters (line breaks, tabs)")


@dataclass
class TrainConfig:
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    mode: Literal["fp32", "amp", "triaccel"] = "fp32"
    amp_dtype: Literal["bf16", "fp16", "fp32"] = "bf16"  # amp mode (static); triaccel's initial level
    epochs: int = 10
    batch_size: int = 96  # examples per optimizer update (initial, in triaccel paper mode)
    accum_steps: int = 1  # micro-batches per update; the micro-batch is batch_size / accum_steps
    checkpointing: bool = False  # activation checkpointing per block
    # with checkpointing: true, only the model's first N blocks (null: every block); read only then, so a
    # search may turn checkpointing on and off around it (and a profile's checkpointing-off variant
    # runs). A CNN's first blocks hold
    # its largest activations (ResNet-18 on 32 px: the first stage's 2 blocks hold about half of the
    # blocks' activations) for the same recomputed FLOPs per block as the later ones
    checkpoint_blocks: Optional[int] = None
    # NHWC activations and weights. null (default): on for conv models on CUDA, where an H200 runs the
    # step 1.7-2x as fast as NCHW at batch 512 (bench/results/profile/h200_step_breakdown.json), off on CPU.
    channels_last: Optional[bool] = None
    # cuDNN autotuning. null (default): on from the first step, as static AMP runs (an H200, channels_last,
    # B=512 bf16: 52.9k against 43.7k img/s untuned), except under the paper's batch rule
    # (triaccel.batch.policy: paper), whose size moves every window and would be tuned again each time
    # (fp32 B=512 NCHW first epoch: 7.9 s tuned, 2.7 s untuned; bench/results/archive/baselines/
    # h200_baselines_bs512*.json): there it goes on once the precision plan settles, for the sizes met
    # after. Turning it on later tunes only shapes met afterwards: torch's cuDNN plan cache keeps the
    # untuned choice of every shape already run (bench/results/effnet224/cudnn_retune/), so a run that
    # started untuned keeps heuristic kernels for good (EfficientNet-B0 at 32 px, H100: 2.19 s epochs
    # against 1.36-1.63 s tuned; bench/results/effnet_b0/). Each new batch size or layer dtype is tuned
    # once: a size's cost is in what the batch controller measures before it explores further, a new
    # precision plan's in its first window (no budget counts it).
    cudnn_benchmark: Optional[bool] = None
    # Record each micro-batch's forward + loss + backward as a CUDA graph and replay it
    # (triaccel.capture): one launch instead of ~300 per ResNet-18 step. CUDA only (a CPU run logs
    # that it is eager); one graph per (micro-batch shape, precision plan), at most capture_cap live
    # (the least recently used is dropped past it).
    capture: bool = False
    capture_cap: int = 8
    # The sizes the memory-elastic batch moves between and an out-of-memory split falls to
    # (triaccel.controllers.batch): null (default) is automatic: with capture or compile on, the ladder
    # 1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, ... (8 and 12 times powers of two), so a run records
    # or compiles one graph per (bucket, plan) instead of one per size the rules produce; otherwise free
    # sizes. A list: those sizes. []: free sizes. The run's own batch_size, first micro-batch and (triaccel)
    # triaccel.batch.min_batch are always buckets (the start stays as configured); a short last batch keeps
    # its own size (padding it would change BatchNorm's batch statistics: not exact).
    batch_buckets: Optional[tuple] = None
    # torch.compile the training forward (its backward follows): null (default) runs eager. default:
    # Inductor's fused kernels (BatchNorm+ReLU in one pass instead of three; its partitioner recomputes
    # cheap pointwise ops in backward instead of saving them), launched as usual, so `capture: true`
    # records them in the step's graph; max-autotune-no-cudagraphs: the same after autotuning each
    # kernel (minutes of warm-up); reduce-overhead: Inductor's own CUDA graphs (not with capture).
    # One compile per micro-batch shape and precision plan (torch's recompile limit applies: past it
    # that shape runs eager); evaluation and the curvature probes stay eager. The compile's time is in
    # the first epochs (the score leaves the first out) and reported apart (compile_s); a compile that
    # fails is one log line and the run goes on eager. An H200, ResNet-18 at B=96
    # (bench/results/compile/h200_compile.json): with capture: true, 6 % faster and 5 % more memory
    # than the captured eager forward; without capture, host-bound and slower than eager.
    # Measure on your model (bench/search_vs_static.py --static).
    compile: Optional[Literal["default", "max-autotune-no-cudagraphs", "reduce-overhead"]] = None
    # fp16 (GradScaler): learn whether a step was skipped one step later, from a non-blocking copy of
    # the found-inf flag, instead of reading the scale back every step (a host sync the captured step
    # cannot hide: captured fp16 B=96 runs 2.02 s/epoch against bf16's 1.36 on an H200). The lr
    # schedule stays exact: each step's lr is set after the previous step's outcome is known. With it,
    # torch.optim runs fused on CUDA (no sync in GradScaler.step). H200, ResNet-18, B=96 captured
    # fp16: 1.79 -> 1.19 s/epoch, eff 84 -> 136, same val acc (bench/results/triaccel_diag/h200_triaccel_b96_diag.json).
    deferred_skip: bool = True
    eval_batch_size: int = 1024
    evaluate_test: bool = True  # final test-set evaluation (never used for selection)
    memory_limit_fraction: Optional[float] = None  # torch.cuda.set_per_process_memory_fraction
    # cuBLAS's workspace per (handle, stream), in MiB (CUBLAS_WORKSPACE_CONFIG, set while the run
    # trains and restored after; one the user set in the environment wins, with a log line).
    # null: torch's default, 32 MiB on Hopper, paid twice per stream (cuBLAS and cuBLASLt) and
    # again on the capture stream: 130 MiB of a captured ResNet-18 step's 0.52 GiB peak
    # at B=96 on an H200, for a model whose only matmul is its 512x10 classifier. 4 there: peak 0.41
    # GiB, same step time, efficiency 114 -> 142 (bench/results/mem_breakdown/). Models with
    # large matmuls (transformers) may want torch's default: measure before lowering it.
    cublas_workspace_mib: Optional[int] = None
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    triaccel: TriAccelConfig = field(default_factory=TriAccelConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    provenance: Optional[dict] = None  # written by `triaccel export`; carried, never read for training

    def __post_init__(self):
        _check(self.epochs >= 1, "epochs", f"must be >= 1, got {self.epochs}")
        _check(1 <= self.batch_size <= MAX_BATCH, "batch_size", f"must be in [1, {MAX_BATCH}], got {self.batch_size}")
        _check(self.accum_steps >= 1, "accum_steps", f"must be >= 1, got {self.accum_steps}")
        _check(self.accum_steps <= self.batch_size, "accum_steps", "must be <= batch_size")
        _check(1 <= self.eval_batch_size <= MAX_BATCH, "eval_batch_size", f"must be in [1, {MAX_BATCH}]")
        _check(self.capture_cap >= 1, "capture_cap", f"must be >= 1, got {self.capture_cap}")
        _check(self.batch_buckets is None or all(isinstance(b, int) and not isinstance(b, bool)
                                                 and 1 <= b <= MAX_BATCH for b in self.batch_buckets),
               "batch_buckets", f"must be null (automatic) or a list of batch sizes in [1, {MAX_BATCH}], "
                                f"got {list(self.batch_buckets) if self.batch_buckets is not None else None!r}")
        _check(self.checkpoint_blocks is None or self.checkpoint_blocks >= 1, "checkpoint_blocks",
               f"must be null (every block) or >= 1, got {self.checkpoint_blocks}")
        _check(not (self.compile == "reduce-overhead" and self.capture), "compile",
               "reduce-overhead records its own CUDA graphs, and capture: true records the step again: "
               "use compile: default with capture, or capture: false")
        _check(self.mode != "amp" or self.amp_dtype != "fp32", "amp_dtype", "amp mode needs bf16 or fp16")
        _check(self.memory_limit_fraction is None or 0 < self.memory_limit_fraction <= 1,
               "memory_limit_fraction", "must be in (0, 1]")
        _check(self.cublas_workspace_mib is None or 0 <= self.cublas_workspace_mib <= 4096,
               "cublas_workspace_mib", f"must be null or an integer in [0, 4096] MiB, got {self.cublas_workspace_mib}")
        _check(re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device) is not None,
               "device", f"must be auto, cpu or cuda[:N], got {self.device!r}")
        _check(0 <= self.seed < 2**32, "seed", f"must be in [0, 2**32), got {self.seed}")
        _check(self.optim.warmup_epochs is None or self.optim.warmup_epochs <= self.epochs, "optim.warmup_epochs",
               f"must be <= epochs ({self.epochs}), got {self.optim.warmup_epochs}: the lr would still be "
               f"rising to optim.lr when the run ends")
        bc = self.triaccel.batch
        if self.mode == "triaccel" and bc.enabled:
            # the controller's bounds must hold the start: it would otherwise clamp batch_size without a word
            _check(bc.min_batch <= self.batch_size <= bc.max_batch, "batch_size",
                   f"{self.batch_size} is outside the batch controller's bounds [triaccel.batch.min_batch "
                   f"{bc.min_batch}, triaccel.batch.max_batch {bc.max_batch}]")
        dc = self.data
        if dc.image_size is not None and dc.class_path is None:  # the user's data: check_read says image_size is unread
            bad = check_image_size(self.model, dc.image_size)
            _check(bad is None, "data.image_size", bad or "")
            bad = check_crop_padding(dc, dc.image_size)
            _check(bad is None, "data.crop_padding", bad or "")

    def warmup_epochs(self) -> float:
        """optim.warmup_epochs, or (unset) 5 epochs or the whole run when it is shorter. Resolved
        here, not stored: an exported config keeps `null`, so `--set epochs=N` resolves it again."""
        w = self.optim.warmup_epochs
        return min(DEFAULT_WARMUP_EPOCHS, float(self.epochs)) if w is None else w


def unread_keys(cfg: TrainConfig) -> dict[str, tuple[str, str]]:
    """The dotted keys a run of ``cfg`` never reads (a trailing dot: a whole section), each with the key
    that decides it and why: a static run's triaccel section, the Hessian probe's keys under the Fisher
    proxy, one optimizer's keys under the other, a built-in dataset's or model's keys beside a class_path."""
    out = {}
    if cfg.mode != "triaccel":
        out["triaccel."] = ("mode", f"train.mode is {cfg.mode}: the triaccel section is read only in mode "
                                    f"triaccel (train.mode: triaccel)")
    else:
        c = cfg.triaccel.curvature
        for key in c.unread():
            out[f"triaccel.curvature.{key}"] = ("triaccel.curvature.method", f"train.triaccel.curvature.method is "
                                                f"{c.method}: the Hessian probe's keys are read only under method power")
    sgd_only, adamw_only = ("momentum", "nesterov"), ("betas",)
    for key in adamw_only if cfg.optim.name == "sgd" else sgd_only:
        out[f"optim.{key}"] = ("optim.name", f"train.optim.name is {cfg.optim.name}: optim.{key} is read only "
                                             f"under optim.name {'adamw' if cfg.optim.name == 'sgd' else 'sgd'}")
    for section in ("data", "model"):
        for key in getattr(cfg, section).unread():
            out[f"{section}.{key}"] = (f"{section}.class_path", f"train.{section}.class_path builds the {section}; "
                                                                 f"its own arguments are {section}.init_args.*")
    return out


def runnable_dict(cfg: TrainConfig) -> dict:
    """``cfg`` as a file to run again (an export, a run's config.yaml): ``to_dict`` less the keys the run never
    reads (``unread_keys``). ``load_config`` reads it back to the same run; the full dict would be refused for a
    named model's key written beside model.class_path."""
    data = to_dict(cfg)
    for key in unread_keys(cfg):
        *path, last = key.rstrip(".").split(".")
        node = data
        for k in path:
            node = node[k]
        node.pop(last, None)
    return data


def refuse_a_space(data, path) -> None:
    """A search space handed where a training config goes is named as one (else: `name: unknown key`)."""
    if isinstance(data, dict) and isinstance(data.get("train"), dict) and "params" in data:
        raise ConfigError(f"{path}: a search space, not a training config (it has train: and params:): "
                          f"`triaccel search --space {path}` searches it; its train: section alone is a "
                          f"training config")


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                base: dict | None = None, written_model: dict | None = None) -> TrainConfig:
    """Load a TrainConfig from YAML plus ``key=value`` overrides; errors name file and key.
    ``written_model``: the model section as the user wrote it, where ``base`` is more (triaccel.train's
    handed factory set as its class_path); else the file's or base's own."""
    data = dict(base or {})
    if path is not None:
        data = read_yaml(path)
        refuse_a_space(data, path)
    sets = parse_overrides(overrides or [])
    written = written_model if written_model is not None else data.get("model")
    written = dict(written) if isinstance(written, dict) else None  # before the --set keys
    try:
        for k, v in sets:
            set_dotted(data, k, v)
        cfg = from_dict(TrainConfig, data)
        cfg.data.check_read()
        if cfg.model.class_path is not None:
            ModelConfig.check_written(written, tuple(k.split(".", 1)[1] for k, _ in sets if k.startswith("model.")))
        return cfg
    except ConfigError as e:
        # a value given with --set is named as the user typed it, not as the config file's (the last
        # --set of a key wins, as it does in the config)
        key = str(e).split(": ", 1)[0]
        # (or a section the --set made up: `--set nosuch.key=3` is refused as `nosuch: unknown key`)
        typed = [k for k, _ in sets if key == k or key.startswith(k + ".") or k.startswith(key + ".")]
        if typed:
            raise ConfigError(f"--set {typed[-1]}: {str(e).split(': ', 1)[-1] if key == typed[-1] else e}") from None
        if path is not None:
            raise ConfigError(f"{path}: {e}") from None
        raise
