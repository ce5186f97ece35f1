"""The fitted baseline handed to a job that is already training: the baseline is fitted beside the train step.

A model that blends the baseline in (``model.blend_baseline``) trains without it: its workers need it first when
they judge a checkpoint on the blended predictions. So the train step starts as soon as the dataset is prepared, and
the fit, running beside it, publishes itself where the workers find it without anything passed between them: under
a root (on Kubeflow the checkpoint store, where fit-baseline, a step of its own, publishes; on kfp.local, which runs
one task at a time, the step cache's root, where the train step's own fit beside its job publishes), at a name made
of the dataset artifact's URI and the fit's settings (:func:`handoff_uri`; the functions below take the
:class:`~components.storage.Storage` opened there). A worker waits for it there when it first needs it
(:func:`wait_for_baseline`); a fit-baseline step that finds a fit published takes it (:func:`take_published`).

The name follows the step cache: KFP serves a cached fit-baseline only for the same dataset artifact and settings,
and then the hand-off its first run published is still there. The baseline file is published before the
:data:`READY_FILE` that names its digest and what it was fitted with, so a reader sees the whole file or waits. A
fit that fails publishes its error (:data:`FAILED_FILE`); its retry clears it when it starts, so where the step is
retried a worker gives up only when no retry has cleared it within :data:`FAILED_GRACE_S`.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Callable

from components.checkpoint.format import file_digest
from components.networks.models import BASELINE_FILE
from components.storage import Storage

HANDOFF_DIR = "baselines"  # under the root: the checkpoint store, or kfp.local's step cache
READY_FILE, FAILED_FILE = "READY.json", "FAILED.json"
# How long a worker waits for the baseline: the fit of eval.baseline_rows rows takes ~40 s at 800k rows here.
HANDOFF_WAIT_S = 3600.0
# How long a published failure stands before a worker gives up where the step is retried (cluster.step_retries):
# KFP retries it after 60 s, then 120 s, ...
FAILED_GRACE_S = 300.0
POLL_S = 2.0

_sleep = time.sleep  # tests patch it


class BaselineUnavailable(RuntimeError):
    """The baseline fitted beside the job did not arrive: its step failed, or nothing published it in time."""


def handoff_uri(root: str, dataset_uri: str, rows: int, features: int) -> str:
    """Where the fit of the dataset at ``dataset_uri`` is published under ``root``: the same for the fit and the job,
    and for a cached step and the run that first fitted it."""
    key = hashlib.sha256(json.dumps([dataset_uri, rows, features]).encode()).hexdigest()[:20]
    return f"{root.rstrip('/')}/{HANDOFF_DIR}/{key}"


def clear_failure(store: Storage) -> None:
    """A fit starting again (the step's retry) withdraws the failure an earlier try published."""
    store.remove(FAILED_FILE)


def publish(baseline_dir: str | Path, store: Storage, fit: dict) -> None:
    """Publish the fit in ``baseline_dir``: the file, then the marker naming its digest and ``fit``, what it was
    fitted with (a reader looks for the marker first: a failure an earlier try published no longer counts)."""
    sent = store.send_file(Path(baseline_dir) / BASELINE_FILE, None, BASELINE_FILE)
    store.write_json(None, READY_FILE, {"file": BASELINE_FILE, **sent, "fit": fit})


def is_published(store: Storage) -> bool:
    return store.read_json(None, READY_FILE) is not None


def take_published(store: Storage, local: Path) -> dict | None:
    """What the fit published in ``store`` was fitted with, its file fetched into ``local`` and checked; None when
    nothing is published there."""
    ready = store.read_json(None, READY_FILE)
    if ready is None:
        return None
    _fetch(store, ready, local)
    return ready["fit"]


def publish_failure(store: Storage, error: str) -> None:
    """Tell the waiting workers the fit failed, and why (one line)."""
    store.write_json(None, FAILED_FILE, {"error": error})


def wait_for_baseline(store: Storage, local: Path, failed_grace_s: float, timeout_s: float = HANDOFF_WAIT_S,
                      poll_s: float = POLL_S, say: Callable[[str], None] = print) -> Path:
    """The directory ``local`` holding the baseline published in ``store``, once it is there and its digest checks;
    raises :class:`BaselineUnavailable` after ``timeout_s``, or ``failed_grace_s`` after a published failure that no
    retry withdrew (0 where the step is not retried)."""
    started = time.monotonic()
    failed_since = None
    said = False
    while True:
        ready = store.read_json(None, READY_FILE)
        if ready is not None:
            return _fetch(store, ready, local)
        failed = store.read_json(None, FAILED_FILE)
        now = time.monotonic()
        failed_since = (failed_since or now) if failed is not None else None
        if failed_since is not None and now - failed_since >= failed_grace_s:
            raise BaselineUnavailable(f"the baseline's fit beside this job failed: {failed.get('error')} "
                                      f"(published at {store.display_uri}); fix it and run the pipeline again")
        if now - started >= timeout_s:
            raise BaselineUnavailable(
                f"no baseline at {store.display_uri} after {timeout_s:.0f}s: the baseline's fit beside this job "
                "did not publish it (it failed without a word, or its cached result's hand-off was deleted: run the "
                "pipeline again with caching off), or set model.blend_baseline=false")
        if not said:
            say(f"waiting for the baseline fitted beside this job at {store.display_uri}")
            said = True
        _sleep(poll_s)


def _fetch(store: Storage, ready: dict, local: Path) -> Path:
    local.mkdir(parents=True, exist_ok=True)
    target = local / BASELINE_FILE
    store.get_file(BASELINE_FILE, target)
    size, sha256 = file_digest(target)
    if (size, sha256) != (ready.get("size"), ready.get("sha256")):
        raise BaselineUnavailable(f"{store.url(None, BASELINE_FILE)} is not the file its {READY_FILE} names "
                                  f"({size:,} bytes; {ready.get('size')} published): altered since")
    return local
