"""ResNet, as torchvision's resnet18 ... resnet152 (and its ResNeXt and wide variants) compute it and name their
weights: a 7x7 stride-2 convolution, batch norm, ReLU and a 3x3 stride-2 max pool; four stages of residual blocks
(BasicBlock: two 3x3 convolutions; Bottleneck: 1x1, 3x3, 1x1 expanding the width four times), each stage after the
first halving the size in its first block's 3x3 convolution (torchvision's "v1.5"), a 1x1 convolution and batch norm
(`downsample`) bringing the input to the block's output where their shapes differ; the mean over the image and a
linear classifier.

Batch norm uses its running statistics (eval mode) unless Tensor.train() is on, as a torchvision model after
.eval(). Images are (batch, 3, height, width), normalized as torchvision's ImageNet weights expect them (see
tiny.examples.resnet); any size from 32 x 32 up. The model computes in its weights' dtype (float32, or float16 or
bfloat16 when loaded with that dtype), the images cast to it.

>>> from tiny.models import resnet  # doctest: +SKIP
>>> model = resnet.load("resnet50-11ad3fa6.pth")  # doctest: +SKIP
>>> model(images).argmax(-1).tolist()  # doctest: +SKIP
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from tiny.models.hf import compute_dtype
from tiny.nn import BatchNorm2d, Conv2d, Linear, skip_init
from tiny.nn.state import get_state_dict, safe_load, torch_load
from tiny.tensor import DType, Tensor, dtypes

__all__ = [
    "ARCHITECTURES",
    "ResNet",
    "ResNetConfig",
    "config_of",
    "load",
    "load_state",
    "read_state_dict",
    "resnet18",
    "resnet34",
    "resnet50",
    "resnet101",
    "resnet152",
]


@dataclass(frozen=True)
class ResNetConfig:
    """block: "basic" (two 3x3 convolutions) or "bottleneck" (1x1, 3x3, 1x1); layers: blocks per stage; groups and
    width_per_group: the 3x3 convolution of a bottleneck is grouped and width_per_group * groups channels wide per 64
    of the stage's planes (ResNeXt: 32 groups of 4, wide ResNet: 1 group of 128)."""

    block: Literal["basic", "bottleneck"] = "basic"
    layers: tuple[int, ...] = (2, 2, 2, 2)
    num_classes: int = 1000
    groups: int = 1
    width_per_group: int = 64

    def __post_init__(self) -> None:
        if self.block not in ("basic", "bottleneck"):
            raise ValueError(f"ResNet: block must be 'basic' or 'bottleneck', got {self.block!r}")
        if len(self.layers) != 4 or min(self.layers) < 1:
            raise ValueError(f"ResNet: layers must be four counts of at least 1 block, got {self.layers}")
        if self.block == "basic" and (self.groups, self.width_per_group) != (1, 64):
            raise ValueError("ResNet: BasicBlock only supports groups=1 and width_per_group=64, as torchvision's")
        if self.num_classes < 1:
            raise ValueError(f"ResNet: num_classes must be at least 1, got {self.num_classes}")


# torchvision's model functions and their configurations
ARCHITECTURES: dict[str, ResNetConfig] = {
    "resnet18": ResNetConfig("basic", (2, 2, 2, 2)),
    "resnet34": ResNetConfig("basic", (3, 4, 6, 3)),
    "resnet50": ResNetConfig("bottleneck", (3, 4, 6, 3)),
    "resnet101": ResNetConfig("bottleneck", (3, 4, 23, 3)),
    "resnet152": ResNetConfig("bottleneck", (3, 8, 36, 3)),
    "resnext50_32x4d": ResNetConfig("bottleneck", (3, 4, 6, 3), groups=32, width_per_group=4),
    "resnext101_32x8d": ResNetConfig("bottleneck", (3, 4, 23, 3), groups=32, width_per_group=8),
    "wide_resnet50_2": ResNetConfig("bottleneck", (3, 4, 6, 3), width_per_group=128),
    "wide_resnet101_2": ResNetConfig("bottleneck", (3, 4, 23, 3), width_per_group=128),
}


class Downsample(list):
    """The shortcut of a block whose output differs from its input in shape: [1x1 Conv2d, BatchNorm2d], named
    downsample.0 and downsample.1 as torchvision's Sequential."""

    def __call__(self, x: Tensor) -> Tensor:
        conv, bn = self
        return bn(conv(x))


def _downsample(inplanes: int, out: int, stride: int, device: str | None) -> Downsample | None:
    if stride == 1 and inplanes == out:
        return None
    return Downsample(
        [Conv2d(inplanes, out, 1, stride=stride, bias=False, device=device), BatchNorm2d(out, device=device)]
    )


class BasicBlock:
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int, cfg: ResNetConfig, device: str | None) -> None:
        self.conv1 = Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False, device=device)
        self.bn1 = BatchNorm2d(planes, device=device)
        self.conv2 = Conv2d(planes, planes, 3, padding=1, bias=False, device=device)
        self.bn2 = BatchNorm2d(planes, device=device)
        self.downsample = _downsample(inplanes, planes, stride, device)

    def __call__(self, x: Tensor) -> Tensor:
        h = self.bn1(self.conv1(x)).relu()
        h = self.bn2(self.conv2(h))
        shortcut = x if self.downsample is None else self.downsample(x)
        return (h + shortcut).relu()


class Bottleneck:
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int, cfg: ResNetConfig, device: str | None) -> None:
        width = planes * cfg.width_per_group // 64 * cfg.groups
        out = planes * self.expansion
        self.conv1 = Conv2d(inplanes, width, 1, bias=False, device=device)
        self.bn1 = BatchNorm2d(width, device=device)
        self.conv2 = Conv2d(
            width, width, 3, stride=stride, padding=1, groups=cfg.groups, bias=False, device=device
        )  # (the stride here, not in conv1: torchvision's ResNet v1.5)
        self.bn2 = BatchNorm2d(width, device=device)
        self.conv3 = Conv2d(width, out, 1, bias=False, device=device)
        self.bn3 = BatchNorm2d(out, device=device)
        self.downsample = _downsample(inplanes, out, stride, device)

    def __call__(self, x: Tensor) -> Tensor:
        h = self.bn1(self.conv1(x)).relu()
        h = self.bn2(self.conv2(h)).relu()
        h = self.bn3(self.conv3(h))
        shortcut = x if self.downsample is None else self.downsample(x)
        return (h + shortcut).relu()


class ResNet:
    """conv1, bn1, layer1 ... layer4 (lists of blocks) and fc, named as torchvision's ResNet names them."""

    def __init__(self, cfg: ResNetConfig = ARCHITECTURES["resnet18"], device: str | None = None) -> None:
        self.cfg, self.device = cfg, device
        block = BasicBlock if cfg.block == "basic" else Bottleneck
        self.conv1 = Conv2d(3, 64, 7, stride=2, padding=3, bias=False, device=device)
        self.bn1 = BatchNorm2d(64, device=device)
        inplanes = 64
        stages: list[list[BasicBlock | Bottleneck]] = []
        for i, count in enumerate(cfg.layers):
            planes = 64 * 2**i
            stage = [block(inplanes, planes, 1 if i == 0 else 2, cfg, device)]
            inplanes = planes * block.expansion
            stage += [block(inplanes, planes, 1, cfg, device) for _ in range(count - 1)]
            stages.append(stage)
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.fc = Linear(inplanes, cfg.num_classes, device=device)

    def features(self, images: Tensor | Any) -> Tensor:
        """The last stage's mean over the image (batch, 512 * expansion): what fc classifies."""
        x = _images(images, self.device).cast(self.conv1.weight.dtype)
        x = self.bn1(self.conv1(x)).relu().max_pool2d(3, stride=2, padding=1)
        for stage in (self.layer1, self.layer2, self.layer3, self.layer4):
            for block in stage:
                x = block(x)
        return x.mean(axis=(2, 3))

    def __call__(self, images: Tensor | Any) -> Tensor:
        """The logits (batch, num_classes) of images (batch, 3, height, width)."""
        return self.fc(self.features(images))


def _images(images: Tensor | Any, device: str | None) -> Tensor:
    if not isinstance(images, Tensor):
        images = Tensor(np.asarray(images, dtype=np.float32), device=device)
    elif not images.dtype.is_float:
        raise TypeError(f"ResNet: images must be floats, got dtype {images.dtype.name}")
    if images.ndim != 4 or images.shape[1] != 3 or min(images.shape[2:]) < 32:
        raise ValueError(
            f"ResNet: images must be (batch, 3, height, width) with height and width at least 32, got shape "
            f"{images.shape}"
        )
    return images


def resnet18(num_classes: int = 1000, device: str | None = None) -> ResNet:
    return ResNet(replace(ARCHITECTURES["resnet18"], num_classes=num_classes), device)


def resnet34(num_classes: int = 1000, device: str | None = None) -> ResNet:
    return ResNet(replace(ARCHITECTURES["resnet34"], num_classes=num_classes), device)


def resnet50(num_classes: int = 1000, device: str | None = None) -> ResNet:
    return ResNet(replace(ARCHITECTURES["resnet50"], num_classes=num_classes), device)


def resnet101(num_classes: int = 1000, device: str | None = None) -> ResNet:
    return ResNet(replace(ARCHITECTURES["resnet101"], num_classes=num_classes), device)


def resnet152(num_classes: int = 1000, device: str | None = None) -> ResNet:
    return ResNet(replace(ARCHITECTURES["resnet152"], num_classes=num_classes), device)


# ---------------------------------------------------------------- checkpoints


def read_state_dict(path: str | os.PathLike, device: str | None = None) -> dict[str, Tensor]:
    """The tensors of a torchvision checkpoint: a .safetensors file (read lazily) or a torch.save'd state dict
    (.pth, .pt: its pickle may hold only tensors), unwrapped from {"state_dict": ...} or {"model": ...} and from the
    "module." prefix that DataParallel adds."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"ResNet: no checkpoint file {file}")
    if file.suffix == ".safetensors":
        state: Any = safe_load(file, device)
    else:
        state = torch_load(file)
        for key in ("state_dict", "model"):
            if isinstance(state, dict) and isinstance(state.get(key), dict):
                state = state[key]
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise ValueError(f"ResNet: {file} does not hold a state dict of tensors (it holds a {type(state).__name__})")
    if state and all(k.startswith("module.") for k in state):
        state = {k.removeprefix("module."): v for k, v in state.items()}
    return {k: v if device is None else v.to(device) for k, v in state.items()}


def config_of(state: dict[str, Tensor]) -> ResNetConfig:
    """The configuration a torchvision ResNet's state dict was made with: the block by whether blocks have a conv3,
    the blocks per stage by their indices, the classes by fc's rows, groups and width by the first 3x3 convolution."""
    if "conv1.weight" not in state or "fc.weight" not in state:
        raise ValueError(f"not a torchvision ResNet's state dict: no conv1.weight or fc.weight among {list(state)[:5]}")
    counts = [0, 0, 0, 0]
    for name in state:
        if m := re.match(r"layer([1-4])\.(\d+)\.", name):
            stage, index = int(m[1]) - 1, int(m[2])
            counts[stage] = max(counts[stage], index + 1)
    if "layer1.0.conv3.weight" not in state:
        return ResNetConfig("basic", tuple(counts), state["fc.weight"].shape[0])
    width, per_group = state["layer1.0.conv2.weight"].shape[:2]  # (width, width / groups, 3, 3)
    groups = width // per_group
    return ResNetConfig("bottleneck", tuple(counts), state["fc.weight"].shape[0], groups, width // groups)


def load_state(
    model: ResNet,
    state: dict[str, Tensor],
    source: str | os.PathLike = "the state dict",
    dtype: DType | str = dtypes.float32,
) -> None:
    """Each tensor of a torchvision state dict into the model's tensor of the same name (floats cast to dtype, the
    dtype the model computes in; num_batches_tracked to an integer), checked for shape first; every missing,
    unexpected or misshapen name is listed in one error."""
    dtype = compute_dtype(dtype, "ResNet")
    targets = get_state_dict(model)
    problems = [f"missing {k}" for k in targets if k not in state]
    problems += [f"unexpected {k}" for k in state if k not in targets]
    problems += [f"shape of {k}: the file has {state[k].shape}, the model has {t.shape}"
                 for k, t in targets.items() if k in state and state[k].shape != t.shape]  # fmt: skip
    if problems:
        shown = problems[:20] + ([f"... and {len(problems) - 20} more"] if len(problems) > 20 else [])
        raise ValueError(f"ResNet: {source} does not fit the model ({model.cfg}):\n  " + "\n  ".join(shown))
    for name, target in targets.items():
        *path, attr = name.split(".")
        owner: Any = model
        for part in path:
            owner = owner[int(part)] if isinstance(owner, list) else getattr(owner, part)
        value, want = state[name], dtype if target.dtype.is_float else target.dtype
        if value.dtype != want or value.device != target.device:
            value = value.to(target.device).cast(want).contiguous()
        setattr(owner, attr, value.realize())


def _described(cfg: ResNetConfig) -> str:
    widened = (cfg.groups, cfg.width_per_group) != (1, 64)
    grouped = f" ({cfg.groups} groups of {cfg.width_per_group} channels per 64)" if widened else ""
    return f"a ResNet of {cfg.block} blocks, {'-'.join(map(str, cfg.layers))} per stage{grouped}"


def load(
    path: str | os.PathLike, device: str | None = None, arch: str | None = None, dtype: DType | str = dtypes.float32
) -> ResNet:
    """The ResNet of a torchvision checkpoint (`torch.save(model.state_dict(), path)`, or .safetensors), its
    configuration read off the checkpoint's names and shapes (or arch's, one of ARCHITECTURES, checked against it).
    dtype: what the model computes in, whatever the file holds (float32 by default: a float16 checkpoint is widened;
    dtypes.float16 computes in half)."""
    if arch is not None and arch not in ARCHITECTURES:
        raise ValueError(f"ResNet: arch must be one of {', '.join(ARCHITECTURES)}, got {arch!r}")
    state = read_state_dict(path, device)
    cfg = config_of(state)
    if arch is not None and replace(ARCHITECTURES[arch], num_classes=cfg.num_classes) != cfg:
        raise ValueError(f"ResNet: {path} holds {_described(cfg)}, where {arch} is {_described(ARCHITECTURES[arch])}")
    with skip_init():  # (the weights come from the file: no random ones first)
        model = ResNet(cfg, device)
    load_state(model, state, path, dtype)
    return model
