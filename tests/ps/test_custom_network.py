"""A network of the user's (model=custom, model.network="package.module:function"): the contract it is given, the
names of its parameters, and a run that trains, evaluates, exports and serves it like the built-in families."""

import json

import numpy as np
import pytest

from components.config import ConfigError, ModelConfig, ModelName
from components.data_prep.multislot import Schema, read_shards
from components.export.model import InferenceModel
from components.metrics import binary_metrics
from components.networks import models
from tests.conftest import ROOT, compose_config

DIM = 4
SEEN: list = []  # what recording_network was given, per call


def recording_network(inputs: models.NetworkInputs):
    """A linear network that keeps what it was given."""
    import paddle

    SEEN.append(inputs)
    features = paddle.concat(list(inputs.slots) + [inputs.dense], axis=1)
    return paddle.static.nn.fc(paddle.static.nn.fc(features, inputs.hidden[0]), 1)


def _build(prefix_layers: int):
    """A program whose custom network comes after ``prefix_layers`` layers of other code: its parameter names."""
    import paddle

    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        feeds = models.create_feeds(Schema(dense_dim=2, sparse_slots=["a", "b", "c"]))
        for _ in range(prefix_layers):  # other code's automatically named layers shift the global name counter
            paddle.static.nn.fc(feeds.dense, 3)

        def lookup(slot):
            return paddle.static.nn.embedding(slot, size=[10, DIM], param_attr=paddle.ParamAttr(name="embedding"))

        config = ModelConfig(name=ModelName.custom, network="tests.ps.test_custom_network:recording_network",
                             hidden=[5], dropout=0.25)
        logit = models.net(config, feeds, lookup, DIM, training=True, initial_logit=-1.5).logit
    assert logit.shape[1:] == (1,)
    return {p.name for p in main.all_parameters()} - {"embedding"}, feeds


def test_the_network_gets_each_slots_pooled_rows_the_dense_values_and_the_model_keys():
    SEEN.clear()
    _build(prefix_layers=0)
    [given] = SEEN
    assert len(given.slots) == 3 and all(tuple(slot.shape[1:]) == (DIM,) for slot in given.slots)
    assert tuple(given.dense.shape[1:]) == (2,)
    assert (given.embedding_dim, given.hidden, given.dropout, given.training, given.initial_logit) == \
        (DIM, [5], 0.25, True, -1.5)


def test_its_parameters_are_named_alike_in_every_program_that_builds_it():
    alone, _ = _build(prefix_layers=0)
    after_other_layers, _ = _build(prefix_layers=2)
    assert len(alone) == 4 and all(name.startswith(models.CUSTOM_NAME_SCOPE) for name in alone)  # 2 fc layers
    assert {name for name in after_other_layers if name.startswith(models.CUSTOM_NAME_SCOPE)} == alone


def test_a_network_that_does_not_import_is_named_in_the_error():
    with pytest.raises(ValueError, match="cannot import 'no_such_package.nets'"):
        models.load_network("no_such_package.nets:network")
    with pytest.raises(ValueError, match="has no function 'nope'"):
        models.load_network("tests.ps.test_custom_network:nope")


@pytest.mark.parametrize("overrides,key", [(["model=custom"], "model.network"),
                                           (["model=custom", "model.network=not a path"], "model.network"),
                                           (["model.network=examples.custom_network:network"], "model.network")])
def test_model_network_is_given_with_model_custom_only(config, overrides, key):
    from components.config_rules import validate

    with pytest.raises(ConfigError) as err:
        validate(config(*overrides))
    assert err.value.key == key


def test_a_custom_network_trains_evaluates_exports_and_serves_like_the_built_in_ones(tmp_path, monkeypatch):
    from pipelines.ctr import run

    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # every process of the run imports examples.custom_network
    run_dir = tmp_path / "run"
    metrics = run(compose_config(run_dir, "experiment=tiny", "ps.epochs=1", "eval.baseline=false", "model=custom",
                                 "model.network=examples.custom_network:network")).metrics
    assert metrics["auc"] > 0.7
    served = InferenceModel.load(run_dir / "serving_model")
    assert served.meta["model_name"] == "custom"
    # The served model scores the test split as the evaluation scored the trained checkpoint.
    dataset = next(tmp_path.rglob("merge-data/dataset"))
    stats = json.loads((dataset / "stats.json").read_text())
    test_shards = [dataset / rel for rel in stats["shards"]["test"]]
    labels, _, _ = read_shards(test_shards, served.schema)
    assert binary_metrics(labels, served.predict_files(test_shards))["auc"] == pytest.approx(metrics["auc"], abs=1e-4)
    assert np.all((0 < served.predict_instances([{}])) & (served.predict_instances([{}]) < 1))
