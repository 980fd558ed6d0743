"""python -m tiny.onnx MODEL --input name=file.npy [--device DEV]: run an ONNX model and print its outputs."""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from tiny.ir.device import DeviceUnavailable
from tiny.onnx import load


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit code 2 (argparse's own, without the usage block)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


def _inputs(pairs: list[str]) -> dict[str, np.ndarray]:
    feed = {}
    for pair in pairs:
        name, sep, path = pair.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--input takes name=file.npy, got {pair!r}")
        if not os.path.isfile(path):
            raise ValueError(f"--input {name}: no such file {path!r}")
        try:
            feed[name] = np.load(path, allow_pickle=False)
        except (ValueError, OSError) as e:
            raise ValueError(f"--input {name}: {path!r} is not a .npy array ({e})") from None
    return feed


def _summary(arr: np.ndarray) -> str:
    if arr.size == 0:
        return "empty"
    if arr.size <= 8:
        return f"values {arr.reshape(-1).tolist()}"
    shown = arr.astype(np.float64)
    return f"min {shown.min():.6g} max {shown.max():.6g} mean {shown.mean():.6g} first {arr.reshape(-1)[:4].tolist()}"


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="python -m tiny.onnx", description="Run an ONNX model on tiny and print its outputs.")
    parser.add_argument("model", help="the .onnx file")
    parser.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy", help="an input (repeat)")
    parser.add_argument("--device", help="the device to run on (default: the default device)")
    args = parser.parse_args(argv)
    try:
        feed = _inputs(args.input)
        model = load(args.model, device=args.device)
        outputs = model(feed)
        for name, t in outputs.items():
            arr = t.numpy()
            print(f"{name}: shape {tuple(arr.shape)} dtype {t.dtype.name} {_summary(arr)}")
    except (ValueError, NotImplementedError, TypeError, KeyError, DeviceUnavailable) as e:
        print(f"python -m tiny.onnx: error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
