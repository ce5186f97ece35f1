"""A servable inference model from a committed checkpoint, and the code that runs it on new data.

A serving model directory (written by :func:`export_inference_model`)::

    model.pdmodel     the inference program in Paddle's inference format (pruned to the inputs below)
    model.pdiparams   its parameters: the dense weights (float32) and the embedding table, whose rows are
                      the checkpoint's rows followed by one zero row (the row of every id never trained),
                      in the export's dtype: float16 when the checkpoint was exported so, widened to
                      float32 by the program right after the lookup
    ids.npy           uint64 [n], sorted: the feature id of each table row (row i <-> ids[i]); any other
                      id uses row n, the zero row
    serving.json      schema, feed names in order, fetch names, model config and name, the source
                      checkpoint (its path, or store URI and id; MANIFEST.json sha256), Paddle version,
                      table shape and dtype, vocab_size

The program is the one :class:`components.ps.scoring.Scorer` runs
(:func:`components.ps.scoring.build_program`), so the served model scores exactly like the evaluation.
The directory is staged next to ``out`` and renamed into place: it is complete or absent.

How to run it on new data
-------------------------
1. Export a committed checkpoint: a local directory holding ``MANIFEST.json`` (in a checkpoint store, the
   directory of one checkpoint). The pipeline's ``export-model`` step does this, and a local run leaves its
   result in ``run_dir/serving_model/``::

       python -m components.serving export --checkpoint CHECKPOINT_DIR --out serving_model

2. Write the examples as MultiSlot shards (:mod:`components.data_prep.multislot`), the format the
   data-prep step writes: per line ``1 <click> [<dense_dim> <dense values>] <count> <ids> ...`` for each
   sparse slot of ``serving.json["schema"]``, in its order. The click value is required by the format and
   ignored. Ids must be hashed as for training: ``hashing.feature_id(slot, raw_value, vocab_size)`` with
   ``serving.json["vocab_size"]``; the data-prep step (``data.source=files``) does this for raw files
   (both its splits are valid input).

3. Score them: one probability per line, examples in input order (inputs in the order given, each glob's
   matches sorted)::

       python -m components.serving predict --model serving_model --input 'new/part-*.txt' --output preds.txt

From Python: ``InferenceModel.load(dir).predict(dense, sparse)`` with ``(labels, dense, sparse) =
read_shards(paths, model.schema)`` (or your own ``[n, dense_dim]`` float32 array and one
:class:`~components.data_prep.multislot.RaggedIds` of raw ids per sparse slot).

From another Paddle runtime (``paddle.inference`` predictor, Paddle Serving): load ``model.pdmodel`` +
``model.pdiparams`` and feed ``serving.json["feed_names"]`` in order: ``dense`` float32 ``[batch, dense_dim]``
(absent when dense_dim is 0), then per sparse slot an int64 ``[total_ids, 1]`` tensor of **row indices**
(``i = searchsorted(ids, id)``; ``i`` if ``ids[i] == id`` else ``len(ids)``) with LoD
``[[0, end_1, ..., end_batch]]`` (where each example's ids end). The output ``serving.json["fetch_names"][0]``
is float32 ``[batch, 1]``: the click probability.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from components.checkpoint import format as ckpt_io
from components.data_prep.hashing import HASH_FUNCTION, check_hash_function
from components.data_prep.multislot import RaggedIds, Schema, read_shards
from components.ps.scoring import Scorer, predict_batches
from components.ps.models import EMBEDDING_TABLE

FORMAT = 1
MODEL_PREFIX = "model"  # model.pdmodel + model.pdiparams
IDS_FILE = "ids.npy"
SERVING_META = "serving.json"
PROGRAM_FILES = (f"{MODEL_PREFIX}.pdmodel", f"{MODEL_PREFIX}.pdiparams")


class ServingModelError(RuntimeError):
    """A serving model directory that is incomplete or inconsistent."""


def export_inference_model(checkpoint_dir: str | os.PathLike, out_dir: str | os.PathLike,
                           source: Optional[dict] = None) -> Path:
    """Export the committed checkpoint at ``checkpoint_dir`` as a serving model directory ``out_dir``.

    ``serving.json["source_checkpoint"]`` records the manifest's sha256 and ``source`` (e.g. ``{"uri": store,
    "id": checkpoint id}`` when ``checkpoint_dir`` is a temporary local copy), by default ``{"path": checkpoint_dir}``.
    Raises :class:`~components.checkpoint.CheckpointError` for a directory that is not a committed,
    intact checkpoint. ``out_dir`` may be absent, empty or an earlier serving model (replaced as a
    whole); any other existing path is refused. Returns ``out_dir``.
    """
    import paddle

    local = Path(checkpoint_dir).resolve()
    checkpoint = ckpt_io.load(local)  # verifies the manifest first
    if np.any(checkpoint.ids[1:] <= checkpoint.ids[:-1]):
        raise ckpt_io.CheckpointError(f"{local}: the exported ids are not sorted and unique: rows cannot be looked up")
    out = Path(out_dir).absolute()
    if out.exists() and not _replaceable(out):
        raise FileExistsError(f"{out} exists and is not a serving model: refusing to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    scorer = Scorer(checkpoint, calibrated=True)  # what the servers deliver: calibrated probabilities
    program = scorer.program
    feeds = program.input_vars()
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        with paddle.static.scope_guard(scorer.scope):
            paddle.static.save_inference_model(str(staging / MODEL_PREFIX), feeds, [program.prob], scorer.exe,
                                               program=program.main)
        fetch_names = _saved_fetch_names(paddle, staging, scorer.exe)
        np.save(staging / IDS_FILE, checkpoint.ids.astype(np.uint64))
        meta = checkpoint.meta
        serving = {
            "format": FORMAT,
            "model_name": meta["model"]["name"],
            "model": meta["model"],
            "schema": meta["schema"],
            "feed_names": [v.name for v in feeds],
            "feeds": [_feed_description(v, program, scorer.schema) for v in feeds],
            "fetch_names": fetch_names,
            "model_file": PROGRAM_FILES[0],
            "params_file": PROGRAM_FILES[1],
            "ids_file": IDS_FILE,
            "table_rows": program.table_shape[0],
            "unseen_row": program.table_shape[0] - 1,
            "sparse_values": f"a sparse feed holds row indices, not ids: the position of the id in {IDS_FILE} "
                             f"(sorted), or unseen_row ({program.table_shape[0] - 1}) for an id not in it",
            "embedding_dim": program.table_shape[1],
            "embedding_dtype": program.table_dtype,
            "vocab_size": meta.get("table", {}).get("vocab_size"),
            # Checkpoints made before the name was recorded used the same (and only) function.
            "hash_function": meta.get("hash_function") or HASH_FUNCTION,
            # Applied in the program: model.pdmodel outputs calibrated probabilities.
            "calibration": meta.get("calibration"),
            "source_checkpoint": {"manifest_sha256": ckpt_io.file_digest(local / ckpt_io.MANIFEST)[1],
                                  "mode": meta.get("mode"),
                                  "rows": meta.get("rows"), "paddle_version": meta.get("paddle_version"),
                                  **(source or {"path": str(local)})},
            "paddle_version": paddle.__version__,
        }
        (staging / SERVING_META).write_text(json.dumps(serving, indent=2, sort_keys=True))
        os.chmod(staging, 0o755)  # mkdtemp makes it private
        _swap_in(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


def _feed_description(var: Any, program: Any, schema: Schema) -> dict:
    """What one feed variable takes, for ``serving.json``."""
    if program.feeds.dense is not None and var.name == program.feeds.dense.name:
        return {"name": var.name, "slot": "dense", "dtype": "float32", "shape": [-1, schema.dense_dim],
                "lod_level": 0, "values": "the dense features"}
    slot = schema.sparse_slots[[v.name for v in program.feeds.sparse].index(var.name)]
    return {"name": var.name, "slot": slot, "dtype": "int64", "shape": [-1, 1], "lod_level": 1,
            "values": "row indices (see sparse_values), one LoD sequence per example"}


def _saved_fetch_names(paddle: Any, staging: Path, exe: Any) -> list[str]:
    """The fetch variables as saved (``save_inference_model`` appends a scale op after the target)."""
    with paddle.static.scope_guard(paddle.static.Scope()):
        _, _, fetch_targets = paddle.static.load_inference_model(str(staging / MODEL_PREFIX), exe)
    return [v.name for v in fetch_targets]


def _replaceable(out: Path) -> bool:
    return out.is_dir() and (not any(out.iterdir()) or (out / SERVING_META).is_file())


def _swap_in(staging: Path, out: Path) -> None:
    """Rename ``staging`` to ``out``; an existing ``out`` is moved aside first and removed after."""
    if not out.exists():
        os.rename(staging, out)
        return
    old = out.with_name(f".{out.name}.old-{uuid.uuid4().hex[:8]}")
    os.rename(out, old)
    try:
        os.rename(staging, out)
    except BaseException:
        os.rename(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)


class InferenceModel:
    """A serving model directory loaded for scoring: ``predict(dense, sparse) -> probabilities``."""

    def __init__(self, root: Path, meta: dict, ids: np.ndarray, program: Any, feed_names: list[str],
                 fetch_targets: list, scope: Any, exe: Any):
        import paddle

        self.paddle = paddle
        self.root, self.meta, self.ids = root, meta, ids
        self.schema = Schema.from_dict(meta["schema"])
        self.program, self.feed_names, self.fetch_targets = program, feed_names, fetch_targets
        self.scope, self.exe = scope, exe
        self.dense_name = feed_names[0] if self.schema.dense_dim else None
        self.sparse_names = feed_names[1:] if self.schema.dense_dim else list(feed_names)

    @classmethod
    def load(cls, root: str | os.PathLike) -> InferenceModel:
        """Load a serving model directory; raises :class:`ServingModelError` if it is incomplete or inconsistent."""
        import paddle

        root = Path(root)
        for name in (SERVING_META, IDS_FILE, *PROGRAM_FILES):
            if not (root / name).is_file():
                raise ServingModelError(f"{root} is not a serving model: {name} is missing")
        meta = json.loads((root / SERVING_META).read_text())
        if meta.get("format") != FORMAT:
            raise ServingModelError(f"{root / SERVING_META}: format {meta.get('format')!r}, this code reads {FORMAT}")
        try:
            check_hash_function(meta.get("hash_function"), str(root / SERVING_META))
        except ValueError as err:
            raise ServingModelError(str(err)) from None
        ids = np.load(root / IDS_FILE)
        paddle.enable_static()
        scope = paddle.static.Scope()
        exe = paddle.static.Executor(paddle.CPUPlace())
        with paddle.static.scope_guard(scope):
            program, feed_names, fetch_targets = paddle.static.load_inference_model(str(root / MODEL_PREFIX), exe)
        if list(feed_names) != list(meta["feed_names"]):
            raise ServingModelError(f"{root}: the program feeds {feed_names}, {SERVING_META} says {meta['feed_names']}")
        table = scope.find_var(EMBEDDING_TABLE)
        rows = np.array(table.get_tensor()).shape[0] if table is not None else None
        if rows != len(ids) + 1:
            raise ServingModelError(f"{root}: the embedding table has {rows} rows, {IDS_FILE} holds {len(ids)} ids "
                                    "(expected one more row: the zero row of unseen ids)")
        return cls(root, meta, ids, program, list(feed_names), fetch_targets, scope, exe)

    def _run(self, feed: dict) -> np.ndarray:
        with self.paddle.static.scope_guard(self.scope):
            (prob,) = self.exe.run(self.program, feed=feed, fetch_list=self.fetch_targets)
        return prob

    def predict(self, dense: Optional[np.ndarray], sparse: Sequence[RaggedIds]) -> np.ndarray:
        """Click probabilities (float32 ``[n]``) of ``n`` examples.

        ``dense``: float32 ``[n, dense_dim]`` (ignored when the schema has no dense slot); ``sparse``: one
        :class:`RaggedIds` of raw feature ids per sparse slot, in schema order. Ids the model never saw
        score with the zero row, as in evaluation.
        """
        if dense is None:
            n = len(sparse[0].offsets) - 1 if sparse else 0
            dense = np.zeros((n, self.schema.dense_dim), np.float32)
        return predict_batches(self._run, self.ids, self.dense_name, self.sparse_names, dense, list(sparse))[:, 0]

    def predict_files(self, paths: Sequence[str | os.PathLike]) -> np.ndarray:
        """Probabilities of every example of the MultiSlot files ``paths``, in order."""
        _, dense, sparse = read_shards(paths, self.schema)
        return self.predict(dense, sparse)


def expand_inputs(patterns: Sequence[str]) -> list[Path]:
    """Files named by ``patterns`` (paths or globs; each glob's matches sorted), in the order given."""
    files: list[Path] = []
    for pattern in patterns:
        if glob.has_magic(pattern):
            matches = sorted(p for p in glob.glob(os.path.expanduser(pattern)) if os.path.isfile(p))
            if not matches:
                raise FileNotFoundError(f"no file matches {pattern!r}")
            files.extend(Path(p) for p in matches)
        else:
            path = Path(pattern).expanduser()
            if not path.is_file():
                raise FileNotFoundError(f"{pattern!r} is not a file (give MultiSlot files or a glob)")
            files.append(path)
    return files


def write_predictions(path: str | os.PathLike, preds: np.ndarray) -> None:
    """One probability per line (``%.9g``: a float32 reads back exactly), written atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "w") as f:
            for value in np.asarray(preds, np.float32):
                f.write(f"{value:.9g}\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m components.serving", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    export = commands.add_parser("export", help="checkpoint -> serving model directory")
    export.add_argument("--checkpoint", required=True, help="a committed checkpoint directory (with MANIFEST.json)")
    export.add_argument("--out", required=True, help="the serving model directory to write")
    predict = commands.add_parser("predict", help="score MultiSlot files with a serving model")
    predict.add_argument("--model", required=True, help="a serving model directory")
    predict.add_argument("--input", required=True, nargs="+", help="MultiSlot files or globs (quote globs)")
    predict.add_argument("--output", required=True, help="file to write, one probability per line")
    args = parser.parse_args(argv)
    try:
        if args.command == "export":
            out = export_inference_model(args.checkpoint, args.out)
            meta = json.loads((out / SERVING_META).read_text())
            print(f"serving model {meta['model_name']} ({meta['table_rows'] - 1} rows, feeds "
                  f"{', '.join(meta['feed_names'])}) -> {out}")
        else:
            model = InferenceModel.load(args.model)
            files = expand_inputs(args.input)
            preds = model.predict_files(files)
            write_predictions(args.output, preds)
            print(f"{len(preds)} predictions from {len(files)} file(s) -> {args.output}")
    except (ckpt_io.CheckpointError, ServingModelError, FileNotFoundError, FileExistsError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
