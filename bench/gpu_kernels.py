"""The matrix product's kernel alone, under each plan, on each renderer of a GPU device: what the heuristics chose,
what each optimization action adds, and (with --beam) what BEAM finds. Part of bench/gpu_check.sh.

    python -m bench.gpu_kernels                         # CUDA and CUDA:PTX, fp16 and bf16, N = 4096 and 8192, a conv
    python -m bench.gpu_kernels --devices CPU --dtypes float32 --sizes 256   # the code path on a CPU machine

Each kernel runs on buffers of its sizes (uninitialized: a kernel's time does not depend on the values) and is
timed by the device (`wait=True`), the fastest of --reps runs after one warm-up. TFLOPS = 2 N^3 / time.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np

from tiny.codegen.opt import Kernel, KernelOptError, Opt, OptOps
from tiny.codegen.opt.beam import beam_search
from tiny.codegen.opt.heuristic import hand_opts
from tiny.codegen.program import build_program
from tiny.ir.device import CompileError, Device
from tiny.ir.dtypes import PtrDType, dtypes
from tiny.ir.schedule import create_schedule
from tiny.ir.uop import Ops, UOp
from tiny.tensor import Tensor


def matmul_ast(n: int, dtype: str, device: str) -> UOp:
    """The kernel of an n x n @ n x n product of `dtype` tensors on `device` (the one with the sum)."""
    dt = dtypes.from_name(dtype)
    a, b = (Tensor(np.zeros((n, n), np.float32), device=device).cast(dt).realize() for _ in range(2))
    items = create_schedule([(a @ b).uop]).items
    return next(i.ast for i in items if any(u.op is Ops.REDUCE_AXIS for u in i.ast.toposort))


CONV = (
    32,
    128,
    28,
    28,
    128,
)  # batch, input channels, height, width, output channels of a 3 x 3 convolution (padding 1)


def conv_ast(dtype: str, device: str) -> UOp:
    """The kernel of a 3 x 3 convolution (CONV's sizes) of `dtype` tensors on `device` (the one with the sum)."""
    dt, (n, ci, h, w, co) = dtypes.from_name(dtype), CONV
    x = Tensor(np.zeros((n, ci, h, w), np.float32), device=device).cast(dt).realize()
    weight = Tensor(np.zeros((co, ci, 3, 3), np.float32), device=device).cast(dt).realize()
    items = create_schedule([x.conv2d(weight, padding=1).uop]).items
    return next(i.ast for i in items if any(u.op is Ops.REDUCE_AXIS for u in i.ast.toposort))


def time_plan(ast: UOp, device: str, opts: list[Opt] | None, reps: int) -> float:
    """Seconds of the fastest of `reps` runs of the kernel after `opts` (None: the heuristics')."""
    dev = Device[device]
    prog = build_program(ast, dev, opts)
    runner = dev.load(prog)
    bufs = []
    for g in sorted({u for u in ast.toposort if u.op is Ops.DEFINE_GLOBAL}, key=lambda u: u.arg):
        assert isinstance(g.dtype, PtrDType) and g.dtype.base is not None
        bufs.append((dev.allocator.alloc(g.dtype.size * g.dtype.base.itemsize), g.dtype.size * g.dtype.base.itemsize))
    try:
        best = math.inf
        for _ in range(reps + 1):
            t = runner(*(b for b, _ in bufs), global_size=prog.global_size, local_size=prog.local_size, wait=True)
            best = min(best, t if t is not None else math.inf)
        return best
    finally:
        for b, size in bufs:
            dev.allocator.free(b, size)


def plans(ast: UOp, device: str) -> dict[str, list[Opt] | None]:
    """The heuristics' plan, and that plan with each of its last actions left out (what each one brings)."""
    rules = hand_opts(Kernel(ast, Device[device].renderer.caps))
    out: dict[str, list[Opt] | None] = {"rules": None}
    for cut in range(1, min(3, len(rules)) + 1):
        out[f"rules less the last {cut}"] = rules[:-cut]
    out["rules: " + " ".join(repr(o) for o in rules)] = rules
    if rules and rules[-1].op is OptOps.STAGE and rules[-1].arg == 0:  # the tiles copied the other way too
        other = rules[:-1] + [Opt(OptOps.STAGE, rules[-1].axis, 1)]
        out["rules, tiles copied asynchronously a K step ahead (STAGE 1, cp.async)"] = other
    elif rules and rules[-1].op is OptOps.STAGE:
        out["rules, tiles copied through registers (STAGE 0)"] = rules[:-1] + [Opt(OptOps.STAGE, rules[-1].axis, 0)]
    if rules and rules[-1].op is OptOps.STAGE and Device[device].renderer.caps.async_copy:  # deeper pipelines (past
        for ahead in (2, 3):  # 48 KiB of tiles: dynamic shared memory)
            out[f"rules, tiles copied {ahead} K steps ahead (STAGE {ahead})"] = rules[:-1] + [
                Opt(OptOps.STAGE, rules[-1].axis, ahead)
            ]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--devices", default="CUDA,CUDA:PTX")
    p.add_argument("--dtypes", default="float16,bfloat16")
    p.add_argument("--sizes", default="4096,8192", help="the matrix products' N")
    p.add_argument("--conv", type=int, default=1, help="1: also a 3 x 3 convolution (CONV: 32 x 128 x 28 x 28 -> 128)")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--beam", type=int, default=0, help="also a BEAM search of this width (first device and dtype)")
    p.add_argument("--beam-budget", type=float, default=60.0)
    args = p.parse_args(argv)
    batch, ci, h, w, co = CONV
    for device in args.devices.split(","):
        for dtype in args.dtypes.split(","):
            kernels = [(f"N={n:5}", matmul_ast(n, dtype, device), 2 * n**3) for n in map(int, args.sizes.split(","))]
            if args.conv:
                kernels.append(("conv3x3", conv_ast(dtype, device), 2 * batch * co * h * w * ci * 9))
            for name, ast, flops in kernels:
                for label, opts in plans(ast, device).items():
                    try:
                        seconds = time_plan(ast, device, opts, args.reps)
                    except (KernelOptError, CompileError) as e:
                        print(f"{device:9} {dtype:9} {name}  {label}: not run: {str(e).splitlines()[0][:150]}")
                        continue
                    tflops = flops / seconds / 1e12
                    print(f"{device:9} {dtype:9} {name}  {tflops:8.1f} TFLOPS  {seconds * 1e3:8.3f} ms  {label}")
    if args.beam:
        device, dtype, n = args.devices.split(",")[0], args.dtypes.split(",")[0], int(args.sizes.split(",")[0])
        ast = matmul_ast(n, dtype, device)
        start = time.perf_counter()
        found = beam_search(ast, Device[device], args.beam, args.beam_budget)
        seconds = time_plan(ast, device, found, args.reps)
        print(f"BEAM={args.beam} on {device} {dtype} N={n} ({time.perf_counter() - start:.0f} s): "
              f"{2 * n**3 / seconds / 1e12:.1f} TFLOPS {seconds * 1e3:.3f} ms with {found}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
