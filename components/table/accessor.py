"""Paddle 2.6.2's SparseAccessor row: the one place that knows its layout.

A server keeps a row as floats ``slot, unseen_days, delta_score, show, click, embed_w, <embed_w's optimizer
state>, embedx_w[dim - 1], <embedx's optimizer state>``, and saves it as a text line starting with the
feature id. The strategy sizes the table from it (:mod:`components.ps.strategy`), the planner the servers'
memory (:mod:`components.train.planner`), and the serving export reads the saved rows back, one shard file at a
time (:func:`read_sparse_shard`). Pure: no Paddle.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path
from typing import Iterator

import numpy as np

from components.checkpoint.format import CheckpointError
from components.config import SparseRule, TableConfig

# The row's floats before embed_w's optimizer state: slot, unseen_days, delta_score, show, click, embed_w.
HEADER_FLOATS = 6
PARSE_BLOCK = 4 << 20  # bytes of whole lines a saved table file is parsed in: what bounds the parse's temporaries


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

    A row gets its embedx part once its score reaches ``table.admission.embedx_threshold`` (Paddle's
    MemorySparseTable extends it when ``SparseAccessor::NeedExtendMF`` says so; with the default 0, on its
    first push); until then it holds :func:`short_row_floats`.
    """
    embedx = table.embedding_dim - 1
    return short_row_floats(table) + embedx + rule_state_dim(table.rule, embedx)


def short_row_floats(table: TableConfig) -> int:
    """Floats of a row below the admission threshold: header and embed_w's optimizer state (no embedx)."""
    return HEADER_FLOATS + rule_state_dim(table.rule, 1)


def read_sparse_table(table_dir: str | os.PathLike, rule: SparseRule, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of a table as the servers saved it, every shard file of ``table_dir`` together:
    ``(ids sorted, [n, dim] = [embed_w, embedx...])`` (:func:`read_sparse_shard` reads one file)."""
    parts = [read_sparse_shard(path, rule, dim) for path in sorted(Path(table_dir).glob("part-*"))]
    if not parts or not sum(len(ids) for ids, _ in parts):
        raise CheckpointError(f"no rows in sparse table files under {table_dir}")
    ids = np.concatenate([ids for ids, _ in parts])
    order = np.argsort(ids, kind="stable")
    return ids[order], np.concatenate([rows for _, rows in parts])[order]


def read_sparse_shard(path: str | os.PathLike, rule: SparseRule, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of one saved shard file (text, or ``.gz`` in older checkpoints): ``(ids sorted uint64, [n, dim]
    float32 = [embed_w, embedx...])``.

    A saved line is ``key slot unseen delta show click embed_w <embed state> [embedx_w <embedx state>]``;
    ``embedx`` is absent for rows below the accessor's embedx threshold (those rows use zeros, as the
    servers serve them). The file is parsed in blocks of whole lines, each with array operations (token
    boundaries in numpy, the numbers by Arrow's string casts), never a Python step per line or field.
    A line of another length than ``rule`` and ``dim`` give, or a token that is not a number, raises
    :class:`CheckpointError` naming the file.
    """
    path = Path(path)
    layout = _RowLayout(rule, dim)
    parts = [layout.parse(block, path) for block in _line_blocks(path)]
    ids = np.concatenate([np.zeros(0, np.uint64)] + [ids for ids, _ in parts])
    rows = np.concatenate([np.zeros((0, dim), np.float32)] + [rows for _, rows in parts])
    order = np.argsort(ids, kind="stable")
    return ids[order], rows[order]


def _line_blocks(path: Path) -> Iterator[bytes]:
    """The file's bytes in blocks of about ``PARSE_BLOCK`` that end with a newline (one is added to a last line
    without it)."""
    opener = gzip.open if path.suffix == ".gz" else open
    carry = b""
    with opener(path, "rb") as f:
        for chunk in iter(lambda: f.read(PARSE_BLOCK), b""):
            block = carry + chunk
            cut = block.rfind(b"\n") + 1
            carry = block[cut:]
            if cut:
                yield block[:cut]
    if carry.strip():
        yield carry + b"\n"


class _RowLayout:
    """Where a row's serving values sit among the tokens of its saved line, for one rule and dim."""

    def __init__(self, rule: SparseRule, dim: int):
        self.rule, self.dim = rule, dim
        self.embedx_start = 1 + HEADER_FLOATS + rule_state_dim(rule, 1)  # after the key, header, embed_w's state
        self.short = self.embedx_start
        self.full = self.embedx_start + dim - 1 + rule_state_dim(rule, dim - 1)

    def parse(self, block: bytes, path: Path) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, rows)`` of the lines of ``block`` in file order."""
        import pyarrow as pa

        data = np.frombuffer(block, np.uint8)
        word = data > ord(" ")  # ASCII whitespace and control bytes separate tokens
        first = word.copy()
        first[1:] &= ~word[:-1]
        last = word.copy()
        last[:-1] &= ~word[1:]
        starts, stops = np.flatnonzero(first), np.flatnonzero(last) + 1  # each token is block[start:stop]
        before = np.searchsorted(starts, np.flatnonzero(data == ord("\n")))  # tokens before each line's end
        counts = np.diff(before, prepend=np.int64(0))
        line_start = (before - counts)[counts > 0]  # the first token of each non-empty line
        counts = counts[counts > 0]
        bad = (counts != self.short) & (counts != self.full)
        if bad.any():
            raise CheckpointError(f"sparse table file {path}: a line has {counts[bad][0]} fields; a SparseAccessor "
                                  f"row with rule {self.rule.value} and embedding_dim {self.dim} has {self.short} "
                                  f"or {self.full}: the table was saved with another rule or dim")
        full = counts == self.full
        picked = np.zeros((len(line_start), self.dim), np.int64)
        picked[:, 0] = line_start + HEADER_FLOATS
        picked[:, 1:] = line_start[:, None] + self.embedx_start + np.arange(self.dim - 1)
        present = np.ones(picked.shape, bool)
        present[~full, 1:] = False
        rows = np.zeros(picked.shape, np.float32)
        tokens = picked[present]
        try:
            ids = _cast_tokens(block, starts[line_start], stops[line_start], "uint64")
            rows[present] = _cast_tokens(block, starts[tokens], stops[tokens], "float64")
        except pa.ArrowInvalid as err:
            raise CheckpointError(f"sparse table file {path}: {err}") from None
        return ids, rows


def _cast_tokens(block: bytes, starts: np.ndarray, stops: np.ndarray, dtype: str) -> np.ndarray:
    """The tokens ``block[starts[i]:stops[i]]`` (in increasing order) as numbers of ``dtype``: one Arrow string
    array over the block whose strings alternate token, gap, token, ..., of which the tokens are cast."""
    import pyarrow as pa
    import pyarrow.compute as pc

    offsets = np.column_stack([starts, stops]).ravel()
    if not len(offsets):
        return np.zeros(0, dtype)
    strings = pa.Array.from_buffers(pa.large_string(), len(offsets) - 1,
                                    [None, pa.py_buffer(offsets), pa.py_buffer(block)])
    tokens = strings.take(pa.array(np.arange(0, len(offsets), 2)))
    return np.asarray(pc.cast(tokens, getattr(pa, dtype)()))
