"""A schedule's kernels that are not built yet are built together before the first one runs, their compilers side
by side on every core (tiny.codegen.get_programs): what a cold first training step spends its time on."""

from __future__ import annotations

import numpy as np
import pytest

import tiny.tensor.realize as realize
from tiny.codegen import get_program, get_programs
from tiny.ir.device import Device
from tiny.ir.schedule import create_schedule
from tiny.tensor import Tensor


def test_a_schedule_builds_its_new_kernels_in_one_batch(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    batches: list[int] = []

    def recording(kernels: list) -> list:
        batches.append(len(kernels))
        return get_programs(kernels)

    monkeypatch.setattr(realize, "get_programs", recording)
    x = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4) + 0.125, device=device)
    y = (x.sum(axis=0, keepdim=True) * x).max(axis=1) + x.exp().mean()  # several kernels, none built yet
    want = (x.numpy().sum(0, keepdims=True) * x.numpy()).max(1) + np.exp(x.numpy()).mean()
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-5)
    assert batches and batches[0] >= 2, "the kernels went to the compilers together"
    z = (x.sum(axis=0, keepdim=True) * x).max(axis=1) + x.exp().mean()  # the same kernels: built already
    before = len(batches)
    np.testing.assert_allclose(z.numpy(), want, rtol=1e-5)
    assert len(batches) == before


def test_programs_built_together_are_the_ones_built_alone(device: str) -> None:
    x = Tensor(np.ones((8, 8), np.float32), device=device)
    items = [i for i in create_schedule([((x @ x).relu() + x.sum()).uop]).items if i.ast.op.name == "SINK"]
    dev = Device[device]
    together = get_programs([(i.ast, dev) for i in items])
    assert [p.src for p in together] == [get_program(i.ast, dev).src for i in items]
    assert all(p.binary for p in together)


def test_a_kernel_goes_to_its_compiler_as_soon_as_it_is_rendered(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compilers start while later kernels are still rendered (rendering is Python on one core, compiling runs
    beside it): while the last kernel is rendered, the first one's compiler has been called (the last rendering
    waits up to 5 s for it, which built-in-order code would never end early)."""
    import time

    import tiny.codegen as codegen

    x = Tensor(np.ones((8, 8), np.float32), device="CPU")
    items = [i for i in create_schedule([((x @ x).relu() + x.sum()).uop]).items if i.ast.op.name == "SINK"]
    assert len(items) >= 2
    monkeypatch.setattr(codegen, "usable_cores", lambda: 2)
    events: list[str] = []
    render = codegen.render

    def rendering(ast, renderer, actions):  # noqa: ANN001, ANN202
        if ast is items[-1].ast:
            deadline = time.monotonic() + 5
            while "compile" not in events and time.monotonic() < deadline:
                time.sleep(0.01)
            events.append("last render")
        return render(ast, renderer, actions)

    monkeypatch.setattr(codegen, "render", rendering)

    class Logging:
        def __init__(self, dev: object) -> None:
            self.dev = dev

        def compile(self, src: str) -> bytes:
            events.append("compile")
            return self.dev.compile(src)

        def compile_many(self, srcs: list[str]) -> list[bytes]:
            events.append("compile")
            return self.dev.compile_many(srcs)

        def __getattr__(self, name: str) -> object:
            return getattr(self.dev, name)

    programs = get_programs([(i.ast, Logging(Device["CPU"])) for i in items])
    assert [p.src for p in programs] == [get_program(i.ast, Device["CPU"]).src for i in items]
    assert events.index("compile") < events.index("last render"), events


def test_a_process_keeps_a_bounded_number_of_programs(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past KEEP_PROGRAMS the oldest program built goes, and a CPU kernel's library with it (a process that built
    13000 kernels ran out of memory maps); a kernel whose program went is built again when it runs again."""
    monkeypatch.setattr(realize, "KEEP_PROGRAMS", 4)
    monkeypatch.setattr(realize, "_programs_by_opts", {})
    x = Tensor(np.arange(6, dtype=np.float32)).realize()
    for k in range(1, 9):  # eight kernels of different constants: eight programs
        np.testing.assert_allclose((x * (k + 0.5)).numpy(), np.arange(6) * (k + 0.5))
    assert len(realize.programs()) == 4
    np.testing.assert_allclose((x * 1.5).numpy(), np.arange(6) * 1.5)  # the first kernel again
    assert len(realize.programs()) == 4


def test_each_kernels_lowered_graph_goes_once_it_is_rendered(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """get_programs keeps what a program needs (its source and its description), not each rendering's lowered
    graph until the last kernel is compiled: a schedule's new kernels side by side were most of the memory a decode
    step's capture took."""
    import gc
    import weakref

    import tiny.codegen as codegen

    x = Tensor(np.ones((16, 16), np.float32), device=device)
    items = [i for i in create_schedule([((x @ x).relu() + x.sum() * x).uop]).items if i.ast.op.name == "SINK"]
    assert len(items) >= 2
    rendered: list[weakref.ref] = []
    alive_at: list[int] = []
    planned = codegen._planned_render

    def watching(*args: object) -> object:
        gc.collect()
        alive_at.append(sum(r() is not None for r in rendered))
        out = planned(*args)
        rendered.append(weakref.ref(out.kernel.sink))
        return out

    monkeypatch.setattr(codegen, "_planned_render", watching)
    dev = Device[device]
    get_programs([(i.ast, dev) for i in items] * 2)  # (more kernels than compilers: some wait their turn)
    assert alive_at and max(alive_at) == 0
