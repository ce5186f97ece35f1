"""The sharded serving export (``export.format=sharded``): the next version of the export store, shard by shard.

A version directory (:mod:`components.export.store` names and publishes it)::

    model.pdmodel, model.pdiparams   the dense inference program (:func:`components.export.program.rows_program`):
                                     feeds ``dense`` and, per sparse slot, ``<slot>.rows`` (the looked-up rows)
    shards/SSSSS.*.npy               the embedding rows, one set of files per table shard (:mod:`.shards`):
                                     every row (a base) or what changed since the parent (a delta, :mod:`.delta`)
    transform/                       the training data's transform (raw record -> row), when exported with its
                                     dataset: transform.json (+ id_counts.npy under a count filter)
    serving.json                     written last (keys below)

``serving.json``: ``format`` (``sharded``), ``format_version``, ``kind`` (base or delta), ``version``,
``parent`` (None for a base), ``chain`` (the versions a loader applies: the base, then each delta), ``store``,
``feed_names`` / ``feeds`` / ``fetch_names``, ``slot_tables`` (slot -> table), ``hash_function``,
``vocab_size``, ``negative_sample_rate`` / ``correction``, ``calibration``, ``embedding_dim`` / ``embedding_dtype``,
``shard_num``, ``rows`` (the full table's at this version), ``written_rows`` / ``removed_rows``, ``shards`` (per
shard: its files, ``written``, ``removed``, ``total``), ``source_checkpoint`` (uri and id or path, its MANIFEST.json
sha256), ``transform`` (the transform's description, or None), and ``files`` (every other file's size and sha256).

Memory: one table shard (the checkpoint's, and for a delta its parent's rebuilt) at a time and the next one being
read, plus the dense parameters; the checkpoint's shard files are fetched and dropped one by one.
"""

from __future__ import annotations

import datetime as _dt
import os
from typing import Any, Optional

from components.config import ExportDtype
from components.data_prep.multislot import Schema
from components.export.delta import DELTA, diff_shard, plan_version, rebuilt_shard
from components.export.manifest import checkpoint_facts, copy_transform, file_entries, write_manifest
from components.export.signing import AUTO, signer
from components.export.program import PROGRAM_FILES, declared_ops, rows_program, save_inference
from components.networks.scoring import BUCKETS_SUFFIX, bucket_feed_description
from components.export.shards import IDS, ROWS, TOMBSTONES, narrowed, write_shard
from components.export.store import ExportStore
from components.export.table import CheckpointTable, FetchFile
from components.networks.models import EMBEDDING_TABLE


def export_sharded(checkpoint_dir: str | os.PathLike, store_uri: str, dtype: ExportDtype = ExportDtype.float32,
                   base_every: int = 8, source: Optional[dict] = None,
                   fetch: Optional[FetchFile] = None, dataset_dir: Optional[str | os.PathLike] = None,
                   signing_key: str = AUTO) -> dict[str, Any]:
    """Export the committed checkpoint at ``checkpoint_dir`` (its table files through ``fetch``, see
    :class:`~components.export.table.CheckpointTable`) as the next version of the export store ``store_uri``:
    a base, or a delta on the latest version (:func:`components.export.delta.plan_version`). ``source`` is
    recorded as where the checkpoint lives (default ``{"path": checkpoint_dir}``). ``dataset_dir``: the dataset the
    checkpoint trained on, whose transform the version holds (every version its own: a new day's dataset may map
    ids by new counts; :func:`components.export.manifest.copy_transform`). ``signing_key`` is
    ``export.signing_key`` (:func:`components.export.signing.signer`). Returns the version's ``serving.json``; a
    failure leaves no version behind.
    """
    import paddle

    if base_every < 0:
        raise ValueError(f"export.base_every must be >= 0 (0: every export is a base), got {base_every}")
    sign = signer(signing_key)  # a key that cannot sign fails before any work
    table = CheckpointTable(checkpoint_dir, fetch)  # verifies the manifest first
    store = ExportStore(store_uri)
    latest = store.latest()
    parent = store.manifest(latest) if latest is not None else None
    layout = {"shard_num": table.shard_num, "embedding_dim": table.embedding_dim, "embedding_dtype": dtype.value,
              "schema": table.meta["schema"]}
    plan = plan_version(parent, base_every, layout)
    chain = [store.manifest(version) for version in plan.chain[:-1]]  # the parent's, to rebuild its shards
    program = rows_program(table.meta, table.dense())
    schema = Schema.from_dict(table.meta["schema"])
    # What each feed carries: a network that starts from the baseline also feeds each slot's buckets.
    slots = ((["dense"] if schema.dense_dim else []) + list(schema.sparse_slots)
             + [f"{slot}{BUCKETS_SUFFIX}" for slot in schema.sparse_slots if program.baseline_feeds])
    with store.publishing(plan.version) as staging:
        fetch_names = save_inference(staging, program.feeds, program.prob, program.main, program.scope, program.exe,
                                     declared_ops(table.meta))
        transform_files, transform = copy_transform(dataset_dir, staging, table.meta)
        shards = []
        for shard in table.shards():
            stored = narrowed(shard.rows, dtype)
            if plan.kind == DELTA:
                parent_ids, parent_rows = rebuilt_shard(store, chain, shard.index)
                entry = write_shard(staging, shard.index, *diff_shard(parent_ids, parent_rows, shard.ids, stored))
            else:
                entry = write_shard(staging, shard.index, shard.ids, stored)
            shards.append({**entry, "total": int(len(shard.ids))})
        manifest = {
            **checkpoint_facts(table.meta, table.manifest_sha256, source or {"path": str(table.root)}),
            "format": "sharded",
            "kind": plan.kind, "version": plan.version, "parent": plan.parent, "chain": plan.chain,
            "store": store.version_url(),
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "feed_names": [v.name for v in program.feeds],
            "feeds": [_feed_description(v.name, slot, schema, table.embedding_dim)
                      for v, slot in zip(program.feeds, slots)],
            "fetch_names": fetch_names,
            "model_file": PROGRAM_FILES[0],
            "params_file": PROGRAM_FILES[1],
            "slot_tables": {slot: EMBEDDING_TABLE for slot in schema.sparse_slots},
            **layout,
            "shard_rule": "a row lives in shard id % shard_num, ids sorted within it; an id no shard holds has a "
                          "zero row",
            "rows": sum(entry["total"] for entry in shards),
            "written_rows": sum(entry["written"] for entry in shards),
            "removed_rows": sum(entry.get("removed", 0) for entry in shards),
            "shards": shards,
            "paddle_version": paddle.__version__,
            "transform": transform,
            "files": file_entries(staging, [*PROGRAM_FILES, *transform_files,
                                            *(entry[kind] for entry in shards for kind in (IDS, ROWS, TOMBSTONES)
                                              if kind in entry)]),
        }
        write_manifest(staging, manifest, sign)
    return manifest


def _feed_description(name: str, slot: str, schema: Schema, dim: int) -> dict:
    """What one feed variable takes, for ``serving.json``."""
    if slot == "dense":
        return {"name": name, "slot": slot, "dtype": "float32", "shape": [-1, schema.dense_dim],
                "lod_level": 0, "values": "the dense features"}
    if slot.endswith(BUCKETS_SUFFIX):
        return bucket_feed_description(name, slot.removesuffix(BUCKETS_SUFFIX))
    return {"name": name, "slot": slot, "dtype": "float32", "shape": [-1, dim], "lod_level": 1,
            "values": "the embedding rows of the slot's ids, looked up in the shards (zeros for an id no shard "
                      "holds), one LoD sequence per example"}
