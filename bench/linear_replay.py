"""One pass of a linear model over a prepared dataset, replayed in numpy with the PS job's update rules: what one
pass *can* reach, to tell an optimizer's shortfall from the model's (bench/results/criteo_defaults.md).

    python bench/linear_replay.py <prepared dataset dir> [--batch 128] [--sparse-lr 0.05] [--dense-lr 0.02]
                                  [--passes 2] [--standardize]

The model is the honest baseline's (one weight per id, one per count, a bias), trained in batches in file order:
per id one step of Paddle's SparseAdaGrad (the batch's mean gradient of the id, ``initial_g2sum`` 3), the dense
weights and the bias by a local Adam. Prints the test AUC after every pass. Single-valued slots only (raw Criteo).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.data_prep.multislot import Schema, read_shards  # noqa: E402
from components.metrics import binary_metrics  # noqa: E402
from components.networks.scoring import read_test_split  # noqa: E402

INITIAL_G2SUM = 3.0
BETA1, BETA2, EPSILON = 0.9, 0.999, 1e-8


def replay(data: Path, batch: int, sparse_lr: float, dense_lr: float, passes: int, standardize: bool) -> list[float]:
    stats = json.loads((data / "stats.json").read_text())
    labels, dense, sparse = read_shards([data / rel for rel in stats["shards"]["train"]],
                                        Schema.from_dict(stats["schema"]))
    test_labels, test_dense, test_sparse = read_test_split(data)
    if standardize:
        mean, std = dense.mean(0), dense.std(0) + 1e-6
        dense, test_dense = (dense - mean) / std, (test_dense - mean) / std
    train_ids, test_ids = (np.stack([slot.values for slot in s], 1) for s in (sparse, test_sparse))
    _, index = np.unique(np.concatenate([train_ids.ravel(), test_ids.ravel()]), return_inverse=True)
    rows, test_rows = index[:train_ids.size].reshape(train_ids.shape), index[train_ids.size:].reshape(test_ids.shape)
    w, g2sum = np.zeros(index.max() + 1), np.zeros(index.max() + 1)
    dense_w = np.zeros(dense.shape[1] + 1)  # the last one is the bias
    moment1, moment2, step = np.zeros_like(dense_w), np.zeros_like(dense_w), 0
    aucs = []
    for _ in range(passes):
        for start in range(0, len(labels), batch):
            ids, x, y = rows[start:start + batch], dense[start:start + batch], labels[start:start + batch]
            p = 1.0 / (1.0 + np.exp(-(w[ids].sum(1) + x @ dense_w[:-1] + dense_w[-1])))
            g = p - y
            unique, inverse = np.unique(ids.ravel(), return_inverse=True)
            mean_grad = np.bincount(inverse, np.repeat(g, ids.shape[1])) / np.bincount(inverse)
            w[unique] -= sparse_lr * mean_grad * np.sqrt(INITIAL_G2SUM / (INITIAL_G2SUM + g2sum[unique]))
            g2sum[unique] += mean_grad ** 2
            grad = np.concatenate([x.T @ g / len(g), [g.mean()]])
            step += 1
            moment1 = BETA1 * moment1 + (1 - BETA1) * grad
            moment2 = BETA2 * moment2 + (1 - BETA2) * grad ** 2
            dense_w -= dense_lr * (moment1 / (1 - BETA1 ** step)) / (np.sqrt(moment2 / (1 - BETA2 ** step)) + EPSILON)
        logits = w[test_rows].sum(1) + test_dense @ dense_w[:-1] + dense_w[-1]
        aucs.append(binary_metrics(test_labels, 1.0 / (1.0 + np.exp(-logits)))["auc"])
    return aucs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--sparse-lr", type=float, default=0.05)
    parser.add_argument("--dense-lr", type=float, default=0.02)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--standardize", action="store_true")
    args = parser.parse_args()
    aucs = replay(args.data, args.batch, args.sparse_lr, args.dense_lr, args.passes, args.standardize)
    print("test AUC after each pass: " + ", ".join(f"{auc:.4f}" for auc in aucs))


if __name__ == "__main__":
    main()
