"""tiny.nn.gguf: GGUF files written by llama.cpp's `gguf` package, read back and dequantized."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tiny.ir.config import Context
from tiny.ir.device import Device, buffer_of
from tiny.ir.dtypes import dtypes
from tiny.ir.schedule import layout
from tiny.ir.uop import Ops
from tiny.nn.gguf import gguf_load
from tiny.tensor import Tensor
from tiny.tensor.weight_forms import Panels, form_of

gguf = pytest.importorskip("gguf")
QT = gguf.GGMLQuantizationType
quants = gguf.quants


def _write(path: Path, tensors: dict[str, tuple[np.ndarray, QT | None]], kv: dict[str, object] | None = None) -> Path:
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in (kv or {}).items():
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, list):
            writer.add_array(key, value)
        elif isinstance(value, float):
            writer.add_float64(key, value)
        else:
            writer.add_uint32(key, value)
    for name, (array, raw_dtype) in tensors.items():
        writer.add_tensor(name, array, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_float_tensors_round_trip(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    f32 = rng.standard_normal((3, 5, 7)).astype(np.float32)
    f16 = rng.standard_normal((4, 6)).astype(np.float16)
    vec = np.arange(10, dtype=np.float32)
    path = _write(tmp_path / "f.gguf", {"a": (f32, None), "b": (f16, None), "v": (vec, None)})
    tensors, _ = gguf_load(path)
    assert tensors["a"].shape == (3, 5, 7) and tensors["b"].shape == (4, 6) and tensors["v"].shape == (10,)
    np.testing.assert_array_equal(tensors["a"].numpy(), f32)
    np.testing.assert_array_equal(tensors["b"].numpy(), f16.astype(np.float32))
    np.testing.assert_array_equal(tensors["v"].numpy(), vec)


@pytest.mark.parametrize("qtype", [QT.Q8_0, QT.Q4_0])
def test_quantized_matches_reference(tmp_path: Path, qtype: QT) -> None:
    x = np.random.default_rng(1).standard_normal((6, 64)).astype(np.float32)
    packed = quants.quantize(x, qtype)
    path = _write(tmp_path / "q.gguf", {"w": (packed, qtype)})
    tensors, _ = gguf_load(path)
    reference = quants.dequantize(packed, qtype)
    assert tensors["w"].shape == (6, 64)
    np.testing.assert_array_equal(tensors["w"].numpy(), reference)
    np.testing.assert_allclose(tensors["w"].numpy(), x, atol=0.5)  # and it is a quantization of x


def test_q4_k_matches_reference(tmp_path: Path) -> None:
    # the gguf package can dequantize Q4_K but not quantize it: random super-blocks with finite f16 scales
    rng = np.random.default_rng(2)
    n_blocks = 6
    blocks = rng.integers(0, 256, size=(n_blocks, 144), dtype=np.uint8)
    scales = rng.uniform(-0.1, 0.1, size=(n_blocks, 2)).astype("<f2")
    blocks[:, 0:4] = scales.view(np.uint8)
    packed = blocks.reshape(2, 3 * 144)
    path = _write(tmp_path / "k.gguf", {"w": (packed, QT.Q4_K)})
    tensors, _ = gguf_load(path)
    reference = quants.dequantize(packed, QT.Q4_K)
    assert tensors["w"].shape == (2, 768) == reference.shape
    np.testing.assert_allclose(tensors["w"].numpy(), reference, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("qtype", [QT.Q4_1, QT.Q5_0, QT.Q5_1])
def test_more_quantizations_match_reference(tmp_path: Path, qtype: QT) -> None:
    x = np.random.default_rng(4).standard_normal((5, 96)).astype(np.float32)
    packed = quants.quantize(x, qtype)
    tensors, _ = gguf_load(_write(tmp_path / "q.gguf", {"w": (packed, qtype)}))
    np.testing.assert_array_equal(tensors["w"].numpy(), quants.dequantize(packed, qtype))
    np.testing.assert_allclose(tensors["w"].numpy(), x, atol=0.5)


@pytest.mark.parametrize(
    ("qtype", "size", "scales"),
    [(QT.Q2_K, 84, (80, 84)), (QT.Q3_K, 110, (108, 110)), (QT.Q5_K, 176, (0, 4)), (QT.Q6_K, 210, (208, 210))],
)
def test_k_quantizations_match_reference(tmp_path: Path, qtype: QT, size: int, scales: tuple[int, int]) -> None:
    """Random super-blocks (the gguf package dequantizes these but does not quantize them) with finite f16 scales."""
    rng = np.random.default_rng(5)
    blocks = rng.integers(0, 256, size=(6, size), dtype=np.uint8)
    lo, hi = scales
    blocks[:, lo:hi] = rng.uniform(-0.1, 0.1, size=(6, (hi - lo) // 2)).astype("<f2").view(np.uint8)
    packed = blocks.reshape(2, 3 * size)
    tensors, _ = gguf_load(_write(tmp_path / "k.gguf", {"w": (packed, qtype)}))
    reference = quants.dequantize(packed, qtype)
    assert tensors["w"].shape == (2, 768) == reference.shape
    np.testing.assert_array_equal(tensors["w"].numpy(), reference)


# the K-quantizations the gguf package cannot quantize: bytes per super-block, where its f16 scales lie
_K_BLOCKS = {QT.Q2_K: (84, (80, 84)), QT.Q3_K: (110, (108, 110)), QT.Q4_K: (144, (0, 4)), QT.Q5_K: (176, (0, 4))}
_K_BLOCKS[QT.Q6_K] = (210, (208, 210))
_EVERY_TYPE = [QT.F16, QT.BF16, QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, *_K_BLOCKS]


def _packed(qtype: QT, rows: int, cols: int, seed: int) -> np.ndarray:
    """rows x cols values in `qtype`, as the gguf package writes them: quantized by it where it can, else random
    super-blocks (every bit pattern of the quants and the 6-bit scales) with finite f16 scales."""
    rng = np.random.default_rng(seed)
    if qtype not in _K_BLOCKS:
        return quants.quantize(rng.standard_normal((rows, cols)).astype(np.float32), qtype)
    size, (lo, hi) = _K_BLOCKS[qtype]
    blocks = rng.integers(0, 256, size=(rows * cols // 256, size), dtype=np.uint8)
    blocks[:, lo:hi] = rng.uniform(-0.1, 0.1, size=(len(blocks), (hi - lo) // 2)).astype("<f2").view(np.uint8)
    return blocks.reshape(rows, -1)


def _kernels(t: Tensor) -> int:
    return sum(1 for item in t.schedule() if item.ast.op is Ops.SINK)


@pytest.mark.parametrize("qtype", _EVERY_TYPE, ids=lambda q: q.name)
def test_every_type_stays_as_stored_and_is_the_gguf_packages_values(tmp_path: Path, qtype: QT) -> None:
    """dequantize=False: the device holds the file's bytes (not 4-8x as many of float32), and the lazy tensor, one
    kernel, computes gguf.dequantize's values bit for bit, as the host path does."""
    packed = _packed(qtype, 3, 512, seed=int(qtype))
    path = _write(tmp_path / "q.gguf", {"w": (packed, qtype)})
    reference = quants.dequantize(packed, qtype)
    lazy = gguf_load(path, dequantize=False)[0]["w"]
    host = gguf_load(path)[0]["w"]
    assert lazy.shape == host.shape == reference.shape == (3, 512)
    held = {id(buffer_of(u)): buffer_of(u).nbytes for u in lazy.uop.toposort if u.op is Ops.BUFFER}
    assert sum(held.values()) == packed.nbytes < reference.nbytes  # (the fields of the blocks, nothing besides)
    assert _kernels(lazy) == 1
    bits = np.uint32
    np.testing.assert_array_equal(lazy.numpy().view(bits), reference.view(bits))
    np.testing.assert_array_equal(host.numpy().view(bits), reference.view(bits))


@pytest.mark.parametrize("qtype", _EVERY_TYPE, ids=lambda q: q.name)
def test_a_product_over_a_lazy_weight_matches_numpy(tmp_path: Path, qtype: QT) -> None:
    """x @ w.T over the blocks: the product of the dequantized values. Its kernels: the product, after one that
    dequantizes the blocks for it where the values come in blocks (no more: the lazy graph fuses whole)."""
    packed = _packed(qtype, 8, 512, seed=7)
    w = gguf_load(_write(tmp_path / "q.gguf", {"w": (packed, qtype)}), dequantize=False)[0]["w"]
    x = np.random.default_rng(8).standard_normal((3, 512)).astype(np.float32)
    out = Tensor(x).realize() @ w.T
    assert _kernels(out) <= (1 if qtype in (QT.F16, QT.BF16) else 2)
    want = x.astype(np.float64) @ quants.dequantize(packed, qtype).T.astype(np.float64)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("qtype", _EVERY_TYPE, ids=lambda q: q.name)
def test_a_linear_layer_over_a_lazy_weight_is_one_kernel(tmp_path: Path, qtype: QT) -> None:
    """x.linear(w) (what nn.Linear and the language models call) reads a quantized weight as its blocks
    (Tensor.blocks): the dequantization runs inside the product's kernel, with no float32 copy of the weight; one row
    of it picked by a bound Variable (a decode step's token embedding) is a view of its blocks. (Loaded with
    Q8_ACTIVATIONS=0: where the device multiplies bytes, a Q8_0 or Q4_0 product otherwise rounds x to int8 first, in
    kernels of its own; test_products_of_bytes_give_llama_cpps_integer_product.)"""
    from tiny.tensor import Variable

    packed = _packed(qtype, 8, 512, seed=9)
    with Context(Q8_ACTIVATIONS=0):
        w = gguf_load(_write(tmp_path / "q.gguf", {"w": (packed, qtype)}), dequantize=False)[0]["w"]
    dense = quants.dequantize(packed, qtype)
    x = np.random.default_rng(10).standard_normal((3, 512)).astype(np.float32)
    out = Tensor(x).realize().linear(w)
    assert _kernels(out) == 1
    want = x.astype(np.float64) @ dense.T.astype(np.float64)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    assert (w.blocks() is None) == (qtype in (QT.F16, QT.BF16))  # (those are one value a block: no split)
    if w.blocks() is not None:
        row = Variable("row", 0, 7).bind(5)
        picked = w.blocks()[row : row + 1].reshape(1, 512)
        assert _kernels(picked) == 1
        np.testing.assert_array_equal(picked.numpy()[0].view(np.uint32), dense[5].view(np.uint32))


@pytest.mark.parametrize("qtype", [QT.F32, QT.F16, QT.BF16], ids=lambda q: q.name)
def test_float_matrices_are_kept_in_panels_where_products_read_them(tmp_path: Path, qtype: QT) -> None:
    """Where the device's products read B from panels (layout.weight_panel_width: the CPU), dequantize=False keeps an
    F32, F16 or BF16 matrix whose rows are a whole number of panels in panels (weight_forms.Panels): the device holds
    the file's bytes once, the tensor is the file's values bit for bit, and a product over it (a decode step's row, a
    prompt's, and rows enough that a product would copy B into panels) is one kernel, no copy, equal to NumPy's.
    Rows that are no whole number of panels, and the tensors named in `lookups`, stay as stored."""
    width = layout.weight_panel_width(Device.DEFAULT, dtypes.float32, 64)
    if not width:
        pytest.skip(f"{Device.DEFAULT}'s products read no panels")
    rng = np.random.default_rng(13)
    packed = {
        n: quants.quantize(rng.standard_normal((rows, 256)).astype(np.float32), qtype)
        for n, rows in (("w", 64), ("odd", width + 8))
    }
    values = {n: quants.dequantize(p, qtype) for n, p in packed.items()}
    files = {"w": (packed["w"], qtype), "odd": (packed["odd"], qtype), "table": (packed["w"], qtype)}
    tensors = gguf_load(_write(tmp_path / "f.gguf", files), dequantize=False, lookups=("table",))[0]
    w, form = tensors["w"], form_of(tensors["w"])
    assert isinstance(form, Panels) and form.values.shape == (64 // width, 256, width)
    held = {id(buffer_of(u)): buffer_of(u).nbytes for u in w.uop.toposort if u.op is Ops.BUFFER}
    assert sum(held.values()) == packed["w"].nbytes
    bits = np.uint32
    np.testing.assert_array_equal(w.numpy().view(bits), values["w"].view(bits))
    for rows in (1, 32, 2 * layout.PANEL_MIN_ROWS):
        x = rng.standard_normal((rows, 256)).astype(np.float32)
        out = Tensor(x).realize().linear(w)
        assert _kernels(out) == 1
        want = x.astype(np.float64) @ values["w"].T.astype(np.float64)
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    assert form_of(tensors["odd"]) is None and form_of(tensors["table"]) is None
    np.testing.assert_array_equal(tensors["odd"].numpy().view(bits), values["odd"].view(bits))


def _q8_0_product(x: np.ndarray, packed: np.ndarray, qtype: QT) -> np.ndarray:
    """llama.cpp's product over Q8_0/Q4_0/Q5_0 blocks, in NumPy: each block of 32 of x rounded to int8 with the scale
    max|x| / 127 (kept as float16; halves rounded away from 0, as quantize_row_q8_0), the integer products summed per
    block exactly, then scaled by both scales and summed."""
    dense = quants.dequantize(packed, qtype).reshape(packed.shape[0], -1, 32)
    scales = np.ascontiguousarray(packed.reshape(*dense.shape[:2], -1)[..., :2]).view(np.float16)[..., 0]
    scales = scales.astype(np.float32)
    qw = np.round(dense / np.where(scales == 0, 1, scales)[..., None]).astype(np.int64)
    xb = x.reshape(x.shape[0], -1, 32)
    dx = np.abs(xb).max(axis=-1) / 127
    v = xb * np.where(dx > 0, 1 / np.where(dx > 0, dx, 1), 0)[..., None]
    qx = np.trunc(v + np.where(v < 0, -0.5, 0.5)).astype(np.int64)
    dots = np.einsum("mbi,rbi->mrb", qx, qw).astype(np.float64)
    return (dots * scales[None] * dx.astype(np.float16).astype(np.float64)[:, None]).sum(axis=-1)


def _multiplies_bytes(rows: int) -> bool:
    return layout.byte_dot_rows(Device.DEFAULT, rows) > 0


@pytest.mark.parametrize("qtype", [QT.Q8_0, QT.Q4_0, QT.Q5_0, QT.Q4_1, QT.Q4_K], ids=lambda q: q.name)
def test_products_of_bytes_give_llama_cpps_integer_product(tmp_path: Path, qtype: QT) -> None:
    """Where the device multiplies bytes (x86 with VNNI or AVX2: the CPU's C), a Q8_0 or Q4_0 matrix is kept as int32
    words with a vector's rows side by side, and linear() over it rounds x to int8 a block and sums each block's
    products in int32 (DOT4), as llama.cpp: NumPy's model of llama.cpp's product, for a decode step's row and a
    prompt's. The tensor is still the gguf package's values bit for bit, and the device holds the file's bytes. With
    Q8_ACTIVATIONS=0 at loading, and for the blocks with a minimum added (Q4_1, the K quants), the float32 product."""
    packed = _packed(qtype, 48, 512, seed=11)
    path = _write(tmp_path / "q.gguf", {"w": (packed, qtype)})
    w = gguf_load(path, dequantize=False)[0]["w"]
    with Context(Q8_ACTIVATIONS=0):
        stored = gguf_load(path, dequantize=False)[0]["w"]
    dense = quants.dequantize(packed, qtype)
    x = np.random.default_rng(12).standard_normal((6, 512)).astype(np.float32)
    x[1, :32] = 0.0  # (a block of zeros: scale 0, quants 0)
    floats = Tensor(x).realize().linear(stored).numpy()
    np.testing.assert_allclose(floats, x.astype(np.float64) @ dense.T, rtol=1e-4, atol=1e-4 * np.abs(floats).max())
    words = qtype in (QT.Q8_0, QT.Q4_0) and _multiplies_bytes(48)
    assert (form_of(w) is not None) == words
    for rows in (x[:1], x):  # (a decode step's row, and a prompt)
        got = Tensor(rows).realize().linear(w).numpy()
        if not words:
            np.testing.assert_array_equal(got, floats[: len(rows)])
            continue
        want = _q8_0_product(rows, packed, qtype)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
        assert np.abs(floats[: len(rows)] - want).max() > 1e-4 * np.abs(want).max()  # (float32's is another number)
    held = {id(buffer_of(u)): buffer_of(u).nbytes for u in w.uop.toposort if u.op is Ops.BUFFER}
    assert sum(held.values()) == packed.nbytes
    np.testing.assert_array_equal(w.numpy().view(np.uint32), dense.view(np.uint32))


def test_metadata_round_trip(tmp_path: Path) -> None:
    kv = {"tiny.count": 7, "tiny.name": "hello", "tiny.flag": True, "tiny.ratio": 0.25, "tiny.list": [1, 2, 3]}
    kv["tiny.words"] = ["a", "bc"]
    path = _write(tmp_path / "m.gguf", {"x": (np.zeros(4, np.float32), None)}, kv)
    _, meta = gguf_load(path)
    assert meta["general.architecture"] == "llama"
    for key, value in kv.items():
        assert meta[key] == value, key


def test_alignment_is_honoured(tmp_path: Path) -> None:
    a, b = np.arange(3, dtype=np.float32), np.arange(5, dtype=np.float32) + 10
    path = _write(tmp_path / "al.gguf", {"a": (a, None), "b": (b, None)}, {"general.alignment": 64})
    tensors, meta = gguf_load(path)
    assert meta["general.alignment"] == 64
    np.testing.assert_array_equal(tensors["b"].numpy(), b)


def test_truncated_file_raises(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.gguf", {"w": (np.ones((8, 8), np.float32), None)})
    data = path.read_bytes()
    (tmp_path / "cut_data.gguf").write_bytes(data[:-16])
    with pytest.raises(ValueError, match="truncated.*data of tensor 'w'"):
        gguf_load(tmp_path / "cut_data.gguf")
    (tmp_path / "cut_header.gguf").write_bytes(data[:30])
    with pytest.raises(ValueError, match="truncated"):
        gguf_load(tmp_path / "cut_header.gguf")


def test_bad_magic_and_unsupported_type(tmp_path: Path) -> None:
    (tmp_path / "bad.gguf").write_bytes(b"NOPE" + bytes(20))
    with pytest.raises(ValueError, match="not a GGUF file"):
        gguf_load(tmp_path / "bad.gguf")
    blocks = np.zeros((2, 66), np.uint8)  # IQ2_XXS: a type tiny does not read
    path = _write(tmp_path / "iq.gguf", {"w": (blocks, QT.IQ2_XXS)})
    with pytest.raises(ValueError, match="IQ2_XXS"):
        gguf_load(path)


def test_the_biggest_tensors_are_read_first_and_handed_back_in_the_files_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tensor's bytes as read (and the fields made of them) are held beside its device copy while it is made: read
    biggest first, the peak is the model's memory plus a small tensor's, not plus the embedding's twice (a 1B Q4_0
    model's peak 0.66 -> 0.58 GB). The names come back in the file's order."""
    rng = np.random.default_rng(0)
    arrays = {"small": (4, 32), "big": (64, 32), "middle": (16, 32)}
    path = _write(
        tmp_path / "m.gguf", {n: (rng.standard_normal(s).astype(np.float32), None) for n, s in arrays.items()}
    )
    read: list[int] = []
    real = np.fromfile

    def fromfile(*args: object, **kwargs: object) -> np.ndarray:
        out = real(*args, **kwargs)  # type: ignore[call-overload]
        read.append(out.nbytes)
        return out

    monkeypatch.setattr(np, "fromfile", fromfile)
    tensors, _ = gguf_load(path)
    assert read == sorted(read, reverse=True) and len(read) == 3
    assert list(tensors) == ["small", "big", "middle"]


@pytest.mark.parametrize("qtype", [QT.F32, QT.F16, QT.Q8_0, QT.Q4_0, QT.Q4_K], ids=lambda q: q.name)
def test_tensors_joined_by_rows_are_read_as_one(tmp_path: Path, qtype: QT) -> None:
    """gguf_load's joins: each layer's query, key and value weights (and biases) read as one tensor of their rows
    one after another, of their type (Q8_0 and Q4_0 as words for products of bytes where the device multiplies
    bytes): its values are the parts' and a product over it is the parts' products. A layer whose parts differ in
    type, or that lacks one, keeps them apart under their own names; so does a file that has the joined name."""
    ends = {"weight": ("attn_q.weight", "attn_k.weight", "attn_v.weight"), "bias": ("attn_q.bias", "attn_k.bias")}
    joins = {"attn_qkv.weight": ends["weight"], "attn_qk.bias": ends["bias"]}
    rows = {"attn_q.weight": 64, "attn_k.weight": 32, "attn_v.weight": 32}  # (whole panels of 16 or 32 rows)
    parts = {end: (_packed(qtype, n, 256, seed=n + i), qtype) for i, (end, n) in enumerate(rows.items())}
    biases = {"attn_q.bias": np.arange(64, dtype=np.float32), "attn_k.bias": np.arange(32, dtype=np.float32) + 0.5}
    other = QT.F16 if qtype == QT.F32 else QT.F32
    tensors = {f"blk.0.{end}": part for end, part in parts.items()}
    tensors |= {f"blk.0.{end}": (a, None) for end, a in biases.items()}
    tensors |= {f"blk.1.{end}": part for end, part in parts.items() if end != "attn_v.weight"}  # (no value)
    tensors |= {f"blk.2.{end}": part for end, part in parts.items() if end != "attn_v.weight"}
    tensors["blk.2.attn_v.weight"] = (_packed(other, 32, 256, seed=3), other)  # (of another type)
    tensors |= {f"blk.3.{end}": part for end, part in parts.items()}
    tensors["blk.3.attn_qkv.weight"] = (np.ones(4, np.float32), None)  # (the joined name taken)
    path = _write(tmp_path / "q.gguf", tensors)
    loaded = gguf_load(path, dequantize=False, joins=joins)[0]
    apart = gguf_load(path, dequantize=False)[0]
    assert sorted(loaded) == sorted(
        ["blk.0.attn_qkv.weight", "blk.0.attn_qk.bias"] + [n for n in tensors if not n.startswith("blk.0.")]
    )
    joined = loaded["blk.0.attn_qkv.weight"]
    assert joined.shape == (128, 256)
    # (the product first: a weight computed into memory is no longer the graph its words are registered for)
    assert (form_of(joined) is not None) == (form_of(apart["blk.0.attn_q.weight"]) is not None)
    x = Tensor(np.random.default_rng(4).standard_normal((3, 256)).astype(np.float32)).realize()
    products = np.concatenate([x.linear(apart[f"blk.0.{end}"]).numpy() for end in ends["weight"]], axis=-1)
    np.testing.assert_allclose(x.linear(joined).numpy(), products, rtol=1e-5, atol=1e-5 * np.abs(products).max())
    want = np.concatenate([quants.dequantize(parts[end][0], qtype) for end in ends["weight"]])
    np.testing.assert_array_equal(joined.numpy(), want)
    np.testing.assert_array_equal(loaded["blk.0.attn_qk.bias"].numpy(), np.concatenate(list(biases.values())))
    for name in ("blk.1.attn_q.weight", "blk.2.attn_v.weight", "blk.3.attn_k.weight"):
        np.testing.assert_array_equal(loaded[name].numpy(), apart[name].numpy())
