"""Running the CUDA C renderer's kernels on the CPU, to check their numerics without a GPU: the source is compiled as
C++ by clang with a small shim for what CUDA adds (qualifiers, threadIdx/blockIdx as thread-local variables,
__shared__ as a static array, __syncthreads as a barrier, the float bit casts and float16 conversions that a GPU
does with intrinsics and PTX), and a launcher runs each block's threads as std::threads. What this cannot check is
the device compiler and the GPU's own math library: those are the CUDA suite's on a GPU machine."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Any

import numpy as np

SHIM = r"""#include <barrier>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>
#define __device__
#define __global__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __align__(n) alignas(n)
#define __launch_bounds__(...)
#define __shared__ static
struct tiny_dim3 { unsigned int x, y, z; };
thread_local tiny_dim3 threadIdx, blockIdx;
static std::barrier<>* tiny_block_barrier;
inline void __syncthreads() { tiny_block_barrier->arrive_and_wait(); }
inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
inline float __uint_as_float(unsigned int i) { float f; memcpy(&f, &i, 4); return f; }
inline unsigned int __float_as_uint(float f) { unsigned int i; memcpy(&i, &f, 4); return i; }
inline float tiny_f16_to_f32(unsigned short h) { _Float16 x; memcpy(&x, &h, 2); return (float)x; }
inline unsigned short tiny_f16_bits(_Float16 x) { unsigned short h; memcpy(&h, &x, 2); return h; }
inline unsigned short tiny_f32_to_f16(float f) { return tiny_f16_bits((_Float16)f); }
inline unsigned short tiny_f64_to_f16(double d) { return tiny_f16_bits((_Float16)d); }
"""

_KERNEL = re.compile(r'extern "C" __global__ void __launch_bounds__\(\d+\) (\w+)\((.*?)\) \{', re.S)


def _launcher(name: str, params: str, entry: str) -> str:
    """A C entry point that runs kernel `name` over a grid of blocks, each block's threads at once."""
    args = []
    n_buf = n_val = 0
    for p in (p.strip() for p in params.split(",") if p.strip()):
        if "*" in p:
            args.append(f"({p.split(' restrict ')[0]})bufs[{n_buf}]")
            n_buf += 1
        else:
            args.append(f"vals[{n_val}]")
            n_val += 1
    call = f"{name}({', '.join(args)})"
    return (
        f'extern "C" void {entry}(void** bufs, const int* vals, int gx, int gy, int gz, int bx, int by, int bz) {{\n'
        "  for (int z = 0; z < gz; z++) for (int y = 0; y < gy; y++) for (int x = 0; x < gx; x++) {\n"
        "    std::barrier<> block(bx * by * bz);\n    tiny_block_barrier = &block;\n"
        "    std::vector<std::thread> threads;\n"
        "    for (int tz = 0; tz < bz; tz++) for (int ty = 0; ty < by; ty++) for (int tx = 0; tx < bx; tx++)\n"
        "      threads.emplace_back([=] {\n"
        "        blockIdx = {(unsigned)x, (unsigned)y, (unsigned)z};\n"
        "        threadIdx = {(unsigned)tx, (unsigned)ty, (unsigned)tz};\n"
        f"        {call};\n      }});\n"
        "    for (auto& t : threads) t.join();\n  }\n}\n"
    )


@functools.cache
def compiler() -> str | None:
    """A clang++ that builds C++20 with std::barrier and _Float16."""
    for cc in ("clang++-19", "clang++", *(f"clang++-{v}" for v in range(25, 15, -1))):
        if shutil.which(cc) and _build(cc, SHIM + 'extern "C" void f() { _Float16 h = 1; (void)h; }', False):
            return cc
    return None


def _build(cc: str, src: str, check: bool = True) -> ctypes.CDLL | None:
    """Compile src into a shared library and load it; None (or, with check, a RuntimeError) when clang refuses."""
    folder = tempfile.mkdtemp(prefix="tiny_cuda_host_")
    path = os.path.join(folder, hashlib.sha256(src.encode()).hexdigest()[:16])
    with open(path + ".cpp", "w") as f:
        f.write(src)
    flags = ["-std=c++20", "-O1", "-ffp-contract=off", "-shared", "-fPIC", "-pthread"]
    cmd = [cc, *flags, path + ".cpp", "-o", path + ".so"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        if not check:
            return None
        raise RuntimeError(f"{cc} did not build the kernel:\n{r.stderr[:4000]}\n--- source ---\n{src}")
    return ctypes.CDLL(path + ".so")


@dataclass
class Job:
    """One kernel launch: the rendered source, its arrays (written in place), grid, block, int arguments, and how
    many bytes off its alignment every buffer is put (a vector access must then take its lane-by-lane path)."""

    src: str
    buffers: list[np.ndarray]
    grid: tuple[int, int, int] = (1, 1, 1)
    block: tuple[int, int, int] = (1, 1, 1)
    vals: tuple[int, ...] = ()
    misalign: int = 0


def static_shared(src: str) -> str:
    """The source with its dynamic shared array (tiny.codegen.renderer.shared) a static one of the size it says."""
    size = re.search(r"^// dynamic shared memory: (\d+) bytes$", src, re.M)
    extern = "extern __shared__ __align__(16) unsigned char tiny_shared[];"
    return src.replace(extern, f"alignas(16) static unsigned char tiny_shared[{size.group(1)}];") if size else src


def run_all(jobs: list[Job]) -> None:
    """Compile the kernels of every job into libraries (one clang run for the kernels of each prelude: the kernels'
    names must differ) and run them in order."""
    cc = compiler()
    assert cc is not None, "no clang++ with C++20 here"
    by_prelude: dict[str, tuple[list[str], list[int]]] = {}
    for i, job in enumerate(jobs):
        src = static_shared(job.src)
        m = _KERNEL.search(src)
        assert m is not None, "each job is one kernel"
        prelude = src[: src.index('extern "C" __global__')]
        parts, which = by_prelude.setdefault(prelude, ([SHIM, prelude], []))
        parts += [src[len(prelude) :], _launcher(m.group(1), m.group(2), f"tiny_launch_{i}")]
        which.append(i)
    launchers = {}
    for parts, which in by_prelude.values():
        lib = _build(cc, "".join(parts))
        assert lib is not None
        launchers |= {i: getattr(lib, f"tiny_launch_{i}") for i in which}
    for i, job in enumerate(jobs):
        _launch(launchers[i], job)


def run(
    src: str,
    buffers: list[np.ndarray],
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    vals: tuple[int, ...] = (),
    misalign: int = 0,
) -> None:
    """Compile the CUDA C in `src` for the host and run it on NumPy arrays (written in place)."""
    run_all([Job(src, buffers, grid, block, vals, misalign)])


def _launch(fn: Any, job: Job) -> None:
    copies = []
    for b in job.buffers:
        raw = np.zeros(b.nbytes + 64 + job.misalign, np.uint8)
        start = (-raw.ctypes.data) % 64 + job.misalign
        view = raw[start : start + b.nbytes]
        view[:] = b.view(np.uint8).reshape(-1)
        copies.append((raw, view))
    ptrs = (ctypes.c_void_p * max(len(job.buffers), 1))(*(v.ctypes.data for _, v in copies))
    ints = (ctypes.c_int * max(len(job.vals), 1))(*job.vals)
    fn(ptrs, ints, *job.grid, *job.block)
    for b, (_, view) in zip(job.buffers, copies):
        b.view(np.uint8).reshape(-1)[:] = view
