"""The Python side of a cold start: how long turning kernel ASTs into source takes (choosing the optimization
actions, lowering, simplifying, linearizing, rendering), compiling excluded, and a hash of every source it made.

    python -m bench.render collect KERNELS.pkl [--quick]     # run the suite's tiny sides once; keep every kernel AST
    python -m bench.render time KERNELS.pkl [--only mnist_step] [--profile N] [--hashes OUT.json]

`collect` runs each workload's tiny side once (setup and one call: an MNIST step is its model's initialization and
its first training step, 100-odd kernels) and pickles the ASTs of the kernels it built, by workload, with their
device. `time` loads them in a fresh process (so nothing about them is cached yet: a UOp caches its toposort,
bounds ... as it is first asked; an AST collected by an older tiny is brought to today's form, tiny.replay.current_ast)
and renders each one as a cold start would, timing the whole; `--profile N` prints cProfile's top N functions by own
and by cumulative time. The CPU time it prints besides the wall time
is the steadier figure on a busy machine; `--hashes` writes each source's sha256, so two checkouts
can be shown to render the same code (compare the files).
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import pickle
import pstats
import sys
import time

from bench.workloads import WORKLOADS
from tiny.codegen import choose_opts, render
from tiny.ir.device import Device
from tiny.ir.uop import UOp
from tiny.replay import current_ast
from tiny.tensor import realize

Kernels = dict[str, list[tuple[UOp, str]]]  # workload -> (kernel AST, device name) in the order they were built


def collect(path: str, quick: bool) -> None:
    found: Kernels = {}
    current: list[tuple[UOp, str]] = []
    get_program, get_programs = realize.get_program, realize.get_programs

    def recorded_one(ast, device, *args, **kwargs):  # noqa: ANN001, ANN202
        current.append((ast, device.name))
        return get_program(ast, device, *args, **kwargs)

    def recorded_many(kernels):  # noqa: ANN001, ANN202
        current.extend((ast, device.name) for ast, device in kernels)
        return get_programs(kernels)

    realize.get_program, realize.get_programs = recorded_one, recorded_many
    for w in WORKLOADS:
        if "tiny" not in w.setups or w.group == "startup":
            continue
        current = found[w.name] = []
        w.setups["tiny"](w.params(quick), Device.DEFAULT).run()
        print(f"{w.name}: {len(current)} kernel(s)", file=sys.stderr)
    with open(path, "wb") as f:
        pickle.dump(found, f)


def render_all(kernels: list[tuple[UOp, str]]) -> list[str]:
    """Every kernel's source, as a cold start renders it (the actions chosen as get_program chooses them)."""
    out = []
    for ast, name in kernels:
        device = Device[name]
        out.append(render(ast, device.renderer, choose_opts(ast, device)).src)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("collect", "time"))
    parser.add_argument("path")
    parser.add_argument("--quick", action="store_true", help="collect: the workloads' small sizes")
    parser.add_argument("--only", help="time: these workloads (comma-separated); default all")
    parser.add_argument("--profile", type=int, default=0, help="time: print cProfile's top N functions")
    parser.add_argument("--hashes", help="time: write each source's sha256 here (JSON)")
    args = parser.parse_args()
    if args.mode == "collect":
        collect(args.path, args.quick)
        return
    with open(args.path, "rb") as f:
        found: Kernels = pickle.load(f)
    found = {name: [(current_ast(ast), device) for ast, device in ks] for name, ks in found.items()}  # (older forms)
    names = args.only.split(",") if args.only else list(found)
    kernels = [k for name in names for k in found[name]]
    for _, name in kernels:
        Device[name]  # noqa: B018  (opened before the clock starts)
    profiler = cProfile.Profile() if args.profile else None
    start, cpu = time.perf_counter(), time.process_time()
    if profiler is not None:
        profiler.enable()
    sources = render_all(kernels)
    if profiler is not None:
        profiler.disable()
    took, cpu = time.perf_counter() - start, time.process_time() - cpu
    print(f"{len(kernels)} kernels of {','.join(names)} rendered in {took:.2f} s ({cpu:.2f} s of CPU time)")
    if profiler is not None:
        for order in ("tottime", "cumulative"):
            pstats.Stats(profiler).sort_stats(order).print_stats(args.profile)
    if args.hashes:
        digests = [hashlib.sha256(s.encode()).hexdigest() for s in sources]
        with open(args.hashes, "w") as f:
            json.dump(digests, f, indent=0)


if __name__ == "__main__":
    main()
