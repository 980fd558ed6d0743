"""tiny.models.resnet against torchvision's own ResNet: random-initialized models with random batch-norm weights and
running statistics (eval mode), saved with torch.save or as safetensors and loaded by tiny; logits equal to 1e-4 in
float32 (in float16 as near as torchvision's float16), gradients of the images equal to torch's; a torch.onnx.export
of ResNet-18 through tiny.onnx against onnxruntime; the example command's preprocessing against torchvision's
transforms, and its errors.

torchvision is the reference: where `import torchvision` works, as it is; else from the folder TINY_TORCHVISION
names (nox's tensor session installs torchvision 0.28.0 there, see TORCHVISION in noxfile.py), its pure-Python
models and transforms imported without the package's __init__ (see _torchvision); else these tests skip."""

from __future__ import annotations

import functools
import importlib
import io
import os
import subprocess
import sys
import types
import warnings
from pathlib import Path

import numpy as np
import pytest
from half_compare import assert_half_close

from tiny.models import resnet
from tiny.tensor import Tensor, dtypes

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

TOL = {"rtol": 1e-4, "atol": 1e-4}


@functools.cache
def _torchvision(module: str) -> types.ModuleType:
    """torchvision.<module>, imported as usual where torchvision imports, else from TINY_TORCHVISION's folder as a
    bare package: PyPI's torchvision 0.28.0 is the CUDA build, whose `import torchvision` fails registering its
    compiled ops beside the CPU torch. The bare package is taken out of sys.modules afterwards, so that
    transformers, which imports torchvision where it finds one, does not find it."""
    folder = os.environ.get("TINY_TORCHVISION")
    if not folder:
        try:
            return importlib.import_module(f"torchvision.{module}")
        except ImportError:
            pytest.skip("torchvision is not installed and TINY_TORCHVISION is unset (nox's tensor session sets it)")
    if not (Path(folder) / "torchvision" / "models" / "resnet.py").is_file():
        pytest.fail(f"TINY_TORCHVISION={folder} is not a folder holding torchvision (pip install --target)")
    package = types.ModuleType("torchvision")
    package.__path__ = [str(Path(folder) / "torchvision")]
    saved = {k: sys.modules.pop(k) for k in list(sys.modules) if k == "torchvision" or k.startswith("torchvision.")}
    sys.modules["torchvision"] = package
    try:
        return importlib.import_module(f"torchvision.{module}")
    finally:
        for k in [k for k in sys.modules if k == "torchvision" or k.startswith("torchvision.")]:
            del sys.modules[k]
        sys.modules.update(saved)


def _tv_resnet() -> types.ModuleType:
    return _torchvision("models.resnet")


def _randomized(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """The model in eval mode with batch-norm weights, biases and running statistics away from torchvision's 1, 0,
    0 and 1 (which would hide a misplaced one), and fc's bias random."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0, 0.3)
                module.running_mean.normal_(0, 0.5)
                module.running_var.uniform_(0.5, 2.0)
                module.num_batches_tracked.fill_(7)
        model.fc.bias.normal_(0, 0.3)
    return model.eval()


def _images(batch: int = 2, size: int = 64, seed: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, 3, size, size)).astype(np.float32)


@pytest.mark.parametrize("arch", ["resnet18", "resnet50"])
def test_resnet_from_a_pth_equals_torchvision(arch: str, tmp_path: Path) -> None:
    ref = _randomized(getattr(_tv_resnet(), arch)(num_classes=10), seed=0)
    torch.save(ref.state_dict(), tmp_path / "weights.pth")
    images = _images()
    with torch.no_grad():
        want = ref(torch.tensor(images)).numpy()
    model = resnet.load(tmp_path / "weights.pth")
    assert model.cfg == resnet.ResNetConfig(**{**resnet.ARCHITECTURES[arch].__dict__, "num_classes": 10})
    assert isinstance(model.layer1[0], resnet.Bottleneck if arch == "resnet50" else resnet.BasicBlock)
    np.testing.assert_allclose(model(images).numpy(), want, **TOL)
    assert model.bn1.num_batches_tracked.dtype.name == "int64" and model.bn1.num_batches_tracked.item() == 7


def test_grouped_bottleneck_from_safetensors_with_image_gradients(tmp_path: Path) -> None:
    """A ResNeXt-shaped model (one block per stage, 4 groups of 8 channels per 64) from a safetensors file, an
    image of another height and width, and d sum(logits * w) / d images against torch's."""
    tv = _tv_resnet()
    ref = _randomized(tv.ResNet(tv.Bottleneck, [1, 1, 1, 1], num_classes=7, groups=4, width_per_group=8), seed=1)
    safetensors_torch.save_file(ref.state_dict(), tmp_path / "weights.safetensors")
    images = _images(batch=2, size=48, seed=4)[:, :, :, :40].copy()
    w = np.random.default_rng(5).standard_normal((2, 7)).astype(np.float32)
    x = torch.tensor(images, requires_grad=True)
    (ref(x) * torch.tensor(w)).sum().backward()
    model = resnet.load(tmp_path / "weights.safetensors")
    assert model.cfg == resnet.ResNetConfig("bottleneck", (1, 1, 1, 1), 7, groups=4, width_per_group=8)
    tx = Tensor(images, requires_grad=True)
    logits = model(tx)
    with torch.no_grad():
        np.testing.assert_allclose(logits.numpy(), ref(torch.tensor(images)).numpy(), **TOL)
    (logits * Tensor(w)).sum().backward()
    np.testing.assert_allclose(tx.grad.numpy(), x.grad.numpy(), **TOL)


def test_a_wrapped_checkpoint_and_an_explicit_arch(tmp_path: Path) -> None:
    """A training script's checkpoint: {"state_dict": ...} with DataParallel's "module." prefix; arch given."""
    ref = _randomized(_tv_resnet().resnet18(num_classes=3), seed=2)
    state = {f"module.{k}": v for k, v in ref.state_dict().items()}
    torch.save({"state_dict": state}, tmp_path / "ckpt.pt")
    images = _images(batch=1, size=32)
    with torch.no_grad():
        want = ref(torch.tensor(images)).numpy()
    np.testing.assert_allclose(resnet.load(tmp_path / "ckpt.pt", arch="resnet18")(images).numpy(), want, **TOL)
    with pytest.raises(
        ValueError,
        match=r"holds a ResNet of basic blocks, 2-2-2-2 per stage, where resnet50 is a "
        r"ResNet of bottleneck blocks, 3-4-6-3 per stage$",
    ):
        resnet.load(tmp_path / "ckpt.pt", arch="resnet50")


# ---------------------------------------------------------------- ONNX


def test_float16_checkpoint_computed_in_half_and_in_float32(tmp_path: Path) -> None:
    """A float16 checkpoint (torchvision's model .half()): with dtype=float16 the logits are float16 and as near the
    float32 logits of the same weights as torchvision's own float16 model is (half_compare); by default the weights
    are widened and the logits match to 1e-4."""
    ref = _randomized(_tv_resnet().resnet18(), 4)
    torch.save(ref.half().state_dict(), tmp_path / "half.pth")
    ref = ref.float()  # (the float16-rounded weights, in float32)
    images = _images()
    with torch.no_grad():
        want = ref(torch.tensor(images)).numpy()
        want_half = ref.half()(torch.tensor(images).half()).float().numpy()
    model = resnet.load(tmp_path / "half.pth", dtype=dtypes.float16)
    assert model.conv1.weight.dtype == dtypes.float16 and model.bn1.running_var.dtype == dtypes.float16
    assert_half_close(model(images), want, want_half, "ResNet-18 logits")
    np.testing.assert_allclose(resnet.load(tmp_path / "half.pth")(images).numpy(), want, **TOL)
    with pytest.raises(TypeError, match="ResNet: dtype must be the float dtype .* got 'int32'"):
        resnet.load(tmp_path / "half.pth", dtype="int32")


def test_torchvision_resnet18_exported_to_onnx_matches_onnxruntime() -> None:
    """torchvision's ResNet-18 exported by torch.onnx.export (opset 17, the batch dynamic), run by tiny.onnx."""
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    import tiny.onnx

    ref = _randomized(_tv_resnet().resnet18(num_classes=20), seed=6)
    f = io.BytesIO()
    with warnings.catch_warnings():  # (the TorchScript exporter's deprecation; the new one needs onnxscript)
        warnings.simplefilter("ignore")
        torch.onnx.export(
            ref, (torch.tensor(_images(batch=2)),), f, dynamo=False, input_names=["images"], output_names=["logits"],
            dynamic_axes={"images": {0: "batch"}, "logits": {0: "batch"}}, opset_version=17,
        )  # fmt: skip
    images = _images(batch=3, size=64, seed=7)
    want = ort.InferenceSession(f.getvalue(), providers=["CPUExecutionProvider"]).run(None, {"images": images})[0]
    got = tiny.onnx.load(f.getvalue())({"images": images})["logits"].numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        np.testing.assert_allclose(got, ref(torch.tensor(images)).numpy(), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- bad input


def test_bad_checkpoints_and_images(tmp_path: Path) -> None:
    ref = _randomized(_tv_resnet().resnet18(num_classes=4), seed=8)
    state = ref.state_dict()
    del state["layer2.1.bn2.running_var"]
    state["fc.bias"] = torch.zeros(5)
    torch.save(state, tmp_path / "bad.pth")
    with pytest.raises(ValueError) as err:
        resnet.load(tmp_path / "bad.pth")
    assert "missing layer2.1.bn2.running_var" in str(err.value)
    assert "shape of fc.bias: the file has (5,), the model has (4,)" in str(err.value)
    torch.save({"weight": torch.zeros(3)}, tmp_path / "other.pth")
    with pytest.raises(ValueError, match=r"not a torchvision ResNet's state dict: no conv1.weight or fc.weight"):
        resnet.load(tmp_path / "other.pth")
    with pytest.raises(FileNotFoundError, match="no checkpoint file"):
        resnet.load(tmp_path / "absent.pth")
    with pytest.raises(ValueError, match="arch must be one of resnet18, .*got 'resnet19'"):
        resnet.load(tmp_path / "other.pth", arch="resnet19")
    model = resnet.resnet18(num_classes=4)
    with pytest.raises(ValueError, match=r"\(batch, 3, height, width\).*got shape \(3, 64, 64\)"):
        model(np.zeros((3, 64, 64), np.float32))
    with pytest.raises(ValueError, match=r"at least 32, got shape \(1, 3, 16, 64\)"):
        model(np.zeros((1, 3, 16, 64), np.float32))
    with pytest.raises(TypeError, match="images must be floats, got dtype int32"):
        model(Tensor.zeros(1, 3, 32, 32, dtype="int32"))


# ---------------------------------------------------------------- the example command


def _photo(path: Path, size: tuple[int, int], seed: int = 0) -> Path:
    """A smooth random picture (gradients plus noise), so that resizing has something to average."""
    Image = pytest.importorskip("PIL.Image")
    rng = np.random.default_rng(seed)
    w, h = size
    ramp = np.linspace(0, 255, w)[None, :, None] * np.linspace(0.2, 1.0, h)[:, None, None]
    pixels = np.clip(ramp * rng.uniform(0.5, 1.0, 3) + rng.normal(0, 20, (h, w, 3)), 0, 255).astype(np.uint8)
    Image.fromarray(pixels).save(path)
    return path


@pytest.mark.parametrize("size", [(300, 400), (500, 256), (224, 224)], ids=["tall", "wide", "small"])
def test_preprocessing_equals_torchvisions_transforms(size: tuple[int, int], tmp_path: Path) -> None:
    from tiny.examples import resnet as example

    transforms = _torchvision("transforms")
    path = _photo(tmp_path / "photo.png", size)
    Image = pytest.importorskip("PIL.Image")
    steps = [transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor()]
    pipeline = transforms.Compose([*steps, transforms.Normalize(example.MEAN.tolist(), example.STD.tolist())])
    with Image.open(path) as img:
        want = pipeline(img.convert("RGB")).numpy()
    np.testing.assert_allclose(example.preprocess(path), want, rtol=1e-5, atol=1e-5)


def _command(*args: str) -> subprocess.CompletedProcess:
    env = os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, "-m", "tiny.examples.resnet", *args], env=env, capture_output=True, text=True, timeout=300
    )


def test_the_command_classifies_with_a_checkpoint_and_labels(tmp_path: Path) -> None:
    ref = _randomized(_tv_resnet().resnet18(num_classes=6), seed=9)
    torch.save(ref.state_dict(), tmp_path / "r18.pth")
    (tmp_path / "labels.txt").write_text("".join(f"thing {i}\n" for i in range(6)))
    from tiny.examples import resnet as example

    photos = [_photo(tmp_path / "a.png", (320, 240), seed=1), _photo(tmp_path / "b.jpg", (256, 300), seed=2)]
    with torch.no_grad():
        probs = ref(torch.tensor(np.stack([example.preprocess(p) for p in photos]))).softmax(-1).numpy()
    out = _command(*map(str, photos), "--weights", str(tmp_path / "r18.pth"), "--labels", str(tmp_path / "labels.txt"))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "random" not in out.stdout
    for i, photo in enumerate(photos):
        block = lines[lines.index(str(photo)) + 1 : lines.index(str(photo)) + 6]
        assert [line.split("  ")[-1] for line in block] == [f"thing {c}" for c in np.argsort(-probs[i])[:5]]
        assert float(block[0].split("%")[0]) == pytest.approx(probs[i].max() * 100, abs=0.01)


def test_the_command_says_when_weights_are_random_and_prints_indices(tmp_path: Path) -> None:
    out = _command(str(_photo(tmp_path / "a.png", (64, 80))), "--arch", "resnet18", "--top", "3")
    assert out.returncode == 0, out.stderr
    assert "resnet18 with random weights (no --weights): its classes mean nothing" in out.stdout
    assert sum(line.strip().endswith(tuple(f"class {c}" for c in range(1000))) for line in out.stdout.splitlines()) == 3


def test_the_command_errors_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a picture")
    photo = str(_photo(tmp_path / "a.png", (64, 64)))
    torch.save({"weight": torch.zeros(3)}, tmp_path / "other.pth")
    cases = [
        ((str(tmp_path / "absent.jpg"),), f"resnet: {tmp_path / 'absent.jpg'}: no such file"),
        ((str(tmp_path / "notes.txt"),), f"resnet: {tmp_path / 'notes.txt'} is not an image Pillow can read"),
        ((photo, "--weights", str(tmp_path / "other.pth")), "resnet: cannot load"),
        ((photo, "--weights", str(tmp_path / "absent.pth")), "no checkpoint file"),
        ((photo, "--arch", "resnet19"), "resnet: argument --arch: invalid choice: 'resnet19'"),
    ]
    for args, message in cases:
        out = _command(*args)
        assert out.returncode in (1, 2) and message in out.stderr, (args, out.stderr)
        assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
