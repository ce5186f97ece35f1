"""Deterministic Criteo-like synthetic CTR data with a known (hidden) click model.

Rows have 13 dense count features (heavy-tailed, some missing, normalised exactly like
raw Criteo by ``formats.normalize_count``) and 26 categorical fields ``C1..C26`` with
varied cardinalities (3 to 40,000) and Zipf-skewed category frequencies. The
click probability of a row is ``sigmoid(logit)`` with

    logit = bias
          + dense_weights . x                        (x = normalised counts, as for raw Criteo)
          + sum_f w_f[c_f]                           (per-category weights, shrinking with rarity)
          + sum_{f<g in interacting} <v_f[c_f], v_g[c_g]>   (rank-4 FM-style term over the
                                                               10 smallest fields)

and the label is a Bernoulli draw of that probability. The hidden model depends on the
seed only (the bias is calibrated to ``base_ctr`` on a fixed-size sample), so datasets
of different sizes share it. Because the true probabilities are known,
:func:`bayes_metrics` gives the best AUC/logloss any model can reach on a split.

Same seed and spec -> identical arrays and identical text (for a given numpy version).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import NamedTuple

import numpy as np

import pyarrow as pa
import pyarrow.compute as pc

from components.data_prep.formats import normalize_count
from components.data_prep.hashing import feature_ids
from components.data_prep.multislot import Schema, format_float, text_bytes
from components.metrics import binary_metrics

# Criteo-like spread: a few tiny fields, many mid-sized, several large ones.
DEFAULT_CARDINALITIES = (
    1400, 550, 30000, 12000, 300, 24, 9000, 630, 3, 40000, 5200, 25000, 3100,
    27, 10000, 20000, 10, 4500, 2000, 4, 22000, 18, 15, 16000, 100, 12000,
)  # fmt: skip
# Criteo Kaggle's 26 cardinalities, the largest capped at 2M (the hidden model keeps two floats per category):
# most ids of the big fields are seen once, as in the real logs.
CRITEO_CARDINALITIES = (
    1460, 583, 2_000_000, 1_500_000, 305, 24, 12517, 633, 3, 93145, 5683, 2_000_000, 3194,
    27, 14992, 1_800_000, 10, 5652, 2173, 4, 1_200_000, 18, 15, 286181, 105, 142572,
)  # fmt: skip
_CALIBRATION_ROWS = 100_000
_SMALL_COUNTS = 1 << 16


@dataclass(frozen=True)
class SyntheticSpec:
    """Shape and signal strength of the generator.

    The defaults give a base CTR of 0.25 and a Bayes AUC of about 0.84; logistic
    regression on 200k rows reaches ~0.80 and an FM ~0.80+ (>= 95% of Bayes).
    """

    cardinalities: tuple[int, ...] = DEFAULT_CARDINALITIES
    dense_dim: int = 13
    zipf_exponent: float = 1.2
    base_ctr: float = 0.25
    dense_missing_rate: float = 0.15
    dense_weight_scale: float = 2.2
    id_weight_scale: float = 0.3
    id_weight_decay_rank: float = 20.0
    interaction_fields: int = 10
    interaction_rank: int = 4
    interaction_scale: float = 0.2

    @property
    def sparse_slots(self) -> list[str]:
        return [f"C{index}" for index in range(1, len(self.cardinalities) + 1)]

    @property
    def interacting_fields(self) -> np.ndarray:
        """The fields whose pairs interact: the ``interaction_fields`` smallest (enough rows per pair to learn)."""
        return np.sort(np.argsort(self.cardinalities, kind="stable")[: self.interaction_fields])

    @property
    def schema(self) -> Schema:
        return Schema(self.dense_dim, self.sparse_slots)

    def to_dict(self) -> dict:
        """JSON-ready fields (lists, not tuples, so a JSON round trip is identical)."""
        return {**asdict(self), "cardinalities": list(self.cardinalities)}


# Generators of different structure, for tuning defaults on some and checking them on others (bench/quality.py).
# Each differs from the default in what carries the signal; their Bayes AUCs differ too.
SPECS: dict[str, SyntheticSpec] = {
    "default": SyntheticSpec(),
    # Criteo's cardinalities and a heavier tail than the default: what the raw-TSV defaults were first tuned on.
    "criteo_like": SyntheticSpec(cardinalities=CRITEO_CARDINALITIES, zipf_exponent=1.1),
    # Per-id (first-order) effects and a single interacting pair: logistic regression's home ground.
    "first_order": SyntheticSpec(id_weight_scale=0.45, interaction_fields=2, interaction_scale=0.5),
    # Pairwise effects over the 16 smallest fields, as strong as the per-id ones.
    "interactions": SyntheticSpec(id_weight_scale=0.2, interaction_fields=16, interaction_scale=0.3),
    # Criteo's cardinalities with a flat tail whose rare ids still carry signal: most ids are seen once or twice.
    "long_tail": SyntheticSpec(cardinalities=CRITEO_CARDINALITIES, zipf_exponent=1.02, id_weight_decay_rank=2000.0),
    # The counts carry most of the signal, the ids little.
    "dense_heavy": SyntheticSpec(dense_weight_scale=4.0, id_weight_scale=0.12, interaction_scale=0.15),
    # Tune twins of the two families above, with tails, strengths and missing rates of their own: the default's
    # smaller fields with a flat tail whose rare ids carry signal, and counts that carry more than the ids.
    "rare_ids": SyntheticSpec(zipf_exponent=1.0, id_weight_scale=0.35, id_weight_decay_rank=500.0,
                              interaction_fields=6),
    "count_signal": SyntheticSpec(dense_weight_scale=3.0, id_weight_scale=0.18, dense_missing_rate=0.3,
                                  interaction_fields=4),
}


class SyntheticRows(NamedTuple):
    labels: np.ndarray  # int64[n]
    probabilities: np.ndarray  # float64[n], the true click probabilities
    dense_counts: np.ndarray  # int64[n, dense_dim], raw counts (0 where missing)
    categories: np.ndarray  # int64[n, fields], category index per field
    interaction_logits: np.ndarray  # float64[n], the pairwise-interaction part of the true logit


class _HiddenModel(NamedTuple):
    category_cdfs: list[np.ndarray]
    dense_log_means: np.ndarray
    dense_log_stds: np.ndarray
    dense_weights: np.ndarray
    id_weights: list[np.ndarray]
    interacting_fields: np.ndarray
    factors: list[np.ndarray]
    bias: float


def generate(rows: int, seed: int, spec: SyntheticSpec | None = None) -> SyntheticRows:
    """``rows`` i.i.d. rows from the hidden model of ``seed``."""
    spec = spec or SyntheticSpec()
    model_seed, rows_seed = np.random.SeedSequence(seed).spawn(2)
    model = _hidden_model(spec, np.random.default_rng(model_seed))
    rng = np.random.default_rng(rows_seed)
    dense_counts, categories = _draw_features(model, rows, spec, rng)
    return _rows(model, dense_counts, categories, rng)


def _rows(model: _HiddenModel, dense_counts: np.ndarray, categories: np.ndarray,
          rng: np.random.Generator) -> SyntheticRows:
    """The rows' true probabilities and their labels drawn from them."""
    per_feature, interactions = _logit_parts(model, dense_counts, categories)
    probabilities = 1.0 / (1.0 + np.exp(-(per_feature + interactions + model.bias)))
    labels = (rng.random(len(probabilities)) < probabilities).astype(np.int64)
    return SyntheticRows(labels, probabilities, dense_counts, categories, interactions)


def _hidden_model(spec: SyntheticSpec, rng: np.random.Generator) -> _HiddenModel:
    cdfs = []
    for cardinality in spec.cardinalities:
        weights = np.arange(1, cardinality + 1, dtype=np.float64) ** -spec.zipf_exponent
        cdf = np.cumsum(weights)
        cdfs.append(cdf / cdf[-1])
    fields = len(spec.cardinalities)
    # Some fields carry much more signal than others.
    field_strength = spec.id_weight_scale * rng.uniform(0.2, 1.8, fields)
    # Rarer categories get smaller effects, so what a model cannot learn from a few
    # sightings is mostly noise-sized rather than the bulk of the signal.
    id_weights = [
        rng.normal(0.0, strength, cardinality)
        / np.sqrt(1.0 + np.arange(cardinality) / spec.id_weight_decay_rank)
        for strength, cardinality in zip(field_strength, spec.cardinalities)
    ]
    interacting = spec.interacting_fields
    factors = [
        rng.normal(0.0, spec.interaction_scale, (spec.cardinalities[field], spec.interaction_rank))
        for field in interacting
    ]
    partial = _HiddenModel(
        category_cdfs=cdfs,
        dense_log_means=rng.uniform(0.5, 6.0, spec.dense_dim),
        dense_log_stds=rng.uniform(0.8, 2.0, spec.dense_dim),
        dense_weights=rng.normal(0.0, spec.dense_weight_scale, spec.dense_dim),
        id_weights=id_weights,
        interacting_fields=interacting,
        factors=factors,
        bias=0.0,
    )
    sample_dense, sample_categories = _draw_features(partial, _CALIBRATION_ROWS, spec, rng)
    bias = _calibrate_bias(_logits(partial, sample_dense, sample_categories), spec.base_ctr)
    return partial._replace(bias=bias)


def _draw_features(
    model: _HiddenModel, rows: int, spec: SyntheticSpec, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    noise = rng.standard_normal((rows, spec.dense_dim))
    log_counts = model.dense_log_means + model.dense_log_stds * noise
    dense_counts = np.floor(np.expm1(np.maximum(log_counts, 0.0))).astype(np.int64)
    dense_counts[rng.random((rows, spec.dense_dim)) < spec.dense_missing_rate] = 0
    categories = np.empty((rows, len(model.category_cdfs)), dtype=np.int64)
    for field, cdf in enumerate(model.category_cdfs):
        categories[:, field] = np.minimum(np.searchsorted(cdf, rng.random(rows)), len(cdf) - 1)
    return dense_counts, categories


def _logits(model: _HiddenModel, dense_counts: np.ndarray, categories: np.ndarray) -> np.ndarray:
    return sum(_logit_parts(model, dense_counts, categories))


def _logit_parts(model: _HiddenModel, dense_counts: np.ndarray,
                 categories: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The logit without its bias, in two parts: one weight per count and per id (what a logistic regression can
    learn), and the pairwise interactions (what only a model of interactions can)."""
    per_feature = normalize_counts(dense_counts) @ model.dense_weights
    for field, weights in enumerate(model.id_weights):
        per_feature += weights[categories[:, field]]
    interactions = np.zeros(len(categories))
    if model.factors:
        # sum_{f<g} <v_f, v_g> = (|sum_f v_f|^2 - sum_f |v_f|^2) / 2
        factor_sum = np.zeros((len(categories), model.factors[0].shape[1]))
        square_sum = np.zeros(len(categories))
        for field, factors in zip(model.interacting_fields, model.factors):
            vectors = factors[categories[:, field]]
            factor_sum += vectors
            square_sum += np.einsum("ij,ij->i", vectors, vectors)
        interactions = 0.5 * (np.einsum("ij,ij->i", factor_sum, factor_sum) - square_sum)
    return per_feature, interactions


def _calibrate_bias(logits: np.ndarray, target_ctr: float) -> float:
    low, high = -20.0, 20.0
    for _ in range(60):
        middle = 0.5 * (low + high)
        mean_ctr = np.mean(1.0 / (1.0 + np.exp(-(logits + middle))))
        low, high = (middle, high) if mean_ctr < target_ctr else (low, middle)
    return 0.5 * (low + high)


def normalize_counts(counts: np.ndarray) -> np.ndarray:
    """:func:`formats.normalize_count` over an array of non-negative integer counts."""
    return _map_counts(counts, formatted=False)


def _map_counts(counts: np.ndarray, *, formatted: bool) -> np.ndarray:
    """``normalize_count`` (or its ``format_float`` text) of every count, computed per
    distinct count: a cached table for small counts, a sort only for the rare large ones."""
    small = counts < _SMALL_COUNTS
    result = np.empty(counts.shape, dtype=object if formatted else np.float64)
    result[small] = _small_count_table(formatted)[counts[small]]
    distinct, inverse = np.unique(counts[~small], return_inverse=True)
    result[~small] = _count_table(distinct.tolist(), formatted)[inverse]
    return result


@functools.cache
def _small_count_table(formatted: bool) -> np.ndarray:
    return _count_table(range(_SMALL_COUNTS), formatted)


def _count_table(counts: Iterable[int], formatted: bool) -> np.ndarray:
    values = [normalize_count(float(count)) for count in counts]
    if formatted:
        return np.array([format_float(value) for value in values], dtype=object)
    return np.array(values, dtype=np.float64)


def category_id_tables(spec: SyntheticSpec, vocab_size: int) -> list[np.ndarray]:
    """Per field, the feature id of every category: ``feature_id(slot, category_value(k))``."""
    return [
        feature_ids(slot, (category_value(index) for index in range(cardinality)), vocab_size)
        for slot, cardinality in zip(spec.sparse_slots, spec.cardinalities)
    ]


def format_lines(
    rows: SyntheticRows, spec: SyntheticSpec, id_tables: list[np.ndarray]
) -> pa.Array:
    """MultiSlot lines of ``rows`` (newline included), identical to ``multislot.format_line`` per row.

    Vectorised: each distinct dense count and each category is formatted once; rows get their text by ``take``.
    """
    texts = [pc.take(pa.array(["1 0", "1 1"]), pa.array(rows.labels)),
             pa.array([str(spec.dense_dim)] * len(rows.labels))]
    cells = _map_counts(rows.dense_counts, formatted=True)
    texts += [pa.array(cells[:, column].tolist(), pa.string()) for column in range(spec.dense_dim)]
    for field, ids in enumerate(id_tables):
        tokens = pa.array([f"1 {feature}" for feature in ids.tolist()])
        texts.append(pc.take(tokens, pa.array(rows.categories[:, field])))
    texts[-1] = pc.binary_join_element_wise(texts[-1], "\n", "")
    return pc.binary_join_element_wise(*texts, " ")


def category_value(index: int) -> str:
    """Raw categorical value of category ``index`` (hex, like Criteo's hashed strings)."""
    return f"{index:08x}"


def generate_blocks(rows: int, seed: int, spec: SyntheticSpec | None = None,
                    block_rows: int = 1 << 16) -> Iterator[SyntheticRows]:
    """``rows`` i.i.d. rows from the hidden model of ``seed``, ``block_rows`` at a time (memory stays flat); each
    block draws from a stream of its own, so the rows differ from :func:`generate`'s."""
    spec = spec or SyntheticSpec()
    model_seed, rows_seed = np.random.SeedSequence(seed).spawn(2)
    model = _hidden_model(spec, np.random.default_rng(model_seed))
    for block_seed, start in zip(rows_seed.spawn(-(-rows // block_rows)), range(0, rows, block_rows)):
        rng = np.random.default_rng(block_seed)
        count = min(block_rows, rows - start)
        dense_counts, categories = _draw_features(model, count, spec, rng)
        yield _rows(model, dense_counts, categories, rng)


def write_raw_tsv(path: str, rows: int, seed: int, spec: SyntheticSpec | None = None) -> dict[str, float]:
    """Write ``rows`` rows as raw Criteo TSV (label, I1..I13 counts, C1..C26 hex; a zero count as an empty field,
    as Criteo leaves it); returns the Bayes-optimal metrics of all the rows (the oracle any model is held to)."""
    spec = spec or SyntheticSpec()
    labels, probabilities = [], []
    hexes = [pa.array([category_value(k) for k in range(cardinality)]) for cardinality in spec.cardinalities]
    with open(path, "wb") as out:
        for block in generate_blocks(rows, seed, spec):
            counts = block.dense_counts
            texts = [pc.cast(pa.array(block.labels), pa.string())]
            texts += [pc.if_else(pa.array(counts[:, c] == 0), "", pc.cast(pa.array(counts[:, c]), pa.string()))
                      for c in range(spec.dense_dim)]
            texts += [pc.take(table, pa.array(block.categories[:, f])) for f, table in enumerate(hexes)]
            texts[-1] = pc.binary_join_element_wise(texts[-1], "\n", "")
            lines = pc.binary_join_element_wise(*texts, "\t")
            out.write(text_bytes(lines))
            labels.append(block.labels)
            probabilities.append(block.probabilities)
    return bayes_metrics(np.concatenate(labels), np.concatenate(probabilities))


def bayes_metrics(labels: np.ndarray, probabilities: np.ndarray) -> dict[str, float]:
    """AUC and logloss of the true probabilities: the best any model can do on ``labels``."""
    metrics = binary_metrics(labels, probabilities)
    return {"auc": metrics["auc"], "logloss": metrics["logloss"]}


def main(argv: list[str] | None = None) -> None:
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="python -m components.data_prep.synthetic",
                                     description="Write synthetic raw Criteo TSV with a known oracle (Bayes) AUC.")
    parser.add_argument("--rows", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--spec", choices=sorted(SPECS), default="default",
                        help="the generator's structure (components.data_prep.synthetic.SPECS)")
    parser.add_argument("--out", required=True, help="the TSV to write; <out>.oracle.json gets the oracle metrics")
    args = parser.parse_args(argv)
    oracle = write_raw_tsv(args.out, args.rows, args.seed, SPECS[args.spec])
    with open(f"{args.out}.oracle.json", "w") as f:
        json.dump({**oracle, "rows": args.rows, "seed": args.seed, "spec": args.spec}, f, indent=2)
    print(f"{args.rows:,} rows -> {args.out}; oracle AUC {oracle['auc']:.4f}, logloss {oracle['logloss']:.4f}")


if __name__ == "__main__":
    main()
