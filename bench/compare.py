"""Two checkouts' tiny in one run of the CPU suite: is the second one slower?

    python -m bench.compare BEFORE AFTER                     # every workload, full sizes, 2 rounds
    python -m bench.compare /tmp/old . --only matmul,softmax --rounds 3 --json /tmp/compare.json
    python -m bench.compare /tmp/old . --quick --rounds 1    # checks that the comparison runs, no figures

Each checkout runs its own `python -m bench.run --only W` (its bench code, its tiny: bench.checkout puts its sources
and entry points first), one workload at a time, the two checkouts in turns: round r runs workload i on BEFORE then
AFTER when r + i is even, AFTER then BEFORE when odd, so a machine that slows down over the run slows both sides
alike. A workload's figure on each side is the fastest of its rounds' best runs (bench.run's figure: seconds per unit,
from the fastest timed run). PyTorch runs in every one of those processes: its time beside tiny's on the same side
shows how the machine moved between the two sides' turns, and the normalized column divides it out.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.checkout import environment

SIDES = ("before", "after")


def _python(root: Path, env: dict[str, str], code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{root}: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else 'failed'}")
    return done.stdout


def workloads(root: Path, env: dict[str, str], only: str | None) -> list[str]:
    """The names of the CPU workloads of the checkout's bench that --only picks (all of them for None)."""
    code = (
        "import json, tiny.tensor; from bench.workloads import select\n"
        f"print(json.dumps([tiny.tensor.__file__, [w.name for w in select({only!r})]]))"
    )
    where, names = json.loads(_python(root, env, code).splitlines()[-1])
    if not Path(where).resolve().is_relative_to(root / "packages"):
        raise RuntimeError(f"{root}: tiny.tensor imports from {where}, not from the checkout's packages")
    return names


def turns(names: list[str], rounds: int) -> list[tuple[int, str, str]]:
    """(round, workload, side) in the order they run: each workload on both sides before the next one, BEFORE first
    where round + the workload's place is even, AFTER first where odd."""
    return [
        (r, name, side)
        for r in range(rounds)
        for i, name in enumerate(names)
        for side in (SIDES if (r + i) % 2 == 0 else SIDES[::-1])
    ]


def run_one(root: Path, env: dict[str, str], workload: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """One `python -m bench.run --only workload` in the checkout; its tiny and torch sides from the JSON."""
    cmd = [sys.executable, "-m", "bench.run", "--only", workload, "--json", str(out), "--budget", str(args.budget)]
    cmd += ["--quick"] * args.quick + (["--reps", str(args.reps)] if args.reps else [])
    done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    if done.returncode != 0 or not out.exists():
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {side: {"status": "error", "error": " | ".join(tail)} for side in ("tiny", "torch")}
    report = json.loads(out.read_text())
    results = report["workloads"][workload]["results"]
    sides = {
        side: {"status": r["status"], "seconds": r.get("seconds"), "figures": r.get("figures")}
        for side, r in ((s, results.get(s, {"status": "none"})) for s in ("tiny", "torch"))
    }
    return sides | {"commit": report["machine"].get("tiny_commit")}


def _best(runs: list[dict[str, Any]], fw: str) -> float | None:
    times = [r[fw]["seconds"] for r in runs if r[fw]["status"] == "ok" and r[fw]["seconds"]]
    return min(times) if times else None


def summarize(names: list[str], runs: dict[str, dict[str, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """Per workload: each side's best tiny and torch seconds, the after/before time ratio and its normalized form
    ((tiny after / torch after) / (tiny before / torch before)); None where a side did not run."""
    rows = []
    for name in names:
        row: dict[str, Any] = {"workload": name}
        for side in SIDES:
            row[f"tiny_{side}"] = _best(runs[side][name], "tiny")
            row[f"torch_{side}"] = _best(runs[side][name], "torch")
        tb, ta, pb, pa = (row[k] for k in ("tiny_before", "tiny_after", "torch_before", "torch_after"))
        row["after_over_before"] = ta / tb if ta and tb else None
        row["normalized"] = (ta / pa) / (tb / pb) if ta and tb and pa and pb else None
        rows.append(row)
    return rows


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.4g}"


def _x(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.3f}"


def table(rows: list[dict[str, Any]], labels: tuple[str, str]) -> str:
    header = ["workload", f"tiny ms {labels[0]}", f"tiny ms {labels[1]}", "after/before", "torch ms before",
              "torch ms after", "normalized"]  # fmt: skip
    cells = [
        [r["workload"], _ms(r["tiny_before"]), _ms(r["tiny_after"]), _x(r["after_over_before"]),
         _ms(r["torch_before"]), _ms(r["torch_after"]), _x(r["normalized"])]
        for r in rows
    ]  # fmt: skip
    widths = [max(len(c[i]) for c in [header, *cells]) for i in range(len(header))]
    lines = [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        for row in [header, *cells]
    ]
    ratios = [r["after_over_before"] for r in rows if r["after_over_before"]]
    normalized = [r["normalized"] for r in rows if r["normalized"]]
    if ratios:
        summary = f"geometric mean after/before: {_geomean(ratios):.3f} over {len(ratios)} workloads"
        lines.append(summary + (f", normalized {_geomean(normalized):.3f}" if normalized else ""))
    lines.append("after/before: tiny's time after over before (above 1: slower); normalized: the same of tiny's time "
                 "over PyTorch's in the same process")  # fmt: skip
    return "\n".join(lines)


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(map(math.log, xs)) / len(xs))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__.splitlines()[0])
    p.add_argument("before", type=Path, help="the checkout to compare against (e.g. a git worktree of the base)")
    p.add_argument("after", type=Path, help="the checkout under test")
    p.add_argument("--only", metavar="NAME[,NAME]", help="workloads or groups, as bench.run's --only (default: all)")
    p.add_argument("--rounds", type=int, default=2, metavar="N", help="turns of each workload on each side (2)")
    p.add_argument("--quick", action="store_true", help="bench.run --quick: checks the comparison runs, no figures")
    p.add_argument("--budget", type=float, default=120.0, metavar="SECONDS", help="bench.run's --budget (120)")
    p.add_argument("--reps", type=int, metavar="N", help="bench.run's --reps (default: each workload's own)")
    p.add_argument("--json", type=Path, metavar="PATH", help="also write every run's figures and the table as JSON")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")
    roots = {"before": args.before.resolve(), "after": args.after.resolve()}
    with tempfile.TemporaryDirectory(prefix="tiny-bench-compare-") as tmp:
        try:
            envs = {side: environment(root, Path(tmp) / side) for side, root in roots.items()}
            names = {side: workloads(roots[side], envs[side], args.only) for side in SIDES}
        except (RuntimeError, ValueError) as e:
            p.error(str(e))
        common = [n for n in names["after"] if n in names["before"]]
        missing = sorted(set(names["after"]) ^ set(names["before"]))
        if missing:
            print(f"bench.compare: not in both checkouts, left out: {', '.join(missing)}", file=sys.stderr)
        runs: dict[str, dict[str, list]] = {side: {n: [] for n in common} for side in SIDES}
        for r, name, side in turns(common, args.rounds):
            result = run_one(roots[side], envs[side], name, args, Path(tmp) / f"{side}-{r}-{name}.json")
            runs[side][name].append(result)
            shown = _ms(result["tiny"].get("seconds")) if result["tiny"]["status"] == "ok" else result["tiny"]
            print(f"  round {r + 1} {name:<18} {side:<6} tiny {shown} ms", file=sys.stderr, flush=True)
    rows = summarize(common, runs)
    for side in SIDES:
        commits = sorted({str(r.get("commit")) for results in runs[side].values() for r in results})
        print(f"{side + ':':<7} {roots[side]} (tiny {', '.join(commits)})")
    print(table(rows, ("before", "after")))
    if args.quick:
        print("(--quick: small sizes and 1-2 runs; these figures say nothing about speed)")
    if args.json:
        report = {"roots": {k: str(v) for k, v in roots.items()}, "options": vars(args), "runs": runs, "rows": rows}
        args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
