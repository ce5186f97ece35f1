"""Headroom: how much any model can gain over a logistic regression by learning interactions, per generator.

    python bench/headroom.py [--out bench/results/headroom.md]

``bench/quality.py`` asks the default to beat the honest baseline by ``REQUIRED_LIFT`` on every check generator.
The generators' hidden click models (``components.data_prep.synthetic``) are a weight per count and per id plus
pairwise interactions, so what a model can add to a logistic regression is bounded by what the interactions are
worth. For each check generator of ``bench/quality.py`` (the same rows as its file, from ``generate_blocks``) this fits,
on one random split (80% train, 10% validation, 10% test as ``data=criteo``):

* **regression**: one weight per category of every field (no hashing) and per normalized count, L2 chosen on the
  validation split from a grid (scikit-learn, L-BFGS);
* **regression + true interactions**: the same, given the hidden model's exact interaction logit as one more
  feature: a model that learned every interaction perfectly and the per-feature weights as well as the
  regression does;
* **regression + crosses**: the regression given one more column per pair of categories of every pair of the
  generator's interacting fields (which a model of real data does not know to pick): how much of the interactions a
  learner fitted to convergence gets from these rows; the rest needs more rows per pair.

Their test-AUC differences from the regression are the headroom and the learnable headroom. Where the headroom is
below ``REQUIRED_LIFT``, a model beats the regression by that much only by estimating the per-feature weights better
than a tuned L2 regression does. The oracle (the true probabilities) is the ceiling for all three. Generators of
more than ``MAX_ROWS`` rows are left out (their regressions over millions of categories take too long on 2 cores).
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from pathlib import Path

import numpy as np
import scipy.sparse as sparse

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import log, publish  # noqa: E402
from bench.quality import GENERATORS, REQUIRED_LIFT, Generator  # noqa: E402
from components.data_prep.synthetic import SPECS, generate_blocks, normalize_counts  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "headroom.md"
MAX_ROWS = 500_000
L2_GRID = (0.01, 0.03, 0.1, 0.3)  # scikit-learn's C, the inverse L2 strength
SPLIT_SEED = 0


def one_hot(keys: np.ndarray) -> sparse.csr_matrix:
    """One column per distinct key of ``keys`` ``[rows, k]`` (most of a long tail never occurs: L-BFGS's cost grows
    with the columns)."""
    seen, columns = np.unique(keys.ravel(), return_inverse=True)
    rows = len(keys)
    return sparse.csr_matrix((np.ones(keys.size), (np.repeat(np.arange(rows), keys.shape[1]), columns.ravel())),
                             shape=(rows, len(seen)))


def crosses(categories: np.ndarray, cardinalities: tuple[int, ...], fields: np.ndarray) -> sparse.csr_matrix:
    """One column per pair of categories of every pair of ``fields`` that occurs."""
    keys, offset = [], 0
    for i, f in enumerate(fields):
        for g in fields[i + 1:]:
            keys.append(offset + categories[:, f] * cardinalities[g] + categories[:, g])
            offset += cardinalities[f] * cardinalities[g]
    return one_hot(np.stack(keys, axis=1)) if keys else sparse.csr_matrix((len(categories), 0))


def features(generator: Generator) -> dict:
    """The generator's rows: per-feature matrix, crosses of its interacting fields, labels, true interaction
    logits and true probabilities."""
    spec = SPECS[generator.spec]
    blocks = list(generate_blocks(generator.rows, generator.seed, spec))
    categories = np.concatenate([b.categories for b in blocks])
    offsets = np.concatenate([[0], np.cumsum(spec.cardinalities)[:-1]])
    counts = normalize_counts(np.concatenate([b.dense_counts for b in blocks]))
    return {"matrix": sparse.hstack([one_hot(categories + offsets), sparse.csr_matrix(counts)]).tocsr(),
            "crosses": crosses(categories, spec.cardinalities, spec.interacting_fields),
            "labels": np.concatenate([b.labels for b in blocks]),
            "interactions": np.concatenate([b.interaction_logits for b in blocks]),
            "probabilities": np.concatenate([b.probabilities for b in blocks])}


def tuned_regression_auc(matrix: sparse.csr_matrix, labels: np.ndarray, split: np.ndarray) -> float:
    """The test AUC of the logistic regression whose L2 scored best on the validation split."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score

    train, valid, test = (split == 0), (split == 1), (split == 2)
    # From the strongest L2 to the weakest, each fit starting from the last one's weights (a regularization path).
    model = LogisticRegression(max_iter=500, tol=1e-6, warm_start=True)
    best = None
    for c in L2_GRID:
        model.set_params(C=c).fit(matrix[train], labels[train])
        score = roc_auc_score(labels[valid], model.decision_function(matrix[valid]))
        if best is None or score > best[0]:
            best = (score, roc_auc_score(labels[test], model.decision_function(matrix[test])))
    return float(best[1])


def headroom(generator: Generator) -> dict:
    from sklearn.metrics import roc_auc_score

    rows = features(generator)
    matrix, labels = rows["matrix"], rows["labels"]
    draw = np.random.default_rng(SPLIT_SEED).random(len(labels))
    split = np.where(draw < 0.8, 0, np.where(draw < 0.9, 1, 2))
    with_interactions = sparse.hstack([matrix, sparse.csr_matrix(rows["interactions"][:, None])]).tocsr()
    return {"generator": generator.name, "purpose": generator.purpose,
            "regression": tuned_regression_auc(matrix, labels, split),
            "with_interactions": tuned_regression_auc(with_interactions, labels, split),
            "with_crosses": tuned_regression_auc(sparse.hstack([matrix, rows["crosses"]]).tocsr(), labels, split),
            "oracle": float(roc_auc_score(labels[split == 2], rows["probabilities"][split == 2]))}


def render(cells: list[dict], when: str) -> str:
    lines = [f"# Headroom over a logistic regression ({when})", "",
             "`python bench/headroom.py`: per check generator of `bench/quality.py` (its rows), the test AUC of a "
             "logistic regression (one weight per category and per count, L2 chosen on validation), of the same "
             "regression given the true interaction logit, and given every pair of categories of the interacting "
             "fields; method: the docstring of `bench/headroom.py`.", "",
             "| generator | purpose | regression AUC | + true interactions | headroom | + crosses | learnable headroom "
             f"| oracle AUC | headroom >= {REQUIRED_LIFT} | learnable >= {REQUIRED_LIFT} |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|---|"]
    for c in cells:
        gain, learnable = c["with_interactions"] - c["regression"], c["with_crosses"] - c["regression"]
        lines.append(f"| {c['generator']} | {c['purpose']} | {c['regression']:.4f} | {c['with_interactions']:.4f} | "
                     f"{gain:+.4f} | {c['with_crosses']:.4f} | {learnable:+.4f} | {c['oracle']:.4f} | "
                     f"{'yes' if gain >= REQUIRED_LIFT else '**no**'} | "
                     f"{'yes' if learnable >= REQUIRED_LIFT else '**no**'} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    cells = []
    for generator in (g for g in GENERATORS if g.purpose == "check"):
        if generator.rows > MAX_ROWS:
            log(f"{generator.name}: left out (more than {MAX_ROWS:,} rows)")
            continue
        cells.append(headroom(generator))
        log(f"{generator.name}: regression {cells[-1]['regression']:.4f}, "
            f"+ true interactions {cells[-1]['with_interactions']:.4f}, + crosses {cells[-1]['with_crosses']:.4f}")
    publish(render(cells, datetime.now().strftime("%Y-%m-%d %H:%M")), args.out)


if __name__ == "__main__":
    main()
