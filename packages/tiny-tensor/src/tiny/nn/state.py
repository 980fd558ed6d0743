"""Model state: finding a model's tensors, naming them, and reading and writing them to files.

A model is any Python object; its tensors are found by walking its attributes, lists, tuples and dicts.
Files: safetensors (read and written here, loaded lazily from the file mapped on the DISK device) and PyTorch
.pt/.pth checkpoints (read only, without torch and without running the pickle's code: only the names checkpoints
use are allowed).
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import pickle
import types
import zipfile
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from tiny.ir.device import Device
from tiny.tensor import DType, Tensor, dtypes

# ---------------------------------------------------------------- walking a model

# objects that hold no tensors: never looked inside
_LEAVES = (str, bytes, int, float, complex, bool, type(None), np.ndarray, type, types.ModuleType)
_LEAVES += (types.FunctionType, types.MethodType, types.BuiltinFunctionType)


def _walk(obj: Any, prefix: str, seen: set[int]) -> Iterator[tuple[str, Tensor]]:
    """(dotted name, tensor) for every tensor reachable from obj, each container visited once."""
    if isinstance(obj, Tensor):
        yield prefix, obj
        return
    if isinstance(obj, _LEAVES) or id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, (list, tuple)):
        items: Any = enumerate(obj)
    elif isinstance(obj, dict):
        items = obj.items()
    elif hasattr(obj, "__dict__"):
        items = vars(obj).items()
    else:
        return
    for key, value in items:
        yield from _walk(value, f"{prefix}.{key}" if prefix else str(key), seen)


def get_state_dict(obj: Any, prefix: str = "") -> dict[str, Tensor]:
    """Every tensor of obj by its dotted path, as PyTorch names them ("layers.0.weight").

    A tensor reachable by two paths appears under both names.

    >>> class Net:
    ...     def __init__(self): self.layers = [Tensor([1.0]), Tensor([2.0])]
    >>> list(get_state_dict(Net()))
    ['layers.0', 'layers.1']
    """
    return {prefix + name: t for name, t in _walk(obj, "", set())}


def get_parameters(obj: Any) -> list[Tensor]:
    """Every tensor reachable from obj (attributes, lists, tuples, dicts), each once, in the order found.

    >>> len(get_parameters({"w": (w := Tensor([1.0])), "again": [w], "b": Tensor([0.0])}))
    2
    """
    out: dict[int, Tensor] = {}
    for _, t in _walk(obj, "", set()):
        out.setdefault(id(t), t)
    return list(out.values())


@dataclass(frozen=True)
class LoadResult:
    """What load_state_dict left alone when strict=False."""

    missing: tuple[str, ...]  # names the model has and the state lacks
    unexpected: tuple[str, ...]  # names the state has and the model lacks


def load_state_dict(obj: Any, state: dict[str, Any], strict: bool = True) -> LoadResult:
    """Write the values of state into obj's tensors in place (cast to each tensor's dtype and device).

    strict (the default) refuses a state whose names differ from the model's; shapes must always match.
    Every problem is listed in one error.

    >>> w = Tensor([0.0, 0.0]); _ = load_state_dict({"w": w}, {"w": Tensor([1.0, 2.0])}); w.tolist()
    [1.0, 2.0]
    """
    model = get_state_dict(obj)
    missing = tuple(k for k in model if k not in state)
    unexpected = tuple(k for k in state if k not in model)
    problems = [
        f"  mis-shaped: {k!r}: the model expects shape {model[k].shape}, the state gives {_shape_of(state[k])}"
        for k in model
        if k in state and tuple(model[k].shape) != _shape_of(state[k])
    ]
    if strict:
        problems = [f"  missing: {k!r}" for k in missing] + [f"  unexpected: {k!r}" for k in unexpected] + problems
    if problems:
        raise RuntimeError("load_state_dict: the state does not fit the model:\n" + "\n".join(problems))
    for name, target in model.items():
        if name in state:
            _assign(target, state[name])
    return LoadResult(missing, unexpected)


def _shape_of(value: Any) -> tuple[int, ...]:
    return tuple(value.shape) if hasattr(value, "shape") else np.shape(value)


def _assign(target: Tensor, value: Any) -> None:
    source = value if isinstance(value, Tensor) else Tensor(np.asarray(value))
    source = source.to(target.device).cast(target.dtype)
    grad_flag = target.requires_grad
    target.requires_grad = None  # a leaf that requires grad refuses in-place writes; loading is not an op
    try:
        target.assign(source)
    finally:
        target.requires_grad = grad_flag


# ---------------------------------------------------------------- NumPy <-> Tensor, bfloat16 as raw bits


def _from_numpy(arr: np.ndarray, dtype: DType) -> Tensor:
    """A Tensor of dtype from arr; for bfloat16, arr holds the raw uint16 bit patterns."""
    if dtype == dtypes.bfloat16:
        widened = (np.asarray(arr, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        return Tensor(widened, dtype=dtypes.bfloat16)  # every bfloat16 is exact in float32: no rounding here
    return Tensor(np.asarray(arr, order="C"), dtype=dtype)  # the Tensor copies the (memory-mapped) bytes once


def _to_numpy(t: Tensor) -> np.ndarray:
    """t's values as a contiguous array; bfloat16 as its uint16 bit patterns."""
    arr = np.array(t.numpy(), order="C")  # (ascontiguousarray would make a 0-d array 1-d)
    if t.dtype == dtypes.bfloat16:
        return (arr.view(np.uint32) >> 16).astype(np.uint16)
    return arr


# ---------------------------------------------------------------- safetensors

# safetensors dtype name <-> (tiny dtype, NumPy dtype of the stored bytes)
_SAFE_DTYPES: dict[str, tuple[DType, np.dtype]] = {
    "F64": (dtypes.float64, np.dtype("<f8")),
    "F32": (dtypes.float32, np.dtype("<f4")),
    "F16": (dtypes.float16, np.dtype("<f2")),
    "BF16": (dtypes.bfloat16, np.dtype("<u2")),
    "I64": (dtypes.int64, np.dtype("<i8")),
    "I32": (dtypes.int32, np.dtype("<i4")),
    "I16": (dtypes.int16, np.dtype("<i2")),
    "I8": (dtypes.int8, np.dtype("i1")),
    "U64": (dtypes.uint64, np.dtype("<u8")),
    "U32": (dtypes.uint32, np.dtype("<u4")),
    "U16": (dtypes.uint16, np.dtype("<u2")),
    "U8": (dtypes.uint8, np.dtype("u1")),
    "BOOL": (dtypes.bool, np.dtype("?")),
}
_SAFE_NAME = {dt: name for name, (dt, _) in _SAFE_DTYPES.items()}
_HEADER_ALIGN = 8  # the data starts on an 8-byte boundary, as the reference writer pads it


def safe_save(state: dict[str, Tensor], path: str | os.PathLike, metadata: dict[str, str] | None = None) -> None:
    """Write tensors to a .safetensors file; metadata is a str -> str mapping stored in the header.

    >>> import tempfile; p = tempfile.mktemp(suffix=".safetensors")
    >>> safe_save({"w": Tensor([1.0, 2.0])}, p); safe_load(p)["w"].tolist()
    [1.0, 2.0]
    """
    for name, t in state.items():
        if not isinstance(name, str) or name == "__metadata__":
            raise ValueError(f"safe_save: tensor names must be strings other than '__metadata__', got {name!r}")
        if t.dtype not in _SAFE_NAME:
            raise TypeError(f"safe_save: {name!r} has dtype {t.dtype.name}, which safetensors cannot store")
    if metadata is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise TypeError("safe_save: metadata must map str to str")
    # widest items first, then by name: every tensor starts aligned to its own item size
    order = sorted(state, key=lambda n: (-state[n].dtype.itemsize, n))
    header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    blobs, offset = [], 0
    for name in order:
        data = _to_numpy(state[name]).astype(_SAFE_DTYPES[_SAFE_NAME[state[name].dtype]][1], copy=False).tobytes()
        header[name] = {
            "dtype": _SAFE_NAME[state[name].dtype],
            "shape": list(state[name].shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % _HEADER_ALIGN)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def safe_load_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The __metadata__ mapping of a .safetensors file ({} when it has none)."""
    header, _ = _safe_header(path)
    return header.get("__metadata__") or {}


def safe_load(path: str | os.PathLike, device: str | None = None) -> dict[str, Tensor]:
    """The tensors of a .safetensors file, loaded lazily: each is a view of the file, mapped on the DISK device,
    and is read when first used, straight from the file's pages into the memory of `device` (the default device
    when None) with no copy in between. `device="DISK"` keeps them on the file (copy them with `.to()`).

    >>> import tempfile; p = tempfile.mktemp(suffix=".safetensors")
    >>> safe_save({"n": Tensor([1, 2])}, p); safe_load(p)["n"].dtype
    dtypes.int64
    """
    header, data_start = _safe_header(path)
    size = os.path.getsize(path) - data_start
    raw = Tensor(pathlib.Path(path))
    keep = device is not None and device.upper() == "DISK"
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dt, _ = _safe_entry(path, name, entry, size)
        begin, end = entry["data_offsets"]
        t = raw[data_start + begin : data_start + end].bitcast(dt).reshape(entry["shape"])
        out[name] = t if keep else t.to(device if device is not None else Device.DEFAULT)
    return out


def safe_entries(path: str | os.PathLike) -> dict[str, tuple[DType, tuple[int, ...], int]]:
    """Each tensor of a .safetensors file, checked as safe_load checks it: its dtype, its shape, and the byte of the
    file where its data begins (for a reader of its bytes on the host)."""
    header, data_start = _safe_header(path)
    size = os.path.getsize(path) - data_start
    out = {}
    for name, entry in header.items():
        if name != "__metadata__":
            dt, _ = _safe_entry(path, name, entry, size)
            out[name] = (dt, tuple(entry["shape"]), data_start + entry["data_offsets"][0])
    return out


def _safe_header(path: str | os.PathLike) -> tuple[dict[str, Any], int]:
    """The parsed JSON header and the byte offset where the data starts."""
    file_size = os.path.getsize(path)
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise ValueError(
                f"{path}: not a safetensors file: {file_size} bytes, shorter than its 8-byte header length"
            )
        n = int.from_bytes(raw, "little")
        if n > file_size - 8:
            raise ValueError(f"{path}: not a safetensors file: header length {n} exceeds the file size {file_size}")
        text = f.read(n)
    try:
        header = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: the safetensors header is not valid JSON: {e}") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: the safetensors header is not a JSON object")
    return header, 8 + n


def _safe_entry(path: Any, name: str, entry: Any, size: int) -> tuple[DType, np.dtype]:
    """Check one header entry against the file; its tiny dtype and stored NumPy dtype."""
    where = f"{path}: tensor {name!r}"
    if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= entry.keys():
        raise ValueError(f"{where}: the header entry needs dtype, shape and data_offsets, got {entry!r}")
    if entry["dtype"] not in _SAFE_DTYPES:
        raise TypeError(f"{where}: dtype {entry['dtype']!r} is not supported; supported: {sorted(_SAFE_DTYPES)}")
    dt, npdt = _SAFE_DTYPES[entry["dtype"]]
    begin, end = entry["data_offsets"]
    want = math.prod(entry["shape"]) * npdt.itemsize
    if not 0 <= begin <= end <= size or end - begin != want:
        raise ValueError(
            f"{where}: data_offsets {[begin, end]} do not fit: shape {entry['shape']} of {entry['dtype']} needs "
            f"{want} bytes, and the data section has {size}"
        )
    return dt, npdt


# ---------------------------------------------------------------- PyTorch checkpoints

# torch's storage classes -> NumPy dtype of their bytes and tiny dtype
_TORCH_STORAGES: dict[str, tuple[np.dtype, DType]] = {
    "DoubleStorage": (np.dtype("f8"), dtypes.float64),
    "FloatStorage": (np.dtype("f4"), dtypes.float32),
    "HalfStorage": (np.dtype("f2"), dtypes.float16),
    "BFloat16Storage": (np.dtype("u2"), dtypes.bfloat16),
    "LongStorage": (np.dtype("i8"), dtypes.int64),
    "IntStorage": (np.dtype("i4"), dtypes.int32),
    "ShortStorage": (np.dtype("i2"), dtypes.int16),
    "CharStorage": (np.dtype("i1"), dtypes.int8),
    "ByteStorage": (np.dtype("u1"), dtypes.uint8),
    "BoolStorage": (np.dtype("?"), dtypes.bool),
}


@dataclass(frozen=True)
class _StorageType:
    """Stands in for torch.FloatStorage etc. in the pickle."""

    name: str


@dataclass(frozen=True)
class _Storage:
    """One storage of the checkpoint: a flat array and the dtype it holds."""

    array: np.ndarray
    dtype: DType


def _rebuild_tensor(storage: _Storage, offset: int, size: tuple[int, ...], stride: tuple[int, ...], *_: Any) -> Tensor:
    """torch._utils._rebuild_tensor_v2: a strided view of a storage, made contiguous."""
    flat = storage.array
    itemsize = flat.dtype.itemsize
    last = offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
    if all(size) and not 0 <= offset <= last < flat.size:
        raise ValueError(f"torch_load: a tensor of size {tuple(size)} reaches past its storage of {flat.size} items")
    view = np.lib.stride_tricks.as_strided(
        flat[offset:], shape=tuple(size), strides=tuple(s * itemsize for s in stride), writeable=False
    )
    return _from_numpy(np.array(view, order="C"), storage.dtype)


def _rebuild_parameter(data: Tensor, requires_grad: bool, *_: Any) -> Tensor:
    """torch._utils._rebuild_parameter: the tensor itself."""
    return data


# the only globals a checkpoint may name
_TORCH_GLOBALS: dict[tuple[str, str], Any] = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("collections", "OrderedDict"): OrderedDict,
    **{("torch", name): _StorageType(name) for name in _TORCH_STORAGES},
}


class _CheckpointUnpickler(pickle.Unpickler):
    """Unpickles a checkpoint's data.pkl, allowing only _TORCH_GLOBALS and reading storages from the zip."""

    def __init__(self, file: Any, archive: zipfile.ZipFile, root: str, path: Any) -> None:
        super().__init__(file)
        self.archive, self.root, self.path = archive, root, path
        self.storages: dict[str, _Storage] = {}
        self.big_endian = f"{root}byteorder" in archive.namelist() and archive.read(f"{root}byteorder") == b"big"

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _TORCH_GLOBALS:
            raise pickle.UnpicklingError(
                f"torch_load: {self.path} names {module}.{name}, which a tensor checkpoint has no use for; "
                "refusing to load it (only tensors, storages and OrderedDict are allowed)"
            )
        return _TORCH_GLOBALS[(module, name)]

    def persistent_load(self, pid: Any) -> _Storage:
        if not (isinstance(pid, tuple) and len(pid) >= 3 and pid[0] == "storage" and isinstance(pid[1], _StorageType)):
            raise pickle.UnpicklingError(f"torch_load: {self.path} has an unknown persistent id {pid!r}")
        key = str(pid[2])
        if key not in self.storages:
            npdt, dt = _TORCH_STORAGES[pid[1].name]
            entry = f"{self.root}data/{key}"
            try:
                raw = self.archive.read(entry)
            except KeyError:
                raise ValueError(f"torch_load: {self.path} lacks the storage {entry!r}") from None
            if len(raw) % npdt.itemsize:
                raise ValueError(f"torch_load: storage {entry!r} of {len(raw)} bytes is not whole {pid[1].name} items")
            arr = np.frombuffer(raw, dtype=npdt.newbyteorder(">" if self.big_endian else "<"))
            self.storages[key] = _Storage(arr.astype(npdt.newbyteorder("="), copy=False), dt)
        return self.storages[key]


def torch_load(path: str | os.PathLike) -> Any:
    """The contents of a PyTorch .pt/.pth checkpoint (torch.save's zip format), with tensors as tiny Tensors.

    torch is not imported and no code in the file runs: the pickle may name only tensor-rebuilding functions,
    storage types and collections.OrderedDict; anything else is refused with an UnpicklingError.
    """
    if not zipfile.is_zipfile(path):
        raise ValueError(
            f"torch_load: {path} is not a zip archive; only checkpoints written by torch.save since PyTorch 1.6 "
            "(the default zip format) can be read"
        )
    with zipfile.ZipFile(path) as archive:
        pickles = [n for n in archive.namelist() if n.endswith("data.pkl") and n.count("/") <= 1]
        if not pickles:
            raise ValueError(f"torch_load: {path} is a zip archive without a data.pkl: not a torch checkpoint")
        root = pickles[0][: -len("data.pkl")]
        with archive.open(pickles[0]) as f:
            return _CheckpointUnpickler(f, archive, root, path).load()
