"""Layers with torch.nn's names, arguments and initialization, built on tiny.tensor's functional ops; and the
submodules optim (optimizers, schedules), state (state dicts, safetensors, torch checkpoints), datasets, and mpi
(data-parallel training across processes).

>>> from tiny import nn
>>> from tiny.tensor import Tensor
>>> nn.Linear(3, 2)(Tensor.ones(1, 3)).shape
(1, 2)
"""

import importlib
from typing import Any

from tiny.nn.layers import (
    BatchNorm1d,
    BatchNorm2d,
    Conv1d,
    Conv2d,
    ConvTranspose1d,
    ConvTranspose2d,
    Dropout,
    Embedding,
    GroupNorm,
    InstanceNorm1d,
    InstanceNorm2d,
    LayerNorm,
    Linear,
    LSTMCell,
    RMSNorm,
    skip_init,
)
from tiny.nn.tinygrad_names import BatchNorm, InstanceNorm, LayerNorm2d

__all__ = [
    "datasets",
    "gguf",
    "mpi",
    "optim",
    "state",
    "BatchNorm1d",
    "BatchNorm2d",
    "Conv1d",
    "Conv2d",
    "ConvTranspose1d",
    "ConvTranspose2d",
    "Dropout",
    "Embedding",
    "GroupNorm",
    "InstanceNorm1d",
    "InstanceNorm2d",
    "LSTMCell",
    "LayerNorm",
    "Linear",
    "RMSNorm",
    "skip_init",
    # tinygrad's names (tiny.nn.tinygrad_names)
    "BatchNorm",
    "InstanceNorm",
    "LayerNorm2d",
]

# the submodules are imported when first named (nn.optim ...): a program that only runs a model loads no optimizer,
# dataset reader or MPI (and the compression modules these import)
_SUBMODULES = ("datasets", "gguf", "mpi", "optim", "state")


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"tiny.nn.{name}")
    raise AttributeError(f"module 'tiny.nn' has no attribute {name!r}")
