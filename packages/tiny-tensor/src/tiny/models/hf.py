"""Reading a Hugging Face model folder for the models of tiny.models: its config.json, its weights (model.safetensors
or a sharded index), and each weight into the model's tensor of the same dotted name.

A model is written with the attributes Hugging Face's modules have (`encoder.layer[0].attention.output.dense`), so
that tiny.nn.state.get_state_dict(model) names its weights as the checkpoint does. Weights are read lazily: each is
a view of its file, read from the file's pages straight into the device's memory when it is realized.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tiny.ir.device import Device
from tiny.ir.dtypes import to_dtype
from tiny.ir.schedule import layout
from tiny.nn.state import get_state_dict, safe_entries, safe_load
from tiny.tensor import DType, Tensor, dtypes
from tiny.tensor.weight_forms import STORED, Panels

__all__ = [
    "LOWEST",
    "activation",
    "compute_dtype",
    "load_weights",
    "read_config",
    "read_json",
    "read_panels",
    "read_weights",
    "weight_files",
]

LOWEST = {  # what Hugging Face adds to a masked key's score: the lowest value of the dtype the model computes in
    dtypes.float32: -3.4028234663852886e38,
    dtypes.float16: -65504.0,
    dtypes.bfloat16: -3.3895313892515355e38,
}


def compute_dtype(dtype: DType | str, what: str) -> DType:
    """The dtype a model computes in, as a loader's dtype= names it ("float16" or dtypes.float16): a float dtype."""
    try:
        dt = to_dtype(dtype)
    except (KeyError, ValueError, TypeError, AttributeError):
        dt = None
    if dt is None or dt not in LOWEST:
        raise TypeError(
            f"{what}: dtype must be the float dtype the model computes in (float32, float16 or bfloat16), got {dtype!r}"
        )
    return dt


def read_config(path: str | os.PathLike, architectures: Sequence[str]) -> tuple[Path, dict[str, Any], str]:
    """The folder, its config.json and the architecture it names, which must be one of `architectures`."""
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(
            f"expected a Hugging Face model folder (config.json, model.safetensors); {folder} is not"
        )
    config_path = folder / "config.json"
    if not config_path.is_file():
        found = sorted(p.name for p in folder.iterdir())[:10]
        raise FileNotFoundError(f"{folder} has no config.json: not a Hugging Face model folder (it holds {found})")
    cfg = read_json(config_path)
    found_archs = cfg.get("architectures") or []
    arch = found_archs[0] if found_archs else None
    if arch not in architectures:
        raise ValueError(
            f"{folder}: expected one of the architectures {', '.join(architectures)}; config.json names "
            f"{arch!r} (model_type {cfg.get('model_type')!r})"
        )
    return folder, cfg, arch


def read_json(path: Path, missing: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON object a file holds (a config); `missing` where the file does not exist, if given, else an error."""
    if not path.is_file():
        if missing is not None:
            return missing
        raise FileNotFoundError(f"{path.parent} has no {path.name}")
    try:
        found = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(found, dict):
        raise ValueError(f"{path} should hold a JSON object, it holds a {type(found).__name__}")
    return found


def read_weights(folder: Path, device: str | None) -> dict[str, Tensor]:
    """Every tensor of model.safetensors (or of the shards its index names), lazily: nothing is read yet."""
    out: dict[str, Tensor] = {}
    for path in weight_files(folder):
        out |= safe_load(path, device)
    return out


def weight_files(folder: Path) -> list[Path]:
    """model.safetensors, or the shards its index names."""
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        for shard in shards:
            if not (folder / shard).is_file():
                raise FileNotFoundError(f"{index} names the shard {shard}, which {folder} lacks")
        return [folder / shard for shard in shards]
    raise FileNotFoundError(
        f"{folder} has neither model.safetensors nor model.safetensors.index.json (.bin checkpoints are not read)"
    )


def read_panels(folder: Path, names: Collection[str], device: str | None) -> dict[str, Tensor]:
    """Those of the named matrices (weights that products read) stored as float32, float16 or bfloat16 whose rows
    are a whole number of panels where the device's products read panels (layout.weight_panel_width: the CPU), read
    from the files on the host straight into panels (tiny.tensor.weight_forms.Panels): the device holds each one's
    bytes once, in the layout every product over it reads, a prompt's rows and a decode step's one alike (a float32
    1B model's 32-token prompt 68 -> 80 tokens/s on 2 AVX2 cores). The others are not read here."""
    where = Device.DEFAULT if device is None else device
    out: dict[str, Tensor] = {}
    for path in weight_files(folder):
        for name, (dt, shape, offset) in safe_entries(path).items():
            if name not in names or dt.name not in STORED or len(shape) != 2:
                continue
            if width := layout.weight_panel_width(where, dtypes.float32, shape[0]):
                host = np.fromfile(path, dtype=STORED[dt.name][0], count=shape[0] * shape[1], offset=offset)
                out[name] = Panels.of(host.reshape(shape), dt.name, width, device)
    return out


def _renamed(name: str) -> str:
    """The name transformers gives a weight of an old checkpoint (LayerNorm's gamma and beta)."""
    if name.endswith(".gamma"):
        return name.removesuffix(".gamma") + ".weight"
    if name.endswith(".beta"):
        return name.removesuffix(".beta") + ".bias"
    return name


_SHOWN = 20  # problems listed by name in a load's error


def load_weights(
    model: Any,
    weights: dict[str, Tensor],
    folder: Path,
    base: str,
    tied: Sequence[str] = (),
    dtype: DType = dtypes.float32,
) -> None:
    """Each weight into the model's tensor of its name, cast to dtype (what the model computes in: float32 widens a
    float16 or bfloat16 checkpoint) and checked for shape.

    base: the base model's attribute in a model with a head ("bert", "vit"): a base model takes a head model's
    file (the prefix is dropped) and a head model a base model's file (the prefix is added), as transformers does.
    tied: names the model shares with another weight (a decoder tied to the embedding, which the model ties after),
    not read from the file even where it has them. Names the file has and the model lacks (a pretraining head) are
    left, as transformers leaves them; names the model has and the file lacks, and shapes that differ, are an error
    listing all of them."""
    targets = {name: t for name, t in get_state_dict(model).items() if name not in tied}
    names = {_renamed(k): k for k in weights}  # the model's name for each of the file's
    headed = any(k.startswith(f"{base}.") for k in targets)
    if headed and not any(k.startswith(f"{base}.") for k in names):
        heads = _heads(targets, base)
        names = {(k if k.split(".")[0] in heads else f"{base}.{k}"): f for k, f in names.items()}
    elif not headed:
        names = {k.removeprefix(f"{base}."): f for k, f in names.items()}
    others = [f for k, f in names.items() if k not in targets]
    weights = {k: weights[f] for k, f in names.items() if k in targets}
    missing = [k for k in targets if k not in weights]
    bad = [f"{k}: the file has {weights[k].shape}, the config makes {t.shape}" for k, t in targets.items()
           if k in weights and weights[k].shape != t.shape]  # fmt: skip
    if missing or bad:
        lines = [f"missing {k}" for k in missing] + [f"shape of {b}" for b in bad]
        if len(lines) > _SHOWN:
            lines = lines[:_SHOWN] + [f"... and {len(lines) - _SHOWN} more"]
        if missing:  # (what the file has instead tells a wrong prefix or another model's file)
            lines.append(f"the file has {len(names)} tensors, {len(others)} of them not the model's: {others[:5]}")
        raise ValueError(f"{folder}: the weights do not fit the config:\n  " + "\n  ".join(lines))
    for name in targets:
        owner, attr = _owner(model, name)
        loaded = weights[name]
        if loaded.dtype == dtype:
            setattr(owner, attr, loaded.realize())  # read from its file into the buffer that becomes the weight
        else:
            setattr(owner, attr, loaded.cast(dtype).contiguous().realize())


def _heads(targets: dict[str, Tensor], base: str) -> set[str]:
    """The first parts of the names a model has besides its base model's ("cls", "classifier")."""
    return {k.split(".")[0] for k in targets} - {base}


def _owner(model: Any, name: str) -> tuple[Any, str]:
    """The object holding the tensor of a dotted name, and its attribute there."""
    *path, attr = name.split(".")
    obj = model
    for part in path:
        obj = obj[int(part)] if isinstance(obj, (list, tuple)) else getattr(obj, part)
    return obj, attr


# Hugging Face's hidden_act names and what they compute
_ACTIVATIONS = {
    "gelu": lambda x: x.gelu(),
    "gelu_new": lambda x: x.gelu(approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: x.gelu(approximate="tanh"),
    "quick_gelu": lambda x: x * (x * 1.702).sigmoid(),
    "relu": lambda x: x.relu(),
    "silu": lambda x: x.silu(),
    "swish": lambda x: x.silu(),
    "tanh": lambda x: x.tanh(),
}


def activation(name: str) -> Any:
    """The function of a config's activation name (hidden_act, pooler_act)."""
    if name not in _ACTIVATIONS:
        raise ValueError(f"activation {name!r} is not supported (these are: {', '.join(_ACTIVATIONS)})")
    return _ACTIVATIONS[name]
