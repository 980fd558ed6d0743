import os

import pytest

from tiny.ir.device import DeviceUnavailable
from tiny.runtime.amd.discovery import find_stack, gfx_name, gfx_targets
from tiny.runtime.amd.kfd import AMDDevice


@pytest.mark.parametrize(
    "version,name", [(110000, "gfx1100"), (120001, "gfx1201"), (90402, "gfx942"), (90500, "gfx950"), (90010, "gfx90a")]
)
def test_gfx_name(version: int, name: str) -> None:
    assert gfx_name(version) == name


def test_gfx_targets_reads_topology(tmp_path) -> None:
    for node, version in (("0", 0), ("1", 110000), ("2", 90402)):  # node 0 is the CPU
        os.makedirs(tmp_path / node)
        (tmp_path / node / "properties").write_text(f"cpu_cores_count 0\ngfx_target_version {version}\nsimd_count 8\n")
    assert gfx_targets(str(tmp_path)) == ("gfx1100", "gfx942")


def test_stack_reports_a_reason_or_a_gpu() -> None:
    stack = find_stack()
    if not os.path.exists("/dev/kfd"):
        assert not stack.kfd and "/dev/kfd" in (stack.problem or "")
    else:
        assert stack.problem is None or stack.problem


def test_device_says_why_it_cannot_start(monkeypatch: pytest.MonkeyPatch) -> None:
    if os.path.exists("/dev/kfd"):
        pytest.skip("this machine has /dev/kfd: the AMD device may well start")
    monkeypatch.delenv("AMD_MOCK", raising=False)  # the real driver, not the mock
    with pytest.raises(DeviceUnavailable) as e:
        AMDDevice("AMD", "AMDGPU")
    assert str(e.value)
