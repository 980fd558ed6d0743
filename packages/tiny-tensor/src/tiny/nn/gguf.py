"""GGUF files (llama.cpp's model format): reading the metadata and the tensors, dequantized to float32 on the host
or kept as stored on the device and dequantized by the kernels that read them.

Layout (little-endian): "GGUF", uint32 version (2 or 3), uint64 tensor count, uint64 key/value count, the
key/value pairs, one info record per tensor (name, dims innermost first, ggml type, offset into the data),
padding to the alignment (`general.alignment`, 32 by default), then the tensor data.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Mapping, Sequence

import numpy as np

from tiny.ir.device import Device
from tiny.ir.dtypes import dtypes
from tiny.ir.schedule import layout
from tiny.tensor import Tensor
from tiny.tensor.byte_blocks import ByteBlocks
from tiny.tensor.functional import Q8_ACTIVATIONS
from tiny.tensor.weight_forms import STORED, Panels, register

_MAGIC = b"GGUF"
_VERSIONS = (2, 3)
_DEFAULT_ALIGNMENT = 32

# ---------------------------------------------------------------- metadata value types

_STRING, _ARRAY, _BOOL = 8, 9, 7
_SCALARS: dict[int, np.dtype] = {
    0: np.dtype("<u1"),
    1: np.dtype("<i1"),
    2: np.dtype("<u2"),
    3: np.dtype("<i2"),
    4: np.dtype("<u4"),
    5: np.dtype("<i4"),
    6: np.dtype("<f4"),
    10: np.dtype("<u8"),
    11: np.dtype("<i8"),
    12: np.dtype("<f8"),
}

# ---------------------------------------------------------------- ggml tensor types

_GGML_NAMES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1", 10: "Q2_K",
    11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS",
    19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32",
    27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16",
}  # fmt: skip


class _Reader:
    """A cursor over the file's bytes that says where a truncated file ended."""

    def __init__(self, data: np.ndarray, path: str) -> None:
        self.data, self.path, self.pos = data, path, 0

    def take(self, n: int, what: str) -> np.ndarray:
        if self.pos + n > len(self.data):
            raise ValueError(
                f"GGUF file {self.path!r} is truncated: reading {what} needs {n} bytes at offset {self.pos}, "
                f"but the file has {len(self.data)} bytes"
            )
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def scalar(self, dtype: np.dtype, what: str) -> int | float:
        return self.take(dtype.itemsize, what).view(dtype)[0].item()

    def u32(self, what: str) -> int:
        return int(self.scalar(np.dtype("<u4"), what))

    def u64(self, what: str) -> int:
        return int(self.scalar(np.dtype("<u8"), what))

    def string(self, what: str) -> str:
        n = self.u64(f"the length of {what}")
        return self.take(n, what).tobytes().decode("utf-8")

    def value(self, vtype: int, what: str) -> object:
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype], what)
        if vtype == _BOOL:
            return bool(self.take(1, what)[0])
        if vtype == _STRING:
            return self.string(what)
        if vtype == _ARRAY:
            item_type = self.u32(f"the item type of {what}")
            n = self.u64(f"the length of {what}")
            if item_type in _SCALARS:  # read numeric arrays in one go
                dtype = _SCALARS[item_type]
                return self.take(n * dtype.itemsize, what).view(dtype).tolist()
            return [self.value(item_type, f"{what}[{i}]") for i in range(n)]
        raise ValueError(f"GGUF file {self.path!r}: {what} has unknown value type {vtype}")


# ---------------------------------------------------------------- dequantization (raw bytes -> float32)


def _f16(raw: np.ndarray) -> np.ndarray:
    """Reinterpret (..., 2) bytes as float16 widened to float32, shape (..., 1)."""
    return np.ascontiguousarray(raw).view("<f2").astype(np.float32)


def _dequant_f32(raw: np.ndarray) -> np.ndarray:
    return raw.view("<f4").astype(np.float32, copy=False)


def _dequant_f16(raw: np.ndarray) -> np.ndarray:
    return raw.view("<f2").astype(np.float32)


def _dequant_bf16(raw: np.ndarray) -> np.ndarray:
    """The top 16 bits of a float32; the low 16 are 0."""
    return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)


def _dequant_q8_0(raw: np.ndarray) -> np.ndarray:
    """Blocks of 32: f16 scale d, 32 int8 q; value = d * q."""
    blocks = raw.reshape(-1, 34)
    d = _f16(blocks[:, :2])
    q = blocks[:, 2:].view(np.int8).astype(np.float32)
    return (d * q).reshape(-1)


def _dequant_q4_0(raw: np.ndarray) -> np.ndarray:
    """Blocks of 32: f16 scale d, 16 bytes whose low nibbles are elements 0..15, high 16..31; value = d*(q-8)."""
    blocks = raw.reshape(-1, 18)
    d = _f16(blocks[:, :2])
    qs = blocks[:, 2:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32) - 8.0
    return (d * q).reshape(-1)


def _q4_k_scales_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 12 bytes of 6-bit scales and mins of a Q4_K super-block -> (n, 8) scales, (n, 8) mins.

    Sub-blocks 0..3: scale = low 6 bits of byte j, min = low 6 bits of byte j+4.
    Sub-blocks 4..7: scale = low nibble of byte j+4 | (top 2 bits of byte j-4) << 4,
                     min = high nibble of byte j+4 | (top 2 bits of byte j) << 4.
    """
    p = packed.astype(np.uint8)
    low_scales, low_mins, tail = p[:, 0:4], p[:, 4:8], p[:, 8:12]
    scales = np.concatenate([low_scales & 63, (tail & 0x0F) | ((low_scales >> 6) << 4)], axis=1)
    mins = np.concatenate([low_mins & 63, (tail >> 4) | ((low_mins >> 6) << 4)], axis=1)
    return scales.astype(np.float32), mins.astype(np.float32)


def _dequant_q4_k(raw: np.ndarray) -> np.ndarray:
    """Super-blocks of 256: f16 d, f16 dmin, 12 bytes of scales/mins, 128 bytes of nibbles.

    The nibbles come in 4 chunks of 32 bytes; chunk c's low nibbles are sub-block 2c, its high nibbles 2c+1.
    value = d * scale * q - dmin * min, per sub-block of 32.
    """
    blocks = raw.reshape(-1, 144)
    d, dmin = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])
    scales, mins = _q4_k_scales_mins(blocks[:, 4:16])
    qs = blocks[:, 16:].reshape(-1, 4, 32)
    q = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(-1, 8, 32).astype(np.float32)  # (n, sub-block, 32)
    out = (d * scales)[:, :, None] * q - (dmin * mins)[:, :, None]
    return out.reshape(-1)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, 16) bytes of 32 4-bit values (low nibbles first, then high) -> (n, 32)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """(n, 4) bytes: a uint32 whose bit i is the fifth bit of element i -> (n, 32) of 0 or 1."""
    word = np.ascontiguousarray(qh).view("<u4").reshape(-1, 1)
    return ((word >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)


def _dequant_q4_1(raw: np.ndarray) -> np.ndarray:
    """Blocks of 32: f16 scale d, f16 minimum m, 16 bytes of nibbles; value = d*q + m."""
    blocks = raw.reshape(-1, 20)
    d, m = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])
    return (d * _nibbles(blocks[:, 4:]).astype(np.float32) + m).reshape(-1)


def _dequant_q5_0(raw: np.ndarray) -> np.ndarray:
    """Blocks of 32: f16 d, 4 bytes of fifth bits, 16 bytes of nibbles; value = d*(q - 16)."""
    blocks = raw.reshape(-1, 22)
    d = _f16(blocks[:, 0:2])
    q = _nibbles(blocks[:, 6:]) | (_high_bits(blocks[:, 2:6]) << 4)
    return (d * (q.astype(np.float32) - 16.0)).reshape(-1)


def _dequant_q5_1(raw: np.ndarray) -> np.ndarray:
    """Blocks of 32: f16 d, f16 m, 4 bytes of fifth bits, 16 bytes of nibbles; value = d*q + m."""
    blocks = raw.reshape(-1, 24)
    d, m = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])
    q = _nibbles(blocks[:, 8:]) | (_high_bits(blocks[:, 4:8]) << 4)
    return (d * q.astype(np.float32) + m).reshape(-1)


def _crumbs(qs: np.ndarray) -> np.ndarray:
    """(n, 64) bytes of 2-bit values -> (n, 256): two halves of 32 bytes, each byte's bits 0-1 first (for the 32
    bytes of the half), then bits 2-3, 4-5, 6-7."""
    halves = qs.reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    return (halves & 3).reshape(-1, 256)


def _dequant_q2_k(raw: np.ndarray) -> np.ndarray:
    """Super-blocks of 256: 16 bytes of 4-bit scale (low) and minimum (high) per 16 values, 64 bytes of 2-bit values,
    f16 d, f16 dmin; value = d*scale*q - dmin*min."""
    blocks = raw.reshape(-1, 84)
    sc = blocks[:, :16]
    d, dmin = _f16(blocks[:, 80:82]), _f16(blocks[:, 82:84])
    q = _crumbs(blocks[:, 16:80]).reshape(-1, 16, 16).astype(np.float32)
    scale = (d * (sc & 15).astype(np.float32))[:, :, None]
    low = (dmin * (sc >> 4).astype(np.float32))[:, :, None]
    return (scale * q - low).reshape(-1)


def _dequant_q3_k(raw: np.ndarray) -> np.ndarray:
    """Super-blocks of 256: 32 bytes of high bits (bit i of byte b: element 32*i + b), 64 bytes of 2-bit values,
    12 bytes of 6-bit signed scales per 16 values, f16 d; value = d*(scale - 32)*(q - 4 where the high bit is 0)."""
    blocks = raw.reshape(-1, 110)
    hmask, qs, packed = blocks[:, :32], blocks[:, 32:96], blocks[:, 96:108]
    d = _f16(blocks[:, 108:110])
    low = packed[:, :8].reshape(-1, 1, 8) >> np.array([0, 4], dtype=np.uint8).reshape(1, 2, 1)
    high = packed[:, 8:].reshape(-1, 1, 4) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 4, 1)
    scales = ((low.reshape(-1, 16) & 15) | ((high.reshape(-1, 16) & 3) << 4)).astype(np.float32) - 32.0
    bits = (hmask.reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1
    q = _crumbs(qs).astype(np.float32) - 4.0 * (1 - bits.reshape(-1, 256)).astype(np.float32)
    return ((d * scales)[:, :, None] * q.reshape(-1, 16, 16)).reshape(-1)


def _dequant_q5_k(raw: np.ndarray) -> np.ndarray:
    """Super-blocks of 256: f16 d, f16 dmin, 12 bytes of scales/mins (as Q4_K), 32 bytes of fifth bits (bit i of
    byte b: sub-block i's element b), 128 bytes of nibbles (as Q4_K); value = d*scale*q - dmin*min."""
    blocks = raw.reshape(-1, 176)
    d, dmin = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])
    scales, mins = _q4_k_scales_mins(blocks[:, 4:16])
    qs = blocks[:, 48:].reshape(-1, 4, 32)
    low = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(-1, 8, 32)
    high = (blocks[:, 16:48].reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1
    q = (low | (high << 4)).astype(np.float32)
    return ((d * scales)[:, :, None] * q - (dmin * mins)[:, :, None]).reshape(-1)


def _dequant_q6_k(raw: np.ndarray) -> np.ndarray:
    """Super-blocks of 256: 128 bytes of low nibbles, 64 bytes of 2-bit highs, 16 int8 scales per 16 values, f16 d;
    value = d*scale*(q - 32). Each half of 128 values: low nibbles of its 64 bytes, then their high nibbles; the
    highs of its 32 bytes at bits 0-1, 2-3, 4-5, 6-7 in turn."""
    blocks = raw.reshape(-1, 210)
    ql, qh = blocks[:, :128], blocks[:, 128:192]
    scales = np.ascontiguousarray(blocks[:, 192:208]).view(np.int8).astype(np.float32)
    d = _f16(blocks[:, 208:210])
    low = (ql.reshape(-1, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)) & 15
    high = (qh.reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 3
    q = (low.reshape(-1, 256) | (high.reshape(-1, 256) << 4)).astype(np.float32) - 32.0
    return ((d * scales)[:, :, None] * q.reshape(-1, 16, 16)).reshape(-1)


# ggml type -> (elements per block, bytes per block, dequantizer)
_DEQUANT: dict[int, tuple[int, int, Callable[[np.ndarray], np.ndarray]]] = {
    0: (1, 4, _dequant_f32),
    1: (1, 2, _dequant_f16),
    2: (32, 18, _dequant_q4_0),
    3: (32, 20, _dequant_q4_1),
    6: (32, 22, _dequant_q5_0),
    7: (32, 24, _dequant_q5_1),
    8: (32, 34, _dequant_q8_0),
    10: (256, 84, _dequant_q2_k),
    11: (256, 110, _dequant_q3_k),
    12: (256, 144, _dequant_q4_k),
    13: (256, 176, _dequant_q5_k),
    14: (256, 210, _dequant_q6_k),
    30: (1, 2, _dequant_bf16),
}

# ---------------------------------------------------------------- kept as stored (dequantized where read)
#
# Each lazy form holds a block's fields as separate device tensors (scales as float16, quants as the bytes they are),
# together the file's bytes, and builds the float32 values from them with elementwise ops alone, in one kernel. The
# values are computed in a shape that splits each block along its bit layout (which byte, which bits of it, which
# scale), so that every field reaches every element through a view (a split and a broadcast): the shape is folded
# into the tensor's own only at the end. Rounding follows the gguf package's dequantizers step by step, so the
# values are theirs bit for bit.


def _field(blocks: np.ndarray, lo: int, hi: int, dtype: str, device: str | None) -> Tensor:
    """Bytes lo:hi of every block read as `dtype` ("<f2", "u1", "i1"): a (blocks, n) device tensor."""
    return Tensor(np.ascontiguousarray(blocks[:, lo:hi]).view(dtype), device=device)


def _bits(x: Tensor, amounts: list[int], shape: tuple[int, ...], mask: int) -> Tensor:
    """(x >> amount) & mask for each of `amounts` laid out in `shape` (1 along the dims where x has its fields, x's
    size 1 along the others): a block's bit fields, each shifted by a constant (vector code shifts every lane by one
    constant), joined along those dims."""
    return _joined(x, np.array(amounts).reshape(shape), mask)


def _joined(x: Tensor, table: np.ndarray, mask: int) -> Tensor:
    """_bits over a table of shift amounts, joined along its first dim of more than one (a module function, not a
    closure that calls itself: that is a reference cycle, which kept x until the cycle collector ran)."""
    axis = next((i for i, n in enumerate(table.shape) if n > 1), None)
    if axis is None:
        amount = int(table.flat[0])
        return ((x >> amount) if amount else x) & mask
    return Tensor.cat(*(_joined(x, table.take([i], axis=axis), mask) for i in range(table.shape[axis])), dim=axis)


def _scale(blocks: np.ndarray, at: int, rank: int, device: str | None) -> Tensor:
    """The f16 at byte `at` of every block (on the device as float16), widened to float32: (blocks, 1, ..., 1) of
    `rank` dims, broadcast over the block's layout."""
    return _field(blocks, at, at + 2, "<f2", device).cast("float32").reshape(-1, *(1,) * (rank - 1))


def _lazy_f16(raw: np.ndarray, shape: tuple[int, ...], device: str | None) -> Tensor:
    return Tensor(np.ascontiguousarray(raw).view("<f2").reshape(shape), device=device).cast("float32")


def _lazy_bf16(raw: np.ndarray, shape: tuple[int, ...], device: str | None) -> Tensor:
    return STORED["bfloat16"][1](Tensor(np.ascontiguousarray(raw).view("<u2").reshape(shape), device=device))


def _lazy_q8_0(raw: np.ndarray, shape: tuple[int, ...], device: str | None) -> Tensor:
    blocks = raw.reshape(-1, 34)
    d = Tensor(np.ascontiguousarray(blocks[:, :2]).view("<f2"), device=device)  # (blocks, 1)
    q = Tensor(np.ascontiguousarray(blocks[:, 2:]).view(np.int8), device=device)  # (blocks, 32)
    return (q.cast("float32") * d.cast("float32")).reshape(shape)


def _lazy_q4_0(raw: np.ndarray, shape: tuple[int, ...], device: str | None) -> Tensor:
    """(blocks, nibble, byte): the low nibbles of the 16 bytes are elements 0..15, the high ones 16..31."""
    blocks = raw.reshape(-1, 18)
    d = _scale(blocks, 0, 3, device)
    qs = _field(blocks, 2, 18, "u1", device).reshape(-1, 1, 16)
    q = _bits(qs, [0, 4], (1, 2, 1), 15)
    return ((q.cast("float32") - 8.0) * d).reshape(shape)


# ---------------------------------------------------------------- Q8_0 and Q4_0 as words (tiny.tensor.byte_blocks)
#
# Where the device multiplies bytes, a matrix's quants are kept as int32 words with rows side by side, which products
# read (Tensor.linear); the float32 graph over them is the tensor, the same values as the stored form's.


def _words_q8_0(raw: np.ndarray, shape: tuple[int, ...], lanes: int, device: str | None) -> Tensor:
    form = _words(raw.reshape(-1, 34), shape, lanes, device)
    words = form.split(form.words)  # (rows / lanes, lanes, blocks, 8 words): byte i of word g is quant 4g + i
    signed = _bits(words.reshape(*words.shape, 1), [0, 8, 16, 24], (1, 1, 1, 1, 4), 0xFF) ^ 0x80
    d = form.split_scales
    return register(((signed.cast("float32") - 128.0) * d.reshape(*d.shape, 1, 1)).reshape(shape), form)


def _words_q4_0(raw: np.ndarray, shape: tuple[int, ...], lanes: int, device: str | None) -> Tensor:
    form = _words(raw.reshape(-1, 18), shape, lanes, device)
    words = form.split(form.words)  # (rows / lanes, lanes, blocks, 4 words): nibble h of byte i of word m is
    shifts = np.array([[0, 8, 16, 24], [4, 12, 20, 28]]).reshape(1, 1, 1, 2, 1, 4)  # quant 16h + 4m + i
    nibbles = _joined(words.reshape(*words.shape[:3], 1, 4, 1), shifts, 15)
    d = form.split_scales
    return register(((nibbles.cast("float32") - 8.0) * d.reshape(*d.shape, 1, 1, 1)).reshape(shape), form)


# ---------------------------------------------------------------- float matrices in panels (tiny.tensor.weight_forms)


def _panel_width(shape: tuple[int, ...], device: str | None) -> int:
    """Rows a panel of a float matrix of this shape, kept so where the device's products read panels; else 0."""
    if len(shape) != 2:
        return 0
    return layout.weight_panel_width(Device.DEFAULT if device is None else device, dtypes.float32, shape[0])


def _panels(raw: np.ndarray, ggml_type: int, shape: tuple[int, ...], width: int, device: str | None) -> Tensor:
    """A matrix (rows, k) of F32, F16 or BF16 values kept in panels of `width` rows: the float32 graph over them,
    with the panels registered as its form."""
    dtype = _PANEL_TYPES[ggml_type]
    return Panels.of(raw.view(STORED[dtype][0]).reshape(shape), dtype, width, device)


def _side_by_side(shape: tuple[int, ...], device: str | None) -> int:
    """Rows of a matrix to keep side by side as words for products of bytes, where the device multiplies bytes and
    Q8_ACTIVATIONS is on; else 0 (the blocks as stored)."""
    if len(shape) != 2 or not Q8_ACTIVATIONS.value:
        return 0
    return layout.byte_dot_rows(Device.DEFAULT if device is None else device, shape[0])


def _words(blocks: np.ndarray, shape: tuple[int, ...], lanes: int, device: str | None) -> ByteBlocks:
    """The quants of every block (its bytes after the f16 scale at 0: Q8_0's 32, Q4_0's 16) as int32 words with
    `lanes` rows side by side, (rows / lanes, blocks a row, words, lanes), and the scales likewise, (rows / lanes,
    blocks a row, lanes)."""
    rows, per_row = shape[0], blocks.shape[0] // shape[0]
    words = np.ascontiguousarray(blocks[:, 2:]).view("<i4").reshape(rows // lanes, lanes, per_row, -1)
    scales = np.ascontiguousarray(blocks[:, :2]).view("<f2").reshape(rows // lanes, lanes, per_row)
    return ByteBlocks(
        Tensor(np.ascontiguousarray(words.transpose(0, 2, 3, 1)), device=device),
        Tensor(np.ascontiguousarray(scales.transpose(0, 2, 1)), device=device),
        nibbles=blocks.shape[1] == 18,
    )


def _lazy_q4_1(raw: np.ndarray, shape: tuple[int, ...], device: str | None) -> Tensor:
    """(blocks, nibble, byte): the low nibbles of the 16 bytes are elements 0..15, the high ones 16..31."""
    blocks = raw.reshape(-1, 20)
    d, m = _scale(blocks, 0, 3, device), _scale(blocks, 2, 3, device)
    qs = _field(blocks, 4, 20, "u1", device).reshape(-1, 1, 16)
    q = _bits(qs, [0, 4], (1, 2, 1), 15)
    return (d * q.cast("float32") + m).reshape(shape)


def _five_bits(qh: Tensor, qs: Tensor) -> Tensor:
    """Q5_0/Q5_1's 32 values of a block as (blocks, nibble, half of the 16 bytes, byte of the half): the nibbles as
    Q4_1's, the fifth bit of element i bit i of the 4 bytes qh (a little-endian uint32)."""
    low = _bits(qs.reshape(-1, 1, 2, 8), [0, 4], (1, 2, 1, 1), 15)
    high = _bits(qh.reshape(-1, 2, 2, 1), list(range(8)), (1, 1, 1, 8), 1)
    return low | (high << 4)


def _lazy_q5_0(raw: np.ndarray, shape: tuple[int, ...], device: str | None) -> Tensor:
    blocks = raw.reshape(-1, 22)
    d = _scale(blocks, 0, 4, device)
    q = _five_bits(_field(blocks, 2, 6, "u1", device), _field(blocks, 6, 22, "u1", device))
    return (d * (q.cast("float32") - 16.0)).reshape(shape)


def _lazy_q5_1(raw: np.ndarray, shape: tuple[int, ...], device: str | None) -> Tensor:
    blocks = raw.reshape(-1, 24)
    d, m = _scale(blocks, 0, 4, device), _scale(blocks, 2, 4, device)
    q = _five_bits(_field(blocks, 4, 8, "u1", device), _field(blocks, 8, 24, "u1", device))
    return (d * q.cast("float32") + m).reshape(shape)


def _lazy_q2_k(raw: np.ndarray, shape: tuple[int, ...], device: str | None) -> Tensor:
    """(blocks, half, bit pair, half of the 32 bytes, byte): element 128*half + 32*pair + byte's bits 2*pair..,
    scale and minimum number 8*half + 2*pair + half of the bytes (one per 16 values)."""
    blocks = raw.reshape(-1, 84)
    sc = _field(blocks, 0, 16, "u1", device).reshape(-1, 2, 4, 2, 1)
    qs = _field(blocks, 16, 80, "u1", device).reshape(-1, 2, 1, 2, 16)
    d, dmin = _scale(blocks, 80, 5, device), _scale(blocks, 82, 5, device)
    q = _bits(qs, [0, 2, 4, 6], (1, 1, 4, 1, 1), 3)
    scale, low = d * (sc & 15).cast("float32"), dmin * (sc >> 4).cast("float32")
    return (scale * q.cast("float32") - low).reshape(shape)


def _lazy_q3_k(raw: np.ndarray, shape: tuple[int, ...], device: str | None) -> Tensor:
    """(blocks, half, pair // 2, pair % 2, half of the 32 bytes, byte): the 2-bit values as Q2_K's, the third bit of
    element 128*half + 32*pair + byte at bit 4*half + pair of hmask's byte; scale number j = 8*half + 2*pair + half
    of the bytes: its low 4 bits in byte j % 8 at bit 4*(j // 8), its high 2 in byte 8 + j % 4 at bit 2*(j // 4)."""
    blocks = raw.reshape(-1, 110)
    hmask = _field(blocks, 0, 32, "u1", device).reshape(-1, 1, 1, 1, 2, 16)
    qs = _field(blocks, 32, 96, "u1", device).reshape(-1, 2, 1, 1, 2, 16)
    low_sc = _field(blocks, 96, 104, "u1", device).reshape(-1, 1, 2, 2, 2, 1)
    high_sc = _field(blocks, 104, 108, "u1", device).reshape(-1, 1, 1, 2, 2, 1)
    d = _scale(blocks, 108, 6, device)
    low = _bits(low_sc, [0, 4], (1, 2, 1, 1, 1, 1), 15)
    high = _bits(high_sc, [0, 2, 4, 6], (1, 2, 2, 1, 1, 1), 3)
    scale = (low | (high << 4)).cast("float32") - 32.0
    q = _bits(qs, [0, 2, 4, 6], (1, 1, 2, 2, 1, 1), 3)
    bit = _bits(hmask, list(range(8)), (1, 2, 2, 2, 1, 1), 1)
    q = q.cast("float32") - ((bit ^ 1) << 2).cast("float32")  # 4 less where the bit is 0
    return ((d * scale) * q).reshape(shape)


def _k_scales_mins(packed: Tensor) -> tuple[Tensor, Tensor]:
    """Q4_K/Q5_K's 12 bytes of 6-bit scales and mins, (blocks, 12) -> (blocks, 2, 2, 2, 1) each, sub-block
    4*i + 2*j + k at [i, j, k] (as _q4_k_scales_mins)."""
    scales, mins, tail = (packed[:, 4 * i : 4 * i + 4].reshape(-1, 1, 2, 2, 1) for i in range(3))
    sc = (scales & 63).cat((tail & 15) | ((scales >> 2) & 48), dim=1)
    mn = (mins & 63).cat((tail >> 4) | ((mins >> 2) & 48), dim=1)
    return sc, mn


def _lazy_q4_k(raw: np.ndarray, shape: tuple[int, ...], device: str | None) -> Tensor:
    """(blocks, chunk // 2, chunk % 2, nibble, byte): each of the 4 chunks of 32 bytes holds sub-block 2*chunk in its
    low nibbles and 2*chunk + 1 in its high ones."""
    blocks = raw.reshape(-1, 144)
    d, dmin = _scale(blocks, 0, 5, device), _scale(blocks, 2, 5, device)
    sc, mn = _k_scales_mins(_field(blocks, 4, 16, "u1", device))
    qs = _field(blocks, 16, 144, "u1", device).reshape(-1, 2, 2, 1, 32)
    q = _bits(qs, [0, 4], (1, 1, 1, 2, 1), 15)
    return ((d * sc.cast("float32")) * q.cast("float32") - dmin * mn.cast("float32")).reshape(shape)


def _lazy_q5_k(raw: np.ndarray, shape: tuple[int, ...], device: str | None) -> Tensor:
    """As Q4_K, and the fifth bit of sub-block s's element b at bit s of byte b of the 32 bytes qh."""
    blocks = raw.reshape(-1, 176)
    d, dmin = _scale(blocks, 0, 5, device), _scale(blocks, 2, 5, device)
    sc, mn = _k_scales_mins(_field(blocks, 4, 16, "u1", device))
    qh = _field(blocks, 16, 48, "u1", device).reshape(-1, 1, 1, 1, 32)
    qs = _field(blocks, 48, 176, "u1", device).reshape(-1, 2, 2, 1, 32)
    low = _bits(qs, [0, 4], (1, 1, 1, 2, 1), 15)
    high = _bits(qh, list(range(8)), (1, 2, 2, 2, 1), 1)
    q = low | (high << 4)
    return ((d * sc.cast("float32")) * q.cast("float32") - dmin * mn.cast("float32")).reshape(shape)


def _lazy_q6_k(raw: np.ndarray, shape: tuple[int, ...], device: str | None) -> Tensor:
    """(blocks, half, nibble, 32-byte half of ql's 64, 16-byte half of that, byte): as _dequant_q6_k, element
    128*half + 64*nibble + b (b the byte's place in ql's 64 of the half) takes its top 2 bits from qh's byte b % 32
    of the half, at bit 2*(b // 32 + 2*nibble); one int8 scale per 16 values."""
    blocks = raw.reshape(-1, 210)
    ql = _field(blocks, 0, 128, "u1", device).reshape(-1, 2, 1, 2, 2, 16)
    qh = _field(blocks, 128, 192, "u1", device).reshape(-1, 2, 1, 1, 2, 16)
    scale = _field(blocks, 192, 208, "i1", device).cast("float32").reshape(-1, 2, 2, 2, 2, 1)
    d = _scale(blocks, 208, 6, device)
    low = _bits(ql, [0, 4], (1, 1, 2, 1, 1, 1), 15)
    high = _bits(qh, [0, 2, 4, 6], (1, 1, 2, 2, 1, 1), 3)
    q = (low | (high << 4)).cast("float32") - 32.0
    return ((d * scale) * q).reshape(shape)


# ggml type -> its lazy form
_LAZY: dict[int, Callable[[np.ndarray, tuple[int, ...], str | None], Tensor]] = {
    1: _lazy_f16,
    2: _lazy_q4_0,
    3: _lazy_q4_1,
    6: _lazy_q5_0,
    7: _lazy_q5_1,
    8: _lazy_q8_0,
    10: _lazy_q2_k,
    11: _lazy_q3_k,
    12: _lazy_q4_k,
    13: _lazy_q5_k,
    14: _lazy_q6_k,
    30: _lazy_bf16,
}

_WORDS: dict[int, Callable[[np.ndarray, tuple[int, ...], int, str | None], Tensor]] = {2: _words_q4_0, 8: _words_q8_0}
# ggml type -> the float type its matrices are kept in panels in, by weight_forms' name (STORED)
_PANEL_TYPES = {0: "float32", 1: "float16", 30: "bfloat16"}

# ---------------------------------------------------------------- loading


def _align(offset: int, alignment: int) -> int:
    return offset + (-offset) % alignment


def gguf_load(
    path: str | os.PathLike[str],
    dequantize: bool = True,
    device: str | None = None,
    lookups: Collection[str] = (),
    joins: Mapping[str, Sequence[str]] | None = None,
) -> tuple[dict[str, Tensor], dict[str, object]]:
    """Read a GGUF file: its tensors by name (dequantized to float32) and its key/value metadata.

    dequantize=False keeps every tensor as it is stored: the device holds its blocks (scales and quants as separate
    tensors, together the file's bytes) and each tensor is a lazy float32 graph over them, which the kernels that read
    it compute (one kernel dequantizes a whole tensor; a matrix product over block-quantized values runs after one
    that dequantizes the weight for it, as the scheduler cannot yet index a block's scale from the product's flat
    dim). F32 tensors are read as they are either way. Where the device's products read panels (the CPU: rows in
    blocks of two vectors, layout.weight_panel_width), F32, F16 and BF16 matrices are kept in panels instead
    (tiny.tensor.weight_forms.Panels), which every product over them reads; where the device multiplies bytes (x86
    with VNNI), Q8_0 and Q4_0 matrices are kept as int32 words with rows side by side, for products of bytes
    (tiny.tensor.byte_blocks). The tensors named in `lookups` (an embedding table, read by rows) stay as stored.

    `joins` maps the end of a new name to the ends of the names of tensors whose rows it holds one after another:
    for each start of names that the file has all of them under (each layer's "blk.N."), they are read as one tensor
    of their type under the new name (a layer's query, key and value projections, {"attn_qkv.weight":
    ("attn_q.weight", "attn_k.weight", "attn_v.weight")}: one product reads them, not three). Where they differ in
    type or row size, or the file has the new name, they stay apart under their own names.

    Shapes are in numpy/PyTorch order (GGUF stores dims innermost first). Supported tensor types:
    F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K; others raise ValueError naming the
    type.

    >>> import gguf, numpy as np, tempfile, os                                      # doctest: +SKIP
    >>> p = os.path.join(tempfile.mkdtemp(), "m.gguf"); w = gguf.GGUFWriter(p, "llama")  # doctest: +SKIP
    >>> w.add_tensor("w", np.ones((2, 3), np.float32)); w.write_header_to_file()    # doctest: +SKIP
    >>> w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()             # doctest: +SKIP
    >>> tensors, meta = gguf_load(p); tensors["w"].shape, meta["general.architecture"]  # doctest: +SKIP
    ((2, 3), 'llama')
    """
    path = os.fspath(path)
    data = np.memmap(path, dtype=np.uint8, mode="r") if os.path.getsize(path) else np.zeros(0, np.uint8)
    reader = _Reader(data, path)
    magic = reader.take(4, "the magic").tobytes()
    if magic != _MAGIC:
        raise ValueError(f"{path!r} is not a GGUF file: magic is {magic!r}, expected {_MAGIC!r}")
    version = reader.u32("the version")
    if version not in _VERSIONS:
        raise ValueError(f"GGUF file {path!r} has version {version}; only versions {_VERSIONS} are supported")
    n_tensors = reader.u64("the tensor count")
    n_kv = reader.u64("the key/value count")

    metadata: dict[str, object] = {}
    for i in range(n_kv):
        key = reader.string(f"the key of metadata entry {i}")
        metadata[key] = reader.value(reader.u32(f"the type of {key!r}"), repr(key))

    infos: list[tuple[str, tuple[int, ...], int, int]] = []
    for i in range(n_tensors):
        name = reader.string(f"the name of tensor {i}")
        n_dims = reader.u32(f"the rank of {name!r}")
        dims = [reader.u64(f"a dimension of {name!r}") for _ in range(n_dims)]
        ggml_type = reader.u32(f"the type of {name!r}")
        offset = reader.u64(f"the offset of {name!r}")
        infos.append((name, tuple(reversed(dims)), ggml_type, offset))
    infos, parts = _join_infos(infos, joins or {})

    alignment = metadata.get("general.alignment", _DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0:
        raise ValueError(f"GGUF file {path!r}: general.alignment is {alignment!r}, expected a positive integer")
    data_start = _align(reader.pos, alignment)

    tensors: dict[str, Tensor] = {}
    # the biggest first: a tensor's bytes as read and the fields made from them are held beside its device copy
    # while it is made, so the peak is what is loaded already plus that; with the embedding and the output (a 1B
    # model's biggest, 36 MB at Q4_0) first, it is a few MB over the model's memory, not 2 x 36
    for name, shape, ggml_type, _ in sorted(infos, key=lambda info: -_nbytes(info[1], info[2])):
        if ggml_type not in _DEQUANT:
            type_name = _GGML_NAMES.get(ggml_type, f"unknown type {ggml_type}")
            supported = ", ".join(_GGML_NAMES[t] for t in _DEQUANT)
            raise ValueError(f"GGUF tensor {name!r} has ggml type {type_name}, which is not supported ({supported})")
        block_elems, block_bytes, dequant = _DEQUANT[ggml_type]
        n = int(np.prod(shape, dtype=np.int64))
        if n % block_elems:
            raise ValueError(f"GGUF tensor {name!r}: {n} elements is not a whole number of {block_elems}-blocks")
        # read, not mapped: pages of a mapping stay resident while it lives, beside the device's copy (a model would
        # take twice its file's size while loading)
        raws = [_read(reader, data_start, *part) for part in parts[name]]
        raw = raws[0] if len(raws) == 1 else np.concatenate(raws)
        del raws
        if not dequantize and ggml_type in _WORDS and name not in lookups and (lanes := _side_by_side(shape, device)):
            tensors[name] = _WORDS[ggml_type](raw, shape, lanes, device)
            continue
        if (
            not dequantize
            and ggml_type in _PANEL_TYPES
            and name not in lookups
            and (width := _panel_width(shape, device))
        ):
            tensors[name] = _panels(raw, ggml_type, shape, width, device)
            continue
        if not dequantize and ggml_type in _LAZY:
            tensors[name] = _LAZY[ggml_type](raw, shape, device)
            continue
        tensors[name] = Tensor(dequant(raw).reshape(shape), device=device)
    return {name: tensors[name] for name, *_ in infos}, metadata  # (in the file's order)


def _join_infos(
    infos: list[tuple[str, tuple[int, ...], int, int]], joins: Mapping[str, Sequence[str]]
) -> tuple[list[tuple[str, tuple[int, ...], int, int]], dict[str, list[tuple[str, int, int]]]]:
    """The tensors to read, each joined one (gguf_load's `joins`) in place of its first part (its offset that one's),
    and the parts each is read from: (name, offset, bytes) in order."""
    by_name = {info[0]: info for info in infos}
    parts = {name: [(name, offset, _nbytes(shape, t))] for name, shape, t, offset in infos}
    for new, ends in joins.items():
        for name in [n for n in by_name if ends and n.endswith(ends[0])]:
            prefix = name[: len(name) - len(ends[0])]
            names = [prefix + end for end in ends]
            found = [by_name[n] for n in names if n in parts]  # (a part missing, or taken by an earlier join: apart)
            shapes = [f[1] for f in found]
            if len(found) < len(ends) or prefix + new in by_name or len({f[2] for f in found}) != 1:
                continue
            if len({s[1:] for s in shapes}) != 1 or not shapes[0]:
                continue
            joined = (prefix + new, (sum(s[0] for s in shapes), *shapes[0][1:]), found[0][2], found[0][3])
            parts[joined[0]] = [part for n in names for part in parts.pop(n)]
            infos = [joined if info is found[0] else info for info in infos if info is found[0] or info[0] not in names]
    return infos, parts


def _read(reader: _Reader, data_start: int, name: str, offset: int, nbytes: int) -> np.ndarray:
    """A tensor's bytes, checked to be in the file."""
    reader.pos = data_start + offset
    reader.take(nbytes, f"the data of tensor {name!r}")
    return np.fromfile(reader.path, dtype=np.uint8, count=nbytes, offset=data_start + offset)


def _nbytes(shape: tuple[int, ...], ggml_type: int) -> int:
    """The bytes a tensor of this shape and type takes in the file (0 for a type not read: it fails in order)."""
    if ggml_type not in _DEQUANT:
        return 0
    block_elems, block_bytes, _ = _DEQUANT[ggml_type]
    return int(np.prod(shape, dtype=np.int64)) // block_elems * block_bytes
