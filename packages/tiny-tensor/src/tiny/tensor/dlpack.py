"""The DLPack protocol in ctypes: the C structs of dlpack.h, the capsules that carry them, and the map between
DLPack's device and dtype codes and tiny's. Tensor.__dlpack__ and Tensor.from_dlpack (tiny.tensor.interop) use it."""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass
from typing import Any

from tiny.ir.device import Buffer, DeviceName
from tiny.ir.dtypes import DType, dtypes

# ---------------------------------------------------------------- the structs of dlpack.h


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),  # in elements; NULL: compact, row-major
        ("byte_offset", ctypes.c_uint64),
    ]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)  # void (*deleter)(DLManagedTensor[Versioned] *self)


class DLManagedTensor(ctypes.Structure):  # DLPack before 1.0: capsule "dltensor"
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class DLManagedTensorVersioned(ctypes.Structure):  # DLPack 1.0: capsule "dltensor_versioned"
    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


VERSION = (1, 0)  # the DLPack version tiny makes and reads
FLAG_READ_ONLY = 1 << 0
NAME, USED_NAME = b"dltensor", b"used_dltensor"
NAME_VERSIONED, USED_NAME_VERSIONED = b"dltensor_versioned", b"used_dltensor_versioned"

# device types (DLDeviceType) by the base name of a tiny device, and back
DEVICE_TYPES = {"CPU": 1, "CUDA": 2}
DEVICE_NAMES = {code: base for base, code in DEVICE_TYPES.items()}
# (type code, bits): kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4, kDLBool 6
DTYPES: dict[tuple[int, int], DType] = {
    (2, 16): dtypes.float16,
    (2, 32): dtypes.float32,
    (2, 64): dtypes.float64,
    (4, 16): dtypes.bfloat16,
    (0, 8): dtypes.int8,
    (0, 16): dtypes.int16,
    (0, 32): dtypes.int32,
    (0, 64): dtypes.int64,
    (1, 8): dtypes.uint8,
    (1, 16): dtypes.uint16,
    (1, 32): dtypes.uint32,
    (1, 64): dtypes.uint64,
    (6, 8): dtypes.bool,
}
CODES = {dt: code for code, dt in DTYPES.items()}
_CODE_NAMES = {0: "int", 1: "uint", 2: "float", 3: "opaque handle", 4: "bfloat", 5: "complex", 6: "bool"}


def device_of(device: str) -> tuple[int, int]:
    """The (DLDeviceType, device id) of a tiny device, or a ValueError that says which devices have one."""
    name = DeviceName.parse(device)
    if name.base not in DEVICE_TYPES:
        raise ValueError(
            f"DLPack has no device type for tiny's {device}; expected a tensor on {' or '.join(DEVICE_TYPES)} "
            "(.to('CPU') first)"
        )
    return DEVICE_TYPES[name.base], name.index


def tiny_device(device_type: int, device_id: int) -> str:
    """The tiny device of a DLPack (device type, id)."""
    if device_type not in DEVICE_NAMES:
        names = ", ".join(f"{code} ({base})" for code, base in DEVICE_NAMES.items())
        raise ValueError(f"tiny takes DLPack tensors of device type {names}, got device type {device_type}")
    base = DEVICE_NAMES[device_type]
    return base if base == "CPU" else f"{base}:{device_id}"


def dtype_of(dtype: DLDataType) -> DType:
    key = (dtype.code, dtype.bits)
    if dtype.lanes != 1 or key not in DTYPES:
        given = f"{_CODE_NAMES.get(dtype.code, f'code {dtype.code}')}{dtype.bits}" + (
            f" x{dtype.lanes}" if dtype.lanes != 1 else ""
        )
        raise TypeError(f"DLPack dtype {given} has no tiny dtype; tiny takes {', '.join(d.name for d in CODES)}")
    return DTYPES[key]


# ---------------------------------------------------------------- the C API of capsules

_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
# the C strings of capsule names: they must outlive every capsule that is named by them
_C_NAMES = {n: ctypes.c_char_p(n) for n in (NAME, USED_NAME, NAME_VERSIONED, USED_NAME_VERSIONED)}


# ---------------------------------------------------------------- export: tiny memory -> a capsule


@dataclass
class _Export:
    """What a capsule tiny made keeps alive: the struct, its shape and strides, and the buffer."""

    managed: DLManagedTensor | DLManagedTensorVersioned
    shape: ctypes.Array
    strides: ctypes.Array
    buffer: Buffer


_EXPORTS: dict[int, _Export] = {}  # each live export by its managed struct's address (its manager_ctx)
# each capsule no consumer has taken yet, by its struct's address. A capsule has no destructor: one written in Python
# (a ctypes callback) breaks when a consumer drops the capsule with an exception set (NumPy refusing a bfloat16), as
# CPython refuses a call that returns with an exception pending. Instead tiny holds each capsule it made, and at the
# next export forgets the taken ones (the consumer calls the deleter) and releases those only tiny still holds.
_UNTAKEN: dict[int, Any] = {}


def _release(address: int) -> None:
    _EXPORTS.pop(address, None)  # the buffer goes with the last reference (its own __del__ frees it)


@DELETER
def _deleter(managed: int) -> None:  # the consumer is done with the memory
    _release(managed)


def sweep() -> None:
    """Forget the capsules a consumer took; release the exports of those that nobody but tiny holds."""
    for address in list(_UNTAKEN):
        capsule = _UNTAKEN[address]
        taken = not (_api.PyCapsule_IsValid(capsule, NAME) or _api.PyCapsule_IsValid(capsule, NAME_VERSIONED))
        del capsule
        if taken:
            del _UNTAKEN[address]
        elif sys.getrefcount(_UNTAKEN[address]) == 2:  # (the table's reference and getrefcount's argument)
            del _UNTAKEN[address]
            _release(address)


_DELETER_ADDRESS = ctypes.cast(_deleter, ctypes.c_void_p).value


def export(buffer: Buffer, shape: tuple[int, ...], versioned: bool, read_only: bool = False) -> Any:
    """A DLPack capsule over the whole of `buffer` (contiguous, of `shape`), that keeps it alive until the consumer
    calls the deleter (or the capsule dies unconsumed)."""
    device_type, device_id = device_of(buffer.device)
    dims = (ctypes.c_int64 * max(len(shape), 1))(*shape)
    strides = (ctypes.c_int64 * max(len(shape), 1))()
    step = 1
    for i in reversed(range(len(shape))):
        strides[i], step = step, step * max(shape[i], 1)
    code, bits = CODES[buffer.dtype]
    data = buffer.address if buffer.size else 0
    tensor = DLTensor(data, DLDevice(device_type, device_id), len(shape), DLDataType(code, bits, 1), dims, strides, 0)
    if versioned:
        flags = FLAG_READ_ONLY if read_only else 0
        managed: Any = DLManagedTensorVersioned(DLPackVersion(*VERSION), None, _DELETER_ADDRESS, flags, tensor)
    else:
        managed = DLManagedTensor(tensor, None, _DELETER_ADDRESS)
    address = ctypes.addressof(managed)
    managed.manager_ctx = address
    _EXPORTS[address] = _Export(managed, dims, strides, buffer)
    sweep()
    capsule = _api.PyCapsule_New(address, _C_NAMES[NAME_VERSIONED if versioned else NAME], None)
    _UNTAKEN[address] = capsule
    return capsule


# ---------------------------------------------------------------- import: a capsule -> tiny memory


@dataclass(frozen=True)
class Imported:
    """A consumed capsule's tensor: where its data is and how it is laid out (strides in elements)."""

    device: str
    dtype: DType
    data: int  # the address of element 0 (data + byte_offset)
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    owner: _Owner  # calls the producer's deleter when the last tiny buffer over the memory dies


class _Owner:
    """Holds a consumed DLManagedTensor until tiny is done with its memory, then calls its deleter."""

    __slots__ = ("managed", "deleter")

    def __init__(self, managed: int, deleter: int) -> None:
        self.managed, self.deleter = managed, deleter

    def __del__(self) -> None:
        if self.deleter:
            DELETER(self.deleter)(self.managed)
            self.deleter = 0


def consume(capsule: Any) -> Imported:
    """Take the tensor of a DLPack capsule (versioned or not): rename the capsule as used, and hand its deleter to
    an owner that calls it when the owner dies."""
    versioned = bool(_api.PyCapsule_IsValid(capsule, NAME_VERSIONED))
    if not versioned and not _api.PyCapsule_IsValid(capsule, NAME):
        raise TypeError(
            f"__dlpack__() must return a PyCapsule named 'dltensor' or 'dltensor_versioned', got {capsule!r} "
            "(a capsule already consumed is named 'used_dltensor')"
        )
    name = NAME_VERSIONED if versioned else NAME
    address = _api.PyCapsule_GetPointer(capsule, _C_NAMES[name])
    struct = DLManagedTensorVersioned if versioned else DLManagedTensor
    managed = struct.from_address(address)
    if versioned and managed.version.major != VERSION[0]:
        raise ValueError(f"a DLPack {managed.version.major}.{managed.version.minor} tensor; tiny reads DLPack 1.x")
    _api.PyCapsule_SetName(capsule, _C_NAMES[USED_NAME_VERSIONED if versioned else USED_NAME])
    owner = _Owner(address, managed.deleter or 0)  # from here on the deleter is called, whatever fails below
    tensor = managed.dl_tensor
    dtype = dtype_of(tensor.dtype)
    device = tiny_device(tensor.device.device_type, tensor.device.device_id)
    shape = tuple(tensor.shape[i] for i in range(tensor.ndim))
    if tensor.strides:
        strides = tuple(tensor.strides[i] for i in range(tensor.ndim))
    else:
        strides, step = [0] * tensor.ndim, 1
        for i in reversed(range(tensor.ndim)):
            strides[i], step = step, step * shape[i]
        strides = tuple(strides)
    data = (tensor.data or 0) + tensor.byte_offset
    return Imported(device, dtype, data, shape, strides, owner)
