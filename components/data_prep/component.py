"""KFP v2 component for data prep: a thin wrapper over :mod:`components.data_prep.prepare`.

The component body only maps the pipeline's config and artifacts onto :func:`prepare_dataset`, which
holds the logic and is importable (and unit-testable) without KFP. Lightweight-component rule: the
body is shipped as source, so every import it needs happens inside it.
"""

# No `from __future__ import annotations`: KFP reads the component signatures' annotations as types.
from typing import Any

from kfp import dsl
from kfp.dsl import Dataset, Output

# The one image every step of the pipeline runs in: this package installed on Paddle 2.6.2. The
# components import the package from it, hence install_kfp_package=False (kfp is in the image too).
PIPELINE_IMAGE = "paddle-ps-pipelines:0.1.0"


def _integral_floats_to_int(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _integral_floats_to_int(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_integral_floats_to_int(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def step_config(config: Any) -> Any:
    """The typed config inside a step, from the ``config`` parameter the step received.

    A KFP ``dict`` parameter travels as a protobuf Struct, whose only number type is double: ``epochs: 2``
    arrives as ``2.0``, which the schema's int fields refuse. Integral floats go back to ints (a float
    field takes the int as well), then :func:`components.config.from_dict` rebuilds the schema.
    """
    from components.config import from_dict

    return from_dict(_integral_floats_to_int(config))


def prepare_dataset(config: Any, out_dir: str) -> dict:
    """Build the dataset ``cfg.data`` describes into ``out_dir``; returns the stats dict.

    Shards: one per worker reader (``ps.workers * data.shards_per_worker``), as the launcher expects.
    """
    from components.config import DataSource
    from components.data_prep.prepare import prepare_files, prepare_synthetic

    cfg = step_config(config)
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


# A running step imports this module for the plain functions above, and there kfp.dsl is the runtime
# subset (_KFP_RUNTIME=true): it has no decorators, and the component object is not needed.
if hasattr(dsl, "component"):
    @dsl.component(base_image=PIPELINE_IMAGE, install_kfp_package=False)
    def prepare_data(config: dict, dataset: Output[Dataset]):
        """Synthetic or file data -> sharded MultiSlot train/test splits + stats.json."""
        from components.data_prep.component import dataset_metadata, prepare_dataset

        dataset.metadata.update(dataset_metadata(prepare_dataset(config, dataset.path)))
