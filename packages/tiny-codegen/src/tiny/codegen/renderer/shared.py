"""NVIDIA's local (shared) memory past 48 KiB. A kernel's static `__shared__` arrays (`.shared` in PTX) may take 48 KiB
in all; an sm_80 or newer GPU gives a block more (an A100 164 KiB, an H100 228 KiB) only as dynamic shared memory: one
array of no declared size (`extern __shared__`, `.extern .shared`), its size given at each launch and allowed first
for the kernel (cuFuncSetAttribute's MAX_DYNAMIC_SHARED_SIZE_BYTES). Where a kernel's buffers take more than the
static 48 KiB, the CUDA renderers make each a piece of that array, 16-byte aligned, and say its size on a line of the
source that tiny-runtime-nv reads: `// dynamic shared memory: N bytes`."""

from __future__ import annotations

from collections.abc import Callable

from tiny.ir.uop import Ops, UOp

STATIC_SHARED_MAX = 49152  # bytes of static shared memory a kernel may declare
DYNAMIC_NAME = "tiny_shared"  # the dynamic array


def dynamic_shared(uops: list[UOp], nbytes: Callable[[UOp], int]) -> tuple[dict[UOp, int], int] | None:
    """Each DEFINE_LOCAL's byte offset in the dynamic array and the array's size, where the buffers (`nbytes` each,
    16-byte aligned) take more than STATIC_SHARED_MAX; None where static arrays hold them."""
    offsets, total = {}, 0
    for u in uops:
        if u.op is Ops.DEFINE_LOCAL:
            offsets[u], total = total, total + -(-nbytes(u) // 16) * 16
    return (offsets, total) if total > STATIC_SHARED_MAX else None


def size_line(total: int) -> str:
    """The source line that tells the runtime the dynamic shared memory a launch gives the kernel."""
    return f"// dynamic shared memory: {total} bytes\n"
