"""`python -m bench.run`: time every workload on tiny and on the references in one run, print the table of figures
and tiny's ratios, and write the JSON (and, with --markdown, the results file).

    python -m bench.run                         # everything, full sizes
    python -m bench.run --quick --only sum,softmax --json /tmp/r.json
    python -m bench.run --markdown bench/RESULTS.md
    python -m bench.run --gpu                   # the GPU suite: tiny on CUDA against PyTorch on cuda
    python -m bench.run --compiler all          # tiny on each CPU path (clang, LLVM, gcc) in the same run
"""

from __future__ import annotations

import argparse
import gc
import json
import shlex
import sys
from pathlib import Path

from bench import report
from bench.core import FRAMEWORKS, GPU_FRAMEWORKS, Result, Setup, Workload, measure
from bench.frameworks import compiler_sides, describe, installed
from bench.gpu import gpu_workloads
from bench.workloads import WORKLOADS, select
from tiny.tensor import Device

DEFAULT_JSON = Path(__file__).resolve().parent / "results.json"
DEFAULT_GPU_JSON = DEFAULT_JSON.with_name("results_gpu.json")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    names = ", ".join(w.name for w in WORKLOADS)
    gpu_names = ", ".join(w.name for w in gpu_workloads())
    p.add_argument("--quick", action="store_true", help="small sizes and 1-2 timed runs (the smoke test's mode)")
    p.add_argument(
        "--only", metavar="NAME[,NAME]", help=f"workloads or groups to run, of: {names} (--gpu: {gpu_names})"
    )
    p.add_argument("--device", metavar="DEV", help="tiny's device (default: the default device; CUDA with --gpu)")
    p.add_argument(
        "--compiler",
        metavar="NAME[,NAME]",
        help="CPU paths to time tiny on, side by side in one run, of clang, llvm, gcc, or all: the first is the tiny "
        "column (the references' ratios are its), each other one's ratio to it is shown (tiny:llvm vs tiny)",
    )
    p.add_argument("--gpu", action="store_true", help="run the GPU suite instead: tiny on --device, PyTorch on a GPU")
    p.add_argument(
        "--torch-device",
        metavar="DEV",
        help="PyTorch's device in the GPU suite (default cuda; cpu runs its code paths without a GPU, for the tests)",
    )
    p.add_argument("--budget", type=float, default=120.0, metavar="SECONDS", help="time per workload and framework")
    p.add_argument("--reps", type=int, metavar="N", help="timed runs per workload (default: each workload's own)")
    p.add_argument(
        "--min-time",
        type=float,
        metavar="SECONDS",
        help="keep timing a short workload until its runs add up to this (default 1, 0 with --quick)",
    )
    p.add_argument(
        "--json",
        type=Path,
        metavar="PATH",
        help="where the JSON goes (default bench/results.json; --gpu: results_gpu.json)",
    )
    p.add_argument("--markdown", type=Path, metavar="PATH", help="also write the table as markdown, with a header")
    p.add_argument(
        "--commit",
        metavar="TEXT",
        help="tiny's commit as the header gives it (default: git's HEAD here; bench/gpu_check.sh passes the commit "
        "its wheels were built from, as the checkout sent to a GPU machine may carry another .git)",
    )
    return p


def run_workload(
    workload: Workload,
    args: argparse.Namespace,
    device: str,
    frameworks: tuple[str, ...] = FRAMEWORKS,
    tiny_sides: dict[str, str] | None = None,
) -> dict[str, Result]:
    """Each framework's side of one workload; a side that fails is an error result, the others still run.
    tiny_sides (--compiler): tiny's sides, side name -> tiny's device; "tiny" is the first."""
    if tiny_sides:
        frameworks = (*tiny_sides, *(fw for fw in frameworks if fw != "tiny"))
    params = workload.params(args.quick)
    reps = args.reps or (workload.quick_reps if args.quick else workload.reps)
    results: dict[str, Result] = {}
    setups = dict(workload.setups)
    if tiny_sides and "tiny" in setups:
        setups |= {side: _on(setups["tiny"], dev) for side, dev in tiny_sides.items()}
    for fw in frameworks:
        if not installed(fw.split(":")[0]):
            results[fw] = Result("not installed")
        elif fw not in setups:
            results[fw] = Result("none")
    sides = {fw: setups[fw] for fw in frameworks if fw not in results}
    results |= measure(sides, params, device, workload.warmup, reps, args.budget, args.min_time)
    for fw in sides:
        result = results[fw]
        shown = f"{result.best():.6f} s" if result.ok else result.status
        print(f"  {workload.name:<20} {fw:<9} {shown}", file=sys.stderr, flush=True)
    gc.collect()  # drop this workload's inputs before the next one makes its own
    return {fw: results[fw] for fw in frameworks}


def _on(setup: Setup, device: str) -> Setup:
    """tiny's setup, on `device` whatever the run's device is."""
    return lambda params, _device: setup(params, device)


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.min_time is None:
        args.min_time = 0.0 if args.quick else 1.0
    if args.torch_device is not None and not args.gpu:
        p.error("--torch-device goes with --gpu (the CPU suite runs PyTorch on the CPU)")
    if args.compiler and (args.gpu or args.device):
        p.error("--compiler picks tiny's CPU devices itself: it goes with neither --gpu nor --device")
    torch_device = (args.torch_device or "cuda") if args.gpu else None
    json_path = args.json or (DEFAULT_GPU_JSON if args.gpu else DEFAULT_JSON)
    try:
        workloads = select(args.only, gpu_workloads(torch_device) if args.gpu else WORKLOADS)
        name = args.device or ("CUDA" if args.gpu else None)
        device = Device.canonicalize(name) if name else Device.DEFAULT
        tiny_sides = compiler_sides(args.compiler) if args.compiler else None
    except Exception as exc:  # an unknown workload, device or compiler name, or a compiler this machine lacks
        p.error(str(exc))
    if tiny_sides:
        device = tiny_sides["tiny"]
    command = shlex.join(["python", "-m", "bench.run", *(sys.argv[1:] if argv is None else argv)])
    options = {"quick": args.quick, "budget_s": args.budget, "min_time_s": args.min_time, "reps": args.reps}
    options["command"] = command
    meta = {"machine": report.machine(device, torch_device, args.commit), "options": options}
    if tiny_sides:
        meta["machine"]["compilers"] = {side: f"{dev}, {describe(dev)}" for side, dev in tiny_sides.items()}
    where = f", PyTorch on {torch_device} ({meta['machine']['gpu'] or 'no GPU'})" if args.gpu else ""
    print(f"bench: {len(workloads)} workload(s), tiny on {device}{where}", file=sys.stderr, flush=True)
    frameworks = GPU_FRAMEWORKS if args.gpu else FRAMEWORKS
    results = {w.name: run_workload(w, args, device, frameworks, tiny_sides) for w in workloads}
    full = report.build(workloads, results, meta)
    print(report.text(full))
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(full, indent=2) + "\n")
    print(f"\nJSON written to {json_path}")
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(report.markdown(full))
        print(f"markdown written to {args.markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
