"""Serving an exported model, in either format, and the command line that exports and scores.

Two formats (``export.format``; ``serving.json["format"]`` says which a directory holds):

* ``sharded`` (:mod:`components.export.sharded`, the default): versions in an export store, each the dense
  program plus the embedding rows as memory-mapped, id-sorted shards; a version is a base or a delta on the one
  before. :class:`ShardedModel` looks each batch's rows up in the shards, so its memory follows the rows the
  batches touch, not the table, and :meth:`ShardedModel.apply_delta` moves a loaded model to the next version.
* ``single`` (:mod:`components.export.single`): one Paddle inference model holding every row (small tables).

Every export's ``serving.json`` is signed (``--signing-key``, :mod:`components.export.signing`); a model loads
only once that signature checks out with the operator's public key (``--public-key``, else
``$CTR_SERVING_PUBLIC_KEY``, else the per-user ``key.pub``; ``--allow-unsigned`` accepts any), then every
file is checked against ``serving.json``'s sha256 (``verify=False`` skips that).

How to run it on new data
-------------------------
1. Export a committed checkpoint: a local directory holding ``MANIFEST.json`` (in a checkpoint store, the
   directory of one checkpoint). The pipeline's ``export-model`` step does this, and a local run leaves the
   version it wrote in ``run_dir/serving_model/``::

       python -m components.export.serving export --checkpoint CHECKPOINT_DIR --out EXPORT_STORE --dataset DATA_DIR
       python -m components.export.serving export --checkpoint CHECKPOINT_DIR --out MODEL_DIR --format single

   ``sharded`` writes the next version into the export store ``--out`` (a base, or a delta after one:
   ``--base-every``); ``single`` writes the model directory ``--out``. ``--dtype float16`` halves the rows.
   ``--dataset``: the prepared dataset the checkpoint trained on, whose transform goes with the model.

2. Give it raw records in the format it trained on (an export made with its dataset, ``--dataset``, holds the
   dataset's transform: ``serving.json["transform"]``): the same files data prep read (a path, glob, directory or
   fsspec URL; the label column is read and ignored), mapped to ids and dense values by data prep's own code, so
   exactly as training saw them. Or, for any export, give it MultiSlot shards
   (:mod:`components.data_prep.multislot`) as the data-prep step writes them (its splits are valid input). Do
   not hash ids by hand: data prep also maps empty values to ``<missing>``, rare ids to their slot's OOV id
   (``data.min_id_count``) and normalises dense values; the transform
   (:class:`components.data_prep.transform.Transform`) does all of it.

3. Score them: one probability per record, in input order (inputs in the order given, each glob's matches
   sorted; blank lines have none). ``--input-format`` is ``records`` by default when the model has a transform,
   else ``shards``. ``--model`` is a single-file model, a sharded version directory (a delta loads its chain
   from the export store its ``serving.json`` names) or an export store (its latest version)::

       python -m components.export.serving predict --model EXPORT_STORE --input 'raw/day-*.tsv' --output preds.txt
       python -m components.export.serving predict --model EXPORT_STORE --input-format shards \
           --input 'new/part-*.txt' --output preds.txt

4. Serve it online: raw instances in, probabilities out, on KServe's v1 and v2 protocols
   (:mod:`components.export.server`), following the export store: each new version is checked and swapped in
   while serving (:mod:`components.export.follow`)::

       python -m components.export.serving serve --model EXPORT_STORE --port 8080
       curl -d '{"instances": [["1", "", ...]]}' localhost:8080/v1/models/ctr:predict

From Python: ``components.export.model.InferenceModel.load(path).predict_records(data)`` (bytes of training-format lines) or
``.predict_instances(instances)`` (raw fields without the label, as lists in column order or objects by column);
``.predict(dense, sparse)`` with ``(labels, dense, sparse) =
read_shards(paths, model.schema)`` (or your own ``[n, dense_dim]`` float32 array and one
:class:`~components.data_prep.multislot.RaggedIds` of raw ids per sparse slot).
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import uuid
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from components.checkpoint import format as ckpt_io
from components.config import ExportDtype, ExportFormat
from components.data_prep.sources import Unit, list_inputs, read_blocks
from components.export.manifest import ServingModelError, read_manifest
from components.export.model import InferenceModel
from components.export.sharded import export_sharded
from components.export.signing import AUTO, PUBLIC_KEY_ENV
from components.export.single import export_single

INPUT_FORMATS = ("records", "shards")  # predict --input-format


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


def predict_record_files(model: InferenceModel, patterns: Sequence[str]) -> tuple[np.ndarray, int]:
    """``(probabilities, files read)`` of the raw records of ``patterns`` (each a path, glob, directory or fsspec
    URL, listed and read as data prep lists and reads its input), a block of whole lines at a time."""
    files = [found for pattern in patterns for found in list_inputs(pattern)]
    preds = []
    for file in files:
        lines = 1
        for _, block in read_blocks(Unit(0, file.url, 0, file.size, file.compressed)):
            preds.append(model.predict_records(block, file.url, lines))
            lines += block.count(b"\n")
    return (np.concatenate(preds) if preds else np.zeros(0, np.float32)), len(files)


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


def _export(args: argparse.Namespace) -> str:
    """Run the ``export`` command; returns its one-line summary."""
    dtype = ExportDtype(args.dtype)
    if args.format == ExportFormat.single.value:
        out = export_single(args.checkpoint, args.out, dtype, dataset_dir=args.dataset, signing_key=args.signing_key)
        meta = read_manifest(out)
        return (f"serving model {meta['model_name']} ({meta['table_rows'] - 1} rows, feeds "
                f"{', '.join(meta['feed_names'])}) -> {out}")
    meta = export_sharded(args.checkpoint, args.out, dtype, args.base_every, dataset_dir=args.dataset,
                          signing_key=args.signing_key)
    on = f" on version {meta['parent']}" if meta["parent"] is not None else ""
    return (f"serving version {meta['version']} ({meta['kind']}{on}) of {meta['model_name']}: {meta['rows']} rows "
            f"in {meta['shard_num']} shards, {meta['written_rows']} written, {meta['removed_rows']} removed -> "
            f"{meta['store']}")


def _serve(args: argparse.Namespace) -> None:
    """Run the ``serve`` command until SIGTERM or SIGINT."""
    import logging

    from components.export.follow import LoadOptions
    from components.export.server import serve  # FastAPI and uvicorn: only the serve command needs them

    if args.max_batch < 1 or args.poll_seconds < 0:
        raise ValueError(f"--max-batch must be >= 1 and --poll-seconds >= 0, got {args.max_batch} and "
                         f"{args.poll_seconds}")
    # The project's loggers (the follower's refusals, the server's errors) to stderr; Paddle's import has already
    # given the root logger a handler, which would make basicConfig do nothing.
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    project = logging.getLogger("components")
    project.addHandler(handler)
    project.setLevel(logging.INFO)
    project.propagate = False
    options = LoadOptions(public_key=args.public_key, allow_unsigned=args.allow_unsigned)
    serve(args.model, options, args.host, args.port, args.name, args.poll_seconds, args.max_batch)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m components.export.serving", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    export = commands.add_parser("export", help="checkpoint -> the next version of an export store, or a model")
    export.add_argument("--checkpoint", required=True, help="a committed checkpoint directory (with MANIFEST.json)")
    export.add_argument("--out", required=True, help="sharded: the export store; single: the model directory")
    export.add_argument("--format", choices=[f.value for f in ExportFormat], default=ExportFormat.sharded.value)
    export.add_argument("--dtype", choices=[d.value for d in ExportDtype], default=ExportDtype.float32.value,
                        help="of the embedding rows")
    export.add_argument("--base-every", type=int, default=8, help="sharded: a new base after this many deltas "
                        "(0: always a base)")
    export.add_argument("--dataset", help="the prepared dataset the checkpoint trained on: its transform goes "
                        "with the model, which then scores raw records (without it: MultiSlot shards only)")
    export.add_argument("--signing-key", default=AUTO, help="the PEM PKCS#8 EC P-256 private key that signs "
                        "serving.json (export.signing_key); auto: the per-user key, made on first use; none: unsigned")
    predict = commands.add_parser("predict", help="score raw records or MultiSlot files with an exported model")
    predict.add_argument("--model", required=True, help="a model or version directory, or an export store")
    predict.add_argument("--input", required=True, nargs="+", help="files, globs (quote them), directories or "
                         "fsspec URLs (records; shards: local files or globs)")
    predict.add_argument("--input-format", choices=INPUT_FORMATS, help="records: raw lines in the training "
                         "data's format (the default when the model has a transform); shards: MultiSlot files")
    predict.add_argument("--output", required=True, help="file to write, one probability per line")
    predict.add_argument("--no-verify", action="store_true", help="skip checking every file's sha256 at load")
    predict.add_argument("--public-key", help=f"the PEM public key the export was signed for (default: "
                         f"${PUBLIC_KEY_ENV}, else the per-user key.pub)")
    predict.add_argument("--allow-unsigned", action="store_true", help="accept an export that is unsigned or "
                         "whose signature does not check out")
    serve = commands.add_parser("serve", help="serve a model online (KServe v1 and v2), following its export store")
    serve.add_argument("--model", required=True, help="an export store (any fsspec URL) or a version or model "
                       "directory (a sharded version follows the store it names)")
    serve.add_argument("--host", default="127.0.0.1", help="0.0.0.0 in a container")
    serve.add_argument("--port", type=int, default=8080)
    serve.add_argument("--name", default="ctr", help="the model name in the request paths")
    serve.add_argument("--public-key", help=f"the PEM public key the exports are signed for (default: "
                       f"${PUBLIC_KEY_ENV}, else the per-user key.pub)")
    serve.add_argument("--allow-unsigned", action="store_true", help="serve exports that are unsigned or whose "
                       "signature does not check out")
    serve.add_argument("--poll-seconds", type=float, default=10.0, help="how often to look for a new version "
                       "(0: never)")
    serve.add_argument("--max-batch", type=int, default=1024, help="the most instances one request may hold")
    args = parser.parse_args(argv)
    try:
        if args.command == "export":
            print(_export(args))
        elif args.command == "serve":
            _serve(args)
        else:
            model = InferenceModel.load(args.model, verify=not args.no_verify, public_key=args.public_key,
                                        allow_unsigned=args.allow_unsigned)
            input_format = args.input_format or ("records" if model.transform is not None else "shards")
            if input_format == "records":
                preds, count = predict_record_files(model, args.input)
            else:
                files = expand_inputs(args.input)
                preds, count = model.predict_files(files), len(files)
            write_predictions(args.output, preds)
            print(f"{len(preds)} predictions from {count} file(s) of {input_format} -> {args.output}")
    except (ckpt_io.CheckpointError, ServingModelError, FileNotFoundError, FileExistsError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def cli() -> None:
    """The ``ctr-serving`` console script."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
