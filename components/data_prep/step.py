"""What the data-prep step runs: plain functions over :mod:`components.data_prep.prepare` (no KFP needed)."""

from typing import Any

from components.config import DataSource, from_dict
from components.data_prep.prepare import prepare_files, prepare_synthetic


def prepare_dataset(config: Any, out_dir: str) -> dict:
    """Build the dataset ``cfg.data`` describes into ``out_dir``; returns the stats dict.

    Shards: one per worker reader (``ps.workers * data.shards_per_worker``), as the launcher expects.
    """
    cfg = from_dict(config)
    data = cfg.data
    common = dict(test_fraction=data.test_fraction, num_shards=cfg.ps.workers * data.shards_per_worker,
                  vocab_size=cfg.table.vocab_size, seed=data.seed)
    if data.source is DataSource.synthetic:
        return prepare_synthetic(out_dir, rows=data.rows, **common)
    return prepare_files(out_dir, uri=data.uri, fmt=data.format.value,
                         max_malformed_fraction=data.max_malformed_fraction,
                         slots=list(data.slots) if data.slots else None, **common)


def dataset_metadata(stats: dict) -> dict:
    """The few stats worth showing on the Dataset artifact (the full set is ``stats.json`` inside it)."""
    meta = {"format": stats["format"], "rows": stats["rows"], "ctr": stats["ctr"]}
    if stats.get("bayes"):
        meta["bayes"] = stats["bayes"]
    return meta


