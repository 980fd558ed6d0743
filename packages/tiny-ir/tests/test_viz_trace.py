"""VIZ's recording (tiny.ir.viz) and its server (tiny.viz) without a browser: a named rewrite pass records the graph
before and after and each rule that fired, nothing is recorded outside a group, while paused or with VIZ off, graphs
serialize in order and are cut when huge, traces round-trip through a file and other formats are refused, and the
server answers the page, its files and the JSON the page reads (and nothing outside its folder)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tiny.ir import viz
from tiny.ir.config import Context
from tiny.ir.dtypes import dtypes
from tiny.ir.pattern import PatternMatcher, UPat, graph_rewrite
from tiny.ir.uop import Ops, UOp
from tiny.viz import make_server, url_of


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    viz.clear()
    yield
    viz.clear()


def _x_plus_zero() -> UOp:
    x = UOp(Ops.DEFINE_VAR, dtypes.int32, arg=("x", 0, 9))
    return UOp(Ops.SINK, src=((x + 0) * 1,))


def _drop_add_zero(a: UOp) -> UOp | None:
    return a.src[0] if a.src[1].op is Ops.CONST and a.src[1].arg == 0 else None


def _drop_mul_one(m: UOp) -> UOp | None:
    return m.src[0] if m.src[1].op is Ops.CONST and m.src[1].arg == 1 else None


RULES = PatternMatcher([(UPat(Ops.ADD, name="a"), _drop_add_zero), (UPat(Ops.MUL, name="m"), _drop_mul_one)])


def test_a_named_pass_records_its_graphs_and_each_rule_that_fired() -> None:
    sink = _x_plus_zero()
    with Context(VIZ="unused.json"), viz.group("kernel", "k") as g:
        out = graph_rewrite(sink, RULES, name="tidy")
    assert out.src[0].op is Ops.DEFINE_VAR and g is not None
    [step] = g.steps
    assert step["name"] == "tidy"
    assert [n["op"] for n in step["before"]["nodes"]] == ["DEFINE_VAR", "CONST", "ADD", "CONST", "MUL", "SINK"]
    assert [n["op"] for n in step["after"]["nodes"]] == ["DEFINE_VAR", "SINK"]
    assert step["after"]["nodes"][1]["src"] == [0]
    line = _drop_add_zero.__code__.co_firstlineno
    assert step["rules"][0] == {
        "rule": f"test_viz_trace.py:{line}",
        "pattern": "UPat(ADD as a)",
        "code": "def _drop_add_zero(a: UOp) -> UOp | None:",
        "before": "ADD int32",
        "after": "DEFINE_VAR int32 ('x', 0, 9)",
    }
    assert [r["rule"] for r in step["rules"]] == [f"test_viz_trace.py:{line}", f"test_viz_trace.py:{line + 4}"]


def test_nothing_is_recorded_when_off_outside_a_group_or_paused() -> None:
    sink = _x_plus_zero()
    with viz.group("kernel", "off") as g:  # VIZ unset
        graph_rewrite(sink, RULES, name="tidy")
    assert g is None and viz.groups() == []
    with Context(VIZ="unused.json"):
        graph_rewrite(sink, RULES, name="tidy")  # no group open
        with viz.paused(), viz.group("kernel", "paused") as g:
            graph_rewrite(sink, RULES, name="tidy")
        assert g is None and viz.groups() == []
        with viz.group("kernel", "unnamed") as g:
            graph_rewrite(sink, RULES)  # a pass without a name (a helper's rewrite) is not a step
    assert g is not None and g.steps == []


def test_a_linearized_kernel_keeps_its_order_and_huge_graphs_are_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    x = UOp(Ops.DEFINE_VAR, dtypes.int32, arg=("x", 0, 9))
    y = x * 3
    listed = viz.graph([x, UOp.const(dtypes.int32, 3), y])
    assert listed["linear"] and [n["op"] for n in listed["nodes"]] == ["DEFINE_VAR", "CONST", "MUL"]
    monkeypatch.setattr(viz, "MAX_NODES", 2)
    cut = viz.graph(UOp(Ops.SINK, src=(y,)))
    assert cut["cut"] == 2 and [n["op"] for n in cut["nodes"]] == ["MUL", "SINK"]
    assert cut["nodes"][0]["src"] == [] and cut["nodes"][1]["src"] == [0]


def test_a_trace_round_trips_through_a_file_and_other_formats_are_refused(tmp_path: Path) -> None:
    with Context(VIZ="unused.json"), viz.group("schedule", "s"):
        graph_rewrite(_x_plus_zero(), RULES, name="tidy")
    path = viz.save(tmp_path / "t.json")
    loaded = viz.load(path)
    assert loaded["format"] == viz.FORMAT and loaded["groups"][0]["steps"][0]["name"] == "tidy"
    (tmp_path / "old.json").write_text(json.dumps({**loaded, "format": viz.FORMAT + 1}))
    with pytest.raises(viz.TraceError, match=f"format {viz.FORMAT + 1}, this tiny reads format {viz.FORMAT}"):
        viz.load(tmp_path / "old.json")
    (tmp_path / "junk.json").write_text("{not json")
    with pytest.raises(viz.TraceError, match="not a VIZ trace"):
        viz.load(tmp_path / "junk.json")
    cmd = [sys.executable, "-m", "tiny.viz", str(tmp_path / "old.json")]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 2 and "format" in done.stderr and "Traceback" not in done.stderr


def _get(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.headers["Content-Type"], r.read()
    except urllib.error.HTTPError as e:
        return e.code, "", b""


def test_the_server_answers_the_page_its_files_and_the_trace() -> None:
    with Context(VIZ="unused.json"), viz.group("kernel", "k", source="void k() {}"):
        graph_rewrite(_x_plus_zero(), RULES, name="tidy")
    trace = viz.trace()
    server = make_server(lambda: trace)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = url_of(server)
        assert url.startswith("http://127.0.0.1:")
        status, kind, page = _get(url)
        assert status == 200 and kind.startswith("text/html") and b"/static/dagre.min.js" in page
        status, kind, script = _get(url + "static/dagre.min.js")
        assert status == 200 and kind.startswith("text/javascript") and b"dagre" in script
        status, _, body = _get(url + "api/groups")
        assert json.loads(body) == [{"id": 0, "kind": "kernel", "name": "k",
                                     "steps": [{"name": "tidy", "rules": 2, "nodes": 2}]}]  # fmt: skip
        status, _, body = _get(url + "api/group/0")
        assert json.loads(body)["info"] == {"source": "void k() {}"}
        assert _get(url + "api/profile")[2] == b"null"
        for missing in ("api/group/1", "api/group/x", "static/..%2F__init__.py", "static/viz.py", "nothing"):
            assert _get(url + missing)[0] == 404, missing
    finally:
        server.shutdown()
        server.server_close()
