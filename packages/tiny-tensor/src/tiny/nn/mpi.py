"""Data-parallel training across processes with MPI: every process holds the whole model and takes its share of
each batch; after backward the gradients are summed across the processes with one MPI all-reduce on the host, each
process's weighted by its share, so every process applies the update of the whole batch. mpi4py over the system's
MPI (`pip install 'tiny-tensor[mpi]'`, and e.g. `apt-get install openmpi-bin libopenmpi-dev`), started by mpirun:

    mpirun -n 2 python -m tiny.examples.mnist --mpi

A training loop with it:

    with mpi.world() as world:                       # rank and size; a process that fails stops the others
        world.broadcast(get_state_dict(model).values())   # rank 0's weights everywhere
        for x, y in batches:
            mine = world.share(len(x))               # this process's rows
            opt.zero_grad()
            loss = model(Tensor(x[mine])).cross_entropy(Tensor(y[mine]))
            loss.backward()
            world.reduce_gradients(params, weight=(mine.stop - mine.start) / len(x))
            opt.step()

Layers that mix the rows of a batch (batch norm) see only the process's share, as in PyTorch's DDP without
SyncBatchNorm: their statistics are the share's. `SyncBatchNorm.convert(model, world)` makes its batch norms take
the whole batch's statistics, as PyTorch's SyncBatchNorm does; the gradient then flows through the other processes'
statistics too, which backward() cannot see: take it from `world.gradients` instead (`python -m tiny.examples.mnist
--mpi` does):

            loss = model(Tensor(x[mine])).cross_entropy(Tensor(y[mine]))
            grads = world.all_reduce(world.gradients(loss * weight, params), weight=1.0)
"""

from __future__ import annotations

import math
import os
import sys
import time
import traceback
import types
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import numpy as np

from tiny.ir.dtypes import DType
from tiny.nn.layers import _BatchNorm
from tiny.tensor import Tensor

# set by the launchers in each process they start: Open MPI's mpirun, and the PMI/PMIx ones (MPICH's, Slurm's srun)
LAUNCHER_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")
INSTALL = "pip install 'tiny-tensor[mpi]' (mpi4py; it needs an MPI: apt-get install openmpi-bin libopenmpi-dev)"


class MPIError(RuntimeError):
    """MPI cannot be used here: mpi4py is missing, or the process was not started by an MPI launcher."""


def launched() -> bool:
    """Whether this process was started by an MPI launcher (mpirun, mpiexec, srun)."""
    return any(name in os.environ for name in LAUNCHER_VARIABLES)


def world(timeout: float = 300.0) -> World:
    """The processes mpirun started, as a World; MPIError where mpi4py is missing or no launcher started this one
    (MPI would then make a world of one process, and training would silently not be parallel). `timeout`: the
    seconds a collective may wait for the other processes before this one stops the job, saying so."""
    if not timeout > 0:
        raise ValueError(f"world(timeout=): expected a positive number of seconds, got {timeout!r}")
    if not launched():
        raise MPIError(
            "this process was not started by mpirun (none of the launcher's variables "
            f"{', '.join(LAUNCHER_VARIABLES)} is set): run it as `mpirun -n 2 python ...`"
        )
    try:
        from mpi4py import MPI  # noqa: PLC0415  (an optional extra: imported only where MPI is asked for)
    except (ImportError, RuntimeError) as e:  # (RuntimeError: mpi4py without an MPI library it can load)
        raise MPIError(f"MPI training needs mpi4py, which does not import here ({e}): {INSTALL}") from None
    comm = MPI.COMM_WORLD
    return World(rank=comm.Get_rank(), size=comm.Get_size(), comm=comm, timeout=timeout)


@dataclass(frozen=True)
class World:
    """The processes of one MPI job: this one's rank (0 to size - 1), their number, and the communicator.

    A process that dies stops the job, with a message, instead of leaving the others waiting in an all-reduce it
    will never join: killed, or exiting with a non-zero status, mpirun ends the others (Open MPI's default); leaving
    the World's `with` block with an exception (SystemExit and Ctrl-C included), it says what happened and calls
    MPI_Abort; and a process whose collective waits more than `timeout` seconds for the others (one left the
    training early and ended cleanly) says so and calls MPI_Abort."""

    rank: int
    size: int
    comm: Any  # mpi4py.MPI.Comm
    timeout: float = 300.0
    # the sums over the processes taken since the last `gradients` (synced_sum): (this process's part, the total)
    synced: list[tuple[Tensor, Tensor]] = field(default_factory=list, repr=False)

    def share(self, n: int) -> slice:
        """The rows of a batch of `n` this process takes: contiguous, sizes as numpy.array_split cuts them."""
        if n < self.size:
            raise ValueError(f"a batch of {n} rows cannot be split over {self.size} processes: give each at least one")
        size, extra = divmod(n, self.size)
        start = self.rank * size + min(self.rank, extra)
        return slice(start, start + size + (self.rank < extra))

    def broadcast(self, tensors: Iterable[Tensor], root: int = 0) -> None:
        """Write process `root`'s values into `tensors`, on every process (in place: optimizers keep them)."""
        for t in tensors:
            value = np.ascontiguousarray(t.numpy()).reshape(t.shape)  # (0-d arrays come back 1-d)
            self._wait(self.comm.Ibcast(value, root=root), f"a broadcast from process {root}")
            if self.rank != root:
                with Tensor.no_grad():
                    t.assign(Tensor(value, device=t.device, dtype=t.dtype)).realize()

    def reduce_gradients(self, params: Iterable[Tensor], weight: float | None = None) -> None:
        """Replace each parameter's .grad with the sum over the processes of weight * .grad (all_reduce): with
        `weight` this process's share of the batch (1 / size, the default, where the shares are equal), each .grad
        becomes the gradient of the whole batch's mean loss. Parameters without a .grad are skipped, and must be the
        same on every process."""
        with_grad = [p for p in params if p.grad is not None]
        for p, g in zip(with_grad, self.all_reduce([p.grad for p in with_grad], weight), strict=True):  # type: ignore[misc]
            p.grad = g

    def all_reduce(self, tensors: list[Tensor], weight: float | None = None) -> list[Tensor]:
        """New tensors, each the sum over the processes of weight * the tensor (1 / size by default: the mean), on
        the tensors' devices; one MPI all-reduce on the host per dtype. (For a TinyJit-captured step whose outputs
        are the gradients: a replay does not set .grad.)"""
        weight = 1 / self.size if weight is None else weight
        by_dtype: dict[DType, list[int]] = {}
        for i, t in enumerate(tensors):
            by_dtype.setdefault(t.dtype, []).append(i)
        out: list[Tensor] = list(tensors)
        for dtype, group in by_dtype.items():
            flat = np.concatenate([tensors[i].numpy().ravel() for i in group])
            flat *= flat.dtype.type(weight)
            total = np.empty_like(flat)
            self._wait(self.comm.Iallreduce(flat, total), "an all-reduce")
            at = 0
            for i in group:
                t = tensors[i]
                out[i] = Tensor(total[at : at + t.numel()].reshape(t.shape), device=t.device, dtype=dtype)
                at += t.numel()
        return out

    def synced_sum(self, part: Tensor) -> Tensor:
        """`part` summed over the processes (one host all-reduce), as a new tensor: the statistics of a whole batch
        (SyncBatchNorm). What flows back into the total is all-reduced by `gradients`, which reaches each
        process's part through it."""
        total = self.all_reduce([part.detach()], weight=1.0)[0].requires_grad_()
        self.synced.append((part, total))
        return total

    def gradients(self, loss: Tensor, params: list[Tensor]) -> list[Tensor | None]:
        """This process's part of the gradient of the sum over the processes of their `loss` (each weighted by its
        share, for the whole batch's mean) with respect to `params`: all_reduce(parts, weight=1.0) sums the parts
        into that gradient. Where the forward took sums over the processes (synced_sum), the loss of each process
        depends on every process's rows through them: the gradient of each total is all-reduced, last first (a
        total's gradient reaches the totals taken before it), and flows on into this process's part. None where a
        parameter does not reach the loss. Without synced sums this is loss.gradient(*params)."""
        synced, self.synced[:] = list(self.synced), []
        reaching: list[tuple[Tensor, Tensor]] = []  # (a part, the gradient of its total over every process's loss)
        for part, total in reversed(synced):
            (g,) = self._through(loss, reaching).gradient(total)
            g = total.zeros_like() if g is None else g
            reaching.append((part, self.all_reduce([g], weight=1.0)[0]))
        grads = self._through(loss, reaching).gradient(*params)
        return list(grads)

    @staticmethod
    def _through(loss: Tensor, reaching: list[tuple[Tensor, Tensor]]) -> Tensor:
        """`loss` plus each part's sum weighted by its total's gradient: its gradient is the whole job's."""
        for part, g in reaching:
            loss = loss + (part * g).sum()
        return loss

    def sum(self, value: float) -> float:
        """`value` summed over the processes (a loss weighted by each share sums to the whole batch's)."""
        total = np.empty(1)
        self._wait(self.comm.Iallreduce(np.array([value], np.float64), total), "a sum")
        return float(total[0])

    def _wait(self, request: Any, what: str) -> None:
        """Wait for a non-blocking collective; past the timeout, stop the job saying which one never completed."""
        deadline = time.monotonic() + self.timeout
        while not request.Test():
            if time.monotonic() > deadline:
                print(
                    f"tiny.nn.mpi: process {self.rank} of {self.size} waited {self.timeout:g} s in {what} and the "
                    "other processes did not all join it (one stopped training early, or hangs); stopping the job "
                    "(MPI_Abort)",
                    file=sys.stderr,
                    flush=True,
                )
                self.comm.Abort(1)
            time.sleep(0.0002)

    def __enter__(self) -> World:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        if error is None:
            return
        if isinstance(error, SystemExit):
            code = error.code if isinstance(error.code, int) else 1
            what = f"exited with status {error.code}" if isinstance(error.code, int) else f"exited: {error.code}"
        else:
            code = 1
            traceback.print_exception(kind, error, tb, file=sys.stderr)
            what = f"failed with {kind.__name__ if kind else 'an error'}: {error}"
        print(
            f"tiny.nn.mpi: process {self.rank} of {self.size} {what}; stopping the other processes (MPI_Abort)",
            file=sys.stderr,
            flush=True,
        )
        self.comm.Abort(code or 1)  # (status 0 mid-run is an early exit all the same: the others would wait for it)


class SyncBatchNorm(_BatchNorm):
    """Batch norm whose training statistics are the whole batch's over the processes of a World (PyTorch's
    SyncBatchNorm): each channel's mean and variance from the sums of every process's rows (World.synced_sum, a host
    all-reduce each), the running statistics updated with them on every process alike. The gradient must come from
    World.gradients, which all-reduces what flows back through the sums. Out of training, the running statistics.
    `SyncBatchNorm.convert(model, world)` puts one in place of each batch norm layer of a model, over its tensors."""

    def __init__(self, layer: _BatchNorm, world: World) -> None:
        vars(self).update(vars(layer))  # the layer's tensors and settings, under its names (state dicts keep them)
        self.ndims = layer.ndims
        self._world = _Of(world)

    @classmethod
    def convert(cls, module: Any, world: World) -> Any:
        """`module` with each batch norm layer in its attributes, lists and dicts (at any depth; not in tuples)
        replaced by a SyncBatchNorm over the layer's tensors; a batch norm layer itself comes back converted."""
        if isinstance(module, _BatchNorm) and not isinstance(module, SyncBatchNorm):
            return cls(module, world)
        seen: set[int] = set()
        todo = [module]
        while todo:
            obj = todo.pop()
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            for key, value in _held(obj):
                if not isinstance(value, _BatchNorm) or isinstance(value, SyncBatchNorm):
                    todo.append(value)
                elif isinstance(obj, (list, dict)):
                    obj[key] = cls(value, world)
                else:
                    setattr(obj, key, cls(value, world))
        return module

    def _by_batch(self, x: Tensor) -> Tensor:
        """x normalized by the whole batch's statistics across the processes (see the class)."""
        world = self._world.world
        axes = (0, *range(2, x.ndim))
        shape = (1, x.shape[1], *([1] * (x.ndim - 2)))
        count = world.sum(float(math.prod(x.shape[a] for a in axes)))  # values per channel in the whole batch
        if count <= 1:
            raise ValueError(f"batch norm in training needs more than one value per channel, got {count:g} in all")
        mean = world.synced_sum(x.sum(axis=axes)) / count
        var = world.synced_sum((x - mean.reshape(shape)).square().sum(axis=axes)) / count
        if Tensor.is_training() and self.track_running_stats:
            assert self.running_mean is not None and self.running_var is not None
            factor = self._update_factor()
            self.running_mean.assign((1 - factor) * self.running_mean + factor * mean.detach())
            self.running_var.assign((1 - factor) * self.running_var + factor * var.detach() * (count / (count - 1)))
        y = (x - mean.reshape(shape)) * (var.reshape(shape) + self.eps).rsqrt()
        if self.weight is not None:
            y = y * self.weight.reshape(shape)
        return y if self.bias is None else y + self.bias.reshape(shape)


def _held(obj: Any) -> list[tuple[Any, Any]]:
    """What a model holds where a layer can be replaced: a list's items, a dict's, an object's attributes (not a
    tensor's, a class's or a module's)."""
    if isinstance(obj, list):
        return list(enumerate(obj))
    if isinstance(obj, dict):
        return list(obj.items())
    if isinstance(obj, (Tensor, type, types.ModuleType)) or not hasattr(obj, "__dict__"):
        return []
    return list(vars(obj).items())


class _Of:
    """The World a layer takes its sums in, out of reach of get_state_dict (no __dict__: its tensors are not the
    model's)."""

    __slots__ = ("world",)

    def __init__(self, world: World) -> None:
        self.world = world
