"""PROFILE (tiny.ir.profile): a training step's schedules, renders, compiles, kernel launches (TinyJit's replays too)
and copies as spans of a Chrome trace-event JSON that validates against the format; nothing recorded when it is off."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tiny import nn
from tiny.ir import profile
from tiny.ir.config import Context
from tiny.nn.state import get_parameters
from tiny.tensor import GlobalCounters, Tensor, TinyJit, Variable, realize

# the trace-event format (the "Trace Event Format" document Chrome's tracing and Perfetto read): a JSON object whose
# traceEvents is a list of events, each with a one-letter phase `ph`; complete events ("X") carry name, ts and dur in
# microseconds, pid and tid; metadata events ("M") name a process or thread (args.name) or order them
METADATA = {"process_name": "name", "thread_name": "name", "process_sort_index": "sort_index",
            "thread_sort_index": "sort_index"}  # fmt: skip


def validate_trace(trace: Any) -> None:
    assert isinstance(trace, dict) and isinstance(trace.get("traceEvents"), list)
    assert trace.get("displayTimeUnit", "ms") in ("ms", "ns")
    named_threads = set()
    for e in trace["traceEvents"]:
        assert isinstance(e, dict) and isinstance(e.get("ph"), str) and len(e["ph"]) == 1, e
        assert isinstance(e.get("pid"), int) and isinstance(e.get("tid"), int), e
        assert isinstance(e.get("args", {}), dict), e
        if e["ph"] == "M":
            assert e["name"] in METADATA and METADATA[e["name"]] in e["args"], e
            if e["name"] == "thread_name":
                named_threads.add((e["pid"], e["tid"]))
        else:
            assert e["ph"] == "X", e  # (tiny writes complete events only)
            assert isinstance(e["name"], str) and e["name"], e
            for field in ("ts", "dur"):
                assert isinstance(e[field], (int, float)) and math.isfinite(e[field]), e
            assert e["dur"] >= 0, e
            assert (e["pid"], e["tid"]) in named_threads, f"a span on a track no metadata names: {e}"
    json.loads(json.dumps(trace, allow_nan=False))  # (plain JSON: no NaN or infinity)


def tracks(trace: dict) -> dict[int, str]:
    return {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}


@pytest.fixture(autouse=True)
def _fresh() -> Any:
    profile.clear()
    yield
    profile.clear()


class Net:
    """A small convolutional net, shaped (7 channels, 11 pixels) so that no other test built its kernels."""

    def __init__(self, device: str) -> None:
        self.conv = nn.Conv2d(1, 7, 3, device=device)
        self.fc = nn.Linear(7 * 9 * 9, 5, device=device)

    def __call__(self, x: Tensor) -> Tensor:
        return self.fc(self.conv(x).relu().reshape(x.shape[0], -1))


def _step(device: str) -> tuple[Any, Tensor, Tensor]:
    net = Net(device)
    opt = nn.optim.SGD(get_parameters(net), lr=0.01)

    @TinyJit
    def step(x: Tensor, y: Tensor) -> Tensor:
        opt.zero_grad()
        loss = net(x).sparse_categorical_crossentropy(y).backward()
        opt.step()
        return loss.realize()

    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((3, 1, 11, 11)).astype(np.float32), device=device)
    y = Tensor(rng.integers(0, 5, 3).astype(np.int32), device=device)
    return step, x, y


def test_off_records_nothing(device: str) -> None:
    step, x, y = _step(device)
    for _ in range(3):
        step(x, y)
    assert profile.events() == []


def test_a_training_step_shows_its_schedules_compiles_and_kernels(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(realize, "_programs_by_opts", {})  # (every kernel built again, as in a new process)
    with Context(PROFILE="1"):
        step, x, y = _step(device)
        made, before = len(profile.events()), GlobalCounters.time_s
        step(x, y)  # runs and is scheduled, rendered, compiled
        first = profile.events()
        timed = GlobalCounters.time_s - before
        step(x, y)  # captured
        captured = len(profile.events())
        step(x, y)  # replayed by TinyJit: its kernels are spans too
        replay = profile.events()[captured:]
    trace = profile.trace()
    validate_trace(trace)
    names = tracks(trace)
    cats = Counter(e["cat"] for e in first)
    assert cats["schedule"] >= 1 and cats["render"] >= 5 and cats["compile"] >= 1 and cats["kernel"] >= 5, cats
    kernels = [e for e in first if e["cat"] == "kernel"]
    assert {names[e["tid"]] for e in kernels} == {device}
    assert {names[e["tid"]] for e in first if e["cat"] == "render"} == {"codegen"}
    assert all(names[e["tid"]].startswith("compile") for e in first if e["cat"] == "compile")
    rendered = {e["name"] for e in first if e["cat"] == "render"}
    assert {e["name"] for e in kernels} <= rendered  # every kernel that ran was rendered in this process
    # a kernel's span lasts the device's time for it: the step's add up to what the counters measured
    assert sum(e["dur"] for e in first[made:] if e["cat"] == "kernel") / 1e6 == pytest.approx(timed, rel=1e-6)
    assert all("global_size" in e["args"] and "GFLOPS" in e["args"] for e in kernels)
    # the replay: kernels only (nothing scheduled or compiled again), the same programs as the run before
    assert {e["cat"] for e in replay} == {"kernel"}
    ran_before = [e["name"] for e in profile.events()[len(first) : captured] if e["cat"] == "kernel"]
    assert [e["name"] for e in replay] == ran_before
    assert all(a["ts"] + a["dur"] <= b["ts"] + 1 for a, b in zip(replay, replay[1:]))  # one after another


def test_a_copy_between_devices_is_a_span_on_the_device_it_goes_to() -> None:
    with Context(PROFILE="1"):
        x = Tensor(np.arange(6, dtype=np.float32), device="CPU")
        got = (x.to("PYTHON") + 1).numpy()
    np.testing.assert_equal(got, np.arange(6) + 1)
    names = tracks(profile.trace())
    copies = [e for e in profile.events() if e["cat"] == "copy"]
    assert [(e["name"], names[e["tid"]], e["args"]["bytes"]) for e in copies] == [("copy CPU -> PYTHON", "PYTHON", 24)]


def test_a_kernel_over_variables_named_as_a_span_s_fields_keeps_their_values(device: str) -> None:
    """A kernel's Variables are its span's args by name: ones named `start` or `seconds` (a language model's prompt
    chunk at a start position) are args like any other, not the span's own start and length."""
    base = Tensor(np.arange(16, dtype=np.float32), device=device).realize()
    start, seconds = Variable("start", 0, 8).bind(3), Variable("seconds", 0, 8).bind(2)
    with Context(PROFILE="1"):
        got = (base[start : start + 4] + base[seconds : seconds + 4]).numpy()
    np.testing.assert_equal(got, [3 + 2, 4 + 3, 5 + 4, 6 + 5])
    kernels = [e for e in profile.events() if e["cat"] == "kernel"]
    assert any(e["args"].get("start") == 3 and e["args"].get("seconds") == 2 for e in kernels), kernels


SCRIPT = """
from tiny.tensor import Tensor
print((Tensor.arange(12).reshape(3, 4).float().softmax(axis=1) * 3).sum().item())
"""


@pytest.mark.parametrize("where", ["path", "temp"])
def test_the_trace_is_written_at_exit(tmp_path: Path, where: str) -> None:
    out = tmp_path / "trace.json"
    value = str(out) if where == "path" else "1"
    env = os.environ | {"PROFILE": value, "TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    written = out if where == "path" else next(tmp_path.glob("tiny_profile_*.json"))
    assert f"spans written to {written}" in done.stdout
    trace = json.loads(written.read_text())
    validate_trace(trace)
    kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]
    assert kernels and all(tracks(trace)[e["tid"]] == "CPU" for e in kernels)


def test_the_validator_refuses_what_the_format_does_not_allow() -> None:
    """(The validator above is a check that can fail.)"""
    track = {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "CPU"}}
    span = {"name": "k", "cat": "kernel", "ph": "X", "ts": 1.0, "dur": 2.0, "pid": 1, "tid": 1}
    good = {"traceEvents": [track, span]}
    validate_trace(good)
    for bad in ({"dur": -1.0}, {"ts": float("nan")}, {"tid": 2}, {"ph": "XX"}, {"name": ""}):
        event = good["traceEvents"][1] | bad
        with pytest.raises(AssertionError):
            validate_trace({"traceEvents": [good["traceEvents"][0], event]})
