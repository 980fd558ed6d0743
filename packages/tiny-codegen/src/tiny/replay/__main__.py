"""python -m tiny.replay record OUT -- <pytest args>   |   python -m tiny.replay compare OUT

record: run pytest with every kernel it renders recorded in the folder OUT.
compare: render each recorded kernel again with the tiny that imports now; list the kernels whose source changed,
with a diff. Exit status: 0 all the same, 1 some changed or could not be rendered, 2 no readable recording.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from tiny.ir.device import usable_cores
from tiny.replay import PREFIX, Outcome, RecordingError, compare, load


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tiny.replay",
        description="Process replay: record the kernels a test run renders, then check that this checkout renders "
        "each the same.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="run pytest, recording every kernel it renders into a folder")
    rec.add_argument("out", help="the folder to record into (created)")
    rec.add_argument("--overwrite", action="store_true", help="replace a recording already in OUT")
    rec.add_argument("pytest_args", nargs=argparse.REMAINDER, help="after --: what to pass to pytest")
    cmp = sub.add_parser("compare", help="render the recorded kernels again and list those that changed")
    cmp.add_argument("recording", help="a folder written by `record`")
    cmp.add_argument("--diffs", type=int, default=10, metavar="N", help="print the diffs of the first N (default 10)")
    cmp.add_argument("--jobs", "-j", type=int, default=0, metavar="N", help="processes (default: one per core)")
    args = parser.parse_args(argv)
    if args.command == "record":
        pytest_args = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
        return _record(Path(args.out), pytest_args, args.overwrite)
    return _compare(Path(args.recording), args.diffs, args.jobs or usable_cores())


def _record(out: Path, pytest_args: list[str], overwrite: bool) -> int:
    old = sorted(out.glob(f"{PREFIX}*.pkl")) if out.is_dir() else []
    if old and not overwrite:
        print(f"error: {out} already holds a recording ({len(old)} files); pass --overwrite or another folder",
              file=sys.stderr)  # fmt: skip
        return 2
    for path in old:
        path.unlink()
    out.mkdir(parents=True, exist_ok=True)
    env = os.environ | {"REPLAY_RECORD": str(out.resolve())}
    status = subprocess.call([sys.executable, "-m", "pytest", *pytest_args], env=env)
    try:
        kernels = len(load(out))
    except RecordingError:
        kernels = 0
    print(f"tiny.replay: {kernels} kernels recorded in {out} (pytest exit status {status})")
    if kernels == 0:
        print("error: no kernel was rendered; check the pytest arguments", file=sys.stderr)
        return status or 1
    return 0 if status in (0, 1) else status  # (failing tests still rendered their kernels)


def _compare(folder: Path, diffs: int, jobs: int) -> int:
    try:
        records = load(folder)
    except RecordingError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    outcomes = compare(records, jobs)
    changed = [o for o in outcomes if o.status == "changed"]
    errors = [o for o in outcomes if o.status == "error"]
    print(f"tiny.replay: {len(records)} kernels of {folder} rendered again with this checkout")
    print(f"  {len(outcomes) - len(changed) - len(errors)} the same, {len(changed)} changed, {len(errors)} failed")
    for i, o in enumerate(changed):
        print(f"\nchanged: {_describe(o)}")
        if i < diffs:
            print(o.detail)
    for o in errors:
        print(f"\nfailed: {_describe(o)}\n  {o.detail}")
    return 1 if changed or errors else 0


def _describe(o: Outcome) -> str:
    r = o.record
    actions = "the rules'" if r.opts is None else f"given {len(r.opts)}"
    where = f", test {r.test}" if r.test else ""
    return f"{r.name} ({r.renderer[1]} {r.renderer[2]}".rstrip() + f", actions {actions}{where})"


if __name__ == "__main__":
    sys.exit(main())
