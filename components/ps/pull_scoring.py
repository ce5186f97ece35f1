"""Scoring through the servers: every worker scores its share of a split with a program that only pulls rows.

A committed checkpoint is scored while the servers hold exactly its table (the workers stand at the checkpoint's
barrier, nobody pushes). The program is the network of :func:`components.networks.scoring.network_program` whose lookups
are the training program's sparse lookup in test mode: a pull that creates no row and counts no show. No process
holds the table; each worker holds the rows of its share of the split. :func:`check_pull_only` refuses a program
that could change the table. Geo workers keep a dense local copy of the table (Paddle's GeoCommunicator: every geo
worker holds ``vocab_size x embedding_dim`` floats by design), so there the lookup reads a copy of that copy.

Each worker's predictions become :class:`components.metrics.ScoreCounts` (distinct predictions with their
positive and negative counts), which merge exactly: worker 0 merges every worker's part into the checkpoint's
``scores/<split>.npz``, from which validation and evaluation compute their metrics.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import numpy as np

from components.config import CtrConfig, Mode
from components.data_prep.multislot import Schema, read_shards
from components.metrics import ScoreCounts
from components.networks.models import BASELINE_PARAMETERS, EMBEDDING_TABLE, baseline_features
from components.networks.scoring import network_program, predict_batches

# Operators that send anything to the servers or change a table: a scoring program holds none.
CHANGING_OPS = frozenset({"distributed_push_sparse", "push_sparse", "push_sparse_v2", "push_dense", "send",
                          "send_and_recv", "send_barrier", "fetch_barrier", "recv", "push_box_sparse",
                          "sgd", "adam", "adagrad", "lookup_table_grad", "lookup_table_v2_grad"})
SPARSE_PULL = "distributed_lookup_table"


def check_pull_only(program: Any) -> None:
    """Raise RuntimeError unless every sparse lookup of ``program`` is a test-mode pull and nothing pushes."""
    for op in program.global_block().ops:
        if op.type in CHANGING_OPS or op.type.endswith("_grad"):
            raise RuntimeError(f"the scoring program holds a {op.type} op: scoring must not change the table")
        if op.type == SPARSE_PULL and not op.attr("is_test"):
            raise RuntimeError("the scoring program's sparse lookup is in training mode: it would create rows")


def split_share(stats: dict, split: str, index: int, count: int) -> list[str]:
    """The shard files of ``split`` worker ``index`` of ``count`` scores (relative to the dataset directory)."""
    return list(stats["shards"].get(split, []))[index::count]


class PullScorer:
    """One worker's scorer: :meth:`score` its share of a split with the parameters :meth:`take_parameters` copied."""

    def __init__(self, cfg: CtrConfig, schema: Schema, train_main: Any, train_scope: Any, place: Any, paddle: Any,
                 negative_sample_rate: float):
        """``negative_sample_rate``: the rate the job's data was prepared with (its plan's), which the predictions
        are corrected for."""
        self.cfg, self.schema, self.paddle, self.place = cfg, schema, paddle, place
        self.negative_sample_rate = negative_sample_rate
        self.train_scope = train_scope
        self.exe = paddle.static.Executor(place)
        self.dim = dim = cfg.table.embedding_dim
        self.geo = cfg.ps.mode is Mode.geo
        self.make_lookup = self._local_lookup if self.geo else self._pull_lookup(train_main, dim)
        # The uncalibrated program, and the one of the latest calibration (each checkpoint fits its own): kept, since
        # Paddle's executor caches programs by id(), and no more, since a long job would pile them up.
        self.baseline_features = baseline_features(cfg)
        self.raw = network_program(cfg.model, schema, dim, self.make_lookup,
                                   negative_sample_rate=negative_sample_rate,
                                   baseline_features=self.baseline_features)
        check_pull_only(self.raw.main)
        self.calibrated: Optional[tuple[tuple, Any]] = None
        self._pull = None  # the program that pulls rows by id, once built
        # Scored in a scope of its own, into which the parameters are copied from the training scope: running this
        # program in the training scope crashed (a pull after the next pass: "Variable Id ... is not registered";
        # geo: a segfault feeding variables the training program's dataset owns). The pulled table's variable is a
        # [1, dim] placeholder (the pull reads only its width); geo's is the worker's whole local copy.
        self.scope = paddle.static.Scope()
        if not self.geo:
            self.scope.var(EMBEDDING_TABLE).get_tensor().set(np.zeros((1, dim), np.float32), place)

    def program(self, calibration: Optional[dict] = None):
        """The scoring network: its probability corrected for the negative sample rate, then (with
        ``calibration``) calibrated in it, as the served program does; ``raw_prob`` is before the calibration."""
        if not calibration:
            return self.raw
        key = tuple(sorted(calibration.items()))  # a blend's c and method too, not only Platt's a and b
        if self.calibrated is None or self.calibrated[0] != key:
            built = network_program(self.cfg.model, self.schema, self.dim, self.make_lookup, calibration,
                                    self.negative_sample_rate, self.baseline_features)
            check_pull_only(built.main)
            self.calibrated = (key, built)
        return self.calibrated[1]

    def take_parameters(self) -> None:
        """Copy the parameters from the training scope (after ``fleet.save_dense_params`` the dense ones are the
        servers': the checkpoint's); once per checkpoint, before :meth:`score`."""
        for param in self.raw.main.all_parameters():
            if (self.geo or param.name != EMBEDDING_TABLE) and param.name not in BASELINE_PARAMETERS:
                value = np.array(self.train_scope.find_var(param.name).get_tensor())
                self.scope.var(param.name).get_tensor().set(value, self.place)

    def set_baseline(self, values: dict) -> None:
        """Score with the baseline of ``values`` (its parameters by name) from now on: the one a model that blends
        it in (model.blend_baseline) scores with, trained by nobody (:meth:`take_parameters` leaves it)."""
        for name, value in values.items():
            self.scope.var(name).get_tensor().set(value, self.place)

    def logits(self, data_dir: Path, shards: list[str]) -> tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]:
        """``(labels, logits [rows, 2], weights or None)`` of the shards' rows: each row's network logit and baseline
        logit, both corrected for negative downsampling (what :func:`components.calibration.fit_blend` fits on)."""
        if not shards:
            return np.zeros(0), np.zeros((0, 2), np.float32), None
        labels, dense, sparse, weights = read_shards([Path(data_dir) / rel for rel in shards], self.schema,
                                                     with_weights=True)
        program, paddle = self.raw, self.paddle

        def run(feed: dict) -> np.ndarray:
            with paddle.static.scope_guard(self.scope):
                return np.hstack(self.exe.run(program.main, feed=feed, fetch_list=[program.logit,
                                                                                   program.baseline_logit]))

        logits = predict_batches(run, None, program.feeds.dense.name if program.feeds.dense is not None else None,
                                 [v.name for v in program.feeds.sparse], dense, sparse, baseline=program.baseline)
        return labels, logits, weights if self.schema.weighted else None

    def _local_lookup(self, block):
        paddle, cfg = self.paddle, self.cfg

        def lookup(slot):
            return paddle.static.nn.embedding(slot, size=[cfg.table.vocab_size, cfg.table.embedding_dim],
                                              is_sparse=True, param_attr=paddle.ParamAttr(name=EMBEDDING_TABLE))
        return lookup

    @staticmethod
    def _pull_lookup(train_main: Any, dim: int):
        """Lookups that are the training program's sparse pull (same table, same attributes) in test mode."""
        trained = next((op for op in train_main.global_block().ops if op.type == SPARSE_PULL), None)
        if trained is None:
            raise RuntimeError("no distributed sparse lookup in the training program")
        attrs = {name: trained.attr(name) for name in trained.attr_names}
        attrs["is_test"] = True

        def make_lookup(block):
            table = block.create_var(name=EMBEDDING_TABLE, shape=[1, dim], dtype="float32", persistable=True)

            def lookup(slot):
                rows = block.create_var(name=f"{slot.name}.pulled", shape=[-1, dim], dtype="float32", lod_level=1)
                block.append_op(type=SPARSE_PULL, inputs={"Ids": [slot], "W": [table]}, outputs={"Outputs": [rows]},
                                attrs=attrs)
                return rows
            return lookup
        return make_lookup

    def pull(self, ids: np.ndarray, batch: int = 1 << 16) -> np.ndarray:
        """``[len(ids), dim]``: the rows the servers serve for ``ids`` (zeros for an id they never saw), pulled as
        the scoring program pulls them. For the checkpoints of tables the servers cannot save (SSD)."""
        if self.geo:
            raise RuntimeError("geo workers keep their own copy of the table: read it, there is nothing to pull")
        if self._pull is None:
            program = self.paddle.static.Program()
            with self.paddle.static.program_guard(program, self.paddle.static.Program()):
                feed = self.paddle.static.data("pull_ids", [-1, 1], "int64")
                self._pull = (program, feed, self.make_lookup(program.global_block())(feed))
            check_pull_only(program)
        program, feed, rows = self._pull
        with self.paddle.static.scope_guard(self.scope):
            pulled = [self.exe.run(program, feed={feed.name: ids[i:i + batch].reshape(-1, 1).astype(np.int64)},
                                   fetch_list=[rows])[0] for i in range(0, len(ids), batch)]
        return np.concatenate(pulled).reshape(len(ids), self.dim) if pulled else np.zeros((0, self.dim), np.float32)

    def score(self, data_dir: Path, shards: list[str], calibration: Optional[dict] = None
              ) -> tuple[ScoreCounts, Optional[ScoreCounts], np.ndarray, Optional[np.ndarray]]:
        """``(counts of this worker's predictions on shards, of its calibrated predictions or None, the predictions
        of every row in the shards' order, the rows' weights or None)``: the predictions float32 ``[rows, 1]``, or
        ``[rows, 2]`` with the calibrated ones second; the counts weighted when the data is (empty counts when the
        worker has no shard)."""
        if not shards:
            empty = ScoreCounts.of(np.zeros(0), np.zeros(0))
            return empty, (empty if calibration else None), np.zeros((0, 2 if calibration else 1), np.float32), None
        labels, dense, sparse, weights = read_shards([Path(data_dir) / rel for rel in shards], self.schema,
                                                     with_weights=True)
        weights = weights if self.schema.weighted else None  # unweighted counts stay exact integers
        paddle, program = self.paddle, self.program(calibration)
        feeds = program.feeds
        outputs = [program.raw_prob] + ([program.prob] if calibration else [])

        def run(feed: dict) -> np.ndarray:
            with paddle.static.scope_guard(self.scope):
                return np.hstack(self.exe.run(program.main, feed=feed, fetch_list=outputs))

        preds = predict_batches(run, None, feeds.dense.name if feeds.dense is not None else None,
                                [v.name for v in feeds.sparse], dense, sparse, baseline=program.baseline)
        return (ScoreCounts.of(labels, preds[:, 0], weights),
                ScoreCounts.of(labels, preds[:, 1], weights) if calibration else None, preds, weights)
