"""Data-parallel training across processes (tiny.nn.mpi): the MNIST Adam step of a batch over 2 processes, each
with half of it, against 1 process with all of it; both started by Open MPI's mpirun, each process's CPU device
given its share of the cores (THREADS), so that the processes do not fight over them.

    python -m bench.mpi [--processes 2] [--runs 20] [--batch 128]

Each figure is the fastest of --runs steps after two that are not timed (TinyJit captures on the second). The step
over MPI is three parts: the gradients (one jitted function), their all-reduce on the host (one MPI_Allreduce of all
the gradients, read back from the device and written again), and Adam's update (another jitted function); the one
process also runs the one-function step of `python -m tiny.examples.mnist`, the reference with no MPI part at all.
The last column is the step of `mnist --mpi`: batch norm over the whole batch (tiny.nn.mpi.SyncBatchNorm), its sums
all-reduced on the host forward and backward, so the forward and backward run un-jitted.
Needs mpirun and mpi4py (apt-get install openmpi-bin libopenmpi-dev; pip install 'tiny-tensor[mpi]').
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

from bench.multi import fastest
from bench.training import MnistNet
from tiny import nn
from tiny.nn import mpi
from tiny.nn.state import get_parameters
from tiny.tensor import Tensor, TinyJit

ROOT_OK = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}  # (Open MPI as root, as in CI)


def worker(runs: int, batch: int) -> None:
    """One process of the job: times its steps; rank 0 prints them as JSON."""
    with mpi.world() as world:
        Tensor.manual_seed(0)
        model = MnistNet(nn.Conv2d, nn.BatchNorm2d, nn.Linear)
        params = [p for p in get_parameters(model) if p.requires_grad]
        opt = nn.optim.Adam(params, lr=1e-3)
        rng = np.random.default_rng(0)
        mine = world.share(batch)
        x = Tensor(rng.standard_normal((batch, 1, 28, 28)).astype(np.float32)[mine])
        y = Tensor(rng.integers(0, 10, batch).astype(np.int32)[mine])

        def gradients(x: Tensor, y: Tensor) -> Tensor:
            with Tensor.train():
                opt.zero_grad()
                loss = model(x).cross_entropy(y)
                loss.backward()
            return loss

        @TinyJit
        def local(x: Tensor, y: Tensor) -> list[Tensor]:
            loss = gradients(x, y)
            grads = [p.grad for p in params if p.grad is not None]
            loss.realize(*grads)
            return [loss, *grads]

        @TinyJit
        def update(*grads: Tensor) -> None:
            for p, g in zip(params, grads, strict=True):
                p.grad = g
            opt.step()

        timed: dict[str, float] = {}

        def mpi_step() -> None:
            grads = local(x, y)[1:]
            at = time.perf_counter()
            grads = world.all_reduce(grads, (mine.stop - mine.start) / batch)
            timed["all-reduce"] = min(timed.get("all-reduce", float("inf")), time.perf_counter() - at)
            update(*grads)

        result = {"mpi step": fastest(mpi_step, runs)}
        result["all-reduce"] = timed["all-reduce"]
        if world.size == 1:

            @TinyJit
            def step(x: Tensor, y: Tensor) -> Tensor:
                loss = gradients(x, y)
                opt.step()
                return loss.realize()

            result["plain step"] = fastest(lambda: step(x, y).item(), runs)
        mpi.SyncBatchNorm.convert(model, world)  # (last: the steps above are the model's own)
        share = (mine.stop - mine.start) / batch

        def sync_step() -> None:  # the step of `mnist --mpi`: batch norm over the whole batch, un-jitted
            with Tensor.train():
                loss = model(x).cross_entropy(y)
                parts = world.gradients(loss * share, params)
            grads = [p.zeros_like() if g is None else g for p, g in zip(params, parts, strict=True)]
            update(*world.all_reduce(grads, weight=1.0))

        result["sync step"] = fastest(sync_step, runs)
        if world.rank == 0:
            print(json.dumps(result))


def launch(processes: int, threads: int, runs: int, batch: int) -> dict[str, float]:
    cmd = ["mpirun", "--oversubscribe", "-n", str(processes), "-x", f"THREADS={threads}", sys.executable]
    cmd += ["-m", "bench.mpi", "--worker", "--runs", str(runs), "--batch", str(batch)]
    env = {**os.environ, **ROOT_OK}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, check=False)
    if done.returncode != 0:
        sys.exit(f"bench.mpi: {' '.join(cmd)} failed ({done.returncode}):\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.mpi", description=__doc__)
    p.add_argument("--processes", type=int, default=2, help="the processes of the data-parallel run (default: 2)")
    p.add_argument("--runs", type=int, default=20, help="timed steps per figure (default: 20)")
    p.add_argument("--batch", type=int, default=128, help="the images of a step, over all processes (default: 128)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # (one process of the job: mpirun's)
    args = p.parse_args()
    if args.worker:
        worker(args.runs, args.batch)
        return
    if shutil.which("mpirun") is None:
        sys.exit("bench.mpi: no mpirun here (apt-get install openmpi-bin libopenmpi-dev)")
    cores = len(os.sched_getaffinity(0))
    threads = max(1, cores // args.processes)
    one = launch(1, cores, args.runs, args.batch)
    runs = [(1, cores, one)]
    if threads != cores:  # (the one process on as few threads as each of the several: how much is the threads')
        runs.append((1, threads, launch(1, threads, args.runs, args.batch)))
    runs.append((args.processes, threads, launch(args.processes, threads, args.runs, args.batch)))
    print(f"MNIST Adam step, batch {args.batch}; fastest of {args.runs} steps; {cores} cores\n")
    head = "| run | step | of it, the gradients' all-reduce | 1 process without MPI / this | with SyncBatchNorm |"
    print(head + "\n|---|---:|---:|---:|---:|")
    plain = one["plain step"]
    print(f"| 1 process without MPI, THREADS={cores} | {plain * 1e3:.1f} ms | - | 1.00x | - |")
    for n, t, r in runs:
        row = f"| {n} MPI process{'es' if n > 1 else ''}, THREADS={t} each | {r['mpi step'] * 1e3:.1f} ms | "
        print(row + f"{r['all-reduce'] * 1e3:.2f} ms | {plain / r['mpi step']:.2f}x | {r['sync step'] * 1e3:.1f} ms |")


if __name__ == "__main__":
    main()
