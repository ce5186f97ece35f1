"""The SparseAccessor row as the servers save it."""

import gzip

import numpy as np
import pytest

from components.checkpoint.format import CheckpointError
from components.config import SparseRule
from components.table import accessor
from components.table.accessor import read_sparse_shard, read_sparse_table, rule_state_dim


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


@pytest.mark.parametrize("block", [64, 1 << 20])
def test_read_sparse_shard_parses_whole_lines_across_blocks(tmp_path, monkeypatch, block):
    """Lines cut by the block boundary, short rows, the largest uint64 id, blank lines, no final newline."""
    monkeypatch.setattr(accessor, "PARSE_BLOCK", block)
    dim, rule = 4, SparseRule.adam
    rng = np.random.default_rng(0)
    ids = np.concatenate([rng.integers(0, 2**63, 200, dtype=np.uint64) * np.uint64(2), [np.uint64(2**64 - 1)]])
    values = rng.normal(0, 1, (len(ids), dim)).astype(np.float32)
    values[::3, 1:] = 0
    path = tmp_path / "part-001-00003"
    state_embed, state_embedx = rule_state_dim(rule, 1), rule_state_dim(rule, dim - 1)
    lines = []
    for key, row in zip(ids.tolist(), values.astype(np.float64).tolist()):
        fields = [key, 0, 0, 1.5, 15, 1, repr(row[0])] + [0.5] * state_embed
        if any(row[1:]):
            fields += [repr(v) for v in row[1:]] + [0.25] * state_embedx
        lines.append(" ".join(str(v) for v in fields))
    path.write_text("\n".join(lines[:50] + [""] + lines[50:]))  # a blank line; the last line has no newline
    got_ids, got_rows = read_sparse_shard(path, rule, dim)
    order = np.argsort(ids)
    assert np.array_equal(got_ids, ids[order]) and got_ids.dtype == np.uint64
    assert np.array_equal(got_rows, values[order]) and got_rows.dtype == np.float32


def test_read_sparse_shard_refuses_a_line_of_another_rule_or_dim_and_a_non_number(tmp_path):
    path = tmp_path / "part-000-00000"
    path.write_text("7 0 0 1.5 15 1 0.1 0.5 1 2 3 0.25\n")  # adagrad, dim 4
    assert read_sparse_shard(path, SparseRule.adagrad, 4)[0].tolist() == [7]
    with pytest.raises(CheckpointError, match=f"{path}: a line has 12 fields; a SparseAccessor row with rule adam "
                                              "and embedding_dim 4 has 11 or 22"):
        read_sparse_shard(path, SparseRule.adam, 4)
    path.write_text("7 0 0 1.5 15 1 zero 0.5\n")
    with pytest.raises(CheckpointError, match=f"sparse table file {path}: .*zero"):
        read_sparse_shard(path, SparseRule.adagrad, 4)
