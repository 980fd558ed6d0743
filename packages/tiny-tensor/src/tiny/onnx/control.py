"""ONNX's control flow (If, Loop) over tiny tensors: the condition and the trip count are read on the host, and the
chosen branch or every iteration of the body is run as tiny ops (a loop is unrolled into the lazy graph)."""

from __future__ import annotations

import numpy as np

from tiny.onnx.model import NodeCall, Value, register
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
