"""Fixtures of the tiny-tensor tests: the devices the op tests run on.

By default every test that takes `device` runs on CPU and on PYTHON (the reference emulator). With the
environment variable DEVICE set (DEVICE=CUDA, DEVICE=CPU:LLVM ...) it runs on that device only, so a new
backend runs the very same suite. A device that cannot open here is skipped with the reason.
"""

from __future__ import annotations

import os

import pytest
from tensor_helpers import missing_dtype, open_device

from tiny.tensor import Device

DEFAULT_DEVICES = ("CPU", "PYTHON")
# devices that open but compute nothing: the op tests compare values, so they skip there
NO_COMPUTE = frozenset({"NULL"})


def devices_under_test() -> list[str]:
    """The devices the op tests run on: $DEVICE alone when it is set, else CPU and PYTHON."""
    env = os.environ.get("DEVICE", "").strip()
    return [env] if env else list(DEFAULT_DEVICES)


@pytest.fixture(params=devices_under_test())
def device(request: pytest.FixtureRequest) -> str:
    """A device every op test runs on."""
    name = open_device(request.param)
    if name.split(":")[0] in NO_COMPUTE:
        pytest.skip(f"device {name} computes nothing (its buffers read back as zeros); the op tests compare values")
    return name


@pytest.fixture
def python_device() -> str:
    """The PYTHON emulator, for tests that compare a device with it; skipped when it is not there yet."""
    return open_device("PYTHON")


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> object:
    """A test on a device whose renderer lacks a dtype the test computes in (WEBGPU has no float64 or int64;
    Python ints are int64) is skipped when the op refuses that dtype with the clear error at the call."""
    try:
        return (yield)
    except Exception as e:  # noqa: BLE001  (a TypeError, or pytest.raises failing on one)
        skip_for_missing_dtype(pyfuncitem.funcargs.get("device", Device.DEFAULT), e)
        raise


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest) -> object:
    """The same for a fixture that computes (on the default device: the fixtures here take no device)."""
    try:
        return (yield)
    except Exception as e:  # noqa: BLE001
        skip_for_missing_dtype(Device.DEFAULT, e)
        raise


def skip_for_missing_dtype(device: str, error: BaseException) -> None:
    dtype = missing_dtype(device, error)
    if dtype is not None:
        pytest.skip(f"device {device} does not compute in {dtype} (the test needs it): {error}")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--opt-fuzz", type=int, default=6, help="random action sequences per kernel in test_opt_fuzz")
    parser.addoption("--opt-fuzz-seed", type=int, default=0, help="seed of test_opt_fuzz")
    parser.addoption("--autograd-fuzz", type=int, default=40, help="random graphs in test_autograd_fuzz")
    parser.addoption("--autograd-fuzz-seed", type=int, default=0, help="first seed of test_autograd_fuzz")
