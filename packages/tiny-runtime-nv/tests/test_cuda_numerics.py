"""What the kernels of the tensor-op sweep (nv_kernels.py) compute, without a GPU: every kernel planned for an H100
and rendered as PTX runs in tiny-codegen's PTX interpreter, and rendered as CUDA C runs on the CPU through
tiny-codegen's CUDA shim (real threads per block); each op's result is compared with the CPU device's. Kernels with
tensor cores (mma.sync) run on neither and are left out, by name. The interpreter and the shim live in
packages/tiny-codegen/tests (this checkout's), which the nv nox session has."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest
from nv_kernels import RenderedKernel, ops, render_schedule, target

from tiny.codegen.renderer.cuda import CUDARenderer
from tiny.codegen.renderer.ptx import PTXRenderer
from tiny.ir.device import Buffer
from tiny.ir.dtypes import dtypes
from tiny.ir.schedule import create_schedule
from tiny.ir.sint import sym_eval
from tiny.ir.uop import Ops

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tiny-codegen" / "tests"))
import cuda_host  # noqa: E402
import ptx_interpreter  # noqa: E402

OPS = ops()
SLOW_IN_THE_INTERPRETER = {"matmul"}  # 64^3 multiply-adds in Python: matmul_odd covers the same code
TOLERANCE = {dtypes.float64: 1e-9, dtypes.float32: 1e-4, dtypes.float16: 1e-2, dtypes.bfloat16: 2e-2}


def _bytes(buf: Buffer) -> np.ndarray:
    return np.frombuffer(buf.as_bytes(), np.uint8).copy() if buf.is_allocated else np.zeros(buf.nbytes, np.uint8)


def _check(op: str, got: np.ndarray, want: np.ndarray) -> None:
    dt = OPS_DTYPES[op]
    if want.dtype.kind in "fc" or dt == dtypes.bfloat16:
        if dt == dtypes.bfloat16:
            got = (got.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            got = got.view(want.dtype)
        tol = TOLERANCE[dt]  # (a symbolic shape's buffer holds its largest size: its values are the first ones)
        got = got[: want.size].reshape(want.shape)
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), tol, tol)
    else:
        np.testing.assert_array_equal(got.view(want.dtype)[: want.size].reshape(want.shape), want)


OPS_DTYPES = {name: f().dtype for name, f in OPS.items()}


def _run_op(op: str, renderer: object, runner: object) -> None:
    t = OPS[op]()
    values = create_schedule([t.uop]).var_vals  # (the symbolic ops' Variables: integer arguments of their kernels)
    items = [i for i in t.schedule() if i.ast.op is Ops.SINK]
    kernels = render_schedule(op, t, renderer)  # type: ignore[arg-type]
    if any(Ops.WMMA in {u.op for u in k.uops} for k in kernels):
        pytest.skip(f"{op} uses tensor cores (mma.sync): neither the interpreter nor the CPU runs them")
    memory: dict[int, np.ndarray] = {}
    launches = [(k, [memory.setdefault(id(b), _bytes(b)) for b in item.buffers]) for item, k in zip(items, kernels)]
    assert len(launches) == len(items) == len(kernels)
    runner(launches, values)  # type: ignore[operator]
    want = t.numpy()
    _check(op, memory[id(items[-1].buffers[0])], want)


def _grid(k: RenderedKernel, values: dict[str, int] | None = None) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """The launch: its workgroups (a count over a Variable takes its value, as CompiledProgram.grid does) and the
    workgroup's threads from the hardware indices."""
    block = [1, 1, 1]
    for u in k.uops:
        if u.op is Ops.SPECIAL and u.arg[0].startswith("lidx"):
            block[int(u.arg[0][4:])] = u.arg[1]
    x, y, z = (sym_eval(g, values) for g in k.global_size)
    return (x, y, z), (block[0], block[1], block[2])


@pytest.mark.parametrize("op", sorted(set(OPS) - SLOW_IN_THE_INTERPRETER))
def test_ptx_kernels_compute_what_the_cpu_does(op: str) -> None:
    def run(launches: list[tuple[RenderedKernel, list[np.ndarray]]], values: dict[str, int]) -> None:
        for k, arrays in launches:
            ptx_interpreter.run(k.src, arrays, *_grid(k, values), vals=values)

    _run_op(op, PTXRenderer(target("sm_90")), run)


@pytest.mark.skipif(cuda_host.compiler() is None, reason="no clang++ here builds C++20 with std::barrier")
@pytest.mark.parametrize("op", sorted(OPS))
def test_cuda_c_kernels_compute_what_the_cpu_does(op: str) -> None:
    def run(launches: list[tuple[RenderedKernel, list[np.ndarray]]], values: dict[str, int]) -> None:
        jobs = []
        for i, (k, arrays) in enumerate(launches):  # one library: each kernel renamed apart
            src = k.src.replace(f") {k.name}(", f") {k.name}_{i}(", 1)
            vals = tuple(values[u.arg[0]] for u in k.uops if u.op is Ops.DEFINE_VAR)
            jobs.append(cuda_host.Job(src, arrays, *_grid(k, values), vals=vals))
        cuda_host.run_all(jobs)

    _run_op(op, CUDARenderer(target("sm_90")), run)


def test_the_grid_comes_from_the_hardware_indices() -> None:
    (k,) = render_schedule("sum", OPS["sum_rows"](), PTXRenderer(target("sm_90")))
    grid, block = _grid(k)
    assert re.search(rf"\.maxntid {block[0]}, {block[1]}, {block[2]}", k.src)
    assert grid[0] >= 1 and block[0] >= 1
