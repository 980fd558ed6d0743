"""Every workload of the suite, in the order the table lists them, and the choice made by --only."""

from __future__ import annotations

from bench.core import Workload
from bench.decode import DECODE_OVERHEAD, DECODE_STEP
from bench.kernels import CONV2D, ELEMENTWISE, SOFTMAX, SUM, matmul
from bench.overhead import FIRST_RESULT, FIRST_RESULT_WARM, JIT_REPLAY, OVERHEAD_EACH, OVERHEAD_LAZY
from bench.training import MNIST_COLD_STEP, MNIST_STEP

WORKLOADS: tuple[Workload, ...] = (
    matmul(512, quick_n=64),
    matmul(1024, quick_n=128),
    matmul(2048, quick_n=256),
    ELEMENTWISE,
    SUM,
    SOFTMAX,
    CONV2D,
    MNIST_STEP,
    DECODE_STEP,
    OVERHEAD_EACH,
    OVERHEAD_LAZY,
    JIT_REPLAY,
    DECODE_OVERHEAD,
    FIRST_RESULT,
    FIRST_RESULT_WARM,
    MNIST_COLD_STEP,
)


def select(only: str | None, workloads: tuple[Workload, ...] = WORKLOADS) -> list[Workload]:
    """The workloads named in a comma-separated list (a workload's name, or its group: "matmul" is all three);
    every workload when only is None. `workloads` is the suite to choose from (the GPU suite's, with --gpu)."""
    if not only:
        return list(workloads)
    names = [n.strip() for n in only.split(",") if n.strip()]
    known = {w.name for w in workloads} | {w.group for w in workloads}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown workload(s) {unknown}; the workloads are {[w.name for w in workloads]}")
    return [w for w in workloads if w.name in names or w.group in names]
