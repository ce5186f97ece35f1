"""What the benchmark scripts share: timestamped progress lines, publishing the table a run made, a process tree."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Callable


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def publish(table: str, out: Path) -> None:
    """Print the table and write it to ``out`` (by default the script's file under bench/results/)."""
    print(table)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table)
    log(f"wrote {out}")


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it, as /proc shows them now."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        try:
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as children:
                    todo += [int(child) for child in children.read().split()]
        except OSError:
            pass
    return found


class PeakMemory:
    """The largest RSS (``VmHWM``) of process ``pid`` and of its descendants, by ``kind_of(pid)`` (default: one
    kind, ``all``), sampled every ``period_s`` from this process until the ``with`` block ends.

    Not ``ru_maxrss``: Linux keeps it across ``exec``, so a process started by a big one reports its parent's size.
    Sampled from outside: a sampling thread inside the measured process would make it multi-threaded, and data prep
    then starts its pool by spawn (a second of imports per process) instead of fork, as it would not in a real run.
    """

    def __init__(self, pid: int, kind_of: Callable[[int], str] = lambda pid: "all", period_s: float = 0.2) -> None:
        self.pid, self.kind_of, self.period_s = pid, kind_of, period_s
        self.peaks: dict[str, int] = {}
        self._kinds: dict[int, tuple[bytes, str]] = {}  # pid -> (its command line, its kind)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "PeakMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _kind(self, pid: int) -> str | None:
        """The kind of ``pid``, classified again when its command line changed: a child seen between its fork and
        its exec has its parent's (a worker counted as the step that started it, before 2026-12-06)."""
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                argv = cmdline.read()
        except OSError:
            return None  # it ended meanwhile
        known = self._kinds.get(pid)
        if known is None or known[0] != argv:
            known = self._kinds[pid] = (argv, self.kind_of(pid))
        return known[1]

    def _run(self) -> None:
        while True:
            for pid in descendants(self.pid):
                try:
                    with open(f"/proc/{pid}/status") as status:
                        rss = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) * 1024
                except (OSError, StopIteration):
                    continue  # it ended meanwhile
                kind = self._kind(pid)
                if kind is not None:
                    self.peaks[kind] = max(self.peaks.get(kind, 0), rss)
            if self._stop.wait(self.period_s):
                return
