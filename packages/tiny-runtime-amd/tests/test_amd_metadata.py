"""The installed tiny-runtime-amd distribution matches its pyproject.toml and registers its devices with tiny."""

import importlib.metadata
import tomllib
from pathlib import Path

PYPROJECT = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]


def test_installed_version_is_this_checkouts():
    # a stale install (an older wheel, another checkout) shows up here as a different version
    assert importlib.metadata.version("tiny-runtime-amd") == PYPROJECT["version"]


def test_registers_its_devices_in_the_tiny_devices_group():
    installed = importlib.metadata.distribution("tiny-runtime-amd").entry_points
    eps = {ep.name: ep.value for ep in installed.select(group="tiny.devices")}
    assert "AMD" in eps, f"tiny-runtime-amd registers no AMD device: {eps}"
    assert all(value.startswith("tiny.runtime.amd.") for value in eps.values()), eps
    assert eps == PYPROJECT["entry-points"]["tiny.devices"]


def test_depends_on_tiny_ir_alone():
    requires = importlib.metadata.requires("tiny-runtime-amd") or []
    tiny = [r for r in requires if r.startswith("tiny-") and "extra ==" not in r.replace("'", '"')]
    assert len(tiny) == 1 and tiny[0].startswith("tiny-ir"), requires
    # the mock kernel driver's PYTHON emulator comes only with the [mock] extra
    mock = [r for r in requires if 'extra == "mock"' in r.replace("'", '"')]
    assert any(r.startswith("tiny-runtime-misc") for r in mock), requires
