"""VIZ end to end: a script's schedules and kernels saved (VIZ=path) with each pass of the spine, served live (VIZ=1)
until Ctrl-C, and the page in a real headless browser (Debian's chromium driven by selenium): it loads, lists a
softmax's kernels, draws a pass's graph, a click on a pass shows its rewrite and the rules that fired, and the profile
view shows the kernels of a training step."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tiny.ir.viz import load
from tiny.viz import make_server, url_of

# a softmax, then a few steps of training a linear layer (jitted), with PROFILE on as well
SCRIPT = """
import numpy as np
from tiny import nn
from tiny.nn.state import get_parameters
from tiny.tensor import Tensor, TinyJit
x = Tensor(np.arange(24, dtype=np.float32).reshape(4, 6) / 10)
print(x.softmax(axis=1).numpy().sum())
layer = nn.Linear(6, 3)
opt = nn.optim.SGD(get_parameters(layer), lr=0.1)
@TinyJit
def step(x, y):
    opt.zero_grad()
    loss = layer(x).sparse_categorical_crossentropy(y).backward()
    opt.step()
    return loss.realize()
for _ in range(3):
    step(x, Tensor(np.array([0, 1, 2, 0], dtype=np.int32)))
"""
CODEGEN_PASSES = ["symbolic", "vectorize", "linearize"]  # after "index memory", "lower [actions]"; "narrow loops" where
# it acts
SCHEDULE_PASSES = ["prepare", "lift reshapes", "read copies", "kernels"]


def _run(tmp_path: Path, viz: str, **popen: Any) -> subprocess.Popen:
    (tmp_path / "script.py").write_text(SCRIPT)
    env = os.environ | {"VIZ": viz, "PROFILE": str(tmp_path / "profile.json"), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, str(tmp_path / "script.py")]
    return subprocess.Popen(cmd, env=env, cwd=tmp_path, text=True, stdout=subprocess.PIPE, **popen)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("viz")
    proc = _run(tmp, str(tmp / "trace.json"))
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    assert f"saved to {tmp / 'trace.json'}; view them with python -m tiny.viz {tmp / 'trace.json'}" in out
    return load(tmp / "trace.json")


def test_the_trace_holds_every_schedule_and_kernel_pass_by_pass(saved: dict[str, Any]) -> None:
    schedules = [g for g in saved["groups"] if g["kind"] == "schedule"]
    kernels = [g for g in saved["groups"] if g["kind"] == "kernel"]
    assert schedules and kernels
    planned = [g for g in schedules if g["steps"]]  # (the others reused a cached schedule, and say so)
    assert planned and all([s["name"] for s in g["steps"]] == SCHEDULE_PASSES for g in planned)
    assert all("cached schedule" in g["info"]["note"] for g in schedules if not g["steps"])
    for g in kernels:
        names = [s["name"] for s in g["steps"]]
        assert names[0] == "index memory" and names[1].startswith("lower [")
        assert [n for n in names[2:] if n != "narrow loops"] == CODEGEN_PASSES
        assert g["name"] in g["info"]["source"] and "actions" in g["info"]
    softmax = [g for g in kernels if g["name"].startswith("r_4_6")]
    assert softmax, [g["name"] for g in kernels]
    assert any(s["rules"] for g in softmax for s in g["steps"] if s["name"] == "symbolic")
    assert all(s["rules"] for g in softmax for s in g["steps"] if s["name"] == "index memory")  # (READ -> LOAD ...)
    spans = [e for e in saved["profile"]["traceEvents"] if e.get("cat") == "kernel"]
    assert len(spans) >= 3 * 5  # the training steps' kernels, replays included


@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_viz_1_serves_while_running_and_after_until_ctrl_c(tmp_path: Path, sigint: str) -> None:
    """Ctrl-C (SIGINT) stops the page, also where the process started ignoring SIGINT, as a shell's background job
    does (nox run in the background: the test hung there)."""
    ignore = signal.SIG_IGN if sigint == "ignored" else signal.SIG_DFL
    proc = _run(tmp_path, "1", stderr=subprocess.STDOUT, preexec_fn=lambda: signal.signal(signal.SIGINT, ignore))
    try:
        lines: list[str] = []
        while not any("until Ctrl-C" in line for line in lines):
            line = proc.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)
        url = next(line.split(" at ")[1].split()[0] for line in lines if "serving the schedules" in line)
        assert url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(url + "api/groups", timeout=10) as r:
            groups = json.loads(r.read())
        assert any(g["kind"] == "kernel" for g in groups) and proc.poll() is None  # the script ended, still serving
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0 and "VIZ: stopped" in out and "Traceback" not in out


# ---------------------------------------------------------------- the page in a browser


def _browser() -> Any:
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is a dev dependency (pip install '.[dev]')")
    from selenium.webdriver.chrome.service import Service

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.skip("no chromium and chromedriver here (apt install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1600,1000"):
        options.add_argument(arg)
    options.binary_location = chromium
    return webdriver.Chrome(service=Service(driver), options=options)


@pytest.fixture(scope="module")
def page(saved: dict[str, Any]) -> Iterator[tuple[Any, str]]:
    server = make_server(lambda: saved)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    browser = _browser()
    try:
        browser.get(url_of(server))
        yield browser, url_of(server)
    finally:
        browser.quit()
        server.shutdown()
        server.server_close()


def _wait(browser: Any, css: str, at_least: int = 1, timeout: float = 60) -> list[Any]:
    from selenium.webdriver.common.by import By

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = browser.find_elements(By.CSS_SELECTOR, css)
        if len(found) >= at_least:
            return found
        time.sleep(0.05)
    raise AssertionError(f"no {css} on the page after {timeout} s")


def test_the_page_lists_a_softmaxs_kernels_and_draws_a_pass(page: tuple[Any, str], saved: dict[str, Any]) -> None:
    from selenium.webdriver.common.by import By

    browser, _ = page
    items = _wait(browser, "li.group", len(saved["groups"]))
    names = [i.find_element(By.CSS_SELECTOR, ".name").text for i in items]
    assert names == [g["name"] for g in saved["groups"]]
    index = next(i for i, g in enumerate(saved["groups"]) if g["name"].startswith("r_4_6"))
    items[index].click()
    steps = _wait(browser, "li.step")
    group = saved["groups"][index]
    assert [s.get_attribute("data-name") for s in steps] == [s["name"] for s in group["steps"]]
    assert group["name"] in browser.find_element(By.ID, "source").text
    # a click on the symbolic pass: its graph drawn, the rules that fired listed with their source lines
    position = next(i for i, s in enumerate(group["steps"]) if s["name"] == "symbolic")
    steps[position].click()
    svg = _wait(browser, "#graph svg")[0]
    after = group["steps"][position]["after"]["nodes"]
    assert int(svg.get_attribute("data-nodes")) == min(len(after), 400)
    assert len(browser.find_elements(By.CSS_SELECTOR, "#graph g.node")) == min(len(after), 400)
    rules = _wait(browser, "li.rule")
    fired = group["steps"][position]["rules"]
    assert len(rules) == len(fired) > 0 and fired[0]["rule"] in rules[0].text and "symbolic.py:" in rules[0].text
    assert "after" in browser.find_element(By.ID, "graph-title").text
    browser.find_element(By.ID, "show-before").click()
    before = group["steps"][position]["before"]["nodes"]
    assert f"before, {len(before)} nodes" in browser.find_element(By.ID, "graph-title").text
    svg = _wait(browser, "#graph svg")[0]
    assert int(svg.get_attribute("data-nodes")) == min(len(before), 400)


def test_the_profile_view_shows_the_kernels_of_a_training_step(page: tuple[Any, str], saved: dict[str, Any]) -> None:
    from selenium.webdriver.common.by import By

    browser, _ = page
    browser.find_element(By.ID, "tab-profile").click()
    spans = [e for e in saved["profile"]["traceEvents"] if e.get("cat") == "kernel"]
    drawn = _wait(browser, "rect.span.kernel", len(spans))
    assert len(drawn) == len(spans)
    assert browser.find_element(By.ID, "graphs-view").is_displayed() is False
    drawn[-1].click()
    assert spans[-1]["name"] in browser.find_element(By.ID, "span-info").text
    names = {e["tid"]: e["args"]["name"] for e in saved["profile"]["traceEvents"] if e["name"] == "thread_name"}
    tracks = [t.text for t in browser.find_elements(By.CSS_SELECTOR, "text.track")]
    assert {names[e["tid"]] for e in spans} <= set(tracks)  # the device's track is drawn
    browser.find_element(By.ID, "tab-graphs").click()
