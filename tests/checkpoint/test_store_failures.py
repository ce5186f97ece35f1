"""A store that refuses (a full disk, no permission, no credentials) fails at once, naming the cause and the path,
and leaves nothing half-written: no temporary file, and no partial checkpoint that ``LATEST`` names."""

from __future__ import annotations

import errno
import time

import pytest

from components import storage
from components.checkpoint.lease import StoreLease
from components.checkpoint.store import CheckpointStore, StoreRefused, make_id


def _fill_the_disk(store, monkeypatch, after: int = 0):
    """From the ``after``-th write on, ``pipe_file`` writes half its bytes and fails as a full disk does."""
    writes = []
    real = store.fs.pipe_file

    def pipe_file(path, data, **kwargs):
        writes.append(path)
        if len(writes) <= after:
            return real(path, data, **kwargs)
        real(path, data[:len(data) // 2], **kwargs)
        raise OSError(errno.ENOSPC, "No space left on device")  # as write(2) reports it: no file name

    monkeypatch.setattr(store.fs, "pipe_file", pipe_file)
    return writes


def _leftovers(root):
    return sorted(p.name for p in root.rglob("*") if ".tmp-" in p.name)


def test_a_full_disk_fails_at_once_naming_enospc_and_the_file_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    store = CheckpointStore(str(tmp_path / "store"))
    sleeps = []
    monkeypatch.setattr(storage, "_sleep", sleeps.append)
    writes = _fill_the_disk(store, monkeypatch)
    with pytest.raises(StoreRefused) as err:
        store.write_json(None, "LATEST", {"id": "x"})
    message = str(err.value)
    assert "No space left on device (ENOSPC)" in message and f"{store.url(None, 'LATEST')} failed" in message
    assert len(writes) == 1 and sleeps == []  # no retry: waiting frees no space
    assert _leftovers(tmp_path) == [] and not (tmp_path / "store" / "LATEST").exists()


def test_a_checkpoint_whose_commit_hits_a_full_disk_never_becomes_latest(tmp_path, monkeypatch):
    store = CheckpointStore(str(tmp_path / "store"))
    staged = tmp_path / "staged"
    (staged / "tables").mkdir(parents=True)
    (staged / "tables" / "part-000").write_bytes(b"rows" * 1000)
    first = make_id(1, 0)
    store.commit(first, store.upload_dir(staged, first), {})
    second = make_id(2, 0)
    files = store.upload_dir(staged, second)
    _fill_the_disk(store, monkeypatch, after=1)  # model.json lands; the manifest does not
    with pytest.raises(StoreRefused, match=r"MANIFEST.json failed: .*\(ENOSPC\)"):
        store.commit(second, files, {})
    monkeypatch.undo()
    assert store.latest() == first and store.committed() == [first]
    assert _leftovers(tmp_path) == []
    assert store.cleanup_incomplete() == [second]  # what the next job's start removes


def test_a_lease_on_a_full_disk_is_lost_at_its_first_renewal_naming_the_cause(tmp_path, monkeypatch):
    store = CheckpointStore(str(tmp_path / "store"))
    lease = StoreLease(store, "run-a", ttl_s=60, renew_s=0.05).acquire()
    try:
        _fill_the_disk(store, monkeypatch)
        for _ in range(100):
            if lease.lost:
                break
            time.sleep(0.05)
    finally:
        monkeypatch.undo()
        lease.release()
    # Not after ttl_s / 2 of "unreachable": the store said why, and no wait frees space.
    assert lease.lost and "refused this run's lease" in lease.lost and "(ENOSPC)" in lease.lost
    assert _leftovers(tmp_path) == []


def test_a_store_that_denies_permission_is_refused_at_once(tmp_path, monkeypatch):
    store = CheckpointStore(str(tmp_path / "store"))
    sleeps = []
    monkeypatch.setattr(storage, "_sleep", sleeps.append)

    def denied(path, data, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", path)

    monkeypatch.setattr(store.fs, "pipe_file", denied)
    with pytest.raises(StoreRefused, match=r"writing .*_probe-\w+\.json failed: PermissionError: .*\(EACCES\)"):
        store.probe()
    assert sleeps == []


def test_an_s3_store_without_credentials_is_refused_in_one_line(moto_endpoint, monkeypatch, caplog):
    import s3fs

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance metadata lookup: nothing leaves loopback
    s3fs.S3FileSystem.clear_instance_cache()
    store = CheckpointStore("s3://no-such-bucket-for-this-test/ckpt")
    with pytest.raises(StoreRefused) as err:
        store.probe()
    [line] = str(err.value).splitlines()
    assert "NoCredentialsError" in line and "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" in line
    assert "s3://no-such-bucket-for-this-test/ckpt/_probe-" in line
    assert "cannot delete the probe file" not in caplog.text  # the error says it; no second line


def test_a_worker_part_that_hits_a_full_disk_is_refused_naming_enospc(tmp_path, monkeypatch):
    """The job's exchange area (score and row parts, the day ledger) goes through the store's retries and errors:
    a full disk is a StoreRefused naming the cause and the path, not a bare OSError from deep in fsspec."""
    import numpy as np

    from components.checkpoint.protocol import upload_scores
    from components.metrics import ScoreCounts

    store = CheckpointStore(str(tmp_path / "store"))
    monkeypatch.setattr(storage, "_sleep", lambda s: None)

    def put_file(local, path, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store.fs, "put_file", put_file)
    counts = ScoreCounts.of(np.array([0, 1]), np.array([0.2, 0.7]))
    with pytest.raises(StoreRefused, match=r"uploading .* to file://.*/_scores/r1/test-worker-0.npz failed: "
                                           r".*\(ENOSPC\)"):
        upload_scores(store, "r1", "test", 0, counts, tmp_path)
