"""A small data-parallel job for test_mpi.py: a two-layer MLP trained with SGD on fixed random data, under mpirun
with tiny.nn.mpi (--mpi) or in one process on the whole batch. Prints the losses, one a line (rank 0 only).

    mpirun -n 2 python mpi_job.py --mpi [--bn] [--die-at STEP --die-how exit|raise|kill|finalize]

--bn puts a batch norm between the layers: under --mpi a SyncBatchNorm (the whole batch's statistics), its gradient
from World.gradients.

--die-at makes rank 1 stop at that step: `exit` with sys.exit(3), `raise` an exception, `kill` itself with SIGKILL
(no Python code runs after it), `finalize` leave the job cleanly (sys.exit(0) outside tiny.nn.mpi's guard, so that
mpi4py finalizes MPI as at a normal end) while the others still train.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

import numpy as np

from tiny import nn
from tiny.nn import mpi
from tiny.nn.state import get_parameters, get_state_dict
from tiny.tensor import Tensor


class MLP:
    def __init__(self, bn: bool = False) -> None:
        self.l1, self.l2 = nn.Linear(12, 16), nn.Linear(16, 3)
        self.bn = nn.BatchNorm1d(16) if bn else None

    def __call__(self, x: Tensor) -> Tensor:
        h = self.l1(x)
        return self.l2((self.bn(h) if self.bn is not None else h).relu())


def die(how: str) -> None:
    if how == "exit":
        sys.exit(3)
    if how == "raise":
        raise RuntimeError("rank 1 broke on purpose")
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mpi", action="store_true")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--die-at", type=int, default=-1)
    p.add_argument("--die-how", default="exit")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--bn", action="store_true")
    args = p.parse_args()
    data = np.random.default_rng(1)
    x_all = data.standard_normal((args.steps, args.batch, 12)).astype(np.float32)
    y_all = data.integers(0, 3, (args.steps, args.batch)).astype(np.int32)
    Tensor.manual_seed(7 + (mpi.launched() and int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))))  # (unlike seeds:
    # the broadcast must make the weights equal)
    model = MLP(args.bn)
    params = [p for p in get_parameters(model) if p.requires_grad]
    opt = nn.optim.SGD(params, lr=0.5)
    if not args.mpi:
        for x, y in zip(x_all, y_all):
            opt.zero_grad()
            with Tensor.train():
                loss = model(Tensor(x)).cross_entropy(Tensor(y))
                loss.backward()
            opt.step()
            print(f"{loss.item():.8f}", flush=True)
        if args.bn:  # (the running statistics too)
            assert model.bn is not None and model.bn.running_var is not None
            print(" ".join(f"{v:.6f}" for v in model.bn.running_var.tolist()[:4]), flush=True)
        return
    with mpi.world(args.timeout) as world:
        world.broadcast(get_state_dict(model).values())
        mpi.SyncBatchNorm.convert(model, world)
        for step, (x, y) in enumerate(zip(x_all, y_all)):
            if step == args.die_at and world.rank == 1 and args.die_how != "finalize":
                die(args.die_how)
            if step == args.die_at and world.rank == 1:
                break
            mine = world.share(len(x))
            weight = (mine.stop - mine.start) / len(x)
            opt.zero_grad()
            with Tensor.train():
                loss = model(Tensor(x[mine])).cross_entropy(Tensor(y[mine]))
                if args.bn:  # (through the batch norm's sums over the processes)
                    grads = world.all_reduce(world.gradients(loss * weight, params), weight=1.0)  # type: ignore[arg-type]
                    for p, g in zip(params, grads, strict=True):
                        p.grad = g
                else:
                    loss.backward()
                    world.reduce_gradients(params, weight=weight)
            opt.step()
            total = world.sum(loss.item() * weight)
            if world.rank == 0:
                print(f"{total:.8f}", flush=True)
        if args.bn and world.rank == 0:
            assert model.bn is not None and model.bn.running_var is not None
            print(" ".join(f"{v:.6f}" for v in model.bn.running_var.tolist()[:4]), flush=True)
    if args.die_how == "finalize" and world.rank == 1:
        sys.exit(0)


if __name__ == "__main__":
    main()
