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
    lines = {"000/part-000-00000": 2, "000/part-000-00001": 3, "000/part-001-00000": 1, "001/part-000": 4,
             "001/part-001": 4}
    for name, count in lines.items():
        (staged / name).parent.mkdir(parents=True, exist_ok=True)
        (staged / name).write_text("".join(f"{k} 0 0 1 0 0.5\n" for k in range(count)))
    store = CheckpointStore(str(tmp_path / "store"))
    ckpt_id = make_id(1, 100)
    store.write_json(None, shard_uploader.request_rel(ckpt_id), {"tables_dir": str(staged)})
    for server in (0, 1):
        (found_id, request), = shard_uploader.pending_requests(store, server, served=set())
        assert found_id == ckpt_id
        answer = shard_uploader.upload_shards(store, ckpt_id, Path(request["tables_dir"]), server)
        assert all(f"part-{server:03d}" in rel for rel in answer["files"]), answer
        store.write_json(None, shard_uploader.answer_rel(ckpt_id, server), answer)
    answers = shard_uploader.wait_for_servers(store, ckpt_id, servers=2, timeout_s=5)
    assert [sorted(a["files"]) for a in answers] == [
        ["tables/000/part-000-00000", "tables/000/part-000-00001", "tables/001/part-000"],
        ["tables/000/part-001-00000", "tables/001/part-001"]]
    # The rows of each server's sparse shards (one per line; the dense slices part-<i> are not rows).
    assert [a["rows"] for a in answers] == [2 + 3, 1] and [a["evicted"] for a in answers] == [None, None]
    assert not list(staged.rglob("part-*"))  # each server removed what it staged once it was in the store


def test_collecting_the_shards_clears_the_upload_records(tmp_path):
    """Worker 0's round: request, every server's answer, then no trace left in the control folder."""
    store = CheckpointStore(str(tmp_path / "store"))
    ckpt_id = make_id(1, 10)
    entry = {"size": 3, "sha256": "abc"}
    shard_uploader.announce_save(store, ckpt_id, "/staging/tables")
    for server in (0, 1):  # the servers answered already; the round must not depend on who is first
        store.write_json(None, shard_uploader.answer_rel(ckpt_id, server),
                         {"files": {f"tables/part-00{server}": entry}, "rows": server, "evicted": None})
    answers = shard_uploader.collect_shards(store, ckpt_id, "/staging/tables", servers=2, timeout_s=5)
    assert [a["files"] for a in answers] == [{"tables/part-000": entry}, {"tables/part-001": entry}]
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
        # A refusal (here EISDIR) is named with the store path it was refused at, not retried (issue 34).
        assert str(err.value).startswith(f"checkpoint {ckpt_id}: server 0: StoreRefused: uploading ")
        assert str(err.value).endswith(f"{ckpt_id}/tables/000/part-000-00000.gz' (EISDIR)")
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
        (answer,) = shard_uploader.wait_for_servers(store, ckpt_id, servers=1, timeout_s=30)
        assert list(answer["files"]) == ["tables/000/part-000-00000.gz"]
    finally:
        owner.kill()
        owner.wait()
    serving.join(10)
    assert not serving.is_alive()  # it ends with its server


def test_a_save_in_progress_is_reported_by_the_rows_it_wrote(tmp_path):
    """The sidecar counts the lines of its own shard files as the server writes them (not another server's)."""
    tables = tmp_path / "tables" / "000"
    tables.mkdir(parents=True)
    watch = shard_uploader.SaveWatch(tmp_path / "tables", server=1)
    assert watch.rows() == 0
    mine, other = tables / "part-001-00003", tables / "part-000-00002"
    mine.write_text("1 0 0 1 0 0.5\n2 0 0 1 0 0.5\n")
    other.write_text("9 0 0 1 0 0.5\n")
    assert watch.rows() == 2
    with open(mine, "a") as f:
        f.write("3 0 0 1 0 0.5\n")
    (tables / "part-001-00004").write_text("4 0 0 1 0 0.5\n")
    assert watch.rows() == 4


def test_evicted_rows_are_counted_against_the_servers_last_save(tmp_path):
    """How many rows of a server's last save its new save no longer holds, shard by shard on its own disk."""
    staged = tmp_path / "staging"
    counter = shard_uploader.EvictionCount(tmp_path / "work")

    def save(shard_ids):
        staged.mkdir(exist_ok=True)
        paths = []
        for shard, ids in shard_ids.items():
            path = staged / f"part-000-{shard:05d}"
            path.write_text("".join(f"{k} 0 0 1 0 0.5\n" for k in ids))
            paths.append(path)
        return paths

    assert counter.evicted(save({0: [2, 4, 6], 1: [1, 3]})) is None  # nothing to compare the first with
    assert counter.evicted(save({0: [4, 6, 8], 1: [3]})) == 2  # 2 and 1 are gone; 8 is new
    assert counter.evicted(save({0: [4, 6, 8], 1: [3]})) == 0
