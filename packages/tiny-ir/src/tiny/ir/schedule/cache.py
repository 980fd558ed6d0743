"""The schedule cache: a graph with the structure of one scheduled before reuses that schedule.

Two tensor-level graphs have the same structure when they are the same ops, dtypes, args and devices, wired the
same way, over input buffers of the same sizes and dtypes: only which buffers they read differs (a BUFFER counts by
its place in the graph, so two reads of one buffer are not two reads of two buffers). The scheduler's answer for
them differs in the buffers alone: kernel ASTs number their buffers (DEFINE_GLOBAL), so the ASTs are the very same
objects, and each step binds the buffers at the same places. A Template keeps a schedule in those terms -- nodes
by their path from the targets, buffers by slot (the graph's BUFFERs in order, then the new ones the schedule makes)
-- and instantiates it for another graph of the same structure without running the scheduler's rewrites.

The key costs little where little is new: each node keeps the structure of the graph below it, so a new node over
nodes seen before (x + 1 over a tensor just realized) is keyed from its sources' structures, not by a walk, and a
chain of new nodes each over one new source (x + 1 + 1 ..., recorded op by op) by following it down.

What the structure does not show bypasses the cache: a graph that touches a device which only holds data (DISK:
the scheduler makes views of its buffers' memory). What else the scheduler reads is part of the key: the caps of
each device that is open (it splits kernels by how many buffers one may bind and how many loop iterations one
thread may run; a device not opened yet is planned for as unlimited).
"""

from __future__ import annotations

import itertools
import operator
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from tiny.ir.device import Buffer, buffer_of, device_computes, new_buffer, opened_caps
from tiny.ir.dtypes import DType
from tiny.ir.uop import Ops, UOp, make_node, substitute


class ScheduleItem(NamedTuple):
    """One step of a schedule: a kernel (ast is a SINK) or a copy between devices (ast is a COPY). (A NamedTuple, as
    Schedule: one is made per step of every realize, and a frozen dataclass takes twice as long to make.)"""

    ast: UOp
    buffers: tuple[Buffer, ...]  # the output first, then the inputs in the order the AST numbers them


class Schedule(NamedTuple):
    """What realizing a graph takes: the steps in execution order, and what the graph's nodes become."""

    items: list[ScheduleItem]
    becomes: dict[UOp, UOp]  # each realized tensor-level node -> the view of its new buffer
    renamed: dict[UOp, UOp]  # targets that need no kernel, being views of memory once written simply
    fresh: tuple[UOp, ...]  # the BUFFER nodes the schedule made, in the order it made them
    reads: tuple[UOp, ...]  # the BUFFER nodes of the graph: the memory it was given
    var_vals: dict[str, int] = {}  # noqa: RUF012  (never written) each Variable's value by name, for the launches


class StructureKey:
    """The entries that describe a walked graph's structure, one per node; hashed once (a key is looked up more than
    once). A key put together from the nodes' shapes is a short tuple instead, hashed as it is."""

    __slots__ = ("entries", "hash")

    def __init__(self, entries: tuple) -> None:
        self.entries, self.hash = entries, hash(entries)

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StructureKey) and self.hash == other.hash and self.entries == other.entries


class Structure(NamedTuple):
    """A graph's structure (the cache key), its targets and its buffers in slot order (0, 1, ...). A node of the
    graph is named by a path: the index of a target, then of a source at each step down (graphs of one structure
    have the same node at the same path)."""

    key: StructureKey | tuple
    targets: tuple[UOp, ...]
    buffers: tuple[UOp, ...]

    def node(self, path: tuple[int, ...]) -> UOp:
        u = self.targets[path[0]]
        for i in path[1:]:
            u = u.src[i]
        return u


def structure_of(targets: list[UOp]) -> Structure | None:
    """The structure of the graph of `targets`, or None when the graph must be scheduled anew every time.

    The key is put together from a structure cached on each node (see _Shape): a new node over nodes seen before
    costs a few lookups, not a walk of the graph below it. Where many nodes are new (a big graph built since the last
    realize), one walk of the graph makes the key instead (another kind of key: a graph keyed one way does not find
    a schedule recorded under the other, which costs one scheduling)."""
    shape = _shape_of_targets(targets)
    if shape is None:  # too much new: one walk
        entries, nodes = _walk(targets)
        if entries is None:
            return None
        return Structure(StructureKey(entries), tuple(targets), tuple(u for u in nodes if u.op is Ops.BUFFER))
    root, buffers, devices = shape
    if len(devices) == 1:  # (the usual case: one device)
        (name,) = devices
        # (a device with caps is open and computes: only one without is asked whether it computes)
        if (caps := opened_caps(name)) is None and not device_computes(name):
            return None  # values there become views of a buffer's memory: BUFFERs that are not new memory
        key = (_COMPOSED, root, name, _caps_token(caps))
        return _new_tuple(Structure, (key, tuple(targets), buffers))  # (without the NamedTuple's Python __new__)
    names = tuple(sorted(devices))
    if not all(map(device_computes, names)):
        return None
    tokens = tuple(_caps_token(opened_caps(d)) for d in names)
    return Structure((_COMPOSED, root, names, tokens), tuple(targets), buffers)


_CAPS: dict[int, object] = {}  # every caps object a key has named, by id (kept, so that no other takes its id)


def _caps_token(caps: object | None) -> int | None:
    """A device's caps (see opened_caps) in a key: the caps object's id (hashing a dataclass of many fields is
    slow), None for a device not opened. Caps equal but not the same object make another key: a miss, not a wrong
    schedule."""
    if caps is None:
        return None
    if (kept := _CAPS.get(token := id(caps))) is not caps:
        if kept is not None:
            raise AssertionError("internal: two caps objects alive with one id")
        _CAPS[token] = caps
    return token


def _walk(targets: list[UOp]) -> tuple[tuple | None, tuple[UOp, ...]]:
    """The structure of the graph of `targets` as one entry per node (None where a device only holds data), and the
    nodes, each after its sources (depth first, sources in order)."""
    place: dict[UOp, int] = {}  # each node -> its place in `nodes`, where it comes after its sources
    nodes: list[UOp] = []
    entries: list[tuple] | None = []
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
                if entries is None:
                    pass
                elif node.op is Ops.DEVICE:
                    if not device_computes(node.arg):
                        entries = None  # values there become views of a buffer's memory: BUFFERs that are not new
                    else:
                        entries.append((Ops.DEVICE, node.arg, opened_caps(node.arg)))
                elif node.op is Ops.BUFFER:  # its size and dtype, not which buffer it is
                    entries.append((Ops.BUFFER, node.dtype, node.arg[1], place[node.src[0]]))
                else:
                    entries.append((node.op, node.dtype, node.argkey, tuple(map(place.__getitem__, node.src))))
                place[node] = len(nodes)
                nodes.append(node)
    if entries is not None:
        entries.append(tuple(map(place.__getitem__, targets)))
    return (tuple(entries) if entries is not None else None), tuple(nodes)


# ---------------------------------------------------------------- structures put together node by node

# The structure of the graph below a node, cached on the node (UOps are immutable, so it never goes stale):
# (an id that names the structure, the graph's BUFFER nodes in slot order, the names of the devices it touches).
# Two nodes have the same id when their graphs are the same ops, dtypes, args and devices wired the same way over
# buffers of the same sizes and dtypes, which buffer being which up to renaming: a node's id is interned from its
# op, dtype and arg, its sources' ids, and where each source's buffers fall among the node's (two reads of one
# buffer are not reads of two). With hash-consing, that is the whole graph: equal graphs over the same buffers are
# the same node.
_Shape = tuple[int, tuple[UOp, ...], frozenset[str]]
_SHAPE = "schedule_cache.shape"  # this module's record in a node's __dict__ (see tiny.ir.uop.cached_property)
_COMPOSED = object()  # marks a key put together from the nodes' shapes (another kind than a walk's entries)
_IDS: dict[tuple, int] = {}  # each structure seen -> its id
_next_id = itertools.count()
_IDS_KEPT = 1 << 17  # then the table starts afresh: nodes keep their ids, new structures get new ones (a miss)
NEW_NODES_LIMIT = 256  # at most this many nodes without a shape: more, and one walk keys the graph
_MERGE_BUDGET = 4096  # ... and at most this many buffer lookups to put their shapes together


def _intern(entry: tuple) -> int:
    if (i := _IDS.get(entry)) is None:
        if len(_IDS) >= _IDS_KEPT:
            _IDS.clear()
        i = _IDS[entry] = next(_next_id)
    return i


def _shape_of_targets(targets: list[UOp]) -> tuple[int | tuple, tuple[UOp, ...], frozenset[str]] | None:
    """The shape of the targets' graph (as of a node whose sources they are), or None where too much is new."""
    if len(targets) == 1:  # the usual case first: one target, known already or a chain of new nodes over known ones
        target = targets[0]
        if (known := target.__dict__.get(_SHAPE)) is not None:
            return known
        sources = []
        for s in target.src:  # (a loop: a comprehension is a call on Python 3.11)
            if (known := s.__dict__.get(_SHAPE)) is None:
                break
            sources.append(known)
        else:  # (not kept on the target: realizing it replaces it with a view, which comes with its own)
            return _shape(target, sources)[0]
        if (chain := _new_chain(target)) is not None:
            return target.__dict__[_SHAPE] if _keep_shapes(chain) else None
    new = _new_nodes(targets)
    if new is None or not _keep_shapes(new):
        return None
    if len(targets) == 1:
        return targets[0].__dict__[_SHAPE]
    ids, buffers, devices, _ = _merge([t.__dict__[_SHAPE] for t in targets])
    return ids, buffers, devices  # (a tuple: one target's is an int)


def _new_chain(target: UOp) -> list[UOp] | None:
    """The new nodes below a target where each has one source without a shape (x + 1, then + 1 again ... recorded op
    by op since the last realize), each after its source, the target last; None where one has more (the walk of
    _new_nodes puts those together). Following the one new source down needs no record of the nodes seen."""
    chain, u = [target], target
    while True:
        below = None
        for s in u.src:  # (a loop: a comprehension is a call on Python 3.11)
            if _SHAPE not in s.__dict__ and s is not below:
                if below is not None:
                    return None
                below = s
        if below is None:
            chain.reverse()
            return chain
        chain.append(below)
        u = below


def _keep_shapes(nodes: list[UOp]) -> bool:
    """Give each node (each after its sources) its shape from its sources'; False past _MERGE_BUDGET buffer lookups."""
    budget = _MERGE_BUDGET
    for u in nodes:
        sources = []
        for s in u.src:  # (a loop: a comprehension is a call on Python 3.11)
            sources.append(s.__dict__[_SHAPE])
        shape, cost = _shape(u, sources)
        u.__dict__[_SHAPE] = shape
        budget -= cost
        if budget < 0:
            return False
    return True


def _new_nodes(targets: list[UOp]) -> list[UOp] | None:
    """The nodes of the targets' graph without a shape yet, each after its sources; None where there are more than
    NEW_NODES_LIMIT."""
    new: list[UOp] = []
    seen: set[UOp] = set()
    for target in targets:
        if _SHAPE in target.__dict__ or target in seen:
            continue
        seen.add(target)
        stack = [(target, iter(target.src))]
        while stack:
            node, sources = stack[-1]
            for s in sources:
                if _SHAPE not in s.__dict__ and s not in seen:
                    seen.add(s)
                    stack.append((s, iter(s.src)))
                    break
            else:
                stack.pop()
                new.append(node)
                if len(new) > NEW_NODES_LIMIT:
                    return None
    return new


def _shape(u: UOp, sources: list[_Shape]) -> tuple[_Shape, int]:
    """A node's shape from its sources' shapes, and how many buffer lookups that took."""
    op = u.op
    if len(sources) == 2:  # the usual case first (every binary op): as _merge does, with the id looked up here
        (a, a_buffers, a_devices), (b, b_buffers, b_devices) = sources
        if not a_buffers or not b_buffers:  # buffers on one side at most: which follows from the ids
            devices = a_devices if b_devices is a_devices or b_devices <= a_devices else a_devices | b_devices
            entry = (op, u.dtype, u.argkey, (a, b))
            if (i := _IDS.get(entry)) is None:
                i = _intern(entry)
            return (i, a_buffers or b_buffers, devices), 0
    if len(sources) == 1:
        source, buffers, devices = sources[0]
        if op is _BUFFER:  # its size and dtype, not which buffer it is
            return (_intern((op, u.dtype, u.arg[1], source)), (u,), devices), 0
        return (_intern((op, u.dtype, u.argkey, source)), buffers, devices), 0
    if op is _DEVICE:
        return (_intern((op, u.arg)), (), frozenset((u.arg,))), 0
    if not sources:
        return (_intern((op, u.dtype, u.argkey)), (), frozenset()), 0
    ids, buffers, devices, cost = _merge(sources)
    return (_intern((op, u.dtype, u.argkey, ids)), buffers, devices), cost


def _merge(sources: list[_Shape]) -> tuple[tuple, tuple[UOp, ...], frozenset[str], int]:
    """The sources' ids (with where each one's buffers fall among all of theirs, when more than one has buffers),
    their buffers in order of first appearance, and their devices; and how many buffer lookups that took."""
    if len(sources) == 2:  # the usual case first: a binary op, buffers on one side at most
        (a, a_buffers, a_devices), (b, b_buffers, b_devices) = sources
        devices = a_devices if b_devices is a_devices or b_devices <= a_devices else a_devices | b_devices
        if not a_buffers or not b_buffers:  # which sources have buffers follows from their ids
            return (a, b), a_buffers or b_buffers, devices, 0
    ids = tuple(s[0] for s in sources)
    devices = sources[0][2]
    for s in sources[1:]:
        if s[2] is not devices and not s[2] <= devices:
            devices = devices | s[2]
    with_buffers = [s[1] for s in sources if s[1]]
    if len(with_buffers) <= 1:  # which sources have buffers follows from their ids: nothing to say where they fall
        return ids, (with_buffers[0] if with_buffers else ()), devices, 0
    slot: dict[UOp, int] = {}
    places = []
    for buffers in with_buffers:
        places.append(tuple(slot.setdefault(b, len(slot)) for b in buffers))
    return (ids, tuple(places)), tuple(slot), devices, sum(map(len, with_buffers))


# a node of the schedule: the graph's node at this path (a tuple), or a graph over slot placeholders (UOp)
Ref = tuple[int, ...] | UOp


def _placeholder(slot: int, like: UOp) -> UOp:
    """A BUFFER node that stands for buffer slot `slot` (the same dtype, size and device as `like`); no buffer ever
    has a negative number, so it is never a real one."""
    return UOp(Ops.BUFFER, like.dtype, like.src, (-1 - slot, like.arg[1]))


def _slot_of(placeholder: UOp) -> int:
    return -1 - placeholder.arg[0]


class _Unrecordable(Exception):
    """A schedule holds a buffer that is neither the graph's nor one the schedule made: it cannot be a template."""


@dataclass(frozen=True)
class Template:
    """A schedule for every graph of one structure."""

    fresh: tuple[tuple[str, int, DType], ...]  # the buffers it makes (device, size, dtype): the slots after the graph's
    steps: tuple[tuple[Ref, tuple[int, ...]], ...]  # each step's AST (a kernel's as is) and its buffer slots
    becomes: tuple[tuple[Ref, Ref], ...]
    renamed: tuple[tuple[Ref, Ref], ...]
    # the same, as instantiate() runs it (worked out once, here, instead of at every instantiation)
    _steps: tuple[tuple[Ref, Callable[[list[Buffer]], tuple[Buffer, ...]], bool], ...] = field(
        init=False, repr=False, compare=False
    )
    _becomes: tuple[tuple[Ref, _ViewOf | Ref], ...] = field(init=False, repr=False, compare=False)
    # where every step is a kernel, every value becomes a view of one buffer and nothing is renamed (nearly every
    # schedule): each target's index and its view, for the shorter way instantiate() takes then; else None
    _views: tuple[tuple[int, _ViewOf], ...] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        steps = tuple((ast, _picker(ks), _is_kernel(ast)) for ast, ks in self.steps)
        object.__setattr__(self, "_steps", steps)
        becomes = tuple((k, _view_of(v) or v) for k, v in self.becomes)
        object.__setattr__(self, "_becomes", becomes)
        plain = not self.renamed and all(kernel for _, _, kernel in steps)
        plain = plain and all(type(k) is tuple and len(k) == 1 and type(v) is _ViewOf for k, v in becomes)
        object.__setattr__(self, "_views", tuple((k[0], v) for k, v in becomes) if plain else None)

    @staticmethod
    def record(schedule: Schedule, graph: Structure) -> Template | None:
        """The schedule in terms of paths and slots; None when it holds what a template cannot say."""
        try:
            return _Recorder(schedule, graph).template()
        except _Unrecordable:
            return None

    def instantiate(self, graph: Structure) -> Schedule:
        """The schedule for `graph` (of the structure this was recorded for): new buffers where the schedule makes
        them. (Straight from the template to the steps: this runs for every op, so loops, not comprehensions, which
        are calls on Python 3.11; and the NamedTuples made by tuple.__new__, without their Python __new__.)"""
        nodes = list(graph.buffers)  # the BUFFER node of each slot
        buffers = []  # ... and its Buffer
        for node in nodes:
            buffers.append(buffer_of(node))
        for device, size, dtype in self.fresh:
            node = new_buffer(device, size, dtype)
            nodes.append(node)
            buffers.append(buffer_of(node))
        targets, reads = graph.targets, graph.buffers
        items: list[ScheduleItem] = []
        becomes: dict[UOp, UOp] = {}
        if (views := self._views) is not None:  # (the usual schedule: kernels, and each target a view)
            for ast, pick, _ in self._steps:
                items.append(_new_tuple(ScheduleItem, (ast, pick(buffers))))
            for k, v in views:
                becomes[targets[k]] = v.make(nodes[v.slot])
            return _new_tuple(Schedule, (items, becomes, {}, tuple(nodes[len(reads) :]), reads, _NO_VALUES))
        for ast, pick, kernel in self._steps:
            if not kernel:  # a copy's node (a kernel's AST is itself)
                ast = _node(ast, targets, nodes)
            items.append(_new_tuple(ScheduleItem, (ast, pick(buffers))))
        for k, v in self._becomes:
            node = targets[k[0]] if type(k) is tuple and len(k) == 1 else _node(k, targets, nodes)
            becomes[node] = v.make(nodes[v.slot]) if type(v) is _ViewOf else _node(v, targets, nodes)
        renamed: dict[UOp, UOp] = {}
        for k, v in self.renamed:
            renamed[_node(k, targets, nodes)] = _node(v, targets, nodes)
        return _new_tuple(Schedule, (items, becomes, renamed, tuple(nodes[len(reads) :]), reads, _NO_VALUES))


_new_tuple = tuple.__new__
_NO_VALUES: dict[str, int] = {}  # a schedule's var_vals where it has no Variable (never written)


def _picker(slots: tuple[int, ...]) -> Callable[[list[Buffer]], tuple[Buffer, ...]]:
    """A function that takes the buffers of these slots, as a tuple, from the list of every slot's buffer."""
    if len(slots) >= 2:
        return operator.itemgetter(*slots)  # (which gives a tuple for two or more)
    return lambda buffers: tuple(buffers[k] for k in slots)


_SINK, _RESHAPE, _BUFFER, _DEVICE = Ops.SINK, Ops.RESHAPE, Ops.BUFFER, Ops.DEVICE  # (Enum members as globals: see
# tiny.ir.schedule)


def _node(ref: Ref, targets: tuple[UOp, ...], nodes: list[UOp]) -> UOp:
    """The node a Ref names in a graph of these targets, with each slot's placeholder bound to the BUFFER node of
    that slot (`nodes`)."""
    if type(ref) is tuple:  # a path from the targets
        u = targets[ref[0]]
        for i in ref[1:]:
            u = u.src[i]
        return u
    if (view := _view_of(ref)) is not None:  # a view of one buffer (the usual value of becomes)
        return view.make(nodes[view.slot])
    return substitute(ref, {b: nodes[_slot_of(b)] for b in ref.toposort if b.op is _BUFFER})


class _ViewOf(NamedTuple):
    """A template's RESHAPE(placeholder): a view of one buffer slot, with what the next op on such a view reads at
    once (its structure, shape and device: the placeholder has the buffer's dtype, size and device)."""

    slot: int
    dtype: DType
    arg: tuple[int, ...]
    structure: int  # the id of its structure (see _Shape)
    devices: frozenset[str]
    shape: tuple[int, ...]
    device: str

    def make(self, buffer: UOp) -> UOp:
        """RESHAPE(buffer), its structure, shape and device filled in where the cached properties would keep them,
        so that none is computed again."""
        view = make_node(UOp, _RESHAPE, self.dtype, (buffer,), self.arg)  # (UOp(...): see make_node)
        if _SHAPE not in view.__dict__:
            view.__dict__[_SHAPE] = (self.structure, view.src, self.devices)  # (view.src: its one buffer)
            view.set_shape(self.shape, self.device)
        return view


def _view_of(ref: Ref) -> _ViewOf | None:
    """A Ref that is RESHAPE(placeholder) as a _ViewOf; None for any other."""
    if type(ref) is tuple or ref.op is not _RESHAPE or ref.src[0].op is not _BUFFER:
        return None
    if (known := ref.__dict__.get(_SHAPE)) is None:
        known = _shape_of_targets([ref])
    assert known is not None, "a view of one buffer has a few nodes"
    return _ViewOf(_slot_of(ref.src[0]), ref.dtype, ref.arg, known[0], known[2], ref.shape, ref.device)


def _paths(targets: tuple[UOp, ...]) -> dict[UOp, tuple[int, ...]]:
    """A path to each node of the targets' graph (the first one met, depth first)."""
    path: dict[UOp, tuple[int, ...]] = {}
    stack = [(t, (i,)) for i, t in reversed(list(enumerate(targets)))]
    while stack:
        u, p = stack.pop()
        if u not in path:
            path[u] = p
            stack.extend((s, (*p, i)) for i, s in reversed(list(enumerate(u.src))) if s not in path)
    return path


def _is_kernel(ast: Ref) -> bool:
    """A kernel's AST (kept as it is: it holds no buffers), not a copy's node (a Ref)."""
    return isinstance(ast, UOp) and ast.op is Ops.SINK


class _Recorder:
    def __init__(self, schedule: Schedule, graph: Structure) -> None:
        self.schedule, self.graph = schedule, graph
        self.path = _paths(graph.targets)
        self.slot = {b: k for k, b in enumerate(graph.buffers)}
        self.made = set(schedule.fresh)
        self.node_of = {buffer_of(b): b for b in (*graph.buffers, *schedule.fresh)}  # (steps hold Buffers)
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
        if u in self.path:
            return self.path[u]
        stand_ins = {}
        for b in u.toposort:
            if b.op is Ops.BUFFER:
                k = self.buffer(b)
                stand_ins[b] = self.placeholders.setdefault(k, _placeholder(k, b))
        return substitute(u, stand_ins)

    def template(self) -> Template:
        steps = []
        for ast, bufs in self.schedule.items:
            if not all(b in self.node_of for b in bufs):
                raise _Unrecordable
            slots = tuple(self.buffer(self.node_of[b]) for b in bufs)
            if ast.op is Ops.SINK and any(u.op is Ops.BUFFER for u in ast.toposort):
                raise _Unrecordable  # a kernel AST numbers its buffers; it never holds one
            steps.append((ast if _is_kernel(ast) else self.ref(ast), slots))
        becomes = tuple((self.ref(k), self.ref(v)) for k, v in self.schedule.becomes.items())
        renamed = tuple((self.ref(k), self.ref(v)) for k, v in self.schedule.renamed.items())
        if len(self.fresh) != len(self.schedule.fresh):
            raise _Unrecordable  # a buffer the schedule made that no step writes: instantiating would not make it
        return Template(tuple(self.fresh), tuple(steps), becomes, renamed)


class ScheduleCache:
    """Templates by structure, the most recently used kept (at most `capacity`); counts hits and misses."""

    def __init__(self, capacity: int = 1024) -> None:
        self.capacity = capacity
        self.templates: OrderedDict[StructureKey | tuple, Template] = OrderedDict()
        self.hits = self.misses = 0

    def get(self, key: StructureKey | tuple) -> Template | None:
        template = self.templates.get(key)
        if template is None:
            self.misses += 1
        else:
            self.hits += 1
            self.templates.move_to_end(key)
        return template

    def put(self, key: StructureKey | tuple, template: Template) -> None:
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


def check_same(cached: Template, schedule: Schedule, graph: Structure) -> None:
    """Fail unless the template instantiated for `graph` is `schedule` (up to which new buffers it makes)."""
    from_cache, fresh = Template.record(cached.instantiate(graph), graph), Template.record(schedule, graph)
    if from_cache != fresh:
        raise ScheduleMismatch(
            f"the schedule cache gives a different schedule than the scheduler for a graph of {len(graph.buffers)} "
            f"buffers:\ncached:   {from_cache}\ncomputed: {fresh}"
        )
