"""ONNX's control flow (If, Loop, Scan) over tiny tensors: conditions and trip counts are read on the host, and the
chosen branch or every iteration of the body is run as tiny ops (a loop is unrolled into the lazy graph)."""

from __future__ import annotations

import numpy as np

from tiny.onnx.model import NodeCall, Value, normalize_axis, register
from tiny.tensor import Tensor


def _out(v: Value) -> Tensor | np.ndarray:
    return v.tensor if v.tensor is not None else v.host


@register("If")
def if_(c: NodeCall) -> list[Tensor | np.ndarray]:
    branch = c.attr("then_branch") if bool(c.host(0).reshape(-1)[0]) else c.attr("else_branch")
    return [_out(v) for v in c.run_graph(branch, {})]


@register("Loop")
def loop(c: NodeCall) -> list[Tensor | np.ndarray]:
    body = c.attr("body")
    trips = int(c.scalar(0)) if c.has(0) else None
    keep_going = bool(c.scalar(1)) if c.has(1) else True
    carried = [c.value(i) for i in range(2, len(c.inputs))]
    names = [vi.name for vi in body.input]  # (iteration number, condition, the carried values)
    n_carried = len(carried)
    scans: list[list[Tensor | np.ndarray]] = []
    i = 0
    while keep_going and (trips is None or i < trips):
        bound = {names[0]: Value(host=np.array(i, dtype=np.int64)), names[1]: Value(host=np.array(keep_going))}
        bound.update(dict(zip(names[2:], carried)))
        outs = c.run_graph(body, bound)
        keep_going = bool(outs[0].numpy().reshape(-1)[0])
        carried = outs[1 : 1 + n_carried]
        scans.append([_out(v) for v in outs[1 + n_carried :]])
        i += 1
    stacked = []
    for k in range(c.n_outputs - n_carried):
        column = [step[k] for step in scans]
        if not column:
            raise NotImplementedError(
                f"{c.where}: scan outputs of a loop that ran no iteration (their shape is unknown)"
            )
        if all(isinstance(x, np.ndarray) for x in column):
            stacked.append(np.stack(column))
        else:
            tensors = [x if isinstance(x, Tensor) else Tensor(x, device=c.device) for x in column]
            stacked.append(Tensor.stack(*tensors, dim=0))
    return [*(_out(v) for v in carried), *stacked]


@register("Scan")
def scan(c: NodeCall) -> list[Tensor | np.ndarray]:
    if c.opset >= 9:
        n_state = len(c.inputs) - c.attr("num_scan_inputs")
        return _scan(c, [c.value(i) for i in range(n_state)], [c.tensor(i) for i in range(n_state, len(c.inputs))])
    # opset 8: a batch axis first, the sequence second, and sequence_lens (input 0) that must be the whole sequence
    n_state = len(c.inputs) - 1 - c.attr("num_scan_inputs")
    states = [c.tensor(i) for i in range(1, 1 + n_state)]
    xs = [c.tensor(i) for i in range(1 + n_state, len(c.inputs))]
    if c.has(0) and any(n != xs[0].shape[1] for n in c.ints(0)):
        raise NotImplementedError(f"{c.where}: sequences of different lengths (sequence_lens {c.ints(0)})")
    c.attrs.setdefault("scan_input_directions", c.attr("directions", [0] * len(xs)))
    rows = [_scan(c, [Value(tensor=s[b]) for s in states], [x[b] for x in xs]) for b in range(states[0].shape[0])]
    as_tensors = [[r if isinstance(r, Tensor) else Tensor(r, device=c.device) for r in row] for row in rows]
    return [Tensor.stack(*column) for column in zip(*as_tensors)]  # (the batch axis first again)


def _scan(c: NodeCall, states: list[Value], xs: list[Tensor]) -> list[Tensor | np.ndarray]:
    """Scan from opset 9 on: the body over slices of xs along their scan axes, carrying the states."""
    body = c.attr("body")
    n_scan, n_state = len(xs), len(states)
    in_axes = [normalize_axis(a, x.ndim, c) for a, x in zip(c.attr("scan_input_axes", [0] * n_scan), xs)]
    in_reverse = c.attr("scan_input_directions", [0] * n_scan)
    steps = xs[0].shape[in_axes[0]] if xs else 0
    if any(x.shape[a] != steps for x, a in zip(xs, in_axes)):
        raise ValueError(f"{c.where}: the scan inputs have different lengths along their scan axes")
    names = [vi.name for vi in body.input]
    per_step: list[list[Tensor]] = []
    for t in range(steps):
        bound = dict(zip(names[:n_state], states))
        for j, (x, a, rev) in enumerate(zip(xs, in_axes, in_reverse)):
            i = steps - 1 - t if rev else t
            bound[names[n_state + j]] = Value(tensor=x[(slice(None),) * a + (i,)])
        outs = c.run_graph(body, bound)
        states = outs[:n_state]
        per_step.append([v.tensor if v.tensor is not None else Tensor(v.host, device=c.device) for v in outs[n_state:]])
    n_out = c.n_outputs - n_state
    out_axes = c.attr("scan_output_axes", [0] * n_out)
    out_reverse = c.attr("scan_output_directions", [0] * n_out)
    stacked = []
    for k in range(n_out):
        column = [step[k] for step in per_step]
        if not column:
            raise NotImplementedError(f"{c.where}: scan outputs of a scan of no steps (their shape is unknown)")
        if out_reverse[k]:
            column = column[::-1]
        axis = normalize_axis(out_axes[k], column[0].ndim + 1, c)
        stacked.append(Tensor.stack(*column, dim=axis))
    return [*(_out(v) for v in states), *stacked]
