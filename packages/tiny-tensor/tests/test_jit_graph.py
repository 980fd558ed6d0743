"""TinyJit's graph hook (Compiled.graph): a device that offers a graph executor gets the captured kernels once, with
their precomputed arguments, and every replay is one call of it with the new inputs patched in; a device that offers
none (the default) replays kernel by kernel. Runs on the CPU device, with its graph method replaced in the test."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tiny.ir.device import Compiled, Device, GraphLaunch
from tiny.tensor import Tensor
from tiny.tensor.jit import TinyJit


def test_the_default_is_kernel_by_kernel() -> None:
    assert Compiled.graph(Device["CPU"], []) is None
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

        def replay(args: list[tuple[Any, ...]]) -> None:
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
