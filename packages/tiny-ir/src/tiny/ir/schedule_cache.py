"""The schedule cache: a graph with the structure of one scheduled before reuses that schedule.

Two tensor-level graphs have the same structure when they are the same ops, dtypes, args and devices, wired the
same way, over input buffers of the same sizes and dtypes: only which buffers they read differs (a BUFFER counts by
its place in the graph, so two reads of one buffer are not two reads of two buffers). The scheduler's answer for
them differs in the buffers alone: kernel ASTs number their buffers (DEFINE_GLOBAL), so the ASTs are the very same
objects, and each step binds the buffers at the same places. A Template keeps a schedule in those terms -- nodes
by their place in the graph, buffers by slot (the graph's BUFFERs in order, then the new ones the schedule makes)
-- and instantiates it for another graph of the same structure without running the scheduler's rewrites.

What the structure does not show bypasses the cache: a graph that touches a device which only holds data (DISK:
the scheduler makes views of its buffers' memory). What else the scheduler reads is part of the key: the caps of
each device that is open (it splits kernels by how many buffers one may bind and how many loop iterations one
thread may run; a device not opened yet is planned for as unlimited).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from tiny.ir.device import device_computes, new_buffer, opened_caps
from tiny.ir.dtypes import DType
from tiny.ir.uop import Ops, UOp, substitute


@dataclass(frozen=True)
class Plan:
    """A schedule in terms of BUFFER nodes, as the scheduler computes it (before it looks up their Buffers)."""

    steps: tuple[tuple[UOp, tuple[UOp, ...]], ...]  # each kernel (SINK) or copy (COPY) and its buffers, output first
    becomes: dict[UOp, UOp]  # each realized tensor-level node -> the view of its buffer
    renamed: dict[UOp, UOp]  # targets that need no kernel -> the view of memory they are
    fresh: tuple[UOp, ...]  # the BUFFER nodes the schedule made, in the order it made them


class StructureKey:
    """The entries that describe a graph's structure, one per node; hashed once (a key is looked up more than once)."""

    __slots__ = ("entries", "hash")

    def __init__(self, entries: tuple) -> None:
        self.entries, self.hash = entries, hash(entries)

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StructureKey) and self.hash == other.hash and self.entries == other.entries


@dataclass(frozen=True)
class Structure:
    """A graph's structure (the cache key) and the graph's own nodes and buffers, in the order the key lists them."""

    key: StructureKey
    nodes: tuple[UOp, ...]  # every node of the targets' graph, each after its sources
    buffers: tuple[UOp, ...]  # the BUFFER nodes among them, in that order: slots 0, 1, ...


def structure_of(targets: list[UOp]) -> Structure | None:
    """The structure of the graph of `targets`, or None when the graph must be scheduled anew every time."""
    place: dict[UOp, int] = {}  # each node -> its place in `nodes`, where it comes after its sources
    nodes: list[UOp] = []
    entries: list[tuple] = []
    for target in targets:  # depth first, sources in order, without recursion
        stack = [(target, iter(target.src))] if target not in place else []
        while stack:
            node, sources = stack[-1]
            for s in sources:
                if s not in place:
                    stack.append((s, iter(s.src)))
                    break
            else:
                stack.pop()
                if node.op is Ops.DEVICE:
                    if not device_computes(node.arg):
                        return None  # values there become views of a buffer's memory: BUFFERs that are not new memory
                    entries.append((Ops.DEVICE, node.arg, opened_caps(node.arg)))
                elif node.op is Ops.BUFFER:  # its size and dtype, not which buffer it is
                    entries.append((Ops.BUFFER, node.dtype, node.arg[1], place[node.src[0]]))
                else:
                    entries.append((node.op, node.dtype, node.argkey, tuple(map(place.__getitem__, node.src))))
                place[node] = len(nodes)
                nodes.append(node)
    entries.append(tuple(map(place.__getitem__, targets)))
    return Structure(StructureKey(tuple(entries)), tuple(nodes), tuple(u for u in nodes if u.op is Ops.BUFFER))


# a node of the schedule: the graph's node at this place (int), or a graph over slot placeholders (UOp)
Ref = int | UOp


def _placeholder(slot: int, like: UOp) -> UOp:
    """A BUFFER node that stands for buffer slot `slot` (the same dtype, size and device as `like`); no buffer ever
    has a negative number, so it is never a real one."""
    return UOp(Ops.BUFFER, like.dtype, like.src, (-1 - slot, like.arg[1]))


class _Unrecordable(Exception):
    """A plan holds a buffer that is neither the graph's nor one the schedule made: it cannot be a template."""


@dataclass(frozen=True)
class Template:
    """A schedule for every graph of one structure."""

    fresh: tuple[tuple[str, int, DType], ...]  # the buffers it makes (device, size, dtype): the slots after the graph's
    steps: tuple[tuple[Ref, tuple[int, ...]], ...]  # each step's AST (a kernel's as is) and its buffer slots
    becomes: tuple[tuple[Ref, Ref], ...]
    renamed: tuple[tuple[Ref, Ref], ...]
    placeholders: tuple[tuple[int, UOp], ...]  # the slots that Ref graphs use, each with its placeholder

    @staticmethod
    def record(plan: Plan, graph: Structure) -> Template | None:
        """The plan in terms of places and slots; None when it holds what a template cannot say."""
        try:
            return _Recorder(plan, graph).template()
        except _Unrecordable:
            return None

    def instantiate(self, graph: Structure) -> Plan:
        """The plan for `graph` (of the structure this was recorded for): new buffers where the schedule makes them."""
        fresh = tuple(new_buffer(device, size, dtype) for device, size, dtype in self.fresh)
        slots = graph.buffers + fresh
        binding = {p: slots[k] for k, p in self.placeholders}

        def node(ref: Ref) -> UOp:
            if isinstance(ref, int):
                return graph.nodes[ref]
            if ref.op is Ops.RESHAPE and ref.src[0] in binding:  # a view of one buffer (the usual value of becomes)
                return UOp(Ops.RESHAPE, ref.dtype, (binding[ref.src[0]],), ref.arg)
            return substitute(ref, binding)

        steps = tuple((ast if _is_kernel(ast) else node(ast), tuple(slots[k] for k in ks)) for ast, ks in self.steps)
        becomes = {node(k): node(v) for k, v in self.becomes}
        renamed = {node(k): node(v) for k, v in self.renamed}
        return Plan(steps, becomes, renamed, fresh)


def _is_kernel(ast: Ref) -> bool:
    """A kernel's AST (kept as it is: it holds no buffers), not a copy's node (a Ref)."""
    return isinstance(ast, UOp) and ast.op is Ops.SINK


class _Recorder:
    def __init__(self, plan: Plan, graph: Structure) -> None:
        self.plan, self.graph = plan, graph
        self.place = {u: i for i, u in enumerate(graph.nodes)}
        self.slot = {b: k for k, b in enumerate(graph.buffers)}
        self.made = set(plan.fresh)
        self.fresh: list[tuple[str, int, DType]] = []
        self.placeholders: dict[int, UOp] = {}

    def buffer(self, b: UOp) -> int:
        if b not in self.slot:
            if b not in self.made:
                raise _Unrecordable
            self.slot[b] = len(self.slot)
            self.fresh.append((b.device, b.arg[1], b.dtype))
        return self.slot[b]

    def ref(self, u: UOp) -> Ref:
        if u in self.place:
            return self.place[u]
        stand_ins = {}
        for b in u.toposort:
            if b.op is Ops.BUFFER:
                k = self.buffer(b)
                stand_ins[b] = self.placeholders.setdefault(k, _placeholder(k, b))
        return substitute(u, stand_ins)

    def template(self) -> Template:
        steps = []
        for ast, bufs in self.plan.steps:
            slots = tuple(self.buffer(b) for b in bufs)
            if ast.op is Ops.SINK and any(u.op is Ops.BUFFER for u in ast.toposort):
                raise _Unrecordable  # a kernel AST numbers its buffers; it never holds one
            steps.append((ast if _is_kernel(ast) else self.ref(ast), slots))
        becomes = tuple((self.ref(k), self.ref(v)) for k, v in self.plan.becomes.items())
        renamed = tuple((self.ref(k), self.ref(v)) for k, v in self.plan.renamed.items())
        if len(self.fresh) != len(self.plan.fresh):
            raise _Unrecordable  # a buffer the schedule made that no step writes: instantiating would not make it
        placeholders = tuple(sorted(self.placeholders.items()))
        return Template(tuple(self.fresh), tuple(steps), becomes, renamed, placeholders)


class ScheduleCache:
    """Templates by structure, the most recently used kept (at most `capacity`); counts hits and misses."""

    def __init__(self, capacity: int = 1024) -> None:
        self.capacity = capacity
        self.templates: OrderedDict[StructureKey, Template] = OrderedDict()
        self.hits = self.misses = 0

    def get(self, key: StructureKey) -> Template | None:
        template = self.templates.get(key)
        if template is None:
            self.misses += 1
        else:
            self.hits += 1
            self.templates.move_to_end(key)
        return template

    def put(self, key: StructureKey, template: Template) -> None:
        self.templates[key] = template
        if len(self.templates) > self.capacity:
            self.templates.popitem(last=False)

    def clear(self) -> None:
        self.templates.clear()
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self.templates)


SCHEDULES = ScheduleCache()


class ScheduleMismatch(RuntimeError):
    """SCHEDULE_CACHE=2 found the cached schedule of a graph different from the one the scheduler computes."""


def check_same(cached: Template, plan: Plan, graph: Structure) -> None:
    """Fail unless the template instantiated for `graph` is `plan` (up to which new buffers it makes)."""
    from_cache, fresh = Template.record(cached.instantiate(graph), graph), Template.record(plan, graph)
    if from_cache != fresh:
        raise ScheduleMismatch(
            f"the schedule cache gives a different schedule than the scheduler for a graph of {len(graph.nodes)} "
            f"nodes:\ncached:   {from_cache}\ncomputed: {fresh}"
        )
