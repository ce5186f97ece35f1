"""Committed checkpoints built directly for the export tests (random but fixed parameters; no PS job): the servers'
text shard files in the SparseAccessor line format, ``export/dense.npz`` and ``model.json``, committed by a local
checkpoint store as a training job commits them; or, as geo and SSD jobs do, the workers' rows in
``export/embedding.npz``."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np
import paddle

from components.checkpoint import format as ckpt_io
from components.config import SparseRule, from_dict, to_dict
from components.data_prep.multislot import Schema, read_shards
from components.table.accessor import rule_state_dim
from components.networks.models import EMBEDDING_TABLE
from components.networks.scoring import build_program
from tests.conftest import commit_staged_checkpoint

# The calibration a checkpoint carries (fitted on the validation split while it trained): serving applies it.
CALIBRATION = {"method": "platt", "a": 1.3, "b": -0.2}
EMBEDDING_DIM = 5
VOCAB = 5000
SHARD_NUM = 4
SERVERS = 2
TABLE_DIR = f"{ckpt_io.TABLES}/000"


def make_checkpoint(data_dir: Path, model: str, seed: int = 0, rule: str = "adagrad") -> ckpt_io.Checkpoint:
    """A checkpoint's content: rows for the train split's ids (every 5th id left out, so the test split holds
    unseen ids; every 7th row without its embedx part, as the servers save rows below the embedx threshold) and
    every dense parameter of the model."""
    stats = json.loads((data_dir / "stats.json").read_text())
    schema = Schema.from_dict(stats["schema"])
    cfg = from_dict({"model": {"name": model, "hidden": [16, 8]},
                     "table": {"embedding_dim": EMBEDDING_DIM, "vocab_size": VOCAB, "shard_num": SHARD_NUM,
                               "rule": rule}})
    _, _, sparse = read_shards([data_dir / p for p in stats["shards"]["train"]], schema)
    ids = np.delete(np.unique(np.concatenate([slot.values for slot in sparse])).astype(np.uint64), np.s_[::5])
    rng = np.random.default_rng(seed)
    rows = rng.normal(0, 0.3, (len(ids), EMBEDDING_DIM)).astype(np.float32)
    rows[::7, 1:] = 0
    program = build_program(cfg.model, schema, len(ids) + 1, EMBEDDING_DIM)
    dense = {p.name: rng.normal(0, 0.3, p.shape).astype(np.float32)
             for p in program.main.all_parameters() if p.name != EMBEDDING_TABLE}
    full = to_dict(cfg)
    meta = {"model": full["model"], "table": full["table"], "mode": "async", "schema": stats["schema"],
            "servers": SERVERS, "workers": 1, "paddle_version": paddle.__version__, "training": {},
            "rows": int(len(ids)), "calibration": CALIBRATION, "sparse_table": TABLE_DIR}
    return ckpt_io.Checkpoint(meta=meta, ids=ids, rows=rows, dense=dense)


def commit_checkpoint(root: Path, checkpoint: ckpt_io.Checkpoint, rows_from_workers: bool = False,
                      gzip_tables: bool = False, scored_on: Path | None = None) -> Path:
    """``checkpoint`` staged at ``root`` and committed; returns the committed checkpoint's directory.

    Its rows go to one text file per table shard (rows in shuffled order, as a server writes its hash map;
    ``gzip_tables``: ``.gz`` files, as checkpoints before 2026-12 hold), or with ``rows_from_workers`` to
    ``export/embedding.npz`` (model.json then names no ``sparse_table``). ``scored_on``: a prepared dataset whose
    test split the checkpoint's ``scores/`` hold, scored in one process as the job's workers score it through the
    servers (tests/ps/test_ps_jobs.py holds the two equal)."""
    meta = dict(checkpoint.meta)
    (root / ckpt_io.EXPORT).mkdir(parents=True)
    if scored_on is not None:
        write_scores(root, checkpoint, scored_on)
    np.savez(root / ckpt_io.EXPORT / ckpt_io.DENSE_FILE, **checkpoint.dense)
    if rows_from_workers:
        np.savez(root / ckpt_io.EXPORT / ckpt_io.EMBEDDING_FILE, ids=checkpoint.ids, rows=checkpoint.rows)
        meta.update(sparse_table=None, mode="geo")
    else:
        shard_num, rule = meta["table"]["shard_num"], SparseRule(meta["table"]["rule"])
        per_server = math.ceil(shard_num / meta["servers"])
        rng = np.random.default_rng(len(checkpoint.ids))
        for shard in range(shard_num):
            order = rng.permutation(np.flatnonzero(checkpoint.ids % np.uint64(shard_num) == np.uint64(shard)))
            path = root / TABLE_DIR / f"part-{shard // per_server:03d}-{shard:05d}"
            write_shard_file(path, checkpoint.ids[order], checkpoint.rows[order], rule)
            if gzip_tables:
                path.with_name(path.name + ".gz").write_bytes(gzip.compress(path.read_bytes()))
                path.unlink()
    return commit_staged_checkpoint(root, meta)


def write_shard_file(path: Path, ids: np.ndarray, rows: np.ndarray, rule: SparseRule) -> None:
    """Rows as a server saves them: ``key slot unseen delta show click embed_w <state> [embedx_w <state>]``, the
    embedx part left out of rows whose embedx is all zero. Floats in their exact decimal form (float32 -> float64
    repr), so they parse back bit for bit."""
    dim = rows.shape[1]
    embed_state, embedx_state = rule_state_dim(rule, 1), rule_state_dim(rule, dim - 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for key, row in zip(ids.tolist(), rows.astype(np.float64).tolist()):
            fields = [str(key), "0", "0", "1.5", "15", "1", repr(row[0])] + ["0.5"] * embed_state
            if any(row[1:]):
                fields += [repr(v) for v in row[1:]] + ["0.25"] * embedx_state
            f.write(" ".join(fields) + "\n")


def write_scores(root: Path, checkpoint: ckpt_io.Checkpoint, data_dir: Path) -> None:
    """The checkpoint's ``scores/``: its test predictions, before and through its calibration, as counts."""
    from components.metrics import ScoreCounts
    from components.networks.scoring import Scorer, read_test_split

    labels, dense, sparse = read_test_split(data_dir, Schema.from_dict(checkpoint.meta["schema"]))
    calibrated, raw = Scorer(checkpoint, calibrated=True).predict_with_uncalibrated(dense, sparse)
    (root / ckpt_io.SCORES).mkdir(parents=True, exist_ok=True)
    ScoreCounts.of(labels, raw).save(root / ckpt_io.SCORES / f"{ckpt_io.TEST}.npz")
    ScoreCounts.of(labels, calibrated).save(root / ckpt_io.SCORES / f"{ckpt_io.TEST_CALIBRATED}.npz")


def build_checkpoint(root: Path, data_dir: Path, model: str, seed: int = 0, rows_from_workers: bool = False) -> Path:
    """:func:`make_checkpoint` committed at ``root`` (:func:`commit_checkpoint`), scored on ``data_dir``'s test
    split."""
    return commit_checkpoint(root, make_checkpoint(data_dir, model, seed), rows_from_workers, scored_on=data_dir)
