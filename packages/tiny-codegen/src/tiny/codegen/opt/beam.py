"""BEAM search: find a kernel's optimization actions by timing candidates on the device.

Each round extends every kernel in the beam by one more legal action, compiles the new candidates in
parallel (one compiler process per core), times each on fresh buffers, and keeps the `width` fastest. The
search stops when a round finds nothing faster or the time budget is spent; the winner is cached on disk
per (kernel, device, renderer target, code generator), so a kernel is searched once per machine and version.
"""

from __future__ import annotations

import functools
import math
import pathlib
import pickle
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tiny.codegen.lower import kernel_name
from tiny.codegen.opt.actions import Kernel, KernelOptError, Kind, Opt, OptOps
from tiny.codegen.opt.heuristic import hand_opts
from tiny.codegen.program import Rendered, render_kernel, to_program
from tiny.ir.config import flag
from tiny.ir.device import Compiled, CompiledProgram, CompileError, usable_cores
from tiny.ir.diskcache import cache_get, cache_put, digest
from tiny.ir.dtypes import PtrDType
from tiny.ir.sint import kernel_variables
from tiny.ir.uop import Ops, UOp

BEAM_BUDGET = flag("BEAM_BUDGET", int, 60, "seconds a BEAM search may spend on one kernel")

AMOUNTS = (0, 2, 3, 4, 5, 7, 8, 16, 32)  # 0: the whole part
REPEATS = 3  # timed runs per candidate; the fastest counts


@dataclass(frozen=True)
class Candidate:
    opts: tuple[Opt, ...]
    seconds: float


def actions(k: Kernel) -> list[Opt]:
    """Every action worth trying next on k (legality is checked when one is applied)."""
    out: list[Opt] = []
    caps = k.caps
    if caps.tensor_cores and not k.applied:  # a matrix product on tensor cores: K and which core
        out += [
            Opt(OptOps.TC, i, t)
            for i, p in enumerate(k.axes)
            if p.kind is Kind.REDUCE
            for t in range(len(caps.tensor_cores))
        ]
    for i, p in enumerate(k.axes):
        if type(p.size) is not int:
            continue  # (a symbolic size is not cut)
        if p.kind is Kind.GLOBAL:
            out += [Opt(OptOps.UPCAST, i, a) for a in AMOUNTS if a == 0 and p.size <= 16 or a and p.size % a == 0]
            if caps.has_local:
                out += [Opt(OptOps.LOCAL, i, a) for a in (2, 4, 8, 16, 32) if p.size % a == 0]
            if caps.threads > 1:
                out += [Opt(OptOps.THREAD, i, t) for t in range(2, caps.threads + 1) if p.size % t == 0]
            out += [Opt(OptOps.SWAP, i, j) for j in range(i + 1, len(k.axes)) if k.axes[j].kind is Kind.GLOBAL]
            if caps.has_shared and p.dim in k.row_dims():
                most = next(a for a in range(min(p.size, 256), 0, -1) if p.size % a == 0)  # (the rules' choice)
                out += [Opt(OptOps.ROWS, i, a) for a in dict.fromkeys((32, 64, 128, 256, most)) if p.size % a == 0]
        else:
            out += [Opt(OptOps.UNROLL, i, a) for a in AMOUNTS if a == 0 and p.size <= 16 or a and p.size % a == 0]
            if caps.has_shared:
                out += [Opt(op, i, a) for op in (OptOps.GROUP, OptOps.GROUPTOP) for a in (2, 4, 8, 16, 32, 64)]
            if k.tc is not None and caps.has_shared:
                out += [Opt(OptOps.STAGE, i, a) for a in ((0, 1, 2, 3) if caps.async_copy else (0,))]
        if p.size == k.full_shape[p.dim] and p.size % 16:  # (and to a multiple of the threads: THREAD after it)
            pads = (4, 8, 16, 32) + ((caps.threads,) if caps.threads > 1 and p.kind is Kind.GLOBAL else ())
            out += [Opt(OptOps.PADTO, i, a) for a in dict.fromkeys(pads)]
    return out


@functools.cache
def _codegen_digest() -> str:
    """A digest of this package's source. A cached winner is only the winner for the code generator that timed it:
    the actions' meaning changes with how Kernel numbers a kernel's dims, and the speed of each candidate with how
    the renderers write it."""
    here = pathlib.Path(__file__).parent
    return digest(b"".join(f.read_bytes() for f in sorted(here.glob("*.py"))))


def _search_key(ast: UOp, device: Compiled, width: int) -> str:
    meta = f"\0{device.name}\0{device.renderer_name}\0{device.renderer.target}\0{width}\0{_codegen_digest()}"
    blob = pickle.dumps(ast) + meta.encode()
    return digest(blob)


class _Timer:
    """Runs candidate programs on buffers of the kernel's sizes, allocated once for the whole search."""

    def __init__(self, ast: UOp, device: Compiled) -> None:
        self.device = device
        globals_ = sorted({u for u in ast.toposort if u.op is Ops.DEFINE_GLOBAL}, key=lambda u: u.arg)
        self.sizes = []
        for g in globals_:
            dt = g.dtype
            assert isinstance(dt, PtrDType) and dt.base is not None
            self.sizes.append(max(dt.size, 1) * dt.base.itemsize)
        self.bufs = [device.allocator.alloc(n) for n in self.sizes]
        for b, n in zip(self.bufs, self.sizes):  # written once: memory never written reads as one shared page of
            device.allocator.copyin(b, memoryview(bytearray(n)))  # zeros (a CPU's), always in cache, and times wrong
        # a kernel over symbolic sizes is timed at each Variable's largest value (its buffers hold that many)
        self.values = {v.arg[0]: v.arg[2] for v in kernel_variables(ast)}

    def time(self, prog: CompiledProgram, cutoff: float = math.inf) -> float:
        """The fastest of a few runs; one run only when that one is already slower than `cutoff`."""
        runner = self.device.load(prog)
        best = math.inf
        for _ in range(REPEATS):
            if best > cutoff:
                break
            vals = tuple(self.values[n] for n in prog.var_names)
            t = runner(*self.bufs, global_size=prog.grid(vals), local_size=prog.local_size, vals=vals, wait=True)
            best = min(best, t if t is not None else math.inf)
        return best

    def close(self) -> None:
        for b, n in zip(self.bufs, self.sizes):
            self.device.allocator.free(b, n)


def beam_search(ast: UOp, device: Compiled, width: int, budget_s: float | None = None) -> list[Opt]:
    """The fastest action list found for this kernel on this device (cached on disk once found)."""
    key = _search_key(ast, device, width)
    if (hit := cache_get("beam", key)) is not None:
        return list(hit)
    budget = BEAM_BUDGET.value if budget_s is None else budget_s
    base = Kernel(ast, device.renderer.caps)
    if base.empty:
        return []
    start = time.perf_counter()
    timer = _Timer(ast, device)
    workers = ThreadPoolExecutor(max_workers=usable_cores())  # compilers are processes: all cores work
    try:
        seeds = [tuple(hand_opts(base)), ()]  # the rules' choice first: it sets the bar the others must reach
        beam = sorted(_measure(ast, device, timer, workers, seeds), key=lambda c: c.seconds)[:width]
        best = beam[0]
        rounds = 0
        while time.perf_counter() - start < budget:
            rounds += 1
            tried = {c.opts for c in beam}
            nexts = []
            for c in beam:
                k = base.copy().apply_opts(list(c.opts))
                for a in actions(k):
                    opts = c.opts + (a,)
                    if opts not in tried and _legal(base, opts):
                        tried.add(opts)
                        nexts.append(opts)
            found = _measure(ast, device, timer, workers, nexts, deadline=start + budget)
            beam = sorted(beam + found, key=lambda c: c.seconds)[:width]
            _progress(ast, rounds, len(nexts), beam[0], time.perf_counter() - start)
            if beam[0].seconds >= best.seconds:
                break  # this round found nothing faster
            best = beam[0]
    finally:
        workers.shutdown(cancel_futures=True)
        timer.close()
    print(file=sys.stderr)
    cache_put("beam", key, best.opts)
    return list(best.opts)


def _legal(base: Kernel, opts: tuple[Opt, ...]) -> bool:
    try:
        base.copy().apply_opts(list(opts))
    except KernelOptError:
        return False
    return True


def _measure(
    ast: UOp,
    device: Compiled,
    timer: _Timer,
    workers: ThreadPoolExecutor,
    candidates: list[tuple[Opt, ...]] | tuple[tuple[Opt, ...], ...],
    deadline: float = math.inf,
) -> list[Candidate]:
    """Render each candidate here, compile them all in parallel, then time them one by one."""
    rendered: dict[str, tuple[tuple[Opt, ...], Rendered]] = {}
    for opts in candidates:
        if time.perf_counter() > deadline:
            break
        r = render_kernel(ast, device, opts)
        rendered.setdefault(r.src, (opts, r))  # different actions can give the same code: time it once
    jobs = [(opts, r, workers.submit(device.compile, r.src)) for opts, r in rendered.values()]
    out: list[Candidate] = []
    for opts, r, job in jobs:
        if time.perf_counter() > deadline:
            job.cancel()  # the budget is spent: what has not started compiling does not
            continue
        try:
            binary = job.result()
        except CompileError:
            continue  # a candidate the compiler rejects (too big, too many registers) is not a candidate
        if time.perf_counter() > deadline:
            continue
        cutoff = 3 * min((c.seconds for c in out), default=math.inf)
        out.append(Candidate(opts, timer.time(to_program(r, device, binary), cutoff)))
    return out


def _progress(ast: UOp, rounds: int, tried: int, best: Candidate, elapsed: float) -> None:
    name = kernel_name(ast)
    line = f"BEAM {name}: round {rounds}, {tried} candidates, best {best.seconds * 1e6:.1f} us {list(best.opts)}"
    if at := ", ".join(f"{v.arg[0]}={v.arg[2]}" for v in kernel_variables(ast)):
        line += f" (timed at {at})"
    print(f"\r{line[:200]} ({elapsed:.1f} s)", end="", file=sys.stderr, flush=True)
