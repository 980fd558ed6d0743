"""Pattern matching on UOps and graph rewriting to a fixed point."""

from __future__ import annotations

import functools
import inspect
import itertools
from collections.abc import Callable
from typing import Any

from tiny.ir import viz
from tiny.ir.dtypes import DType
from tiny.ir.uop import GroupOp, Ops, UOp

_ANY = object()  # "match any arg"


class UPat:
    """A pattern over UOps.

    op: an Ops or a set of them (None for any); dtype: a DType or a set of them; src: a tuple matches
    the sources in order, a list matches them in any order, a single UPat matches every source; arg:
    the exact argument; name: bind the matched UOp to this keyword of the rewrite function.
    """

    __slots__ = ("ops", "dtypes", "src", "arg", "name", "allow_any_len")

    def __init__(
        self,
        op: Ops | frozenset[Ops] | set[Ops] | tuple[Ops, ...] | None = None,
        dtype: DType | tuple[DType, ...] | None = None,
        src: tuple[UPat, ...] | list[UPat] | UPat | None = None,
        arg: Any = _ANY,
        name: str | None = None,
        allow_any_len: bool = False,
    ) -> None:
        self.ops: frozenset[Ops] | None = None if op is None else frozenset((op,) if isinstance(op, Ops) else op)
        self.dtypes: frozenset[DType] | None = (
            None if dtype is None else frozenset((dtype,) if isinstance(dtype, DType) else dtype)
        )
        self.src = src
        self.arg = arg
        self.name = name
        self.allow_any_len = allow_any_len

    def __repr__(self) -> str:
        ops = "any" if self.ops is None else "|".join(o.name for o in self.ops)
        return f"UPat({ops}{'' if self.name is None else ' as ' + self.name})"

    # ---- short constructors

    @staticmethod
    def var(name: str | None = None, dtype: DType | tuple[DType, ...] | None = None) -> UPat:
        return UPat(dtype=dtype, name=name)

    @staticmethod
    def cvar(name: str | None = None, dtype: DType | tuple[DType, ...] | None = None) -> UPat:
        return UPat(Ops.CONST, dtype=dtype, name=name)

    @staticmethod
    def const(value: Any, dtype: DType | tuple[DType, ...] | None = None) -> UPat:
        return UPat(Ops.CONST, dtype=dtype, arg=value)

    # ---- building patterns with operators: x + 0, x * 1 ...

    def _binary(self, op: Ops, other: UPat | int | float | bool, reverse: bool = False) -> UPat:
        o = other if isinstance(other, UPat) else UPat.const(other)
        pair = [o, self] if reverse else [self, o]
        return UPat(op, src=pair if op in GroupOp.Commutative else tuple(pair))

    def __add__(self, x: UPat | int | float) -> UPat:
        return self._binary(Ops.ADD, x)

    def __radd__(self, x: UPat | int | float) -> UPat:
        return self._binary(Ops.ADD, x, reverse=True)

    def __mul__(self, x: UPat | int | float) -> UPat:
        return self._binary(Ops.MUL, x)

    def __rmul__(self, x: UPat | int | float) -> UPat:
        return self._binary(Ops.MUL, x, reverse=True)

    def __floordiv__(self, x: UPat | int) -> UPat:
        return self._binary(Ops.IDIV, x)

    def __mod__(self, x: UPat | int) -> UPat:
        return self._binary(Ops.MOD, x)

    def __and__(self, x: UPat | int | bool) -> UPat:
        return self._binary(Ops.AND, x)

    def __or__(self, x: UPat | int | bool) -> UPat:
        return self._binary(Ops.OR, x)

    def lt(self, x: UPat | int | float) -> UPat:
        return self._binary(Ops.CMPLT, x)

    def ne(self, x: UPat | int | float) -> UPat:
        return self._binary(Ops.CMPNE, x)

    def maximum(self, x: UPat | int | float) -> UPat:
        return self._binary(Ops.MAX, x)

    def where(self, a: UPat, b: UPat) -> UPat:
        return UPat(Ops.WHERE, src=(self, a, b))

    def named(self, name: str) -> UPat:
        return UPat(self.ops, tuple(self.dtypes) if self.dtypes else None, self.src, self.arg, name, self.allow_any_len)

    # ---- matching

    def match(self, u: UOp, store: dict[str, UOp]) -> list[dict[str, UOp]]:
        """Every way this pattern matches u, each as the names it binds (extending store)."""
        if self.ops is not None and u.op not in self.ops:
            return []
        if self.dtypes is not None and u.dtype not in self.dtypes and u.dtype.scalar not in self.dtypes:
            return []
        if self.arg is not _ANY and not (type(self.arg) is type(u.arg) or _numeric(self.arg, u.arg)):
            return []
        if self.arg is not _ANY and self.arg != u.arg:
            return []
        if self.name is not None:
            if (bound := store.get(self.name)) is not None:
                return [store] if bound is u else []
            store = {**store, self.name: u}
        if self.src is None:
            return [store]
        if isinstance(self.src, UPat):
            stores = [store]
            for s in u.src:
                stores = [out for st in stores for out in self.src.match(s, st)]
            return stores
        if len(self.src) != len(u.src) and not (self.allow_any_len and len(u.src) >= len(self.src)):
            return []
        orders = itertools.permutations(self.src) if isinstance(self.src, list) else (self.src,)
        results: list[dict[str, UOp]] = []
        for order in orders:
            stores = [store]
            for pat, s in zip(order, u.src):
                stores = [out for st in stores for out in pat.match(s, st)]
                if not stores:
                    break
            results.extend(stores)
        return results


def _numeric(a: Any, b: Any) -> bool:
    """A const pattern written as 1 matches 1.0 too, but never True."""
    num = (int, float)
    return isinstance(a, num) and isinstance(b, num) and not isinstance(a, bool) and not isinstance(b, bool)


def _admits(pat: UPat, dtype: DType) -> bool:
    """Whether the pattern's own dtype test lets a node of this dtype through (as UPat.match tests it)."""
    return pat.dtypes is None or dtype in pat.dtypes or dtype.scalar in pat.dtypes


Rewrite = Callable[..., UOp | None]
# a rule as a matcher keeps it: the pattern, the rewrite, whether the rewrite takes ctx, and whether the node's op and
# dtype alone decide the match (a pattern with no sources and any arg), which then binds the node itself, unmatched
Rule = tuple[UPat, Rewrite, bool, bool]


class PatternMatcher:
    """An ordered list of (pattern, rewrite) rules; the first rule whose rewrite returns a UOp wins."""

    def __init__(self, rules: list[tuple[UPat, Rewrite]], name: str = "") -> None:
        self.name = name
        self.rules = rules
        self._by_op: dict[Ops, list[Rule]] = {}
        self._any: list[Rule] = []
        for pat, fn in rules:
            entry = (pat, fn, "ctx" in inspect.signature(fn).parameters, pat.src is None and pat.arg is _ANY)
            if pat.ops is None:
                self._any.append(entry)
            else:
                for op in pat.ops:
                    self._by_op.setdefault(op, []).append(entry)
        for op in Ops:  # rules for "any op" keep their place after the op-specific ones
            self._by_op[op] = self._by_op.get(op, []) + self._any
        # the rules whose pattern's own op and dtype admit a node of this op and dtype, made when first asked for
        self._by_kind: dict[Ops, dict[DType, list[Rule]]] = {op: {} for op in Ops}

    def __add__(self, other: PatternMatcher) -> PatternMatcher:
        return PatternMatcher(self.rules + other.rules, f"{self.name}+{other.name}")

    def _rules_for(self, op: Ops, dtype: DType) -> list[Rule]:
        found = self._by_kind[op][dtype] = [entry for entry in self._by_op[op] if _admits(entry[0], dtype)]
        return found

    def rewrite(self, u: UOp, ctx: Any = None) -> UOp | None:
        if (rules := self._by_kind[u.op].get(u.dtype)) is None:
            rules = self._rules_for(u.op, u.dtype)
        for pat, fn, wants_ctx, whole in rules:
            for binding in ({} if pat.name is None else {pat.name: u},) if whole else pat.match(u, {}):
                out = fn(ctx=ctx, **binding) if wants_ctx else fn(**binding)
                if out is not None and out is not u:
                    return out
        return None

    def rewrite_noting(self, u: UOp, ctx: Any, fired: list[tuple[UPat, Callable, UOp, UOp]]) -> UOp | None:
        """rewrite, adding (the rule's pattern and function, u, what u became) to `fired` when one applies (VIZ)."""
        for pat, fn, wants_ctx, whole in self._by_kind[u.op].get(u.dtype) or self._rules_for(u.op, u.dtype):
            for binding in ({} if pat.name is None else {pat.name: u},) if whole else pat.match(u, {}):
                out = fn(ctx=ctx, **binding) if wants_ctx else fn(**binding)
                if out is not None and out is not u:
                    fired.append((pat, fn, u, out))
                    return out
        return None


def graph_rewrite(
    root: UOp, pm: PatternMatcher, ctx: Any = None, memo: dict[UOp, UOp] | None = None, name: str | None = None
) -> UOp:
    """Rewrite bottom-up until no rule applies anywhere: sources first, then the node, again and again.
    memo, when given, is filled with what each node of the graph became. name: the pass's name, under which VIZ
    records the graph before and after and each rule that fired."""
    if name is not None and viz.recording():
        fired: list[tuple[UPat, Callable, UOp, UOp]] = []
        out = _rewrite(root, functools.partial(pm.rewrite_noting, fired=fired), ctx, memo)
        viz.step(name, root, out, fired)
        return out
    return _rewrite(root, pm.rewrite, ctx, memo)


def _rewrite(root: UOp, rewrite: Callable[[UOp, Any], UOp | None], ctx: Any, memo: dict[UOp, UOp] | None) -> UOp:
    done: dict[UOp, UOp] = {} if memo is None else memo
    # stack entries: (node, stage, rewritten form); stage 0 = visit sources, 1 = rewrite, 2 = adopt result
    stack: list[tuple[UOp, int, UOp | None]] = [(root, 0, None)]
    while stack:
        node, stage, new = stack.pop()
        if node in done:
            continue
        if stage == 0:
            stack.append((node, 1, None))
            stack += [(s, 0, None) for s in reversed(node.src) if s not in done]
        elif stage == 1:
            src = tuple([done[s] for s in node.src])
            rebuilt = node if src == node.src else UOp(node.op, node.dtype, src, node.arg)
            out = rewrite(rebuilt, ctx)
            if out is None:
                done[node] = done[rebuilt] = rebuilt
            else:
                stack.append((node, 2, out))
                stack.append((out, 0, None))
        else:
            assert new is not None
            done[node] = done[new]
    return done[root]
