"""Where a workload's time goes on a device: each kernel of one run timed alone (DEBUG=2's timings), slowest first.

    python -m bench.gpu_profile [--device CUDA] [--top 12]

Runs the GPU suite's softmax (8192 x 8192), its causal float16 attention (8 x 16 x 2048 x 64), one MNIST training
step (batch 128, not jitted, so each kernel is launched and timed) and one decode step at a cache length of 2000 (pos
a bound Variable), each once to build its kernels and once timed. The kernels' times add up to more than the workload
takes in the suite (each waits for the device), but their shares say which kernels to work on.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
from collections.abc import Callable

import numpy as np

from bench.decode import _tiny_step
from bench.frameworks import random_arrays, tiny_upload
from bench.training import tiny_mnist_step
from tiny.ir.config import Context
from tiny.tensor import dtypes

LINE = re.compile(r"^\*\*\* \S+\s+\d+ (\S+)\s+([\d.]+) ms")


def _softmax(device: str) -> Callable[[], object]:
    x = tiny_upload(random_arrays((8192, 8192), 1)[0], device)
    return lambda: x.softmax(-1).realize()


def _attention(device: str) -> Callable[[], object]:
    q, k, v = (tiny_upload(x, device).cast(dtypes.float16).realize() for x in random_arrays((8, 16, 2048, 64), 3))
    return lambda: q.scaled_dot_product_attention(k, v, is_causal=True).realize()


def _mnist(device: str) -> Callable[[], object]:
    step, x, y = tiny_mnist_step({"batch": 128}, device)
    return lambda: step(x, y)


def _decode(device: str) -> Callable[[], object]:
    jitted, q, kv, pos = _tiny_step({"heads": 128, "dim": 64, "max": 2048}, device)
    return lambda: jitted.fn(q, kv, pos.bind(2000))  # (the function itself: a replay times no kernel)


WORKLOADS = {"softmax": _softmax, "attention": _attention, "mnist_step": _mnist, "decode_step": _decode}


def profile(name: str, device: str, top: int) -> None:
    run = WORKLOADS[name](device)
    run()
    out = io.StringIO()
    with contextlib.redirect_stdout(out), Context(DEBUG=2):
        run()
    times: dict[str, list[float]] = {}
    for line in out.getvalue().splitlines():
        if m := LINE.match(line):
            times.setdefault(m[1], []).append(float(m[2]))
    total = sum(sum(t) for t in times.values())
    launches = sum(len(t) for t in times.values())
    print(f"== {name} on {device}: {launches} kernels, {total:.3f} ms in all (each timed alone)")
    for kernel, t in sorted(times.items(), key=lambda kv: -sum(kv[1]))[:top]:
        print(f"  {sum(t):9.3f} ms {100 * sum(t) / total:5.1f}%  {len(t):3d}x  {kernel}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="CUDA")
    parser.add_argument("--top", type=int, default=12, help="kernels listed per workload (default 12)")
    parser.add_argument("--only", default=",".join(WORKLOADS), help=f"of: {', '.join(WORKLOADS)}")
    args = parser.parse_args()
    np.random.seed(0)
    for name in args.only.split(","):
        if name not in WORKLOADS:
            parser.error(f"--only: {name!r} is not one of {', '.join(WORKLOADS)}")
        profile(name, args.device, args.top)


if __name__ == "__main__":
    main()
