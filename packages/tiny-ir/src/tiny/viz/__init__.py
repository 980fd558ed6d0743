"""tiny.viz: the web page of a VIZ trace (see tiny.ir.viz), served on 127.0.0.1 by Python's own HTTP server.

The page (static/index.html, viz.js, viz.css) lists every schedule and kernel; for one it lists the passes, draws the
graph before or after a pass (laid out by dagre, bundled here: static/dagre.min.js, MIT, see dagre.LICENSE, so that
nothing is fetched from the network), lists the rules that fired with their source lines, and shows a kernel's
actions and rendered source. Its Profile tab draws PROFILE's spans as a timeline.

The page reads JSON from: /api/groups (a summary of each group), /api/group/N (one group whole), /api/profile.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from tiny.ir.config import VIZ_PORT

STATIC = Path(__file__).resolve().parent / "static"
TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".LICENSE": "text/plain"}

Source = Callable[[], dict[str, Any]]  # the trace now: tiny.ir.viz.trace while recording, a loaded file's otherwise


def summary(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """Each group without its graphs: what the page's list shows."""
    out = []
    for i, g in enumerate(trace["groups"]):
        steps = [{"name": s["name"], "rules": len(s["rules"]), "nodes": len(s["after"]["nodes"])} for s in g["steps"]]
        out.append({"id": i, "kind": g["kind"], "name": g["name"], "steps": steps})
    return out


class _Handler(BaseHTTPRequestHandler):
    source: Source  # (set on a subclass per server)

    def do_GET(self) -> None:  # noqa: N802  (http.server's name)
        path = urlparse(self.path).path
        if path in ("/", "/index.html"):
            return self._file("index.html")
        if path.startswith("/static/"):
            return self._file(path.removeprefix("/static/"))
        if path == "/api/groups":
            return self._json(summary(self.source()))
        if path.startswith("/api/group/"):
            groups = self.source()["groups"]
            index = path.removeprefix("/api/group/")
            if index.isdigit() and int(index) < len(groups):
                return self._json(groups[int(index)])
        if path == "/api/profile":
            return self._json(self.source().get("profile"))
        if path == "/favicon.ico":  # (none: said so without an error in the browser's console)
            self.send_response(204)
            self.end_headers()
            return None
        self.send_error(404, f"no such page: {path}")

    def _file(self, name: str) -> None:
        if name not in {p.name for p in STATIC.iterdir()}:  # (only the files that are there: no path reaches out)
            return self.send_error(404, f"no such file: {name}")
        path = STATIC / name
        self._send(path.read_bytes(), TYPES.get(path.suffix, "application/octet-stream"))

    def _json(self, value: Any) -> None:
        self._send(json.dumps(value).encode(), "application/json")

    def _send(self, body: bytes, kind: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", f"{kind}; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # (quiet: the script's own output stays readable)
        pass


def make_server(source: Source, port: int = 0) -> ThreadingHTTPServer:
    """A server of the page for the trace `source` gives, on 127.0.0.1 at `port` (0: a free one); not started."""
    handler = type("Handler", (_Handler,), {"source": staticmethod(source)})
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    server.daemon_threads = True
    return server


def url_of(server: ThreadingHTTPServer) -> str:
    host, port = server.server_address[:2]
    return f"http://{host}:{port}/"


_live: ThreadingHTTPServer | None = None  # the server of this process's own recording (VIZ=1)


def start_server(source: Source) -> str:
    """Serve `source` from a background thread from now on (VIZ=1: while the script runs), saying where."""
    global _live
    _live = make_server(source, VIZ_PORT.value)
    threading.Thread(target=_live.serve_forever, name="tiny.viz", daemon=True).start()
    print(f"VIZ: serving the schedules and kernels at {url_of(_live)}", flush=True)
    return url_of(_live)


def serve_until_interrupted() -> None:
    """At the end of a VIZ=1 script: keep the page up until Ctrl-C."""
    if _live is None:
        return
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN and threading.current_thread() is threading.main_thread():
        # (started as a shell's background job, which ignores SIGINT: kill -INT must still stop the page)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:  # (from the line on: a Ctrl-C that comes as soon as it is read stops the page too)
        print(f"VIZ: the script has ended; still serving at {url_of(_live)} until Ctrl-C", flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print("VIZ: stopped", flush=True)
    finally:
        _live.shutdown()
