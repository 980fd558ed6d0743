"""What a workload is, how one side of it is timed, and what a measurement holds.

A workload states its sizes (full and --quick), the work one run does (flops, bytes), the figures it reports
(GFLOPS, GB/s, ms ...), its target, and for each framework a setup function that builds the inputs and returns a
`Prepared`: the function to time, which does the work once and waits until it is done.
"""

from __future__ import annotations

import math
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

FRAMEWORKS = ("tiny", "numpy", "torch", "tinygrad")
REFERENCES = FRAMEWORKS[1:]
# the --gpu suite's columns: tiny against PyTorch, and against "peak", the GPU's copy bandwidth measured in the run
GPU_FRAMEWORKS = ("tiny", "torch", "peak")
MAX_RUNS = 1000  # timed runs of one side at most, however short they are
TURN_SECONDS = 0.25  # timed runs of one side in a row, before the next side's turn

Params = dict[str, Any]


class Unavailable(Exception):
    """A framework cannot run this workload here (a feature it lacks); the cell says n/a with the reason."""


@dataclass(frozen=True)
class Metric:
    """A reported figure. A rate (rate_of names the amount: "flops", "bytes") is amount * factor / seconds and
    higher is better; a time is seconds * factor and lower is better."""

    unit: str
    factor: float
    rate_of: str | None = None

    @property
    def higher_is_better(self) -> bool:
        return self.rate_of is not None

    def figure(self, seconds: float, amounts: dict[str, float]) -> float:
        if self.rate_of is None:
            return seconds * self.factor
        return amounts[self.rate_of] * self.factor / seconds

    def ratio(self, tiny: float, reference: float) -> float:
        """How many times as fast tiny is as the reference (> 1: tiny is faster), whichever way the unit points."""
        return tiny / reference if self.higher_is_better else reference / tiny


GFLOPS = Metric("GFLOPS", 1e-9, "flops")
TFLOPS = Metric("TFLOPS", 1e-12, "flops")
GBS = Metric("GB/s", 1e-9, "bytes")
MS = Metric("ms", 1e3)
US_PER_KERNEL = Metric("us/kernel", 1e6)


@dataclass(frozen=True)
class Target:
    """The issue's goal for a workload: tiny's ratio against a reference at least min_ratio, or (reference None)
    tiny's first figure at most max_figure."""

    text: str
    reference: str | None = None
    min_ratio: float = 0.0
    max_figure: float = math.inf

    def met(self, ratios: dict[str, float], tiny_figure: float | None) -> bool | None:
        """True or False, or None where the figures it needs are missing."""
        if self.reference is not None:
            ratio = ratios.get(self.reference)
            return None if ratio is None else ratio >= self.min_ratio
        return None if tiny_figure is None else tiny_figure <= self.max_figure


@dataclass(frozen=True)
class Prepared:
    """One framework's side of a workload, ready to time: run() does the work once and waits for it. Figures are
    per unit, where one run covers `units` of them (the kernels of one jitted call); note is shown with the row.
    A side whose run does other work than the workload's (the peak bandwidth's copy) states its own amounts."""

    run: Callable[[], object]
    units: int = 1
    note: str = ""
    amounts: dict[str, float] | None = None  # None: the workload's amounts


Setup = Callable[[Params, str], Prepared]  # (sizes, tiny's device) -> the prepared side


@dataclass(frozen=True)
class Workload:
    name: str
    group: str
    what: str
    metrics: tuple[Metric, ...]
    full: Params
    quick: Params
    setups: dict[str, Setup]
    amounts: Callable[[Params], dict[str, float]] = lambda params: {}
    target: Target | None = None
    warmup: int = 1
    reps: int = 5
    quick_reps: int = 2

    def params(self, quick: bool) -> Params:
        return self.quick if quick else self.full

    def size_text(self, quick: bool) -> str:
        return " ".join(f"{k}={v}" for k, v in self.params(quick).items())


@dataclass
class Result:
    """One framework's measurement of one workload. status: ok, error, n/a (the framework cannot run it here),
    not installed, or none (the suite has no implementation for that framework)."""

    status: str
    samples: list[float] = field(default_factory=list)  # seconds per timed run
    warmups: list[float] = field(default_factory=list)  # seconds per warmup run (compilation included)
    units: int = 1
    over_budget: bool = False  # the warmup alone ran past the budget: its time is the one measurement
    note: str = ""
    amounts: dict[str, float] | None = None  # the side's own amounts of work (Prepared.amounts), else None
    error: str = ""  # the exception's type and first line
    traceback: str = ""  # its innermost frames and whole message

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def best(self) -> float:
        """Seconds per unit of the fastest timed run."""
        return min(self.samples) / self.units

    def median(self) -> float:
        ordered = sorted(self.samples)
        mid = len(ordered) // 2
        middle = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
        return middle / self.units


def measure(
    sides: dict[str, Setup], params: Params, device: str, warmup: int, reps: int, budget: float, min_seconds: float
) -> dict[str, Result]:
    """Prepare and warm up each side, then time the sides in turns, so that a machine whose speed drifts over
    seconds (a neighbour's load on a shared host, a throttled core) slows every side alike and the ratios compare
    like with like. A turn is one untimed run (to refill the caches and wake the thread pools that the other sides'
    turns left cold), then timed runs for TURN_SECONDS (at least one); the order reverses every round. Each side
    takes at least `reps` timed runs, more while they add up to less than min_seconds (short workloads get many
    runs, so the minimum escapes a noisy neighbour), none once they add up to the budget. When a side's warmup alone
    exceeds the budget, its last warmup is its one measurement. An exception in one side makes its result an error;
    the others go on."""
    results: dict[str, Result] = {}
    ready: dict[str, Prepared] = {}
    last, rounds = None, 0  # the side that ran last; rounds begun
    for name, setup in sides.items():
        try:
            prepared = setup(params, device)
            result = Result("ok", units=prepared.units, note=prepared.note, amounts=prepared.amounts)
            results[name] = result
            last = name
            if _warm_up(prepared, result, warmup, budget):
                ready[name] = prepared
        except Unavailable as exc:
            results[name] = Result("n/a", note=str(exc))
        except Exception as exc:  # any failure of one side is reported in its cell
            results[name] = _failed(exc)
    spent = dict.fromkeys(ready, 0.0)
    while ready:
        order, rounds = list(ready.items()), rounds + 1
        for name, prepared in order if rounds % 2 else order[::-1]:
            samples, turn = results[name].samples, 0.0
            try:
                if last != name:
                    _timed(prepared.run)
                last = name
                while True:
                    seconds = _timed(prepared.run)
                    samples.append(seconds)
                    spent[name] += seconds
                    turn += seconds
                    wants_more = len(samples) < max(reps, 1) or (spent[name] < min_seconds and len(samples) < MAX_RUNS)
                    if spent[name] > budget or not wants_more:
                        del ready[name]
                        break
                    if turn >= TURN_SECONDS:
                        break
            except Exception as exc:
                results[name] = _failed(exc)
                del ready[name]
    return results


def _warm_up(prepared: Prepared, result: Result, warmup: int, budget: float) -> bool:
    """Run the warmups into result; False (and the last warmup as the one sample) when they exceed the budget."""
    spent = 0.0
    for _ in range(max(warmup, 1)):
        seconds = _timed(prepared.run)
        result.warmups.append(seconds)
        spent += seconds
        if spent > budget:
            result.samples, result.over_budget = [seconds], True
            return False
    return True


def _failed(exc: Exception) -> Result:
    first = (str(exc).strip().splitlines() or [""])[0]
    message = f"{type(exc).__name__}: {first[:300]}"
    return Result("error", error=message, traceback=traceback.format_exc(limit=-10))


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start
