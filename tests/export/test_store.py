"""The export store on the project's storage layer: its uploads are retried like the checkpoint store's, and a store
that refuses them fails in one line with nothing published."""

from __future__ import annotations

import errno
import uuid

import pytest

from components import storage
from components.export.manifest import MANIFEST
from components.export.store import ExportStore, ExportStoreRefused


def _publish(store: ExportStore, version: int) -> None:
    with store.publishing(version) as staging:
        (staging / "dense.npz").write_bytes(b"dense")
        (staging / MANIFEST).write_text('{"version": %d, "files": {"dense.npz": {}}}' % version)


def _failing_put(store, monkeypatch, error: OSError, times: int) -> list[str]:
    real, tries = store.fs.put_file, []

    def put_file(local, path, **kwargs):
        tries.append(path)
        if len(tries) <= times:
            raise error
        return real(local, path, **kwargs)

    monkeypatch.setattr(store.fs, "put_file", put_file)
    return tries


def test_an_upload_that_fails_for_a_moment_is_retried_and_the_version_published(monkeypatch):
    store = ExportStore(f"memory://exports-{uuid.uuid4().hex[:8]}")
    sleeps = []
    monkeypatch.setattr(storage, "_sleep", sleeps.append)
    tries = _failing_put(store, monkeypatch, ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"), 1)
    _publish(store, 1)
    assert store.versions() == [1] and store.manifest(1)["version"] == 1
    assert len(sleeps) == 1 and tries[0] == tries[1]  # the same file again, after one backoff


def test_a_store_that_refuses_the_upload_fails_in_one_line_and_publishes_nothing(monkeypatch):
    store = ExportStore(f"memory://exports-{uuid.uuid4().hex[:8]}")
    sleeps = []
    monkeypatch.setattr(storage, "_sleep", sleeps.append)
    _failing_put(store, monkeypatch, OSError(errno.ENOSPC, "No space left on device"), 100)
    with pytest.raises(ExportStoreRefused) as err:
        _publish(store, 1)
    assert "No space left on device (ENOSPC)" in str(err.value) and "\n" not in str(err.value)
    assert sleeps == [] and store.versions() == []
