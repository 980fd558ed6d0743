"""Linearizing: a lowered kernel graph -> a list of device ops in execution order.

Loops nest as a tree. Output loops form a chain (in axis order); a REDUCE's loops hang below the
deepest loop its result (or a loop's count: tiny.codegen.narrow) depends on. Each node is placed in the deepest
loop it depends on, so work that does not change inside a loop is done outside it. A REDUCE becomes an
accumulator (DEFINE_ACC) before its loops and an ASSIGN at the end of its innermost loop (a sum of unrolled lanes
is added to it lane by lane);
its users read the ASSIGN after the loops. A sum of WMMAs (tensor cores) accumulates through the WMMA itself:
the accumulator is its C operand.
"""

from __future__ import annotations

import heapq
import itertools

from tiny.codegen.lower import identity
from tiny.ir.uop import Ops, UOp

Block = UOp | None  # a loop (its RANGE), or None for the kernel's top level


class _Linearizer:
    """Places each op of a lowered kernel in a loop, and emits the loops and their ops in order.

    A walker, not rewrite rules: linearizing is scheduling. The loop an op goes into depends on every loop below it
    (its scope, through any path), and its place in that loop on its siblings (a loop comes after everything its body
    reads); a rewrite rule sees one node and its sources and makes a graph, not an order. The steps: the scopes
    (_shared_scopes), the loop tree (_nest), the terms added to accumulators one at a time (_accumulated), each op's
    block; then emit_block walks the tree once."""

    def __init__(self, sink: UOp) -> None:
        self.topo = [u for u in sink.toposort if u.op is not Ops.SINK]
        self.order = {u: i for i, u in enumerate(self.topo)}
        self.reduces = [u for u in self.topo if u.op is Ops.REDUCE]
        self.scope = self._shared_scopes()  # the loops each node depends on
        self.parent: dict[UOp, Block] = {}
        self.depth: dict[Block, int] = {None: 0}
        self._nest()  # each loop's parent
        self.wmma_chains: dict[UOp, list[UOp]] = {}
        self.lane_terms: dict[UOp, list[UOp]] = {}
        chained = self._accumulated()  # the ops a REDUCE's update takes the place of
        self.children: dict[Block, list[UOp]] = {}
        self.nodes: dict[Block, list[UOp]] = {}
        for u in self.topo:
            if u in chained:
                continue
            if u.op is Ops.RANGE:
                self.children.setdefault(self.parent[u], []).append(u)
            else:
                self.nodes.setdefault(self.block_of(u), []).append(u)
        self.out: list[UOp] = []
        self.new: dict[UOp, UOp] = {}
        self.acc_ids = itertools.count()
        self.accs: dict[UOp, UOp] = {}

    def _shared_scopes(self) -> dict[UOp, frozenset[UOp]]:
        """The loops each node depends on. Reduces that share loops (the lanes of one reduction) are placed together:
        each takes the loops any of them depends on (a lane whose value folded to a constant must not pull the shared
        loops out of the output loops the other lanes need)."""
        shared: dict[UOp, frozenset[UOp]] = {}
        while True:
            scope = self._scopes(shared)
            grown = dict(shared)
            for red in self.reduces:
                for r in red.ranges:
                    grown[r] = grown.get(r, frozenset()) | scope[red]
            if grown == shared:
                return scope
            shared = grown

    def _nest(self) -> None:
        """The loop tree: output loops form a chain in axis order; a REDUCE's loops hang below the deepest loop it
        depends on (a reduce's users come first: their loops are placed already)."""
        owned = {r for red in self.reduces for r in red.ranges}
        prev: Block = None
        for r in sorted((u for u in self.topo if u.op is Ops.RANGE and u not in owned), key=lambda r: r.arg):
            prev = self._attach(r, prev)
        for red in reversed(self.reduces):
            p = self.deepest(self.scope[red])
            for r in red.ranges:
                p = self._attach(r, p)

    def _accumulated(self) -> set[UOp]:
        """Fill wmma_chains and lane_terms; the ops they take the place of.

        A WMMA only a sum uses (or a chain of them, each the C of the next) is emitted as that sum's update, with the
        accumulator as the first one's C operand. A sum of unrolled products ((a0*b0 + a1*b1) + ...) that only its
        REDUCE uses, computed inside its loop, is added to the accumulator one product at a time ((acc + a0*b0) +
        a1*b1 ...): a chain of multiply-adds the compiler fuses. Other lanes (a max, a sum of exps) are combined first
        and reach the accumulator in one op, so the chain from one iteration to the next is one op long, not one per
        lane."""
        uses: dict[UOp, int] = {}
        for u in self.topo:
            for s in u.src:
                uses[s] = uses.get(s, 0) + 1
        for r in self.reduces:
            chain, w = [], r.value
            while w.op is Ops.WMMA and uses[w] == 1:
                chain.append(w)
                w = w.src[2]
            if chain and r.arg is Ops.ADD and w.op is Ops.CONST:
                self.wmma_chains[r.value] = chain
        chained = {w for chain in self.wmma_chains.values() for w in chain}
        for r in self.reduces:
            spine, terms, v = [], [], r.value
            while v.op is r.arg and len(v.src) == 2 and uses[v] == 1 and r.ranges[-1] in self.scope[v]:
                spine.append(v)
                terms.append(v.src[1])
                v = v.src[0]
            if spine and r.arg is Ops.ADD and all(t.op is Ops.MUL for t in (v, *terms)):
                self.lane_terms[r.value] = [v] + terms[::-1]
                chained.update(spine)
        return chained

    def _scopes(self, shared: dict[UOp, frozenset[UOp]]) -> dict[UOp, frozenset[UOp]]:
        scope: dict[UOp, frozenset[UOp]] = {}
        for u in self.topo:
            if u.op is Ops.RANGE:  # a loop runs inside the loops its count reads
                scope[u] = scope[u.end] | {u}
                continue
            inner = frozenset().union(*(scope[s] for s in u.src))
            if u.op is Ops.REDUCE:
                inner = inner.union(*(shared.get(r, frozenset()) for r in u.ranges)) - set(u.ranges)
            scope[u] = inner
        return scope

    def _attach(self, r: UOp, parent: Block) -> UOp:
        self.parent[r] = parent
        self.depth[r] = self.depth[parent] + 1
        return r

    def deepest(self, ranges: frozenset[UOp]) -> Block:
        if not ranges:
            return None
        inner = max(ranges, key=lambda r: self.depth[r])
        chain = set(self.ancestors(inner))
        assert ranges <= chain, "a node depends on loops that do not nest"
        return inner

    def ancestors(self, b: Block) -> list[UOp]:
        out = []
        while b is not None:
            out.append(b)
            b = self.parent[b]
        return out

    def block_of(self, u: UOp) -> Block:
        return self.deepest(self.scope[u])

    def item_in(self, u: UOp, b: Block) -> UOp | None:
        """What in block b provides u: u itself, the child loop holding it, or None when it is outside b."""
        where = u if u.op is Ops.RANGE else self.block_of(u)
        if where is b:
            return None if u.op is Ops.RANGE else u
        while where is not None and self.parent[where] is not b:
            where = self.parent[where]
        return where

    def subtree(self, r: UOp) -> tuple[list[UOp], list[UOp]]:
        """The nodes and the loops inside loop r, at any depth (r included among the loops)."""
        nodes, loops = list(self.nodes.get(r, [])), [r]
        for c in self.children.get(r, []):
            n, lp = self.subtree(c)
            nodes += n
            loops += lp
        return nodes, loops

    def deps(self, item: UOp, b: Block) -> set[UOp]:
        """The items of block b that must come before this one."""
        if item.op is Ops.RANGE:  # a loop waits for everything its body uses, and for what its reduces add up
            nodes, loops = self.subtree(item)
            srcs = [s for n in nodes for s in n.src] + [lp.end for lp in loops]
            for red in self.reduces:
                if red.ranges[-1] in loops:
                    srcs += self.lane_terms.get(red.value, [red.value])
        else:
            srcs = list(item.src)
        found = {self.item_in(s, b) for s in srcs} - {None, item}
        return found  # type: ignore[return-value]

    def emit(self, u: UOp) -> UOp:
        if u in self.new:
            return self.new[u]
        v = u.replace(src=tuple(self.emit_src(s) for s in u.src))
        self.out.append(v)
        self.new[u] = v
        return v

    def emit_src(self, s: UOp) -> UOp:
        if s not in self.new and s.op is Ops.CONST:
            return self.emit(s)
        return self.new[s]

    def emit_block(self, b: Block) -> None:
        items = list(self.nodes.get(b, [])) + list(self.children.get(b, []))
        deps = {it: self.deps(it, b) for it in items}
        users: dict[UOp, list[UOp]] = {it: [] for it in items}
        for it, ds in deps.items():
            for d in ds:
                users[d].append(it)
        waiting = {it: len(ds) for it, ds in deps.items()}
        ready = [(self.order[it], it.op.value, id(it), it) for it in items if waiting[it] == 0]
        heapq.heapify(ready)
        while ready:
            it = heapq.heappop(ready)[-1]
            if it.op is Ops.RANGE:
                self.emit_loop(it)
            elif it.op is Ops.REDUCE:
                self.new[it] = self.accs[it]
            else:
                self.emit(it)
            for user in users[it]:
                waiting[user] -= 1
                if waiting[user] == 0:
                    heapq.heappush(ready, (self.order[user], user.op.value, id(user), user))
        assert all(n == 0 for n in waiting.values()), "cyclic dependencies between a block's items"

    def emit_loop(self, r: UOp) -> None:
        starting = [red for red in self.reduces if red.ranges[0] is r]
        for red in starting:
            init = self.emit(UOp.const(red.dtype, identity(red.arg, red.dtype)))
            acc = UOp(Ops.DEFINE_ACC, red.dtype, (init,), next(self.acc_ids))
            self.out.append(acc)
            self.accs[red] = acc
        loop = self.emit(r)
        self.emit_block(r)
        for red in self.reduces:
            if red.ranges[-1] is r:
                acc = self.accs[red]
                if red.value in self.wmma_chains:
                    update = acc
                    for w in reversed(self.wmma_chains[red.value]):  # the first WMMA of the chain first
                        a, b, _ = w.src
                        update = w.replace(src=(self.emit_src(a), self.emit_src(b), update))
                        self.out.append(update)
                else:
                    update = acc
                    for term in self.lane_terms.get(red.value, [red.value]):
                        update = update.alu(red.arg, self.emit_src(term))
                        self.out.append(update)
                assign = UOp(Ops.ASSIGN, red.dtype, (acc, update))
                self.out.append(assign)
                self.accs[red] = assign
        self.out.append(UOp(Ops.ENDRANGE, src=(loop,)))


def linearize(sink: UOp) -> list[UOp]:
    """The kernel as a list of device ops: loops opened and closed, each op after what it uses."""
    lin = _Linearizer(sink)
    lin.emit_block(None)
    return lin.out
