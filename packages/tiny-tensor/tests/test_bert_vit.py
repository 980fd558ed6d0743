"""tiny.models.bert and tiny.models.vit against Hugging Face transformers: small random-initialized models saved with
save_pretrained and loaded by tiny; hidden states, pooled outputs and logits equal to 1e-4 in float32 (and in
float16 as near as transformers' float16), gradients of an input through the whole model equal to torch's, and the
errors a wrong folder gets.
(No model hub is reachable: the weights are random, which checks every weight's place as well as trained ones do.)"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from half_compare import assert_half_close

from tiny.models import bert, vit
from tiny.tensor import Tensor, dtypes

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

TOL = {"rtol": 1e-4, "atol": 1e-4}
BERT = {
    "vocab_size": 99,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "max_position_embeddings": 40,
    "type_vocab_size": 3,
    "initializer_range": 0.2,  # (transformers' 0.02 makes attention nearly uniform: a wrong mask would hardly show)
}
VIT = {
    "image_size": 32,
    "patch_size": 8,
    "num_channels": 3,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "initializer_range": 0.2,
}
IDS = np.array([[2, 17, 45, 8, 93, 61, 30, 5, 3], [2, 71, 12, 66, 3, 0, 0, 0, 0]], dtype=np.int64)
MASK = (IDS != 0).astype(np.int64)  # the second sequence is padded after 5 tokens
TYPES = np.array([[0, 0, 0, 0, 1, 1, 1, 1, 1], [0, 0, 2, 2, 2, 0, 0, 0, 0]], dtype=np.int64)


def _saved(model: object, folder: Path, **save: object) -> object:
    """The model with random biases and LayerNorm weights (transformers starts them at 0 and 1, which hides a
    misplaced one), saved to folder."""
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "LayerNorm" in name or "layernorm" in name:
                p.normal_(0, 0.3)
    model.eval().save_pretrained(folder, **save)
    return model


def _bert(cls: str, folder: Path, **cfg: object) -> object:
    torch.manual_seed(1)
    return _saved(getattr(transformers, cls)(transformers.BertConfig(**{**BERT, **cfg})), folder)


def _vit(cls: str, folder: Path, **save: object) -> object:
    torch.manual_seed(2)
    return _saved(getattr(transformers, cls)(transformers.ViTConfig(**VIT, num_labels=5)), folder, **save)


def _pixels(batch: int = 2) -> np.ndarray:
    return np.random.default_rng(3).standard_normal((batch, 3, 32, 32)).astype(np.float32)


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_bert_masked_lm_with_padding_and_token_types_equals_transformers(tied: bool, tmp_path: Path) -> None:
    """The decoder is the word embeddings where the config ties them (the file has no copy), else its own weight."""
    ref = _bert("BertForMaskedLM", tmp_path, tie_word_embeddings=tied)
    with torch.no_grad():
        want = ref(
            torch.tensor(IDS), attention_mask=torch.tensor(MASK), token_type_ids=torch.tensor(TYPES),
            output_hidden_states=True,
        )  # fmt: skip
    model = bert.load(tmp_path)
    assert isinstance(model, bert.BertForMaskedLM)
    got = model(IDS, attention_mask=MASK, token_type_ids=TYPES)
    np.testing.assert_allclose(got.last_hidden_state.numpy(), want.hidden_states[-1].numpy(), **TOL)
    np.testing.assert_allclose(got.logits.numpy(), want.logits.numpy(), **TOL)
    assert (model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight) == tied
    # the padding changed what the padded sequence's tokens see, and only theirs
    unmasked = model(IDS, token_type_ids=TYPES).logits.numpy()
    assert not np.allclose(unmasked[1], want.logits.numpy()[1], atol=1e-3)
    np.testing.assert_allclose(unmasked[0], want.logits.numpy()[0], **TOL)  # (the first sequence has no padding)


def test_bert_model_hidden_states_and_pooler_equal_transformers(tmp_path: Path) -> None:
    """BertModel's files have no "bert." prefix; its activation here is gelu_new (tanh) and positions are given."""
    ref = _bert("BertModel", tmp_path, hidden_act="gelu_new")
    positions = np.array([[3, 4, 5, 6, 7, 8, 9, 10, 11], [0, 1, 2, 3, 4, 5, 6, 7, 8]], dtype=np.int64)
    with torch.no_grad():
        want = ref(
            torch.tensor(IDS), attention_mask=torch.tensor(MASK), token_type_ids=torch.tensor(TYPES),
            position_ids=torch.tensor(positions),
        )  # fmt: skip
    model = bert.load(tmp_path)
    assert isinstance(model, bert.BertModel)
    got = model(Tensor(IDS), attention_mask=Tensor(MASK), token_type_ids=TYPES, position_ids=positions)
    np.testing.assert_allclose(got.last_hidden_state.numpy(), want.last_hidden_state.numpy(), **TOL)
    np.testing.assert_allclose(got.pooler_output.numpy(), want.pooler_output.numpy(), **TOL)


@pytest.mark.parametrize("head", ["BertForSequenceClassification", "BertForTokenClassification"])
def test_bert_classifiers_equal_transformers(head: str, tmp_path: Path) -> None:
    ref = _bert(head, tmp_path, num_labels=3)
    with torch.no_grad():
        want = ref(torch.tensor(IDS), attention_mask=torch.tensor(MASK)).logits.numpy()
    got = bert.load(tmp_path)(IDS, attention_mask=MASK).logits.numpy()
    assert got.shape == ((2, 3) if head == "BertForSequenceClassification" else (2, 9, 3))
    np.testing.assert_allclose(got, want, **TOL)


def test_bert_model_from_a_classifiers_float16_file_with_old_names(tmp_path: Path) -> None:
    """A BertModel config over a BertForSequenceClassification's file (names under "bert.", a classifier besides),
    its weights in float16 and LayerNorm's named gamma and beta as old checkpoints name them: read and cast to float32,
    the classifier left as transformers leaves it."""
    ref = _bert("BertForSequenceClassification", tmp_path)
    state = safetensors_torch.load_file(tmp_path / "model.safetensors")
    old = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v.half()
           for k, v in state.items()}  # fmt: skip
    assert "bert.embeddings.LayerNorm.gamma" in old and "classifier.weight" in old
    safetensors_torch.save_file(old, tmp_path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "architectures": ["BertModel"]}))
    base = ref.bert.half().float()  # (the weights rounded to float16, as the file holds them)
    with torch.no_grad():
        want = base(torch.tensor(IDS), attention_mask=torch.tensor(MASK))
    model = bert.load(tmp_path)
    assert isinstance(model, bert.BertModel)
    got = model(IDS, attention_mask=MASK)
    np.testing.assert_allclose(got.last_hidden_state.numpy(), want.last_hidden_state.numpy(), **TOL)
    np.testing.assert_allclose(got.pooler_output.numpy(), want.pooler_output.numpy(), **TOL)


def test_bert_and_vit_in_float16(tmp_path: Path) -> None:
    """dtype=float16: BERT (padding mask, token types) and ViT (at its size and at another) compute in half, as near
    the float32 outputs of the same weights as transformers' float16 models are (half_compare)."""
    ref = _bert("BertModel", tmp_path / "bert").half().float()  # (the weights as float16 holds them)
    args = {"attention_mask": torch.tensor(MASK), "token_type_ids": torch.tensor(TYPES)}
    with torch.no_grad():
        want, want_half = ref(torch.tensor(IDS), **args), ref.half()(torch.tensor(IDS), **args)
    got = bert.load(tmp_path / "bert", dtype="float16")(IDS, attention_mask=MASK, token_type_ids=TYPES)
    for name in ("last_hidden_state", "pooler_output"):
        ours, theirs = getattr(got, name), getattr(want_half, name).float().numpy()
        assert_half_close(ours, getattr(want, name).numpy(), theirs, f"BERT's {name}")
    ref = _vit("ViTForImageClassification", tmp_path / "vit").half().float()
    model = vit.load(tmp_path / "vit", dtype=dtypes.float16)
    other = np.random.default_rng(6).standard_normal((1, 3, 48, 40)).astype(np.float32)
    for pixels, resize in ((_pixels(), False), (other, True)):
        with torch.no_grad():
            want = ref.float()(torch.tensor(pixels), interpolate_pos_encoding=resize).logits.numpy()
            want_half = ref.half()(torch.tensor(pixels).half(), interpolate_pos_encoding=resize).logits.float()
        assert_half_close(model(pixels, interpolate_pos_encoding=resize).logits, want, want_half.numpy(), "ViT logits")


def test_bert_gradients_equal_torch(tmp_path: Path) -> None:
    """d sum(pooler output * weights) / d inputs_embeds, and / d a query projection's weight, through every layer
    with a padded mask."""
    ref = _bert("BertModel", tmp_path)
    embeds = np.random.default_rng(4).standard_normal((2, 9, 64)).astype(np.float32)
    weights = np.random.default_rng(5).standard_normal((2, 64)).astype(np.float32)
    x = torch.tensor(embeds, requires_grad=True)
    out = ref(inputs_embeds=x, attention_mask=torch.tensor(MASK), token_type_ids=torch.tensor(TYPES))
    ((out.pooler_output * torch.tensor(weights)).sum() + out.last_hidden_state.sum()).backward()
    model = bert.load(tmp_path)
    query = model.encoder.layer[0].attention.self.query
    query.weight.requires_grad_()
    tx = Tensor(embeds, requires_grad=True)
    got = model(inputs_embeds=tx, attention_mask=MASK, token_type_ids=TYPES)
    ((got.pooler_output * Tensor(weights)).sum() + got.last_hidden_state.sum()).backward()
    np.testing.assert_allclose(tx.grad.numpy(), x.grad.numpy(), **TOL)
    want_w = ref.encoder.layer[0].attention.self.query.weight.grad.numpy()
    np.testing.assert_allclose(query.weight.grad.numpy(), want_w, **TOL)


def test_vit_classification_equals_transformers(tmp_path: Path) -> None:
    ref = _vit("ViTForImageClassification", tmp_path)
    pixels = _pixels()
    with torch.no_grad():
        want = ref(torch.tensor(pixels))
        final = ref.vit(torch.tensor(pixels)).last_hidden_state.numpy()
    model = vit.load(tmp_path)
    assert isinstance(model, vit.ViTForImageClassification)
    got = model(pixels)
    np.testing.assert_allclose(got.logits.numpy(), want.logits.numpy(), **TOL)
    np.testing.assert_allclose(got.last_hidden_state.numpy(), final, **TOL)
    # an image of another size and shape: the 4 x 4 grid of position embeddings resized to 6 x 5 patches
    other = np.random.default_rng(6).standard_normal((1, 3, 48, 40)).astype(np.float32)
    with torch.no_grad():
        want = ref(torch.tensor(other), interpolate_pos_encoding=True).logits.numpy()
    np.testing.assert_allclose(model(other, interpolate_pos_encoding=True).logits.numpy(), want, **TOL)


def test_vit_model_from_shards_with_pooler_and_gradients(tmp_path: Path) -> None:
    """ViTModel saved in shards of its index; hidden states, pooler, and d sum(outputs) / d pixels."""
    ref = _vit("ViTModel", tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").is_file() and not (tmp_path / "model.safetensors").exists()
    pixels = _pixels()
    x = torch.tensor(pixels, requires_grad=True)
    want = ref(x)
    (want.last_hidden_state.sum() + (want.pooler_output * 3).sum()).backward()
    model = vit.load(tmp_path)
    tx = Tensor(pixels, requires_grad=True)
    got = model(tx)
    np.testing.assert_allclose(got.last_hidden_state.numpy(), want.last_hidden_state.detach().numpy(), **TOL)
    np.testing.assert_allclose(got.pooler_output.numpy(), want.pooler_output.detach().numpy(), **TOL)
    (got.last_hidden_state.sum() + (got.pooler_output * 3).sum()).backward()
    np.testing.assert_allclose(tx.grad.numpy(), x.grad.numpy(), **TOL)


# ---------------------------------------------------------------- bad input


def test_a_folder_without_config_json(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        bert.load(tmp_path)
    with pytest.raises(FileNotFoundError, match="expected a Hugging Face model folder"):
        vit.load(tmp_path / "absent")


def test_a_config_of_another_architecture(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    with pytest.raises(ValueError, match=r"BertModel, BertForMaskedLM.*'GPT2LMHeadModel' \(model_type 'gpt2'\)"):
        bert.load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["BertForMaskedLM"], "model_type": "bert"}))
    with pytest.raises(ValueError, match=r"ViTModel, ViTForImageClassification.*'BertForMaskedLM'"):
        vit.load(tmp_path)


def test_a_missing_or_misshapen_tensor(tmp_path: Path) -> None:
    _vit("ViTForImageClassification", tmp_path)
    state = safetensors_torch.load_file(tmp_path / "model.safetensors")
    del state["vit.encoder.layer.1.attention.attention.key.weight"]
    state["classifier.bias"] = torch.zeros(7)
    safetensors_torch.save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError) as err:
        vit.load(tmp_path)
    assert "missing vit.encoder.layer.1.attention.attention.key.weight" in str(err.value)
    assert "shape of classifier.bias: the file has (7,), the config makes (5,)" in str(err.value)
    assert "the file has 39 tensors, 0 of them not the model's: []" in str(err.value)
    # another model's names (a prefix the loader does not know): the first 20 listed, and what the file has instead
    safetensors_torch.save_file({f"model.{k}": v for k, v in state.items()}, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"(?s)\.\.\. and 20 more.*39 tensors, 39 of them not the model's: \['model\."):
        vit.load(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="neither model.safetensors nor model.safetensors.index.json"):
        vit.load(tmp_path)


def test_bad_inputs_say_what_was_expected(tmp_path: Path) -> None:
    _vit("ViTModel", tmp_path)
    model = vit.load(tmp_path)
    with pytest.raises(ValueError, match=r"pixel_values must be \(batch, 3, 32, 32\), got shape \(1, 3, 16, 16\)"):
        model(np.zeros((1, 3, 16, 16), np.float32))
    with pytest.raises(ValueError, match=r"\(batch, 3, height, width\).*got shape \(1, 1, 16, 16\)"):
        model(np.zeros((1, 1, 16, 16), np.float32), interpolate_pos_encoding=True)
    folder = tmp_path / "bert"
    _bert("BertModel", folder)
    model = bert.load(folder)
    with pytest.raises(IndexError, match=r"input_ids must be in \[0, 99\), got 0..120"):
        model([[0, 120]])
    with pytest.raises(ValueError, match=r"attention_mask must be \(2, 9\) or \(2, 9, 9\), got \(2, 8\)"):
        model(IDS, attention_mask=MASK[:, :8])
    with pytest.raises(ValueError, match="41 tokens are past BERT's 40 positions"):
        model(np.ones((1, 41), np.int64))
