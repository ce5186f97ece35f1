"""The inference programs the serving formats save (``model.pdmodel`` + ``model.pdiparams``) and load back.

The single-file model saves :class:`components.networks.scoring.Scorer`'s program: the network over a local table.
The sharded format saves :func:`rows_program`: the same network (:func:`components.networks.scoring.network_program`)
whose lookup is a feed, per sparse slot, of the rows already looked up (``<slot>.rows``: float32
``[total_ids, dim]``, one LoD sequence per example), so everything after the lookup is the single-file model's,
the negative-downsampling correction and the calibration included.

A loaded program runs whatever ops its file holds, and Paddle has ops that read and write files (``save``,
``load``, ``print``...). :func:`load_program` parses the file first and refuses any op outside
:data:`ALLOWED_OPS` (what the exporter writes) before a parameter is loaded or anything runs.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from components.checkpoint.format import CheckpointError
from components.config import ModelConfig, section_from_dict
from components.data_prep.multislot import Schema
from components.export.manifest import ServingModelError
from components.networks.scoring import blended_features, negative_sample_rate, network_program

MODEL_PREFIX = "model"
PROGRAM_FILES = (f"{MODEL_PREFIX}.pdmodel", f"{MODEL_PREFIX}.pdiparams")
ROWS_FEED = "{}.rows"  # the feed of one sparse slot's rows in the sharded format's program
# Every op the four model families (components.networks.models: dnn, wide_deep, deepfm, dcn) export, in both formats,
# with calibration and negative downsampling on and off and float16 rows (``cast``), and no other:
# tests/export/test_program.py exports each and holds this list equal to what they use, so an op the exporter
# starts writing is added here by review.
ALLOWED_OPS = frozenset({
    "feed", "fetch", "lookup_table_v2", "sequence_pool", "concat", "reshape2", "flatten_contiguous_range", "slice",
    "stack", "mul", "elementwise_add", "elementwise_sub", "elementwise_mul", "reduce_sum", "relu", "sigmoid",
    "scale", "cast",
})


@dataclass
class LoadedProgram:
    """A saved inference program, loaded into a scope of its own. :meth:`run` may be called from any thread."""

    program: Any
    feed_names: list[str]
    fetch_targets: list
    scope: Any
    exe: Any
    # Paddle's executor is not thread-safe: one run at a time per program (a server's threads share it).
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def run(self, feed: dict) -> np.ndarray:
        # The scope is passed, not set with scope_guard: that switches a process-wide scope, which a program
        # loading or running in another thread would see.
        with self._lock:
            # The program cache keeps the feed and fetch ops Paddle adds per run: 0.5 ms less for one instance.
            (prob,) = self.exe.run(self.program, feed=feed, fetch_list=self.fetch_targets, scope=self.scope,
                                   use_program_cache=True)
        return prob


def save_inference(staging: Path, feeds: list, prob: Any, program: Any, scope: Any, exe: Any,
                   extra_ops: Iterable[str] = ()) -> list[str]:
    """Save ``program`` pruned to ``feeds`` -> ``prob`` under ``staging``; returns the fetch names as saved
    (``save_inference_model`` appends a scale op after the target). ``extra_ops``: a custom network's
    (``model.extra_ops``)."""
    import paddle

    with paddle.static.scope_guard(scope):
        paddle.static.save_inference_model(str(staging / MODEL_PREFIX), feeds, [prob], exe, program=program)
    return [v.name for v in load_program(staging, extra_ops).fetch_targets]


def declared_ops(manifest: dict[str, Any]) -> list[str]:
    """The ops a custom network's export declares (``model.extra_ops``, inside the signed ``serving.json``)."""
    return list(manifest.get("model", {}).get("extra_ops") or [])


def load_program(root: Path, extra_ops: Iterable[str] = ()) -> LoadedProgram:
    """The program saved under ``root``, loaded only when :func:`check_ops` accepts it. The bytes checked are the
    bytes loaded (each file is read once), so a file swapped in between cannot slip past the check."""
    import paddle

    paddle.enable_static()
    model_file = root / PROGRAM_FILES[0]
    model_bytes, params_bytes = model_file.read_bytes(), (root / PROGRAM_FILES[1]).read_bytes()
    check_ops(paddle.static.deserialize_program(model_bytes), model_file, extra_ops)
    scope, exe = paddle.static.Scope(), paddle.static.Executor(paddle.CPUPlace())
    # Paddle warns at every load from memory that the path form is preferred; the bytes are loaded on purpose.
    paddle_io_log = logging.getLogger("paddle.static.io")
    level = paddle_io_log.level
    paddle_io_log.setLevel(logging.ERROR)
    try:
        with paddle.static.scope_guard(scope):
            program, feed_names, fetch_targets = paddle.static.load_inference_model(
                None, exe, model_filename=model_bytes, params_filename=params_bytes)
    finally:
        paddle_io_log.setLevel(level)
    return LoadedProgram(program, list(feed_names), fetch_targets, scope, exe)


def program_ops(program: Any) -> set[str]:
    """The op types of every block of ``program``."""
    return {op.type for block in program.blocks for op in block.ops}


def check_ops(program: Any, path: Path, extra_ops: Iterable[str] = ()) -> None:
    """Refuse a program holding an op the exporter never writes (:data:`ALLOWED_OPS`, and a custom network's
    declared ``extra_ops``), naming it, in one line."""
    foreign = sorted(program_ops(program) - ALLOWED_OPS - set(extra_ops))
    if foreign:
        raise ServingModelError(f"{path} holds op(s) {', '.join(foreign)} that no export writes: refusing to load "
                                "it (altered, or written by other code); re-export the checkpoint, or, for a "
                                "network of your own, list them in model.extra_ops")


@dataclass
class RowsProgram:
    """The sharded format's network, its dense parameters set in ``scope``."""

    main: Any
    feeds: list  # dense (when the schema has it), then each sparse slot's rows, in schema order, then its buckets
    prob: Any  # [batch, 1] click probability: corrected for negative downsampling, then calibrated
    scope: Any
    exe: Any
    baseline_feeds: bool = False  # the calibration blends the baseline in: each slot's buckets are fed too


def rows_program(meta: dict[str, Any], dense: dict[str, np.ndarray]) -> RowsProgram:
    """The network of a checkpoint's ``model.json`` fed with looked-up rows, with its ``dense`` parameters, the
    correction for the negative sample rate it was trained with and the calibration it carries. Raises
    :class:`CheckpointError` when ``dense`` lacks a parameter."""
    import paddle

    model_cfg = section_from_dict(ModelConfig, meta["model"])
    schema = Schema.from_dict(meta["schema"])
    dim = int(meta["table"]["embedding_dim"])
    row_feeds = []

    def make_lookup(block):
        def lookup(slot):
            rows = paddle.static.data(ROWS_FEED.format(slot.name), [-1, dim], "float32", lod_level=1)
            row_feeds.append(rows)
            return rows
        return lookup

    built = network_program(model_cfg, schema, dim, make_lookup, meta.get("calibration"), negative_sample_rate(meta),
                            blended_features(meta, meta.get("calibration")))
    missing = [p.name for p in built.main.all_parameters() if p.name not in dense]
    if missing:
        raise CheckpointError(f"checkpoint lacks parameters {missing} of model {model_cfg.name.value}")
    scope, exe = paddle.static.Scope(), paddle.static.Executor(paddle.CPUPlace())
    with paddle.static.scope_guard(scope):
        exe.run(built.startup)
    for param in built.main.all_parameters():
        scope.find_var(param.name).get_tensor().set(dense[param.name], paddle.CPUPlace())
    buckets = [built.main.global_block().var(name) for name in built.baseline.names] if built.baseline else []
    feeds = ([built.feeds.dense] if built.feeds.dense is not None else []) + row_feeds + buckets
    return RowsProgram(built.main, feeds, built.prob, scope, exe, bool(buckets))
