"""The model contract on tiny local programs: pooling of multi-valued slots, and row weights in the loss."""

import numpy as np
import pytest

from components.config import ModelConfig, ModelName, Pooling
from components.data_prep.multislot import Schema
from components.networks import models

DIM = 3


def _lod_tensor(values: np.ndarray, lengths: list[int]):
    import paddle

    tensor = paddle.base.core.LoDTensor()
    tensor.set(values, paddle.CPUPlace())
    tensor.set_lod([np.concatenate([[0], np.cumsum(lengths)]).tolist()])
    return tensor


@pytest.mark.parametrize("pooling,scale", [(Pooling.sum, lambda n: 1.0), (Pooling.mean, lambda n: 1.0 / n),
                                           (Pooling.sqrtn, lambda n: 1.0 / np.sqrt(n))])
def test_pooling_divides_a_slots_sum_by_n_or_its_square_root(pooling, scale):
    import paddle

    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        rows = paddle.static.data("rows", [-1, DIM], "float32", lod_level=1)
        pooled = models.pool(rows, pooling)
    lengths = [1, 3, 2]
    values = np.random.default_rng(0).normal(size=(sum(lengths), DIM)).astype(np.float32)
    (got,) = paddle.static.Executor(paddle.CPUPlace()).run(main, feed={"rows": _lod_tensor(values, lengths)},
                                                           fetch_list=[pooled])
    starts = np.cumsum([0] + lengths[:-1])
    expected = [values[s:s + n].sum(axis=0) * scale(n) for s, n in zip(starts, lengths)]
    np.testing.assert_allclose(got, np.array(expected), rtol=1e-6)


def _loss_and_gradients(model: ModelConfig, schema: Schema, feed: dict) -> list[np.ndarray]:
    """The loss and the gradient of every parameter of ``model`` over a local table, for the batch ``feed``."""
    import paddle

    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
        feeds = models.create_feeds(schema)
        paddle.seed(1)  # the same initial parameters in both programs

        def lookup(slot):
            return paddle.static.nn.embedding(slot, size=[50, DIM], param_attr=paddle.ParamAttr(name="embedding"))

        heads = models.heads(models.net(model, feeds, lookup, DIM, training=True), feeds, model.embedding_l2)
        params = main.all_parameters()
        grads = paddle.static.gradients(heads.loss, params)
    scope, exe = paddle.static.Scope(), paddle.static.Executor(paddle.CPUPlace())
    with paddle.static.scope_guard(scope):
        exe.run(startup)
        return exe.run(main, feed=feed, fetch_list=[heads.loss] + grads)


def test_a_row_of_weight_two_counts_exactly_as_the_row_twice():
    schema = Schema(dense_dim=2, sparse_slots=["a", "b"], weighted=True)
    model = ModelConfig(name=ModelName.deepfm, hidden=[8], embedding_l2=0.01)
    rng = np.random.default_rng(0)
    labels, dense = np.array([[1], [0], [1]]), rng.normal(size=(3, 2)).astype(np.float32)
    ids = {"a": ([[1], [2, 3], [4]]), "b": ([[5, 6], [7], [8, 9, 10]])}

    def batch(rows: list[int], weights: list[float]) -> dict:
        feed = {"click": labels[rows], "weight": np.array(weights, np.float32).reshape(-1, 1), "dense": dense[rows]}
        for slot, per_row in ids.items():
            chosen = [per_row[r] for r in rows]
            feed[slot] = _lod_tensor(np.concatenate(chosen).reshape(-1, 1).astype(np.int64), [len(c) for c in chosen])
        return feed

    weighted = _loss_and_gradients(model, schema, batch([0, 1, 2], [1, 2, 1]))
    repeated = _loss_and_gradients(model, schema, batch([0, 1, 1, 2], [1, 1, 1, 1]))
    assert len(weighted) > 2
    for got, expected in zip(weighted, repeated):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)
    # The weights matter: the same rows unweighted give another loss.
    unweighted = _loss_and_gradients(model, schema, batch([0, 1, 2], [1, 1, 1]))
    assert not np.isclose(unweighted[0], weighted[0])


def test_the_weight_is_fed_right_after_the_label():
    import paddle

    paddle.enable_static()
    with paddle.static.program_guard(paddle.static.Program(), paddle.static.Program()):
        weighted = models.create_feeds(Schema(dense_dim=2, sparse_slots=["a"], weighted=True))
        unweighted = models.create_feeds(Schema(dense_dim=2, sparse_slots=["a"]))
    assert [v.name for v in weighted.in_order()] == ["click", "weight", "dense", "a"]
    assert [v.name for v in unweighted.in_order()] == ["click", "dense", "a"] and unweighted.weight is None


def test_base_rate_logit_is_the_train_ctrs_logit_bounded_away_from_0_and_1():
    assert models.base_rate_logit({"ctr": {"train": 0.25}}) == pytest.approx(np.log(0.25 / 0.75))
    assert models.base_rate_logit({"ctr": {"train": 0.0}}) == pytest.approx(np.log(1e-4 / (1 - 1e-4)))
    assert models.base_rate_logit({"ctr": {"train": None}}) == 0.0


@pytest.mark.parametrize("name", [name for name in ModelName if name is not ModelName.custom])  # custom: its own tests
def test_every_model_starts_predicting_the_base_rate_its_initial_logit_gives(name):
    """With every embedding row zero, only the biases speak: their sum is the initial logit."""
    import paddle

    paddle.enable_static()
    schema = Schema(dense_dim=2, sparse_slots=["a", "b"])
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
        feeds = models.create_feeds(schema)

        def lookup(slot):
            return paddle.static.nn.embedding(slot, size=[10, DIM], param_attr=paddle.ParamAttr(
                name="embedding", initializer=paddle.nn.initializer.Constant(0.0)))

        logit = models.net(ModelConfig(name=name, hidden=[4]), feeds, lookup, DIM, initial_logit=-2.5).logit
    biases = [p.name for p in main.all_parameters() if p.name.endswith(".b")]
    scope, exe = paddle.static.Scope(), paddle.static.Executor(paddle.CPUPlace())
    with paddle.static.scope_guard(scope):
        exe.run(startup)
        feed = {"dense": np.zeros((2, 2), np.float32),
                **{var.name: _lod_tensor(np.array([[1], [2]], np.int64), [1, 1]) for var in feeds.sparse}}
        (got,) = exe.run(main, feed=feed, fetch_list=[logit])
        total_bias = sum(float(np.array(scope.find_var(b).get_tensor()).sum()) for b in biases)
    np.testing.assert_allclose(got, -2.5, rtol=1e-6)
    assert total_bias == pytest.approx(-2.5)


@pytest.mark.parametrize("name", list(ModelName))
@pytest.mark.parametrize("dense_dim", [13, 0])
def test_dense_parameters_counts_what_the_program_builds(name, dense_dim):
    import paddle

    network = "examples.custom_network:network" if name is ModelName.custom else None
    model = ModelConfig(name=name, hidden=[32, 16], cross_layers=2, network=network)
    schema = Schema(dense_dim, ["a", "b", "c"])
    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
        feeds = models.create_feeds(schema)

        def lookup(slot):
            return paddle.static.nn.embedding(slot, size=[50, DIM], param_attr=paddle.ParamAttr(name="embedding"))

        models.net(model, feeds, lookup, DIM)
    built = sum(int(np.prod(p.shape)) for p in main.all_parameters() if p.name != "embedding")
    assert models.dense_parameters(model, 3, dense_dim, DIM) == built
