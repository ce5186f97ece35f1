"""Progress in a Kubeflow TrainJob's status: what worker 0 posts to the Trainer's status endpoint.

Trainer 2.2+ (KEP-2779, feature gate ``TrainJobStatus``) gives a trainer pod an HTTPS endpoint, a CA certificate
and a projected service-account token through three environment variables, and shows what the pod posts there in
``TrainJob.status.trainerStatus`` (progressPercentage, estimatedRemainingSeconds, metrics). This speaks the protocol
of the kubeflow SDK's ``kubeflow.trainer.update_trainjob_status`` (0.5): the same variables, the same JSON body, at
most one post per :data:`MIN_INTERVAL_S`. It is written out here rather than imported because the SDK pulls the
Kubernetes client into a PS process, which the layering forbids, for one POST. A post that fails is logged once per
kind of failure and never fails the job: progress is a view, training is the product.
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Callable, Optional

SERVER_URL_ENV = "KUBEFLOW_TRAINER_SERVER_URL"
CA_CERT_ENV = "KUBEFLOW_TRAINER_SERVER_CA_CERT"
TOKEN_ENV = "KUBEFLOW_TRAINER_SERVER_TOKEN"
MIN_INTERVAL_S = 5.0  # the SDK's throttle: the controller is not a metrics store
TIMEOUT_S = 5.0
MAX_METRICS = 256  # the SDK's limit on entries


def trainer_status(progress_percent: Optional[float], remaining_s: Optional[float],
                   metrics: Mapping[str, object], now: Optional[datetime] = None) -> dict:
    """The body of one post: ``{"trainerStatus": {...}}`` as the Trainer API takes it (metric values as strings)."""
    status: dict = {"lastUpdatedTime": (now or datetime.now(timezone.utc)).isoformat()}
    if progress_percent is not None:
        status["progressPercentage"] = int(max(0, min(100, progress_percent)))
    if remaining_s is not None:
        status["estimatedRemainingSeconds"] = int(max(0, remaining_s))
    entries = [(name, value) for name, value in metrics.items() if value is not None][:MAX_METRICS]
    if entries:
        status["metrics"] = [{"name": str(name), "value": _metric_text(value)} for name, value in entries]
    return {"trainerStatus": status}


def _metric_text(value: object) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


class TrainerStatusReporter:
    """Posts progress to the Trainer status endpoint, throttled; :meth:`from_env` is None outside such a pod."""

    def __init__(self, url: str, token_path: Optional[str], ca_path: Optional[str],
                 clock: Callable[[], float] = time.monotonic):
        self.url, self.token_path, self.ca_path, self.clock = url, token_path, ca_path, clock
        self._last_post: Optional[float] = None
        self._warned: set[str] = set()
        self._lock = threading.Lock()
        self.posted = 0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Optional["TrainerStatusReporter"]:
        url = environ.get(SERVER_URL_ENV)
        return cls(url, environ.get(TOKEN_ENV), environ.get(CA_CERT_ENV)) if url else None

    def report(self, progress_percent: Optional[float], remaining_s: Optional[float],
               metrics: Mapping[str, object]) -> bool:
        """Post unless one was posted less than :data:`MIN_INTERVAL_S` ago; True when the endpoint took it. Never
        raises."""
        with self._lock:
            now = self.clock()
            if self._last_post is not None and now - self._last_post < MIN_INTERVAL_S:
                return False
            self._last_post = now  # a failing endpoint is retried at the same pace, not on every beat
        try:
            return self._post(trainer_status(progress_percent, remaining_s, metrics))
        except Exception as err:  # noqa: BLE001 - a status post must never end the training
            self._warn(type(err).__name__, f"trainer status post to {self.url} failed: {err}")
            return False

    def _post(self, body: dict) -> bool:
        headers = {"Content-Type": "application/json"}
        token = self._token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        request = urllib.request.Request(self.url, data=json.dumps(body).encode(), headers=headers, method="POST")
        context = ssl.create_default_context(cafile=self.ca_path) if self.ca_path and \
            os.path.exists(self.ca_path) else None
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S, context=context) as reply:
                ok = reply.status == 200
        except urllib.error.HTTPError as err:
            self._warn(f"http-{err.code}", f"trainer status post to {self.url} answered HTTP {err.code}")
            return False
        self.posted += ok
        return ok

    def _token(self) -> Optional[str]:
        # Read at every post: the projected token is rotated by the kubelet.
        if not self.token_path or not os.path.exists(self.token_path):
            return None
        with open(self.token_path) as f:
            return f.read().strip() or None

    def _warn(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            print(f"warning: {message} (training goes on; later failures of this kind are not logged)",
                  file=sys.stderr, flush=True)


def pass_progress(epoch: int, epochs: int, examples: int, pass_examples: Optional[int],
                  elapsed_s: float) -> tuple[Optional[float], Optional[float]]:
    """``(percent of the job's passes done, seconds left)`` of a worker ``examples`` into pass ``epoch`` of at most
    ``epochs`` passes of ``pass_examples`` examples each, ``elapsed_s`` into the pass. Early stopping may end the job
    sooner: the estimate is of the planned passes. ``(None, None)`` when the pass's size is unknown."""
    if not pass_examples or epochs < 1:
        return None, None
    within = min(examples / pass_examples, 1.0)
    done = (epoch - 1 + within) / epochs
    if within == 0:
        return 100.0 * done, None
    pass_s = elapsed_s / within
    return 100.0 * done, pass_s * ((1 - within) + (epochs - epoch))


def progress_publisher(reporter: TrainerStatusReporter, epochs: int) -> Callable[[dict], None]:
    """What a worker's heartbeat calls with each progress event (:meth:`components.ps.role.Worker._progress`'s
    payload: epoch, examples, pass_examples, pass_seconds, loss, auc, validation_auc, examples_per_s)."""

    def publish(progress: dict) -> None:
        percent, remaining = pass_progress(progress["epoch"], epochs, progress["examples"],
                                           progress.get("pass_examples"), progress.get("pass_seconds", 0.0))
        reporter.report(percent, remaining, {name: progress.get(name) for name in
                                             ("loss", "auc", "validation_auc", "examples_per_s", "epoch")})

    return publish
