"""Paddle 2.6.2's SparseAccessor row: the one place that knows its layout.

A server keeps a row as floats ``slot, unseen_days, delta_score, show, click, embed_w, <embed_w's optimizer
state>, embedx_w[dim - 1], <embedx's optimizer state>``, and saves it as a text line starting with the
feature id. The strategy sizes the table from it (:mod:`components.ps.strategy`), the planner the servers'
memory (:mod:`components.train.planner`), and worker 0 reads the saved rows back for a checkpoint's export
(:func:`read_sparse_table`). Pure: no Paddle.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np

from components.checkpoint.format import CheckpointError
from components.config import SparseRule, TableConfig

# The row's floats before embed_w's optimizer state: slot, unseen_days, delta_score, show, click, embed_w.
HEADER_FLOATS = 6


def rule_state_dim(rule: SparseRule, weights: int) -> int:
    """Floats of optimizer state a rule keeps beside ``weights`` weights (Paddle's SGDRule::Dim)."""
    if rule is SparseRule.naive:
        return 0
    if rule is SparseRule.adagrad:
        return 1
    if rule is SparseRule.std_adagrad:
        return weights
    return 2 * weights + 2  # adam: gsum, g2sum per weight, then beta1^t, beta2^t


def row_floats(table: TableConfig) -> int:
    """Floats of a full row: header, embed_w's optimizer state, embedx and its state.

    Every row gets its embedx part on its first push (the strategy leaves embedx_threshold at 0), so
    every trained row is full.
    """
    embedx = table.embedding_dim - 1
    return HEADER_FLOATS + rule_state_dim(table.rule, 1) + embedx + rule_state_dim(table.rule, embedx)


def read_sparse_table(table_dir: str | os.PathLike, rule: SparseRule, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of a table as the servers saved it: ``(ids sorted, [n, dim] = [embed_w, embedx...])``.

    A saved line is ``key slot unseen delta show click embed_w <embed state> [embedx_w <embedx state>]``;
    ``embedx`` is absent for rows below the accessor's embedx threshold (those rows use zeros, as the
    servers serve them).
    """
    embedx_start = 1 + HEADER_FLOATS + rule_state_dim(rule, 1)
    ids, rows = [], []
    for path in sorted(Path(table_dir).glob("part-*")):
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as f:
            for line in f:
                fields = line.split()
                if not fields:
                    continue
                row = np.zeros(dim, dtype=np.float32)
                row[0] = float(fields[HEADER_FLOATS])
                if len(fields) >= embedx_start + dim - 1:
                    row[1:] = np.asarray(fields[embedx_start:embedx_start + dim - 1], dtype=np.float32)
                ids.append(int(fields[0]))
                rows.append(row)
    if not ids:
        raise CheckpointError(f"no rows in sparse table files under {table_dir}")
    ids_array = np.asarray(ids, dtype=np.uint64)
    order = np.argsort(ids_array, kind="stable")
    return ids_array[order], np.stack(rows)[order]
