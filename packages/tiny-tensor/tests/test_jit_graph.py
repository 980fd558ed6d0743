"""TinyJit's graph hook (Compiled.graph): a device that offers a graph executor gets the captured kernels once, with
their precomputed arguments, and every replay is one call of it with the new inputs patched in; a device that offers
none (the default) replays kernel by kernel. Runs on the CPU device, with its graph method replaced in the test."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tiny.ir.device import Compiled, Device, GraphLaunch, launchers_changed
from tiny.runtime import cpu
from tiny.runtime.cpu import CPUGraph
from tiny.tensor import Tensor, Variable, jit
from tiny.tensor.jit import TinyJit


def test_the_default_is_kernel_by_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Compiled.graph(Device["CPU"], []) is None
    monkeypatch.setattr(type(Device["CPU"]), "graph", Compiled.graph)  # (the CPU device has one of its own)
    step = TinyJit(lambda x: (x * 2 + 1).realize())
    for i in range(3):
        out = step(Tensor(np.full(4, i, np.float32), device="CPU"))
    assert next(iter(step.recordings.values())).graph is None
    np.testing.assert_allclose(out.numpy(), np.full(4, 5.0))


def test_a_graph_executor_replays_every_kernel_in_one_call(monkeypatch: pytest.MonkeyPatch) -> None:
    captured: list[list[GraphLaunch]] = []
    replays: list[list[tuple[Any, ...]]] = []

    def graph(self: Compiled, launches: list[GraphLaunch]) -> Any:
        captured.append(launches)

        def replay(args: list[tuple[Any, ...]], values: dict[str, int]) -> None:
            replays.append(args)
            assert len(args) == len(launches)
            for ln, a in zip(launches, args):
                ln.program(*a, global_size=ln.global_size, local_size=ln.local_size, vals=ln.vals)

        return replay

    monkeypatch.setattr(type(Device["CPU"]), "graph", graph)
    w = Tensor(np.arange(4, dtype=np.float32), device="CPU").realize()
    step = TinyJit(lambda x: ((x * w).sum() + x.max()).realize())
    outs, inputs = [], []
    for i in range(4):
        x = np.arange(4, dtype=np.float32) + i
        inputs.append(Tensor(x, device="CPU"))  # kept alive: each call's input has a buffer of its own
        outs.append((step(inputs[-1]).numpy().item(), float((x * np.arange(4)).sum() + x.max())))
    assert len(captured) == 1 and len(captured[0]) >= 1  # captured on the second call
    assert len(replays) == 2  # the third and fourth calls
    assert replays[0] != replays[1]  # each replay got its own input's buffer
    for got, want in outs:
        assert got == pytest.approx(want)


def _decode_like(device: str) -> tuple[TinyJit[Tensor], np.ndarray, np.ndarray]:
    """A jitted step over a growing prefix (a Variable, as a decode step's position) of a cache, with a product big
    enough to be split across threads, a reduction and an elementwise tail: several kernels, one over the Variable."""
    rng = np.random.default_rng(3)
    cache, w = rng.standard_normal((4, 64)).astype(np.float32), rng.standard_normal((512, 1024)).astype(np.float32)
    c, wt = Tensor(cache, device=device).realize(), Tensor(w, device=device).realize()

    @TinyJit
    def step(x: Tensor, m: object) -> Tensor:
        h = (x @ wt).relu()
        return (h[:, :64] * (c[:, :m].sum(1).reshape(1, 4).repeat(1, 16))).sum(1).realize()

    return step, cache, w


def _reference(x: np.ndarray, cache: np.ndarray, w: np.ndarray, m: int) -> np.ndarray:
    return (np.maximum(x @ w, 0)[:, :64] * np.tile(cache[:, :m].sum(1), 16)).sum(1)


def test_the_cpu_replays_a_capture_in_one_call_with_its_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU device's own graph (CPUGraph): a capture whose kernels take a Variable replays by one call into the
    pool in C, with each call's value of the Variable and its new input written into the kernels' arguments; no
    kernel is launched from Python."""
    step, cache, w = _decode_like("CPU")
    n = Variable("n", 1, 64)
    rng = np.random.default_rng(4)
    xs = [rng.standard_normal((2, 512)).astype(np.float32) for _ in range(5)]
    for i, m in enumerate((3, 7)):
        step(Tensor(xs[i], device="CPU"), n.bind(m))
    (rec,) = step.recordings.values()
    assert isinstance(rec.graph, CPUGraph) and rec.variables == ("n",)
    assert any(ln.global_size[0] > 1 for ln in rec.graph.launches)  # (a kernel in parts among them)
    assert any(ln.var_names == ("n",) for ln in rec.graph.launches)
    monkeypatch.setattr(jit, "_replay_launches", lambda *args: pytest.fail("replayed kernel by kernel"))
    inputs = [Tensor(x, device="CPU") for x in xs[2:]]  # (each its own buffer)
    for x, t, m in zip(xs[2:], inputs, (1, 64, 20)):
        np.testing.assert_allclose(step(t, n.bind(m)).numpy(), _reference(x, cache, w, m), rtol=1e-4, atol=1e-3)
    assert step.replays == 3


def test_the_cpu_graph_of_one_device_among_several_runs_on_its_thread() -> None:
    """With CPU devices of two indices open, each device's launches run on a thread of its own (cpu_queue): a graph's
    replay is given to that thread, on a copy of the arguments, so that replays given before the thread ran them keep
    their own inputs and values (each adds its product over a prefix of its own length to a sum kept on the device)."""
    Device["CPU:1"]  # noqa: B018  (opened: from now on launches go to the devices' threads)
    rng = np.random.default_rng(5)
    cache, w = rng.standard_normal((4, 64)).astype(np.float32), rng.standard_normal((512, 1024)).astype(np.float32)
    c, wt = Tensor(cache, device="CPU:1").realize(), Tensor(w, device="CPU:1").realize()
    total = Tensor.zeros(4, device="CPU:1").contiguous().realize()

    @TinyJit
    def step(x: Tensor, m: object) -> Tensor:
        return total.assign(total + (x @ wt).relu()[:, :4].sum(0) * c[:, :m].sum(1)).realize()

    n, lengths = Variable("n", 1, 64), (3, 7, 1, 64, 20, 9)
    xs = [rng.standard_normal((2, 512)).astype(np.float32) for _ in lengths]
    inputs = [Tensor(x, device="CPU:1") for x in xs]
    for t, m in zip(inputs, lengths):  # (the last four replayed, none waited for)
        step(t, n.bind(m))
    assert isinstance(next(iter(step.recordings.values())).graph, CPUGraph)
    want = sum(np.maximum(x @ w, 0)[:, :4].sum(0) * cache[:, :m].sum(1) for x, m in zip(xs, lengths))
    np.testing.assert_allclose(total.numpy(), want, rtol=1e-4, atol=1e-2)


def test_a_cpu_graph_asks_again_where_to_run_when_the_launchers_change(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a CPU graph's replay runs (the pool now, or the device's thread) is found again once LAUNCHERS.epoch has
    moved (a second CPU device opened, a fork): a replay given as before would race the device's thread."""
    step = TinyJit(lambda x: (x * 2 + 1).realize())
    inputs = [Tensor(np.full(4, i, np.float32), device="CPU") for i in range(4)]
    for t in inputs[:3]:
        step(t)
    assert isinstance(next(iter(step.recordings.values())).graph, CPUGraph)
    queue, given = Device["CPU"].queue, []
    real = queue.submit
    monkeypatch.setattr(queue, "submit", lambda work, *args: (given.append(work), real(work, *args))[1])
    monkeypatch.setattr(cpu, "queued", lambda: True)  # (the queue itself still runs what it is given at once)
    launchers_changed()
    np.testing.assert_allclose(step(inputs[3]).numpy(), np.full(4, 7.0))
    assert len(given) == 1  # the replay, given to the device's queue
