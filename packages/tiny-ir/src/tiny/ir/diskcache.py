"""A disk cache of compiled programs and search results: sqlite in the user's cache directory.

Safe when several processes use it at once (sqlite locking, WAL journal, retries); CACHELEVEL=0 turns
it off and CACHEDB moves it.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import sqlite3
import threading
from typing import Any

from tiny.ir.config import CACHEDB, CACHELEVEL, cache_dir

try:  # CPython's own BLAKE2: importing hashlib loads OpenSSL's library, 3.6 MB resident in every process, for a key
    from _blake2 import blake2b as _blake2b
except ImportError:  # (a Python without it)
    from hashlib import blake2b as _blake2b

_VERSION = 1  # bump when what is stored changes meaning
_local = threading.local()


def digest(data: bytes) -> str:
    """The key of `data` in a cache: 256 bits of BLAKE2b, in hex."""
    return _blake2b(data, digest_size=32).hexdigest()


def _path() -> str:
    return CACHEDB.value or os.path.join(cache_dir(), "cache.db")


def _connect() -> sqlite3.Connection | None:
    path = _path()
    conns: dict[str, sqlite3.Connection] = getattr(_local, "conns", None) or {}
    _local.conns = conns
    if path in conns:
        return conns[path]
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        conn = sqlite3.connect(path, timeout=30, isolation_level=None)
        with contextlib.suppress(sqlite3.OperationalError):
            conn.execute("PRAGMA journal_mode=WAL")
    except (OSError, sqlite3.Error):
        return None  # a cache that cannot open is no cache, not an error
    conns[path] = conn
    return conn


def _table(conn: sqlite3.Connection, table: str) -> str:
    name = f"{table}_v{_VERSION}"
    conn.execute(f'CREATE TABLE IF NOT EXISTS "{name}" (key TEXT PRIMARY KEY, value BLOB)')
    return name


def cache_get(table: str, key: str) -> Any | None:
    if CACHELEVEL.value <= 0 or (conn := _connect()) is None:
        return None
    try:
        row = conn.execute(f'SELECT value FROM "{_table(conn, table)}" WHERE key=?', (key,)).fetchone()
    except sqlite3.Error:
        return None
    if row is None:
        return None
    try:
        return pickle.loads(row[0])
    except Exception:  # noqa: BLE001  (a damaged entry is a miss)
        return None


def cache_put(table: str, key: str, value: Any) -> None:
    if CACHELEVEL.value <= 0 or (conn := _connect()) is None:
        return
    blob = pickle.dumps(value)
    with contextlib.suppress(sqlite3.Error):
        conn.execute(f'INSERT OR REPLACE INTO "{_table(conn, table)}" (key, value) VALUES (?, ?)', (key, blob))
