"""The launches of a CPU device, run in the order they are given: where they are given while the process has one CPU
device open (nothing else could run beside them), and by a thread of the device's own once it has several (`CPU`,
`CPU:1` ...), so that the devices compute side by side, each on its share of the cores.

A launch that touches memory of several devices (a copy between two; a kernel that reads another device's memory) is
a meeting of their queues: it runs once every one of them has run what it was given before, and none runs what it is
given after until the meeting's launch is done. Meetings are given to their queues in one order (under one lock), so
no two queues can wait for each other. The host reads and writes a device's memory only after its queue is done
(`Queue.synchronize`: the allocator's copies, and Buffer.copyout through the device's synchronize)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any

Work = Callable[..., Any]


class Queue:
    """One device's launches, in order. `submit` runs a launch now (one CPU device open) or hands it to the device's
    thread (several); `synchronize` waits until everything given so far has run, and raises what a launch raised."""

    def __init__(self, name: str, threaded: Callable[[], bool]) -> None:
        self.name = name
        self.threaded = threaded  # whether launches go to the device's thread now (see CPUDevice.queued)
        self.items: SimpleQueue[tuple[Work, tuple[Any, ...]]] = SimpleQueue()
        self.given = 0  # items handed to the thread (counted under `lock`)
        self.done = 0  # items the thread has run (counted by the thread alone)
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None  # the first error a launch raised since the last synchronize

    def submit(self, work: Work, *args: Any) -> None:
        if not self.threaded():
            work(*args)
            return
        self._put(work, args)

    def _put(self, work: Work, args: tuple[Any, ...]) -> None:
        with self.lock:
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name=f"tiny-{self.name}", daemon=True)
                self.thread.start()
            self.given += 1
            self.items.put((work, args))

    def _run(self) -> None:
        get = self.items.get
        while True:
            work, args = get()
            try:
                work(*args)
            except BaseException as e:  # noqa: BLE001  (kept for the next synchronize, which raises it)
                if self.error is None:
                    self.error = e
            self.done += 1

    def synchronize(self) -> None:
        if self.done != self.given:
            finished = threading.Event()
            self._put(finished.set, ())
            finished.wait()
        if (error := self.error) is not None:
            self.error = None
            raise RuntimeError(f"a launch on {self.name} failed: {error}") from error


_giving = threading.Lock()  # meetings are given to all their queues before the next meeting is given to any


class _Meeting:
    """Work that waits for several queues: each queue's thread arrives in turn, the last to arrive runs it, and the
    others wait until it has."""

    def __init__(self, parties: int, work: Work, args: tuple[Any, ...]) -> None:
        self.left, self.work, self.args = parties, work, args
        self.lock, self.finished = threading.Lock(), threading.Event()

    def arrive(self) -> None:
        with self.lock:
            self.left -= 1
            last = self.left == 0
        if not last:
            self.finished.wait()
            return
        try:
            self.work(*self.args)
        finally:
            self.finished.set()


def meet(queues: list[Queue], work: Work, *args: Any) -> None:
    """Run `work(*args)` after everything given to each of `queues` so far and before anything given after."""
    queues = list(dict.fromkeys(queues))  # (a copy within one device meets its one queue)
    if len(queues) == 1 or not any(q.threaded() for q in queues):
        queues[0].submit(work, *args)
        return
    meeting = _Meeting(len(queues), work, args)
    with _giving:
        for q in queues:
            q._put(meeting.arrive, ())
