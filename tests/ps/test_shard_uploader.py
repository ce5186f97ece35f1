"""A server's sidecar that uploads its saved shards, and worker 0's side of that protocol."""

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


def test_worker_0_fails_with_the_server_error(tmp_path):
    store = CheckpointStore(str(tmp_path / "store"))
    ckpt_id = make_id(2, 5)
    store.write_json(None, shard_uploader.answer_rel(ckpt_id, 1, error=True), {"error": "server 1: disk full"})
    with pytest.raises(RuntimeError, match="server 1: disk full"):
        shard_uploader.wait_for_servers(store, ckpt_id, servers=2, timeout_s=5)
    with pytest.raises(TimeoutError, match=r"servers \[0\]"):
        shard_uploader.wait_for_servers(store, make_id(3, 5), servers=1, timeout_s=0.5)
