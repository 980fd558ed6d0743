"""UPat matching, PatternMatcher rule order and ctx, and graph_rewrite to a fixed point."""

from __future__ import annotations

from typing import Any

from tiny.ir.dtypes import dtypes
from tiny.ir.pattern import PatternMatcher, UPat, graph_rewrite
from tiny.ir.uop import Ops, UOp

i32, f32 = dtypes.int32, dtypes.float32


def var(name: str, dtype: Any = i32) -> UOp:
    return UOp(Ops.DEFINE_VAR, dtype, (), (name, 0, 10))


X, Y = var("x"), var("y")
ONE = UOp.const(i32, 1)


def matches(pat: UPat, u: UOp) -> list[dict[str, UOp]]:
    return pat.match(u, {})


# ---------------------------------------------------------------- UPat


def test_op_and_dtype_filters() -> None:
    assert matches(UPat(Ops.ADD), X + 1) == [{}]
    assert matches(UPat(Ops.MUL), X + 1) == []
    assert matches(UPat({Ops.ADD, Ops.MUL}), X * 2) == [{}]
    assert matches(UPat(), X) == [{}]  # no op: anything
    assert matches(UPat(dtype=i32), X) and not matches(UPat(dtype=f32), X)
    assert matches(UPat(dtype=(f32, i32)), X)
    vec = UOp(Ops.VECTORIZE, i32.vec(2), (X, X))
    assert matches(UPat(dtype=i32), vec)  # a scalar dtype matches vectors of it
    assert not matches(UPat(dtype=i32.vec(4)), vec)


def test_names_bind_the_matched_nodes() -> None:
    pat = UPat(Ops.ADD, src=(UPat.var("a"), UPat.cvar("c")), name="root")
    e = X + 1
    assert matches(pat, e) == [{"root": e, "a": X, "c": ONE}]


def test_ordered_sources() -> None:
    pat = UPat(Ops.ADD, src=(UPat.var("a"), UPat.cvar("c")))
    assert matches(pat, X + 1)
    assert not matches(pat, 1 + X)
    assert not matches(pat, UOp(Ops.ADD, i32, (X, ONE, ONE)))  # wrong number of sources


def test_commutative_sources_match_in_any_order() -> None:
    pat = UPat(Ops.ADD, src=[UPat.var("a"), UPat.cvar("c")])
    assert matches(pat, X + 1) == [{"a": X, "c": ONE}]
    assert matches(pat, 1 + X) == [{"a": X, "c": ONE}]
    both = matches(pat, UOp.const(i32, 2) + 1)
    assert {"a": UOp.const(i32, 2), "c": ONE} in both and {"a": ONE, "c": UOp.const(i32, 2)} in both


def test_operator_sugar_builds_commutative_patterns_for_commutative_ops() -> None:
    rule = UPat.var("x") + 0
    assert matches(rule, X + 0) == [{"x": X}]
    assert matches(rule, 0 + X) == [{"x": X}]
    div = UPat.var("x") // 1
    assert matches(div, X // 1) == [{"x": X}]
    assert not matches(div, UOp.const(i32, 1) // X)  # IDIV is not commutative
    assert matches(UPat.var("x").lt(UPat.var("y")), X.lt(Y)) == [{"x": X, "y": Y}]
    assert matches(UPat.var("c").where(UPat.var("a"), UPat.var("b")), X.lt(Y).where(X, Y))


def test_a_name_used_twice_must_bind_the_same_node() -> None:
    pat = UPat(Ops.ADD, src=(UPat.var("x"), UPat.var("x")))
    assert matches(pat, X + X) == [{"x": X}]
    assert matches(pat, X + Y) == []
    nested = UPat(Ops.MUL, src=(UPat.var("x") + 1, UPat.var("x")))
    assert matches(nested, (X + 1) * X) and not matches(nested, (X + 1) * Y)


def test_single_upat_src_matches_every_source() -> None:
    pat = UPat(Ops.SINK, src=UPat(Ops.CONST))
    assert matches(pat, UOp(Ops.SINK, src=(ONE, UOp.const(i32, 2), ONE)))
    assert not matches(pat, UOp(Ops.SINK, src=(ONE, X)))
    assert matches(pat, UOp(Ops.SINK))  # vacuously: no sources
    same = UPat(Ops.SINK, src=UPat.var("x"))
    assert matches(same, UOp(Ops.SINK, src=(X, X))) == [{"x": X}]
    assert matches(same, UOp(Ops.SINK, src=(X, Y))) == []


def test_allow_any_len_matches_a_prefix_of_the_sources() -> None:
    pat = UPat(Ops.SINK, src=(UPat.var("first"),), allow_any_len=True)
    assert matches(pat, UOp(Ops.SINK, src=(X, Y, ONE))) == [{"first": X}]
    assert matches(pat, UOp(Ops.SINK, src=(Y,))) == [{"first": Y}]
    assert matches(pat, UOp(Ops.SINK)) == []  # fewer sources than the pattern lists
    strict = UPat(Ops.SINK, src=(UPat.var("first"),))
    assert matches(strict, UOp(Ops.SINK, src=(X, Y))) == []


def test_arg_matching() -> None:
    one = UPat.const(1)
    assert matches(one, ONE)
    assert matches(one, UOp.const(f32, 1.0))  # a const pattern written as 1 matches 1.0 ...
    assert not matches(one, UOp.const(dtypes.bool, True))  # ... but never True
    assert not matches(UPat.const(True), ONE)
    assert matches(UPat.const(True), UOp.const(dtypes.bool, True))
    assert not matches(one, UOp.const(i32, 2))
    assert matches(UPat(Ops.DEFINE_VAR, arg=("x", 0, 10)), X) and not matches(UPat(Ops.DEFINE_VAR, arg=("y", 0, 10)), X)
    assert matches(UPat(Ops.DEFINE_VAR), X)  # no arg: any arg


def test_named_copies_a_pattern_under_a_new_name() -> None:
    pat = UPat(Ops.ADD, dtype=i32, src=(UPat.var("a"), UPat.cvar("c"))).named("sum")
    e = X + 1
    assert matches(pat, e) == [{"sum": e, "a": X, "c": ONE}]
    assert not matches(pat.named("s"), UOp(Ops.ADD, f32, (var("f", f32), UOp.const(f32, 1.0))))


# ---------------------------------------------------------------- PatternMatcher


def test_first_rule_that_returns_a_node_wins() -> None:
    calls: list[str] = []

    def first(x: UOp) -> UOp | None:
        calls.append("first")
        return None  # declines

    def second(root: UOp) -> UOp:
        calls.append("second")
        return root

    def third(x: UOp) -> UOp:
        calls.append("third")
        return Y

    rule = UPat.var("x") + 1
    pm = PatternMatcher([(rule, first), ((UPat() + 1).named("root"), second), (rule, third)])
    assert pm.rewrite(X + 1) is Y
    assert calls == ["first", "second", "third"]  # returning the node itself counts as "no rewrite"
    calls.clear()
    pm2 = PatternMatcher([(rule, third), (rule, first)])
    assert pm2.rewrite(X + 1) is Y and calls == ["third"]
    assert pm.rewrite(X * 2) is None  # no rule for MUL


def test_rules_for_any_op_come_after_the_op_specific_ones() -> None:
    pm = PatternMatcher([(UPat.var("x"), lambda x: ONE if x.op is Ops.ADD else None), (UPat(Ops.ADD), lambda: Y)])
    assert pm.rewrite(X + 2) is Y  # documented: "rules for any op keep their place after the op-specific ones"
    assert pm.rewrite(X * 2) is None


def test_ctx_is_passed_to_rules_that_ask_for_it() -> None:
    seen: list[Any] = []

    def with_ctx(ctx: list[UOp], x: UOp) -> None:
        ctx.append(x)

    def without_ctx(x: UOp) -> None:
        seen.append(x)

    pm = PatternMatcher([(UPat.var("x") * 2, with_ctx), (UPat.var("x") * 2, without_ctx)])
    ctx: list[UOp] = []
    assert pm.rewrite(X * 2, ctx) is None
    assert ctx == [X] and seen == [X]


def test_adding_matchers_keeps_rule_order() -> None:
    a = PatternMatcher([(UPat(Ops.ADD), lambda: X)], name="a")
    b = PatternMatcher([(UPat(Ops.ADD), lambda: Y)], name="b")
    assert (a + b).rewrite(X + 1) is X and (b + a).rewrite(X + 1) is Y
    assert (a + b).name == "a+b"


def _every_rule_in_order(pm: PatternMatcher, u: UOp) -> UOp | None:
    """What PatternMatcher.rewrite means, without its tables: every rule tried in order, by UPat.match."""
    for pat, fn in pm.rules:
        for binding in pat.match(u, {}):
            out = fn(**binding)
            if out is not None and out is not u:
                return out
    return None


def test_rule_tables_choose_as_trying_every_rule_in_order() -> None:
    # rules that only name the node (applied without matching), ones with a dtype (a vector of it counts), sources,
    # an arg, and rules for any op, over nodes of several ops and dtypes, scalars and vectors
    vec = UOp(Ops.VECTORIZE, i32.vec(2), (X, Y))
    fx = var("f", f32)
    rules = [
        (UPat(Ops.ADD, dtype=f32, name="u"), lambda u: u.src[0]),
        (UPat(Ops.MUL, dtype=i32, name="u"), lambda u: None if u.src[0] is X else u.src[0]),
        (UPat(Ops.MUL, name="u"), lambda u: ONE),
        (UPat(Ops.VECTORIZE, dtype=i32), lambda: X),
        (UPat.var("x") + 0, lambda x: x),
        (UPat(Ops.CONST, arg=2, name="c"), lambda c: c.const_like(3)),
        (UPat(dtype=dtypes.bool, name="b"), lambda b: b.src[0] if b.src else None),
        (UPat(name="any"), lambda any: Y if any.op is Ops.NEG else None),
    ]
    pm = PatternMatcher(rules)
    nodes = [X + 0, X + 1, fx + 1.0, X * 2, Y * 2, fx * 2.0, vec, UOp.const(i32, 2), X.lt(Y), -X, -fx, X]
    for u in nodes:
        assert pm.rewrite(u) is _every_rule_in_order(pm, u), u


# ---------------------------------------------------------------- graph_rewrite

identities = PatternMatcher(
    [
        (UPat.var("x") + 0, lambda x: x),  # x+0 -> x
        (UPat.var("x") * 1, lambda x: x),  # x*1 -> x
        (UPat.var("x") * 0, lambda x: x.const_like(0)),  # x*0 -> 0
    ]
)


def test_graph_rewrite_applies_rules_below_and_above() -> None:
    e = ((X * 1) + 0) * 1 + (Y * 0)
    assert graph_rewrite(e, identities) is X
    assert graph_rewrite(X + Y, identities) is X + Y  # nothing applies: the same node back


def test_graph_rewrite_reaches_a_fixed_point_on_the_node_itself() -> None:
    countdown = PatternMatcher([(UPat(Ops.CONST, name="c"), lambda c: c.const_like(c.arg - 1) if c.arg > 0 else None)])
    assert graph_rewrite(UOp.const(i32, 7), countdown) is UOp.const(i32, 0)
    sink = UOp(Ops.SINK, src=(UOp.const(i32, 3), X))
    assert graph_rewrite(sink, countdown) is UOp(Ops.SINK, src=(UOp.const(i32, 0), X))


def test_graph_rewrite_rewrites_what_a_rule_creates() -> None:
    def unroll(x: UOp, c: UOp) -> UOp | None:
        return x + x * (c.arg - 1) if c.arg > 1 else None  # x*c -> x + x*(c-1)

    pm = PatternMatcher([(UPat.var("x") * UPat.cvar("c"), unroll), (UPat.var("x") * 1, lambda x: x)])
    assert graph_rewrite(X * 4, pm) is X + (X + (X + X))


def test_graph_rewrite_visits_a_shared_node_once() -> None:
    visits: list[UOp] = []

    def count(ctx: list[UOp], x: UOp) -> None:
        ctx.append(x)

    shared = X + 1
    root = UOp(Ops.SINK, src=(shared * 2, shared * 3, shared))
    graph_rewrite(root, PatternMatcher([(UPat(Ops.ADD, name="x"), count)]), ctx=visits)
    assert visits == [shared]


def test_graph_rewrite_passes_ctx() -> None:
    def rename(ctx: dict[str, str], v: UOp) -> UOp | None:
        name = ctx.get(v.arg[0])
        return v.replace(arg=(name, *v.arg[1:])) if name else None

    pm = PatternMatcher([(UPat(Ops.DEFINE_VAR, name="v"), rename)])
    assert graph_rewrite(X + Y, pm, ctx={"x": "y"}) is Y + Y


def test_graph_rewrite_a_chain_of_10000_adds() -> None:
    n = X
    for _ in range(10_000):
        n = n + 0
    assert graph_rewrite(n, identities) is X


def test_graph_rewrite_a_chain_of_10000_nodes_that_stays() -> None:
    n = X
    for i in range(10_000):
        n = (n + Y) if i % 2 else (n * 1)
    out = graph_rewrite(n, identities)
    assert len(out.toposort) == 5_000 + 2
    assert out.op is Ops.ADD


def test_graph_rewrite_folds_a_chain_of_10000_constants() -> None:
    def merge(x: UOp, a: UOp, b: UOp) -> UOp:
        return x + (a.arg + b.arg)  # (x+a)+b -> x+(a+b)

    n = X
    for _ in range(10_000):
        n = n + 1
    pm = PatternMatcher([((UPat.var("x") + UPat.cvar("a")) + UPat.cvar("b"), merge)])
    assert graph_rewrite(n, pm) is X + 10_000


def test_graph_rewrite_with_a_memo_of_earlier_rewrites_gives_what_a_fresh_one_does() -> None:
    # a node's result depends on the node alone, so passes may share one memo (codegen keeps one per kernel)
    from_scratch = [graph_rewrite(e, identities) for e in _expressions()]
    memo: dict[UOp, UOp] = {}
    for e in _expressions():
        graph_rewrite(e.src[0], identities, memo=memo)  # a part first, as lowering simplifies gates first
    assert [graph_rewrite(e, identities, memo=memo) for e in _expressions()] == from_scratch


def _expressions() -> list[UOp]:
    return [((X * 1) + 0) * 1 + (Y * 0), (X + Y) * 1 + 0, (X * 0 + Y) * (Y + 0), X + Y]
