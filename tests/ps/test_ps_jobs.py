"""Real Paddle parameter-server jobs on this machine: servers and workers as local processes."""

import json
import os
import re
import signal
import subprocess
import threading
import time

import numpy as np
import pytest

from components.checkpoint import format as ckpt_io
from components.checkpoint.pointer import fetch_for_scoring
from components.checkpoint.restore import RestoreTarget
from components.checkpoint.store import CheckpointStore, parse_id
from components.config import EvalConfig, from_dict
from components.data_prep.multislot import Schema, read_shards
from components.data_prep.prepare import prepare_synthetic
from components.evaluate.evaluate import evaluate
from components.metrics import binary_metrics, binary_metrics_counts
from components.table.accessor import read_sparse_table
from components.networks.scoring import Scorer, read_test_split
from components.train.backends.local import LocalJob
from components.train.job import PsJobError, prepare_job
from components.train.step import launch_ps_job
from tests.conftest import CRITEO, FAKE_SECRET, needs_criteo

ROWS = 60_000
# For the tests that assert no learning, only what a job did with its rows: chunks, checkpoints, evicted ids.
SMALL_ROWS = 20_000


def _config(tmp_path, checkpoint=None, model=None, table=None, **ps):
    return from_dict({
        # Small data needs more, smaller steps than the defaults tuned for 400k rows.
        "ps": {"servers": 1, "workers": 1, "epochs": 2, "batch_size": 64, **ps},
        "model": {"hidden": [64, 32], **(model or {})},
        "table": {"learning_rate": 0.1, **(table or {})},
        "checkpoint": {"uri": str(tmp_path / "ckpt"), **(checkpoint or {})},
        "run_dir": str(tmp_path),
    })


def _score(uri, ckpt_id, data_dir, out_dir):
    """Test metrics of a committed checkpoint, fetched from its store as the evaluate step does. Without the
    evaluation's logistic-regression baseline (a fit of seconds per call here, on metrics no test of this file
    reads; tests/evaluate covers it): the model's own metrics are the checkpoint's scores either way."""
    local = fetch_for_scoring(uri, ckpt_id, out_dir / "fetched", ckpt_io.EVALUATION_PARTS)
    return evaluate(local, data_dir, out_dir, EvalConfig(baseline=False))


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """One synthetic dataset per worker count (the shard count must equal workers * shards_per_worker)."""
    root = tmp_path_factory.mktemp("data")
    return {w: (root / f"w{w}", prepare_synthetic(root / f"w{w}", rows=ROWS, test_fraction=0.2, num_shards=w,
                                                 vocab_size=1 << 20, seed=3)) for w in (1, 2)}


@pytest.fixture(scope="module")
def small_datasets(tmp_path_factory):
    """As :func:`datasets` with a third of the rows: passes and the scoring of every checkpoint take a third as
    long, for the tests that count chunks, checkpoints and ids rather than how well the model learned."""
    root = tmp_path_factory.mktemp("small")
    return {w: (root / f"w{w}", prepare_synthetic(root / f"w{w}", rows=SMALL_ROWS, test_fraction=0.2, num_shards=w,
                                                 vocab_size=1 << 20, seed=3)) for w in (1, 2)}


def _job_processes_alive(marker: str) -> list[str]:
    out = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "components.ps.role" in line]


def _train_and_score(tmp_path, datasets, **ps):
    cfg = _config(tmp_path, **ps)
    data_dir, stats = datasets[cfg.ps.workers]
    lines = []
    result = launch_ps_job(cfg, data_dir, tmp_path / "logs", echo=lines.append)
    metrics = _score(cfg.checkpoint.uri, result.checkpoints[-1]["id"], data_dir, tmp_path / "eval")
    assert not _job_processes_alive(str(tmp_path))
    return result, metrics, stats, lines


@pytest.fixture(scope="module")
def async_two_by_two(tmp_path_factory, datasets):
    """One 2 server + 2 worker async job over host-name endpoints, shared by the three tests that only read what it
    did (each ran a job of this shape of its own before): that it learns, that endpoints may be host names, and that
    its checkpoints' scores equal one process's. ``(config, result, test metrics, stats)``."""
    tmp_path = tmp_path_factory.mktemp("async")
    ps = dict(servers=2, workers=2, host="localhost")
    result, metrics, stats, _ = _train_and_score(tmp_path, datasets, **ps)
    return _config(tmp_path, **ps), result, metrics, stats


def test_one_server_one_worker_learns(tmp_path, datasets, monkeypatch):
    # Paddle logs the gflags its PS parses (service, fleet) and each dense push after its merge (brpc_ps_client)
    monkeypatch.setenv("GLOG_vmodule", "service=3,fleet=3,brpc_ps_client=3")
    monkeypatch.setenv("GLOG_minloglevel", "0")
    result, metrics, stats, lines = _train_and_score(tmp_path, datasets, rpc_timeout_ms=123456, compress="snappy")
    assert [e["epoch"] for e in result.epochs] == [1, 2]
    assert result.epochs[-1]["examples"] == stats["rows"]["train"]
    assert any("global train AUC" in line for line in lines)
    # every_passes=1: one committed checkpoint per pass, LATEST on the last one
    assert [parse_id(c["id"])[0] for c in result.checkpoints] == [1, 2]
    assert CheckpointStore(str(tmp_path / "ckpt")).latest() == result.checkpoints[-1]["id"]
    # Learned: well above chance on held-out rows, and on the way to the generator's ceiling.
    assert metrics["auc"] > 0.7, metrics
    assert metrics["auc"] / stats["bayes"]["auc"] > 0.85
    # The RPC settings reached both the server's and the worker's PS runtime.
    logs = {role: (tmp_path / "logs" / f"{role}.log").read_text() for role in ("server-0", "worker-0")}
    for role, log in logs.items():
        assert "Init With Gflags:" in log and "-pserver_timeout_ms=123456" in log, role
        assert "-pserver_communicate_compress_type=1" in log, role  # ps.compress=snappy
    # ps.batches_per_push=1: the worker pushes every batch's dense gradient on its own, not Paddle's sum of 13.
    worker_log = logs["worker-0"]
    assert "-pserver_push_dense_merge_limit=0" in worker_log and "-pserver_push_sparse_merge_limit=0" in worker_log
    merges = re.findall(r"PushDenseTaskConsume after merge.*merge_count (\d+)", worker_log)
    assert merges and set(merges) == {"0"}, sorted(set(merges))


# Geo adds every worker's dense delta on the servers: at this data size Adam's 1e-3 sometimes drove the net to a
# constant prediction (test AUC 0.50 in 2 of 5 runs, 0.70-0.71 otherwise); 3e-4 gave 0.745-0.749.
GEO_MODEL = {"hidden": [64, 32], "learning_rate": 3e-4}


# geo: slow, and not only for its time (a geo worker's pass is ~4x an async one's here: see the twin below). With two
# workers a geo job can hang before its first batch, under load: Paddle 2.6.2's GeoCommunicator::InitParams puts the
# workers through two server-side barriers in a row (InitDense, then InitSparse), and BarrierTable::Barrier wakes its
# waiters on a predicate (no trainer registered) rather than a generation: a worker that arrives at the second barrier
# before the server's thread for the other's first one has woken leaves that thread asleep for good. Seen here: worker
# 0 in InitDense's BarrierWithTable, worker 1 in InitSparse's (gdb), until the stall timeout failed the job after
# 120 s. The default suite's geo case is test_geo_on_two_servers_with_one_worker_learns, which no barrier can hang.
@pytest.mark.parametrize("mode", ["async", pytest.param("geo", marks=pytest.mark.slow), "sync"])
def test_two_servers_two_workers_learn(tmp_path, datasets, mode, request):
    if mode == "async":
        _, result, metrics, stats = request.getfixturevalue("async_two_by_two")
    else:
        # sync: rounds of ps.sync_batches=16 (the default) batches per worker, 24 a pass here, each ending in a
        # barrier of the workers (4 gave 94 a pass, twice the pass time, for the same path).
        result, metrics, stats, _ = _train_and_score(tmp_path, datasets, servers=2, workers=2, mode=mode,
                                                     model=GEO_MODEL if mode == "geo" else None)
    # Both workers' examples are counted in the global AUC statistics.
    assert result.epochs[-1]["examples"] == stats["rows"]["train"]
    assert metrics["auc"] > 0.7, (mode, metrics)


GEO_VOCAB = 1 << 16


@pytest.fixture(scope="module")
def geo_dataset(tmp_path_factory):
    """The datasets' rows hashed into 2^16 ids instead of 2^20. A geo worker trains a dense local copy of the whole
    table, and Adam (lazy_mode off) updates every row of it at every step: a pass of two workers took 19 s with 2^20
    rows, 4 s with 2^16, to the same test AUC (0.75-0.76 after one pass, 0.745-0.75 after two; one worker's pass:
    0.762 in three runs)."""
    root = tmp_path_factory.mktemp("geo")
    return root, prepare_synthetic(root, rows=ROWS, test_fraction=0.2, num_shards=1, vocab_size=GEO_VOCAB, seed=3)


def test_geo_on_two_servers_with_one_worker_learns(tmp_path, geo_dataset):
    """The default suite's geo job, the fast twin of test_two_servers_two_workers_learn[geo] (slow): the geo strategy,
    its MemorySparseGeoTable sharded over two servers, the worker's delta sends and receives, the checkpoint of rows
    from the worker. One worker, so that the servers' barriers have no one to wait for (the hang above); the merge of
    two workers' deltas, and a second pass, are the slow case's."""
    data_dir, stats = geo_dataset
    cfg = _config(tmp_path, servers=2, epochs=1, mode="geo", model=GEO_MODEL, table={"vocab_size": GEO_VOCAB})
    result = launch_ps_job(cfg, data_dir, tmp_path / "logs", echo=lambda line: None)
    assert [e["examples"] for e in result.epochs] == [stats["rows"]["train"]]
    assert [c["epoch"] for c in result.checkpoints] == [1] and result.checkpoints[-1]["servers"] is None
    last = tmp_path / "ckpt" / result.checkpoints[-1]["id"]
    assert not (last / "tables").exists() and (last / "worker_rows" / "worker-0.npz").is_file()
    metrics = _score(cfg.checkpoint.uri, result.checkpoints[-1]["id"], data_dir, tmp_path / "eval")
    assert metrics["auc"] > 0.7, metrics
    assert not _job_processes_alive(str(tmp_path))


def test_ssd_table_learns_with_a_rocksdb_per_server_workdir(tmp_path, datasets):
    """table=ssd: Paddle's SSDSparseTable serves and learns. Each server opens its RocksDB stores in its own
    work directory, and the checkpoint's rows are pulled by the workers, since a save of the table hangs."""
    result, metrics, stats, _ = _train_and_score(tmp_path, datasets, servers=2,
                                                 table={"table_class": "SSDSparseTable", "shard_num": 16})
    assert result.epochs[-1]["examples"] == stats["rows"]["train"]
    assert metrics["auc"] > 0.7, metrics
    work = tmp_path / "logs" / "work"
    for server in ("server-0", "server-1"):
        # 16 shards on 2 servers: one RocksDB per local shard, opened (CURRENT written) in the server's workdir
        stores = sorted((work / server).glob("rocksdb_*"))
        assert sorted(p.name for p in stores) == sorted(f"rocksdb_{k}" for k in range(8)), server
        assert all((p / "CURRENT").is_file() for p in stores)
    assert not list(work.rglob("database*"))  # Paddle's default path, which servers in one directory share
    last = tmp_path / "ckpt" / result.checkpoints[-1]["id"]
    assert not (last / "tables").exists() and (last / "worker_rows" / "worker-0.npz").is_file()


def test_endpoints_may_be_host_names(async_two_by_two):
    """On Kubernetes every endpoint is a pod's DNS name (manifests.kubernetes_layout), POD_IP included: the shared
    2 + 2 job binds and dials "localhost"."""
    cfg, result, _, stats = async_two_by_two
    assert cfg.ps.host == "localhost"
    assert [e["examples"] for e in result.epochs] == [stats["rows"]["train"]] * 2


@pytest.mark.parametrize("victim_name", ["worker-1", "server-0"])
def test_killed_process_stops_the_whole_job(tmp_path, datasets, victim_name):
    """With no restart left (cluster.max_restarts=0; restarts: tests/ps/test_restarts.py) a killed role fails the
    job within seconds, naming it, with nothing left running."""
    cfg = _config(tmp_path, model={"blend_baseline": False}, servers=2, workers=2, epochs=200, progress_period_s=1)
    cfg.cluster.max_restarts = 0
    data_dir, _ = datasets[2]
    job = LocalJob(prepare_job(cfg, None), data_dir, tmp_path / "logs", echo=lambda line: None)
    outcome = {}

    def run():
        try:
            job.run()
        except PsJobError as err:
            outcome["error"] = err

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.time() + 120
    while "worker-1" not in job.progress and time.time() < deadline:  # training has started
        time.sleep(0.2)
    assert "worker-1" in job.progress, "worker 1 never reported progress"
    victim = next(p for p in job.processes if p.name == victim_name)
    killed_at = time.time()
    os.kill(victim.popen.pid, signal.SIGKILL)
    thread.join(60)
    assert not thread.is_alive()
    assert time.time() - killed_at < 30
    error = outcome["error"]
    assert error.role == victim_name
    assert "SIGKILL" in str(error) and f"{victim_name}.log" in str(error)
    assert not _job_processes_alive(str(tmp_path))
    assert CheckpointStore(cfg.checkpoint.uri).committed() == []


def test_resume_restores_the_model_exactly_and_continues(tmp_path, datasets):
    """Pass 1 is committed; a rerun with resume=latest trains pass 2 only, from the restored model.

    A third run resumes from pass 2 on a different server count with learning rates so small that
    training cannot move the model: its checkpoint must score exactly like the one it started from. A
    fourth run warm-starts from pass 2 into its own store, on one server, and must score the same too. (Those two
    train their pass in batches of 1,024: a sixteenth of the steps, none of which can move the model either.)
    """
    data_dir, _ = datasets[2]
    first = launch_ps_job(_config(tmp_path, servers=2, workers=2, epochs=1), data_dir, tmp_path / "l1",
                          echo=lambda line: None)
    (pass1,) = [c["id"] for c in first.checkpoints]
    second = launch_ps_job(_config(tmp_path, servers=2, workers=2, epochs=2, checkpoint={"resume": "latest"}),
                           data_dir, tmp_path / "l2", echo=lambda line: None)
    assert second.restored_from == RestoreTarget(str(tmp_path / "ckpt"), pass1, resume=True, shard_num=16)
    assert [e["epoch"] for e in second.epochs] == [2]  # pass 1 is not trained twice
    (pass2,) = [c["id"] for c in second.checkpoints]
    uri = str(tmp_path / "ckpt")
    resumed = _score(uri, pass2, data_dir, tmp_path / "e2")
    # Pass 2 went on from pass 1's model: it fits the rows it has seen once already better than pass 1 fitted them
    # (a pass 2 from scratch would score as pass 1 did), and its checkpoint scores differently. Whether the test
    # split gains from a second pass is the data's business (here it does not: the model starts at the base rate).
    assert second.epochs[-1]["auc"] > first.epochs[-1]["auc"] + 0.01
    assert resumed["auc"] != _score(uri, pass1, data_dir, tmp_path / "e1")["auc"]

    frozen = _config(tmp_path, servers=3, workers=2, epochs=3, batch_size=1024, checkpoint={"resume": pass2},
                     model={"learning_rate": 1e-12}, table={"learning_rate": 1e-12})
    third = launch_ps_job(frozen, data_dir, tmp_path / "l3", echo=lambda line: None)
    assert third.restored_from.id == pass2 and [e["epoch"] for e in third.epochs] == [3]
    assert third.plan.shard_num == 16  # as saved on 2 servers, not 3 x 8: Paddle loads a table into no other count
    restored = _score(uri, third.checkpoints[-1]["id"], data_dir, tmp_path / "e3")
    assert restored["auc"] == pytest.approx(resumed["auc"], abs=1e-6)
    assert restored["logloss"] == pytest.approx(resumed["logloss"], abs=1e-6)

    # Warm start: another run, its own store, starts from pass 2's weights and trains from pass 1.
    warm = _config(tmp_path / "warm", servers=1, workers=2, epochs=1, batch_size=1024,
                   checkpoint={"warm_start": f"{uri}#{pass2}"},
                   model={"learning_rate": 1e-12}, table={"learning_rate": 1e-12})
    fourth = launch_ps_job(warm, data_dir, tmp_path / "l4", echo=lambda line: None)
    assert fourth.restored_from == RestoreTarget(uri, pass2, resume=False, shard_num=16)
    assert [e["epoch"] for e in fourth.epochs] == [1]
    warm_metrics = _score(warm.checkpoint.uri, fourth.checkpoints[-1]["id"], data_dir, tmp_path / "e4")
    assert warm_metrics["auc"] == pytest.approx(resumed["auc"], abs=1e-6)


@pytest.mark.parametrize("victim_name, resume", [
    ("worker-1", True),
    # The fast twin of the slow case below: a killed server keeps pass 1's checkpoint just the same; the resume
    # after it is the one after a killed worker (the case above), whichever role died.
    pytest.param("server-1", False, id="server-1-without-the-resume"),
    pytest.param("server-1", True, marks=pytest.mark.slow),
])
def test_kill_mid_training_keeps_the_last_checkpoint_and_resume_finishes(tmp_path, datasets, victim_name, resume):
    """kill -9 during pass 2 of 3 with no restart left (cluster.max_restarts=0): the job fails naming the role, pass
    1's checkpoint stays committed and loadable, and resume=latest trains passes 2 and 3 only (at most one pass of
    work is lost)."""
    data_dir, _ = datasets[2]
    cfg = _config(tmp_path, model={"blend_baseline": False}, servers=2, workers=2, epochs=3, progress_period_s=1)
    cfg.cluster.max_restarts = 0
    job = LocalJob(prepare_job(cfg, None), data_dir, tmp_path / "l1", echo=lambda line: None)
    outcome = {}
    thread = threading.Thread(target=lambda: outcome.setdefault("error", _run_expecting_failure(job)))
    thread.start()
    deadline = time.time() + 120
    while not job.checkpoints and time.time() < deadline:
        time.sleep(0.1)
    assert job.checkpoints, "no checkpoint was committed"
    time.sleep(0.5)  # into pass 2
    killed_at = time.time()
    os.kill(next(p for p in job.processes if p.name == victim_name).popen.pid, signal.SIGKILL)
    thread.join(60)
    assert time.time() - killed_at < 30
    assert outcome["error"].role == victim_name
    assert not _job_processes_alive(str(tmp_path))
    store = CheckpointStore(cfg.checkpoint.uri)
    (kept,) = [c["id"] for c in job.checkpoints]
    assert store.committed() == [kept] and parse_id(kept)[0] == 1
    assert _score(cfg.checkpoint.uri, kept, data_dir, tmp_path / "e1")["auc"] > 0.6  # intact and loadable
    if not resume:
        return
    rerun = launch_ps_job(_config(tmp_path, model={"blend_baseline": False}, servers=2, workers=2, epochs=3,
                                  checkpoint={"resume": "latest"}),
                          data_dir, tmp_path / "l2", echo=lambda line: None)
    assert rerun.restored_from.id == kept
    assert [e["epoch"] for e in rerun.epochs] == [2, 3]


def _run_expecting_failure(job):
    try:
        job.run()
    except PsJobError as err:
        return err
    raise AssertionError("the job did not fail")


@pytest.mark.slow  # fast twin: test_checkpoints_to_s3_and_a_resume_from_them_restores_the_model_exactly
def test_checkpoints_to_s3_and_resume_matches_an_uninterrupted_run(tmp_path, datasets, s3_endpoint):
    """A run checkpoints to a real S3 endpoint (moto on loopback); a second run resumes from it.

    1 server / 1 worker / 1 thread makes training repeatable, so the resumed run's test metrics match the
    uninterrupted run's closely; what differs is the dense optimizer's moments, which a resume restarts.
    """
    data_dir, _ = datasets[1]
    s3 = dict(checkpoint={"uri": s3_endpoint})
    straight = launch_ps_job(_config(tmp_path / "a", epochs=2, **s3), data_dir, tmp_path / "la",
                             echo=lambda line: None)
    straight_metrics = _score(s3_endpoint, straight.checkpoints[-1]["id"], data_dir, tmp_path / "ea")

    uri = s3_endpoint + "-resumed"
    launch_ps_job(_config(tmp_path / "b", epochs=1, checkpoint={"uri": uri}), data_dir, tmp_path / "lb",
                  echo=lambda line: None)
    resumed = launch_ps_job(_config(tmp_path / "b", epochs=2, checkpoint={"uri": uri, "resume": "latest"}),
                            data_dir, tmp_path / "lc", echo=lambda line: None)
    assert resumed.restored_from.resume and [e["epoch"] for e in resumed.epochs] == [2]
    resumed_metrics = _score(uri, resumed.checkpoints[-1]["id"], data_dir, tmp_path / "eb")
    # Measured: uninterrupted runs differ from each other by up to 0.0016 AUC; resumed vs uninterrupted
    # differed by 0.0002 to 0.0052 over the runs seen, so 0.005 was too tight (a CI run showed 0.0052).
    assert resumed_metrics["auc"] == pytest.approx(straight_metrics["auc"], abs=0.01)
    assert len(CheckpointStore(uri).committed()) == 2
    _assert_no_secret_in(tmp_path)


def _assert_no_secret_in(root):
    """Credentials come from the environment only: they reach no log, no job spec, no checkpoint file."""
    for path in root.rglob("*"):
        if path.is_file() and path.stat().st_size < 50 << 20:
            assert FAKE_SECRET.encode() not in path.read_bytes(), path


def test_checkpoints_to_s3_and_a_resume_from_them_restores_the_model_exactly(tmp_path, datasets, s3_endpoint):
    """The fast twin of the test above (two jobs, not three): pass 1 checkpoints to a real S3 endpoint (moto on
    loopback) and a second run resumes from it with learning rates so small that training cannot move the model
    (in batches of 1,024: a sixteenth of the steps), so its own checkpoint must score exactly like pass 1's."""
    data_dir, _ = datasets[1]
    first = launch_ps_job(_config(tmp_path / "a", epochs=1, checkpoint={"uri": s3_endpoint}), data_dir,
                          tmp_path / "la", echo=lambda line: None)
    (pass1,) = [c["id"] for c in first.checkpoints]
    frozen = _config(tmp_path / "b", epochs=2, batch_size=1024, checkpoint={"uri": s3_endpoint, "resume": "latest"},
                     model={"learning_rate": 1e-12}, table={"learning_rate": 1e-12})
    resumed = launch_ps_job(frozen, data_dir, tmp_path / "lb", echo=lambda line: None)
    assert resumed.restored_from == RestoreTarget(s3_endpoint, pass1, resume=True, shard_num=8)
    assert [e["epoch"] for e in resumed.epochs] == [2]  # pass 1 is not trained twice
    assert CheckpointStore(s3_endpoint).committed() == [pass1, resumed.checkpoints[-1]["id"]]
    before = _score(s3_endpoint, pass1, data_dir, tmp_path / "ea")
    after = _score(s3_endpoint, resumed.checkpoints[-1]["id"], data_dir, tmp_path / "eb")
    assert after["auc"] == pytest.approx(before["auc"], abs=1e-6)
    assert after["logloss"] == pytest.approx(before["logloss"], abs=1e-6)
    _assert_no_secret_in(tmp_path)


def test_timed_checkpoints_inside_a_pass_and_resume_there(tmp_path, small_datasets):
    """every_minutes: checkpoints fall between chunks of a pass; resuming from one trains only the rest."""
    data_dir, stats = small_datasets[2]
    timed = {"every_minutes": 1e-6, "chunk_batches": 31, "keep_last": 10}  # due after every chunk
    result = launch_ps_job(_config(tmp_path, servers=1, workers=2, epochs=1, checkpoint=timed), data_dir,
                           tmp_path / "l1", echo=lambda line: None)
    # 8k rows per worker in chunks of 31 x 64 rows: 4 chunks, a timed checkpoint between each, one at the end.
    assert [c["chunk"] for c in result.checkpoints] == [1, 2, 3, 0]
    mid = result.checkpoints[1]["id"]  # after chunk 2: chunks 3 and 4 are left
    done = parse_id(mid)[1]
    assert 0 < done < stats["rows"]["train"]
    rerun = launch_ps_job(_config(tmp_path, servers=1, workers=2, epochs=1,
                                  checkpoint={**timed, "every_minutes": 0, "resume": mid}),
                          data_dir, tmp_path / "l2", echo=lambda line: None)
    assert rerun.restored_from.id == mid
    # Only the chunks after the checkpoint were trained: nothing twice, nothing skipped.
    assert rerun.epochs[0]["epoch"] == 1 and rerun.epochs[0]["examples"] + done == stats["rows"]["train"]


def test_scores_through_the_servers_equal_one_process_and_create_no_row(tmp_path, datasets, async_two_by_two):
    """Every worker scores its share of the test split through the servers at each checkpoint; the merged metrics
    equal those of one process scoring the whole split with the checkpoint's own rows (its table files) and dense
    parameters. The scoring only pulls: ids seen only in the scored splits never get a row on the servers."""
    data_dir, stats = datasets[2]
    cfg, result, _, _ = async_two_by_two  # 2 servers, 2 workers, 2 passes
    assert [c["epoch"] for c in result.checkpoints] == [1, 2]
    store, schema = CheckpointStore(cfg.checkpoint.uri), Schema.from_dict(stats["schema"])
    labels, dense, sparse = read_test_split(data_dir, schema)
    for event in result.checkpoints:
        local = store.download(event["id"], tmp_path / event["id"])
        meta = json.loads((local / ckpt_io.MODEL_META).read_text())
        ids, rows = read_sparse_table(local / meta["sparse_table"], cfg.table.rule, cfg.table.embedding_dim)
        with np.load(local / ckpt_io.EXPORT / ckpt_io.DENSE_FILE) as saved:
            params = {name: saved[name] for name in saved.files}
        one_process = Scorer(ckpt_io.Checkpoint(meta=meta, ids=ids, rows=rows, dense=params))
        expected = binary_metrics(labels, one_process.predict(dense, sparse))
        merged = binary_metrics_counts(ckpt_io.load_scores(local, ckpt_io.TEST))
        assert merged["count"] == expected["count"] == stats["rows"]["test"]
        assert merged["auc"] == pytest.approx(expected["auc"], abs=1e-4)
        assert merged["logloss"] == pytest.approx(expected["logloss"], abs=1e-4)
        assert event["rows"] == len(ids) == meta["rows"] and sum(event["servers"]["rows"]) == len(ids)
    _, _, train_sparse = read_shards([data_dir / rel for rel in stats["shards"]["train"]], schema)
    trained = np.unique(np.concatenate([slot.values for slot in train_sparse]))
    scored = np.unique(np.concatenate([slot.values for slot in sparse]))
    assert np.setdiff1d(scored, trained).size > 0  # the test split holds ids training never saw
    # The last checkpoint was saved after the first one's scoring: it holds no row training did not create.
    assert np.isin(ids, trained).all()


def test_eviction_removes_the_rows_not_trained_since_the_last_checkpoint(tmp_path, small_datasets):
    """table.eviction with delete_after_unseen_days=0: each save ages every row, training resets it, and the
    shrink before the next save evicts the rest, so a checkpoint holds exactly the ids its chunk trained."""
    data_dir, stats = small_datasets[1]
    timed = {"every_minutes": 1e-6, "chunk_batches": 80, "keep_last": 10}  # a checkpoint after every chunk
    cfg = _config(tmp_path, epochs=1, checkpoint=timed,
                  table={"eviction": {"enabled": True, "delete_after_unseen_days": 0}})
    lines = []
    result = launch_ps_job(cfg, data_dir, tmp_path / "logs", echo=lines.append)
    assert len(result.checkpoints) == 3  # 16k rows in chunks of 80 x 64
    schema = Schema.from_dict(stats["schema"])
    chunk_files = sorted((tmp_path / "logs" / "work" / "worker-0" / "chunks-80").glob("chunk-*.txt"))
    store = CheckpointStore(cfg.checkpoint.uri)
    saved = []
    for n, event in enumerate(result.checkpoints):
        local = store.download(event["id"], tmp_path / f"c{n}")
        saved.append(read_sparse_table(local / ckpt_io.TABLES / "000", cfg.table.rule,
                                               cfg.table.embedding_dim)[0])
    for n in (1, 2):
        _, _, sparse = read_shards([chunk_files[n]], schema)
        trained = np.unique(np.concatenate([slot.values for slot in sparse]))
        assert np.array_equal(np.sort(saved[n]), trained), n
        evicted = np.setdiff1d(saved[n - 1], saved[n])
        assert evicted.size > 0 and result.checkpoints[n]["evicted"] == evicted.size
        assert any(f"({evicted.size:,} rows evicted since the last checkpoint)" in line for line in lines)
    assert result.checkpoints[0].get("evicted") is None  # nothing to compare the first with


@needs_criteo
@pytest.mark.parametrize("model", ["wide_deep", "deepfm", "dcn"])  # dnn: the pipeline's test on the same samples
def test_the_real_criteo_samples_run_through_every_model(tmp_path, model):
    from components.data_prep.prepare import prepare_files

    data_dir = tmp_path / "data"
    stats = prepare_files(data_dir, uri=str(CRITEO / "raw_criteo_sample.tsv"), fmt="raw", test_fraction=0.3,
                          valid_fraction=0.2, num_shards=1, vocab_size=1 << 20, seed=0, max_malformed_fraction=0.0)
    # With both regularizers: their ops must build inside the PS program of every model.
    cfg = _config(tmp_path, epochs=1, model={"name": model, "embedding_l2": 1e-4, "dropout": 0.2})
    result = launch_ps_job(cfg, data_dir, tmp_path / "logs", echo=lambda line: None)
    assert result.checkpoints[-1]["validation"]["count"] == stats["rows"]["valid"]
    metrics = _score(cfg.checkpoint.uri, result.checkpoints[-1]["id"], data_dir, tmp_path / "eval")
    assert metrics["count"] == stats["rows"]["test"] and 0 < metrics["auc"] < 1


@pytest.mark.slow
def test_a_save_longer_than_the_stall_timeout_does_not_fail_the_job(tmp_path):
    """Millions of rows on one server, a stall timeout of five seconds: the checkpoint's save takes longer than that,
    every worker waits in it, and the server's sidecar reports the rows written, so the watchdog sees work, not a
    hang. (The watchdog's rule alone, in tests/train/test_job.py, is this test's fast twin.)"""
    from components.data_prep.prepare import prepare_files

    rng = np.random.default_rng(0)
    rows, tsv = 150_000, tmp_path / "tail.tsv"
    with open(tsv, "w") as out:  # every categorical value seen once: 26 new ids per row
        for label, counts, values in zip(rng.integers(0, 2, rows), rng.integers(0, 50, (rows, 13)),
                                         rng.integers(1 << 62, size=(rows, 26))):
            out.write("\t".join([str(label), *map(str, counts), *(f"{v:016x}" for v in values)]) + "\n")
    stats = prepare_files(tmp_path / "data", uri=str(tsv), fmt="raw", test_fraction=0.05, valid_fraction=0.05,
                          num_shards=1, vocab_size=1 << 40, seed=0, max_malformed_fraction=0.0)
    # Five seconds, not less: a server is silent for a second or two while it builds its tables at start.
    cfg = _config(tmp_path, epochs=1, batch_size=1024, progress_period_s=1.0, stall_timeout_s=5.0)
    lines = []
    result = launch_ps_job(cfg, tmp_path / "data", tmp_path / "logs", echo=lines.append)
    (event,) = result.checkpoints
    assert event["rows"] > 3_000_000 and sum(stats["distinct_ids"].values()) > 3_000_000
    assert event["seconds"]["save_s"] > 2 * cfg.ps.stall_timeout_s, event["seconds"]  # the premise: a long save
    assert any(line.startswith("[server 0] saving: ") for line in lines)
