"""Model definitions written with tiny.nn, one readable file each; their weights as Hugging Face names them."""

from tiny.models.llama import Llama, LlamaConfig

__all__ = ["Llama", "LlamaConfig"]
