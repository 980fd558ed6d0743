"""Model definitions written with tiny.nn, one readable file each; their weights as Hugging Face names them.
bert, vit and whisper each `load(folder)` a Hugging Face folder; resnet `load(file)`s a torchvision checkpoint."""

from tiny.models import bert, resnet, vit, whisper
from tiny.models.gpt2 import GPT2, GPT2Config
from tiny.models.llama import Llama, LlamaConfig

__all__ = ["GPT2", "GPT2Config", "Llama", "LlamaConfig", "bert", "resnet", "vit", "whisper"]
