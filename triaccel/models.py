"""Models by name: ResNet-18 (CIFAR stem), EfficientNet-B0 (torchvision), a small CNN for CPU runs.

Each model exposes ``blocks()``: the modules that activation checkpointing wraps one by one (other
models: ``find_blocks``). Zoo models (torchvision/NAME, timm/NAME) are built by triaccel.hub, the
user's own (model.class_path) by triaccel.userdef.
"""
from __future__ import annotations

import functools
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from triaccel.config import check_image_size
from triaccel.errors import ConfigError


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet18Cifar(nn.Module):
    """ResNet-18 with the CIFAR stem: a 3x3 stride-1 first conv and no max-pool (11.2 M parameters)."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        layers, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers.append(nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)))
            cin = cout
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.fc = nn.Linear(512, num_classes)

    def blocks(self) -> list[nn.Module]:
        return [b for layer in (self.layer1, self.layer2, self.layer3, self.layer4) for b in layer]

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(x)


class SmallCNN(nn.Module):
    """Three conv-BN-ReLU blocks and a linear head: trains on the digits set in seconds on a CPU."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1, width: int = 32):
        super().__init__()
        w = width
        self.block1 = nn.Sequential(nn.Conv2d(in_channels, w, 3, padding=1, bias=False), nn.BatchNorm2d(w), nn.ReLU())
        self.block2 = nn.Sequential(nn.Conv2d(w, 2 * w, 3, padding=1, bias=False), nn.BatchNorm2d(2 * w), nn.ReLU(),
                                    nn.MaxPool2d(2))
        self.block3 = nn.Sequential(nn.Conv2d(2 * w, 4 * w, 3, padding=1, bias=False), nn.BatchNorm2d(4 * w), nn.ReLU())
        self.fc = nn.Linear(4 * w, num_classes)

    def blocks(self) -> list[nn.Module]:
        return [self.block1, self.block2, self.block3]

    def forward(self, x):
        x = self.block3(self.block2(self.block1(x)))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


class MLP(nn.Module):
    """Flatten -> Linear -> ReLU -> Linear, no BatchNorm: the model for exact-equivalence tests."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1, width: int = 32, image_size: int = 8):
        super().__init__()
        self.block1 = nn.Sequential(nn.Flatten(), nn.Linear(in_channels * image_size * image_size, width), nn.ReLU())
        self.fc = nn.Linear(width, num_classes)

    def blocks(self) -> list[nn.Module]:
        return [self.block1]

    def forward(self, x):
        return self.fc(self.block1(x))


class EfficientNetB0(nn.Module):
    """torchvision's EfficientNet-B0 (random init, num_classes set); optional input resize (paper: 224)."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3, resize: int | None = None):
        super().__init__()
        import torchvision

        self.net = torchvision.models.efficientnet_b0(weights=None, num_classes=num_classes)
        if in_channels != 3:
            old = self.net.features[0][0]
            self.net.features[0][0] = nn.Conv2d(in_channels, old.out_channels, old.kernel_size, old.stride,
                                                old.padding, bias=False)
        self.resize = resize

    def blocks(self) -> list[nn.Module]:
        return list(self.net.features)

    def forward(self, x):
        if self.resize and x.shape[-1] != self.resize:
            x = F.interpolate(x, size=(self.resize, self.resize), mode="bilinear", align_corners=False)
        return self.net(x)


MODELS: dict[str, Callable[..., nn.Module]] = {
    "resnet18": lambda nc, ic, sz, cfg: ResNet18Cifar(nc, ic),
    "efficientnet_b0": lambda nc, ic, sz, cfg: EfficientNetB0(nc, ic, cfg.resize),
    "small_cnn": lambda nc, ic, sz, cfg: SmallCNN(nc, ic, cfg.width),
    "mlp": lambda nc, ic, sz, cfg: MLP(nc, ic, cfg.width, sz),
}


def build_model(cfg, num_classes: int, in_channels: int | None, image_size: int | None = 32,
                meta: dict | None = None) -> nn.Module:
    """The model ``cfg`` names, for data of ``num_classes`` classes (images of ``in_channels`` x
    ``image_size``^2, or None for other inputs): the user's factory (model.class_path, given ``meta``
    too: triaccel.userdef), a zoo model (torchvision/NAME, timm/NAME: triaccel.hub) or one of MODELS."""
    if cfg.class_path is not None:
        from triaccel.userdef import build_user_model

        info = {"num_classes": num_classes, "in_channels": in_channels, "image_size": image_size}
        return build_user_model(cfg, {**{k: v for k, v in info.items() if v is not None}, **(meta or {})})
    if "/" in cfg.name:
        from triaccel.hub import build_zoo_model

        return build_zoo_model(cfg, num_classes, in_channels)
    if in_channels is None:
        raise ConfigError(f"model.name: {cfg.name} takes images [C, H, W]; the data's inputs are not images "
                          f"(name a model of your own in model.class_path)")
    if cfg.name not in MODELS:
        raise ConfigError(f"model.name: unknown model {cfg.name!r} (valid: {', '.join(sorted(MODELS))})")
    # the dataset's own side (data.image_size unset); a set data.image_size is checked with the config
    bad = check_image_size(cfg, image_size)
    if bad:
        raise ConfigError(f"data.image_size: {bad}")
    return MODELS[cfg.name](num_classes, in_channels, image_size, cfg)


def _draws_random(m: nn.Module) -> bool:
    name = type(m).__name__
    return "Dropout" in name or name == "StochasticDepth"


def find_blocks(model: nn.Module) -> list[nn.Module]:
    """The modules activation checkpointing wraps: ``model.blocks()`` where the model has that method;
    otherwise the children of the first nn.ModuleList or nn.Sequential of two or more modules of one
    type that holds at least half of the model's parameters (a transformer's layers); otherwise the
    model's top-level children that have parameters. Empty when there are none."""
    own = getattr(model, "blocks", None)
    if callable(own) and not isinstance(own, nn.Module):
        return list(own())
    total = sum(p.numel() for p in model.parameters())
    for m in model.modules():
        if isinstance(m, (nn.ModuleList, nn.Sequential)) and len(m) >= 2 and len({type(c) for c in m}) == 1 \
                and 2 * sum(p.numel() for p in m.parameters()) >= total > 0:
            return list(m)
    return [c for c in model.children() if next(c.parameters(), None) is not None]


def enable_checkpointing(model: nn.Module, first: int | None = None, log=print) -> int:
    """Recompute each of the model's blocks (``find_blocks``; the first ``first`` of them, when given)
    in backward instead of storing its activations. A model without blocks trains without it (a line
    says so).

    The block's forward is wrapped in place (parameter names and state_dict keys unchanged).
    The recomputation normalises with the batch's statistics as the forward did, but leaves the
    BatchNorm running statistics alone: updated by both, they would move twice a step (momentum 0.1
    acting like 0.19), and evaluation would see other statistics than the plain model's.
    Returns the number of blocks wrapped.
    """
    blocks = find_blocks(model)
    if not blocks:
        log(f"[checkpointing] {type(model).__name__} has no blocks (no blocks() method, no child module with "
            f"parameters): activation checkpointing is off for this run")
        return 0
    if first is not None:
        if first > len(blocks):
            raise ConfigError(f"checkpoint_blocks: {type(model).__name__} has {len(blocks)} blocks, got {first}")
        blocks = blocks[:first]
    for b in blocks:
        inner_forward = b.forward
        # Only a block that draws random numbers (dropout, stochastic depth) needs its RNG state saved
        # for the recomputation; skipping it elsewhere saves a copy per block and lets a checkpointed
        # step be recorded as a CUDA graph (reading the generator's state is not allowed while recording).
        random = any(_draws_random(m) for m in b.modules())
        norms = [m for m in b.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]

        def fwd(*args, _f=inner_forward, _rng=random, _norms=norms, **kwargs):
            if kwargs:  # checkpoint passes keyword arguments on to the function it recomputes
                _f = functools.partial(_f, **kwargs)
            if torch.is_grad_enabled() and torch.compiler.is_compiling():
                # traced (compile): the checkpoint becomes one region whose recomputation the partitioner
                # schedules from the traced ops, where a buffer update happens once, in the forward; the
                # call counter below would stop the trace at every block (a graph break, the block eager)
                return checkpoint(_f, *args, use_reentrant=False, preserve_rng_state=_rng)
            if torch.is_grad_enabled():
                calls = [0]

                def run(*xs):
                    calls[0] += 1
                    if calls[0] == 1 or not _norms:
                        return _f(*xs)
                    # the recomputation in backward: the same ops (checkpoint compares what they save),
                    # with an update factor of 0 (running = 1 * running + 0 * batch) for the norms that
                    # update (training mode) and their counters put back as they were, whatever ran
                    moms = [m.momentum for m in _norms]
                    counts = [m.num_batches_tracked.clone() if m.num_batches_tracked is not None else None
                              for m in _norms]
                    for m in _norms:
                        if m.training:
                            m.momentum = 0.0
                    try:
                        return _f(*xs)
                    finally:
                        for m, mom, n in zip(_norms, moms, counts):
                            m.momentum = mom
                            if n is not None:
                                m.num_batches_tracked.copy_(n)

                return checkpoint(run, *args, use_reentrant=False, preserve_rng_state=_rng)
            return _f(*args)

        b.forward = fwd
    return len(blocks)
