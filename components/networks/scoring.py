"""Scoring with a model loaded from a committed checkpoint (never the in-memory model).

The network is rebuilt from ``model.json`` with a local embedding table holding the exported rows, in
their exported dtype (a float16 table's looked-up rows are widened to float32, exactly, before the network);
ids the servers never saw map to a zero row (the PS would create them with near-zero weights).
:func:`build_program` is the one place that builds that program: :class:`Scorer` runs it here, and
:func:`components.export.single.export_single` saves it in Paddle's inference format.

Every program that turns the logit into a delivered probability (:func:`network_program`) first corrects it for
negative downsampling: a model trained on data whose negatives were kept at rate ``w`` (``data.negative_sample_rate``,
recorded in the checkpoint's ``model.json``) predicts ``q = sigmoid(logit + ln w)``, then the calibration applies.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from components.checkpoint import format as ckpt_io
from components.config import ModelConfig, section_from_dict
from components.data_prep.multislot import RaggedIds, Schema, read_shards
from components.networks import models
from components.networks.models import EMBEDDING_TABLE

SCORE_BATCH = 8192
BUCKETS_SUFFIX = ".baseline_buckets"  # a slot's feed of its ids' baseline buckets: "<slot feed>.baseline_buckets"
# How the programs correct for negative downsampling, as the serving manifest names it.
DOWNSAMPLING_CORRECTION = "logit + ln(negative_sample_rate)"


@dataclass
class NetworkProgram:
    """A CTR network as a static program whose embedding lookup was injected (:func:`network_program`)."""

    main: Any
    startup: Any
    feeds: models.Feeds
    prob: Any  # [batch, 1] click probability: corrected for negative downsampling, then calibrated (if built so)
    # [batch, 1] before any calibration, corrected for negative downsampling: what the calibration is fitted on, and
    # the "uncalibrated" metrics are of (the network's own probability only when the rate is 1)
    raw_prob: Any
    logit: Any = None  # [batch, 1] the network's logit, corrected for negative downsampling
    baseline: Optional["BaselineFeeds"] = None  # a model that blends the baseline in: its buckets' feeds
    baseline_logit: Any = None  # [batch, 1] then the baseline's logit, corrected as the network's


@dataclass(frozen=True)
class BaselineFeeds:
    """The feeds of a program that blends the baseline in (:func:`models.baseline_logit`): per sparse slot, in
    schema order, the name of the feed of its ids' buckets (``id % features``)."""

    names: list[str]
    features: int

    @staticmethod
    def name_of(slot_feed: str) -> str:
        return f"{slot_feed}{BUCKETS_SUFFIX}"


@dataclass
class LocalProgram(NetworkProgram):
    """A CTR network as a local static program with a plain embedding table of ``table_shape``."""

    table_shape: tuple[int, int] = (0, 0)
    table_dtype: str = "float32"  # or float16

    def input_vars(self) -> list:
        """What inference feeds, in MultiSlot slot order without the label: ``dense`` (if any), sparse slots, then
        (a model that blends the baseline in) each sparse slot's buckets."""
        buckets = [self.main.global_block().var(name) for name in self.baseline.names] if self.baseline else []
        return ([self.feeds.dense] if self.feeds.dense is not None else []) + list(self.feeds.sparse) + buckets


def network_program(model_cfg: ModelConfig, schema: Schema, embedding_dim: int,
                    make_lookup: Callable[[Any], models.Lookup], calibration: Optional[dict] = None,
                    negative_sample_rate: float = 1.0, baseline_features: Optional[int] = None) -> NetworkProgram:
    """The network of ``model_cfg`` in a program of its own, its rows looked up by ``make_lookup(block)``'s lookup
    (called inside the program, so the variables it creates are the program's).

    Its dense parameters carry the names the PS programs give them, so a checkpoint's dense parameters map onto it.
    The logit is corrected for the ``negative_sample_rate`` ``w`` the model was trained with (``logit + ln w``),
    then ``calibration`` is applied in the program: Platt's (``{"method": "platt", "a", "b"}``, fitted on corrected
    predictions) ``sigmoid(a * (logit + ln w) + b)``, or the blend with the baseline
    (``{"method": "blend", "a", "b", "c"}``: :func:`components.calibration.fit_blend`)
    ``sigmoid(a * (logit + ln w) + c * (baseline logit + ln w) + b)``. ``baseline_features``: the program also holds
    the baseline (:func:`components.networks.models.baseline_logit`), its buckets fed (:class:`BaselineFeeds`).
    """
    import paddle

    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
        feeds = models.create_feeds(schema)
        logit = models.net(model_cfg, feeds, make_lookup(main.global_block()), embedding_dim).logit
        baseline, baseline_logit = None, None
        if baseline_features:
            baseline = BaselineFeeds([BaselineFeeds.name_of(slot.name) for slot in feeds.sparse], baseline_features)
            buckets = [paddle.static.data(name, [-1, 1], "int64", lod_level=1) for name in baseline.names]
            baseline_logit = models.baseline_logit(feeds, baseline_features, buckets)
        if negative_sample_rate != 1.0:
            # Keeping negatives at rate w multiplies the odds the model learns by 1 / w: ln w undoes it (the
            # baseline was fitted on the same rows).
            logit = logit + math.log(negative_sample_rate)
            if baseline_logit is not None:
                baseline_logit = baseline_logit + math.log(negative_sample_rate)
        raw_prob = prob = paddle.nn.functional.sigmoid(logit)
        method = (calibration or {}).get("method")
        if method == "platt":
            prob = paddle.nn.functional.sigmoid(logit * float(calibration["a"]) + float(calibration["b"]))
        elif method == "blend":
            if baseline_logit is None:
                raise ValueError("a blend with the baseline needs the baseline in the program (baseline_features)")
            prob = paddle.nn.functional.sigmoid(logit * float(calibration["a"]) + baseline_logit * float(calibration["c"])
                                                + float(calibration["b"]))
    return NetworkProgram(main, startup, feeds, prob, raw_prob, logit, baseline, baseline_logit)


def build_program(model_cfg: ModelConfig, schema: Schema, table_rows: int, embedding_dim: int,
                  table_dtype: str = "float32", calibration: Optional[dict] = None,
                  negative_sample_rate: float = 1.0, baseline_features: Optional[int] = None) -> LocalProgram:
    """The network of ``model_cfg`` over a local ``[table_rows, embedding_dim]`` table named ``EMBEDDING_TABLE``.

    A ``float16`` table stays float16 (half the table's bytes, in memory and in a saved inference model); the
    network computes in float32 on its rows, as it does on a float32 table.
    """
    import paddle

    shape = (int(table_rows), int(embedding_dim))

    def make_lookup(block):
        def lookup(slot):
            rows = paddle.static.nn.embedding(slot, size=list(shape), dtype=table_dtype,
                                              param_attr=paddle.ParamAttr(name=EMBEDDING_TABLE))
            return rows if table_dtype == "float32" else paddle.cast(rows, "float32")  # keeps the LoD
        return lookup

    built = network_program(model_cfg, schema, shape[1], make_lookup, calibration, negative_sample_rate,
                            baseline_features)
    return LocalProgram(**vars(built), table_shape=shape, table_dtype=table_dtype)


def negative_sample_rate(meta: dict) -> float:
    """The rate at which the training data of a checkpoint (its ``model.json``) kept its negatives (1: all, as in
    checkpoints made before the rate was recorded)."""
    return float(meta.get("negative_sample_rate") or 1.0)


def corrected_probability(prob: np.ndarray, rate: float) -> np.ndarray:
    """``sigmoid(logit + ln rate)`` of probabilities ``sigmoid(logit)``: what the programs' correction makes of
    predictions already taken (``p w / (p w + 1 - p)``)."""
    prob = np.asarray(prob, dtype=np.float64)
    return prob * rate / (prob * rate + 1.0 - prob)


def local_table(checkpoint: ckpt_io.Checkpoint) -> np.ndarray:
    """The checkpoint's rows (in their exported dtype) plus a last, zero row: the row of every id the servers
    never saw."""
    dim = checkpoint.rows.shape[1]
    return np.vstack([checkpoint.rows, np.zeros((1, dim), checkpoint.rows.dtype)])


def blended_features(meta: dict, calibration: Optional[dict]) -> Optional[int]:
    """The baseline's bucket count a program of the checkpoint of ``meta`` holds: only where ``calibration`` (the one
    the program applies) blends the baseline in, so that a program never feeds what it does not use."""
    return meta.get("baseline_features") if (calibration or {}).get("method") == "blend" else None


def checkpoint_program(checkpoint: ckpt_io.Checkpoint,
                       calibrated: bool = False) -> tuple[LocalProgram, dict[str, np.ndarray]]:
    """The checkpoint's network (:func:`build_program`, corrected for the negative sample rate its ``model.json``
    records; ``calibrated``: with the calibration it carries) and the value of each of its parameters.

    Raises :class:`~components.checkpoint.CheckpointError` when the checkpoint lacks one of them.
    """
    model_cfg = section_from_dict(ModelConfig, checkpoint.meta["model"])
    schema = Schema.from_dict(checkpoint.meta["schema"])
    table = local_table(checkpoint)
    calibration = checkpoint.meta.get("calibration") if calibrated else None
    program = build_program(model_cfg, schema, *table.shape, table_dtype=table.dtype.name, calibration=calibration,
                            negative_sample_rate=negative_sample_rate(checkpoint.meta),
                            baseline_features=blended_features(checkpoint.meta, calibration))
    params = {**checkpoint.dense, EMBEDDING_TABLE: table}
    missing = [p.name for p in program.main.all_parameters() if p.name not in params]
    if missing:
        raise ckpt_io.CheckpointError(f"checkpoint lacks parameters {missing} of model {model_cfg.name.value}")
    return program, {p.name: params[p.name] for p in program.main.all_parameters()}


def row_indices(ids: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Global feature ids -> row indices of the local table: the position in the sorted ``ids``;
    an id not in ``ids`` gets ``len(ids)``, the zero row."""
    values = np.asarray(values).astype(np.uint64)
    if len(ids) == 0:
        return np.zeros(len(values), np.int64)
    pos = np.minimum(np.searchsorted(ids, values), len(ids) - 1)
    return np.where(ids[pos] == values, pos, len(ids)).astype(np.int64)


def predict_batches(run: Callable[[dict], np.ndarray], ids: Optional[np.ndarray], dense_name: Optional[str],
                    sparse_names: list[str], dense: np.ndarray, sparse: list[RaggedIds],
                    batch: int = SCORE_BATCH, baseline: Optional[BaselineFeeds] = None) -> np.ndarray:
    """``[n, k]``: the ``k`` outputs of every row, ``run(feed)`` scoring one batch into ``[b, k]``.

    ``feed`` maps ``dense_name`` to a float32 ``[b, dense_dim]`` array and each sparse name to a LoD tensor
    of row indices (:func:`row_indices` in ``ids``; ``ids`` None: the feature ids themselves, for a program that
    looks them up on the servers) with one sequence per example; with ``baseline``, each slot's bucket feed to
    its ids' buckets, with the same sequences.
    """
    import paddle

    if len(sparse) != len(sparse_names):
        raise ValueError(f"the model reads {len(sparse_names)} sparse slots, got {len(sparse)}")
    n = len(sparse[0].offsets) - 1 if sparse else len(dense)
    if dense_name is not None:
        dense = np.asarray(dense, dtype=np.float32)
        if dense.ndim != 2 or len(dense) != n:
            raise ValueError(f"dense features must be a [{n}, dense_dim] array, got shape {dense.shape}")
    out = np.empty((n, 1), dtype=np.float32)
    for start in range(0, n, batch):
        stop = min(start + batch, n)
        feed: dict[str, Any] = {}
        if dense_name is not None:
            feed[dense_name] = dense[start:stop]
        for name, slot in zip(sparse_names, sparse):
            if len(slot.offsets) != n + 1:
                raise ValueError(f"sparse slot {name} holds {len(slot.offsets) - 1} rows, expected {n}")
            lo, hi = int(slot.offsets[start]), int(slot.offsets[stop])
            tensor = paddle.base.core.LoDTensor()
            values = slot.values[lo:hi]
            rows = values.astype(np.int64) if ids is None else row_indices(ids, values)
            lod = [(slot.offsets[start:stop + 1] - lo).tolist()]
            tensor.set(rows.reshape(-1, 1), paddle.CPUPlace())
            tensor.set_lod(lod)
            feed[name] = tensor
        for name, slot in zip(baseline.names if baseline else [], sparse):
            lo, hi = int(slot.offsets[start]), int(slot.offsets[stop])
            feed[name] = baseline_buckets(slot.values[lo:hi], baseline.features,
                                          (slot.offsets[start:stop + 1] - lo).tolist())
        scores = np.asarray(run(feed), dtype=np.float32).reshape(stop - start, -1)
        if out.shape[1] != scores.shape[1]:
            out = np.empty((n, scores.shape[1]), dtype=np.float32)
        out[start:stop] = scores
    return out


def bucket_feed_description(name: str, slot: str) -> dict:
    """A bucket feed, for ``serving.json``."""
    return {"name": name, "slot": slot, "dtype": "int64", "shape": [-1, 1], "lod_level": 1,
            "values": "the baseline buckets of the slot's ids (id % baseline_features), the slot's sequences"}


def baseline_buckets(values: np.ndarray, features: int, lod: list) -> Any:
    """The LoD tensor of ``values``' (raw ids') baseline buckets, ``id % features``, as the regression hashes them."""
    import paddle

    tensor = paddle.base.core.LoDTensor()
    tensor.set((np.asarray(values, np.uint64) % np.uint64(features)).astype(np.int64).reshape(-1, 1),
               paddle.CPUPlace())
    tensor.set_lod([lod])
    return tensor


class Scorer:
    """A checkpoint's model as a local Paddle program: ``predict(dense, sparse) -> probabilities`` (corrected for
    the negative sample rate it was trained with; ``calibrated``: then through the calibration it carries)."""

    def __init__(self, checkpoint: ckpt_io.Checkpoint, calibrated: bool = False):
        import paddle

        self.paddle = paddle
        self.ids = checkpoint.ids
        self.schema = Schema.from_dict(checkpoint.meta["schema"])
        self.program, params = checkpoint_program(checkpoint, calibrated)
        self.main, self.feeds, self.prob = self.program.main, self.program.feeds, self.program.prob
        self.scope = paddle.static.Scope()
        self.exe = paddle.static.Executor(paddle.CPUPlace())
        with paddle.static.scope_guard(self.scope):
            self.exe.run(self.program.startup)
        for name, value in params.items():
            self.scope.find_var(name).get_tensor().set(value, paddle.CPUPlace())

    def _predict(self, dense: np.ndarray, sparse: list[RaggedIds], outputs: list) -> np.ndarray:
        def run(feed: dict) -> np.ndarray:
            with self.paddle.static.scope_guard(self.scope):
                return np.hstack(self.exe.run(self.main, feed=feed, fetch_list=outputs))

        dense_name = self.feeds.dense.name if self.feeds.dense is not None else None
        return predict_batches(run, self.ids, dense_name, [v.name for v in self.feeds.sparse], dense, sparse,
                               baseline=self.program.baseline)

    def predict(self, dense: np.ndarray, sparse: list[RaggedIds]) -> np.ndarray:
        return self._predict(dense, sparse, [self.prob])[:, 0]

    def predict_with_uncalibrated(self, dense: np.ndarray, sparse: list[RaggedIds]) -> tuple[np.ndarray, np.ndarray]:
        """``(probabilities, the same before the calibration)``, from one pass of the network over the rows."""
        both = self._predict(dense, sparse, [self.prob, self.program.raw_prob])
        return both[:, 0], both[:, 1]


def read_test_split(data_dir: str | os.PathLike,
                    schema: Optional[Schema] = None) -> tuple[np.ndarray, np.ndarray, list[RaggedIds]]:
    """``(labels, dense, sparse)`` of the test split of a prepared dataset (checked against ``schema``)."""
    stats = json.loads((Path(data_dir) / "stats.json").read_text())
    data_schema = Schema.from_dict(stats["schema"])
    if schema is not None and schema.to_dict() != data_schema.to_dict():
        raise ckpt_io.CheckpointError(f"the model was trained on another feature schema than the data in {data_dir}")
    return read_shards([Path(data_dir) / p for p in stats["shards"]["test"]], data_schema)
