"""Turning measurements into the report: figures, ratios and targets (JSON), the table (text and markdown) and the
header that says which machine and which versions produced them."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from bench.core import FRAMEWORKS, Result, Workload
from bench.frameworks import COMPILER_TARGETS, torch, versions

ROOT = Path(__file__).resolve().parent.parent
CONVENTION = (
    "ratio = how many times as fast tiny is as the reference, from the same run: tiny/reference for rates "
    "(GFLOPS, GB/s), reference/tiny for times (ms, us); > 1 means tiny is faster"
)
STATISTIC = "figures are from the fastest (min) of the timed runs, after a warmup that is not timed"
QUICK = "--quick: small sizes and 1-2 timed runs; the figures say nothing about speed, and targets are not checked"
CELL = {"error": "error", "n/a": "n/a", "not installed": "not installed", "none": "-"}


# ---------------------------------------------------------------- the machine


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "Hardware", "cpu model") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _nvidia_driver() -> str | None:
    """The NVIDIA driver's version as nvidia-smi says it, None where there is no nvidia-smi or it fails."""
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = done.stdout.strip().splitlines()
    return lines[0].strip() if done.returncode == 0 and lines else None


def gpu(torch_device: str) -> dict[str, Any]:
    """The GPU of a --gpu run: its name as PyTorch says it (None where PyTorch's device is not a CUDA GPU), the
    driver's version (nvidia-smi) and the CUDA PyTorch was built with."""
    name = None
    if torch is not None and torch.device(torch_device).type == "cuda" and torch.cuda.is_available():
        name = torch.cuda.get_device_name(torch.device(torch_device))
    cuda = torch.version.cuda if torch is not None else None
    return {"gpu": name, "gpu_driver": _nvidia_driver(), "torch_cuda": cuda, "torch_device": torch_device}


def machine(device: str, torch_device: str | None = None, commit: str | None = None) -> dict[str, Any]:
    """Where and with what the figures were taken; with torch_device (a --gpu run), the GPU too. commit: tiny's
    commit as given (else git's HEAD here, with a note where the checkout has uncommitted changes)."""
    dirty = False
    if commit is None:
        commit = _git("rev-parse", "--short=12", "HEAD")
        dirty = bool(_git("status", "--porcelain", "--untracked-files=no")) if commit else False
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "os": platform.platform(),
        "python": platform.python_version(),
        **versions(),
        "torch_threads": torch.get_num_threads() if torch is not None else None,
        "tiny_commit": (commit + " (with uncommitted changes)" if dirty else commit) if commit else None,
        "tiny_device": device,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        **(gpu(torch_device) if torch_device is not None else {}),
    }


# ---------------------------------------------------------------- figures, ratios, targets


def _side(workload: Workload, result: Result, quick: bool) -> dict[str, Any]:
    """One framework's entry in the JSON: its status and, when it ran, its figures."""
    entry: dict[str, Any] = {"status": result.status}
    if result.ok:
        amounts = result.amounts or workload.amounts(workload.params(quick))
        best, median = max(result.best(), 1e-12), max(result.median(), 1e-12)
        entry["figures"] = {m.unit: m.figure(best, amounts) for m in workload.metrics}
        entry["median_figures"] = {m.unit: m.figure(median, amounts) for m in workload.metrics}
        entry |= {"seconds": best, "median_seconds": median, "units": result.units}
        entry |= {"samples_s": result.samples, "warmup_s": result.warmups, "over_budget": result.over_budget}
    for key in ("note", "error", "traceback"):
        if getattr(result, key):
            entry[key] = getattr(result, key)
    return entry


def workload_entry(workload: Workload, results: dict[str, Result], quick: bool) -> dict[str, Any]:
    """A workload's JSON entry: what it measures, each framework's side (every framework of the suite, tiny first),
    tiny's ratios, and its target (not checked with --quick, whose sizes are not the target's)."""
    sides = {fw: _side(workload, result, quick) for fw, result in results.items()}
    first = workload.metrics[0]
    figure = {fw: side.get("figures", {}).get(first.unit) for fw, side in sides.items()}
    tiny = figure["tiny"]
    ratios, compilers = {}, {}
    for other in list(sides)[1:]:
        if tiny is not None and figure[other] is not None:
            if _is_tiny(other):  # another CPU path (--compiler): its ratio to the tiny column
                compilers[other] = first.ratio(figure[other], tiny)
            else:
                ratios[other] = first.ratio(tiny, figure[other])
    target = workload.target
    return {
        "what": workload.what,
        "group": workload.group,
        "params": workload.params(quick),
        "metrics": [m.unit for m in workload.metrics],
        "results": sides,
        "ratios": ratios,
        **({"compiler_ratios": compilers} if compilers else {}),
        "target": target.text if target else None,
        "target_met": target.met(ratios, tiny) if target and not quick else None,
    }


def build(workloads: list[Workload], results: dict[str, dict[str, Result]], meta: dict[str, Any]) -> dict:
    quick = meta["options"]["quick"]
    return meta | {"workloads": {w.name: workload_entry(w, results[w.name], quick) for w in workloads}}


# ---------------------------------------------------------------- the table


def _number(x: float) -> str:
    if x >= 1000:
        return f"{x:,.0f}"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    if x >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}"


def _ratio(r: float) -> str:
    return f"{r:.2f}x" if r >= 0.1 else f"{r:.2g}x"  # two significant digits where 0.00x would hide them


def _size(params: dict[str, Any]) -> str:
    def short(v: Any) -> str:
        if isinstance(v, int) and v >= 2**20 and v % 2**20 == 0:
            return f"{v // 2**20}M"
        if isinstance(v, int) and v >= 2**16 and v % 2**10 == 0:
            return f"{v // 2**10}K"
        return str(v)

    return " ".join(f"{k}={short(v)}" for k, v in params.items())


def _cell(side: dict[str, Any], unit: str) -> str:
    if side["status"] != "ok":
        return CELL[side["status"]]
    return _number(side["figures"][unit]) + ("*" if side["over_budget"] else "")


def _is_tiny(side: str) -> bool:
    return side == "tiny" or side.startswith("tiny:")


def frameworks(report: dict) -> list[str]:
    """The suite's frameworks, tiny first: every workload's results name all of them."""
    entries = list(report["workloads"].values())
    return list(entries[0]["results"]) if entries else list(FRAMEWORKS)


def header(report: dict) -> list[str]:
    names = frameworks(report)
    refs = [f"vs {r}" for r in names[1:] if not _is_tiny(r)]
    return ["workload", "size", "unit", *names, *refs, *(f"{t} vs tiny" for t in _other_paths(names)), "target", "met?"]


def _other_paths(names: list[str]) -> list[str]:
    """The tiny sides after the first (--compiler): tiny:llvm, tiny:gcc."""
    return [n for n in names[1:] if _is_tiny(n)]


def _right(column: str) -> bool:
    """Figures and ratios are right-aligned."""
    return column not in ("workload", "size", "unit", "target", "met?")


def _met(entry: dict[str, Any], quick: bool) -> str:
    if not entry["target"]:
        return ""
    return "-" if quick else {True: "yes", False: "no", None: "?"}[entry["target_met"]]


def rows(report: dict) -> list[list[str]]:
    """One row per workload and unit: each framework's figure, tiny's ratios, the target and whether it is met."""
    quick = report["options"]["quick"]
    names = frameworks(report)
    out = []
    for name, entry in report["workloads"].items():
        sides, ratios = entry["results"], entry["ratios"]
        for i, unit in enumerate(entry["metrics"]):
            row = [name, _size(entry["params"]), unit, *(_cell(sides[fw], unit) for fw in names)]
            row += [_ratio(ratios[r]) if r in ratios else "-" for r in names[1:] if not _is_tiny(r)]
            paths = entry.get("compiler_ratios", {})
            row += [_ratio(paths[t]) if t in paths else "-" for t in _other_paths(names)]
            row += [entry["target"] or "", _met(entry, quick)] if i == 0 else ["", ""]
            out.append(row)
    return out


def compiler_summary(report: dict) -> list[str]:
    """With --compiler: for each other CPU path, on how many workloads it came within its target of the tiny column
    (LLVM within 10% of clang, gcc within 20%), and its lowest ratio."""
    compilers = report["machine"].get("compilers")
    if not compilers or not compilers.get("tiny", "").startswith("CPU"):
        return []
    out = [f"{side}: {what}" for side, what in compilers.items()]
    for side in _other_paths(frameworks(report)):
        name = side.split(":", 1)[1]
        ratios = {
            w: e["compiler_ratios"][side]
            for w, e in report["workloads"].items()
            if side in e.get("compiler_ratios", {})
        }
        if not ratios or name not in COMPILER_TARGETS:
            continue
        goal = COMPILER_TARGETS[name]
        low = min(ratios, key=ratios.__getitem__)
        met = sum(r >= goal for r in ratios.values())
        lowest = f"{_ratio(ratios[low])} ({low})"
        out.append(f"{side} vs tiny: at least {goal:g}x on {met} of {len(ratios)} workloads; lowest {lowest}")
    return out


def notes(report: dict) -> list[str]:
    """The lines under the table: notes, errors and over-budget measurements, by workload and framework."""
    budget = report["options"]["budget_s"]
    out = compiler_summary(report)
    for name, entry in report["workloads"].items():
        for fw, side in entry["results"].items():
            if side.get("over_budget"):
                out.append(f"{name} / {fw}: * warmup only, it ran past the budget of {budget:g} s (compile included)")
            if "error" in side:
                out.append(f"{name} / {fw}: error: {side['error']}")
            if "note" in side:
                out.append(f"{name} / {fw}: {side['note']}")
    return out


def text(report: dict) -> str:
    head = header(report)
    table = [head, *rows(report)]
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]

    def line(row: list[str]) -> str:
        cells = [c.rjust(w) if _right(h) else c.ljust(w) for c, w, h in zip(row, widths, head)]
        return "  ".join(cells).rstrip()

    rule = "  ".join("-" * w for w in widths)
    body = [line(head), rule, *(line(r) for r in table[1:])]
    quick = [QUICK] if report["options"]["quick"] else []
    return "\n".join([*body, "", CONVENTION + "; " + STATISTIC, *quick, *notes(report)])


def markdown(report: dict) -> str:
    m, opts = report["machine"], report["options"]
    torch_text = f"{m['torch']} ({m['torch_threads']} threads)" if m["torch"] else "not installed"
    tinygrad_text = m["tinygrad"] or "not installed"
    columns = header(report)
    head = [
        "# tiny GPU benchmark results" if "gpu" in m else "# tiny benchmark results",
        "",
        f"Written by `{opts['command']}` on {m['date']}.",
        "",
        *([_gpu_line(m)] if "gpu" in m else []),
        f"- CPU: {m['cpu']}, {m['cores']} cores; {m['os']}",
        f"- Python {m['python']}, NumPy {m['numpy']}, PyTorch {torch_text}, tinygrad {tinygrad_text}",
        f"- tiny: commit {m['tiny_commit'] or 'unknown'}, device {m['tiny_device']}",
        f"- {STATISTIC}; budget {opts['budget_s']:g} s per workload and framework",
        *([f"- {QUICK}"] if opts["quick"] else []),
        f"- {CONVENTION}",
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "|".join("---:" if _right(h) else "---" for h in columns) + "|",
    ]
    body = ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows(report)]
    tail = notes(report)
    return "\n".join([*head, *body, *(["", "Notes:", ""] + [f"- {n}" for n in tail] if tail else []), ""])


def _gpu_line(m: dict[str, Any]) -> str:
    """The markdown header's line for the GPU of a --gpu run."""
    name = m["gpu"] or f"none seen by PyTorch on {m['torch_device']}"
    return (
        f"- GPU: {name}; NVIDIA driver {m['gpu_driver'] or 'unknown (no nvidia-smi)'}; "
        f"PyTorch's CUDA {m['torch_cuda'] or 'none'}, PyTorch on {m['torch_device']}"
    )
