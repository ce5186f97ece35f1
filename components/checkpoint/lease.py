"""One job at a time on a checkpoint store: a lease file that its holder renews while the job runs.

Two jobs on one ``checkpoint.uri`` would share the upload control folder and prune, or clean up as
incomplete, each other's checkpoints. So a job takes ``<uri>/_lease.json`` before it touches the store and
keeps it until it ends:

* taking it is an exclusive create (:meth:`CheckpointStore.create_json`: atomic on a local disk and on S3);
  a second job finds the file and is refused, in one line naming the holder;
* the holder renews it every ``renew_s``; a lease not renewed for ``ttl_s`` has expired, and so has one whose
  holder ran on this host and no longer exists (a job killed with SIGKILL), and the next job takes it over;
* a holder that cannot renew it for ``ttl_s / 2`` (the store is unreachable), whose store refuses the renewal (a
  full disk, a revoked permission: no wait makes it work) or that finds another holder's lease has lost it:
  :meth:`StoreLease.check` raises, and the launcher stops the job naming the store's error.

Times are the holders' wall clocks: hosts whose clocks differ by more than a few seconds shorten or
lengthen the expiry by as much.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from typing import Any, Optional

from components.checkpoint.store import CheckpointStore, CheckpointStoreError, StoreRefused

log = logging.getLogger(__name__)

LEASE = "_lease.json"
TTL_S = 60.0
RENEW_S = 10.0


class StoreInUse(CheckpointStoreError):
    """Another job holds the store's lease."""


class LeaseLost(CheckpointStoreError):
    """The job could not keep its lease (store unreachable, or another job took it over)."""


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def _alive(record: dict[str, Any], now: float) -> bool:
    """A lease is held while it is renewed, and while its holder may still exist (on another host: unknown)."""
    if now > float(record.get("renewed_at", 0)) + float(record.get("ttl_s", TTL_S)):
        return False
    if record.get("host") == socket.gethostname():
        try:
            os.kill(int(record.get("pid", 0)), 0)
        except ProcessLookupError:
            return False
        except (PermissionError, ValueError, OverflowError):
            pass
    return True


def describe(record: dict[str, Any], now: Optional[float] = None) -> str:
    """Who holds a lease, for messages: ``run 3f2a... (pid 1234 on host-a, renewed 4s ago)``."""
    age = (now or time.time()) - float(record.get("renewed_at", 0))
    return (f"run {record.get('run_id', '?')} (pid {record.get('pid', '?')} on {record.get('host', '?')}, "
            f"renewed {age:.0f}s ago)")


def live_holder(store: CheckpointStore) -> Optional[dict[str, Any]]:
    """The lease of the job using ``store`` now, or None (no lease, or an expired one)."""
    record = store.read_json(None, LEASE)
    return record if isinstance(record, dict) and _alive(record, time.time()) else None


def in_use_message(store: CheckpointStore, record: dict[str, Any]) -> str:
    return (f"checkpoint store {store.display_uri} is in use by {describe(record)}: two jobs on one store would "
            f"prune each other's checkpoints; wait for that run to end (a lease it stops renewing expires after "
            f"{float(record.get('ttl_s', TTL_S)):.0f}s) or set checkpoint.uri to another store")


class StoreLease:
    """The lease of run ``run_id`` on ``store`` (a context manager: acquire, renew in a thread, release)."""

    def __init__(self, store: CheckpointStore, run_id: str, ttl_s: float = TTL_S, renew_s: float = RENEW_S):
        self.store, self.run_id, self.ttl_s, self.renew_s = store, run_id, ttl_s, renew_s
        self.token = uuid.uuid4().hex
        self.lost: Optional[str] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _record(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "token": self.token, "host": socket.gethostname(), "pid": os.getpid(),
                "renewed_at": time.time(), "ttl_s": self.ttl_s}

    def acquire(self) -> "StoreLease":
        """Take the lease, or raise :class:`StoreInUse` naming the holder; then renew it in the background."""
        for _ in range(3):  # a stale lease is removed, then the create is tried again
            if self.store.create_json(LEASE, self._record()):
                break
            record = self.store.read_json(None, LEASE)
            if record is None:  # released in between
                continue
            if _alive(record, time.time()):
                raise StoreInUse(in_use_message(self.store, record))
            log.warning("taking over the expired lease of %s on %s", describe(record), self.store.display_uri)
            self.store.remove(LEASE)
        else:
            raise StoreInUse(f"checkpoint store {self.store.display_uri}: another job took its lease while this "
                             "one tried to")
        self._thread = threading.Thread(target=self._renew, name="store-lease", daemon=True)
        self._thread.start()
        return self

    def _renew(self) -> None:
        renewed = time.monotonic()
        while not self._stop.wait(self.renew_s):
            try:
                record = self.store.read_json(None, LEASE)
                if not isinstance(record, dict) or record.get("token") != self.token:
                    self.lost = (f"checkpoint store {self.store.display_uri}: this run's lease was taken over by "
                                 f"{describe(record) if isinstance(record, dict) else 'nobody (it was deleted)'}")
                    return
                self.store.write_json(None, LEASE, self._record())
                renewed = time.monotonic()
            except StoreRefused as err:
                self.lost = f"checkpoint store {self.store.display_uri} refused this run's lease: {err}"
                return
            except CheckpointStoreError as err:
                if time.monotonic() - renewed > self.ttl_s / 2:
                    self.lost = (f"checkpoint store {self.store.display_uri} unreachable for "
                                 f"{time.monotonic() - renewed:.0f}s: {err}")
                    return
                log.warning("cannot renew the lease on %s (retrying): %s", self.store.display_uri, err)

    def check(self) -> None:
        """Raise :class:`LeaseLost` once the lease is lost."""
        if self.lost:
            raise LeaseLost(self.lost)

    def release(self) -> None:
        """Stop renewing and delete the lease, if it is still this run's (best effort: the store may be gone)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            record = self.store.read_json(None, LEASE)
            if isinstance(record, dict) and record.get("token") == self.token:
                self.store.remove(LEASE)
        except CheckpointStoreError as err:
            log.warning("cannot release the lease on %s (it expires in %.0fs): %s", self.store.display_uri,
                        self.ttl_s, err)

    def __enter__(self) -> "StoreLease":
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()
