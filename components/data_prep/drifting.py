"""Deterministic multi-day Criteo-format logs whose click model drifts: day-by-day training's test bed.

Day ``d`` has ``rows_per_day`` rows of raw Criteo TSV (label, I1..I13, C1..C26) drawn from a hidden logistic model
that moves from one day to the next, as ads traffic does:

* **ids persist and arrive**: a slot's value is, with probability ``1 - recent_share - new_share``, a Zipf draw over
  the slot's persistent vocabulary (popular ids every day); with ``recent_share``, an id born in the last
  ``recent_days`` days; with ``new_share``, an id born today (never seen before);
* **weights drift**: an id's weight rotates between two hidden directions, ``w(d) = a cos(theta d) + b sin(theta d)``
  (its spread stays the same, who matters changes);
* **the CTR shifts**: the bias moves by ``ctr_shift`` on the logit scale per day.

Because the true click probabilities are known, each day's oracle (Bayes-optimal AUC and logloss) is returned.
Same spec and seed: identical files.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from components.data_prep.multislot import text_bytes
from components.data_prep.synthetic import DEFAULT_CARDINALITIES, bayes_metrics, category_value

DENSE_DIM = 13


@dataclass(frozen=True)
class DriftingSpec:
    days: int = 4
    rows_per_day: int = 150_000
    cardinalities: tuple[int, ...] = DEFAULT_CARDINALITIES  # each slot's persistent vocabulary
    zipf_exponent: float = 1.1
    recent_share: float = 0.15
    new_share: float = 0.1
    recent_days: int = 3
    new_ids_per_day: float = 0.05  # ids born per day, as a fraction of the slot's persistent vocabulary (>= 1)
    id_weight_scale: float = 0.45
    theta: float = 0.3  # radians the id weights rotate per day
    dense_weight_scale: float = 0.3
    base_logit: float = -1.3
    ctr_shift: float = 0.08


def _zipf(rng: np.random.Generator, size: int, n: int, exponent: float) -> np.ndarray:
    weights = 1.0 / np.arange(1, size + 1) ** exponent
    return rng.choice(size, n, p=weights / weights.sum())


def write_days(out_dir: str | Path, spec: DriftingSpec = DriftingSpec(), seed: int = 0,
               name: str = "day_{day}.tsv") -> dict:
    """Write days ``0 .. spec.days - 1`` as ``out_dir/<name>``; returns (and writes into ``oracle.json``) each day's
    Bayes-optimal metrics and its share of ids never seen on an earlier day."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model_rng = np.random.default_rng(np.random.SeedSequence([seed, 1]))
    born = [max(1, int(c * spec.new_ids_per_day)) for c in spec.cardinalities]  # new ids per slot per day
    universe = [c + b * spec.days for c, b in zip(spec.cardinalities, born)]
    # Rarer persistent ids and newer ones carry weight too: every id its own two directions.
    directions = [model_rng.normal(0, spec.id_weight_scale, (2, u)) for u in universe]
    dense_weights = model_rng.normal(0, spec.dense_weight_scale, DENSE_DIM)
    hexes = [pa.array([category_value(k) for k in range(u)]) for u in universe]
    oracle, seen = {}, [np.zeros(u, bool) for u in universe]
    for day in range(spec.days):
        rng = np.random.default_rng(np.random.SeedSequence([seed, 2, day]))
        n = spec.rows_per_day
        counts = np.where(rng.random((n, DENSE_DIM)) < 0.2, 0, rng.geometric(0.05, (n, DENSE_DIM)))
        logit = spec.base_logit + spec.ctr_shift * day + (np.log1p(counts) / 4.0) @ dense_weights
        categories = np.empty((n, len(universe)), np.int64)
        new_ids = total_ids = 0
        for f, (persistent, per_day) in enumerate(zip(spec.cardinalities, born)):
            kind = rng.random(n)
            ids = _zipf(rng, persistent, n, spec.zipf_exponent)
            recent = kind < spec.recent_share + spec.new_share
            first_recent_day = max(0, day - spec.recent_days)
            span = (day - first_recent_day + 1) * per_day
            ids[recent] = persistent + first_recent_day * per_day + rng.integers(0, span, int(recent.sum()))
            today = kind < spec.new_share
            ids[today] = persistent + day * per_day + _zipf(rng, per_day, int(today.sum()), spec.zipf_exponent)
            categories[:, f] = ids
            angle = spec.theta * day
            logit += np.cos(angle) * directions[f][0, ids] + np.sin(angle) * directions[f][1, ids]
            distinct = np.unique(ids)
            new_ids += int((~seen[f][distinct]).sum())
            total_ids += len(distinct)
            seen[f][distinct] = True
        probabilities = 1.0 / (1.0 + np.exp(-logit))
        labels = (rng.random(n) < probabilities).astype(np.int64)
        texts = [pc.cast(pa.array(labels), pa.string())]
        texts += [pc.if_else(pa.array(counts[:, c] == 0), "", pc.cast(pa.array(counts[:, c]), pa.string()))
                  for c in range(DENSE_DIM)]
        texts += [pc.take(table, pa.array(categories[:, f])) for f, table in enumerate(hexes)]
        texts[-1] = pc.binary_join_element_wise(texts[-1], "\n", "")
        (out / name.format(day=day)).write_bytes(text_bytes(pc.binary_join_element_wise(*texts, "\t")))
        oracle[str(day)] = {**bayes_metrics(labels, probabilities), "ctr": float(labels.mean()),
                            "new_id_fraction": new_ids / total_ids if day else None}
    (out / "oracle.json").write_text(json.dumps({"spec": asdict(spec), "seed": seed, "days": oracle}, indent=2))
    return oracle
