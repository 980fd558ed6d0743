"""Zero-copy interop: a tensor over memory someone else owns (from_blob), and DLPack both ways (__dlpack__,
__dlpack_device__, from_dlpack), so that NumPy and PyTorch share memory with tiny without a copy."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tiny.ir.device import Device, buffer_of, new_buffer, new_foreign_buffer
from tiny.ir.dtypes import DType, to_dtype
from tiny.ir.uop import Ops, UOp
from tiny.tensor import dlpack
from tiny.tensor.base import TensorBase

if TYPE_CHECKING:
    from tiny.tensor.tensor import Tensor


class InteropOps(TensorBase):
    __slots__ = ()

    @classmethod
    def from_blob(
        cls, ptr: int, shape: Sequence[int], dtype: DType | str, device: str | None = None, owner: Any = None
    ) -> Tensor:
        """A tensor over the memory at address `ptr` that the caller owns, without a copy: a write on one side is
        seen on the other. The memory holds the elements of `shape` contiguously (row-major) and must outlive the
        tensor, or `owner` (any object: kept alive as long as the tensor's buffer) must keep it alive. `device`
        (default: the default device) must be one whose allocator can wrap foreign memory (CPU: a host address;
        CUDA: a device pointer of that GPU).

        >>> import numpy as np; a = np.zeros(4, dtype=np.float32)
        >>> t = Tensor.from_blob(a.ctypes.data, (2, 2), dtype="float32", device="CPU", owner=a)
        >>> a[0] = 7.0; t.tolist()
        [[7.0, 0.0], [0.0, 0.0]]
        """
        if not isinstance(ptr, int) or isinstance(ptr, bool):
            raise TypeError(f"from_blob takes the address as an int (ptr=), got {type(ptr).__name__}")
        if ptr == 0:
            raise ValueError("from_blob got a null pointer (ptr=0); expected the address of memory the caller owns")
        if isinstance(shape, int):
            shape = (shape,)
        if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
            raise ValueError(f"from_blob takes a shape of non-negative ints, got {tuple(shape)!r}")
        dt = to_dtype(dtype)
        dev = Device.canonicalize(device) if device is not None else Device.DEFAULT
        size = math.prod(shape)
        node = new_foreign_buffer(dev, ptr, size, dt, owner)
        return cls._from_node(UOp(Ops.RESHAPE, dt, (node,), tuple(shape)))

    @classmethod
    def from_dlpack(cls, obj: Any) -> Tensor:
        """A tensor over the memory of `obj`, anything with `__dlpack__` (a NumPy array, a torch tensor ...), without
        a copy: a write on one side is seen on the other, and `obj`'s memory stays alive as long as the tensor's
        buffer, also after `obj` is deleted. A strided producer (a slice, a transpose) becomes a view of tiny's
        movement ops over its memory; strides that movement ops cannot express (overlapping rows) are a ValueError.

        >>> import numpy as np; a = np.arange(6.0).reshape(2, 3)
        >>> t = Tensor.from_dlpack(a[:, ::2]); a[1, 2] = 9.0; t.tolist()
        [[0.0, 2.0], [3.0, 9.0]]
        """
        if not hasattr(obj, "__dlpack__"):
            raise TypeError(
                f"from_dlpack takes an object with __dlpack__ (a NumPy array, a torch tensor), got {type(obj).__name__}"
            )
        device_type, _ = obj.__dlpack_device__() if hasattr(obj, "__dlpack_device__") else (1, 0)
        stream = None if device_type == dlpack.DEVICE_TYPES["CPU"] else 1  # CUDA: the legacy default stream
        try:
            capsule = obj.__dlpack__(stream=stream, max_version=dlpack.VERSION)
        except TypeError:  # a producer from before DLPack 1.0 (no max_version)
            capsule = obj.__dlpack__(stream=stream)
        return cls._strided(dlpack.consume(capsule))

    def __dlpack_device__(self) -> tuple[int, int]:
        """The DLPack (device type, device id) of this tensor's memory: (1, 0) for CPU, (2, index) for CUDA.

        >>> Tensor([1.0]).__dlpack_device__()
        (1, 0)
        """
        return dlpack.device_of(self.device)

    def __dlpack__(
        self,
        *,
        stream: int | Any | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        """A DLPack capsule over this tensor's memory, for `np.from_dlpack(t)` and `torch.from_dlpack(t)`: no copy,
        the consumer sees tiny's writes and tiny sees the consumer's. A lazy tensor is realized first; a tensor that
        is not contiguous in memory (a permute, a slice) realizes a contiguous copy, which then is this tensor's
        memory. `max_version` (the consumer's newest DLPack) picks a 1.0 capsule where it is (1, x), else the older
        one; `stream` is ignored on CPU, and on CUDA the device is synchronized first; `copy=True` exports a copy.

        >>> import numpy as np; t = Tensor([1.0, 2.0]).realize(); a = np.from_dlpack(t); a[0] = 5.0; t.tolist()
        [5.0, 2.0]
        """
        here = self.__dlpack_device__()  # (a device DLPack has no type for: a ValueError that says so)
        if dl_device is not None and tuple(dl_device) != here:
            raise BufferError(
                f"__dlpack__(dl_device={dl_device}): this tensor is on {self.device} ({here}); copy it there first"
            )
        source = self._new(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,))) if copy else self
        source.realize()  # type: ignore[attr-defined]
        buffer = buffer_of(source.uop if source.uop.op is Ops.BUFFER else source.uop.src[0])
        if not buffer.allocator.caps.foreign:
            raise BufferError(
                f"{self.device} does not tell where its memory is (its allocator does not declare "
                "AllocatorCaps.foreign): .to('CPU') first"
            )
        Device[self.device].synchronize()
        versioned = max_version is not None and max_version[0] >= dlpack.VERSION[0]
        return dlpack.export(buffer, self.shape, versioned)

    @classmethod
    def _from_node(cls, uop: UOp) -> Tensor:
        return cls(uop)  # type: ignore[return-value]

    @classmethod
    def _strided(cls, got: dlpack.Imported) -> Tensor:
        """A tensor over an imported tensor's memory: a BUFFER over the elements it spans, reshaped when they are
        contiguous, else the movement ops that index them as its strides do."""
        shape, item = got.shape, got.dtype.itemsize
        if math.prod(shape) == 0:  # no memory to share
            return cls._from_node(UOp(Ops.RESHAPE, got.dtype, (new_buffer(got.device, 0, got.dtype),), shape))
        strides = [0 if n == 1 else s for n, s in zip(shape, got.strides)]  # (a dim of one: its stride is moot)
        lo = sum(s * (n - 1) for n, s in zip(shape, strides) if s < 0)
        span = sum(abs(s) * (n - 1) for n, s in zip(shape, strides)) + 1
        node = new_foreign_buffer(got.device, got.data + lo * item, span, got.dtype, got.owner)
        if span == math.prod(shape) and strides == [s if n > 1 else 0 for n, s in zip(shape, _row_major(shape))]:
            return cls._from_node(UOp(Ops.RESHAPE, got.dtype, (node,), shape))
        dims = sorted((d for d, s in enumerate(strides) if s != 0), key=lambda d: -abs(strides[d]))
        extent = 1  # of the dims inside the one looked at: from the innermost out, each must fit the stride above it
        for inner, outer in zip(dims[::-1], dims[-2::-1]):
            extent += abs(strides[inner]) * (shape[inner] - 1)
            if abs(strides[outer]) < extent:
                raise ValueError(
                    f"from_dlpack: strides {got.strides} (elements) of shape {shape} interleave dims; tiny views "
                    "memory through reshape, pad, shrink, flip, permute and expand only: pass a contiguous copy"
                )
        t = cls._from_node(UOp(Ops.RESHAPE, got.dtype, (node,), (span,)))
        if dims:  # the memory as rows of the outermost stride, each inner dim cut out of the row of the one above
            n, step = shape[dims[0]], abs(strides[dims[0]])
            t = t.pad(((0, n * step - span),)).reshape(n, step)
            for d in dims[1:]:
                n, step = shape[d], abs(strides[d])
                t = t.pad((*[(0, 0)] * (t.ndim - 1), (0, n * step - t.shape[-1])))  # (negative: crops)
                t = t.reshape(*t.shape[:-1], n, step)
            t = t.shrink((*[None] * (t.ndim - 1), (0, 1))).reshape(t.shape[:-1])
            t = t.permute(*sorted(range(len(dims)), key=lambda i: dims[i]))  # back to the producer's order
        t = t.reshape(tuple(n if strides[d] != 0 else 1 for d, n in enumerate(shape))).expand(shape)
        flips = [d for d, s in enumerate(strides) if s < 0]
        return t.flip(flips) if flips else t


def _row_major(shape: tuple[int, ...]) -> list[int]:
    strides, step = [0] * len(shape), 1
    for i in reversed(range(len(shape))):
        strides[i], step = step, step * shape[i]
    return strides
