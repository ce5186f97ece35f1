"""CheckpointStore on a local directory and on a real S3 endpoint (moto's server on loopback)."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import os
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from components.checkpoint import format as ckpt_io
from components import storage
from components.checkpoint import store as cs
from components.checkpoint.store import CheckpointStore, CheckpointStoreError, id_time, make_id, parse_id
from components.redaction import redact
from components.storage import PROBE_PREFIX
from tests.conftest import FAKE_KEY_ID, FAKE_SECRET

META = {"paddle_version": "2.6.2", "mode": "async", "epoch": 0, "model": {"name": "dnn"}}


def make_checkpoint_dir(root: Path, seed: int = 0, shards: int = 5) -> Path:
    """Files shaped like ours: server table shards (gz), the npz export, and a stray local manifest."""
    rng = np.random.default_rng(seed)
    for i in range(shards):
        path = root / "tables" / "000" / f"part-{i:03d}-00000.gz"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.bytes(1000 + 3000 * i))
    (root / "export").mkdir(parents=True, exist_ok=True)
    np.savez(root / "export" / "embedding.npz", ids=np.arange(50, dtype=np.uint64),
             rows=rng.random((50, 9), dtype=np.float32))
    np.savez(root / "export" / "dense.npz", w=rng.random((9, 4), dtype=np.float32))
    (root / ckpt_io.MANIFEST).write_text("{}")  # from a local commit: must not be uploaded
    return root


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def save(store: CheckpointStore, src: Path, epoch: int, step: int = 0) -> str:
    ckpt_id = make_id(epoch, step)
    store.commit(ckpt_id, store.upload_dir(src, ckpt_id), dict(META, epoch=epoch))
    return ckpt_id


@pytest.fixture(params=["local", "s3"])
def store_uri(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "store")
    return request.getfixturevalue("s3_endpoint")


@pytest.fixture
def src(tmp_path):
    return make_checkpoint_dir(tmp_path / "src")


def test_upload_commit_download_round_trip(store_uri, src, tmp_path, monkeypatch):
    # one file above the "small" threshold goes the streamed way (and, on S3, as a multipart upload)
    monkeypatch.setattr(cs, "SMALL_FILE", 64 << 10)
    (src / "tables" / "001").mkdir()
    (src / "tables" / "001" / "part-000-00000.gz").write_bytes(os.urandom(11 << 20))
    store = CheckpointStore(store_uri)
    assert store.committed() == [] and store.latest() is None

    ckpt_id = make_id(2, 1200)
    files = store.upload_dir(src, ckpt_id)
    local_files = {p.relative_to(src).as_posix(): p for p in src.rglob("*") if p.is_file()}
    del local_files[ckpt_io.MANIFEST]
    assert files == {rel: {"size": p.stat().st_size, "sha256": sha(p)} for rel, p in local_files.items()}
    assert store.committed() == []  # uploaded, not committed: invisible

    manifest = store.commit(ckpt_id, files, META)
    assert store.committed() == [ckpt_id] and store.latest() == ckpt_id
    assert store.read_json(None, cs.LATEST) == {"id": ckpt_id}
    assert set(manifest["files"]) == set(files) | {ckpt_io.MODEL_META}
    assert manifest["meta"] == {"paddle_version": "2.6.2", "mode": "async", "epoch": 0}
    assert store.list_files(ckpt_id) == sorted(set(files) | {ckpt_io.MODEL_META, ckpt_io.MANIFEST})
    assert store.read_json(ckpt_id, ckpt_io.MANIFEST) == manifest

    out = store.download(ckpt_id, tmp_path / "restored")
    for rel, p in local_files.items():
        assert sha(out / rel) == sha(p), rel
    assert json.loads((out / ckpt_io.MODEL_META).read_text()) == META
    assert ckpt_io.verify(out)["files"] == manifest["files"]  # a local checkpoint as components.checkpoint reads it

    remote_manifest = store.fs.cat_file(store.fs_path(ckpt_id, ckpt_io.MANIFEST))
    assert (out / ckpt_io.MANIFEST).read_bytes() == remote_manifest  # byte for byte: its sha256 names the ckpt

    part = store.download(ckpt_id, tmp_path / "export-only", select=lambda rel: rel.startswith("export/"))
    fetched = sorted(p.relative_to(part).as_posix() for p in part.rglob("*") if p.is_file())
    assert fetched == ["MANIFEST.json", "export/dense.npz", "export/embedding.npz", "model.json"]
    assert (part / ckpt_io.MANIFEST).read_bytes() == remote_manifest


def test_checkpoint_without_manifest_is_invisible_and_cleaned_up(store_uri, src, tmp_path):
    store = CheckpointStore(store_uri)
    done = save(store, src, 0)
    broken, in_progress = make_id(1, 0), make_id(2, 0)
    store.upload_dir(src, broken)
    store.upload_file(src / "export" / "dense.npz", in_progress, "export/dense.npz")

    assert store.committed() == [done] and store.latest() == done
    assert store.resolve("latest") == done
    with pytest.raises(ckpt_io.CheckpointError, match="not a committed checkpoint") as err:
        store.resolve(broken)
    assert done in str(err.value)
    with pytest.raises(ckpt_io.CheckpointError, match="not a committed checkpoint"):
        store.download(broken, tmp_path / "x")
    assert not (tmp_path / "x").exists()

    assert store.cleanup_incomplete(keep=[in_progress]) == [broken]
    assert store.list_files(broken) == []
    assert store.list_files(in_progress) == ["export/dense.npz"]
    assert store.cleanup_incomplete() == [in_progress]
    assert store.committed() == [done] and store.list_files(done)


def test_latest_moves_only_after_commit(store_uri, src):
    store = CheckpointStore(store_uri)
    first = save(store, src, 0)
    second = make_id(1, 0)
    files = store.upload_dir(src, second)
    assert store.read_json(None, cs.LATEST) == {"id": first}
    assert store.latest() == first
    store.commit(second, files, META)
    assert store.read_json(None, cs.LATEST) == {"id": second} and store.latest() == second
    with pytest.raises(ckpt_io.CheckpointError, match="already committed"):
        store.upload_dir(src, second)  # a committed checkpoint is never written again

    # LATEST naming something that is not committed (deleted by hand, garbage): the newest committed wins
    store.write_json(None, cs.LATEST, {"id": make_id(9, 9)})
    assert store.latest() == second
    store.write_json(None, cs.LATEST, {"id": first})
    assert store.latest() == first


def test_prune_keeps_last_and_never_latest(store_uri, src):
    store = CheckpointStore(store_uri)
    ids = [save(store, src, epoch) for epoch in range(4)]
    assert store.prune(keep_last=2) == ids[:2]
    assert store.committed() == ids[2:]
    assert store.list_files(ids[0]) == []
    assert store.prune(keep_last=2) == []

    store.write_json(None, cs.LATEST, {"id": ids[2]})  # LATEST names the oldest one left
    assert store.prune(keep_last=1) == []
    assert store.committed() == ids[2:]
    with pytest.raises(ValueError):
        store.prune(keep_last=0)


def test_resolve(store_uri, src):
    store = CheckpointStore(store_uri)
    assert store.resolve("none") is None and store.resolve(None) is None
    # latest on an empty store is an error (a resume must not quietly start from scratch); auto starts fresh
    with pytest.raises(ckpt_io.CheckpointError, match="holds no committed checkpoint.*checkpoint.resume=auto"):
        store.resolve("latest")
    assert store.resolve("auto") is None
    with pytest.raises(ckpt_io.CheckpointError, match=r"committed: \(none\)"):
        store.resolve(make_id(0, 0))
    a, b = save(store, src, 0), save(store, src, 1)
    assert store.resolve("latest") == b and store.resolve("LATEST") == b and store.resolve("auto") == b
    assert store.resolve(a) == a
    with pytest.raises(ckpt_io.CheckpointError) as err:
        store.resolve("20990101T000000000000Z-e0001-s0000000000")
    assert a in str(err.value) and b in str(err.value)


@pytest.mark.parametrize("damage", ["truncate", "alter", "delete"])
def test_damaged_file_is_detected_at_download(store_uri, src, tmp_path, damage):
    store = CheckpointStore(store_uri)
    ckpt_id = save(store, src, 0)
    rel = "tables/000/part-002-00000.gz"
    remote = store.fs_path(ckpt_id, rel)
    data = store.fs.cat_file(remote)
    if damage == "truncate":
        store.fs.pipe_file(remote, data[:-100])
    elif damage == "alter":
        store.fs.pipe_file(remote, data[:10] + bytes([data[10] ^ 1]) + data[11:])
    else:
        store.fs.rm_file(remote)
    with pytest.raises(ckpt_io.CheckpointError) as err:
        store.download(ckpt_id, tmp_path / "restored")
    message = str(err.value)
    assert rel in message and store.url(ckpt_id, rel) in message
    assert ("missing" if damage == "delete" else "truncated or altered") in message
    assert not (tmp_path / "restored" / rel).exists()
    assert not (tmp_path / "restored" / ckpt_io.MANIFEST).exists()


def test_s3_endpoint_stops_during_upload(moto_endpoint, s3_endpoint, tmp_path, monkeypatch, caplog):
    """The endpoint goes away (listening socket closed, live connections cut) after the first file of an
    upload has landed. The store retries every file with exponential backoff, then names the file it could
    not send; nothing of the failed save is visible. While the endpoint is down, reads fail loudly instead
    of reporting an empty store. When the same endpoint comes back (same port, moto keeps its state in the
    process), the previous checkpoint is still the latest and restores byte for byte."""
    sleeps: list[float] = []
    monkeypatch.setattr(storage, "_sleep", sleeps.append)
    caplog.set_level(logging.INFO)  # (botocore's own DEBUG log prints request headers: not ours to judge)
    store = CheckpointStore(s3_endpoint, retries=3, backoff_s=0.01, workers=3)
    # s3fs' own retries off (a class attribute; its backoff would only slow the test); botocore's are off in
    # the fixture (AWS_MAX_ATTEMPTS=1): the store's retries are the ones counted here.
    monkeypatch.setattr(store.fs, "retries", 1)
    src = make_checkpoint_dir(tmp_path / "src", shards=12)
    good = save(store, src, 0)

    attempts: Counter[str] = Counter()
    landed: list[str] = []
    lock = threading.Lock()
    put_once = store._put_once

    def flaky_put_once(local: Path, path: str):
        rel = local.relative_to(src).as_posix()
        with lock:
            attempts[rel] += 1
        result = put_once(local, path)
        with lock:
            landed.append(rel)
            if len(landed) == 1:
                moto_endpoint.stop()  # the endpoint goes away right after the first file landed
        return result

    monkeypatch.setattr(store, "_put_once", flaky_put_once)
    failed = make_id(1, 0)
    with pytest.raises(CheckpointStoreError) as err:
        store.upload_dir(src, failed)
    message = str(err.value)
    assert "failed after 3 tries" in message
    bad_rel = next(rel for rel in attempts if str(src / rel) in message)
    assert store.url(failed, bad_rel) in message
    assert attempts[bad_rel] == 3  # tried 3 times ...
    # only files already on the wire when the endpoint went away (at most one per worker) landed
    assert 1 <= len(landed) <= store.workers and bad_rel not in landed
    failed_files = [rel for rel in attempts if rel not in landed]
    assert all(attempts[rel] == 3 for rel in failed_files)
    # ... with backoff 0.01 * 2**attempt between tries, for every file that was tried
    assert sorted(sleeps) == sorted([0.01, 0.02] * len(failed_files))
    assert len(attempts) < 12 + 4  # files not started when the first one gave up were dropped

    # while the endpoint is down, listing fails loudly (never "no checkpoints", which would make a job
    # start from scratch or cleanup_incomplete delete good checkpoints)
    with pytest.raises(CheckpointStoreError, match="failed after 3 tries"):
        store.latest()
    with pytest.raises(CheckpointStoreError):
        store.cleanup_incomplete()

    moto_endpoint.start()  # same port, same in-process state
    monkeypatch.setattr(store, "_put_once", put_once)
    assert store.committed() == [good] and store.latest() == good
    assert set(landed) <= set(store.list_files(failed))  # the files that landed are there, but invisible
    restored = store.download(good, tmp_path / "restored")
    for p in src.rglob("*"):
        if p.is_file() and p.name != ckpt_io.MANIFEST:
            assert sha(restored / p.relative_to(src)) == sha(p)
    assert store.cleanup_incomplete() == [failed]

    # no credential anywhere in what the user sees
    for text in [message, caplog.text]:
        assert FAKE_SECRET not in text and FAKE_KEY_ID not in text
    assert "try 1 of 3" in caplog.text and "try 2 of 3" in caplog.text


def test_retry_then_success_counts_tries(tmp_path, monkeypatch):
    sleeps: list[float] = []
    monkeypatch.setattr(storage, "_sleep", sleeps.append)
    store = CheckpointStore(str(tmp_path / "store"), retries=4, backoff_s=0.5)
    calls = Counter()
    put_once = store._put_once

    def flaky(local, path):
        calls["n"] += 1
        if calls["n"] < 3:
            raise ConnectionResetError("connection reset by peer")
        return put_once(local, path)

    monkeypatch.setattr(store, "_put_once", flaky)
    (tmp_path / "f").write_bytes(b"x" * 10)
    entry = store.upload_file(tmp_path / "f", make_id(0, 0), "tables/f")
    assert entry == {"size": 10, "sha256": hashlib.sha256(b"x" * 10).hexdigest()}
    assert calls["n"] == 3 and sleeps == [0.5, 1.0]

    def denied(local, path):
        raise PermissionError("Access Denied")

    monkeypatch.setattr(store, "_put_once", denied)
    with pytest.raises(CheckpointStoreError, match="Access Denied") as err:
        store.upload_file(tmp_path / "f", make_id(0, 1), "tables/f")
    assert "tries" not in str(err.value) and sleeps == [0.5, 1.0]  # permanent: not retried


def test_secrets_are_scrubbed(monkeypatch, tmp_path):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", FAKE_SECRET)
    text = f"boom {FAKE_SECRET} at webhdfs://user:{FAKE_SECRET}x@host:9870/p and s3://bucket/k"
    assert redact(text) == "boom *** at webhdfs://***@host:9870/p and s3://bucket/k"
    assert redact("token=abcdef12", {"client_kwargs": {"aws_session_token": "abcdef12"}}) == "token=***"


def test_ids_sort_by_creation_and_are_enforced(tmp_path):
    ids = [make_id(3, 100), make_id(1, 5), make_id(1, 5)]  # a resumed run goes back in epochs
    assert ids == sorted(ids) and len(set(ids)) == 3
    assert parse_id(ids[0]) == (3, 100)
    assert id_time("20261129T163935123456Z-e0003-s0000001200") == \
        dt.datetime(2026, 11, 29, 16, 39, 35, 123456, tzinfo=dt.timezone.utc)
    before = dt.datetime.now(dt.timezone.utc)
    assert before <= id_time(make_id(0, 0)) <= dt.datetime.now(dt.timezone.utc)
    with pytest.raises(ValueError, match="not a checkpoint id"):
        id_time("final")
    store = CheckpointStore(str(tmp_path / "store"))
    (tmp_path / "f").write_text("x")
    with pytest.raises(ckpt_io.CheckpointError, match="make_id"):
        store.upload_file(tmp_path / "f", "final", "f")
    with pytest.raises(ckpt_io.CheckpointError, match="written by commit"):
        store.upload_file(tmp_path / "f", ids[0], ckpt_io.MANIFEST)
    with pytest.raises(ckpt_io.CheckpointError, match=r"\.\."):
        store.upload_file(tmp_path / "f", ids[0], "../escape")
    # a foreign directory under the store URI is neither a checkpoint nor cleaned up
    (tmp_path / "store" / "notes").mkdir(parents=True)
    assert store.committed() == [] and store.cleanup_incomplete() == []
    assert (tmp_path / "store" / "notes").is_dir()


def test_memory_store_and_unknown_protocol(src, tmp_path):
    store = cs.CheckpointStore(f"memory://ckpt-test-{os.getpid()}/{tmp_path.name}")
    ckpt_id = save(store, src, 0)
    assert store.resolve("latest") == ckpt_id
    ckpt_io.verify(store.download(ckpt_id, tmp_path / "out"))
    with pytest.raises(CheckpointStoreError, match="unknown protocol 'nope'"):
        CheckpointStore("nope://bucket/x")


def test_manifest_file_lists_the_commit_check(store_uri, src):
    """commit refuses a file list naming a file that never landed (the manifest would lie)."""
    store = CheckpointStore(store_uri)
    ckpt_id = make_id(0, 0)
    files = store.upload_dir(src, ckpt_id)
    files["tables/000/part-999-00000.gz"] = {"size": 5, "sha256": "0" * 64}
    with pytest.raises(CheckpointStoreError, match="part-999-00000.gz was not uploaded"):
        store.commit(ckpt_id, files, META)
    assert store.committed() == [] and store.read_json(None, cs.LATEST) is None


def test_pruning_keeps_the_best_checkpoint(tmp_path, src):
    store = CheckpointStore(str(tmp_path / "store"))
    ids = [make_id(epoch, 10 * epoch) for epoch in (1, 2, 3, 4)]
    for ckpt_id in ids:
        store.commit(ckpt_id, store.upload_dir(src, ckpt_id), {"epoch": 1})
        if ckpt_id == ids[1]:
            store.mark_best(ckpt_id)
    assert store.best() == ids[1]
    assert store.prune(keep_last=1) == [ids[0], ids[2]]
    assert store.committed() == [ids[1], ids[3]] and store.best() == ids[1] and store.latest() == ids[3]
    with pytest.raises(ckpt_io.CheckpointError, match="is not committed"):
        store.mark_best(make_id(9, 9))


def test_create_json_is_exclusive(store_uri):
    """Two writers of one control file: exactly one creates it (a hard link locally, If-None-Match on S3)."""
    store = CheckpointStore(store_uri)
    results: list[bool] = []
    start = threading.Barrier(8)

    def create(i: int) -> None:
        start.wait()
        results.append(store.create_json("_lease.json", {"writer": i}))

    threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [False] * 7 + [True]
    assert store.read_json(None, "_lease.json")["writer"] in range(8)  # one writer's whole file
    store.remove("_lease.json")
    assert store.read_json(None, "_lease.json") is None
    store.remove("_lease.json")  # missing is fine


def test_probe_writes_reads_and_deletes(store_uri):
    store = CheckpointStore(store_uri)
    store.probe()
    store.fs.invalidate_cache()
    assert store.fs.glob(f"{store.root}/{PROBE_PREFIX}*") == []  # deleted


def test_probe_of_a_new_local_store_leaves_no_directory_behind(tmp_path):
    CheckpointStore(str(tmp_path / "run" / "checkpoint")).probe()
    assert list(tmp_path.iterdir()) == []


def test_probe_fails_in_one_line_naming_the_store(tmp_path, moto_endpoint):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(CheckpointStoreError) as err:
        CheckpointStore(str(not_a_dir / "ckpt")).probe()
    assert str(not_a_dir / "ckpt") in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(CheckpointStoreError) as err:
        CheckpointStore("s3://no-such-bucket-for-the-probe/ctr").probe()
    message = str(err.value)
    assert "s3://no-such-bucket-for-the-probe/ctr/_probe-" in message and "FileNotFoundError" in message
    assert "failed after" not in message  # a missing bucket is not retried
    assert FAKE_SECRET not in message and FAKE_KEY_ID not in message


@pytest.mark.parametrize("name", ["../../escaped.gz", "/tmp/escaped-absolute.gz", "tables/../../escaped.gz"])
def test_a_manifest_naming_a_file_outside_the_checkpoint_is_refused_at_download(src, tmp_path, name):
    store = CheckpointStore(str(tmp_path / "store"))
    ckpt_id = save(store, src, 0)
    manifest_path = store.fs_path(ckpt_id, ckpt_io.MANIFEST)
    manifest = json.loads(store.fs.cat_file(manifest_path))
    manifest["files"][name] = manifest["files"]["tables/000/part-002-00000.gz"]
    store.fs.pipe_file(manifest_path, json.dumps(manifest).encode())
    with pytest.raises(ckpt_io.CheckpointError) as err:  # the checkpoint store's own error type, still
        store.download(ckpt_id, tmp_path / "deep" / "restored")
    assert "\n" not in str(err.value) and f"bad file name {name!r} in a checkpoint" in str(err.value)
    assert not (tmp_path / "escaped.gz").exists() and not Path("/tmp/escaped-absolute.gz").exists()


def test_a_symlink_out_of_the_download_directory_is_refused(src, tmp_path):
    store = CheckpointStore(str(tmp_path / "store"))
    ckpt_id = save(store, src, 0)
    restored, elsewhere = tmp_path / "restored", tmp_path / "elsewhere"
    restored.mkdir()
    elsewhere.mkdir()
    (restored / "tables").symlink_to(elsewhere)  # left there by someone else: downloads must not follow it out
    with pytest.raises(ckpt_io.CheckpointError, match="outside"):
        store.download(ckpt_id, restored)
    assert not any(elsewhere.rglob("*"))
