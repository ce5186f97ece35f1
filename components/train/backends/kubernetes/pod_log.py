"""A role's pod log, followed from the launcher: worker 0's events make the job's result; its other lines, and
every server's, the step's output (prefixed ``[worker-0]``, ``[server-1]``); every line goes to
``logs/<role>-<i>.log``. The kubeflow SDK's ``get_job_logs`` knows only the ``node`` pods, so the step's output is
where a Kubeflow user reads the servers (or :mod:`.logs`, for a TrainJob started otherwise)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines
from urllib3.exceptions import HTTPError

from components.train.backends.kubernetes.api import ENDED_PHASES, REQUEST_TIMEOUT_S, STARTED_PHASES, KubeApis

WORKER_0 = "worker-0"


def _time_key(stamp: str) -> str:
    """A log line's RFC 3339 timestamp as a string that sorts by time (the kubelet trims trailing zeros)."""
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    return f"{whole}.{fraction.ljust(9, '0')}"


class PodLog:
    """Follows the log of one role's pod (``role``: ``worker-0``, ``server-1``) in a thread: each line goes to
    ``path``; each line to ``events`` when given (worker 0's: ``events(role, line)`` is True for an event), other
    lines to ``echo``, prefixed with the role. A new
    pod (a restart) is followed when it starts; a cut stream is re-attached, skipping the lines it already
    delivered (by their timestamps)."""

    def __init__(self, apis: KubeApis, namespace: str, role: str, echo: Callable[[str], None], path: Path,
                 poll_s: float, events: Optional[Callable[[str, str], bool]] = None):
        self.apis, self.namespace, self.role, self.events, self.echo, self.path, self.poll_s = (
            apis, namespace, role, events, echo, path, poll_s)
        self.selector: Optional[str] = None  # set per job object; a relaunched PaddleJob has a new name
        self._position: dict[str, tuple[str, int]] = {}  # pod uid -> (time key, count) of its last line read
        self._done: set[str] = set()  # pods whose log was read to its end
        self._stop = threading.Event()  # finish the pod being read, then end
        self._aborted = False
        self._response: Any = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"{role}-log", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def finish(self, timeout_s: float) -> bool:
        """Read the log to its end (its pod has ended); False if that took longer than ``timeout_s``."""
        self._stop.set()
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def abort(self) -> None:
        """Stop reading now (the job failed or is being deleted)."""
        with self._lock:
            self._aborted = True
            response = self._response
        self._stop.set()
        if response is not None:
            response.close()  # unblocks the read in the thread
        if self._thread.is_alive():
            self._thread.join(5.0)

    def _newest_started_pod(self) -> Any:
        if not self.selector:
            return None
        pods = self.apis.core.list_namespaced_pod(self.namespace, label_selector=self.selector,
                                                  _request_timeout=REQUEST_TIMEOUT_S).items
        started = [p for p in pods if p.status and p.status.phase in STARTED_PHASES]
        return max(started, key=lambda p: p.metadata.creation_timestamp, default=None)

    def _run(self) -> None:
        with open(self.path, "w") as log:
            while not self._aborted:
                try:
                    pod = self._newest_started_pod()
                    if pod is not None and pod.metadata.uid not in self._done:
                        self._read(pod, log)
                        if pod.metadata.uid in self._done:
                            continue  # a successor pod may already be running
                    elif self._stop.is_set():
                        return
                except (ApiException, HTTPError, OSError, ValueError) as err:
                    if self._aborted:
                        return
                    self.echo(f"[{self.role}] reading its log failed ({type(err).__name__}: {err}); retrying")
                time.sleep(self.poll_s)

    def _read(self, pod: Any, log) -> None:
        uid, name = pod.metadata.uid, pod.metadata.name
        ended = pod.status.phase in ENDED_PHASES  # then the stream below ends with the pod's last line
        if uid not in self._position:
            self._position[uid] = ("", 0)
            log.write(f"----- pod {name} -----\n")
        response = self.apis.core.read_namespaced_pod_log(
            name, self.namespace, container=pod.spec.containers[0].name, follow=True, timestamps=True,
            _preload_content=False)
        with self._lock:
            if self._aborted:
                response.close()
                return
            self._response = response
        last, count = self._position[uid]  # the last line delivered: its time key, how many lines had it
        to_skip = count  # a re-attached stream starts from the top: skip what was delivered
        try:
            for stamped in iter_resp_lines(response):
                stamp, _, line = stamped.partition(" ")
                key = _time_key(stamp)
                if key < last:
                    continue
                if key == last and to_skip:
                    to_skip -= 1
                    continue
                to_skip = 0
                count, last = (count + 1 if key == last else 1), key  # lines of one write share a timestamp
                self._position[uid] = (last, count)
                log.write(line + "\n")
                log.flush()
                if self.events is None or not self.events(self.role, line):
                    self.echo(f"[{self.role}] {line}")
        finally:
            with self._lock:
                self._response = None
            response.release_conn()
        if ended:
            self._done.add(uid)
