"""Classify images with a ResNet from torchvision's checkpoints and print each image's five likeliest classes.

    python -m tiny.examples.resnet IMAGE [IMAGE ...] [--weights FILE] [--labels FILE]

--weights is a torchvision checkpoint (`torch.save(model.state_dict(), FILE)`, or .safetensors), e.g. the file
torchvision downloads for ResNet50_Weights.IMAGENET1K_V2; its architecture is read off its names and shapes. Without
it the model is --arch with random weights, and its classes mean nothing (it says so). --labels is a text file with
one class name per line (ImageNet's 1000, in order); without it the classes are printed as their indices.

Each image is read with Pillow, made RGB and prepared as torchvision's ImageNet classifiers expect: resized so that
its short side is 256 (bilinear), its middle 224 x 224 cropped out, scaled to [0, 1] and normalized per channel.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import NoReturn

import numpy as np

try:
    from PIL import Image  # (Pillow: this command's alone, not tiny's)
except ImportError:
    Image = None

from tiny.models import resnet
from tiny.tensor import Tensor

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)  # ImageNet's channel means and deviations, as torchvision's
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


def preprocess(path: str | Path, resize: int = 256, crop: int = 224) -> np.ndarray:
    """(3, crop, crop) float32: the image resized (short side to `resize`, bilinear, the long side in proportion,
    rounded down), center-cropped and normalized, as torchvision's Resize, CenterCrop, ToTensor and Normalize do
    on a PIL image."""
    with Image.open(path) as img:
        rgb = img.convert("RGB")
    width, height = rgb.size
    if width <= height:
        size = (resize, int(resize * height / width))
    else:
        size = (int(resize * width / height), resize)
    if size != (width, height):
        rgb = rgb.resize(size, Image.Resampling.BILINEAR)
    left, top = int(round((size[0] - crop) / 2.0)), int(round((size[1] - crop) / 2.0))
    pixels = np.asarray(rgb.crop((left, top, left + crop, top + crop)), dtype=np.float32) / 255.0
    return ((pixels - MEAN) / STD).transpose(2, 0, 1).copy()


def read_labels(path: str) -> list[str]:
    try:
        labels = [line.strip() for line in Path(path).read_text().splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as e:
        sys.exit(f"resnet: cannot read the labels {path}: {getattr(e, 'strerror', None) or e}")
    return labels


class Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line (`resnet: ...`) instead of the usage and then the error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"resnet: {message} (see --help)\n")


def parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="python -m tiny.examples.resnet", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("images", nargs="+", metavar="IMAGE", help="image files Pillow can read (JPEG, PNG, ...)")
    p.add_argument("--weights", metavar="FILE", help="a torchvision ResNet checkpoint (.pth or .safetensors)")
    p.add_argument(
        "--arch",
        choices=list(resnet.ARCHITECTURES),
        default=None,
        help="the architecture (default: read off --weights; resnet50 with random weights)",
    )
    p.add_argument("--labels", metavar="FILE", help="class names, one a line (default: class indices)")
    p.add_argument("--top", type=int, default=5, metavar="K", help="classes shown per image (default: 5)")
    p.add_argument("--device", help="the device to run on (default: DEVICE, else the fastest present)")
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if Image is None:
        sys.exit("resnet: reading images needs Pillow (pip install pillow)")
    if args.top < 1:
        sys.exit(f"resnet: --top must be at least 1, got {args.top}")
    images = []
    for path in args.images:
        if not Path(path).is_file():
            sys.exit(f"resnet: {path}: no such file")
        try:
            images.append(preprocess(path))
        except OSError as e:  # (Pillow's UnidentifiedImageError is an OSError)
            sys.exit(f"resnet: {path} is not an image Pillow can read: {e}")
    if args.weights is None:
        model = resnet.ResNet(resnet.ARCHITECTURES[args.arch or "resnet50"], device=args.device)
        print(f"{args.arch or 'resnet50'} with random weights (no --weights): its classes mean nothing")
    else:
        try:
            model = resnet.load(args.weights, device=args.device, arch=args.arch)
        except (OSError, ValueError) as e:
            sys.exit(f"resnet: cannot load {args.weights}: {' '.join(str(e).split())}")
    labels = read_labels(args.labels) if args.labels else None
    if labels is not None and len(labels) != model.cfg.num_classes:
        sys.exit(f"resnet: {args.labels} names {len(labels)} classes, the model has {model.cfg.num_classes}")
    start = time.perf_counter()
    probs = model(Tensor(np.stack(images), device=args.device)).softmax(-1).numpy()
    took = time.perf_counter() - start
    for path, p in zip(args.images, probs, strict=True):
        print(path)
        for c in np.argsort(-p, kind="stable")[: args.top]:
            print(f"  {p[c]:7.2%}  {labels[c] if labels else f'class {c}'}")
    print(f"{len(images)} image(s) in {took:.2f} s on {model.conv1.weight.device}")


if __name__ == "__main__":
    main()
