"""Autograd on the Tensor: requires_grad, backward, gradient, detach, no_grad, and the train/eval switch."""

from __future__ import annotations

import contextlib
import itertools
from typing import TYPE_CHECKING, NamedTuple

from tiny.ir.device import collective_for
from tiny.ir.multi import devices_of, multi, relayout, shard_bounds
from tiny.ir.schedule import copied_value, memory_of, read_through
from tiny.ir.uop import Ops, UOp, substitute
from tiny.tensor.base import TensorBase
from tiny.tensor.checks import shards_of
from tiny.tensor.gradient import compute_gradient, full_like, substitute_keeping_rules
from tiny.tensor.live import LiveSet

if TYPE_CHECKING:
    from tiny.tensor.tensor import Tensor

# What realize() made is recorded on the nodes themselves (in their __dict__, under keys this module alone reads and
# writes: see tiny.ir.uop.cached_property), so a record lives exactly as long as its node, with no weak table to
# update as nodes die:
# - on each buffer view realize() made, _ORIGIN: (the graph it computed, when -- which realize() call --, and one view
#   realized with it earlier in the same schedule, kept alive with it: see record_origins);
# - on each BUFFER an assign wrote into, _WRITTEN: when it last did;
# - on each BUFFER on a gradient's path (a leaf's with requires_grad, a recorded view's), _GRAD_PATH.
# A view holds the value of its graph while no buffer that graph reads, nor its own, has been written since.
_ORIGIN = "autograd.origin"
_WRITTEN = "autograd.written"
_GRAD_PATH = "autograd.grad_path"  # on a BUFFER a leaf with requires_grad holds, or that a recorded view holds
_COMPUTED: LiveSet[UOp] = LiveSet()  # the views with a record, in the order they were made (for _read_computed)
_clock = itertools.count(1)
_ASSIGN = Ops.ASSIGN  # (an Enum member as a global: see tiny.ir.schedule.cache._BUFFER)
_new_tuple = tuple.__new__


class _Origin(NamedTuple):
    node: UOp  # the graph the view computed (the first one: later ones are writes into it)
    when: int  # the realize() call that computed it
    saved: UOp | None  # a view computed before it in the same schedule, kept alive with it (outside no_grad)


def _written(buffer: UOp) -> int:
    """When an assign last wrote into a BUFFER (0: never)."""
    return buffer.__dict__.get(_WRITTEN, 0)


class _Switch:
    """A process-wide mode (no_grad, training) that _Mode sets for a block or a function."""

    def __init__(self, value: bool) -> None:
        self.value = value


class _Mode(contextlib.ContextDecorator):
    """Sets a switch inside a with-block, or for the calls of a function it decorates."""

    def __init__(self, switch: _Switch, value: bool) -> None:
        self.switch, self.target = switch, value
        self.saved: list[bool] = []

    def __enter__(self) -> None:
        self.saved.append(self.switch.value)
        self.switch.value = self.target

    def __exit__(self, *exc: object) -> None:
        self.switch.value = self.saved.pop()


NO_GRAD = _Switch(False)
TRAINING = _Switch(False)


class AutogradOps(TensorBase):
    __slots__ = ()

    @property
    def requires_grad(self) -> bool | None:
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool | None) -> None:
        if value and not self.dtype.is_float:
            raise TypeError(f"only float tensors can require gradients, this one is {self.dtype.name}")
        self._requires_grad = value
        if value:
            self.realize()  # a leaf gets memory of its own, so that later realizes never rename it
            mark_gradient_path(self.uop)

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        """Set requires_grad in place and return this tensor, as torch.Tensor.requires_grad_.

        >>> Tensor([1.0, 2.0]).requires_grad_().requires_grad
        True
        """
        if not isinstance(requires_grad, bool):
            raise TypeError(f"requires_grad_() takes a bool, got {requires_grad!r}")
        self.requires_grad = requires_grad
        return self  # type: ignore[return-value]

    def _on_gradient_path(self) -> bool:
        """Whether a gradient can flow into this tensor's graph: it reads memory of a leaf with requires_grad (or
        what was computed from one) and no_grad is off."""
        if NO_GRAD.value:
            return False
        return any(u.op is Ops.BUFFER and _GRAD_PATH in u.__dict__ for u in self.uop.toposort)

    @staticmethod
    def no_grad() -> _Mode:
        """`with Tensor.no_grad():` or `@Tensor.no_grad()`: ops record no path for gradients.

        >>> with Tensor.no_grad(): y = Tensor([1.0]) * 2
        """
        return _Mode(NO_GRAD, True)

    @staticmethod
    def train(mode: bool = True) -> _Mode:
        """`with Tensor.train():` or `@Tensor.train()`: dropout drops and batch norm uses batch statistics."""
        return _Mode(TRAINING, mode)

    @staticmethod
    def eval() -> _Mode:
        return _Mode(TRAINING, False)

    @staticmethod
    def is_training() -> bool:
        return TRAINING.value

    def detach(self) -> Tensor:
        """The same values, through which no gradient flows."""
        return self._new(UOp(Ops.DETACH, self.dtype, (self.uop,)))

    def gradient(self, *targets: Tensor, gradient: Tensor | None = None) -> list[Tensor | None]:
        """d(self)/d(target) for each target, as new tensors (None where self does not depend on it)."""
        seed = self._seed_gradient(gradient)
        if self.uop.op is not Ops.MULTI and all(t.uop.op is not Ops.MULTI for t in targets):
            grads = _gradients(self.uop, seed.uop, [t.uop for t in targets])
        else:
            grads = _multi_gradients(self.uop, seed.uop, [t.uop for t in targets])
        return [None if g is None else self._new(g) for g in grads]

    def backward(self, gradient: Tensor | None = None) -> Tensor:
        """Accumulate d(self)/d(leaf) into .grad of every tensor with requires_grad that self depends on."""
        leaves = [t for t in type(self)._live if t.requires_grad]
        grads = self.gradient(*leaves, gradient=gradient)
        if all(g is None for g in grads):
            raise RuntimeError("backward(): this tensor does not depend on any tensor with requires_grad=True")
        for leaf, g in zip(leaves, grads):
            if g is not None:
                leaf.grad = g if leaf.grad is None else leaf.grad + g
        return self  # type: ignore[return-value]

    def _seed_gradient(self, gradient: Tensor | None) -> Tensor:
        if gradient is None:
            if self.numel() != 1:
                raise RuntimeError(
                    f"backward()/gradient() without a gradient needs a tensor with one element, this one has shape "
                    f"{self.shape}; pass gradient= of that shape"
                )
            return self.ones_like()
        if gradient.shape != self.shape:
            raise ValueError(f"gradient has shape {gradient.shape}, expected the tensor's shape {self.shape}")
        return gradient.cast(self.dtype)


def _gradients(root: UOp, seed: UOp, targets: list[UOp]) -> list[UOp | None]:
    """d(root)/d(target) for each target, root's gradient being `seed` (nodes of one device each)."""
    became: dict[UOp, UOp] = {}
    grads = compute_gradient(_through_realized(root, set(targets), became), seed, targets)
    if any(g is not None for g in grads):  # what the forward pass computed is read from its buffers, not recomputed
        together = iter(_read_computed(UOp(Ops.SINK, src=tuple(g for g in grads if g is not None)), became).src)
        grads = [None if g is None else next(together) for g in grads]
    return grads


def _multi_gradients(root: UOp, seed: UOp, targets: list[UOp]) -> list[UOp | None]:
    """Gradients where the root or a target is on several devices, worked out on each device's graph. A replicated
    root is one value: its gradient flows from one copy (the first). A sharded root is its shards, each seeded with
    its part of `seed`. A sharded target's gradient is its shards' (a shard is a variable of its own); a replicated
    target is every copy at once, so its gradient is the sum of its copies' (an all-reduce: what data-parallel
    training does with its gradients)."""
    if root.op is not Ops.MULTI:
        roots = [(root, seed)]
    elif root.arg is None:
        roots = [(root.src[0], seed.src[0] if seed.op is Ops.MULTI else seed)]
    else:
        roots = list(zip(root.src, relayout(seed, root.arg, shard_bounds(root))))
    flat = [part for t in targets for part in shards_of(t)]
    total: list[UOp | None] = [None] * len(flat)
    for r, g in roots:
        for i, part in enumerate(_gradients(r, g, flat)):
            if part is not None:
                total[i] = part if total[i] is None else UOp(Ops.ADD, part.dtype, (total[i], part))
    out: list[UOp | None] = []
    parts = iter(total)
    for t in targets:
        mine = [next(parts) for _ in shards_of(t)]
        if t.op is not Ops.MULTI or all(g is None for g in mine):
            out.append(mine[0] if t.op is not Ops.MULTI else None)
            continue
        whole = [g if g is not None else full_like(s, 0) for g, s in zip(mine, t.src)]
        if t.arg is None:
            whole = collective_for(devices_of(t)).all_reduce(Ops.ADD, whole)
        out.append(multi(whole, t.arg))
    return out


def _through_realized(root: UOp, keep: set[UOp], became: dict[UOp, UOp]) -> UOp:
    """root with every buffer that realize() made replaced by the graph that computed it (but the targets), and the
    buffers in those graphs likewise: each buffer's graph is expanded once and used wherever the buffer appears
    (`became`: each node of the graphs expanded -> what it became). A buffer met again inside its own graph (a write
    that read what it overwrote) stays a buffer there."""
    full: dict[UOp, UOp] = {}

    def expand(graph: UOp, inside: tuple[UOp, ...]) -> UOp:
        views = [u for u in graph.toposort if _ORIGIN in u.__dict__ and u not in keep and u not in inside]
        for v in views:
            if v not in full:
                full[v] = expand(v.__dict__[_ORIGIN].node, (*inside, v))
        return substitute_keeping_rules(graph, {v: full[v] for v in views}, became) if views else graph

    return expand(root, ())


def _read_computed(sink: UOp, became: dict[UOp, UOp]) -> UOp:
    """sink with each node that a buffer view still holds the value of (realize() computed it, as it was or as
    _through_realized expanded it, and nothing it reads was written since) replaced by that view."""
    computed_as: dict[UOp, tuple[UOp, UOp]] = {}  # node -> (what reads its value, the buffer view that holds it)
    for view in _COMPUTED.alive():
        node = view.__dict__[_ORIGIN].node
        computed_as[node] = computed_as[became.get(node, node)] = (view, view)
        if (copied := copied_value(node)) is not None:  # a copy of x through a permute: x is read back from it
            x, chain = copied
            back = (read_through(view, chain), view)
            computed_as.setdefault(x, back)
            computed_as.setdefault(became.get(x, x), back)
    newest: dict[UOp, int] = {}  # each node -> the last write into a buffer it reads (0: none)
    reuse: dict[UOp, UOp] = {}
    for u in sink.toposort:
        last = max(map(newest.__getitem__, u.src), default=0)
        newest[u] = max(last, _written(u)) if u.op is Ops.BUFFER else last
        if (hit := computed_as.get(u)) is not None:
            value, view = hit
            if newest[u] < view.__dict__[_ORIGIN].when and _unwritten(view):
                reuse[u] = value
    return substitute(sink, reuse)


def _unwritten(view: UOp) -> bool:
    """Whether no assign has written into a view's buffer since realize() computed it."""
    try:
        base = memory_of(view)[0]
    except ValueError:  # not a plain view of memory: do not vouch for it
        return False
    return _written(base) < view.__dict__[_ORIGIN].when


def saves_graphs(reads: tuple[UOp, ...]) -> bool:
    """Whether a schedule that reads these buffers is remembered for gradients (record_origins): outside no_grad, where
    one of them is on a gradient's path. Its buffers are then all read again by a gradient, as saved tensors."""
    if NO_GRAD.value:
        return False
    for b in reads:  # (a loop: any() of a generator is two calls more on Python 3.11)
        if _GRAD_PATH in b.__dict__:
            return True
    return False


def record_origins(becomes: dict[UOp, UOp], reads: tuple[UOp, ...]) -> None:
    """Remember the graph each new buffer view computed (the first one: later ones are writes into it), and when --
    where a gradient may pass: outside no_grad, and where the graph read memory on a gradient's path (a leaf with
    requires_grad, or what was computed from one). The views of one schedule stay alive together, each with the one
    before it: a graph computed there reads values computed before it in the same schedule, and its gradient reads
    them from their buffers for as long as it may be asked for (what PyTorch's saved tensors do). Elsewhere no graph
    is remembered (no gradient can pass it), as PyTorch saves nothing for ops on tensors that need no gradient: a
    remembered graph keeps the buffer it read alive, and that one the buffer before it (`x = f(x).realize()` in a
    loop would keep every step's buffer)."""
    now, before, saving = next(_clock), None, saves_graphs(reads)
    for node, view in becomes.items():
        if node.op is _ASSIGN:
            memory_of(view)[0].__dict__[_WRITTEN] = now
        if not saving:
            continue
        records = view.__dict__
        if _ORIGIN not in records:  # the first graph that computed a buffer is where its gradient comes from
            records[_ORIGIN] = _new_tuple(_Origin, (node, now, before))  # (no Python __new__)
            _COMPUTED.add(view)
            before = view
        mark_gradient_path(view)


def mark_gradient_path(view: UOp) -> None:
    """Put a view's memory on a gradient's path (each device's, for a tensor on several): graphs that read it remember
    what they computed."""
    for part in view.src if view.op is Ops.MULTI else (view,):
        memory_of(part)[0].__dict__[_GRAD_PATH] = True


def no_grad_wrap(uop: UOp) -> UOp:
    return UOp(Ops.DETACH, uop.dtype, (uop,)) if NO_GRAD.value and uop.op is not Ops.DETACH else uop
