"""Models from the zoos by name: ``model.name: torchvision/NAME`` or ``timm/NAME``, with ``model.kwargs``.

Any torchvision classification model (``torchvision.models.list_models(torchvision.models)``), and
any timm model when timm is installed (``pip install -e '.[timm]'``; ``timm.list_models()``), built
with random weights. The classifier head follows the data: num_classes goes to the constructor.
So do the input channels: timm takes ``in_chans``; a torchvision model's first Conv2d is replaced
by one of the data's channel count when it is not 3.
"""
from __future__ import annotations

import torch.nn as nn

from triaccel.errors import ConfigError

SOURCES = ("torchvision", "timm")
LIST_HINT = {"torchvision": "python -c 'import torchvision; print(torchvision.models.list_models(torchvision.models))'",
             "timm": "python -c 'import timm; print(timm.list_models())'"}


def _call(build, name: str, kwargs: dict) -> nn.Module:
    try:
        return build()
    except Exception as e:  # noqa: BLE001 -- the zoo's own refusal (a bad kwarg, weights for another head)
        first = (str(e).strip().splitlines() or [""])[0][:300]
        raise ConfigError(f"model.kwargs: {name}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())}) raised "
                          f"{type(e).__name__}: {first}") from None


def replace_first_conv(model: nn.Module, in_channels: int, name: str) -> None:
    """The first Conv2d that reads 3 channels, rebuilt to read ``in_channels`` (its other settings kept)."""
    for path, conv in model.named_modules():
        if isinstance(conv, nn.Conv2d) and conv.in_channels == 3 and conv.groups == 1:
            new = nn.Conv2d(in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding,
                            conv.dilation, 1, conv.bias is not None, conv.padding_mode)
            parent_path, _, attr = path.rpartition(".")
            parent = model.get_submodule(parent_path) if parent_path else model
            setattr(parent, attr, new)
            return
    raise ConfigError(f"model.name: {name} has no 3-channel first Conv2d to rebuild for the data's {in_channels} "
                      f"channels")


def build_zoo_model(mc, num_classes: int, in_channels: int | None) -> nn.Module:
    source, _, arch = mc.name.partition("/")
    if source not in SOURCES or not arch:
        raise ConfigError(f"model.name: unknown model {mc.name!r} (a zoo model is torchvision/NAME or timm/NAME)")
    if in_channels is None:
        raise ConfigError(f"model.name: {mc.name} takes images [C, H, W]; the data's inputs are not images")
    kwargs = dict(mc.kwargs)
    for k in ("num_classes", "in_chans"):
        if k in kwargs:
            raise ConfigError(f"model.kwargs.{k}: set by the data ({num_classes} classes, {in_channels} channels); "
                              f"leave it out")
    if source == "torchvision":
        import torchvision.models as tvm

        if arch not in tvm.list_models(module=tvm):
            raise ConfigError(f"model.name: {arch!r} is not a torchvision classification model (list them: "
                              f"{LIST_HINT[source]})")
        kwargs.setdefault("weights", None)
        model = _call(lambda: tvm.get_model(arch, num_classes=num_classes, **kwargs), mc.name, kwargs)
        if in_channels != 3:
            replace_first_conv(model, in_channels, mc.name)
        return model
    try:
        import timm
    except ImportError:
        raise ConfigError(f"model.name: {mc.name} needs timm, which is not installed: pip install -e '.[timm]'") \
            from None
    if not timm.is_model(arch):
        raise ConfigError(f"model.name: {arch!r} is not a timm model (list them: {LIST_HINT[source]})")
    kwargs.setdefault("pretrained", False)
    return _call(lambda: timm.create_model(arch, num_classes=num_classes, in_chans=in_channels, **kwargs),
                 mc.name, kwargs)
