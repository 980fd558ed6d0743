"""tiny.nn.state: model state walking, safetensors, torch checkpoints (tiny.nn.datasets: test_nn_datasets.py)."""

from __future__ import annotations

import json
import os
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tiny.nn.state import get_parameters, get_state_dict, load_state_dict, safe_load, safe_save, torch_load
from tiny.tensor import Device, Tensor, dtypes
from tiny.tensor.checks import default_int

# ---------------------------------------------------------------- walking a model


class Linear:
    def __init__(self, n_in: int, n_out: int) -> None:
        self.weight = Tensor(np.random.rand(n_out, n_in).astype(np.float32))
        self.bias = Tensor(np.zeros(n_out, np.float32))
        self.name = "linear"


class Net:
    def __init__(self) -> None:
        self.layers = [Linear(3, 4), Linear(4, 2)]
        self.extra = {"scale": Tensor([1.0])}
        self.pair = (Tensor([1, 2]),)


def test_state_dict_names_like_torch() -> None:
    names = sorted(get_state_dict(Net()))
    assert names == sorted(
        ["layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias", "extra.scale", "pair.0"]
    )
    assert sorted(get_state_dict(Net(), prefix="model.")) == ["model." + n for n in names]


def test_parameters_have_no_duplicates_and_survive_cycles() -> None:
    net = Net()
    net.tied = net.layers[0].weight  # a shared tensor
    net.me = net  # a cycle
    params = get_parameters(net)
    assert len(params) == 6
    assert sum(p is net.layers[0].weight for p in params) == 1
    assert "tied" in get_state_dict(net)


def test_load_state_dict_assigns_in_place_with_casts() -> None:
    src, dst = Net(), Net()
    dst.layers[0].weight.requires_grad = True
    weight = dst.layers[0].weight
    state = {k: v.numpy() if k.endswith("bias") else v for k, v in get_state_dict(src).items()}
    state["pair.0"] = Tensor([7.0, 8.0])  # float into an int tensor: cast
    load_state_dict(dst, state)
    assert dst.layers[0].weight is weight and weight.requires_grad
    np.testing.assert_array_equal(weight.numpy(), src.layers[0].weight.numpy())
    np.testing.assert_array_equal(dst.layers[1].bias.numpy(), src.layers[1].bias.numpy())
    assert dst.pair[0].dtype == default_int(Device.DEFAULT) and dst.pair[0].tolist() == [7, 8]


def test_load_state_dict_strict_lists_every_problem() -> None:
    state = get_state_dict(Net())
    del state["layers.0.bias"]
    state["unknown.weight"] = Tensor([1.0])
    state["layers.1.weight"] = Tensor(np.zeros((5, 5), np.float32))
    with pytest.raises(RuntimeError) as err:
        load_state_dict(Net(), state)
    msg = str(err.value)
    assert "missing: 'layers.0.bias'" in msg
    assert "unexpected: 'unknown.weight'" in msg
    assert "'layers.1.weight'" in msg and "(2, 4)" in msg and "(5, 5)" in msg


def test_load_state_dict_not_strict_reports_but_still_checks_shapes() -> None:
    net = Net()
    result = load_state_dict(net, {"extra.scale": Tensor([3.0]), "other": Tensor([1.0])}, strict=False)
    assert net.extra["scale"].tolist() == [3.0]
    assert result.unexpected == ("other",) and "layers.0.weight" in result.missing
    with pytest.raises(RuntimeError, match="mis-shaped"):
        load_state_dict(net, {"extra.scale": Tensor([1.0, 2.0])}, strict=False)


# ---------------------------------------------------------------- safetensors

SAFE_DTYPES = [dtypes.float32, dtypes.float16, dtypes.bfloat16, dtypes.float64, dtypes.int64, dtypes.int32]
SAFE_DTYPES += [dtypes.int16, dtypes.int8, dtypes.uint8, dtypes.bool]


def _sample(dt: object, shape: tuple[int, ...] = (2, 3)) -> Tensor:
    values = (np.arange(int(np.prod(shape))).reshape(shape) - 2) % 7
    return Tensor(values.astype(np.float32), dtype=dt) if dt != dtypes.bool else Tensor(values > 2)


@pytest.mark.parametrize("dt", SAFE_DTYPES, ids=lambda d: d.name)
def test_safetensors_round_trip(tmp_path: Path, dt: object) -> None:
    state = {"a": _sample(dt), "scalar": _sample(dt, ()), "empty": _sample(dt, (0, 4)), "f": Tensor([1.5, -2.0])}
    safe_save(state, tmp_path / "x.safetensors", metadata={"format": "pt"})
    back = safe_load(tmp_path / "x.safetensors")
    assert set(back) == set(state)
    for name, t in state.items():
        assert back[name].dtype == t.dtype and back[name].shape == t.shape
        np.testing.assert_array_equal(back[name].numpy(), t.numpy())


def test_safetensors_header_is_aligned_and_has_metadata(tmp_path: Path) -> None:
    safe_save({"b": Tensor([1], dtype=dtypes.int8), "w": Tensor([1.0])}, tmp_path / "x.st", metadata={"k": "v"})
    raw = (tmp_path / "x.st").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    assert (8 + n) % 8 == 0 and header["__metadata__"] == {"k": "v"}
    assert header["w"] == {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}


def test_safetensors_corrupt_files_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    safe_save({"w": Tensor(np.ones((4, 4), np.float32))}, path)
    raw = path.read_bytes()
    (tmp_path / "short").write_bytes(raw[:-8])
    with pytest.raises(ValueError, match="data_offsets"):
        safe_load(tmp_path / "short")
    (tmp_path / "huge").write_bytes((10**9).to_bytes(8, "little") + raw[8:])
    with pytest.raises(ValueError, match="header length"):
        safe_load(tmp_path / "huge")


def test_safetensors_interop_with_reference_library(tmp_path: Path) -> None:
    st_numpy = pytest.importorskip("safetensors.numpy")
    ours = {"w": _sample(dtypes.float32, (3, 5)), "h": _sample(dtypes.float16), "i": _sample(dtypes.int64, (4,))}
    ours["b"] = _sample(dtypes.bool, (3,))
    safe_save(ours, tmp_path / "ours.safetensors", metadata={"who": "tiny"})
    theirs = st_numpy.load_file(str(tmp_path / "ours.safetensors"))
    for name, t in ours.items():
        np.testing.assert_array_equal(theirs[name], t.numpy())
    written = {"x": np.random.rand(4, 3).astype(np.float32), "y": np.arange(5, dtype=np.int16)}
    written["z"] = np.array([True, False])
    st_numpy.save_file(written, str(tmp_path / "theirs.safetensors"), metadata={"a": "b"})
    back = safe_load(tmp_path / "theirs.safetensors")
    for name, arr in written.items():
        np.testing.assert_array_equal(back[name].numpy(), arr)


def test_safetensors_bfloat16_interop_with_torch(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    st_torch = pytest.importorskip("safetensors.torch")
    ref = torch.tensor([1.0, -2.5, 3.140625, 1e30], dtype=torch.bfloat16)
    st_torch.save_file({"b": ref}, str(tmp_path / "b.safetensors"))
    back = safe_load(tmp_path / "b.safetensors")["b"]
    assert back.dtype == dtypes.bfloat16
    np.testing.assert_array_equal(back.numpy(), ref.float().numpy())
    safe_save({"b": back}, tmp_path / "c.safetensors")
    assert torch.equal(st_torch.load_file(str(tmp_path / "c.safetensors"))["b"], ref)


# ---------------------------------------------------------------- torch checkpoints


def test_torch_load_matches_torch_save(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    torch.save(model.state_dict(), tmp_path / "m.pt")
    loaded = torch_load(tmp_path / "m.pt")
    assert list(loaded) == list(model.state_dict())
    for name, t in model.state_dict().items():
        np.testing.assert_array_equal(loaded[name].numpy(), t.numpy())
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    mixed = {
        "t": base.t(),  # strided
        "slice": base[1:, 2:4],  # offset into a shared storage
        "half": torch.tensor([1.5, 2.0], dtype=torch.float16),
        "bf16": torch.nn.Parameter(torch.tensor([1.0, 3.140625], dtype=torch.bfloat16)),
        "long": torch.tensor([[1, -2]], dtype=torch.int64),
        "flag": torch.tensor([True, False]),
        "nested": [torch.tensor(3.0), {"k": torch.tensor([1], dtype=torch.int8)}],
    }
    torch.save(mixed, tmp_path / "x.pth")
    got = torch_load(tmp_path / "x.pth")
    np.testing.assert_array_equal(got["t"].numpy(), base.t().numpy())
    np.testing.assert_array_equal(got["slice"].numpy(), base[1:, 2:4].numpy())
    assert got["bf16"].dtype == dtypes.bfloat16 and got["bf16"].tolist() == [1.0, 3.140625]
    assert got["half"].dtype == dtypes.float16 and got["half"].tolist() == [1.5, 2.0]
    assert got["long"].tolist() == [[1, -2]] and got["flag"].tolist() == [True, False]
    assert got["nested"][0].shape == () and got["nested"][0].item() == 3.0
    assert got["nested"][1]["k"].dtype == dtypes.int8


class _Hostile:
    def __reduce__(self) -> tuple:
        return (os.system, ("echo pwned > /dev/null",))


def test_torch_load_refuses_hostile_pickle(tmp_path: Path) -> None:
    path = tmp_path / "evil.pt"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("evil/data.pkl", pickle.dumps({"w": _Hostile()}, protocol=2))
    with pytest.raises(pickle.UnpicklingError, match="system"):
        torch_load(path)


def test_torch_load_refuses_non_zip(tmp_path: Path) -> None:
    (tmp_path / "old.pt").write_bytes(pickle.dumps({"a": 1}))
    with pytest.raises(ValueError, match="not a zip"):
        torch_load(tmp_path / "old.pt")
