"""Pure pieces of the training step: env builder, strategy mapping, checkpoint files."""

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from components import checkpoint
from components.config import CtrConfig, Mode, SparseRule, from_dict
from components.train.env import Role, local_layout, role_env
from components.train.strategy import rule_state_dim, server_flags, sparse_table_configs, strategy_settings


def test_role_env_matches_paddle_contract():
    layout = local_layout(servers=2, workers=3, host="127.0.0.1", job_id="j1")
    servers = layout.server_endpoints
    for i in range(2):
        env = role_env(layout, Role.SERVER, i)
        assert env["TRAINING_ROLE"] == "PSERVER"
        # Paddle finds a server's own shard by matching POD_IP:PADDLE_PORT against the list exactly.
        assert f"{env['POD_IP']}:{env['PADDLE_PORT']}" == servers[i]
        assert env["PADDLE_PSERVERS_IP_PORT_LIST"].split(",") == list(servers)
        assert "PADDLE_TRAINER_ID" not in env
    for i in range(3):
        env = role_env(layout, Role.WORKER, i)
        assert env["TRAINING_ROLE"] == "TRAINER"
        assert env["PADDLE_TRAINER_ID"] == str(i)
        assert env["PADDLE_TRAINERS_NUM"] == "3"
        assert env["PADDLE_GLOO_HTTP_ENDPOINT"] == layout.gloo_endpoint
    ports = [e.rsplit(":", 1)[1] for e in servers + layout.worker_endpoints + (layout.gloo_endpoint,)]
    assert len(set(ports)) == len(ports)


def test_sparse_table_configs_spell_out_the_rule():
    table = CtrConfig().table
    table.rule, table.learning_rate, table.embedding_dim, table.shard_num = SparseRule.adam, 0.01, 9, 24
    (name, configs), = sparse_table_configs(table).items()
    prefix = f"table_parameters.{name}.accessor."
    assert configs[prefix + "embed_sgd_param.name"] == "SparseAdamSGDRule"
    assert configs[prefix + "embedx_sgd_param.adam.learning_rate"] == 0.01
    # Paddle checks fea_dim = dim + 2 and embedx_dim = dim - 1 for SparseAccessor.
    assert configs[prefix + "fea_dim"] == 11 and configs[prefix + "embedx_dim"] == 8
    assert configs[f"table_parameters.{name}.shard_num"] == 24
    assert not any("ctr_accessor_param" in key for key in configs)  # eviction off: Paddle's defaults
    table.eviction.enabled, table.eviction.delete_after_unseen_days = True, 3
    (_, configs), = sparse_table_configs(table).items()
    assert configs[prefix + "ctr_accessor_param.delete_after_unseen_days"] == 3


@pytest.mark.parametrize("mode,k_steps,has_table", [("async", 0, True), ("sync", 0, True), ("geo", 7, False)])
def test_strategy_per_mode(mode, k_steps, has_table):
    cfg = from_dict({"ps": {"mode": mode, "geo_k_steps": 7}, "run_dir": "."})
    settings = strategy_settings(cfg)
    assert settings["a_sync"] is True
    assert settings["a_sync_configs"] == {"k_steps": k_steps}
    assert (settings["sparse_table_configs"] is not None) == has_table


def test_strategy_builds_in_paddle():
    from components.train.strategy import build_strategy

    cfg = from_dict({"table": {"rule": "adagrad", "learning_rate": 0.3}, "run_dir": "."})
    strategy = build_strategy(cfg)
    (table,) = strategy.sparse_table_configs
    assert table.accessor.embed_sgd_param.name == "SparseAdaGradSGDRule"
    assert table.accessor.embedx_sgd_param.adagrad.learning_rate == pytest.approx(0.3)
    assert list(table.accessor.embedx_sgd_param.adagrad.weight_bounds) == [-10.0, 10.0]


def test_each_ssd_server_keeps_its_rocksdb_in_its_own_workdir(tmp_path):
    ssd = from_dict({"table": {"table_class": "SSDSparseTable"}, "run_dir": "."})
    flags = {i: server_flags(ssd, tmp_path / f"server-{i}") for i in (0, 1)}
    assert flags[0] == {"FLAGS_rocksdb_path": str(tmp_path / "server-0" / "rocksdb")}
    assert flags[0] != flags[1]
    assert server_flags(from_dict({"run_dir": "."}), tmp_path) == {}  # a memory table opens no RocksDB


def _write_table(path, rule, dim, rows):
    state_embed, state_embedx = rule_state_dim(rule, 1), rule_state_dim(rule, dim - 1)
    with gzip.open(path, "wt") as f:
        for key, row, full in rows:
            fields = [key, 0, 0, 1.5, 15, 1, row[0]] + [0.5] * state_embed
            if full:
                fields += list(row[1:]) + [0.25] * state_embedx
            f.write(" ".join(str(v) for v in fields) + "\n")


@pytest.mark.parametrize("rule", list(SparseRule))
def test_read_sparse_table_per_rule(tmp_path, rule):
    dim = 5
    rows = [(7, [0.1, 1, 2, 3, 4], True), (2**63 + 5, [0.2, -1, -2, -3, -4], True), (3, [0.3, 0, 0, 0, 0], False)]
    _write_table(tmp_path / "part-000-00000.gz", rule, dim, rows[:2])
    _write_table(tmp_path / "part-001-00000.gz", rule, dim, rows[2:])
    ids, values = checkpoint.read_sparse_table(tmp_path, rule, dim)
    assert ids.tolist() == [3, 7, 2**63 + 5]
    np.testing.assert_allclose(values, np.array([rows[2][1], rows[0][1], rows[1][1]], dtype=np.float32))


def test_commit_verify_detects_missing_and_altered_files(tmp_path):
    root = tmp_path / "ckpt"
    checkpoint.save_export(root, np.array([1, 2], np.uint64), np.ones((2, 3), np.float32), {"w": np.zeros(4)})
    with pytest.raises(checkpoint.CheckpointError, match="MANIFEST.json is missing"):
        checkpoint.verify(root)
    manifest = checkpoint.commit(root, {"paddle_version": "2.6.2"})
    assert set(manifest["files"]) == {"model.json", "export/embedding.npz", "export/dense.npz"}
    assert checkpoint.load(root).rows.shape == (2, 3)
    dense = root / "export" / "dense.npz"
    dense.write_bytes(dense.read_bytes()[:-10])
    with pytest.raises(checkpoint.CheckpointError, match="export/dense.npz.*checksum"):
        checkpoint.load(root)
    dense.unlink()
    with pytest.raises(checkpoint.CheckpointError, match="dense.npz.*missing"):
        checkpoint.verify(root)
    assert json.loads((root / "model.json").read_text()) == {"paddle_version": "2.6.2"}


def test_geo_mode_refuses_huge_local_tables():
    from components.config import ConfigError, validate

    cfg = from_dict({"ps": {"mode": "geo"}, "table": {"vocab_size": 1 << 30}, "run_dir": "."})
    assert cfg.ps.mode is Mode.geo
    with pytest.raises(ConfigError, match="table.vocab_size.*geo"):
        validate(cfg)


def test_each_server_uploads_only_its_own_shards(tmp_path):
    """The sidecar protocol: server i sends the files it saved; worker 0 collects every server's answer."""
    from components.checkpoint_store import CheckpointStore, make_id
    from components.train import shard_uploader

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
    from components.checkpoint_store import CheckpointStore, make_id
    from components.train import shard_uploader

    store = CheckpointStore(str(tmp_path / "store"))
    ckpt_id = make_id(1, 10)
    entry = {"size": 3, "sha256": "abc"}
    for server in (0, 1):  # the servers answered already; the round must not depend on who is first
        store.write_json(None, shard_uploader.answer_rel(ckpt_id, server), {"files": {f"tables/part-00{server}": entry}})
    files = shard_uploader.collect_shards(store, ckpt_id, "/staging/tables", servers=2, timeout_s=5)
    assert files == {"tables/part-000": entry, "tables/part-001": entry}
    assert store.fs.ls(store.fs_path(None, shard_uploader.UPLOADS), detail=False) == []


def test_worker_rows_merge_averages_geo_copies_and_keeps_pulled_rows_exact(tmp_path):
    from components.checkpoint_store import CheckpointStore
    from components.train import checkpointing

    store = CheckpointStore(str(tmp_path / "store"))
    pulled = np.array([[0.1, -0.7], [1 / 3, 2e-8]], np.float32)  # one barrier's rows: equal on every worker
    checkpointing.upload_worker_rows(store, 1, 0, np.array([5, 9]), pulled, tmp_path)
    checkpointing.upload_worker_rows(store, 1, 1, np.array([9, 2**63 + 1], np.uint64), np.vstack([pulled[1], [4, 4]]), tmp_path)
    ids, rows = checkpointing.merged_worker_rows(store, 1, workers=2, staging=tmp_path / "local")
    assert ids.tolist() == [5, 9, 2**63 + 1]
    assert rows[1].tobytes() == pulled[1].tobytes()  # bit-exact: the mean of equal copies
    checkpointing.upload_worker_rows(store, 2, 0, np.array([7]), np.array([[1.0, 0.0]], np.float32), tmp_path)
    checkpointing.upload_worker_rows(store, 2, 1, np.array([7]), np.array([[3.0, 1.0]], np.float32), tmp_path)
    _, geo = checkpointing.merged_worker_rows(store, 2, workers=2, staging=tmp_path / "local2")
    np.testing.assert_array_equal(geo, [[2.0, 0.5]])
    assert (tmp_path / "local2" / checkpointing.WORKER_ROWS / "worker-1.npz").is_file()  # kept in the checkpoint
    assert not store.fs.exists(store.fs_path(None, f"{checkpointing.WORKER_ROWS_SCRATCH}/e0002"))


def test_worker_0_fails_with_the_server_error(tmp_path):
    from components.checkpoint_store import CheckpointStore, make_id
    from components.train import shard_uploader

    store = CheckpointStore(str(tmp_path / "store"))
    ckpt_id = make_id(2, 5)
    store.write_json(None, shard_uploader.answer_rel(ckpt_id, 1, error=True), {"error": "server 1: disk full"})
    with pytest.raises(RuntimeError, match="server 1: disk full"):
        shard_uploader.wait_for_servers(store, ckpt_id, servers=2, timeout_s=5)
    with pytest.raises(TimeoutError, match=r"servers \[0\]"):
        shard_uploader.wait_for_servers(store, make_id(3, 5), servers=1, timeout_s=0.5)


def test_a_pod_fetches_the_dataset_files_its_role_reads(tmp_path, monkeypatch):
    from components.data_prep.prepare import prepare_synthetic
    from components.train.role import fetch_dataset

    stats = prepare_synthetic(tmp_path / "remote", rows=2000, test_fraction=0.2, num_shards=4, vocab_size=1000, seed=1)
    uri = (tmp_path / "remote").as_uri()  # file://..., fetched through fsspec like s3://...
    monkeypatch.setenv("TRAINING_ROLE", "PSERVER")
    server = fetch_dataset(uri, tmp_path / "server")
    assert sorted(p.name for p in server.rglob("*") if p.is_file()) == ["stats.json"]
    monkeypatch.setenv("TRAINING_ROLE", "TRAINER")
    monkeypatch.setenv("PADDLE_TRAINER_ID", "1")
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "2")
    worker = fetch_dataset(uri, tmp_path / "worker-1")
    fetched = sorted(str(p.relative_to(worker)) for p in worker.rglob("*") if p.is_file() and p.name != "stats.json")
    assert fetched == sorted(stats["shards"]["train"][1::2])
    for rel in fetched:
        assert (worker / rel).read_bytes() == (tmp_path / "remote" / rel).read_bytes()


def test_a_restarted_job_continues_from_its_latest_checkpoint(tmp_path):
    from components.checkpoint_store import CheckpointStore, make_id
    from components.train.checkpointing import restart_restore

    store = CheckpointStore(str(tmp_path / "ckpt"))
    warm = {"uri": "s3://other", "id": "w", "continue": False}
    assert restart_restore(store, warm, attempt=0) == warm
    assert restart_restore(store, warm, attempt=1) == warm  # nothing committed before the failure
    ckpt_id = make_id(2, 100)
    (tmp_path / "staged").mkdir()
    (tmp_path / "staged" / "x.txt").write_text("x")
    store.commit(ckpt_id, store.upload_dir(tmp_path / "staged", ckpt_id), {})
    assert restart_restore(store, warm, attempt=0) == warm  # the first attempt starts as configured
    assert restart_restore(store, warm, attempt=1) == {"uri": store.uri, "id": ckpt_id, "continue": True}


def test_a_pass_reported_again_after_a_restart_replaces_the_first_report():
    from components.train.job import EventLog

    events = EventLog(echo=lambda line: None)
    for epoch, auc in ((1, 0.6), (2, 0.7), (2, 0.71), (3, 0.75)):  # the job restarted during pass 2
        payload = json.dumps({"epoch": epoch, "examples": 10, "seconds": 1.0, "auc": auc})
        assert events.feed("worker-0", f"@epoch {payload}\n")
    assert [(e["epoch"], e["auc"]) for e in events.epochs] == [(1, 0.6), (2, 0.71), (3, 0.75)]
    assert not events.feed("worker-0", "@epoch {broken\n") and not events.feed("worker-0", "I1129 plain line")
