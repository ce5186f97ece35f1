"""A worker's part in taking a checkpoint (the protocol: :mod:`components.checkpoint.protocol`).

Every worker calls :meth:`Checkpointer.take` at the same point. The servers save their own shards, in parallel,
while their sidecars report the rows written; every worker pulls the dense parameters and scores its share of the
validation and test splits through the servers; worker 0 merges the scores, judges the checkpoint on the
validation split (:mod:`components.ps.validation`) and commits. No worker holds the table, except where the servers
cannot save it (geo, SSD: :func:`~components.checkpoint.protocol.rows_from_workers`): there each worker uploads the
rows of the ids it trained and worker 0 merges them into the checkpoint's export.

A job training one day of day partitions (:mod:`components.days`) first scores the whole day with the model it
restored (:meth:`Checkpointer.score_day`: the next-day metric), and ages and shrinks the table at its first
checkpoint only, so ``delete_after_unseen_days`` counts days, however many checkpoints a day takes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from components.checkpoint import format as checkpoint
from components.checkpoint import protocol
from components.checkpoint.store import CheckpointStore, make_id
from components.checkpoint.restore import STATE_FILE
from components.config import CtrConfig, Mode
from components.data_prep.multislot import Schema, read_shards
from components.days import day_of
from components.calibration import blended_probability, fit_blend
from components.metrics import ScoreCounts, binary_metrics_counts
from components.networks import models
from components.ps.contract import CHECKPOINT, DAY_EVAL, JobSpec, emit
from components.ps.liveness import Heartbeat
from components.networks.models import EMBEDDING_TABLE
from components.ps.pull_scoring import SPARSE_PULL, PullScorer, split_share
from components.ps.shard_uploader import announce_save, collect_shards
from components.table.sharding import distinct_ids, rows_per_server, saved_bytes_per_server
from components.ps.strategy import table_save_mode
from components.ps.validation import Validator, Verdict

SCORED_SPLITS = (checkpoint.VALID, checkpoint.TEST)  # the splits every worker fetches its share of
DAY_SPLIT = "day"  # a day's every row, scored before training on it


class Checkpointer:
    """What one worker does at every checkpoint. ``barrier`` and ``all_reduce`` are the worker's collectives (they
    tell the heartbeat that the worker waits)."""

    def __init__(self, cfg: CtrConfig, job: JobSpec, stats: dict, fleet: Any, paddle: Any, exe: Any, scope: Any,
                 place: Any, heartbeat: Heartbeat, barrier: Callable[[], None],
                 all_reduce: Callable[[np.ndarray, str], np.ndarray], validator: Optional[Validator],
                 aged: bool = False, baseline: Callable[[], Optional[dict]] = lambda: None,
                 restored_baseline: Optional[dict] = None):
        self.cfg, self.job, self.stats, self.fleet, self.paddle = cfg, job, stats, fleet, paddle
        self.exe, self.scope, self.place, self.heartbeat = exe, scope, place, heartbeat
        self.barrier, self.all_reduce, self.validator = barrier, all_reduce, validator
        self.index, self.count = fleet.worker_index(), fleet.worker_num()
        self.workdir = Path(job.workdir)
        self.store = CheckpointStore(cfg.checkpoint.uri, retries=protocol.JOB_STORE_RETRIES)
        self.schema = Schema.from_dict(stats["schema"])
        self.main = paddle.static.default_main_program()
        # baseline: what gives the parameters of the baseline a model that blends it in scores with
        # (model.blend_baseline), asked once, at the first checkpoint (one fitted beside the job may arrive only
        # then); restored_baseline: the one the checkpoint the job starts from blended in (its day's scoring).
        self._awaited: Optional[Callable[[], Optional[dict]]] = baseline
        self._baseline: Optional[dict] = None
        self.restored_baseline = restored_baseline
        self.scorer = PullScorer(cfg, self.schema, self.main, scope, place, paddle, job.plan.negative_sample_rate)
        # A day's job ages and shrinks the table once (a mid-day resume: its day has been aged already); any other
        # job at every checkpoint.
        self.day = day_of(cfg)
        self.aged = aged
        # The per-group metrics of the evaluation need each test row's prediction, not only their counts.
        self.saves_test_rows = bool(cfg.eval.group_by or cfg.eval.slices)

    @property
    def baseline(self) -> Optional[dict]:
        """The baseline's parameters, waited for on first use (the heartbeat says this worker waits)."""
        if self._awaited is not None:
            with self.heartbeat.waiting():
                self._baseline = self._awaited()
            self._awaited = None
            if self._baseline:
                self.scorer.set_baseline(self._baseline)
        return self._baseline

    def score_day(self, day: str, source: CheckpointStore, restored: str, train_shards: list[str]) -> None:
        """Every worker scores its train shards and its share of the validation and test splits with the restored
        model (through the calibration that checkpoint carries); worker 0 merges the counts and reports them."""
        started = time.time()
        meta = source.read_json(restored, checkpoint.MODEL_META) or {}
        calibration = meta.get("calibration")
        shards = [str(Path(s).relative_to(self.job.data_dir)) for s in train_shards] + [
            rel for split in SCORED_SPLITS for rel in split_share(self.stats, split, self.index, self.count)]
        self.scorer.take_parameters()
        # Yesterday's model with yesterday's regression: nothing fitted on this day (the day's own is set when it is
        # first asked for, at the first checkpoint).
        if self.restored_baseline:
            self.scorer.set_baseline(self.restored_baseline)
        parts = []  # the counts of each shard only: its rows' predictions go as soon as it is scored
        for rel in shards:
            raw, calibrated, _, _ = self.scorer.score(Path(self.job.data_dir), [rel], calibration)
            parts.append(calibrated if calibration else raw)
        counts = ScoreCounts.merge(parts)
        round_key = f"day-{day}"
        protocol.upload_scores(self.store, round_key, DAY_SPLIT, self.index, counts, self.workdir)
        self.barrier()
        if self.index == 0:
            local = self.workdir / round_key
            merged = protocol.merged_scores(self.store, round_key, (DAY_SPLIT,), self.count, local)[DAY_SPLIT]
            protocol.clear_scores(self.store, round_key)
            emit(DAY_EVAL, day=day, checkpoint=restored, calibrated=bool(calibration),
                 previous_day=(source.read_json(restored, STATE_FILE) or {}).get("day"),
                 metrics=binary_metrics_counts(merged), seconds=round(time.time() - started, 3))
        self.barrier()

    def take(self, epoch: int, chunk: int, chunks_in_pass: int, history: list[dict],
             examples: int) -> Optional[Verdict]:
        """Save, score and (worker 0) commit a checkpoint after ``examples`` examples: after pass ``epoch``, or
        inside it after ``chunk`` of its ``chunks_in_pass`` chunks. Returns worker 0's verdict (None on the
        others, or without validation)."""
        fleet, cfg = self.fleet, self.cfg
        # The round's name on every worker (checkpoint ids carry worker 0's clock): the servers' staging path and
        # the workers' scores in the store.
        round_key = f"pass-{epoch:04d}-{chunk:05d}"
        ckpt_id = make_id(epoch, examples) if self.index == 0 else None
        staging = str(Path(self.job.staging_dir) / round_key / checkpoint.TABLES)
        from_workers = protocol.rows_from_workers(cfg)
        timings: dict[str, float] = {}
        # Pushes still queued in this worker's client would reach the servers after the save and the scoring: the
        # checkpoint would not hold what it scored.
        runtime = fleet.fleet._runtime_handle
        runtime._worker.client_flush()
        self.barrier()
        ages = self.day is None or not self.aged
        with self.heartbeat.waiting():  # every call here ends in a barrier of all workers
            if cfg.table.eviction.enabled and ages:
                fleet.shrink()  # worker 0 asks every server to decay and evict; all barrier
            started = time.time()
            if not from_workers:
                if self.index == 0:
                    announce_save(self.store, ckpt_id, staging)
                fleet.save_persistables(self.exe, staging, self.main,
                                        mode=table_save_mode(cfg.table, ages=ages))  # all barrier
            timings["save_s"] = time.time() - started
        self.aged = True
        dense_path = str(self.workdir / "dense.pdparams")
        dense_scope = self.scope
        if cfg.ps.mode is Mode.geo:
            # Geo workers train local copies and exchange deltas of them: a pulled value written into a copy would
            # travel back as a delta (the servers' moves since the last exchange, pushed again). Worker 0 pulls the
            # servers' into a scope of their own for the checkpoint; each scores its own copy.
            dense_scope = self._dense_copy()
            with self.heartbeat.waiting():
                fleet.save_dense_params(self.exe, dense_path, dense_scope, self.main)
        else:
            # Every worker pulls the servers' dense parameters into its scope: what the checkpoint and its scores
            # hold (fleet.save_dense_params pulls them on worker 0 only; the others would score their own copies).
            runtime._ps_save_dense_params(self.exe, dense_path, self.scope, self.main)
            self.barrier()
        if from_workers:
            ids, rows = self._worker_rows()
            protocol.upload_worker_rows(self.store, epoch, self.index, ids, rows, self.workdir)
        local = self.workdir / f"checkpoint-{round_key}"  # worker 0 stages the checkpoint's own files here
        # Asked once the servers saved the tables: a baseline fitted beside the job (on kfp.local, on the same cores)
        # goes on through the save instead of keeping every worker and server idle before it.
        baseline = self.baseline
        started = time.time()
        self.scorer.take_parameters()
        # The test split is scored after the calibration is fitted, by a program that applies it as the served one
        # does: the evaluation's calibrated metrics come from the same float32 arithmetic.
        if baseline:
            calibration, verdict = self._blended_validation(round_key, ckpt_id, local)
        else:
            verdict = self._score_validation(round_key, ckpt_id, local)
            calibration = self._shared_calibration(verdict)
        test_shards = split_share(self.stats, checkpoint.TEST, self.index, self.count)
        raw, calibrated, preds, weights = self.scorer.score(Path(self.job.data_dir), test_shards, calibration)
        protocol.upload_scores(self.store, round_key, checkpoint.TEST, self.index, raw, self.workdir)
        if calibrated is not None:
            protocol.upload_scores(self.store, round_key, checkpoint.TEST_CALIBRATED, self.index, calibrated,
                                   self.workdir)
        if self.saves_test_rows:
            rows_of = dict(zip(self.stats["shards"][checkpoint.TEST], self.stats["shard_rows"][checkpoint.TEST]))
            predictions = checkpoint.RowPredictions(test_shards, [rows_of[rel] for rel in test_shards], preds[:, 0],
                                                    preds[:, 1] if calibrated is not None else None, weights)
            protocol.upload_row_predictions(self.store, round_key, self.index, predictions, self.workdir)
        timings["score_s"] = time.time() - started
        self.barrier()
        if self.index == 0:
            # Resume continues after pass ``epoch``, or inside it after ``chunk`` chunks.
            state = {"epoch": epoch - 1 if chunk else epoch, "chunk": chunk, "chunks_in_pass": chunks_in_pass,
                     "history": history, "examples": examples, "seed": cfg.data.seed, "run_id": self.job.run_id,
                     "stopping": self.validator.state() if self.validator else None, "day": self.day,
                     "aged": self.aged}
            scored = (checkpoint.TEST,) + ((checkpoint.TEST_CALIBRATED,) if calibrated is not None else ())
            protocol.merged_scores(self.store, round_key, scored, self.count, local)
            if self.saves_test_rows:
                protocol.collected_row_predictions(self.store, round_key, self.count, local)
            protocol.clear_scores(self.store, round_key)
            self._commit(ckpt_id, local, epoch, history, staging, from_workers, state, timings, verdict,
                         calibration, dense_scope)
        self.barrier()
        return verdict

    def _score_validation(self, round_key: str, ckpt_id: Optional[str], local: Path) -> Optional[Verdict]:
        """Every worker scores its share of the validation split; worker 0 merges and judges them (its verdict)."""
        counts, _, _, _ = self.scorer.score(Path(self.job.data_dir),
                                            split_share(self.stats, checkpoint.VALID, self.index, self.count))
        return self._judged(round_key, ckpt_id, local, counts)

    def _blended_validation(self, round_key: str, ckpt_id: Optional[str], local: Path
                            ) -> tuple[Optional[dict], Optional[Verdict]]:
        """``(the blend, worker 0's verdict)``: the blend of the network with the baseline
        (:func:`components.calibration.fit_blend`) fitted on the validation split, whose shares the workers hold (every
        worker takes part and gets the same blend; None: no validation split with both classes), and the checkpoint
        judged on the blended predictions of the same pass over the split: what the checkpoint delivers."""
        labels, logits, weights = self.scorer.logits(Path(self.job.data_dir),
                                                     split_share(self.stats, checkpoint.VALID, self.index, self.count))
        blend = fit_blend(logits, labels, weights,
                          all_reduce=lambda sums: self.all_reduce(sums, "sum").astype(np.float64).ravel())
        counts = ScoreCounts.of(labels, blended_probability(logits, blend), weights)
        return blend, self._judged(round_key, ckpt_id, local, counts, calibrate=False)

    def _judged(self, round_key: str, ckpt_id: Optional[str], local: Path, counts: ScoreCounts,
                calibrate: bool = True) -> Optional[Verdict]:
        """Worker 0's verdict on every worker's validation ``counts`` merged (None on the others, or without
        validation); ``calibrate``: fit the configured calibration on them."""
        protocol.upload_scores(self.store, round_key, checkpoint.VALID, self.index, counts, self.workdir)
        self.barrier()
        if self.index != 0:
            return None
        merged = protocol.merged_scores(self.store, round_key, (checkpoint.VALID,), self.count, local)
        return self.validator.judge(ckpt_id, merged[checkpoint.VALID], calibrate) if self.validator else None

    def _shared_calibration(self, verdict: Optional[Verdict]) -> Optional[dict]:
        """Worker 0's calibration (None: none), on every worker."""
        fitted = verdict.calibration if verdict else None
        mine = np.array([fitted["a"], fitted["b"], 1.0] if fitted else [0.0, 0.0, 0.0], np.float64)
        a, b, present = self.all_reduce(mine, "sum").astype(np.float64).ravel()
        return {"method": "platt", "a": float(a), "b": float(b)} if present else None

    def _commit(self, ckpt_id: str, local: Path, epoch: int, history: list[dict], staging: str, from_workers: bool,
                state: dict, timings: dict[str, float], verdict: Optional[Verdict],
                calibration: Optional[dict], dense_scope: Any) -> None:
        cfg = self.cfg
        meta = self._meta(history)
        server_files, servers = {}, None
        started = time.time()
        if from_workers:
            ids, rows = protocol.merged_worker_rows(self.store, epoch, self.count, local)
            checkpoint.save_worker_rows(local, ids, rows)
            meta["rows"] = int(len(ids))
            if cfg.ps.mode is not Mode.geo:  # geo servers route rows their own way
                servers = {"rows": rows_per_server(ids, self.job.plan.shard_num, cfg.ps.servers)}
        else:
            answers = collect_shards(self.store, ckpt_id, staging, cfg.ps.servers, cfg.ps.startup_timeout_s,
                                     count_evicted=cfg.table.eviction.enabled)
            for answer in answers:
                server_files.update(answer["files"])
            server_rows = [int(a["rows"]) for a in answers]
            meta["rows"] = sum(server_rows)
            servers = {"rows": server_rows, "saved_bytes": saved_bytes_per_server(server_files, cfg.ps.servers)}
            evicted = [a.get("evicted") for a in answers]
            if cfg.table.eviction.enabled and None not in evicted:
                servers["evicted"] = sum(evicted)
        timings["upload_s"] = time.time() - started
        dense = {p.name: np.array(dense_scope.find_var(p.name).get_tensor()) for p in self.main.all_parameters()
                 if p.name != EMBEDDING_TABLE}
        dense.update(self.baseline or {})  # what the blend scores with: the checkpoint serves it
        checkpoint.save_dense(local, dense)
        if verdict:
            meta.update(validation=verdict.metrics, calibration=calibration)
        protocol.commit_checkpoint(self.store, ckpt_id, local, server_files, meta, state,
                                   cfg.checkpoint.keep_last, best=bool(verdict and verdict.best))
        seconds = {k: round(v, 3) for k, v in timings.items()}
        save_rate = (meta["rows"] / max(cfg.ps.servers, 1) / timings["save_s"]
                     if not from_workers and timings["save_s"] > 0 else None)
        emit(CHECKPOINT, id=ckpt_id, epoch=epoch, chunk=state["chunk"], uri=self.store.uri, rows=meta["rows"],
             servers=servers, evicted=(servers or {}).get("evicted"), seconds=seconds,
             save_rows_per_s_per_server=save_rate,
             validation=verdict.metrics if verdict else None, best=bool(verdict and verdict.best),
             stop=bool(verdict and verdict.stop))

    def _meta(self, history: list[dict]) -> dict:
        full, plan = self.job.config, self.job.plan  # the config as a dict, and what the job resolved
        lookup = self._sparse_lookup()
        return {
            # What rebuilds the network; the table as the job laid it out (a restore reads its shard count here).
            "model": full["model"], "table": {**full["table"], "shard_num": plan.shard_num},
            "mode": self.cfg.ps.mode.value,
            "schema": self.stats["schema"], "hash_function": self.stats.get("hash_function"),
            "sparse_table": (f"{checkpoint.TABLES}/{int(lookup.attr('table_id')):03d}"
                             if lookup is not None and not protocol.rows_from_workers(self.cfg) else None),
            "servers": self.cfg.ps.servers, "workers": self.cfg.ps.workers,
            "paddle_version": self.paddle.__version__, "training": {"epochs": history},
            # What the scoring and serving programs of this checkpoint correct its predictions for.
            "negative_sample_rate": plan.negative_sample_rate,
            # The buckets of the baseline the model blends in (model.blend_baseline), else None.
            "baseline_features": models.baseline_features(self.cfg),
        }

    def _dense_copy(self) -> Any:
        """A scope holding a copy of this worker's dense parameters, for a pull that must not touch them."""
        scope = self.paddle.static.Scope()
        for param in self.main.all_parameters():
            if param.name != EMBEDDING_TABLE:
                value = np.array(self.scope.find_var(param.name).get_tensor())
                scope.var(param.name).get_tensor().set(value, self.place)
        return scope

    # -- rows from the workers, where the servers cannot save (geo, SSD) -----------------------------------
    def _worker_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """Rows for the ids this worker trained: geo's local copy, else the rows the servers serve."""
        shards = [str(Path(self.job.data_dir) / p) for p in self.stats["shards"]["train"]][self.index::self.count]
        _, _, sparse = read_shards(shards, self.schema)
        ids = distinct_ids(np.concatenate([slot.values for slot in sparse]))
        if self.cfg.ps.mode is Mode.geo:
            return ids, np.array(self.scope.find_var(EMBEDDING_TABLE).get_tensor())[ids]
        return ids, self.scorer.pull(ids)

    def _sparse_lookup(self):
        for op in self.main.global_block().ops:
            if op.type == SPARSE_PULL:
                return op
        if self.cfg.ps.mode is Mode.geo:
            return None
        raise RuntimeError("no distributed sparse lookup in the training program")
