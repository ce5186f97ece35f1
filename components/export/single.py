"""The single-file serving model (``export.format=single``): one Paddle inference model holding every row.

A directory::

    model.pdmodel     the inference program (pruned to the inputs below)
    model.pdiparams   its parameters: the dense weights (float32) and the embedding table, whose rows are the
                      checkpoint's rows followed by one zero row (the row of every id never trained), in
                      export.dtype: float16 rows are widened to float32 by the program right after the lookup
    ids.npy           uint64 [n], sorted: the feature id of each table row (row i <-> ids[i]); any other id
                      uses row n, the zero row
    transform/        the training data's transform (raw record -> row), when exported with its dataset
    serving.json      written last: format ``single``, schema, feed and fetch names, model, the source
                      checkpoint, table shape and dtype, vocab_size, negative_sample_rate and correction, calibration,
                      every file's size and sha256, and ``transform`` (its description, or None)

The program is the one :class:`components.networks.scoring.Scorer` runs (:func:`components.networks.scoring.build_program`).
Writing it reads the whole table into this process (:meth:`~components.export.table.CheckpointTable.whole`):
memory grows with the table, so it is meant for small tables; the sharded format
(:mod:`components.export.sharded`) is not bounded so. Another runtime (a ``paddle.inference`` predictor,
Paddle Serving) feeds ``serving.json["feed_names"]`` in order: ``dense`` float32 ``[batch, dense_dim]`` (absent
when dense_dim is 0), then per sparse slot an int64 ``[total_ids, 1]`` tensor of **row indices** (``i =
searchsorted(ids, id)``; ``i`` if ``ids[i] == id`` else ``len(ids)``) with LoD ``[[0, end_1, ..., end_batch]]``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Optional

import numpy as np

from components.checkpoint import format as ckpt_io
from components.config import ExportDtype
from components.data_prep.multislot import Schema
from components.export.manifest import (check_replaceable, checkpoint_facts, copy_transform, file_entries, swap_in,
                                        write_manifest)
from components.export.signing import AUTO, signer
from components.export.program import PROGRAM_FILES, declared_ops, save_inference
from components.export.shards import narrowed
from components.export.table import CheckpointTable, FetchFile
from components.networks.scoring import Scorer, bucket_feed_description

IDS_FILE = "ids.npy"


def export_single(checkpoint_dir: str | os.PathLike, out_dir: str | os.PathLike,
                  dtype: ExportDtype = ExportDtype.float32, source: Optional[dict] = None,
                  fetch: Optional[FetchFile] = None, dataset_dir: Optional[str | os.PathLike] = None,
                  signing_key: str = AUTO) -> Path:
    """Export the committed checkpoint at ``checkpoint_dir`` (its table files through ``fetch``, see
    :class:`~components.export.table.CheckpointTable`) as a single-file serving model ``out_dir``.

    ``serving.json["source_checkpoint"]`` records the checkpoint manifest's sha256 and ``source`` (e.g. ``{"uri":
    store, "id": checkpoint id}``), by default ``{"path": checkpoint_dir}``. ``out_dir`` may be absent, empty or
    an earlier serving model (replaced as a whole); any other existing path is refused. ``dataset_dir``: the
    dataset the checkpoint trained on, whose transform the model then holds (``transform/``, raw records in:
    :func:`components.export.manifest.copy_transform`). ``signing_key`` is ``export.signing_key``
    (:func:`components.export.signing.signer`). Returns ``out_dir``.
    """
    import paddle

    sign = signer(signing_key)  # a key that cannot sign fails before any work
    table = CheckpointTable(checkpoint_dir, fetch)  # verifies the manifest first
    out = Path(out_dir).absolute()
    check_replaceable(out)
    ids, rows = table.whole()
    checkpoint = ckpt_io.Checkpoint(meta=table.meta, ids=ids, rows=narrowed(rows, dtype), dense=table.dense())
    scorer = Scorer(checkpoint, calibrated=True)  # what the servers deliver: calibrated probabilities
    program = scorer.program
    feeds = program.input_vars()
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        fetch_names = save_inference(staging, feeds, program.prob, program.main, scorer.scope, scorer.exe,
                                     declared_ops(table.meta))
        np.save(staging / IDS_FILE, checkpoint.ids.astype(np.uint64))
        unseen_row = program.table_shape[0] - 1
        transform_files, transform = copy_transform(dataset_dir, staging, table.meta)
        write_manifest(staging, {
            **checkpoint_facts(table.meta, table.manifest_sha256, source or {"path": str(table.root)}),
            "format": "single",
            "feed_names": [v.name for v in feeds],
            "feeds": [_feed_description(v, program, scorer.schema) for v in feeds],
            "fetch_names": fetch_names,
            "model_file": PROGRAM_FILES[0],
            "params_file": PROGRAM_FILES[1],
            "ids_file": IDS_FILE,
            "table_rows": program.table_shape[0],
            "unseen_row": unseen_row,
            "sparse_values": f"a sparse feed holds row indices, not ids: the position of the id in {IDS_FILE} "
                             f"(sorted), or unseen_row ({unseen_row}) for an id not in it",
            "embedding_dtype": program.table_dtype,
            "paddle_version": paddle.__version__,
            "transform": transform,
            "files": file_entries(staging, [*PROGRAM_FILES, IDS_FILE, *transform_files]),
        }, sign)
        swap_in(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


def _feed_description(var: Any, program: Any, schema: Schema) -> dict:
    """What one feed variable takes, for ``serving.json``."""
    if program.feeds.dense is not None and var.name == program.feeds.dense.name:
        return {"name": var.name, "slot": "dense", "dtype": "float32", "shape": [-1, schema.dense_dim],
                "lod_level": 0, "values": "the dense features"}
    if program.baseline and var.name in program.baseline.names:
        return bucket_feed_description(var.name, schema.sparse_slots[program.baseline.names.index(var.name)])
    slot = schema.sparse_slots[[v.name for v in program.feeds.sparse].index(var.name)]
    return {"name": var.name, "slot": slot, "dtype": "int64", "shape": [-1, 1], "lod_level": 1,
            "values": "row indices (see sparse_values), one LoD sequence per example"}
