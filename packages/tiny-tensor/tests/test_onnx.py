"""tiny.onnx: ONNX's own backend node tests, models exported by torch.onnx.export against onnxruntime and torch,
the errors for what tiny.onnx cannot run, and the command line.

The node tests run on the default device. By default a fixed subset runs: the first runnable test of each op (by
name) and every NODE_STRIDE-th of the rest, and every 4th of the host-form tests (about a minute on two cores with
no compiled kernels cached). TINY_ONNX_NODE_TESTS=all runs every one
(`TINY_ONNX_NODE_TESTS=all pytest packages/tiny-tensor/tests/test_onnx.py`: about six minutes on two cores with no
cache, two with the kernels cached), and `python -m tiny.onnx.node_tests` prints passed / failed / skipped per op.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")

from onnx import TensorProto, helper  # noqa: E402

import tiny.onnx  # noqa: E402
from tiny.onnx.model import HOST_LIMIT, HOST_OPS  # noqa: E402
from tiny.onnx.node_tests import node_tests, run_node_test, skip_reason  # noqa: E402
from tiny.tensor import Tensor  # noqa: E402

NODE_TESTS = {t.name: t for t in node_tests()}
NODE_STRIDE = 50
FULL_SWEEP = os.environ.get("TINY_ONNX_NODE_TESTS", "") == "all"

# node tests of implemented ops that fail, how and why (each must still fail that way: one that starts passing must
# leave the list)
_RANDOM_DROPOUT = (
    NotImplementedError,
    "dropout in training mode draws a random mask (NumPy's draws cannot be matched)",
)
_DFT_NOISE = (
    AssertionError,
    "the expected imaginary parts that are exactly 0 hold the reference's float32 rounding (1.9e-7, past atol 1e-7); "
    "tiny's are 5e-15",
)
KNOWN_FAILURES: dict[str, tuple[type[Exception], str]] = {
    "test_training_dropout": _RANDOM_DROPOUT,
    "test_training_dropout_default": _RANDOM_DROPOUT,
    "test_training_dropout_default_mask": _RANDOM_DROPOUT,
    "test_training_dropout_mask": _RANDOM_DROPOUT,
    "test_dft_inverse": _DFT_NOISE,
    "test_dft_inverse_opset19": _DFT_NOISE,
}


def _default_subset() -> set[str]:
    runnable = [t for t in NODE_TESTS.values() if skip_reason(t) is None and t.name not in KNOWN_FAILURES]
    chosen, ops_seen = set(), set()
    for i, t in enumerate(runnable):
        if t.op not in ops_seen or i % NODE_STRIDE == 0:
            chosen.add(t.name)
            ops_seen.add(t.op)
    return chosen


DEFAULT_SUBSET = _default_subset()


@pytest.mark.parametrize("name", sorted(NODE_TESTS))
def test_node(name: str) -> None:
    test = NODE_TESTS[name]
    reason = skip_reason(test)
    if reason is not None:
        pytest.skip(reason)
    if not FULL_SWEEP and name not in DEFAULT_SUBSET:
        pytest.skip("in the full sweep only (TINY_ONNX_NODE_TESTS=all)")
    if name in KNOWN_FAILURES:
        error, why = KNOWN_FAILURES[name]
        with pytest.raises(error):
            run_node_test(test)
        pytest.xfail(why)
    run_node_test(test)


HOST_TESTS = sorted(
    t.name
    for t in NODE_TESTS.values()
    if skip_reason(t) is None
    and all(n.op_type in HOST_OPS for n in t.model.graph.node)
    and all(a.size <= HOST_LIMIT and a.dtype.name != "bfloat16" for a in t.inputs)
)


HOST_SUBSET = {n for i, n in enumerate(HOST_TESTS) if i % 4 == 0}


@pytest.mark.parametrize("name", HOST_TESTS)
def test_node_on_the_host(name: str) -> None:
    """The node tests of ops with a NumPy form for shape computations, with their inputs made constants: the
    host forms give what the tensor forms give (every 4th by default, all in the full sweep)."""
    if not FULL_SWEEP and name not in HOST_SUBSET:
        pytest.skip("in the full sweep only (TINY_ONNX_NODE_TESTS=all)")
    run_node_test(NODE_TESTS[name], as_constants=True)


def test_default_subset_covers_every_runnable_op() -> None:
    runnable_ops = {t.op for t in NODE_TESTS.values() if skip_reason(t) is None and t.name not in KNOWN_FAILURES}
    assert {NODE_TESTS[n].op for n in DEFAULT_SUBSET} == runnable_ops


# ---------------------------------------------------------------- models exported by torch


class SmallCNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 16, 3, stride=2, padding=1, groups=2)
        self.pool = torch.nn.MaxPool2d(2)
        self.avg = torch.nn.AvgPool2d(2, padding=1, count_include_pad=False)
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(torch.relu(self.bn1(self.conv1(x))))
        x = self.avg(torch.nn.functional.leaky_relu(self.conv2(x), 0.1))
        x = torch.nn.functional.adaptive_avg_pool2d(x, 1).flatten(1)
        return torch.log_softmax(self.fc(x), dim=-1)


class SmallTransformer(torch.nn.Module):
    """One pre-norm block: attention with heads split by reshapes of the input's own sizes, a GELU MLP."""

    def __init__(self, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.embed = torch.nn.Embedding(50, dim)
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.up, self.down = torch.nn.Linear(dim, 4 * dim), torch.nn.Linear(4 * dim, dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / (d // self.heads) ** 0.5
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
        att = scores.masked_fill(mask, float("-inf")).softmax(dim=-1) @ v
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))


def _export(model: torch.nn.Module, example: torch.Tensor, input_name: str) -> bytes:
    model.eval()
    f = io.BytesIO()
    with warnings.catch_warnings():  # (the TorchScript exporter's deprecation; the new one needs onnxscript)
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (example,),
            f,
            dynamo=False,
            input_names=[input_name],
            output_names=["out"],
            dynamic_axes={input_name: {0: "batch"}, "out": {0: "batch"}},
            opset_version=17,
        )
    return f.getvalue()


@pytest.mark.parametrize("make", [SmallCNN, SmallTransformer], ids=["cnn", "transformer"])
def test_torch_export_matches_onnxruntime_and_torch(make: type) -> None:
    torch.manual_seed(0)
    model = make()
    if isinstance(model, SmallCNN):  # running statistics that are not the identity, so BatchNorm computes
        model.bn1.running_mean.uniform_(-0.5, 0.5)
        model.bn1.running_var.uniform_(0.5, 2.0)
        example, name = torch.randn(2, 3, 16, 16), "image"
    else:
        example, name = torch.randint(0, 50, (2, 7)), "tokens"
    data = _export(model, example, name)
    batch = torch.randn(3, 3, 16, 16) if name == "image" else torch.randint(0, 50, (3, 7))  # another batch size
    with torch.no_grad():
        want_torch = model(batch).numpy()
    want_ort = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {name: batch.numpy()})[0]
    got = tiny.onnx.load(data)({name: batch.numpy()})["out"]
    assert isinstance(got, Tensor) and got.shape == want_ort.shape and got.dtype.name == "float32"
    np.testing.assert_allclose(got.numpy(), want_ort, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got.numpy(), want_torch, rtol=1e-4, atol=1e-5)


def test_hugging_face_bert_matches_onnxruntime_and_transformers() -> None:
    """A small random BERT (transformers' BertModel, eager attention) with a padding mask, exported by torch, run at
    the batch and sequence length it was traced with and at others."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        attn_implementation="eager",
    )
    bert = transformers.BertModel(config).eval()

    class Hidden(torch.nn.Module):  # (the last hidden state alone)
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            return self.bert(input_ids=ids, attention_mask=mask)[0]

    hidden = Hidden().eval()  # (a module in training mode would be put back into it, with its BERT, after export)

    def batch(n: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        mask = torch.ones(n, length, dtype=torch.long)
        mask[-1, length // 2 :] = 0  # the last sequence is padded
        return torch.randint(0, 100, (n, length)), mask

    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            hidden,
            batch(2, 9),
            f,
            dynamo=False,
            input_names=["ids", "mask"],
            output_names=["out"],
            dynamic_axes={"ids": {0: "b", 1: "s"}, "mask": {0: "b", 1: "s"}, "out": {0: "b", 1: "s"}},
            opset_version=17,
        )
    model = tiny.onnx.load(f.getvalue())
    session = ort.InferenceSession(f.getvalue(), providers=["CPUExecutionProvider"])
    for n, length in ((2, 9), (3, 6)):
        ids, mask = batch(n, length)
        feed = {"ids": ids.numpy(), "mask": mask.numpy()}
        got = model(feed)["out"].numpy()
        np.testing.assert_allclose(got, session.run(None, feed)[0], rtol=1e-4, atol=1e-5)
        with torch.no_grad():
            np.testing.assert_allclose(got, hidden(ids, mask).numpy(), rtol=1e-4, atol=1e-5)


def test_hugging_face_llama_matches_onnxruntime_and_transformers() -> None:
    """A small random Llama (transformers' LlamaForCausalLM: RMSNorm, rotary positions, grouped-query attention,
    SwiGLU) exported by torch to its logits, with left padding, run at the traced sizes and at others.

    The causal and padding mask is built in the wrapper from the 2-D mask, with plain tensor ops, and handed to the
    model as the 4-D additive mask it accepts, with positions counted from the first real token (as generate does):
    transformers' own mask builder runs under torch.vmap, which the TorchScript exporter cannot trace."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=100,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attn_implementation="eager",
    )
    llama = transformers.LlamaForCausalLM(config).eval()

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.llama = llama

        def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            length = ids.shape[1]
            causal = torch.ones(length, length, dtype=torch.bool).tril()
            keep = causal[None, None] & mask[:, None, None, :].bool()
            additive = torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float32).min)
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            return self.llama(input_ids=ids, attention_mask=additive, position_ids=positions, use_cache=False).logits

    logits = Logits().eval()

    def batch(n: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        mask = torch.ones(n, length, dtype=torch.long)
        mask[-1, : length // 3] = 0  # the last sequence is padded on the left
        return torch.randint(0, 100, (n, length)), mask

    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            logits,
            batch(2, 9),
            f,
            dynamo=False,
            input_names=["ids", "mask"],
            output_names=["logits"],
            dynamic_axes={"ids": {0: "b", 1: "s"}, "mask": {0: "b", 1: "s"}, "logits": {0: "b", 1: "s"}},
            opset_version=17,
        )
    model = tiny.onnx.load(f.getvalue())
    session = ort.InferenceSession(f.getvalue(), providers=["CPUExecutionProvider"])
    for n, length in ((2, 9), (3, 5)):
        ids, mask = batch(n, length)
        feed = {"ids": ids.numpy(), "mask": mask.numpy()}
        got = model(feed)["logits"]
        assert got.shape == (n, length, 100)
        np.testing.assert_allclose(got.numpy(), session.run(None, feed)[0], rtol=1e-4, atol=1e-5)
        with torch.no_grad():
            np.testing.assert_allclose(got.numpy(), logits(ids, mask).numpy(), rtol=1e-4, atol=1e-5)


def test_shape_subgraph_is_computed_on_the_host() -> None:
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape: the reshape's target is known without running a kernel,
    and the output stays lazy (nothing computed until it is read)."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "zero1"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["flat"]),
        helper.make_node("Relu", ["flat"], ["y"]),
    ]
    inits = [
        helper.make_tensor("zero", TensorProto.INT64, [], [0]),
        helper.make_tensor("zero1", TensorProto.INT64, [1], [0]),
        helper.make_tensor("minus1", TensorProto.INT64, [1], [-1]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 12])],
        inits,
    )
    model = tiny.onnx.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    x = np.random.default_rng(0).standard_normal((5, 3, 4)).astype(np.float32)
    y = model({"x": x})["y"]
    assert y.shape == (5, 12)
    assert y.uop.op.name != "BUFFER"  # lazy: the graph of the ops, not a computed buffer
    np.testing.assert_allclose(y.numpy(), np.maximum(x.reshape(5, 12), 0))


def test_runs_on_another_device(python_device: str) -> None:
    """The same graph on the PYTHON emulator: inputs, initializers and results live on the device asked for."""
    rng = np.random.default_rng(1)
    w, b = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "b"], ["h"]), helper.make_node("Softmax", ["h"], ["y"], axis=-1)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [onnx.numpy_helper.from_array(w, "w"), onnx.numpy_helper.from_array(b, "b")],
    )
    x = rng.standard_normal((2, 4)).astype(np.float32)
    y = tiny.onnx.load(helper.make_model(graph), device=python_device)({"x": x})["y"]
    assert y.device == python_device
    want = ort.InferenceSession(helper.make_model(graph).SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(y.numpy(), want.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- errors


def _one_node_model(op: str, opset: int = 17, **attrs: object) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node(op, ["x"], ["y"], name="the_node", **attrs)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_unsupported_op_is_named_with_its_node() -> None:
    with pytest.raises(NotImplementedError, match=r"'Bernoulli'.*not implemented") as e:
        tiny.onnx.load(_one_node_model("Bernoulli"))
    assert "node 'the_node'" in str(e.value)


def test_opset_too_new() -> None:
    with pytest.raises(NotImplementedError, match=rf"opset {tiny.onnx.MAX_OPSET + 1}.*up to {tiny.onnx.MAX_OPSET}"):
        tiny.onnx.load(_one_node_model("Relu", opset=tiny.onnx.MAX_OPSET + 1))


def test_malformed_file(tmp_path) -> None:
    path = tmp_path / "bad.onnx"
    path.write_bytes(b"\x08\x07this is not a protobuf of a model \xff\xff\xff")
    with pytest.raises(ValueError, match="not an ONNX model"):
        tiny.onnx.load(path)
    with pytest.raises(ValueError, match="no such file"):
        tiny.onnx.load(tmp_path / "missing.onnx")


def test_wrong_inputs() -> None:
    model = tiny.onnx.load(_one_node_model("Relu"))
    with pytest.raises(ValueError, match=r"missing \['x'\]"):
        model({})
    with pytest.raises(ValueError, match=r"shape \(2, 2\), got \(3,\)"):
        model({"x": np.zeros(3, np.float32)})
    with pytest.raises(ValueError, match="must be float32, got int64"):
        model({"x": np.zeros((2, 2), np.int64)})


# ---------------------------------------------------------------- the command line


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tiny.onnx", *args], capture_output=True, text=True, timeout=120)


def test_cli_prints_outputs(tmp_path) -> None:
    model_path, x_path = tmp_path / "relu.onnx", tmp_path / "x.npy"
    onnx.save(_one_node_model("Relu"), model_path)
    np.save(x_path, np.array([[-1.0, 2.0], [3.0, -4.0]], np.float32))
    done = _cli(str(model_path), "--input", f"x={x_path}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "y: shape (2, 2) dtype float32 values [0.0, 2.0, 3.0, 0.0]"


@pytest.mark.parametrize(
    "args, message",
    [
        (["{model}", "--input", "x"], "--input takes name=file.npy"),
        (["{model}", "--input", "x={tmp}/nothing.npy"], "no such file"),
        (["{model}"], "missing ['x']"),
        (["{tmp}/nothing.onnx"], "no such file"),
        ([], "the following arguments are required: model"),
        (["{model}", "--input", "x={tmp}/x.npy", "--device", "NOSUCH"], "unknown device 'NOSUCH'"),
    ],
)
def test_cli_bad_arguments_are_one_line(tmp_path, args: list[str], message: str) -> None:
    model_path = tmp_path / "relu.onnx"
    onnx.save(_one_node_model("Relu"), model_path)
    np.save(tmp_path / "x.npy", np.zeros((2, 2), np.float32))
    done = _cli(*(a.format(model=model_path, tmp=tmp_path) for a in args))
    assert done.returncode == 2
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
