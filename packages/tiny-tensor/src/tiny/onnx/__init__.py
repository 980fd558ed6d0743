"""tiny.onnx: run ONNX models as tiny tensor ops (lazy and fused like any tiny graph, on any device).

`load(path_or_model, device=None)` parses a model with the `onnx` package and returns an `OnnxModel`; calling it
with {input name: NumPy array or Tensor} returns {output name: Tensor}. `python -m tiny.onnx MODEL --input
name=file.npy` prints the outputs.
"""

from tiny.onnx import (  # noqa: F401  (they fill the table of operators)
    attention,
    control,
    elementwise,
    losses,
    movement,
    nn_ops,
    quant_ops,
    recurrent,
    reductions,
    resize,
)
from tiny.onnx.model import MAX_OPSET, OPS, OnnxModel, load

__all__ = ["load", "OnnxModel", "MAX_OPSET", "supported_ops"]


def supported_ops() -> list[str]:
    """The ONNX op types (ai.onnx domain) that tiny.onnx implements."""
    return sorted(OPS)
