"""A server's sidecar that uploads its saved shards, and worker 0's side of that protocol."""

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from components.checkpoint.store import CheckpointStore, make_id
from components.ps import shard_uploader


def test_each_server_uploads_only_its_own_shards(tmp_path):
    """The sidecar protocol: server i sends the files it saved; worker 0 collects every server's answer."""
    staged = tmp_path / "staging" / "tables"
    for name in ("000/part-000-00000.gz", "000/part-000-00001.gz", "000/part-001-00000.gz",
                 "001/part-000.gz", "001/part-001.gz"):
        (staged / name).parent.mkdir(parents=True, exist_ok=True)
        (staged / name).write_bytes(name.encode())
    store = CheckpointStore(str(tmp_path / "store"))
    ckpt_id = make_id(1, 100)
    store.write_json(None, shard_uploader.request_rel(ckpt_id), {"tables_dir": str(staged)})
    for server in (0, 1):
        (found_id, request), = shard_uploader.pending_requests(store, server, served=set())
        assert found_id == ckpt_id
        entries = shard_uploader.upload_shards(store, ckpt_id, Path(request["tables_dir"]), server)
        assert all(f"part-{server:03d}" in rel for rel in entries), entries
        store.write_json(None, shard_uploader.answer_rel(ckpt_id, server), {"files": entries})
    collected = shard_uploader.wait_for_servers(store, ckpt_id, servers=2, timeout_s=5)
    assert sorted(collected) == ["tables/000/part-000-00000.gz", "tables/000/part-000-00001.gz",
                                 "tables/000/part-001-00000.gz", "tables/001/part-000.gz", "tables/001/part-001.gz"]
    assert not list(staged.rglob("part-*"))  # each server removed what it staged once it was in the store


def test_collecting_the_shards_clears_the_upload_records(tmp_path):
    """Worker 0's round: request, every server's answer, then no trace left in the control folder."""
    store = CheckpointStore(str(tmp_path / "store"))
    ckpt_id = make_id(1, 10)
    entry = {"size": 3, "sha256": "abc"}
    for server in (0, 1):  # the servers answered already; the round must not depend on who is first
        store.write_json(None, shard_uploader.answer_rel(ckpt_id, server), {"files": {f"tables/part-00{server}": entry}})
    files = shard_uploader.collect_shards(store, ckpt_id, "/staging/tables", servers=2, timeout_s=5)
    assert files == {"tables/part-000": entry, "tables/part-001": entry}
    assert store.fs.ls(store.fs_path(None, shard_uploader.UPLOADS), detail=False) == []


def test_worker_0_fails_quoting_the_error_of_a_real_uploader(tmp_path):
    """The uploader process, on an upload that cannot succeed (the target is a directory), writes its error file
    and lives on; worker 0's wait fails at once quoting it, instead of waiting out its timeout."""
    staged = tmp_path / "staging" / "tables"
    (staged / "000").mkdir(parents=True)
    (staged / "000" / "part-000-00000.gz").write_bytes(b"rows")
    store = CheckpointStore(str(tmp_path / "store"))
    ckpt_id = make_id(2, 5)
    Path(store.fs_path(ckpt_id, "tables/000/part-000-00000.gz")).mkdir(parents=True)  # where the file must go
    uploader = subprocess.Popen([sys.executable, "-m", "components.ps.shard_uploader", "--store", store.uri,
                                 "--server", "0", "--parent-pid", str(os.getpid())],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        store.write_json(None, shard_uploader.request_rel(ckpt_id), {"tables_dir": str(staged)})
        started = time.time()
        with pytest.raises(RuntimeError) as err:
            shard_uploader.wait_for_servers(store, ckpt_id, servers=1, timeout_s=60)
        assert time.time() - started < 10
        assert (f"checkpoint {ckpt_id}: server 0: CheckpointStoreError: uploading {staged / '000' / 'part-000-00000.gz'}"
                in str(err.value)) and "IsADirectoryError" in str(err.value)
        assert uploader.poll() is None  # it serves the next request
    finally:
        uploader.terminate()
        output = uploader.communicate(timeout=10)[0]
    assert "IsADirectoryError" in output  # and the server's log has it too


def test_worker_0_times_out_naming_the_servers_that_did_not_answer(tmp_path):
    store = CheckpointStore(str(tmp_path / "store"))
    with pytest.raises(TimeoutError, match=r"servers \[0\]"):
        shard_uploader.wait_for_servers(store, make_id(3, 5), servers=1, timeout_s=0.5)


def test_an_uploader_rides_out_a_store_that_stops_answering(tmp_path, moto_endpoint, s3_endpoint, caplog):
    """The endpoint is down when the uploader starts polling (each listing fails, even after the store's
    retries); once it is back, the uploader serves the next request: the outage did not end it."""
    store = CheckpointStore(s3_endpoint, retries=1)
    staged = tmp_path / "staging" / "tables"
    (staged / "000").mkdir(parents=True)
    (staged / "000" / "part-000-00000.gz").write_bytes(b"rows")
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # the uploader's "server"
    moto_endpoint.stop()
    serving = threading.Thread(target=shard_uploader.serve, args=(store, 0, owner.pid), daemon=True)
    try:
        serving.start()
        time.sleep(1.5)
        assert "cannot list the upload requests (trying again)" in caplog.text
        moto_endpoint.start()
        ckpt_id = make_id(1, 1)
        store.write_json(None, shard_uploader.request_rel(ckpt_id), {"tables_dir": str(staged)})
        entries = shard_uploader.wait_for_servers(store, ckpt_id, servers=1, timeout_s=30)
        assert list(entries) == ["tables/000/part-000-00000.gz"]
    finally:
        owner.kill()
        owner.wait()
    serving.join(10)
    assert not serving.is_alive()  # it ends with its server
