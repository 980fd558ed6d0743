"""tiny.models.rows: token embeddings by row views against Embedding's lookup (and numpy), quantized tables
included, and a decode step's one token bound as a Variable."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tiny.models.rows import embed_rows
from tiny.nn import Embedding
from tiny.tensor import Tensor, Variable
from tiny.tensor.realize import programs


def _table(rows: int, width: int) -> Embedding:
    e = Embedding(rows, width)
    e.weight = Tensor(np.random.default_rng(rows).standard_normal((rows, width)).astype(np.float32)).realize()
    return e


def test_rows_of_a_prompt_are_the_lookup() -> None:
    e = _table(50, 8)
    ids = np.random.default_rng(1).integers(-50, 50, (2, 9))
    got = embed_rows(e, Tensor(ids.astype(np.int32)))
    assert got.shape == (2, 9, 8)
    np.testing.assert_array_equal(got.numpy(), e.weight.numpy()[ids])
    np.testing.assert_array_equal(got.numpy(), e(Tensor(ids.astype(np.int32))).numpy())


def test_another_prompt_reuses_one_compiled_copy() -> None:
    """Each id is a bound Variable of one jitted copy: no kernel is built for another prompt of the length."""
    e = _table(300, 16)
    first = np.random.default_rng(2).integers(0, 300, (1, 40))
    embed_rows(e, Tensor(first.astype(np.int32))).realize()
    before = len(programs())
    second = np.random.default_rng(3).integers(0, 300, (1, 40))
    np.testing.assert_array_equal(embed_rows(e, Tensor(second.astype(np.int32))).numpy(), e.weight.numpy()[second])
    assert len(programs()) == before
    longer = np.random.default_rng(4).integers(0, 300, (1, 60))  # (the same copier: 64 rows)
    np.testing.assert_array_equal(embed_rows(e, Tensor(longer.astype(np.int32))).numpy(), e.weight.numpy()[longer])


def test_one_token_as_a_bound_variable() -> None:
    e = _table(20, 4)
    token = Variable("token", 0, 19)
    np.testing.assert_array_equal(embed_rows(e, token.bind(13)).numpy(), e.weight.numpy()[13].reshape(1, 1, 4))


def test_a_table_that_takes_gradients_keeps_the_lookup() -> None:
    e = Embedding(10, 4)  # (its weight requires grad: the lookup's own, which gradients flow through)
    out = embed_rows(e, Tensor([[1, 2, 1]]))
    out.sum().backward()
    assert e.weight.grad is not None
    np.testing.assert_array_equal(e.weight.grad.numpy()[1], np.full(4, 2.0, np.float32))


def test_bad_ids_are_a_clear_error() -> None:
    e = _table(10, 4)
    with pytest.raises(IndexError, match=r"token ids must be in \[-10, 10\)"):
        embed_rows(e, Tensor([[3, 10]]))
    with pytest.raises(TypeError, match="integer"):
        embed_rows(e, Tensor([[1.0]]))


def test_rows_of_a_quantized_table_are_its_values(tmp_path: Path) -> None:
    """A Q8_0 table stays blocks on the device; a row picked by a Variable or by a prompt is those of the
    dequantized table, and no float32 copy of the table is made."""
    gguf = pytest.importorskip("gguf")
    from tiny.nn.gguf import gguf_load

    table = np.random.default_rng(4).standard_normal((64, 64)).astype(np.float32)
    kind = gguf.GGMLQuantizationType.Q8_0
    w = gguf.GGUFWriter(str(tmp_path / "t.gguf"), "llama")
    w.add_tensor("t", gguf.quants.quantize(table, kind), raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    e = Embedding(64, 64)
    e.weight = gguf_load(tmp_path / "t.gguf", dequantize=False)[0]["t"]
    dense = gguf_load(tmp_path / "t.gguf")[0]["t"].numpy()
    ids = np.array([[5, 63, 0, 5]])
    np.testing.assert_array_equal(embed_rows(e, Tensor(ids.astype(np.int32))).numpy(), dense[ids])
    token = Variable("token", 0, 63)
    np.testing.assert_array_equal(embed_rows(e, token.bind(17)).numpy()[0, 0], dense[17])
