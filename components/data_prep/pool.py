"""The pool of processes every data-prep pass runs its work on (discovery, counting, converting)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import Optional


def default_processes() -> int:
    """The cores this process may run on (a pod's CPU limit shows as its affinity where the runtime sets it)."""
    return len(os.sched_getaffinity(0))


def parallel_map(fn: Callable, items: Sequence, processes: Optional[int]) -> list:
    """``fn(*item)`` for every item, in order, in a pool of ``processes`` (default: every core); in this process
    when one will do. An item's error is raised at its turn, so the first failing item in order is the one
    reported, whatever the pool's timing."""
    processes = min(processes or default_processes(), len(items))
    if processes <= 1:
        return [fn(*item) for item in items]
    # fork costs nothing but is safe only while this process has one thread (a lock another thread held at the
    # fork stays held in the child); else spawn, which starts each worker afresh (a second of imports).
    single_threaded = len(os.listdir("/proc/self/task")) == 1 if os.path.isdir("/proc/self/task") else False
    with ProcessPoolExecutor(processes, mp_context=get_context("fork" if single_threaded else "spawn")) as pool:
        return list(pool.map(fn, *zip(*items)))
