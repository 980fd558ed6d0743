"""The UOp node: hash-consing, immutability, graph walks, printing, substitution, value bounds, pickling."""

from __future__ import annotations

import gc
import math
import pickle
import struct

import pytest

from tiny.ir.alu import exec_alu
from tiny.ir.dtypes import dtypes
from tiny.ir.uop import GroupOp, Ops, UOp, pretty, substitute
from tiny.ir.views import View

i32, f32 = dtypes.int32, dtypes.float32


def var(name: str, lo: int, hi: int) -> UOp:
    return UOp(Ops.DEFINE_VAR, i32, (), (name, lo, hi))


# ---------------------------------------------------------------- hash-consing


def test_structurally_equal_nodes_are_one_object() -> None:
    x = var("x", 0, 10)
    assert var("x", 0, 10) is x
    assert (x * 2 + 1) is (x * 2 + 1)
    assert UOp(Ops.SINK, src=(x, x)) is UOp(Ops.SINK, dtypes.void, (x, x), None)
    assert UOp.const(f32, 1.5) is UOp(Ops.CONST, f32, (), 1.5)
    assert hash(x * 2) == hash(x * 2) and x * 2 == x * 2


def test_nodes_that_differ_anywhere_are_distinct() -> None:
    x, y = var("x", 0, 10), var("y", 0, 10)
    assert var("x", 0, 11) is not x
    assert x + y is not y + x  # no canonical order: that is symbolic's job
    assert UOp(Ops.CONST, i32, (), 1) is not UOp(Ops.CONST, dtypes.int64, (), 1)
    assert UOp(Ops.SINK, src=(x,)) is not UOp(Ops.SINK, src=(y,))
    assert x * 2 != x * 3


def test_hash_consing_tells_apart_what_equality_confuses() -> None:
    assert UOp(Ops.CONST, f32, (), 0.0) is not UOp(Ops.CONST, f32, (), -0.0)
    one_int, one_bool, one_float = (UOp(Ops.CONST, i32, (), v) for v in (1, True, 1.0))
    assert len({id(one_int), id(one_bool), id(one_float)}) == 3
    assert type(one_int.arg) is int and type(one_bool.arg) is bool and type(one_float.arg) is float
    # ... also inside tuple args
    assert UOp(Ops.SPECIAL, i32, (), ("gidx0", 1)) is not UOp(Ops.SPECIAL, i32, (), ("gidx0", True))
    assert UOp(Ops.DEFINE_VAR, i32, (), ("v", 0.0, 1)) is not UOp(Ops.DEFINE_VAR, i32, (), ("v", -0.0, 1))
    # a tuple of plain ints (its own key) is not a tuple of what equals them: bools, floats, int-likes (NumPy's)
    shapes = [(2, 3), (True, 3), (2.0, 3), (_IntLike(2), 3), (_IntLike(2), _IntLike(3)), ((2, 3),), ((_IntLike(2), 3),)]
    nodes = [UOp(Ops.RESHAPE, f32, (), s) for s in shapes]
    assert len({id(n) for n in nodes}) == len(shapes)


class _IntLike:
    """Equal to an int and hashed as one, but not an int (as NumPy's integers are)."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return other == self.value

    def __hash__(self) -> int:
        return hash(self.value)


def test_nan_constants_are_one_node() -> None:
    assert UOp.const(f32, math.nan) is UOp.const(f32, math.nan)
    assert math.isnan(UOp.const(f32, math.nan).arg)


def test_const_truncates_to_its_dtype() -> None:
    assert UOp.const(dtypes.int8, 200).arg == -56
    assert UOp.const(dtypes.uint8, -1) is UOp.const(dtypes.uint8, 255)
    assert UOp.const(f32, 0.1).arg == struct_f32(0.1)
    assert UOp.const(dtypes.bool, 3).arg is True
    assert UOp.const(i32, 2.7).arg == 2


def struct_f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def test_unused_nodes_are_collected() -> None:
    gc.collect()  # (garbage of earlier tests freed now, not while this one counts)
    before = len(UOp._cache)
    nodes = [var(f"tmp{i}", 0, i) for i in range(1000)]
    assert len(UOp._cache) >= before + 1000
    del nodes
    gc.collect()
    assert len(UOp._cache) < before + 1000


def test_view_args_hash_cons() -> None:
    a = UOp(Ops.VIEW, arg=View.create((2, 3)))
    assert UOp(Ops.VIEW, arg=View.create((2, 3))) is a
    assert UOp(Ops.VIEW, arg=View.create((3, 2))) is not a


# ---------------------------------------------------------------- immutability


def test_immutable() -> None:
    x = var("x", 0, 10)
    for name, value in [("op", Ops.ADD), ("dtype", f32), ("src", ()), ("arg", 3), ("new_field", 1)]:
        with pytest.raises(AttributeError):
            setattr(x, name, value)
    assert x.arg == ("x", 0, 10) and x.op is Ops.DEFINE_VAR


def test_replace_builds_a_new_node_and_keeps_the_old() -> None:
    x = var("x", 0, 10)
    e = x + 1
    f = e.replace(op=Ops.MUL)
    assert f is x * 1 and e.op is Ops.ADD
    assert e.replace() is e
    assert e.replace(dtype=dtypes.int64).dtype == dtypes.int64 and e.dtype == i32


# ---------------------------------------------------------------- constructors and named slots


def test_operators_build_the_expected_ops() -> None:
    x = var("x", 0, 10)
    assert (x + 1).op is Ops.ADD and (1 + x).src == (UOp.const(i32, 1), x)
    assert (x - 2).op is Ops.ADD and (x - 2).src[1].op is Ops.NEG
    assert (3 - x).src[0] is UOp.const(i32, 3)
    assert (x // 2).op is Ops.IDIV and (x % 2).op is Ops.MOD and (x << 1).op is Ops.SHL and (x >> 1).op is Ops.SHR
    assert (x & 1).op is Ops.AND and (x | 1).op is Ops.OR and (x ^ 1).op is Ops.XOR
    assert x.lt(3).dtype == dtypes.bool and x.ne(3).op is Ops.CMPNE
    assert x.maximum(3).op is Ops.MAX
    w = x.lt(3).where(x, 0)
    assert w.op is Ops.WHERE and w.dtype == i32 and w.src[2] is UOp.const(i32, 0)
    assert x.lt(3).where(1.5, UOp.const(f32, 2.0)).dtype == f32
    with pytest.raises(TypeError):
        x.lt(3).where(1, 2)
    assert x.cast(i32) is x and x.cast(f32).op is Ops.CAST and x.bitcast(f32).op is Ops.BITCAST
    vec = UOp(Ops.VECTORIZE, i32.vec(4), (x, x, x, x))
    assert vec.lt(vec).dtype == dtypes.bool.vec(4)


def test_named_slots() -> None:
    buf = UOp(Ops.DEFINE_GLOBAL, f32.ptr(8), (), 0)
    r = UOp.range(8, 0)
    gate = r.lt(4)
    idx = UOp(Ops.INDEX, f32.ptr(8), (buf, r, gate))
    load = UOp(Ops.LOAD, f32, (idx, UOp.const(f32, 0.0)))
    store = UOp(Ops.STORE, src=(UOp(Ops.INDEX, f32.ptr(8), (buf, r)), load))
    assert idx.pointer is buf and idx.offset is r and idx.gate is gate
    assert store.address.gate is None and store.value is load
    assert load.address is idx and load.alternative is UOp.const(f32, 0.0)
    assert r.end is UOp.const(i32, 8)
    red = UOp(Ops.REDUCE, f32, (load, r), Ops.ADD)
    assert red.value is load and red.ranges == (r,)
    with pytest.raises(AssertionError):
        _ = load.pointer


def test_group_ops_partition() -> None:
    assert GroupOp.Unary.isdisjoint(GroupOp.Binary) and GroupOp.Binary.isdisjoint(GroupOp.Ternary)
    assert GroupOp.Commutative <= GroupOp.Binary and GroupOp.Comparison <= GroupOp.Binary
    assert GroupOp.ALU.isdisjoint(GroupOp.Movement)


# ---------------------------------------------------------------- toposort


def test_toposort_puts_sources_first_and_each_node_once() -> None:
    x, y = var("x", 0, 10), var("y", 0, 10)
    a = x + y
    b = a * x
    root = UOp(Ops.SINK, src=(b, a, y))
    topo = root.toposort
    assert topo[-1] is root
    assert len(topo) == len(set(topo)) == 5  # root, b, a, x, y
    pos = {u: i for i, u in enumerate(topo)}
    for u in topo:
        assert all(pos[s] < pos[u] for s in u.src)
    # sources are visited in order: x (via b -> a) comes before y
    assert pos[x] < pos[y]


def test_toposort_of_a_deep_chain_does_not_recurse() -> None:
    x = var("x", 0, 10)
    n = x
    for _ in range(20_000):
        n = n + 1
    topo = n.toposort
    assert len(topo) == 20_002 and topo[0] is x and topo[-1] is n


def test_a_dropped_graph_is_freed_without_the_cycle_collector() -> None:
    """A node whose toposort was asked for is freed as soon as nothing holds it: its cached walk holds no
    reference back to it (one that did kept every walked graph, and the buffers it holds, until a collection)."""
    import weakref

    n = var("x", 0, 10)
    for i in range(50):
        n = n * 3 + i
    assert len(n.toposort) > 100 and n.toposort[-1] is n
    gone = weakref.ref(n)
    enabled = gc.isenabled()
    gc.disable()
    try:
        del n
        assert gone() is None
    finally:
        if enabled:
            gc.enable()


def test_toposort_of_a_wide_diamond_lattice_is_linear() -> None:
    # each level uses the previous level twice: 2**60 paths, 121 nodes
    n = var("x", 0, 10)
    for _ in range(60):
        n = (n + 1) * n
    assert len(n.toposort) == 2 + 60 * 2


def test_a_record_below_is_computed_once_a_node_and_a_new_node_walks_only_itself() -> None:
    """record_below keeps a per-node record in each node's dict: the first ask computes it for every node of the
    graph (each after its sources), asking again computes nothing, and a node made over the graph computes its own
    few (a pending tensor's graph grown by one op: not the whole graph again)."""
    from tiny.ir.uop import record_below

    calls: list[UOp] = []

    def depth(u: UOp) -> int:
        calls.append(u)
        return 1 + max((s.__dict__["test.depth"] for s in u.src), default=0)

    x = var("x", 0, 10)
    n = x
    for _ in range(5000):  # (deeper than Python's recursion)
        n = n * 2
    assert record_below(n, "test.depth", depth) == 5001
    assert len(calls) == len(n.toposort)
    calls.clear()
    assert record_below(n, "test.depth", depth) == 5001 and not calls
    m = n + 3  # m and the constant 3 are new
    assert record_below(m, "test.depth", depth) == 5002 and set(calls) == {m, m.src[1]}


# ---------------------------------------------------------------- printing


def test_pretty_prints_ops_dtypes_args_and_shares_nodes() -> None:
    x = var("x", 0, 10)
    e = x * 2 + x
    text = pretty(e)
    assert repr(e) == text
    lines = text.splitlines()
    assert lines[0] == "%0 = Ops.ADD, dtypes.int32, src=("
    assert "%2 = Ops.DEFINE_VAR, dtypes.int32, arg=('x', 0, 10))" in text
    assert "arg=2)" in text
    assert any(line.strip() == "%2" for line in lines)  # x seen the second time prints as its number
    assert pretty(UOp(Ops.SINK)) == "%0 = Ops.SINK)"


def test_pretty_of_a_huge_graph_stays_short() -> None:
    n = var("x", 0, 10)
    for i in range(5000):
        n = n + i
    text = pretty(n)
    assert "..." in text and len(text.splitlines()) < 2000


# ---------------------------------------------------------------- substitute


def test_substitute_rebuilds_above_the_replaced_nodes_only() -> None:
    x, y, z = var("x", 0, 10), var("y", 0, 10), var("z", 0, 10)
    left, right = x * 2, z + 1
    e = UOp(Ops.SINK, src=(left + right, right))
    out = substitute(e, {x: y})
    assert out is UOp(Ops.SINK, src=(y * 2 + right, right))
    assert out.src[1] is right  # untouched parts are the same objects
    assert substitute(e, {}) is e
    assert substitute(e, {var("w", 0, 1): y}) is e
    assert substitute(e, {e: x}) is x


def test_substitute_shares_what_it_rebuilt_across_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """With one `done` for several roots under one mapping (realize moving every live tensor onto new buffers), a
    node below two roots is rebuilt once, and each root comes out as alone."""
    x, y, z = var("x", 0, 10), var("y", 0, 10), var("z", 0, 10)
    shared = (x * 3 + z) * 5
    a, b = UOp(Ops.SINK, src=(shared + 1,)), UOp(Ops.SINK, src=(shared + 2,))
    want = [substitute(r, {x: y}) for r in (a, b)]
    rebuilt: list[UOp] = []
    replace = UOp.replace
    monkeypatch.setattr(UOp, "replace", lambda self, **kw: rebuilt.append(self) or replace(self, **kw))
    done: dict[UOp, UOp] = {}
    assert [substitute(r, {x: y}, done) for r in (a, b)] == want
    assert rebuilt.count(shared) == 1 and len(rebuilt) == len(set(rebuilt))


def test_substitute_does_not_look_inside_replacements() -> None:
    x, y = var("x", 0, 10), var("y", 0, 10)
    assert substitute(x + 1, {x: x + y, y: x}) is (x + y) + 1


# ---------------------------------------------------------------- bounds


def test_bounds_of_leaves() -> None:
    r = UOp.range(8, 0)
    assert (r.vmin, r.vmax) == (0, 7)
    assert UOp.range(var("n", 1, 5), 1).vmin_vmax == (0, 4)
    assert UOp(Ops.SPECIAL, i32, (), ("gidx0", 32)).vmin_vmax == (0, 31)
    assert var("x", -3, 9).vmin_vmax == (-3, 9)
    assert UOp.const(i32, 5).vmin_vmax == (5, 5)
    assert UOp.const(dtypes.bool, True).vmin_vmax == (True, True)
    assert UOp.const(f32, 1.0).vmin_vmax == (-math.inf, math.inf)  # floats: the dtype's range
    assert UOp(Ops.DEFINE_GLOBAL, f32.ptr(4), (), 0).vmin_vmax == (-math.inf, math.inf)
    assert UOp(Ops.LOAD, dtypes.uint8, (UOp(Ops.DEFINE_GLOBAL, dtypes.uint8.ptr(4), (), 0),)).vmin_vmax == (0, 255)


def test_bounds_of_alu() -> None:
    r = UOp.range(8, 0)  # 0..7
    x = var("x", -3, 9)
    assert (r * 4 + 3).vmin_vmax == (3, 31)
    assert (r * -2).vmin_vmax == (-14, 0)
    assert (x * x).vmin_vmax == (-27, 81)
    assert (r - 10).vmin_vmax == (-10, -3)
    assert (-x).vmin_vmax == (-9, 3)
    assert (r // 3).vmin_vmax == (0, 2)
    assert (r % 3).vmin_vmax == (0, 2)
    assert (r % 100).vmin_vmax == (0, 7)
    assert (x % 4).vmin_vmax[0] >= -3 and (x % 4).vmin_vmax[1] <= 3
    assert r.maximum(3).vmin_vmax == (3, 7)
    assert r.lt(8).vmin_vmax == (True, True) and r.lt(0).vmin_vmax == (False, False)
    assert r.lt(3).vmin_vmax == (False, True)
    assert r.ne(9).vmin_vmax == (True, True)
    assert (r & 3).vmin_vmax == (0, 3)
    assert r.lt(3).where(r, x).vmin_vmax == (-3, 9)
    assert r.cast(dtypes.int8).vmin_vmax == (0, 7)


def test_bounds_fall_back_to_the_dtype_where_they_could_wrap() -> None:
    x = var("x", 0, 10)
    assert (x * UOp.const(i32, 2**30)).vmin_vmax == (i32.min, i32.max)
    assert (x * 100).cast(dtypes.int8).vmin_vmax == (-128, 127)
    assert (x << 2).vmin_vmax == (i32.min, i32.max)


def test_bounds_are_sound_on_samples() -> None:
    """Every value an expression takes over its variables' ranges lies inside its bounds."""
    x, y = var("x", -4, 5), var("y", 1, 6)
    exprs = [x * y + 3, (x + 7) // y, (x + 4) % y, x % y, (-x).maximum(y), x.lt(y).where(x * 2, y - 9), x * x - y]
    for e in exprs:
        lo, hi = e.vmin_vmax
        for xv in range(-4, 6):
            for yv in range(1, 7):
                env = {x: xv, y: yv}
                for u in e.toposort:
                    if u not in env:
                        env[u] = u.arg if u.op is Ops.CONST else exec_alu(u.op, u.dtype, tuple(env[s] for s in u.src))
                assert lo <= env[e] <= hi, (e, xv, yv)


def test_bounds_of_a_deep_chain_do_not_recurse() -> None:
    x = var("x", 0, 1)
    n = x
    for _ in range(20_000):
        n = n + x
    assert n.vmin_vmax == (0, 20_001)


# ---------------------------------------------------------------- pickling


def test_pickle_round_trip_gives_the_same_node() -> None:
    x = var("x", 0, 10)
    e = UOp(Ops.SINK, src=((x * 2 + 1).cast(f32) / UOp.const(f32, -0.0), UOp(Ops.VIEW, arg=View.create((2, 3)))))
    assert pickle.loads(pickle.dumps(e)) is e
    ptr = UOp(Ops.DEFINE_GLOBAL, dtypes.half.ptr(8, local=True), (), 1)
    assert pickle.loads(pickle.dumps(ptr)) is ptr
    c = pickle.loads(pickle.dumps(UOp.const(f32, -0.0)))
    assert math.copysign(1.0, c.arg) == -1.0


def test_pickle_a_deep_graph() -> None:
    n = var("x", 0, 10)
    for i in range(5000):
        n = n + i
    try:
        data = pickle.dumps(n)
    except RecursionError:
        pytest.fail("RecursionError", pytrace=False)
    assert pickle.loads(data) is n


def test_a_new_node_over_a_long_chain_finds_its_shape_without_walking_the_chain() -> None:
    """x + c where x's shape is known and c's is not: c's few nodes are walked, not the chain below x (whose walk
    each op of a lazy loop would repeat: quadratic in the chain's length)."""
    device = UOp(Ops.DEVICE, arg="CPU")
    buf = UOp(Ops.BUFFER, dtypes.float32, (device,), (0, 4))
    x = UOp(Ops.RESHAPE, dtypes.float32, (buf,), (4,))
    assert x.shape == (4,)
    chain = [x]
    for i in range(50):
        c = UOp(
            Ops.EXPAND, dtypes.float32, (UOp(Ops.RESHAPE, dtypes.float32, (UOp.const(dtypes.float32, i),), (1,)),), (4,)
        )
        chain.append(chain[-1] + c)
        assert chain[-1].shape == (4,)
    assert not any("_ancestors" in u.__dict__ for u in chain[:-1])  # (the cached walk of toposort)


def test_a_shape_asked_over_a_big_known_graph_walks_only_the_new_nodes() -> None:
    """A node made without its shape (a shrink of a lazy result) under a new op: finding its shape walks it alone,
    not the graph below it whose nodes know theirs (each such op of a model's forward walked the whole graph)."""
    device = UOp(Ops.DEVICE, arg="CPU")
    x = UOp(Ops.RESHAPE, dtypes.float32, (UOp(Ops.BUFFER, dtypes.float32, (device,), (0, 4)),), (4,))
    chain = [x]
    for _ in range(200):
        chain.append(chain[-1] * chain[-1])
        assert chain[-1].shape == (4,)
    part = UOp(Ops.SHRINK, dtypes.float32, (chain[-1],), ((1, 3),))
    flipped = UOp(Ops.FLIP, dtypes.float32, (part,), (True,))
    assert (-flipped).shape == (2,) and part.shape == (2,)
    assert not any("_ancestors" in u.__dict__ for u in [*chain, part, flipped])
