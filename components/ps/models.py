"""CTR models behind one contract: ``create_feeds`` declares the inputs, ``net`` maps them to a logit.

The embedding lookup is injected, so the same network serves every place it runs:

* training on the PS (``sparse_embedding``: rows live on the servers, any uint64 id),
* training in geo mode (``embedding(is_sparse=True)``: a dense local copy per worker),
* evaluation and serving from a checkpoint (a plain local table holding the exported rows).

All models share one sparse table. A row is ``[w, v_1 .. v_{dim-1}]``, matching SparseAccessor's
``embed_w`` + ``embedx`` split: ``w`` is the first-order (wide / linear) weight of the id and ``v`` its
factor vector. Dense parameters carry explicit names so a checkpoint maps onto any of those programs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from components.config import ModelConfig, ModelName
from components.data_prep.multislot import Schema

# The one sparse table every model looks its ids up in (its parameter name in every program).
EMBEDDING_TABLE = "embedding"
# slot variable -> [batch, dim] rows (one per id, LoD over the batch)
Lookup = Callable[[object], object]


@dataclass
class Feeds:
    label: object
    dense: object | None
    sparse: list

    def in_order(self) -> list:
        """Variables in the MultiSlot file's slot order: label, dense, sparse slots."""
        return [self.label] + ([self.dense] if self.dense is not None else []) + self.sparse


def create_feeds(schema: Schema) -> Feeds:
    import paddle

    label = paddle.static.data("click", [-1, 1], "int64")
    dense = paddle.static.data("dense", [-1, schema.dense_dim], "float32") if schema.dense_dim else None
    sparse = [paddle.static.data(_slot_var(s), [-1, 1], "int64", lod_level=1) for s in schema.sparse_slots]
    return Feeds(label, dense, sparse)


def _slot_var(slot: str) -> str:
    # Feasign slots are numbers; Paddle variable names should not be.
    return slot if slot[0].isalpha() else f"slot_{slot}"


def _fc(x, size: int, name: str, act: str | None = None):
    import paddle

    return paddle.static.nn.fc(
        x, size, activation=act,
        weight_attr=paddle.ParamAttr(name=f"{name}.w", initializer=paddle.nn.initializer.XavierUniform()),
        bias_attr=paddle.ParamAttr(name=f"{name}.b", initializer=paddle.nn.initializer.Constant(0.0)),
    )


def _mlp(x, hidden: list[int], prefix: str):
    for i, width in enumerate(hidden):
        x = _fc(x, width, f"{prefix}_{i}", act="relu")
    return _fc(x, 1, f"{prefix}_out")


def net(cfg: ModelConfig, feeds: Feeds, lookup: Lookup, embedding_dim: int):
    """The logit ``[batch, 1]`` of the configured model."""
    import paddle

    pooled = [
        paddle.static.nn.sequence_pool(paddle.reshape(lookup(slot), [-1, embedding_dim]), "sum")
        for slot in feeds.sparse
    ]
    rows = paddle.stack(pooled, axis=1)  # [batch, slots, dim]
    dense = [feeds.dense] if feeds.dense is not None else []
    if cfg.name is ModelName.dnn:
        return _mlp(paddle.concat(pooled + dense, axis=1), list(cfg.hidden), "dnn")

    first_order = paddle.sum(rows[:, :, 0], axis=1, keepdim=True)
    if dense:
        first_order = first_order + _fc(feeds.dense, 1, "wide_dense")
    factors = rows[:, :, 1:]
    deep = _mlp(paddle.concat([paddle.flatten(factors, 1)] + dense, axis=1), list(cfg.hidden), "deep")
    if cfg.name is ModelName.wide_deep:
        return first_order + deep
    # DeepFM: pairwise interactions sum_{i<j} <v_i, v_j> = 0.5 * ((sum v)^2 - sum v^2)
    summed = paddle.sum(factors, axis=1)
    second_order = 0.5 * paddle.sum(summed * summed - paddle.sum(factors * factors, axis=1), axis=1, keepdim=True)
    return first_order + second_order + deep


@dataclass
class Heads:
    prob: object
    loss: object
    auc_stats: list  # [stat_pos, stat_neg]: persistable bucket counts, summed across workers for global AUC


def heads(logit, label) -> Heads:
    import paddle

    prob = paddle.nn.functional.sigmoid(logit)
    loss = paddle.mean(paddle.nn.functional.binary_cross_entropy_with_logits(logit, paddle.cast(label, "float32")))
    _, _, stats = paddle.static.auc(paddle.concat([1 - prob, prob], axis=1), label)
    return Heads(prob, loss, stats[2:])
