"""Model definitions written with tiny.nn, one readable file each; their weights as Hugging Face names them.
bert, vit and whisper each `load(folder)` a Hugging Face folder; resnet `load(file)`s a torchvision checkpoint."""

import importlib
from typing import Any

from tiny.models.gpt2 import GPT2, GPT2Config
from tiny.models.llama import Llama, LlamaConfig

__all__ = ["GPT2", "GPT2Config", "Llama", "LlamaConfig", "bert", "resnet", "vit", "whisper"]

_SUBMODULES = ("bert", "resnet", "vit", "whisper")  # imported when first named: a language model loads none of them


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"tiny.models.{name}")
    raise AttributeError(f"module 'tiny.models' has no attribute {name!r}")
