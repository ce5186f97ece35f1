"""CTR models behind one contract: ``create_feeds`` declares the inputs, ``net`` maps them to a logit.

The embedding lookup is injected, so the same network serves every place it runs:

* training on the PS (``sparse_embedding``: rows live on the servers, any uint64 id),
* training in geo mode (``embedding(is_sparse=True)``: a dense local copy per worker),
* evaluation and serving from a checkpoint (a plain local table holding the exported rows).

All models share one sparse table. A row is ``[w, v_1 .. v_{dim-1}]``, matching SparseAccessor's
``embed_w`` + ``embedx`` split: ``w`` is the first-order (wide / linear) weight of the id and ``v`` its
factor vector. Dense parameters carry explicit names so a checkpoint maps onto any of those programs.

A slot's rows are pooled into one by ``model.pooling``; a weighted dataset's rows weigh in the loss by their
``weight`` (:func:`heads`); the training program pushes each id's show and click with its gradient
(:func:`push_counts`).
"""

from __future__ import annotations

import math
import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from components.config import CtrConfig, ModelConfig, ModelName, Pooling
from components.data_prep.multislot import WEIGHT_SLOT, Schema

if TYPE_CHECKING:
    import numpy as np

# The one sparse table every model looks its ids up in (its parameter name in every program).
EMBEDDING_TABLE = "embedding"
# slot variable -> [batch, dim] rows (one per id, LoD over the batch)
Lookup = Callable[[object], object]
# model.pooling -> sequence_pool's pool type: the sum, the sum / n, the sum / sqrt(n) of a slot's n rows.
POOL_TYPES = {Pooling.sum: "sum", Pooling.mean: "average", Pooling.sqrtn: "sqrt"}
BASE_RATE_BOUND = 1e-4  # a day without clicks still starts its bias at a finite logit
# The prefix of the automatic parameter names of a network of its user's (model=custom): the same in every program.
CUSTOM_NAME_SCOPE = "custom_"
# The baseline's parameters in a model that blends it in (model.blend_baseline): the regression's bucket weights
# ([features, 1]), dense weights ([dense_dim, 1]) and bias ([1]), set from its fit, never trained.
BASELINE_WEIGHTS, BASELINE_DENSE_WEIGHTS, BASELINE_BIAS = "baseline.w", "baseline.dense_w", "baseline.b"
BASELINE_PARAMETERS = (BASELINE_WEIGHTS, BASELINE_DENSE_WEIGHTS, BASELINE_BIAS)
BASELINE_FILE = "baseline.npz"  # in the fit-baseline step's directory (components.evaluate.baseline_step)
# Below it a batch's weights count as none: the weighted loss is then 0 rather than 0 / 0.
MIN_WEIGHT_SUM = 1e-12


@dataclass
class Feeds:
    label: object
    dense: object | None
    sparse: list
    weight: object | None = None  # [batch, 1] float32 row weights of a weighted dataset

    def in_order(self) -> list:
        """Variables in the MultiSlot file's slot order: label, weight, dense, sparse slots."""
        optional = [v for v in (self.weight, self.dense) if v is not None]
        return [self.label] + optional + self.sparse


def create_feeds(schema: Schema) -> Feeds:
    import paddle

    label = paddle.static.data("click", [-1, 1], "int64")
    weight = paddle.static.data(WEIGHT_SLOT, [-1, 1], "float32") if schema.weighted else None
    dense = paddle.static.data("dense", [-1, schema.dense_dim], "float32") if schema.dense_dim else None
    sparse = [paddle.static.data(_slot_var(s), [-1, 1], "int64", lod_level=1) for s in schema.sparse_slots]
    return Feeds(label, dense, sparse, weight)


@dataclass
class PushCounts:
    show: object  # [batch, 1] float32: 1 per row
    click: object  # [batch, 1] float32: the row's label

    def entry(self):
        """The lookup's ``entry``: Paddle's trainer pass then pushes these per row with every id's gradient."""
        import paddle

        return paddle.distributed.ShowClickEntry(self.show.name, self.click.name)


def push_counts(feeds: Feeds) -> PushCounts:
    """What the training program pushes for each id of a row: one show, and a click when the row was clicked.

    Without them Paddle 2.6.2's trainer pass pushes show 1 and click 0 for every id (DistributedOpsPass
    ``_push_sparse_fuse``), so a saved row would hold no click and its score (eviction, admission) would not count
    clicks. Paddle's ``FleetWrapper::PushSparseFromTensorAsync`` reads them as float32, one per example (the LoD
    sequence an id sits in), so they are computed here from the label and need no slot of their own. Shows stay 1
    on a weighted row too: the servers' sparse rules divide an id's pushed gradient by its shows, which a weight of
    0 would turn into a division by zero.
    """
    import paddle

    click = paddle.cast(feeds.label, "float32")
    return PushCounts(paddle.ones_like(click), click)


def base_rate_logit(stats: dict) -> float:
    """The logit of the train split's click rate in a dataset's ``stats.json`` (after negative downsampling: the rate
    the model trains on), kept within the CTR range [1e-4, 1 - 1e-4]; 0 for a dataset without train rows."""
    ctr = stats["ctr"].get("train")
    if ctr is None:
        return 0.0
    ctr = min(max(ctr, BASE_RATE_BOUND), 1.0 - BASE_RATE_BOUND)
    return math.log(ctr / (1.0 - ctr))


def _slot_var(slot: str) -> str:
    # Feasign slots are numbers; Paddle variable names should not be.
    return slot if slot[0].isalpha() else f"slot_{slot}"


def _fc(x, size: int, name: str, act: str | None = None, bias: float = 0.0):
    import paddle

    return paddle.static.nn.fc(
        x, size, activation=act,
        weight_attr=paddle.ParamAttr(name=f"{name}.w", initializer=paddle.nn.initializer.XavierUniform()),
        bias_attr=paddle.ParamAttr(name=f"{name}.b", initializer=paddle.nn.initializer.Constant(bias)),
    )


def _mlp(x, hidden: list[int], prefix: str, dropout: float, training: bool, out_bias: Optional[float] = 0.0):
    """The tower; with ``out_bias`` a number, ending in one output unit whose bias starts there (None: no output)."""
    import paddle

    for i, width in enumerate(hidden):
        x = _fc(x, width, f"{prefix}_{i}", act="relu")
        if dropout and training:  # upscale_in_train: inference needs no rescaling
            x = paddle.nn.functional.dropout(x, p=dropout, training=True)
    return _fc(x, 1, f"{prefix}_out", bias=out_bias) if out_bias is not None else x


def pool(rows, pooling: Pooling):
    """``[batch, dim]``: each example's rows of one slot (a LoD sequence of ``[n, dim]``) pooled into one."""
    import paddle

    return paddle.static.nn.sequence_pool(rows, POOL_TYPES[pooling])


@dataclass(frozen=True)
class NetworkInputs:
    """What a network of its user's (``model=custom``, ``model.network="package.module:function"``) is given; the
    function returns the logit ``[batch, 1]`` (a Paddle static-graph variable) built from them.

    Everything around it is the pipeline's: the feeds, the embedding lookup on the servers (each id's row is
    ``[w, v_1 .. v_{dim-1}]``: ``w`` a first-order weight, ``v`` its factors), the loss, the AUC, the servers'
    optimizers, checkpoints, the export and serving. Its parameters may keep Paddle's automatic names: it is built
    under a name scope of its own, so every program that builds it (training, evaluation, export) names them alike.
    The exported inference program holds its ops, which must be the built-in families' or listed in
    ``model.extra_ops``.
    """

    slots: list  # per sparse slot, in the schema's order: its rows pooled by model.pooling, [batch, embedding_dim]
    dense: object | None  # [batch, dense_dim] float32, normalised by data prep; None without dense features
    embedding_dim: int
    hidden: list[int]  # model.hidden
    dropout: float  # model.dropout: apply it only while training
    training: bool
    initial_logit: float  # the train split's base-rate logit: a good start for the output unit's bias


def load_network(path: str) -> Callable[[NetworkInputs], object]:
    """The function ``"package.module:function"`` names; ValueError saying why it cannot be had."""
    module_name, _, name = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"cannot import {module_name!r} ({err}): install it, or put its directory on PYTHONPATH "
                         "of every process") from None
    function = getattr(module, name, None)
    if not callable(function):
        raise ValueError(f"{module_name!r} has no function {name!r}")
    return function


@dataclass
class Net:
    logit: object  # [batch, 1]
    embedding_squares: object  # per example, the sum of squares of the rows it looked up (model.embedding_l2 only)


def baseline_logit(feeds: Feeds, features: int, buckets: list):
    """``[batch, 1]``: the logit of the pipeline's hashed logistic regression (:mod:`components.evaluate.baseline`)
    in the program, before its correction for negative downsampling: the weights of the rows' ids' ``buckets`` (per
    sparse slot, a feed of ``id % features``: the programs that score feed row indices or rows, not ids; each
    bucket counts as often as a row holds it), the dense values' weights and the bias. Its parameters are not
    trainable: they stay the regression's (:data:`BASELINE_PARAMETERS`)."""
    import paddle

    def fixed(name):
        return paddle.ParamAttr(name=name, trainable=False, initializer=paddle.nn.initializer.Constant(0.0))

    logit = None
    for slot_buckets in buckets:
        weights = paddle.static.nn.embedding(slot_buckets, size=[features, 1], param_attr=fixed(BASELINE_WEIGHTS))
        pooled = pool(paddle.reshape(weights, [-1, 1]), Pooling.sum)
        logit = pooled if logit is None else logit + pooled  # elementwise adds: the ops every export holds already
    if feeds.dense is not None:  # fc: the mul and add every export holds already
        return logit + paddle.static.nn.fc(feeds.dense, 1, weight_attr=fixed(BASELINE_DENSE_WEIGHTS),
                                           bias_attr=fixed(BASELINE_BIAS))
    return logit + paddle.static.create_parameter([1], "float32", attr=fixed(BASELINE_BIAS))


def baseline_features(cfg: CtrConfig) -> Optional[int]:
    """The baseline's bucket count when the model blends it in (``model.blend_baseline``), else None."""
    return cfg.eval.baseline_features if cfg.model.blend_baseline else None


@dataclass(frozen=True)
class FittedBaseline:
    """The fitted regression as the fit-baseline step writes it into its directory (:data:`BASELINE_FILE`): a weight
    per bucket, per dense value, the bias, and the logit shift of negative downsampling. One format for the step
    that writes it (:mod:`components.evaluate.baseline_step`), the evaluation and the PS roles that read it (which
    import no evaluation code)."""

    weights: np.ndarray
    dense_weights: np.ndarray
    bias: float
    logit_shift: float

    def save(self, directory: str | Path) -> None:
        import numpy as np

        np.savez(Path(directory) / BASELINE_FILE, weights=self.weights, dense_weights=self.dense_weights,
                 bias=self.bias, logit_shift=self.logit_shift)

    @classmethod
    def load(cls, directory: str | Path) -> "FittedBaseline":
        import numpy as np

        with np.load(Path(directory) / BASELINE_FILE) as saved:
            return cls(saved["weights"], saved["dense_weights"], float(saved["bias"]), float(saved["logit_shift"]))


def baseline_values(baseline_dir: str) -> dict:
    """The values of :data:`BASELINE_PARAMETERS` from the baseline fit-baseline wrote into ``baseline_dir``."""
    import numpy as np

    fitted = FittedBaseline.load(baseline_dir)
    values = {BASELINE_WEIGHTS: fitted.weights.astype(np.float32).reshape(-1, 1),
              BASELINE_BIAS: np.array([fitted.bias], np.float32)}
    if len(fitted.dense_weights):  # a schema without dense values has no such parameter
        values[BASELINE_DENSE_WEIGHTS] = fitted.dense_weights.astype(np.float32).reshape(-1, 1)
    return values


def net(cfg: ModelConfig, feeds: Feeds, lookup: Lookup, embedding_dim: int, training: bool = False,
        initial_logit: float = 0.0) -> Net:
    """The logit ``[batch, 1]`` of the configured model (``training``: with dropout).

    ``initial_logit``: where the output unit's bias starts (:func:`base_rate_logit` of the train split when
    training; programs that load trained parameters ignore it). Started at 0, the first few hundred batches would
    be spent moving the bias to the base rate: the dense optimizer moves a parameter by about its learning rate a
    step, and the base rate of ads data is several units of logit away."""
    import paddle

    looked_up = [paddle.reshape(lookup(slot), [-1, embedding_dim]) for slot in feeds.sparse]
    pooled = [pool(rows, cfg.pooling) for rows in looked_up]
    # Pool first, then sum over the dimension: a reduction over axis 1 would drop the rows' LoD that pooling needs.
    squares = paddle.add_n([paddle.sum(pool(paddle.square(rows), Pooling.sum), axis=1, keepdim=True)
                            for rows in looked_up]) if cfg.embedding_l2 and training else None
    rows = paddle.stack(pooled, axis=1)  # [batch, slots, dim]
    dense = [feeds.dense] if feeds.dense is not None else []
    hidden, drop = list(cfg.hidden), cfg.dropout
    if cfg.name is ModelName.custom:
        inputs = NetworkInputs(pooled, feeds.dense, embedding_dim, hidden, drop, training, initial_logit)
        with paddle.utils.unique_name.guard(CUSTOM_NAME_SCOPE):
            return Net(load_network(cfg.network)(inputs), squares)
    if cfg.name is ModelName.dnn:
        return Net(_mlp(paddle.concat(pooled + dense, axis=1), hidden, "dnn", drop, training, initial_logit), squares)
    if cfg.name is ModelName.dcn:
        # DCN-v2 (parallel): full-rank cross layers x_{l+1} = x0 * (W_l x_l + b_l) + x_l beside a deep tower.
        x0 = paddle.concat(pooled + dense, axis=1)
        crossed = x0
        for layer in range(cfg.cross_layers):
            crossed = x0 * _fc(crossed, x0.shape[1], f"cross_{layer}") + crossed
        deep = _mlp(x0, hidden, "deep", drop, training, out_bias=None)
        return Net(_fc(paddle.concat([crossed, deep], axis=1), 1, "dcn_out", bias=initial_logit), squares)

    first_order = paddle.sum(rows[:, :, 0], axis=1, keepdim=True)
    if dense:
        first_order = first_order + _fc(feeds.dense, 1, "wide_dense")
    factors = rows[:, :, 1:]
    deep = _mlp(paddle.concat([paddle.flatten(factors, 1)] + dense, axis=1), hidden, "deep", drop, training,
                initial_logit)
    if cfg.name is ModelName.wide_deep:
        return Net(first_order + deep, squares)
    # DeepFM: pairwise interactions sum_{i<j} <v_i, v_j> = 0.5 * ((sum v)^2 - sum v^2)
    summed = paddle.sum(factors, axis=1)
    second_order = 0.5 * paddle.sum(summed * summed - paddle.sum(factors * factors, axis=1), axis=1, keepdim=True)
    return Net(first_order + second_order + deep, squares)


@dataclass
class Heads:
    prob: object
    loss: object
    auc_stats: list  # [stat_pos, stat_neg]: persistable bucket counts, summed across workers for global AUC


def heads(network: Net, feeds: Feeds, embedding_l2: float) -> Heads:
    """Probability, loss (logloss, plus ``embedding_l2`` x the looked-up rows' squares) and AUC statistics.

    With row weights every per-row term is averaged as ``sum(w * term) / sum(w)``: a row of weight 2 counts exactly
    as the row twice. The AUC statistics count rows, unweighted.
    """
    import paddle

    logit, label, weight = network.logit, feeds.label, feeds.weight

    def row_mean(per_row):
        if weight is None:
            return paddle.mean(per_row)
        return paddle.sum(weight * per_row) / paddle.clip(paddle.sum(weight), min=MIN_WEIGHT_SUM, max=math.inf)

    prob = paddle.nn.functional.sigmoid(logit)
    per_row = paddle.nn.functional.binary_cross_entropy_with_logits(logit, paddle.cast(label, "float32"),
                                                                    reduction="none")
    loss = row_mean(per_row)
    if embedding_l2:
        loss = loss + embedding_l2 * row_mean(network.embedding_squares)
    _, _, stats = paddle.static.auc(paddle.concat([1 - prob, prob], axis=1), label)
    return Heads(prob, loss, stats[2:])


def dense_parameters(cfg: ModelConfig, sparse_slots: int, dense_dim: int, embedding_dim: int) -> int:
    """How many dense parameters :func:`net` builds (weights and biases of every ``fc``): what a worker pulls and
    pushes of the dense tables each time. Counted without Paddle for the built-in models (the planner's network line
    uses it before any program exists); a network of the user's is built to be counted."""
    def tower(inputs: int, widths: list[int]) -> int:
        return sum((n_in + 1) * n_out for n_in, n_out in zip([inputs] + widths, widths))

    if cfg.name is ModelName.custom:
        return _built_dense_parameters(cfg, sparse_slots, dense_dim, embedding_dim)
    hidden = list(cfg.hidden)
    x0 = sparse_slots * embedding_dim + dense_dim
    if cfg.name is ModelName.dnn:
        return tower(x0, hidden + [1])
    if cfg.name is ModelName.dcn:
        return cfg.cross_layers * (x0 + 1) * x0 + tower(x0, hidden) + x0 + hidden[-1] + 1
    wide = dense_dim + 1 if dense_dim else 0
    return wide + tower(sparse_slots * (embedding_dim - 1) + dense_dim, hidden + [1])


def _built_dense_parameters(cfg: ModelConfig, sparse_slots: int, dense_dim: int, embedding_dim: int) -> int:
    """The parameters a network of the user's creates besides the embedding table, counted on a throwaway program
    (nothing else knows what its function builds)."""
    import paddle

    paddle.enable_static()
    program = paddle.static.Program()
    with paddle.static.program_guard(program, paddle.static.Program()), paddle.utils.unique_name.guard():
        feeds = create_feeds(Schema(dense_dim, [f"s{i}" for i in range(sparse_slots)]))
        net(cfg, feeds, lambda slot: paddle.static.nn.embedding(
            slot, size=[2, embedding_dim], param_attr=paddle.ParamAttr(name=EMBEDDING_TABLE)), embedding_dim)
    return sum(math.prod(p.shape) for p in program.all_parameters() if p.name != EMBEDDING_TABLE)
