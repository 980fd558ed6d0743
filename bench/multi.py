"""Tensors on several devices: the all-reduce's bandwidth between two devices against a plain copy of the same bytes,
and the data-parallel MNIST training step on two devices against one.

    python -m bench.multi [--devices CPU:0,CPU:1] [--runs 20]

Each figure is the fastest of --runs timed calls of a TinyJit-captured function (after two calls that capture it),
so it is the copies and kernels alone, without scheduling. The all-reduce's rate is its algorithm bandwidth: the
bytes of one device's tensor over the time, as NCCL's tests report it; a plain copy moves those bytes once, a ring
all-reduce of two devices moves each device's half twice (reduce-scatter, then all-gather) and adds.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from bench.training import MnistNet
from tiny import nn
from tiny.ir.device import collective_for
from tiny.ir.multi import multi
from tiny.ir.uop import Ops
from tiny.nn.state import get_parameters, get_state_dict
from tiny.tensor import Device, Tensor, TinyJit


def fastest(fn: Callable[[], object], runs: int) -> float:
    """Seconds of the fastest of `runs` calls, after two that are not timed (TinyJit captures on the second)."""
    for _ in range(2):
        fn()
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def waited(fn: Callable[[], object], devices: tuple[str, ...]) -> Callable[[], object]:
    """fn, then a wait for every device to finish what it was given (CPU devices run theirs on threads of their own)."""

    def run() -> object:
        out = fn()
        for d in devices:
            Device[d].synchronize()
        return out

    return run


def all_reduce_rows(devices: tuple[str, ...], runs: int) -> list[str]:
    rows = []
    for n in (1 << 18, 1 << 22, 1 << 24):
        parts = [Tensor(np.full(n, i + 1, np.float32), device=d).realize() for i, d in enumerate(devices)]
        x = Tensor(multi([p.uop for p in parts], None))
        reduce = TinyJit(
            lambda x: x._new(multi(collective_for(x.device).all_reduce(Ops.ADD, list(x.uop.src)), None)).realize()
        )
        copy = TinyJit(lambda t: t.to(devices[1]).realize())
        assert float(reduce(x).to(devices[0])[0].item()) == sum(range(1, len(devices) + 1))
        t_reduce = fastest(waited(lambda f=reduce, x=x: f(x), devices), runs)
        t_copy = fastest(waited(lambda f=copy, t=parts[0]: f(t), devices), runs)
        mb = n * 4 / 1e6
        rows.append(
            f"| all-reduce (sum) | {mb:.0f} MB | {mb / 1e3 / t_reduce:.2f} GB/s ({t_reduce * 1e3:.2f} ms) | "
            f"{mb / 1e3 / t_copy:.2f} GB/s ({t_copy * 1e3:.2f} ms) | {t_copy / t_reduce:.2f}x |"
        )
    return rows


def mnist_step(devices: tuple[str, ...], batch: int) -> Callable[[], object]:
    """A jitted Adam step of the benchmark's MNIST CNN: on the default device, or data-parallel over `devices`."""
    Tensor.manual_seed(0)
    model = MnistNet(nn.Conv2d, nn.BatchNorm2d, nn.Linear)
    for p in get_state_dict(model).values() if len(devices) > 1 else ():
        p.shard_(devices)
    opt = nn.optim.Adam([p for p in get_parameters(model) if p.requires_grad], lr=1e-3)
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((batch, 1, 28, 28)).astype(np.float32))
    y = Tensor(rng.integers(0, 10, batch).astype(np.int32))
    if len(devices) > 1:
        x, y = x.shard(devices, 0), y.shard(devices, 0)

    @TinyJit
    def step(x: Tensor, y: Tensor) -> Tensor:
        with Tensor.train():
            opt.zero_grad()
            loss = model(x).cross_entropy(y)
            loss.backward()
            opt.step()
        return loss.realize()

    return waited(lambda: step(x, y).item(), devices)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.multi", description=__doc__)
    p.add_argument("--devices", default="CPU:0,CPU:1", help="two devices, comma-separated (default: CPU:0,CPU:1)")
    p.add_argument("--runs", type=int, default=20, help="timed calls per figure (default: 20)")
    p.add_argument("--batch", type=int, default=128, help="the MNIST step's images (default: 128)")
    args = p.parse_args()
    names = tuple(args.devices.split(","))
    print(f"devices {', '.join(names)}; fastest of {args.runs} jitted calls\n")
    # (one device first, while it is the only CPU device at work: it has all the cores until another opens)
    one = fastest(mnist_step((Device.DEFAULT,), args.batch), args.runs)
    devices = Device.canonicalize_many(names)
    print("| what | size | on the devices | plain copy of the same bytes | copy time / all-reduce time |")
    print("|---|---|---:|---:|---:|")
    for row in all_reduce_rows(devices, args.runs):
        print(row)
    several = fastest(mnist_step(devices, args.batch), args.runs)
    head = f"MNIST Adam step, batch {args.batch}"
    print(f"\n| {head} | one device | {len(devices)} devices, data-parallel | one / several |")
    print("|---|---:|---:|---:|")
    where = f"{Device.DEFAULT} vs {', '.join(devices)}"
    print(f"| {where} | {one * 1e3:.1f} ms | {several * 1e3:.1f} ms | {one / several:.2f}x |")


if __name__ == "__main__":
    main()
