"""The schedule cache: a graph with the structure of one scheduled before takes that schedule, rebound to its own
buffers; any difference in structure is a different key; SCHEDULE_CACHE=2 proves a cached schedule is the one
the scheduler computes.

Buffers live on made-up devices ("FAKE", "OTHER", "FEW"): new_buffer only records them, and nothing here allocates.
"""

from __future__ import annotations

import gc
import math
import random
import weakref
from collections.abc import Callable, Iterator
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

import tiny.ir.schedule.cache as schedule_cache
from tiny.ir.config import Context
from tiny.ir.device import Compiled, Device, RendererCaps, buffer_of, new_buffer
from tiny.ir.dtypes import DType, dtypes
from tiny.ir.schedule import Schedule, create_schedule
from tiny.ir.schedule.cache import SCHEDULES, ScheduleMismatch, Template, structure_of
from tiny.ir.schedule.scheduler import _plan
from tiny.ir.uop import Ops, UOp

f32 = dtypes.float32
DEV = "FAKE"


@pytest.fixture(autouse=True)
def empty_cache() -> Iterator[None]:
    SCHEDULES.clear()
    yield
    SCHEDULES.clear()


def tensor(*shape: int, dtype: DType = f32, device: str = DEV) -> UOp:
    """A realized input: a reshape of a fresh BUFFER."""
    buf = new_buffer(device, math.prod(shape), dtype)
    return UOp(Ops.RESHAPE, dtype, (buf,), tuple(shape))


def move(op: Ops, x: UOp, arg: Any) -> UOp:
    return UOp(op, x.dtype, (x,), arg)


def const(value: Any, shape: tuple[int, ...], dtype: DType = f32, device: str = DEV) -> UOp:
    c = UOp(Ops.CONST, dtype, (UOp(Ops.DEVICE, arg=device),), value)
    return move(Ops.EXPAND, move(Ops.RESHAPE, c, (1,) * len(shape)), shape)


def add(a: UOp, b: UOp) -> UOp:
    return UOp(Ops.ADD, a.dtype, (a, b))


def reduce(x: UOp, axes: tuple[int, ...]) -> UOp:
    return UOp(Ops.REDUCE_AXIS, x.dtype, (x,), (Ops.ADD, axes))


def schedule(*targets: UOp) -> Schedule:
    return create_schedule(list(targets))


def buffers_of(s: Schedule) -> list[tuple[int, ...]]:
    return [tuple(id(b) for b in item.buffers) for item in s.items]


def assert_same_up_to_buffers(a: Schedule, b: Schedule, inputs: dict[int, int]) -> None:
    """a and b are one schedule: the same ASTs (the very objects), a's input buffers where `inputs` maps them in b,
    and each buffer a made matched with one b made, used at the same places."""
    assert [i.ast for i in a.items if i.ast.op is Ops.SINK] == [i.ast for i in b.items if i.ast.op is Ops.SINK]
    made: dict[int, int] = {}
    for x, y in zip(a.items, b.items, strict=True):
        for bx, by in zip(x.buffers, y.buffers, strict=True):
            if id(bx) in inputs:
                assert inputs[id(bx)] == id(by)
            else:
                assert made.setdefault(id(bx), id(by)) == id(by)
                assert (bx.device, bx.size, bx.dtype) == (by.device, by.size, by.dtype)
    assert len(set(made.values())) == len(made)


def pair(build: Callable[[], UOp]) -> tuple[UOp, UOp]:
    """Two graphs of one structure over different buffers (each call of build makes new inputs)."""
    return build(), build()


# ---------------------------------------------------------------- hits


def test_a_graph_of_the_same_structure_takes_the_cached_schedule() -> None:
    def build() -> UOp:
        x, y = tensor(4, 4), tensor(4)
        return add(reduce(add(x, const(1.0, (4, 4))), (1,)), move(Ops.RESHAPE, y, (4, 1)))

    a, b = pair(build)
    first = schedule(a)
    assert (SCHEDULES.hits, SCHEDULES.misses, len(SCHEDULES)) == (0, 1, 1)
    second = schedule(b)
    assert SCHEDULES.hits == 1
    ins = {id(buffer_of(u)): id(buffer_of(v)) for u, v in zip(a.toposort, b.toposort) if u.op is Ops.BUFFER}
    assert_same_up_to_buffers(first, second, ins)
    assert second.items[0].ast is first.items[0].ast  # so the realize engine's program cache hits too
    assert b in second.becomes and a not in second.becomes  # the new graph's node, rebound to a new buffer
    assert second.becomes[b].src[0] is not first.becomes[a].src[0]
    assert buffer_of(second.becomes[b].src[0]) is second.items[-1].buffers[0]


def test_a_cached_schedule_is_the_computed_one_on_many_graphs() -> None:
    """SCHEDULE_CACHE=2 schedules anew and compares: elementwise, reductions, pads, copies, assigns, splits."""
    builders: list[Callable[[], list[UOp]]] = [
        lambda: [add(tensor(8), const(2.0, (8,)))],
        lambda: [reduce(move(Ops.PERMUTE, tensor(4, 6), (1, 0)), (0,))],
        lambda: [move(Ops.PAD, add(tensor(3), tensor(3)), ((1, 2),))],
        lambda: [reduce(tensor(1 << 16), (0,))],  # a big reduction into one output: two kernels
        lambda: [UOp(Ops.COPY, f32, (add(tensor(5), tensor(5)), UOp(Ops.DEVICE, arg="OTHER")))],
        lambda: [_assign(tensor(6), lambda t: add(t, const(1.0, (6,))))],
        lambda: (lambda x: [add(x, x), UOp(Ops.CONTIGUOUS, f32, (x,))])(tensor(7)),
    ]
    with Context(SCHEDULE_CACHE=2):
        for build in builders:
            for _ in range(3):
                schedule(*build())
    assert SCHEDULES.hits == 2 * len(builders)  # each was checked twice against its template
    # both ways instantiate() takes were checked: the short one (kernels, each target a view of one buffer) and the
    # general one (a copy's node, an assign's target, a split reduction's partial sums)
    assert {t._views is None for t in SCHEDULES.templates.values()} == {True, False}


def _assign(target: UOp, value: Callable[[UOp], UOp]) -> UOp:
    return UOp(Ops.ASSIGN, target.dtype, (target, value(target)))


def test_a_split_reductions_partial_buffer_is_rebound() -> None:
    """The partial sums of a split reduction are a node the rewrites made (no tensor holds it): its entry in
    becomes is rebuilt over the new graph's buffers."""
    a, b = pair(lambda: reduce(tensor(1 << 16), (0,)))
    first, second = schedule(a), schedule(b)
    assert SCHEDULES.hits == 1 and len(second.items) == 2
    (partial,) = [k for k in second.becomes if k is not b]
    assert partial.op is Ops.REDUCE_AXIS
    bufs = {u for u in partial.toposort if u.op is Ops.BUFFER}
    assert bufs == {u for u in b.toposort if u.op is Ops.BUFFER}
    assert buffer_of(second.becomes[partial].src[0]) is second.items[0].buffers[0]
    assert [k for k in first.becomes if k is not a][0] is not partial


def test_a_copys_step_is_the_new_graphs_copy() -> None:
    a, b = pair(lambda: UOp(Ops.COPY, f32, (tensor(5), UOp(Ops.DEVICE, arg="OTHER"))))
    schedule(a)
    second = schedule(b)
    assert SCHEDULES.hits == 1
    assert [item.ast for item in second.items] == [b]
    assert second.items[0].buffers[1] is buffer_of(b.source.source)


def test_an_assign_writes_the_new_target() -> None:
    a, b = pair(lambda: _assign(move(Ops.SHRINK, tensor(8), ((2, 6),)), lambda t: add(t, const(1.0, (4,)))))
    schedule(a)
    second = schedule(b)
    assert SCHEDULES.hits == 1
    target = b.src[0].source.source  # ASSIGN(SHRINK(RESHAPE(BUFFER)))
    assert second.items[0].buffers == (buffer_of(target),)
    assert second.becomes[b] is b.src[0]


def test_the_cache_keeps_no_buffer_alive() -> None:
    def build() -> UOp:
        return UOp(Ops.COPY, f32, (add(tensor(5), tensor(5)), UOp(Ops.DEVICE, arg="OTHER")))

    graph = build()
    schedule(graph)
    inputs = [weakref.ref(buffer_of(u)) for u in graph.toposort if u.op is Ops.BUFFER]
    del graph
    while gc.collect():  # a node dies a collection after the nodes whose hash-consing keys hold it
        pass
    assert len(SCHEDULES) == 1 and all(r() is None for r in inputs)


# ---------------------------------------------------------------- misses: every difference in structure


def _base() -> UOp:
    return add(tensor(4, 3), const(1.0, (4, 3)))


MISSES: dict[str, Callable[[], UOp]] = {
    "shape": lambda: add(tensor(4, 2), const(1.0, (4, 2))),
    "dtype": lambda: add(tensor(4, 3, dtype=dtypes.float16), const(1.0, (4, 3), dtypes.float16)),
    "device": lambda: add(tensor(4, 3, device="OTHER"), const(1.0, (4, 3), device="OTHER")),
    "a view": lambda: add(move(Ops.PERMUTE, tensor(3, 4), (1, 0)), const(1.0, (4, 3))),
    "a constant": lambda: add(tensor(4, 3), const(2.0, (4, 3))),
    "-0.0 for 0.0": lambda: add(tensor(4, 3), const(-0.0, (4, 3))),
    "an assign": lambda: _assign(tensor(4, 3), lambda t: add(t, const(1.0, (4, 3)))),
    "an unrealized input": lambda: add(add(tensor(4, 3), tensor(4, 3)), const(1.0, (4, 3))),
    "a shrunk bigger buffer": lambda: add(move(Ops.SHRINK, tensor(5, 3), ((0, 4), (0, 3))), const(1.0, (4, 3))),
}


@pytest.mark.parametrize("change", list(MISSES))
def test_a_change_in_structure_misses(change: str) -> None:
    schedule(_base())
    schedule(_base())
    assert SCHEDULES.hits == 1
    schedule(MISSES[change]())
    assert (SCHEDULES.hits, SCHEDULES.misses) == (1, 2)


def test_one_buffer_read_twice_is_not_two_buffers() -> None:
    x = tensor(6)
    schedule(add(tensor(6), tensor(6)))
    once = schedule(add(x, x))
    assert SCHEDULES.misses == 2 and len(once.items[0].buffers) == 2
    again = tensor(6)
    twice = schedule(add(again, again))
    assert SCHEDULES.hits == 1 and twice.items[0].buffers[1] is buffer_of(again.source)


def test_constants_of_other_types_miss() -> None:
    for value, dtype in ((1.0, f32), (1, dtypes.int32), (True, dtypes.bool)):
        schedule(add(tensor(3, dtype=dtype), const(value, (3,), dtype)))
    assert SCHEDULES.misses == 3
    key_float = structure_of([const(1.0, (3,))])
    key_int = structure_of([const(1, (3,))])
    assert key_float is not None and key_int is not None and key_float.key != key_int.key


class _Limited(Compiled):
    """An opened device with limits in its caps, as WebGPU has."""

    def __init__(self, **limits: int) -> None:  # nothing to allocate: the scheduler only reads the renderer's caps
        self.__dict__["renderer"] = SimpleNamespace(caps=RendererCaps(language="FEW", **limits))


def test_opening_a_device_with_limits_misses(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scheduler splits kernels by the caps of an opened device: a graph scheduled before the device opened
    (planned as unlimited) is another key once it is open."""

    def wide() -> UOp:
        total = tensor(8, device="FEW")
        for _ in range(6):
            total = add(total, tensor(8, device="FEW"))
        return total

    assert len(schedule(wide()).items) == 1
    monkeypatch.setitem(Device._open, "FEW", _Limited(max_buffers=4))
    split = schedule(wide())
    assert SCHEDULES.hits == 0 and len(split.items) > 1 and all(len(i.buffers) <= 4 for i in split.items)
    again = schedule(wide())
    assert SCHEDULES.hits == 1 and len(again.items) == len(split.items)


def test_a_device_that_only_holds_data_bypasses_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scheduler makes views of such a device's buffers (new BUFFER nodes sharing memory): no template says that."""
    monkeypatch.setattr(schedule_cache, "device_computes", lambda name: name != "DATA")
    assert structure_of([tensor(4, device="DATA")]) is None
    assert structure_of([UOp(Ops.COPY, f32, (tensor(4, device="DATA"), UOp(Ops.DEVICE, arg=DEV)))]) is None
    assert structure_of([tensor(4)]) is not None


def test_the_cache_can_be_turned_off() -> None:
    with Context(SCHEDULE_CACHE=0):
        schedule(_base())
        schedule(_base())
    assert (SCHEDULES.hits, SCHEDULES.misses, len(SCHEDULES)) == (0, 0, 0)


def test_the_cache_keeps_the_most_recently_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SCHEDULES, "capacity", 2)
    for n in (2, 3, 2, 4):  # 3 is the least recently used when 4 comes
        schedule(add(tensor(n), tensor(n)))
    schedule(add(tensor(2), tensor(2)))
    assert SCHEDULES.hits == 2
    schedule(add(tensor(3), tensor(3)))
    assert SCHEDULES.hits == 2


# ---------------------------------------------------------------- templates


def test_a_template_instantiated_for_its_own_graph_is_the_plan() -> None:
    x = tensor(4, 4)
    targets = [reduce(x, (1,)), UOp(Ops.COPY, f32, (move(Ops.PERMUTE, x, (1, 0)), UOp(Ops.DEVICE, arg="OTHER")))]
    graph = structure_of(targets)
    assert graph is not None
    plan = _plan(targets)
    template = Template.record(plan, graph)
    assert template is not None
    again = template.instantiate(graph)
    assert [item.ast for item in again.items] == [item.ast for item in plan.items]
    made = {buffer_of(a): buffer_of(b) for a, b in zip(plan.fresh, again.fresh)}
    assert len(again.fresh) == len(plan.fresh) and not set(again.fresh) & set(plan.fresh)
    for mine, theirs in zip(plan.items, again.items):
        assert tuple(made.get(b, b) for b in mine.buffers) == theirs.buffers
    assert list(again.becomes) == list(plan.becomes)
    assert Template.record(again, graph) == template


def test_a_plan_with_a_buffer_it_did_not_make_is_not_recorded() -> None:
    targets = [add(tensor(4), tensor(4))]
    graph = structure_of(targets)
    assert graph is not None
    plan = _plan(targets)
    assert Template.record(plan._replace(fresh=()), graph) is None  # its output would be taken for an old buffer


def test_check_mode_finds_a_wrong_template() -> None:
    a, b = pair(lambda: add(tensor(4), tensor(4)))
    schedule(a)
    ((key, template),) = SCHEDULES.templates.items()
    (ast, slots), *rest = template.steps
    SCHEDULES.put(key, replace(template, steps=((ast, (slots[0], slots[2], slots[1])), *rest)))  # inputs swapped
    with Context(SCHEDULE_CACHE=2), pytest.raises(ScheduleMismatch, match="different schedule"):
        schedule(b)


# ---------------------------------------------------------------- keys put together node by node


def _random_program(rng: random.Random, inputs: int, ops: int) -> list[tuple[str, int, int]]:
    """A random elementwise graph over `inputs` input slots: (kind, operand, operand) for each node, operands naming
    an input slot (0 .. inputs-1) or an earlier node (inputs + its index)."""
    program = []
    for i in range(ops):
        pool = inputs + i
        kind = rng.choice(["add", "mul", "neg", "const", "permute"])
        program.append((kind, rng.randrange(pool), rng.randrange(pool)))
    return program


def _build(program: list[tuple[str, int, int]], inputs: list[UOp]) -> UOp:
    nodes = list(inputs)
    for kind, a, b in program:
        x, y = nodes[a], nodes[b]
        if kind == "add":
            nodes.append(add(x, y))
        elif kind == "mul":
            nodes.append(UOp(Ops.MUL, f32, (x, y)))
        elif kind == "neg":
            nodes.append(UOp(Ops.NEG, f32, (x,)))
        elif kind == "const":
            nodes.append(add(x, const(float(b % 3), (4, 4))))
        else:
            nodes.append(move(Ops.PERMUTE, x, (1, 0)))
    return UOp(Ops.SINK, src=tuple(nodes[len(inputs) :]))  # every node a target's source: none left out


def _walked(targets: list[UOp]) -> tuple | None:
    return schedule_cache._walk(targets)[0]


def _composed(targets: list[UOp]) -> Any:
    graph = structure_of(targets)
    assert graph is not None and isinstance(graph.key, tuple)  # (small graphs: put together, not walked)
    return graph.key


def test_composed_keys_tell_graphs_apart_as_a_walk_does() -> None:
    """On random graphs over random choices of buffers (some read twice): two graphs have the same key put together
    from their nodes' shapes exactly when a walk of each finds the same structure."""
    rng = random.Random(5)
    for _ in range(60):
        program = _random_program(rng, 3, rng.randrange(1, 12))
        pool = [tensor(4, 4) for _ in range(3)]
        graphs = []
        for _ in range(4):  # the same program over inputs drawn from the pool: some share buffers, some do not
            inputs = [rng.choice(pool) if rng.random() < 0.5 else tensor(4, 4) for _ in range(3)]
            graphs.append(_build(program, inputs).src)
        graphs.append(_build(_random_program(rng, 3, rng.randrange(1, 12)), [tensor(4, 4) for _ in range(3)]).src)
        for a in graphs:
            for b in graphs:
                assert (_composed(list(a)) == _composed(list(b))) == (_walked(list(a)) == _walked(list(b)))


def test_a_composed_key_does_not_depend_on_which_nodes_knew_their_shape() -> None:
    """Shapes computed for part of a graph first (an earlier realize of a subgraph) give the key that computing them
    all at once gives."""
    rng = random.Random(7)
    for _ in range(20):
        program = _random_program(rng, 2, 10)
        a = _build(program, [tensor(4, 4), tensor(4, 4)]).src
        b = _build(program, [tensor(4, 4), tensor(4, 4)]).src
        for part in rng.sample(list(b), 3):
            _composed([part])  # some of b's nodes know their shapes now, none of a's did before its key
        assert _composed(list(a)) == _composed(list(b))


def test_reads_of_one_buffer_and_of_two_have_other_composed_keys() -> None:
    x, y, z = tensor(4), tensor(4), tensor(4)
    assert _composed([add(x, x)]) != _composed([add(x, y)])
    assert _composed([add(x, y)]) == _composed([add(y, z)]) == _composed([add(z, x)])
    assert _composed([add(add(x, y), add(y, x))]) != _composed([add(add(x, y), add(x, y))])
    assert _composed([add(x, y), add(y, x)]) != _composed([add(x, y), add(x, y)])
    assert _composed([add(x, y), add(y, z)]) != _composed([add(x, y), add(x, z)])


def test_a_graph_with_many_new_nodes_is_walked_and_still_hits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schedule_cache, "NEW_NODES_LIMIT", 8)

    def chain() -> UOp:
        x = tensor(4)
        for _ in range(20):
            x = add(x, const(1.0, (4,)))
        return x

    graph = structure_of([chain()])
    assert graph is not None and isinstance(graph.key, schedule_cache.StructureKey)
    schedule(chain())
    schedule(chain())
    assert (SCHEDULES.hits, SCHEDULES.misses) == (1, 1)


def test_a_realized_view_knows_its_shape_and_the_next_op_keys_from_it() -> None:
    """The view a cached schedule makes for its output comes with its shape filled in: an op over it is one new
    node (no walk below it)."""
    schedule(add(tensor(4), const(1.0, (4,))))
    out = schedule(add(tensor(4), const(1.0, (4,))))
    assert SCHEDULES.hits == 1
    (view,) = out.becomes.values()
    assert schedule_cache._SHAPE in view.__dict__ and view.__dict__["shape"] == (4,)
    assert schedule_cache._new_nodes([add(view, const(1.0, (4,)))]) == [add(view, const(1.0, (4,)))]
