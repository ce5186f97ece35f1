"""Entry point of one PS process: ``python -m components.ps.role [JOB_JSON]`` (else ``$PS_JOB_SPEC``).

The role comes from the environment and the job spec of :mod:`components.ps.contract`. A server (optionally loading
a checkpoint's tables) serves its shard of the tables until worker 0 stops it; its sidecar uploads the
shards it saves. A worker trains its data shards through Paddle's C++ data path (``QueueDataset`` +
``train_from_dataset``) and, with the others, commits a checkpoint after every ``checkpoint.every_passes``
passes (:mod:`components.checkpoint.protocol`). The job ends on purpose: every worker stops its client,
then worker 0 stops the servers.

It reports through the contract's events (:func:`components.ps.contract.emit`). A job spec, config or environment
that cannot work ends the process with :data:`components.ps.contract.CONFIG_ERROR_EXIT` and a one-line reason on
stderr: restarting the job cannot mend it, so the launchers fail the job at once.
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
from omegaconf.errors import OmegaConfBaseException

from components.checkpoint import format as checkpoint
from components.checkpoint import protocol
from components.checkpoint.restore import restart_target, restore_dense, resume_state, server_restore_dir
from components.checkpoint.store import CheckpointStore, make_id
from components.config import ConfigError, CtrConfig, Mode, from_dict, validate
from components.data_prep.multislot import Schema, read_shards
from components.ps import models
from components.ps.accessor import read_sparse_table
from components.ps.contract import (CHECKPOINT, CONFIG_ERROR_EXIT, DONE, EPOCH, PROGRESS, RESTART_ENV, SPEC_ENV,
                                    JobSpec, emit, wait_until_listening)
from components.ps.liveness import Heartbeat, children_die_with_this_process, die_with_parent, parent_from_env
from components.ps.models import EMBEDDING_TABLE
from components.ps.network import bind_to_own_host
from components.ps.shard_uploader import collect_shards
from components.ps.sharding import rows_per_server, saved_bytes_per_server
from components.ps.strategy import (build_strategy, dense_optimizer, install_rpc_gflags, rpc_gflags, server_flags,
                                    table_save_mode)
from components.ps.validation import Validator

PULL_BATCH = 1 << 16  # ids per request when a worker pulls rows from the servers for a checkpoint


def import_paddle():
    """Paddle in static mode, with its ``proto`` package ahead of proto-plus's.

    kfp depends on proto-plus, whose top-level ``proto`` package shadows the one Paddle's trainer imports
    with ``from proto import trainer_desc_pb2``. PS processes never import kfp, so aliasing is safe here.
    """
    import paddle

    paddle_proto = importlib.import_module("paddle.base.proto")
    importlib.import_module("paddle.base.proto.trainer_desc_pb2")
    sys.modules["proto"] = paddle_proto
    paddle.enable_static()
    return paddle


@dataclass
class TrainProgram:
    feeds: models.Feeds
    heads: models.Heads
    running_loss: object
    running_loss_weight: object  # the same average of a constant 1: running_loss / it is unbiased from batch one


def build_train_program(cfg: CtrConfig, schema: Schema, paddle) -> TrainProgram:
    import paddle.distributed.fleet as fleet

    feeds = models.create_feeds(schema)
    dim = cfg.table.embedding_dim
    attr = paddle.ParamAttr(name=EMBEDDING_TABLE)
    if cfg.ps.mode is Mode.geo:
        def lookup(slot):
            return paddle.static.nn.embedding(slot, size=[cfg.table.vocab_size, dim], is_sparse=True, param_attr=attr)
    else:
        def lookup(slot):
            return paddle.static.nn.sparse_embedding(slot, size=[cfg.table.vocab_size, dim], param_attr=attr)
    heads = models.heads(models.net(cfg.model, feeds, lookup, dim, training=True), feeds.label, cfg.model.embedding_l2)
    # An exponential average of the batch loss, persistable so the progress thread can read it. It starts at 0, so
    # it is divided by the same average of a constant 1 (Adam's bias correction): early reports are not too low.
    running_loss = paddle.static.create_global_var([1], 0.0, "float32", persistable=True, name="running_loss")
    running_loss_weight = paddle.static.create_global_var([1], 0.0, "float32", persistable=True,
                                                          name="running_loss_weight")
    paddle.assign(0.98 * running_loss + 0.02 * heads.loss, running_loss)
    paddle.assign(0.98 * running_loss_weight + 0.02, running_loss_weight)
    optimizer = fleet.distributed_optimizer(dense_optimizer(cfg), build_strategy(cfg))
    optimizer.minimize(heads.loss)
    return TrainProgram(feeds, heads, running_loss, running_loss_weight)


def auc_from_stats(pos: np.ndarray, neg: np.ndarray) -> float:
    """AUC from the auc op's bucket counts (bucket index grows with the prediction)."""
    pos, neg = pos.ravel().astype(np.float64), neg.ravel().astype(np.float64)
    neg_below = np.cumsum(neg) - neg
    total = pos.sum() * neg.sum()
    return float(((neg_below + neg / 2) * pos).sum() / total) if total else float("nan")


def worker_place(cfg: CtrConfig, paddle):
    """The GPU when the worker pods are given one (cluster.workers.gpus), else the CPU."""
    if cfg.cluster.workers.gpus <= 0:
        return paddle.CPUPlace()
    if not paddle.device.is_compiled_with_cuda():
        raise ConfigError("cluster.workers.gpus", cfg.cluster.workers.gpus, "0 with a CPU build of Paddle",
                          f"this Paddle {paddle.__version__} is a CPU build: run workers on the GPU image "
                          "(paddlepaddle-gpu) or set cluster.workers.gpus=0")
    return paddle.CUDAPlace(0)  # the device plugin exposes the pod's GPUs from index 0


class Worker:
    def __init__(self, cfg: CtrConfig, job: JobSpec, program: TrainProgram, paddle):
        import paddle.distributed.fleet as fleet

        self.cfg, self.job, self.program, self.paddle, self.fleet = cfg, job, program, paddle, fleet
        self.index, self.count = fleet.worker_index(), fleet.worker_num()
        self.scope = paddle.static.global_scope()
        self.place = worker_place(cfg, paddle)
        self.exe = paddle.static.Executor(self.place)
        data_dir = Path(job.data_dir)
        self.stats = json.loads((data_dir / "stats.json").read_text())
        self.shards = [str(data_dir / p) for p in self.stats["shards"]["train"]][self.index::self.count]
        shard_rows = self.stats["shard_rows"]["train"]
        self.rows_per_worker = [sum(shard_rows[w::self.count]) for w in range(self.count)]
        self.workdir = Path(job.workdir)
        self.store = CheckpointStore(cfg.checkpoint.uri, retries=protocol.JOB_STORE_RETRIES)
        self.in_pass: Optional[tuple[int, float]] = None  # (epoch, when it started) while a pass trains
        self._chunk_files: dict[int, list[list[str]]] = {}  # batches per chunk -> the chunk files
        self.heartbeat = Heartbeat("worker", self.index, cfg.ps.progress_period_s, progress=self._progress)
        self._pull = None  # the program that pulls rows from the servers, once built
        # Eviction: the ids of the previous checkpoint's export, to count the rows evicted since.
        self.exported_ids: Optional[np.ndarray] = None
        self.evicted: Optional[int] = None

    # -- training -------------------------------------------------------------------------------
    def _tensor(self, var) -> np.ndarray:
        return np.array(self.scope.find_var(var.name).get_tensor())

    def _reset_auc(self) -> None:
        for var in self.program.heads.auc_stats:
            tensor = self.scope.find_var(var.name).get_tensor()
            tensor.set(np.zeros_like(np.array(tensor)), self.place)

    def _dataset(self, files: list[str]):
        dataset = self.paddle.distributed.QueueDataset()
        dataset.init(use_var=self.program.feeds.in_order(), pipe_command="cat",
                     batch_size=self.cfg.ps.batch_size, thread_num=self.cfg.ps.threads)
        dataset.set_filelist(files)
        return dataset

    def _train(self, files: list[str]) -> None:
        self.exe.train_from_dataset(program=self.paddle.static.default_main_program(), dataset=self._dataset(files))

    def _chunks(self, batches: int) -> list[list[str]]:
        """This worker's data cut into chunks of ``batches`` batches; every worker gets the same count.

        The lines are streamed from the shards into the chunk files (never all in memory), once per process:
        every pass trains the same chunks.
        """
        if batches in self._chunk_files:
            return self._chunk_files[batches]
        chunk_rows = batches * self.cfg.ps.batch_size * self.cfg.ps.threads
        count = max(1, min(self.rows_per_worker) // chunk_rows)
        chunk_dir = self.workdir / f"chunks-{batches}"
        shutil.rmtree(chunk_dir, ignore_errors=True)
        chunk_dir.mkdir(parents=True)
        ends = np.linspace(0, self.rows_per_worker[self.index], count + 1).astype(int)[1:]
        lines = (line for shard in self.shards for line in open(shard))
        files = []
        for c, (start, end) in enumerate(zip([0, *ends[:-1]], ends)):
            path = chunk_dir / f"chunk-{c:05d}.txt"
            with open(path, "w") as out:  # the last chunk takes whatever is left
                out.writelines(lines if c == count - 1 else itertools.islice(lines, end - start))
            files.append([str(path)])
        self._chunk_files[batches] = files
        return files

    def train(self) -> list[dict]:
        fleet = self.fleet
        restore = self.job.restore
        source = CheckpointStore(restore.uri) if restore else None
        state = resume_state(source, restore)
        self.heartbeat.start()
        self.exe.run(self.paddle.static.default_startup_program())
        if restore and self.index == 0:
            # init_worker pushes worker 0's dense parameters to the servers: restore them first.
            for name, value in restore_dense(source, restore.id, self.workdir).items():
                self.scope.find_var(name).get_tensor().set(value, self.place)
        wait_until_listening(os.environ["PADDLE_PSERVERS_IP_PORT_LIST"].split(","), self.cfg.ps.startup_timeout_s)
        with self.heartbeat.waiting():
            fleet.init_worker()
        self._barrier()
        history = list(state["history"])
        self.last_checkpoint = time.time()
        # Every worker follows worker 0's early-stopping decision after each checkpoint; it alone scores them.
        self.validating = bool(self.stats["rows"].get("valid"))
        self.validator = (Validator.of(self.cfg, Path(self.job.data_dir), self.stats, state)
                          if self.validating and self.index == 0 else None)
        for epoch in range(state["epoch"] + 1, self.cfg.ps.epochs + 1):
            self._reset_auc()
            # The heartbeat reports this pass's progress (Paddle's own fetch_handler costs ~3 s per pass to stop:
            # its monitor sleeps holding a lock).
            self.in_pass = (epoch, time.time())
            try:
                done_chunks = state.get("chunk", 0) if epoch == state["epoch"] + 1 else 0
                stopped = self._train_pass(epoch, history, done_chunks, state.get("chunks_in_pass"))
            finally:
                started, self.in_pass = self.in_pass[1], None
            if stopped:
                break
            history.append(self._end_epoch(epoch, started))
            if protocol.should_save(epoch, self.cfg.ps.epochs, self.cfg.checkpoint.every_passes) and \
                    self._checkpoint(epoch, history):
                break
        return history

    def _barrier(self) -> None:
        with self.heartbeat.waiting():
            self.fleet.barrier_worker()

    def _all_reduce(self, value: np.ndarray, op: str) -> np.ndarray:
        with self.heartbeat.waiting():
            return np.asarray(self.fleet.util.all_reduce(value, op))

    def _train_pass(self, epoch: int, history: list[dict], done_chunks: int, planned: Optional[int]) -> bool:
        """One pass: in one go, or in chunks when sync rounds or checkpoints inside it need boundaries; True when
        a checkpoint inside it stopped the job early."""
        sync, timed = self.cfg.ps.mode is Mode.sync, self.cfg.checkpoint.every_minutes > 0
        every = self.cfg.checkpoint.every_batches
        if not (sync or timed or every or done_chunks):
            self._train(self.shards)
            return False
        size = self.cfg.ps.sync_batches if sync else every or self.cfg.checkpoint.chunk_batches
        chunks = self._chunks(size)
        if done_chunks and planned != len(chunks):
            raise checkpoint.CheckpointError(
                f"the checkpoint stopped after chunk {done_chunks} of {planned} in pass {epoch}, but this job cuts "
                f"the pass into {len(chunks)} chunks: resume inside a pass needs the same workers, batch size, "
                "threads and chunk size")
        for c in range(done_chunks, len(chunks)):
            self._train(chunks[c])
            if sync:
                # Every push of a round is flushed to the servers when train_from_dataset returns; the
                # barrier then keeps any worker from starting round r+1 before all of round r is applied.
                self._barrier()
            due = every or (timed and self._checkpoint_due())
            if c < len(chunks) - 1 and due and self._checkpoint(epoch, history, chunk=c + 1, chunks_in_pass=len(chunks)):
                return True
        return False

    def _checkpoint_due(self) -> bool:
        """Every worker takes the same decision: due once any worker's clock says so."""
        elapsed = time.time() - self.last_checkpoint >= 60 * self.cfg.checkpoint.every_minutes
        return bool(self._all_reduce(np.array([int(elapsed)]), "max").ravel()[0])

    def _progress(self) -> Optional[dict]:
        """The pass's progress, from the persistable counters the trainer threads update (None between passes)."""
        if self.in_pass is None:
            return None
        epoch, started = self.in_pass
        pos, neg = (self._tensor(v) for v in self.program.heads.auc_stats)
        seen = float(pos.sum() + neg.sum())
        weight = float(self._tensor(self.program.running_loss_weight).ravel()[0])
        loss = float(self._tensor(self.program.running_loss).ravel()[0]) / weight if weight else None  # no batch yet
        return dict(role="worker", index=self.index, epoch=epoch, examples=int(seen),
                    examples_per_s=seen / max(time.time() - started, 1e-9), loss=loss, auc=auc_from_stats(pos, neg))

    def _end_epoch(self, epoch: int, started: float) -> dict:
        """Global AUC of the pass: every worker's bucket counts summed over gloo."""
        seconds = time.time() - started
        pos, neg = (self._tensor(v) for v in self.program.heads.auc_stats)
        local_examples = float(pos.sum() + neg.sum())
        all_pos = self._all_reduce(pos.ravel(), "sum")
        all_neg = self._all_reduce(neg.ravel(), "sum")
        summary = {"epoch": epoch, "seconds": seconds, "examples": int(all_pos.sum() + all_neg.sum()),
                   "worker_examples_per_s": local_examples / max(seconds, 1e-9),
                   "auc": auc_from_stats(all_pos, all_neg)}
        if self.index == 0:
            emit(EPOCH, **summary)
        return summary

    # -- checkpoints and ending -------------------------------------------------------------------
    def _checkpoint(self, epoch: int, history: list[dict], chunk: int = 0, chunks_in_pass: int = 0) -> bool:
        """All workers together; see :mod:`components.checkpoint.protocol` for the protocol. True when the
        validation says to stop (:mod:`components.ps.validation`).

        ``chunk`` > 0: taken inside pass ``epoch`` after that many of its ``chunks_in_pass`` chunks.
        """
        fleet = self.fleet
        main = self.paddle.static.default_main_program()
        # The servers write their shards where worker 0's save call says: one path for all workers.
        staging = Path(self.job.staging_dir) / f"pass-{epoch:04d}-{chunk:05d}"
        # Examples trained so far, this pass's part summed over the workers' AUC counters.
        pos, neg = (self._tensor(v) for v in self.program.heads.auc_stats)
        in_pass = self._all_reduce(np.array([pos.sum() + neg.sum()]), "sum").ravel()[0]
        examples = sum(h["examples"] for h in history) + (int(in_pass) if chunk else 0)
        from_workers = protocol.rows_from_workers(self.cfg)
        self._barrier()
        with self.heartbeat.waiting():  # every call here ends in a barrier of all workers
            if self.cfg.table.eviction.enabled:
                fleet.shrink()  # worker 0 asks every server to decay and evict; all barrier
            if not from_workers:
                fleet.save_persistables(self.exe, str(staging / checkpoint.TABLES), main,  # worker 0 asks; all barrier
                                        mode=table_save_mode(self.cfg.table))
            # Pulls the servers' dense parameters into every worker's scope.
            fleet.save_dense_params(self.exe, str(self.workdir / "dense.pdparams"), self.scope, main)
        if from_workers:
            ids, rows = self._worker_rows(main)
            protocol.upload_worker_rows(self.store, epoch, self.index, ids, rows, self.workdir)
        self._barrier()
        verdict = None
        if self.index == 0:
            ckpt_id = make_id(epoch, examples)
            server_files = {} if from_workers else collect_shards(
                self.store, ckpt_id, str(staging / checkpoint.TABLES), self.cfg.ps.servers, self.cfg.ps.startup_timeout_s)
            local = self.workdir / f"checkpoint-e{epoch:04d}"
            meta = self._meta(history)
            exported = self._export(local, ckpt_id, epoch, main, meta)
            verdict = self.validator.judge(ckpt_id, exported) if self.validator else None
            if verdict:
                meta.update(validation=verdict.metrics, calibration=verdict.calibration)
            # Resume continues after pass ``epoch``, or inside it after ``chunk`` chunks.
            state = {"epoch": epoch - 1 if chunk else epoch, "chunk": chunk, "chunks_in_pass": chunks_in_pass,
                     "history": history, "examples": examples, "seed": self.cfg.data.seed, "run_id": self.job.run_id,
                     "stopping": self.validator.state() if self.validator else None}
            protocol.commit_checkpoint(self.store, ckpt_id, local, server_files, meta, state,
                                       self.cfg.checkpoint.keep_last, best=bool(verdict and verdict.best))
            emit(CHECKPOINT, id=ckpt_id, epoch=epoch, chunk=chunk, uri=self.store.uri,
                 servers=self._server_load(server_files), evicted=self.evicted,
                 validation=verdict.metrics if verdict else None, best=bool(verdict and verdict.best),
                 stop=bool(verdict and verdict.stop))
        self._barrier()
        self.last_checkpoint = time.time()
        if not self.validating:
            return False
        stop = self.index == 0 and bool(verdict and verdict.stop)
        return bool(self._all_reduce(np.array([int(stop)]), "max").ravel()[0])  # every worker takes worker 0's word

    def finish(self) -> None:
        """Stop on purpose: every worker stops its client, then worker 0 stops the servers."""
        with self.heartbeat.waiting():
            self.fleet.stop_worker()
        self._barrier()
        if self.index == 0:
            self.fleet.fleet._runtime_handle._worker.stop_server()
        self.heartbeat.stop()
        emit(DONE, role="worker", index=self.index)

    def _worker_rows(self, main) -> tuple[np.ndarray, np.ndarray]:
        """Rows for the ids this worker trained, when the servers cannot save the table: geo's local copy,
        else the rows the servers serve."""
        schema = Schema.from_dict(self.stats["schema"])
        _, _, sparse = read_shards(self.shards, schema)
        ids = np.unique(np.concatenate([slot.values for slot in sparse]))
        if self.cfg.ps.mode is Mode.geo:
            return ids, np.array(self.scope.find_var(EMBEDDING_TABLE).get_tensor())[ids]
        program, scope, feed, pulled = self._pull_program(main)
        rows = [self.exe.run(program, feed={feed.name: ids[i:i + PULL_BATCH].reshape(-1, 1).astype(np.int64)},
                             fetch_list=[pulled], scope=scope)[0] for i in range(0, len(ids), PULL_BATCH)]
        return ids, np.concatenate(rows).reshape(len(ids), -1)

    def _pull_program(self, main):
        """The training program's sparse lookup (same table, same attributes) alone in a program, in test
        mode: it returns the rows the servers serve.

        It runs in a scope of its own, where the table variable is a [1, dim] tensor (the lookup reads only
        its width): in the training scope, a pull after the next pass failed ("Variable Id ... is not
        registered"). Built once and kept, since Paddle's executor caches programs by ``id()``.
        """
        if self._pull is None:
            lookup = self._sparse_lookup(main)
            table = main.global_block().var(lookup.input("W")[0])
            program, scope = self.paddle.static.Program(), self.paddle.static.Scope()
            scope.var(table.name).get_tensor().set(np.zeros((1, table.shape[1]), np.float32), self.place)
            block = program.global_block()
            weights = block.create_var(name=table.name, shape=[1, table.shape[1]], dtype=table.dtype, persistable=True)
            feed = block.create_var(name="pull_ids", shape=[-1, 1], dtype="int64")
            pulled = block.create_var(name="pulled_rows", shape=[-1, table.shape[1]], dtype=table.dtype)
            attrs = {name: lookup.attr(name) for name in lookup.attr_names}
            block.append_op(type=lookup.type, inputs={"Ids": [feed], "W": [weights]}, outputs={"Outputs": [pulled]},
                            attrs={**attrs, "is_test": True})
            self._pull = (program, scope, feed, pulled)
        return self._pull

    def _sparse_lookup(self, main):
        for op in main.global_block().ops:
            if op.type == "distributed_lookup_table":
                return op
        raise RuntimeError("no distributed sparse lookup in the training program")

    def _export(self, local: Path, ckpt_id: str, epoch: int, main, meta: dict) -> checkpoint.Checkpoint:
        """Write the checkpoint's export into ``local``; returns it, as evaluation will load it."""
        cfg = self.cfg
        if protocol.rows_from_workers(cfg):
            ids, rows = protocol.merged_worker_rows(self.store, epoch, self.count, local)
        else:
            table = f"{checkpoint.TABLES}/{int(self._sparse_lookup(main).attr('table_id')):03d}"
            table_dir = protocol.fetch_uploaded_table(self.store, ckpt_id, table, self.workdir / "export-table")
            ids, rows = read_sparse_table(table_dir, cfg.table.rule, cfg.table.embedding_dim)
        dense = {p.name: np.array(self.scope.find_var(p.name).get_tensor()) for p in main.all_parameters()
                 if p.name != EMBEDDING_TABLE}
        stored = checkpoint.save_export(local, ids, rows, dense, cfg.checkpoint.export_dtype)
        meta["rows"] = int(len(ids))
        if cfg.table.eviction.enabled:
            if self.exported_ids is not None:
                self.evicted = int(np.setdiff1d(self.exported_ids, ids, assume_unique=True).size)
            self.exported_ids = ids
        # Which server holds each row (geo servers route rows their own way): the checkpoint's load report.
        self.rows_per_server = (None if cfg.ps.mode is Mode.geo
                                else rows_per_server(ids, cfg.table.shard_num, cfg.ps.servers))
        return checkpoint.Checkpoint(meta=meta, ids=ids, rows=stored, dense=dense)

    def _server_load(self, server_files: dict[str, dict]) -> Optional[dict]:
        """Rows per server, and the bytes of the shard files each server saved (none when the rows came from
        the workers)."""
        if self.rows_per_server is None:
            return None
        load = {"rows": self.rows_per_server}
        if server_files:
            load["saved_bytes"] = saved_bytes_per_server(server_files, self.cfg.ps.servers)
        return load

    def _meta(self, history: list[dict]) -> dict:
        full = self.job.config  # the resolved config as a dict: what rebuilds the network
        return {
            "model": full["model"], "table": full["table"], "mode": self.cfg.ps.mode.value,
            "schema": self.stats["schema"], "hash_function": self.stats.get("hash_function"),
            "servers": self.cfg.ps.servers, "workers": self.cfg.ps.workers,
            "paddle_version": self.paddle.__version__, "training": {"epochs": history},
        }


def read_job(job_path: Optional[str]) -> tuple[JobSpec, CtrConfig]:
    """The job spec and its validated config; ConfigError when either cannot work."""
    source = job_path or f"${SPEC_ENV}"
    try:
        job = JobSpec.load(job_path)
        cfg = from_dict(job.config)
    except (KeyError, ValueError, TypeError, OSError, OmegaConfBaseException) as err:
        raise ConfigError(source, f"{type(err).__name__}: {err}".strip(),
                          "a job spec (components.ps.contract.JobSpec) whose config this image's schema reads",
                          "the launcher and the role's image must be of the same version") from err
    validate(cfg, check_storage=False)  # storage is reached below, where its errors are not the config's
    return job, cfg


def load_job(job_path: Optional[str]) -> JobSpec:
    """The job spec, with the dataset on local disk and what to restore from after a restart."""
    job, cfg = read_job(job_path)
    Path(job.workdir).mkdir(parents=True, exist_ok=True)
    data_dir = job.data_dir
    if "://" in data_dir:
        data_dir = str(fetch_dataset(data_dir, Path(job.workdir) / "data"))
    attempt = int(os.environ.get(RESTART_ENV) or 0)
    restore = restart_target(CheckpointStore(cfg.checkpoint.uri), job.restore, attempt, cfg.table.shard_num,
                             job.run_id)
    return dataclasses.replace(job, data_dir=data_dir, restore=restore)


def fetch_dataset(uri: str, local: Path) -> Path:
    """A pod's copy of the prepared dataset: stats.json, for a worker the train shards it reads, and for worker 0
    the validation split too (it scores every checkpoint on it)."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(uri)
    local.mkdir(parents=True, exist_ok=True)
    fs.get(f"{root.rstrip('/')}/stats.json", str(local / "stats.json"))
    if os.environ.get("TRAINING_ROLE") == "TRAINER":
        stats = json.loads((local / "stats.json").read_text())
        index, count = int(os.environ["PADDLE_TRAINER_ID"]), int(os.environ["PADDLE_TRAINERS_NUM"])
        valid = stats["shards"].get("valid", []) if index == 0 else []
        for rel in stats["shards"]["train"][index::count] + valid:
            (local / rel).parent.mkdir(parents=True, exist_ok=True)
            fs.get(f"{root.rstrip('/')}/{rel}", str(local / rel))
    return local


def main(job_path: Optional[str]) -> None:
    # Nothing of a job outlives its launcher, even one killed outright: not this process, not what Paddle forks.
    die_with_parent(parent_from_env())
    children_die_with_this_process()
    job = load_job(job_path)
    cfg = from_dict(job.config)
    schema = Schema.from_dict(json.loads((Path(job.data_dir) / "stats.json").read_text())["schema"])
    paddle = import_paddle()
    import paddle.distributed.fleet as fleet
    from paddle.distributed.fleet.base.role_maker import PaddleCloudRoleMaker

    bind_to_own_host()
    install_rpc_gflags(rpc_gflags(cfg))
    fleet.init(PaddleCloudRoleMaker(is_collective=False))
    program = build_train_program(cfg, schema, paddle)
    if fleet.is_server():
        serve(cfg, job, fleet, paddle)
        return
    worker = Worker(cfg, job, program, paddle)
    worker.train()
    worker.finish()


def serve(cfg: CtrConfig, job: JobSpec, fleet, paddle) -> None:
    """A server: load its part of the restored tables (if any), then serve until worker 0 stops it."""
    index = fleet.server_index()
    paddle.set_flags(server_flags(cfg, Path(job.workdir)))
    if job.restore:  # the servers load the sparse tables; worker 0 restores the dense ones
        source = CheckpointStore(job.restore.uri)
        fleet.init_server(str(server_restore_dir(source, job.restore.id, Path(job.workdir))))
    else:
        fleet.init_server()
    # run_server() holds the GIL until the job ends (measured: a thread started here never runs while it serves), so
    # the sidecar that uploads this server's shards and reports it alive is a process of its own; it dies with this one.
    uploader = subprocess.Popen([sys.executable, "-m", "components.ps.shard_uploader",
                                 "--store", cfg.checkpoint.uri, "--server", str(index), "--parent-pid", str(os.getpid()),
                                 "--endpoint", f"{os.environ['POD_IP']}:{os.environ['PADDLE_PORT']}",
                                 "--report-every", str(cfg.ps.progress_period_s)])
    emit(PROGRESS, role="server", index=index, state="serving")
    try:
        fleet.run_server()  # returns when worker 0 stops the servers
    finally:
        uploader.terminate()
        uploader.wait(10)
    emit(DONE, role="server", index=index)


if __name__ == "__main__":
    try:
        main(sys.argv[1] if len(sys.argv) > 1 else None)
    except ConfigError as err:
        print(f"configuration error: {err}", file=sys.stderr, flush=True)
        sys.exit(CONFIG_ERROR_EXIT)
    except BaseException:  # noqa: BLE001 - reported, then the process ends either way
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        # Not a normal exit: with a worker's client still running, Paddle's threads crash the interpreter's
        # teardown (SIGSEGV in BrpcPsClient::PushSparseTaskConsume, seen after a store error), and the launcher
        # would report that instead of this error.
        os._exit(1)
