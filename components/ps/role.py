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
from typing import Callable, Optional

import numpy as np

from components.checkpoint import format as checkpoint
from components.checkpoint import protocol
from components.checkpoint.restore import restore_dense, resume_state, server_restore_dir
from components.checkpoint.store import CheckpointStore, StoreRefused
from components.config import ConfigError, CtrConfig, Mode, PipelineRunner
from components.data_prep.multislot import Schema
from components.networks import models
from components.networks.baseline_handoff import FAILED_GRACE_S, BaselineUnavailable, wait_for_baseline
from components.ps.checkpointing import Checkpointer
from components.days import day_of
from components.ps.contract import (CONFIG_ERROR_EXIT, DONE, EPOCH, PROGRESS, STORE_REFUSED_EXIT, STORE_REFUSED_PREFIX,
                                    JobPlan, JobSpec, emit, wait_until_listening)
from components.ps.liveness import (Heartbeat, HeartbeatRecord, children_die_with_this_process, die_with_parent,
                                    parent_from_env)
from components.networks.models import EMBEDDING_TABLE
from components.storage import Storage
from components.ps.job_inputs import load_job
from components.ps.network import bind_to_own_host, pin_addresses
from components.ps.strategy import (build_strategy, dense_optimizer, install_ps_desc_settings, load_dense_tables,
                                    rpc_gflags, server_flags)
from components.ps.trainer_status import TrainerStatusReporter, progress_publisher
from components.ps.validation import Validator


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


def build_train_program(cfg: CtrConfig, plan: JobPlan, stats: dict, paddle) -> TrainProgram:
    """The training program of the job's ``plan`` (its table's shard count) over the dataset of ``stats`` (its
    ``stats.json``: the schema, the base rate the output bias starts at)."""
    import paddle.distributed.fleet as fleet

    feeds = models.create_feeds(Schema.from_dict(stats["schema"]))
    dim = cfg.table.embedding_dim
    attr = paddle.ParamAttr(name=EMBEDDING_TABLE)
    if cfg.ps.mode is Mode.geo:
        # Geo workers send the deltas of a dense local copy (an embedding, not a sparse_embedding), which carry no
        # show or click: eviction and admission do not apply to its servers' MemorySparseGeoTable.
        def lookup(slot):
            return paddle.static.nn.embedding(slot, size=[cfg.table.vocab_size, dim], is_sparse=True, param_attr=attr)
    else:
        entry = models.push_counts(feeds).entry()  # each id's show and click, for eviction and admission

        def lookup(slot):
            return paddle.static.nn.sparse_embedding(slot, size=[cfg.table.vocab_size, dim], param_attr=attr,
                                                     entry=entry)
    network = models.net(cfg.model, feeds, lookup, dim, training=True, initial_logit=models.base_rate_logit(stats))
    heads = models.heads(network, feeds, cfg.model.embedding_l2)
    # An exponential average of the batch loss, persistable so the progress thread can read it. It starts at 0, so
    # it is divided by the same average of a constant 1 (Adam's bias correction): early reports are not too low.
    running_loss = paddle.static.create_global_var([1], 0.0, "float32", persistable=True, name="running_loss")
    running_loss_weight = paddle.static.create_global_var([1], 0.0, "float32", persistable=True,
                                                          name="running_loss_weight")
    paddle.assign(0.98 * running_loss + 0.02 * heads.loss, running_loss)
    paddle.assign(0.98 * running_loss_weight + 0.02, running_loss_weight)
    optimizer = fleet.distributed_optimizer(dense_optimizer(cfg), build_strategy(cfg, plan.shard_num))
    optimizer.minimize(heads.loss)
    return TrainProgram(feeds, heads, running_loss, running_loss_weight)


def auc_from_stats(pos: np.ndarray, neg: np.ndarray) -> float:
    """AUC from the auc op's bucket counts (bucket index grows with the prediction)."""
    pos, neg = pos.ravel().astype(np.float64), neg.ravel().astype(np.float64)
    neg_below = np.cumsum(neg) - neg
    total = pos.sum() * neg.sum()
    return float(((neg_below + neg / 2) * pos).sum() / total) if total else float("nan")


def check_worker_device(cfg: CtrConfig) -> None:
    """:func:`worker_place`'s check, run where the workers will run before they start (a local run's driver)."""
    import paddle

    worker_place(cfg, paddle)


def worker_place(cfg: CtrConfig, paddle):
    """The GPU when the worker pods are given one (cluster.workers.gpus), else the CPU; ConfigError (the role exits
    78, which Kubernetes does not restart) when the build of Paddle and the GPUs this process sees cannot train.

    A GPU build with no visible GPU is refused whatever the config says: the paddlepaddle-gpu 2.6.2 wheel segfaults
    in ``HogwildWorker::CreateDeviceResource`` at the first ``train_from_dataset`` (Paddle#76762)."""
    gpu_build = paddle.device.is_compiled_with_cuda()
    visible = paddle.device.cuda.device_count() if gpu_build else 0
    if gpu_build and not visible:
        raise ConfigError("cluster.workers.gpus", cfg.cluster.workers.gpus, "a GPU this worker can see with a GPU "
                          "build of Paddle", f"this Paddle {paddle.__version__} is a GPU build and sees no GPU "
                          f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}); it would crash at the "
                          "first batch (Paddle#76762): give the worker pods a GPU, or run them on the CPU image")
    if cfg.cluster.workers.gpus <= 0:
        return paddle.CPUPlace()
    if not gpu_build:
        raise ConfigError("cluster.workers.gpus", cfg.cluster.workers.gpus, "0 with a CPU build of Paddle",
                          f"this Paddle {paddle.__version__} is a CPU build: run workers on the GPU image "
                          "(paddlepaddle-gpu) or set cluster.workers.gpus=0")
    return paddle.CUDAPlace(0)  # the device plugin exposes the pod's GPUs from index 0


class Worker:
    def __init__(self, cfg: CtrConfig, job: JobSpec, stats: dict, program: TrainProgram, paddle):
        """``stats``: the job's dataset's ``stats.json``, as :func:`main` read it."""
        import paddle.distributed.fleet as fleet

        self.cfg, self.job, self.program, self.paddle, self.fleet = cfg, job, program, paddle, fleet
        self.index, self.count = fleet.worker_index(), fleet.worker_num()
        self.scope = paddle.static.global_scope()
        self.place = worker_place(cfg, paddle)
        self.exe = paddle.static.Executor(self.place)
        data_dir = Path(job.data_dir)
        self.stats = stats
        self.shards = [str(data_dir / p) for p in self.stats["shards"]["train"]][self.index::self.count]
        shard_rows = self.stats["shard_rows"]["train"]
        self.rows_per_worker = [sum(shard_rows[w::self.count]) for w in range(self.count)]
        self.workdir = Path(job.workdir)
        self.in_pass: Optional[tuple[int, float]] = None  # (epoch, when it started) while a pass trains
        self._chunk_files: dict[int, list[list[str]]] = {}  # batches per chunk -> the chunk files
        # Worker 0 on a Kubeflow Trainer pod also shows its progress in the TrainJob's status.
        reporter = TrainerStatusReporter.from_env() if self.index == 0 else None
        self.heartbeat = Heartbeat("worker", self.index, cfg.ps.progress_period_s, progress=self._progress,
                                   publish=progress_publisher(reporter, cfg.ps.epochs) if reporter else None,
                                   record=HeartbeatRecord.from_env(cfg.checkpoint.uri, "worker", self.index))

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

    def _baseline(self, kept: dict) -> Callable[[], Optional[dict]]:
        """What gives the baseline's parameters a model that blends it in (``model.blend_baseline``) scores with:
        the job's fit (a day's job: the day's own regression, while the network continues from yesterday's), else
        ``kept``, those of the checkpoint it starts from. A fit published beside the job (``baseline_beside``) is
        waited for when it is asked for."""
        if not models.baseline_features(self.cfg):
            return lambda: None
        if self.job.baseline_beside:
            # Only Kubeflow retries the fit-baseline step, whose retry may yet publish it.
            retried = self.cfg.cluster.runner is PipelineRunner.kubeflow and self.cfg.cluster.step_retries
            grace = FAILED_GRACE_S if retried else 0.0
            return lambda: models.baseline_values(str(wait_for_baseline(Storage(self.job.baseline),
                                                                        self.workdir / "baseline", grace)))
        if self.job.baseline:
            values = models.baseline_values(self.job.baseline)
            return lambda: values
        if not kept:
            raise ConfigError("model.blend_baseline", True, "false for a job given no fitted baseline",
                              "the train step fits it (or takes the pipeline's fit-baseline step's)")
        return lambda: kept

    def train(self) -> list[dict]:
        fleet = self.fleet
        restore = self.job.restore
        source = CheckpointStore(restore.uri) if restore else None
        day = day_of(self.cfg)
        state = resume_state(source, restore, day)
        self.heartbeat.start()
        self.exe.run(self.paddle.static.default_startup_program())
        # Worker 0 restores the dense parameters; a model that blends the baseline in needs the checkpoint's on
        # every worker.
        restored = (restore_dense(source, restore.id, self.workdir)
                    if restore and (self.index == 0 or models.baseline_features(self.cfg)) else {})
        kept_baseline = {name: restored[name] for name in models.BASELINE_PARAMETERS if name in restored}
        if restore and self.index == 0:
            # init_worker pushes worker 0's dense parameters to the servers: restore them first.
            for name, value in restored.items():
                if name not in models.BASELINE_PARAMETERS:  # the scoring program's, not the training program's
                    self.scope.find_var(name).get_tensor().set(value, self.place)
        wait_until_listening(os.environ["PADDLE_PSERVERS_IP_PORT_LIST"].split(","), self.cfg.ps.startup_timeout_s)
        with self.heartbeat.waiting():
            fleet.init_worker()
        self._barrier()
        history = list(state["history"])
        self.last_checkpoint = time.time()
        # Every worker scores its share of each checkpoint and follows worker 0's early-stopping decision.
        self.validating = bool(self.stats["rows"].get("valid"))
        validator = Validator.of(self.cfg, self.stats, state) if self.validating and self.index == 0 else None
        self.checkpointer = Checkpointer(self.cfg, self.job, self.stats, fleet, self.paddle, self.exe, self.scope,
                                         self.place, self.heartbeat, self._barrier, self._all_reduce, validator,
                                         aged=bool(state.get("aged")), baseline=self._baseline(kept_baseline),
                                         restored_baseline=kept_baseline)
        if state.get("new_day") and restore is not None:
            # The next-day metric: the model as the day before delivered it, on every row of this day, before any
            # training on them (the scoring program only pulls: no row of the day is created or trained).
            self.checkpointer.score_day(day, source, restore.id, self.shards)
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
        elapsed = max(time.time() - started, 1e-9)
        return dict(role="worker", index=self.index, epoch=epoch, examples=int(seen), examples_per_s=seen / elapsed,
                    loss=loss, auc=auc_from_stats(pos, neg), pass_examples=self.rows_per_worker[self.index],
                    pass_seconds=elapsed)

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
        """All workers together (:class:`components.ps.checkpointing.Checkpointer`). True when the validation says
        to stop (:mod:`components.ps.validation`).

        ``chunk`` > 0: taken inside pass ``epoch`` after that many of its ``chunks_in_pass`` chunks.
        """
        # Examples trained so far, this pass's part summed over the workers' AUC counters.
        pos, neg = (self._tensor(v) for v in self.program.heads.auc_stats)
        in_pass = self._all_reduce(np.array([pos.sum() + neg.sum()]), "sum").ravel()[0]
        examples = sum(h["examples"] for h in history) + (int(in_pass) if chunk else 0)
        verdict = self.checkpointer.take(epoch, chunk, chunks_in_pass, history, examples)
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
        self.heartbeat.done()
        emit(DONE, role="worker", index=self.index)


def main(job_path: Optional[str]) -> None:
    # Nothing of a job outlives its launcher, even one killed outright: not this process, not what Paddle forks.
    die_with_parent(parent_from_env())
    children_die_with_this_process()
    job, cfg = load_job(job_path)
    stats = json.loads((Path(job.data_dir) / "stats.json").read_text())
    paddle = import_paddle()
    import paddle.distributed.fleet as fleet
    from paddle.distributed.fleet.base.role_maker import PaddleCloudRoleMaker

    pin_addresses(os.environ, cfg.ps.startup_timeout_s)
    bind_to_own_host()
    install_ps_desc_settings(rpc_gflags(cfg))
    role_maker = PaddleCloudRoleMaker(is_collective=False)
    # Paddle waits an hour for every process to join the gloo rendezvous: a job one of whose roles never came up
    # fails within ps.startup_timeout_s instead. Its barriers keep Paddle's bound (days): a worker may wait a whole
    # pass for a slower one; the launchers' stall rule bounds them (components.train.liveness).
    role_maker._gloo._init_timeout_seconds = int(cfg.ps.startup_timeout_s)
    fleet.init(role_maker)
    program = build_train_program(cfg, job.plan, stats, paddle)
    if fleet.is_server():
        serve(cfg, job, fleet, paddle)
        return
    worker = Worker(cfg, job, stats, program, paddle)
    worker.train()
    worker.finish()


def serve(cfg: CtrConfig, job: JobSpec, fleet, paddle) -> None:
    """A server: load its part of the restored tables (if any), then serve until worker 0 stops it."""
    index = fleet.server_index()
    paddle.set_flags(server_flags(cfg, Path(job.workdir)))
    if job.restore:  # the servers load the sparse tables; worker 0 restores the dense ones
        started = time.time()
        tables = server_restore_dir(CheckpointStore(job.restore.uri), job.restore.id, Path(job.workdir))
        downloaded = time.time()
        fleet.init_server(str(tables))
        if job.restore.resume:  # its own run's checkpoint: the dense optimizer continues too
            load_dense_tables(fleet, str(tables))
        # What a restore costs, per server: the launcher reports it (rows/s per server: a plan's restore time).
        emit(PROGRESS, role="server", index=index, state="restored", download_s=round(downloaded - started, 3),
             load_s=round(time.time() - downloaded, 3))
    else:
        fleet.init_server()
    # run_server() holds the GIL until the job ends (measured: a thread started here never runs while it serves), so
    # the sidecar that uploads this server's shards and reports it alive is a process of its own; it dies with this one.
    uploader = subprocess.Popen([sys.executable, "-m", "components.ps.shard_uploader",
                                 "--store", cfg.checkpoint.uri, "--server", str(index), "--parent-pid", str(os.getpid()),
                                 "--endpoint", f"{os.environ['POD_IP']}:{os.environ['PADDLE_PORT']}",
                                 "--report-every", str(cfg.ps.progress_period_s), "--workdir", job.workdir])
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
    except BaselineUnavailable as err:  # no restart brings it: the job fails as on a configuration error
        print(f"baseline unavailable: {err}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(CONFIG_ERROR_EXIT)  # not sys.exit: the worker's client is running (below)
    except StoreRefused as err:
        print(f"{STORE_REFUSED_PREFIX}{err}", flush=True)
        sys.stderr.flush()
        os._exit(STORE_REFUSED_EXIT)  # not sys.exit: Paddle's client threads crash a normal teardown (below)
    except BaseException:  # noqa: BLE001 - reported, then the process ends either way
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        # Not a normal exit: with a worker's client still running, Paddle's threads crash the interpreter's
        # teardown (SIGSEGV in BrpcPsClient::PushSparseTaskConsume, seen after a store error), and the launcher
        # would report that instead of this error.
        os._exit(1)
