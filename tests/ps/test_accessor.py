"""The SparseAccessor row as the servers save it."""

import gzip

import numpy as np
import pytest

from components.config import SparseRule
from components.ps.accessor import read_sparse_table, rule_state_dim


def _write_table(path, rule, dim, rows):
    state_embed, state_embedx = rule_state_dim(rule, 1), rule_state_dim(rule, dim - 1)
    with gzip.open(path, "wt") as f:
        for key, row, full in rows:
            fields = [key, 0, 0, 1.5, 15, 1, row[0]] + [0.5] * state_embed
            if full:
                fields += list(row[1:]) + [0.25] * state_embedx
            f.write(" ".join(str(v) for v in fields) + "\n")


@pytest.mark.parametrize("rule", list(SparseRule))
def test_read_sparse_table_per_rule(tmp_path, rule):
    dim = 5
    rows = [(7, [0.1, 1, 2, 3, 4], True), (2**63 + 5, [0.2, -1, -2, -3, -4], True), (3, [0.3, 0, 0, 0, 0], False)]
    _write_table(tmp_path / "part-000-00000.gz", rule, dim, rows[:2])
    _write_table(tmp_path / "part-001-00000.gz", rule, dim, rows[2:])
    ids, values = read_sparse_table(tmp_path, rule, dim)
    assert ids.tolist() == [3, 7, 2**63 + 5]
    np.testing.assert_allclose(values, np.array([rows[2][1], rows[0][1], rows[1][1]], dtype=np.float32))
