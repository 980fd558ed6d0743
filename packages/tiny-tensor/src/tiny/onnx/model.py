"""Loading an ONNX model and running its graph as tiny tensor ops.

A value in the graph is a `Value`: a tiny Tensor, or a NumPy array known on the host (initializers, constants, shapes
and what a shape-computing subgraph makes of them). Host values feed Reshape, Slice, Expand and the like their
integers without running a kernel; they become tensors on the model's device when a tensor op reads them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import numpy_helper

from tiny.ir.device import Device
from tiny.ir.dtypes import DType, dtypes
from tiny.tensor import Tensor

# The newest ai.onnx opset whose operators tiny.onnx implements with their semantics at that version.
MAX_OPSET = 28
DEFAULT_DOMAINS = ("", "ai.onnx")

# ONNX's TensorProto element types that tiny has a dtype for (the others: strings, complex, 4- and 8-bit floats)
ONNX_DTYPES: dict[int, DType] = {
    onnx.TensorProto.FLOAT: dtypes.float32,
    onnx.TensorProto.DOUBLE: dtypes.float64,
    onnx.TensorProto.FLOAT16: dtypes.float16,
    onnx.TensorProto.BFLOAT16: dtypes.bfloat16,
    onnx.TensorProto.INT8: dtypes.int8,
    onnx.TensorProto.INT16: dtypes.int16,
    onnx.TensorProto.INT32: dtypes.int32,
    onnx.TensorProto.INT64: dtypes.int64,
    onnx.TensorProto.UINT8: dtypes.uint8,
    onnx.TensorProto.UINT16: dtypes.uint16,
    onnx.TensorProto.UINT32: dtypes.uint32,
    onnx.TensorProto.UINT64: dtypes.uint64,
    onnx.TensorProto.BOOL: dtypes.bool,
}


def onnx_dtype(code: int, where: str) -> DType:
    """tiny's dtype for an ONNX element type, or a clear error naming the type tiny lacks."""
    if code not in ONNX_DTYPES:
        name = onnx.TensorProto.DataType.Name(code) if code in onnx.TensorProto.DataType.values() else str(code)
        raise NotImplementedError(f"{where}: ONNX element type {name} has no tiny dtype")
    return ONNX_DTYPES[code]


@dataclass
class Value:
    """One value of the graph: a host array, a tensor, or both (the tensor made from the array once)."""

    host: np.ndarray | None = None
    tensor: Tensor | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.host.shape) if self.host is not None else tuple(self.tensor.shape)

    def numpy(self) -> np.ndarray:
        """The values on the host: the array known there, else the tensor realized and read (kept)."""
        if self.host is None:
            self.host = self.tensor.numpy()
        return self.host


@dataclass
class NodeCall:
    """What an op's implementation sees of one node: its attributes, its inputs and the opset in force."""

    node: onnx.NodeProto
    attrs: dict[str, Any]
    inputs: list[Value | None]
    opset: int
    device: str
    n_outputs: int
    # runs a subgraph (If's branches, Loop's body) with the values of the enclosing scope and given ones bound
    run_graph: Callable[[onnx.GraphProto, dict[str, Value]], list[Value]] | None = None

    @property
    def where(self) -> str:
        return f"{self.node.op_type} node {self.node.name!r}"

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    def has(self, i: int) -> bool:
        return i < len(self.inputs) and self.inputs[i] is not None

    def value(self, i: int) -> Value:
        if not self.has(i):
            raise ValueError(f"{self.where}: input {i} is required but was not given")
        return self.inputs[i]

    def tensor(self, i: int) -> Tensor:
        """Input i as a tensor on the model's device (made from its host array on first use)."""
        v = self.value(i)
        if v.tensor is None:
            v.tensor = to_tensor(v.host, self.device)
        return v.tensor

    def opt(self, i: int) -> Tensor | None:
        return self.tensor(i) if self.has(i) else None

    def host(self, i: int) -> np.ndarray:
        """Input i's values on the host: an array already known there, else the tensor is realized and read."""
        return self.value(i).numpy()

    def ints(self, i: int) -> list[int] | None:
        """An optional input of integers (axes, pads, a shape) as a list; None when it is absent."""
        return [int(x) for x in self.host(i).reshape(-1)] if self.has(i) else None

    def scalar(self, i: int, default: Any = None) -> Any:
        return self.host(i).reshape(-1)[0].item() if self.has(i) else default


def normalize_axis(axis: int, ndim: int, c: NodeCall) -> int:
    """An axis in [-ndim, ndim) as its place in [0, ndim), or a clear error naming the node."""
    if not -ndim <= axis < max(ndim, 1):
        raise ValueError(f"{c.where}: axis {axis} is out of range for a tensor of {ndim} dims")
    return axis % max(ndim, 1)


def same_dtype(c: NodeCall, *ts: Tensor) -> None:
    """The inputs an op requires to share one dtype do, or a clear error."""
    if len({t.dtype for t in ts}) > 1:
        raise ValueError(f"{c.where}: inputs must share one dtype, got {[t.dtype.name for t in ts]}")


def wrapped_index(index: Tensor, n: int) -> Tensor:
    """Indices into a dim of size n with the negative ones counted from its end, as int64."""
    return (index < 0).where(index + n, index).cast(dtypes.int64)


OpFn = Callable[[NodeCall], "Tensor | np.ndarray | tuple | list"]
OPS: dict[str, OpFn] = {}  # ONNX op type -> its tiny implementation (filled by tiny.onnx.ops and tiny.onnx.nn_ops)
HOST_OPS: dict[str, OpFn] = {}  # ops computed on the host with NumPy when every input is a small host array
SUBGRAPH_OPS = frozenset({"If", "Loop", "Scan"})  # the ops whose attributes hold graphs they run
HOST_LIMIT = 1024  # elements: a host input larger than this is no shape computation, and runs as a tensor op


def register(*names: str, host: bool = False) -> Callable[[OpFn], OpFn]:
    """Decorator: the function implements the named ONNX ops (host=True: on host arrays, see HOST_OPS)."""

    def add(fn: OpFn) -> OpFn:
        for name in names:
            (HOST_OPS if host else OPS)[name] = fn
        return fn

    return add


def to_tensor(array: np.ndarray, device: str) -> Tensor:
    """A host array as a tensor on the device; bfloat16 arrays (ml_dtypes', as onnx makes them) by their bits."""
    if array.dtype.name == "bfloat16":
        return Tensor(contiguous(array).view(np.uint16), device=device).bitcast(dtypes.bfloat16)
    if array.dtype.kind in "iubf" and array.dtype.itemsize <= 8:
        return Tensor(contiguous(array), device=device)
    raise NotImplementedError(f"an array of NumPy dtype {array.dtype} has no tiny dtype")


def contiguous(array: np.ndarray) -> np.ndarray:
    """The array in row-major order (np.ascontiguousarray would make a 0-d array 1-d)."""
    return array if array.flags.c_contiguous else array.copy()


def _attribute(attr: onnx.AttributeProto, where: str) -> Any:
    if attr.type == onnx.AttributeProto.GRAPH:
        return attr.g
    if attr.type == onnx.AttributeProto.GRAPHS:
        raise NotImplementedError(f"{where}: attribute {attr.name!r} is a list of subgraphs")
    if attr.ref_attr_name:
        raise NotImplementedError(f"{where}: attribute {attr.name!r} refers to a function's attribute")
    value = onnx.helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, list) and value and isinstance(value[0], bytes):
        return [v.decode() for v in value]
    return value


@dataclass
class OnnxModel:
    """A loaded ONNX model: call it with {input name: NumPy array or Tensor} for {output name: Tensor}.

    >>> import onnx, numpy as np
    >>> from onnx import helper, TensorProto
    >>> g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
    ...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
    ...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    >>> load(helper.make_model(g))({"x": np.array([-1.0, 2.0], np.float32)})["y"].tolist()
    [0.0, 2.0]
    """

    model: onnx.ModelProto
    device: str
    opset: int
    initializers: dict[str, np.ndarray] = field(repr=False)
    input_names: list[str] = field(default_factory=list)
    output_names: list[str] = field(default_factory=list)

    def __call__(self, inputs: Mapping[str, np.ndarray | Tensor]) -> dict[str, Tensor]:
        env: dict[str, Value] = {name: Value(host=arr) for name, arr in self.initializers.items()}
        missing = [n for n in self.input_names if n not in inputs]
        unknown = [n for n in inputs if n not in self.input_names and n not in self.initializers]
        if missing or unknown:
            raise ValueError(f"model inputs are {self.input_names}; missing {missing}, unknown {unknown}")
        for vi in self.model.graph.input:
            if vi.name in inputs:
                env[vi.name] = self._input(vi, inputs[vi.name])
        for node in self.model.graph.node:
            self._run_node(node, env)
        out = {}
        for name in self.output_names:
            v = env[name]
            out[name] = v.tensor if v.tensor is not None else to_tensor(v.host, self.device)
        return out

    def _input(self, vi: onnx.ValueInfoProto, given: np.ndarray | Tensor) -> Value:
        t = given if isinstance(given, Tensor) else to_tensor(np.asarray(given), self.device)
        if t.device != self.device:
            t = t.to(self.device)
        ttype = vi.type.tensor_type
        if ttype.elem_type in ONNX_DTYPES and t.dtype != ONNX_DTYPES[ttype.elem_type]:
            raise ValueError(f"input {vi.name!r} must be {ONNX_DTYPES[ttype.elem_type].name}, got {t.dtype.name}")
        if ttype.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else None for d in ttype.shape.dim]
            if len(dims) != t.ndim or any(d is not None and d != s for d, s in zip(dims, t.shape)):
                shown = tuple(d if d is not None else "?" for d in dims)
                raise ValueError(f"input {vi.name!r} must have shape {shown}, got {tuple(t.shape)}")
        return Value(tensor=t)

    def _run_graph(self, graph: onnx.GraphProto, env: dict[str, Value]) -> list[Value]:
        """A subgraph's outputs, its nodes run in a scope of their own over `env` (the enclosing values and the
        ones the caller binds); its initializers are host arrays like the model's."""
        scope = dict(env)
        scope.update({init.name: Value(host=numpy_helper.to_array(init)) for init in graph.initializer})
        for node in graph.node:
            self._run_node(node, scope)
        return [scope[vi.name] for vi in graph.output]

    def _run_node(self, node: onnx.NodeProto, env: dict[str, Value]) -> None:
        where = f"{node.op_type} node {node.name!r}"
        inputs: list[Value | None] = []
        for name in node.input:
            if name and name not in env:
                raise ValueError(f"{where}: input {name!r} is not computed by any earlier node")
            inputs.append(env[name] if name else None)
        attrs = {a.name: _attribute(a, where) for a in node.attribute}
        run_graph = (
            (lambda graph, bound: self._run_graph(graph, {**env, **bound})) if node.op_type in SUBGRAPH_OPS else None
        )
        call = NodeCall(node, attrs, inputs, self.opset, self.device, len(node.output), run_graph)
        host_fn = HOST_OPS.get(node.op_type)
        given = [v for v in inputs if v is not None]
        if host_fn is not None and all(v.host is not None and v.host.size <= HOST_LIMIT for v in given):
            result = host_fn(call)
        else:
            result = OPS[node.op_type](call)
        results = list(result) if isinstance(result, (tuple, list)) else [result]
        for name, r in zip(node.output, results):
            if name:
                env[name] = Value(host=np.asarray(r)) if isinstance(r, (np.ndarray, np.generic)) else Value(tensor=r)
        for name in node.output[len(results) :]:
            if name:
                raise NotImplementedError(f"{where}: output {name!r} (output {len(results)}) is not computed")


def load(model: str | os.PathLike | bytes | onnx.ModelProto, device: str | None = None) -> OnnxModel:
    """Parse an ONNX model (a path, its bytes or a ModelProto) and check that tiny can run it.

    Raises ValueError for a file that is no valid model, NotImplementedError for an opset newer than MAX_OPSET,
    an operator domain or op type tiny.onnx lacks (named with its node), or an element type tiny has no dtype for.
    """
    proto = _parse(model)
    opset = 0
    for imp in proto.opset_import:
        if imp.domain in DEFAULT_DOMAINS:
            opset = imp.version
    if opset > MAX_OPSET:
        raise NotImplementedError(
            f"the model needs ai.onnx opset {opset}; tiny.onnx implements opsets up to {MAX_OPSET}"
        )
    if opset == 0:
        raise ValueError("the model imports no ai.onnx opset (opset_import names no default domain)")
    for node in _all_nodes(proto.graph):
        where = f"{node.op_type} node {node.name!r}"
        if node.domain not in DEFAULT_DOMAINS:
            raise NotImplementedError(f"{where}: operator domain {node.domain!r} is not implemented (only ai.onnx)")
        if node.op_type not in OPS:
            raise NotImplementedError(f"{where}: ONNX op {node.op_type!r} is not implemented by tiny.onnx")
    try:  # (after the checks above, which say more plainly what tiny lacks than the checker does)
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as e:
        raise ValueError(f"not a valid ONNX model: {str(e).splitlines()[0]}") from None
    for vi in [*proto.graph.input, *proto.graph.output]:
        which = vi.type.WhichOneof("value")
        if which != "tensor_type":
            raise NotImplementedError(f"graph value {vi.name!r} is a {which}; tiny.onnx takes tensors only")
        onnx_dtype(vi.type.tensor_type.elem_type, f"graph value {vi.name!r}")
    initializers = {init.name: numpy_helper.to_array(init) for init in proto.graph.initializer}
    for name, arr in initializers.items():
        if arr.dtype.kind not in "iubf" and arr.dtype.name != "bfloat16":
            raise NotImplementedError(f"initializer {name!r} has NumPy dtype {arr.dtype}, which tiny has no dtype for")
    dev = Device.canonicalize(device) if device is not None else Device.DEFAULT
    Device[dev]  # (opened now: a device that cannot start says why here, not at the first input)
    inputs = [vi.name for vi in proto.graph.input if vi.name not in initializers]
    outputs = [vi.name for vi in proto.graph.output]
    return OnnxModel(proto, dev, opset, initializers, inputs, outputs)


def _all_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The graph's nodes and those of every subgraph inside them."""
    nodes = []
    for node in graph.node:
        nodes.append(node)
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                nodes += _all_nodes(attr.g)
    return nodes


def _parse(model: str | os.PathLike | bytes | onnx.ModelProto) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, bytes):
        data, what = model, "the bytes given"
    elif isinstance(model, (str, os.PathLike)):
        if not os.path.isfile(model):
            raise ValueError(f"{os.fspath(model)}: no such file")
        try:
            proto = onnx.load(os.fspath(model))
        except (DecodeError, RuntimeError, ValueError) as e:
            raise ValueError(f"{os.fspath(model)}: not an ONNX model ({type(e).__name__}: {e})") from None
        if not proto.graph.node and not proto.graph.output:
            raise ValueError(f"{os.fspath(model)}: not an ONNX model (it has no graph)")
        return proto
    else:
        raise TypeError(f"load() takes a path, bytes or an onnx.ModelProto, got {type(model).__name__}")
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except DecodeError as e:
        raise ValueError(f"{what}: not an ONNX model ({e})") from None
    return proto
