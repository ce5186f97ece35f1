"""What the export step runs: the delivered checkpoint exported per ``export.format``.

* ``sharded`` (default): the next version of the export store (``export.uri``, else ``<checkpoint.uri>-serving``):
  a base, or a delta on the latest version, with a new base every ``export.base_every`` deltas
  (:func:`components.export.sharded.export_sharded`). The checkpoint's table files are fetched and converted
  one at a time, so the step never holds the whole table. The ``serving_model`` artifact gets a copy of that
  version; a delta's ``serving.json`` names its chain and store, so a user loads the store (or the artifact,
  which loads the chain from there).
* ``single``: one Paddle inference model holding every row (:func:`components.export.single.export_single`),
  the artifact itself; the step's memory grows with the table.

Both hold the transform of the dataset the checkpoint trained on (``transform/``), so the model scores raw records,
and both sign ``serving.json`` with ``export.signing_key`` (on Kubeflow, ``auto`` is the key of the Secret
``export.signing_secret`` mounted into this step: :func:`components.export.signing.step_signing_key`); the
artifact carries the signature.

The artifact's metadata names the format, version, kind, parent, rows and shards, the checkpoint it came from, and
whether it has a transform.
"""

from pathlib import Path
from typing import Any, Optional

from components.checkpoint.pointer import fetch_file, fetched_checkpoint
from components.config import ExportFormat, PipelineRunner, from_dict
from components.export.manifest import read_manifest
from components.export.sharded import export_sharded
from components.export.signing import step_signing_key
from components.export.single import export_single
from components.export.store import ExportStore, export_store_uri


def serving_metadata(serving: dict) -> dict:
    """The facts worth showing on the Model artifact (the full set is ``serving.json`` inside it)."""
    source = serving["source_checkpoint"]
    facts = {"format": serving["format"], "model_name": serving["model_name"], "feed_names": serving["feed_names"],
             "fetch_names": serving["fetch_names"], "embedding_dtype": serving["embedding_dtype"],
             "checkpoint_uri": source.get("uri"), "checkpoint_id": source.get("id"),
             "checkpoint_manifest_sha256": source["manifest_sha256"], "paddle_version": serving["paddle_version"],
             "transform": serving.get("transform") is not None}
    if serving["format"] == ExportFormat.single.value:
        return {**facts, "rows": serving["table_rows"] - 1}
    return {**facts, "version": serving["version"], "kind": serving["kind"], "parent": serving["parent"],
            "chain": serving["chain"], "store": serving["store"], "rows": serving["rows"],
            "written_rows": serving["written_rows"], "removed_rows": serving["removed_rows"],
            "shards": serving["shard_num"]}


def export_serving_model(config: Any, checkpoint_path: str, checkpoint_metadata: Optional[dict],
                         out_dir: str, dataset_dir: Optional[str] = None) -> dict:
    """Export the checkpoint the Model artifact points at, with the transform of the dataset it trained on
    (``dataset_dir``; None: an export that scores shards only); ``out_dir`` gets the model (or version) written.
    Returns the artifact metadata."""
    cfg = from_dict(config)
    signing_key = step_signing_key(cfg.export.signing_key, cfg.cluster.runner is PipelineRunner.kubeflow)
    with fetched_checkpoint(checkpoint_path, checkpoint_metadata) as (uri, ckpt_id, local):
        source = {"uri": uri, "id": ckpt_id}

        def fetch(rel: str) -> Path:
            return fetch_file(uri, ckpt_id, rel, local.parent / "tables")

        if cfg.export.format is ExportFormat.single:
            serving = read_manifest(export_single(local, out_dir, cfg.export.dtype, source, fetch, dataset_dir,
                                                  signing_key))
        else:
            store_uri = export_store_uri(cfg)
            serving = export_sharded(local, store_uri, cfg.export.dtype, cfg.export.base_every, source, fetch,
                                     dataset_dir, signing_key)
            ExportStore(store_uri).copy_to(serving["version"], Path(out_dir))
    what = (f"version {serving['version']} ({serving['kind']}) in {serving['store']}"
            if serving["format"] == ExportFormat.sharded.value else "single-file model")
    print(f"serving model: {serving['model_name']} from checkpoint {ckpt_id} in {uri} -> {what}, {out_dir}",
          flush=True)
    return serving_metadata(serving)
