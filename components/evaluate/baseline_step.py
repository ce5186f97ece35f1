"""The baseline as a step of its own: fitted on the prepared dataset alone, before training, and cached per dataset.

The hashed logistic regression (:mod:`components.evaluate.baseline`) needs the data, not the model: ``fit-baseline``
fits it from the dataset's first ``eval.baseline_rows`` train rows (its L2 chosen on as many validation rows) and
writes it into a directory (:class:`components.networks.models.FittedBaseline`); the train step blends it into the
delivered model and the evaluate step scores the test split with it. The step cache (KFP's, and kfp.local's) serves
it again to every run of the same dataset (a sweep over training keys, a rerun). A model that blends it in trains
beside its fit, which publishes itself to the running job (:mod:`components.networks.baseline_handoff`): on Kubeflow
this step runs beside the train step; kfp.local runs one task at a time, so there the train step runs this module
beside its job (``python -m components.evaluate.baseline_step``), and this step, after it, takes the published fit.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from components.data_prep.multislot import RaggedIds, Schema, read_shards
from components.evaluate.baseline import HashedLogisticRegression, Split
from components.networks import baseline_handoff
from components.networks.models import FittedBaseline
from components.ps.liveness import die_with_parent, parent_from_env
from components.storage import Storage

FIT_FILE = "baseline.json"


def fit_baseline(data_dir: str | os.PathLike, rows: int, features: int, out_dir: str | os.PathLike,
                 handoff: str = "") -> dict[str, Any]:
    """Fit the baseline on ``data_dir`` and write it into ``out_dir``; returns what it was fitted with
    (``baseline_rows``, ``baseline_l2``, ``baseline_l2_chosen_by``, ``baseline_features``). ``handoff``: where a
    job training beside the fit waits for it (:func:`components.networks.baseline_handoff.handoff_uri`), which is
    told of a failure too; a fit published there already is taken instead."""
    if not handoff:
        return _fit(data_dir, rows, features, out_dir)
    store = Storage(handoff)
    published = baseline_handoff.take_published(store, Path(out_dir))
    if published is not None:
        (Path(out_dir) / FIT_FILE).write_text(json.dumps(published, indent=2))
        return published
    baseline_handoff.clear_failure(store)
    try:
        fit = _fit(data_dir, rows, features, out_dir)
    except Exception as err:
        baseline_handoff.publish_failure(store, f"{type(err).__name__}: {err}")
        raise
    baseline_handoff.publish(out_dir, store, fit)
    return fit


def _fit(data_dir: str | os.PathLike, rows: int, features: int, out_dir: str | os.PathLike) -> dict[str, Any]:
    stats = json.loads((Path(data_dir) / "stats.json").read_text())
    schema = Schema.from_dict(stats["schema"])
    train = _first_rows(data_dir, stats, schema, "train", rows)
    valid = _first_rows(data_dir, stats, schema, "valid", rows)
    model = HashedLogisticRegression(features).fit(
        *train, valid=valid, negative_sample_rate=stats.get("negative_sample_rate", 1.0))
    chosen_by = (f"validation logloss of {len(valid.labels):,} rows" if model.validation_logloss
                 else "default: the dataset has no validation split")
    fit = {"baseline_rows": len(train.labels), "baseline_l2": model.l2, "baseline_l2_chosen_by": chosen_by,
           "baseline_features": features}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    FittedBaseline(model.weights, model.dense_weights, model.bias, model.logit_shift).save(out)
    (out / FIT_FILE).write_text(json.dumps(fit, indent=2))
    return fit


def load_baseline(baseline_dir: str | os.PathLike) -> tuple[HashedLogisticRegression, dict[str, Any]]:
    """``(the fitted model, what it was fitted with)`` from a directory :func:`fit_baseline` wrote."""
    saved = FittedBaseline.load(baseline_dir)
    model = HashedLogisticRegression(len(saved.weights))
    model.weights, model.dense_weights, model.bias, model.logit_shift = (saved.weights, saved.dense_weights,
                                                                         saved.bias, saved.logit_shift)
    return model, json.loads((Path(baseline_dir) / FIT_FILE).read_text())


def _first_rows(data_dir: str | os.PathLike, stats: dict, schema: Schema, split: str, max_rows: int) -> Split:
    """The first ``max_rows`` rows of ``split`` (none if the dataset has no such split), reading whole shard files
    only until it has them."""
    paths, rows = [], 0
    for rel, count in zip(stats["shards"].get(split, []), stats["shard_rows"].get(split, [])):
        if rows >= max_rows:
            break
        paths.append(Path(data_dir) / rel)
        rows += count
    labels, split_dense, split_sparse, weights = read_shards(paths, schema, with_weights=True)
    cut = [RaggedIds(slot.values[:slot.offsets[max_rows]] if len(slot.offsets) > max_rows else slot.values,
                     slot.offsets[:max_rows + 1]) for slot in split_sparse]
    return Split(labels[:max_rows], split_dense[:max_rows], cut, weights[:max_rows] if schema.weighted else None)


def main(argv: list[str] | None = None) -> None:
    """The fit beside a local job (:mod:`components.train.fit_beside` starts it): it dies with the train step."""
    die_with_parent(parent_from_env())
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("data_dir")
    parser.add_argument("rows", type=int)
    parser.add_argument("features", type=int)
    parser.add_argument("out_dir")
    parser.add_argument("handoff")
    args = parser.parse_args(argv)
    fit = fit_baseline(args.data_dir, args.rows, args.features, args.out_dir, args.handoff)
    print(json.dumps(fit), flush=True)


if __name__ == "__main__":
    main()
