"""What keeps a small op cheap: the registry of live tensors (a list of weak references, pruned as it goes) and the
scalar operands kept by value (x + 1 makes its constant once). Each must keep every behaviour of what it replaced."""

from __future__ import annotations

import gc
import math

import pytest

import tiny.tensor.elementwise as elementwise
from tiny.ir.uop import Ops, UOp
from tiny.tensor import Tensor, dtypes
from tiny.tensor.live import LiveSet


class _Thing:
    pass


def test_a_live_set_holds_its_objects_weakly_in_order() -> None:
    live: LiveSet[_Thing] = LiveSet()
    things = [_Thing() for _ in range(5)]
    for t in things:
        live.add(t)
    assert live.alive() == things and list(live) == things and len(live) == 5
    del things[1], t
    gc.collect()
    assert live.alive() == things and len(live.refs) == 5  # one dead of five: its reference stays for now
    del things[0], things[0]
    gc.collect()
    assert live.alive() == things and len(live.refs) == 2  # three dead: their references went as they were listed


def test_a_live_set_prunes_dead_references_when_it_doubles() -> None:
    live: LiveSet[_Thing] = LiveSet()
    keep = [_Thing() for _ in range(10)]
    for t in keep:
        live.add(t)
    for _ in range(5 * LiveSet.MIN_LIMIT):  # objects that die at once, never listed
        live.add(_Thing())
    assert len(live.refs) <= LiveSet.MIN_LIMIT + 1 and live.alive() == keep


def test_a_live_set_drops_settled_objects_as_it_drops_dead_ones() -> None:
    live: LiveSet[_Thing] = LiveSet(settled=lambda t: getattr(t, "done", False))
    things = [_Thing() for _ in range(4)]
    for t in things:
        live.add(t)
    things[0].done = things[1].done = things[2].done = True  # type: ignore[attr-defined]
    assert live.alive() == things[3:] and len(live.refs) == 1  # three of four settled: their references went


def test_realize_looks_only_through_tensors_with_work_pending() -> None:
    """The tensors realize() updates are those made with work pending; realized ones (a model's parameters) are not
    looked through, and one realized drops out of the list, while a pending reader is still updated."""
    params = [Tensor([float(i)]).realize() for i in range(50)]
    x = Tensor([1.0, 2.0]).realize()
    y = x + 1
    reader = y * 2

    def pending() -> set[int]:  # (by identity: == on tensors is elementwise)
        return {id(t) for t in Tensor._pending.alive()}

    assert {id(y), id(reader)} <= pending() and not {id(x), *map(id, params)} & pending()
    y.realize()
    assert id(y) not in pending() and id(reader) in pending() and y.uop in reader.uop.toposort
    assert reader.tolist() == [4.0, 6.0] and id(reader) not in pending()


def test_realize_moves_every_tensor_of_the_computed_node_onto_its_buffer() -> None:
    x = Tensor([1.0, 2.0]).realize()
    y = x + 1
    same = Tensor(y.uop)  # another tensor of the very node
    reader = y * 2  # a tensor whose graph reads it
    y.realize()
    assert same.uop is y.uop and y.uop.op is Ops.RESHAPE and y.uop.src[0].op is Ops.BUFFER
    assert y.uop in reader.uop.toposort  # reads the buffer now, does not compute y again
    assert reader.tolist() == [4.0, 6.0]


def _scalar_node(t: Tensor) -> UOp:
    return t.uop.src[1]


def test_a_scalar_operand_is_made_once_per_value_dtype_device_and_shape() -> None:
    x = Tensor([1.0, 2.0, 3.0])
    assert _scalar_node(x + 1) is _scalar_node(x + 1) is _scalar_node(x + 1.0)  # (1 and 1.0: x's dtype alike)
    others = [x + 2, x + -0.0, x + 0.0, x.reshape(3, 1) + 1, x.cast(dtypes.float16) + 1]
    nodes = [_scalar_node(x + 1)] + [_scalar_node(t) for t in others]
    assert len({id(n) for n in nodes}) == len(nodes)
    assert (x + -0.0).uop.src[1].toposort[0].op is Ops.DEVICE
    assert math.copysign(1.0, [u for u in (x + -0.0).uop.toposort if u.op is Ops.CONST][0].arg) == -1.0


def test_a_scalar_operand_has_what_the_tensor_path_gave_it() -> None:
    """Kept nodes are those Tensor(value, dtype=...) broadcast to the shape makes: under no_grad too, and for 0-d."""
    for shape in ((), (3,), (2, 3)):
        x = Tensor.ones(*shape) if shape else Tensor(1.0)
        for value in (2, 2.5, True):
            expected = Tensor(value, device=x.device, dtype=x.dtype)._broadcast_to(x.shape).uop
            assert (x + value).uop.src[1] is expected
            with Tensor.no_grad():
                expected = Tensor(value, device=x.device, dtype=x.dtype)._broadcast_to(x.shape).uop
                out = (x + value).uop  # DETACH(ADD(x, operand))
                assert out.op is Ops.DETACH and out.src[0].src[1] is expected


def test_scalar_operands_promote_and_compute_as_before() -> None:
    b = Tensor([True, False])
    i = Tensor([1, 2], dtype=dtypes.int32)
    assert (b + 1).dtype == dtypes.int64 and (b + 1).tolist() == [2, 1]
    assert (i + 1.5).dtype == dtypes.float32 and (i + 1.5).tolist() == [2.5, 3.5]
    assert (i * True).dtype == dtypes.int32 and (1 - i).tolist() == [0, -1]
    assert (2 ** Tensor([1.0, 3.0])).tolist() == [2.0, 8.0]


def test_the_kept_scalar_operands_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(elementwise, "_SCALARS_KEPT", 8)
    x = Tensor([1.0])
    for v in range(40):
        assert (x + v).tolist() == [1.0 + v]
    assert len(elementwise._SCALARS) <= 8
