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
  regression does.

Their test-AUC difference is the headroom. Where it is below ``REQUIRED_LIFT``, a model beats the regression by that
much only by estimating the per-feature weights better than a tuned L2 regression does. The oracle (the true
probabilities) is the ceiling for both. Generators of more than ``MAX_ROWS`` rows are left out (their regressions
over millions of categories take too long on 2 cores).
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


def features(generator: Generator) -> tuple[sparse.csr_matrix, np.ndarray, np.ndarray, np.ndarray]:
    """``(per-feature matrix, labels, true interaction logits, true probabilities)`` of the generator's rows."""
    spec = SPECS[generator.spec]
    blocks = list(generate_blocks(generator.rows, generator.seed, spec))
    categories = np.concatenate([b.categories for b in blocks])
    rows = len(categories)
    offsets = np.concatenate([[0], np.cumsum(spec.cardinalities)[:-1]])
    # One column per category that occurs (most of a long tail never does: L-BFGS's cost grows with the columns).
    seen, columns = np.unique((categories + offsets).ravel(), return_inverse=True)
    one_hot = sparse.csr_matrix((np.ones(categories.size), (np.repeat(np.arange(rows), categories.shape[1]),
                                                             columns)), shape=(rows, len(seen)))
    counts = normalize_counts(np.concatenate([b.dense_counts for b in blocks]))
    matrix = sparse.hstack([one_hot, sparse.csr_matrix(counts)]).tocsr()
    return (matrix, np.concatenate([b.labels for b in blocks]), np.concatenate([b.interaction_logits for b in blocks]),
            np.concatenate([b.probabilities for b in blocks]))


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

    matrix, labels, interactions, probabilities = features(generator)
    draw = np.random.default_rng(SPLIT_SEED).random(len(labels))
    split = np.where(draw < 0.8, 0, np.where(draw < 0.9, 1, 2))
    with_interactions = sparse.hstack([matrix, sparse.csr_matrix(interactions[:, None])]).tocsr()
    return {"generator": generator.name, "purpose": generator.purpose,
            "regression": tuned_regression_auc(matrix, labels, split),
            "with_interactions": tuned_regression_auc(with_interactions, labels, split),
            "oracle": float(roc_auc_score(labels[split == 2], probabilities[split == 2]))}


def render(cells: list[dict], when: str) -> str:
    lines = [f"# Headroom over a logistic regression ({when})", "",
             "`python bench/headroom.py`: per check generator of `bench/quality.py` (its rows), the test AUC of a "
             "logistic regression (one weight per category and per count, L2 chosen on validation) and of the same "
             "regression given the true interaction logit; method: the docstring of `bench/headroom.py`.", "",
             "| generator | purpose | regression AUC | + true interactions | headroom | oracle AUC | "
             f"headroom >= {REQUIRED_LIFT} |", "|---|---|---:|---:|---:|---:|---|"]
    for c in cells:
        gain = c["with_interactions"] - c["regression"]
        lines.append(f"| {c['generator']} | {c['purpose']} | {c['regression']:.4f} | {c['with_interactions']:.4f} | "
                     f"{gain:+.4f} | {c['oracle']:.4f} | {'yes' if gain >= REQUIRED_LIFT else '**no**'} |")
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
            f"+ true interactions {cells[-1]['with_interactions']:.4f}")
    publish(render(cells, datetime.now().strftime("%Y-%m-%d %H:%M")), args.out)


if __name__ == "__main__":
    main()
