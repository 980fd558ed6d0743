"""python -m tiny.viz TRACE [--port N]: serve the web page of a trace saved with VIZ=TRACE, until Ctrl-C."""

from __future__ import annotations

import argparse
import sys

from tiny.ir.viz import TraceError, load
from tiny.viz import make_server, url_of


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tiny.viz", description="Serve the web page of a VIZ trace (saved by a run with VIZ=PATH)."
    )
    parser.add_argument("trace", help="the file a run with VIZ=PATH saved")
    parser.add_argument("--port", type=int, default=0, help="the port on 127.0.0.1 (default: a free one)")
    args = parser.parse_args(argv)
    try:
        data = load(args.trace)
    except TraceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        server = make_server(lambda: data, args.port)
    except OSError as e:
        print(f"error: cannot serve on 127.0.0.1:{args.port}: {e}", file=sys.stderr)
        return 2
    groups = len(data["groups"])
    print(f"VIZ: serving {groups} schedules and kernels of {args.trace} at {url_of(server)} until Ctrl-C", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("VIZ: stopped", flush=True)
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
