"""The memory layouts the scheduler picks for a device: where a convolution keeps its output channels innermost and
where a matrix product reads B from panels (a copy, or a weight kept so).

Both are choices of which buffers a graph writes and in what order, so they belong with the scheduler; the front
end (tiny.tensor) asks these functions and builds its graph in the layout they name. Both apply only on a loop
device (one without workgroups, the CPU): a device with workgroups tiles its kernels on its own, and its vectors are
not the renderer's `vector_lanes`.
"""

from __future__ import annotations

from tiny.ir.device import Device
from tiny.ir.dtypes import DType, dtypes

# convolutions keep output channels innermost in these dtypes, from this many multiply-adds
CHANNELS_LAST_DTYPES = frozenset({dtypes.float32, dtypes.float64})
CHANNELS_LAST_MIN_WORK = 1 << 20
# matrix products copy B into panels in these dtypes, from this many elements of B and rows of A
PANEL_DTYPES = frozenset({dtypes.float32, dtypes.float64})
PANEL_MIN_B = 1 << 16  # (was 1 << 18, a B past the cache: see panel_width)
PANEL_MIN_ROWS = 64
PANEL_MAX_PAD = 5  # B's columns padded to whole panels by at most a fifth of them
# reads a multiple of this many bytes apart fall in at most 4 of an L1's sets (a way holds 4 KB, 64 sets of 64 B)
SET_SPAN = 1 << 10
LINE = 64


def channels_last(device: str, dtype: DType, out_channels: int, work: int) -> bool:
    """Whether a convolution on `device` computes its output channels innermost in memory: a loop device, float32/64,
    a whole number of vectors of output channels, at least CHANNELS_LAST_MIN_WORK multiply-adds (`work`).

    With (N, C_out, *out) in memory a thread's vectors run along an output row: rows of 20, 10 or 6 fill vectors of
    8 badly or not at all. Output channels come in multiples of 8: each lane an output channel, each loaded input
    value broadcast to all lanes, the weights read as vectors from a copy with C_out innermost (one pass over a
    small tensor)."""
    caps = Device[device].renderer.caps
    if caps.has_local or dtype not in CHANNELS_LAST_DTYPES:
        return False
    lanes = caps.vector_lanes(dtype)
    return lanes > 1 and out_channels % lanes == 0 and work >= CHANNELS_LAST_MIN_WORK


def spare_channels(device: str, dtype: DType, channels: int, step: int) -> int:
    """Unused channels to leave after each position's `channels` in a channels-last copy that a convolution reads
    with its tile's positions `step` apart (its stride): a cache line's worth where the positions' distance in bytes
    is a multiple of SET_SPAN, else 0; on a device with workgroups, 0.

    A tile of 7 positions by a kernel's 3 x 3 window reads 27 to 45 lines per input channel, each used again for
    the line's next 15 channels. Positions 2 KB apart (512 channels) fall in 2 of the L1's 64 sets, 4 KB apart (512
    channels at a stride of 2) in one: more lines than a set's ways, so each is evicted before its next channel is
    read. One line more per position spreads them over all sets (8 x 512 x 7 x 7 by 512 x 3 x 3 on 2 AVX-512
    cores: 7.6 -> 5.0 ms at a stride of 2 from 14 x 14, 4.7 -> 4.4 ms at 1; ResNet-50's three: 24.6 -> 16.4 ms)."""
    if Device[device].renderer.caps.has_local:
        return 0
    return LINE // dtype.itemsize if (channels * dtype.itemsize * step) % SET_SPAN == 0 else 0


def conv_panel_width(device: str, dtype: DType, out_channels: int) -> int:
    """Output channels per panel of the weight's copy that a convolution computing them innermost reads (see
    channels_last): two hardware vectors, the width of its register tile, where they divide out_channels; else 0
    (the copy has C_out innermost).

    A tile's vectors of output channels read, at each step of the reduction, one row of the copy's C_out: rows
    C_out apart, 4 KB at 1024 channels, in few of the L1's sets and a new page each step. In panels (C_out / width,
    C_in, *kernel, width) the tile reads one contiguous block, as a matrix product's B panels (panel_width).
    ResNet-50's 1 x 1 convolutions on 2 AVX-512 cores: 89 -> 71 ms a batch of 8; its 3 x 3 and 7 x 7, 79 -> 67."""
    return weight_panel_width(device, dtype, out_channels)


def weight_panel_width(device: str, dtype: DType, rows: int) -> int:
    """Rows per panel in which to keep a weight (rows, k) that products on `device` read computing its rows
    innermost (a convolution's output channels, a linear layer's outputs), multiplying in `dtype`: two hardware
    vectors, a register tile's width, where they divide `rows`; else 0 (kept as it is). A loaded model's weight so
    kept (tiny.tensor.weight_forms.Panels) is read as panel_width's copy is, by every product, with no copy made:
    a 1B model's float16 products of a 32-token prompt on 2 AVX2 cores, 115-130 -> 165 GFLOPS."""
    caps = Device[device].renderer.caps
    width = 2 * caps.vector_lanes(dtype)
    return width if not caps.has_local and width > 2 and rows % width == 0 else 0


def panel_width(device: str | tuple[str, ...], dtype: DType, rows: int, m: int, k: int) -> int:
    """Columns per panel of B where a matrix product (rows x k) @ (k x m) on `device` reads B from panels, else 0.

    A register tile of C reads B `width` columns at a time down all k rows. Where B's rows are long, those reads
    are a page or more apart: they evict each other from the cache and defeat the prefetcher, so the product waits
    on memory. A copy of B in panels (each width x k block contiguous) costs one pass over B and lets a panel stay
    in cache while every row block of A passes it. Even a B that fits the cache gains from 256 x 256 on: its rows,
    1 KB or more apart, fall in a few of the L1's sets and evict each other (8192 x 320 @ 320 x 320 on 2 AVX-512
    cores: 148 -> 450 GFLOPS; 1024 x 256 @ 256 x 256: 135 -> 253). Only where enough rows of A share the copy;
    width is two hardware vectors, the tile's width, or one where m is no multiple of two (B's columns then padded
    with zeros to whole panels). Not on several devices: the panels' reshape would cut through the shards of a
    weight split along its columns."""
    if type(device) is tuple:
        return 0
    caps = Device[device].renderer.caps
    if caps.has_local or dtype not in PANEL_DTYPES or not all(type(x) is int for x in (rows, m, k)):
        return 0  # (nor where a size is symbolic)
    lanes = caps.vector_lanes(dtype)
    if m * k < PANEL_MIN_B or rows < PANEL_MIN_ROWS or lanes < 2:
        return 0
    if m % (2 * lanes) == 0:
        return 2 * lanes
    # columns that are no whole number of tiles: panels one vector wide, the last padded with zeros (an attention
    # head of 40 in 3 vectors of 16: its product with the probabilities took vectors of 8, half the machine's width)
    return lanes if whole_vectors(device, dtype, m) % lanes == 0 else 0


def whole_vectors(device: str, dtype: DType, n: int) -> int:
    """n rounded up to whole vectors of `device` (a loop device's lanes for dtype) where that adds at most a fifth
    (PANEL_MAX_PAD): the length to which a product pads what its vectors run along (B's columns, attention's keys);
    n itself elsewhere, on a device with workgroups, or where n is symbolic."""
    caps = Device[device].renderer.caps
    if caps.has_local or type(n) is not int:
        return n
    lanes = caps.vector_lanes(dtype)
    whole = -(-n // lanes) * lanes
    return whole if lanes > 1 and (whole - n) * PANEL_MAX_PAD <= whole else n


def byte_dot_rows(device: str, rows: int) -> int:
    """Rows of a quantized weight (integer blocks times a scale: GGUF's Q8_0, Q4_0) to keep side by side, word by
    word, where a product on `device` multiplies its blocks as bytes (Ops.DOT4): one row per int32 lane of a hardware
    vector, where the renderer writes DOT4 and those lanes divide `rows`; else 0 (row by row, dequantized to float32
    in the product's kernel).

    Side by side, a vector of a block's words holds one word of each of 16 rows, each multiplied by the same word of
    the input (broadcast), their 16 block sums scaled by 16 contiguous scales: no lane sums, no gathers. A 5632 x
    2048 Q4_0 matrix-vector product on one AVX-512 core reads its 6.5 MB so at 40 GB/s."""
    caps = Device[device].renderer.caps
    lanes = caps.vector_lanes(dtypes.int32)
    return lanes if caps.dot4 and not caps.has_local and lanes > 1 and rows % lanes == 0 else 0
