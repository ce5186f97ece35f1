"""The built-in baseline: a hashed logistic regression on the same shards, the first model a practitioner would try.

One weight per bucket of ``features`` (``eval.baseline_features``), one per dense value, and a bias, fitted by
Adagrad on the train split (its first ``eval.baseline_rows`` rows), three passes in mini-batches of 256. An id's
bucket is ``id % features``: the ids data prep wrote are already avalanche-hashed and reduced into
``[0, vocab_size)`` (:mod:`components.data_prep.hashing`), so the remainder spreads them evenly, and it gives every
id a weight of its own whenever the table's ``vocab_size`` is at most the cap (a further mix would only add
collisions). Its memory is the weights and their Adagrad sums, 16 bytes a bucket (64 MiB at the default 1 << 22),
whatever the table's size; ids sharing a bucket share its weight, and a bucket no training id reached scores 0.
Settings chosen on the default synthetic data (400k rows; test AUC 0.807-0.809 against batch 4096's 0.761,
2026-12-01): small batches give each rare id's weight more steps. The evaluation reports the deep model's lift over
it: whether the deep model earns its cost.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from components.data_prep.multislot import RaggedIds

BATCH = 256
EPOCHS = 3
LEARNING_RATE = 0.05
L2 = 1e-6  # per example and step: keeps the weights of ids seen once from running away


@dataclass
class _Features:
    """Rows' sparse features as weight indices: the features of row ``r`` are ``index[starts[r]:starts[r + 1]]``."""

    index: np.ndarray
    starts: np.ndarray

    @classmethod
    def of(cls, sparse: list[RaggedIds], features: int) -> "_Features":
        rows = len(sparse[0].offsets) - 1
        counts = sum(np.diff(slot.offsets) for slot in sparse)
        starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        index = np.empty(starts[-1], np.int64)
        fill = starts[:-1].copy()
        for slot in sparse:  # a row's features: its ids of every slot, slot after slot
            per_row = np.diff(slot.offsets)
            row_of = np.repeat(np.arange(rows), per_row)
            within = np.arange(len(slot.values)) - np.repeat(slot.offsets[:-1], per_row)
            index[fill[row_of] + within] = slot.values % features
            fill += per_row
        return cls(index, starts)

    def batch(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """``(feature indices, the batch row of each)`` of rows ``start:stop``."""
        lo, hi = self.starts[start], self.starts[stop]
        rows = np.repeat(np.arange(stop - start), np.diff(self.starts[start:stop + 1]))
        return self.index[lo:hi], rows


class HashedLogisticRegression:
    def __init__(self, features: int):
        if features < 1:
            raise ValueError(f"the baseline needs at least one feature bucket, got features={features}")
        self.features = features

    def fit(self, labels: np.ndarray, dense: np.ndarray, sparse: list[RaggedIds],
            seed: int = 0) -> "HashedLogisticRegression":
        features = _Features.of(sparse, self.features)
        self.weights = np.zeros(self.features)
        self.dense_weights, self.bias = np.zeros(dense.shape[1]), 0.0
        squares = np.full(self.features, 1e-8)
        dense_squares, bias_square = np.full(dense.shape[1], 1e-8), 1e-8
        order = np.random.default_rng(seed).permutation(-(-len(labels) // BATCH))
        for _ in range(EPOCHS):
            for b in order:
                start, stop = b * BATCH, min((b + 1) * BATCH, len(labels))
                index, rows = features.batch(start, stop)
                logit = self._logits(index, rows, dense[start:stop])
                error = 1.0 / (1.0 + np.exp(-logit)) - labels[start:stop]
                used, inverse = np.unique(index, return_inverse=True)
                grad = np.bincount(inverse, weights=error[rows], minlength=len(used)) + L2 * self.weights[used]
                squares[used] += grad ** 2
                self.weights[used] -= LEARNING_RATE * grad / np.sqrt(squares[used])
                dense_grad = error @ dense[start:stop]
                dense_squares += dense_grad ** 2
                self.dense_weights -= LEARNING_RATE * dense_grad / np.sqrt(dense_squares)
                bias_grad = error.sum()
                bias_square += bias_grad ** 2
                self.bias -= LEARNING_RATE * bias_grad / np.sqrt(bias_square)
        return self

    def _logits(self, index: np.ndarray, rows: np.ndarray, dense: np.ndarray) -> np.ndarray:
        return (np.bincount(rows, weights=self.weights[index], minlength=len(dense))
                + dense @ self.dense_weights + self.bias)

    def predict(self, dense: np.ndarray, sparse: list[RaggedIds]) -> np.ndarray:
        features = _Features.of(sparse, self.features)
        out = np.empty(len(dense))
        for start in range(0, len(dense), BATCH):
            stop = min(start + BATCH, len(dense))
            index, rows = features.batch(start, stop)
            out[start:stop] = 1.0 / (1.0 + np.exp(-self._logits(index, rows, dense[start:stop])))
        return out
