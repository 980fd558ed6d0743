"""Tensor cores as data: the tile a matrix-multiply-accumulate instruction computes and where its operands live.

One instruction computes D = A @ B + C for an (M x K) tile A, a (K x N) tile B and (M x N) tiles C and D, with
the threads of one warp (NVIDIA, 32 lanes) or wave (AMD, 32 or 64 lanes) each holding a few elements of each
operand in registers: its fragment. A `Fragment` says which element of the tile each register element of each
lane is. Every layout here maps bits to bits: bit i of the lane number and bit j of the element number each
give one bit of a row or column, written "m0" (row bit 0 of A or C), "k3", "n1" ...; a lane bit that gives none
(None) means lanes that differ only in it hold the same values (RDNA3's A and B are replicated across the two
half-waves). The code generator turns these bits into index math; the PYTHON emulator (tiny.runtime.python)
executes WMMA by them; the renderers name the instruction by `TensorCore.name`.

Sources: PTX ISA "Matrix fragments for mma.m16n8k16 with floating point type"; AMD RDNA3 ISA and GPUOpen "How
to accelerate AI applications on RDNA 3 using WMMA"; GPUOpen "Using the matrix cores of AMD RDNA 4 architecture
GPUs"; AMD CDNA3 ISA and the AMD matrix instruction calculator (v_mfma_f32_16x16x16f16 / _bf16).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

from tiny.ir.dtypes import DType, dtypes

Bit = str | None  # "m0" .. "k3" .. "n2": one bit of a tile coordinate; None: no coordinate (replicated lanes)


@dataclass(frozen=True)
class Fragment:
    """One operand's registers across a warp: which tile element lane `l`, register element `e` holds."""

    rows: str  # the coordinate along the operand's rows: "m" for A, C and D, "k" for B
    cols: str  # along its columns: "k" for A, "n" for B, C and D
    lane_bits: tuple[Bit, ...]  # bit i of the lane number (least significant first) -> the coordinate bit it gives
    elem_bits: tuple[str, ...]  # bit j of the element number -> the coordinate bit it gives

    @property
    def elements(self) -> int:
        """Register elements per lane."""
        return 2 ** len(self.elem_bits)

    def coord(self, axis: str, lane: int, elem: int) -> int:
        """Coordinate `axis` ("m", "n" or "k") of the tile element that `lane` holds as its element `elem`."""
        value = 0
        for i, bit in enumerate(self.lane_bits):
            if bit is not None and bit[0] == axis:
                value |= (lane >> i & 1) << int(bit[1:])
        for j, bit in enumerate(self.elem_bits):
            if bit[0] == axis:
                value |= (elem >> j & 1) << int(bit[1:])
        return value

    def position(self, lane: int, elem: int) -> tuple[int, int]:
        """(row, column) in the operand's tile of what `lane` holds as element `elem`."""
        return self.coord(self.rows, lane, elem), self.coord(self.cols, lane, elem)

    def lane_terms(self, axis: str) -> list[tuple[int, int, int]]:
        """Coordinate `axis` as a sum over runs of lane bits: (first lane bit, bits in the run, first coordinate
        bit), i.e. coord += (lane >> first % 2**bits) << coordinate bit. Element bits are left out."""
        runs: list[tuple[int, int, int]] = []
        for i, bit in enumerate(self.lane_bits):
            if bit is None or bit[0] != axis:
                continue
            if runs and runs[-1][0] + runs[-1][1] == i and runs[-1][2] + runs[-1][1] == int(bit[1:]):
                first, n, to = runs[-1]
                runs[-1] = (first, n + 1, to)
            else:
                runs.append((i, 1, int(bit[1:])))
        return runs


@dataclass(frozen=True)
class TensorCore:
    """A matrix-multiply-accumulate instruction: D (M x N, dtype_out) = A (M x K) @ B (K x N) + C, with A and B in
    dtype_in, computed by `threads` lanes together, each holding the fragments a, b and c (c is D's layout too)."""

    name: str  # what a WMMA's arg says and renderers pick the instruction by
    dims: tuple[int, int, int]  # (M, N, K)
    dtype_in: DType
    dtype_out: DType
    threads: int  # lanes of the warp or wave
    a: Fragment
    b: Fragment
    c: Fragment
    mantissa: int | None = None  # mantissa bits the core keeps of each input (TF32: 10 of float32's 23); None: all

    def __post_init__(self) -> None:
        check_tensor_core(self)

    def rounded(self, x: float) -> float:
        """An input value as the core multiplies it: rounded to `mantissa` bits, to nearest with ties away from
        zero (NVIDIA's cvt.rna.tf32.f32); infinities and NaN as they are."""
        if self.mantissa is None or not math.isfinite(x):
            return x
        drop = 23 - self.mantissa
        bits = struct.unpack("<I", struct.pack("<f", x))[0]
        bits = (bits + (1 << (drop - 1))) & ~((1 << drop) - 1) & 0xFFFFFFFF  # (the magnitude's carry rounds away)
        return struct.unpack("<f", struct.pack("<I", bits))[0]

    @property
    def a_dtype(self) -> DType:
        return self.dtype_in.vec(self.a.elements)

    @property
    def b_dtype(self) -> DType:
        return self.dtype_in.vec(self.b.elements)

    @property
    def c_dtype(self) -> DType:
        return self.dtype_out.vec(self.c.elements)

    def fragments(self) -> dict[str, Fragment]:
        return {"A": self.a, "B": self.b, "C": self.c}


def check_tensor_core(tc: TensorCore) -> None:
    """Raise ValueError unless each fragment covers its tile exactly (every element held, the same number of times
    by every lane bit that is not replicated)."""
    m, n, k = tc.dims
    if tc.threads != 2 ** len(tc.a.lane_bits) or not all(len(f.lane_bits) == len(tc.a.lane_bits) for f in (tc.b, tc.c)):
        raise ValueError(f"tensor core {tc.name}: every fragment needs one lane bit per bit of {tc.threads} lanes")
    sizes = {"m": m, "n": n, "k": k}
    for label, frag, axes in (("A", tc.a, "mk"), ("B", tc.b, "kn"), ("C", tc.c, "mn")):
        if (frag.rows, frag.cols) != (axes[0], axes[1]):
            raise ValueError(f"tensor core {tc.name}: fragment {label} is {axes[0]} x {axes[1]}")
        want = sorted(f"{a}{i}" for a in axes for i in range(int(math.log2(sizes[a]))))
        have = sorted([b for b in frag.lane_bits if b is not None] + list(frag.elem_bits))
        if any(2 ** int(math.log2(sizes[a])) != sizes[a] for a in axes) or have != want:
            raise ValueError(f"tensor core {tc.name}: fragment {label} gives the bits {have}, the tile needs {want}")


# ---------------------------------------------------------------- the tensor cores tiny knows

# NVIDIA mma.sync.aligned.m16n8k16.row.col (sm_80 and newer, sm_90 included), PTX ISA: with groupID = lane >> 2
# and tig = lane % 4, A's a0..a7 sit at row groupID (+8 for a2, a3, a6, a7), column tig*2 + (i & 1) (+8 for a4..a7);
# B's b0..b3 at row (k) tig*2 + (i & 1) (+8 for b2, b3), column groupID; C/D's c0..c3 at row groupID (+8 for c2,
# c3), column tig*2 + (i & 1).
_NV_A = Fragment("m", "k", lane_bits=("k1", "k2", "m0", "m1", "m2"), elem_bits=("k0", "m3", "k3"))
_NV_B = Fragment("k", "n", lane_bits=("k1", "k2", "n0", "n1", "n2"), elem_bits=("k0", "k3"))
_NV_C = Fragment("m", "n", lane_bits=("n1", "n2", "m0", "m1", "m2"), elem_bits=("n0", "m3"))

# AMD RDNA3 (gfx11) v_wmma_f32_16x16x16_{f16,bf16}, wave32: lane l holds row l % 16 of A and column l % 16 of B,
# all 16 k values, both half-waves the same; D element v of lane l is row 2*v + l // 16, column l % 16.
_RDNA3_A = Fragment("m", "k", lane_bits=("m0", "m1", "m2", "m3", None), elem_bits=("k0", "k1", "k2", "k3"))
_RDNA3_B = Fragment("k", "n", lane_bits=("n0", "n1", "n2", "n3", None), elem_bits=("k0", "k1", "k2", "k3"))
_RDNA3_C = Fragment("m", "n", lane_bits=("n0", "n1", "n2", "n3", "m0"), elem_bits=("m1", "m2", "m3"))

# AMD RDNA4 (gfx12) v_wmma_f32_16x16x16_{f16,bf16}, wave32: lane l holds row l % 16 of A (column of B) at k =
# 8*(l // 16) + e, nothing replicated; D element v of lane l is row 8*(l // 16) + v, column l % 16.
_RDNA4_A = Fragment("m", "k", lane_bits=("m0", "m1", "m2", "m3", "k3"), elem_bits=("k0", "k1", "k2"))
_RDNA4_B = Fragment("k", "n", lane_bits=("n0", "n1", "n2", "n3", "k3"), elem_bits=("k0", "k1", "k2"))
_RDNA4_C = Fragment("m", "n", lane_bits=("n0", "n1", "n2", "n3", "m3"), elem_bits=("m0", "m1", "m2"))

# AMD CDNA3/4 (gfx942, gfx950) v_mfma_f32_16x16x16{f16,bf16}, wave64: lane l holds row l % 16 of A (column of B) at
# k = 4*(l // 16) + e; D element v of lane l is row 4*(l // 16) + v, column l % 16.
_CDNA_A = Fragment("m", "k", lane_bits=("m0", "m1", "m2", "m3", "k2", "k3"), elem_bits=("k0", "k1"))
_CDNA_B = Fragment("k", "n", lane_bits=("n0", "n1", "n2", "n3", "k2", "k3"), elem_bits=("k0", "k1"))
_CDNA_C = Fragment("m", "n", lane_bits=("n0", "n1", "n2", "n3", "m2", "m3"), elem_bits=("m0", "m1"))


def _family(prefix: str, dims: tuple[int, int, int], threads: int, frags: tuple[Fragment, ...]) -> list[TensorCore]:
    return [
        TensorCore(f"{prefix}_{dt.name}_float32", dims, dt, dtypes.float32, threads, *frags)
        for dt in (dtypes.float16, dtypes.bfloat16)
    ]


# NVIDIA mma.sync.aligned.m16n8k8 with .tf32 inputs (sm_80 and newer): float32 values multiplied with 10 mantissa
# bits (cvt.rna.tf32.f32), summed in float32. PTX ISA: A's a0..a3 sit at row groupID (+8 for a1, a3), column tig (+4
# for a2, a3); B's b0, b1 at row (k) tig (+4 for b1), column groupID; C/D as m16n8k16's.
_NV_TF32_A = Fragment("m", "k", lane_bits=("k0", "k1", "m0", "m1", "m2"), elem_bits=("m3", "k2"))
_NV_TF32_B = Fragment("k", "n", lane_bits=("k0", "k1", "n0", "n1", "n2"), elem_bits=("k2",))

NV_MMA_M16N8K16 = tuple(_family("nv_m16n8k16", (16, 8, 16), 32, (_NV_A, _NV_B, _NV_C)))
NV_MMA_TF32 = TensorCore(
    "nv_m16n8k8_tf32_float32", (16, 8, 8), dtypes.float32, dtypes.float32, 32, _NV_TF32_A, _NV_TF32_B, _NV_C, 10
)
RDNA3_WMMA = tuple(_family("rdna3_16x16x16", (16, 16, 16), 32, (_RDNA3_A, _RDNA3_B, _RDNA3_C)))
RDNA4_WMMA = tuple(_family("rdna4_16x16x16", (16, 16, 16), 32, (_RDNA4_A, _RDNA4_B, _RDNA4_C)))
CDNA_MFMA = tuple(_family("cdna_16x16x16", (16, 16, 16), 64, (_CDNA_A, _CDNA_B, _CDNA_C)))

TENSOR_CORES: dict[str, TensorCore] = {
    tc.name: tc for tc in NV_MMA_M16N8K16 + (NV_MMA_TF32,) + RDNA3_WMMA + RDNA4_WMMA + CDNA_MFMA
}


def tensor_cores_for(target: str, tf32: bool = False) -> tuple[TensorCore, ...]:
    """The tensor cores of a GPU architecture: 'sm_80' and newer, 'gfx11xx', 'gfx12xx', 'gfx942'/'gfx950';
    () for any other target. tf32: NVIDIA's float32 products on tensor cores too, with TF32's 10 mantissa bits
    (a precision the user chose: tiny.ir.config's TF32, PyTorch's allow_tf32)."""
    if target.startswith("sm_") and target[3:].rstrip("af").isdigit() and int(target[3:].rstrip("af")) >= 80:
        return NV_MMA_M16N8K16 + ((NV_MMA_TF32,) if tf32 else ())
    if target.startswith("gfx11"):
        return RDNA3_WMMA
    if target.startswith("gfx12"):
        return RDNA4_WMMA
    if target in ("gfx942", "gfx950"):
        return CDNA_MFMA
    return ()


def tensor_core(name: str) -> TensorCore:
    """The tensor core a WMMA's arg names; a KeyError listing the known ones otherwise."""
    if name not in TENSOR_CORES:
        raise KeyError(f"no tensor core named {name!r}; known: {sorted(TENSOR_CORES)}")
    return TENSOR_CORES[name]
