"""The online server: the KServe v1 and v2 protocols and their refusals (against a stand-in model), raw records served
from a real export, and the ``serve`` command shutting down cleanly on SIGTERM."""

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from components.data_prep.prepare import prepare_synthetic
from components.export.model import InferenceModel
from components.export.sharded import export_sharded
from tests.conftest import ROOT
from tests.export.checkpoints import VOCAB, commit_checkpoint, make_checkpoint

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from components.export.server import BYTES_PER_INSTANCE, InstanceError, create_app  # noqa: E402

COLUMNS = ["I1", "I2", "C1", "C2"]


class StandInModel:
    """What the server reads of a model (``predict_instances``, ``version``, ``transform.columns``, ``meta``),
    scoring instance ``i`` of a batch ``(i + 1) / 100``, refusing an instance holding ``"bad"`` as the transform
    refuses one, and recording the instances it was given."""

    def __init__(self, version: int = 7):
        self.version, self.meta = version, {"model_name": "deepfm"}
        self.transform = SimpleNamespace(columns=COLUMNS)
        self.given: list = []
        self.broken = False

    def predict_instances(self, instances: list) -> np.ndarray:
        if self.broken:
            raise RuntimeError("the executor fell over\nsecond line")
        for index, instance in enumerate(instances):
            if "bad" in json.dumps(instance):
                raise InstanceError(f"instance {index}, field C1: expected a string or a number, got a list")
        self.given.append(instances)
        return (np.arange(len(instances), dtype=np.float32) + 1) / 100


@pytest.fixture
def model() -> StandInModel:
    return StandInModel()


@pytest.fixture
def client(model) -> TestClient:
    return TestClient(create_app(lambda: model, name="ctr", max_batch=4))


def refusal(response, status: int = 400) -> str:
    assert response.status_code == status, response.text
    message = response.json()["error"]
    assert "\n" not in message
    return message


def test_v1_predict_scores_each_instance_and_names_the_version(client, model):
    instances = [["1", "", "a", None], {"I1": 3, "C2": "x"}]
    response = client.post("/v1/models/ctr:predict", json={"instances": instances})
    assert response.status_code == 200
    assert response.json() == {"predictions": [pytest.approx(0.01), pytest.approx(0.02)], "model_version": "7"}
    assert response.headers["model-version"] == "7"
    assert model.given == [instances]


@pytest.mark.parametrize("body, expected", [
    (b'{"instances": [', "the request body is not JSON: Expecting value: line 1 column 16 (char 15)"),
    (b"\xff\xfe", "the request body is not JSON: "),
    (b"[1, 2]", 'a v1 request is a JSON object {"instances": [...]}'),
    (b'{"instances": [], "signature": 1}', "unknown key(s) ['signature'] in the request"),
    (b'{"instances": {"I1": 1}}', '"instances" must be a list, got dict'),
    (b'{"instances": [[], [], [], [], []]}', "a batch of 5 instances is over --max-batch 4: split it"),
    (b'{"instances": [[], 7]}', "instance 1: expected a list of fields or an object keyed by column, got int"),
    (b'{"instances": [[], ["bad"]]}', "instance 1, field C1: expected a string or a number, got a list"),
])
def test_v1_bad_requests_get_a_400_in_one_line_and_the_server_keeps_serving(client, body, expected):
    assert expected in refusal(client.post("/v1/models/ctr:predict", content=body))
    assert client.post("/v1/models/ctr:predict", json={"instances": [[]]}).json()["predictions"] == [
        pytest.approx(0.01)]


def test_a_body_over_the_limit_gets_a_413_an_unknown_model_a_404(client):
    instances = [["x" * 1000] * 4] * 4 * (BYTES_PER_INSTANCE // 4000 + 1)
    assert "the request body is over 65536 bytes" in refusal(
        client.post("/v1/models/ctr:predict", json={"instances": instances}), 413)
    assert refusal(client.post("/v1/models/other:predict", json={"instances": []}), 404) == (
        "model 'other' is not served here: this server serves 'ctr'")
    assert client.get("/v2/models/other").status_code == 404


def test_an_internal_error_is_a_500_in_one_line_logged_with_its_traceback(client, model, caplog):
    model.broken = True
    with caplog.at_level(logging.ERROR, logger="components.export.server"):
        message = refusal(client.post("/v1/models/ctr:predict", json={"instances": [[]]}), 500)
    assert message == "internal error (RuntimeError); the server logged it"
    (record,) = caplog.records
    assert record.exc_info and "the executor fell over" in str(record.exc_info[1])
    model.broken = False
    assert client.post("/v1/models/ctr:predict", json={"instances": [[]]}).status_code == 200


def tensor(name: str, datatype: str, data: list, shape=None) -> dict:
    return {"name": name, "datatype": datatype, "shape": shape or [len(data)], "data": data}


def test_v2_infer_takes_one_tensor_per_column_a_column_left_out_is_missing(client, model):
    response = client.post("/v2/models/ctr/infer", json={"id": "r1", "inputs": [
        tensor("I1", "INT64", [1, None, 3]), tensor("C1", "BYTES", ["a", "", None]),
        tensor("I2", "FP32", [[0.5], [1], [2.5]], shape=[3, 1])]})
    assert response.status_code == 200, response.text
    assert response.json() == {"model_name": "ctr", "model_version": "7", "id": "r1", "outputs": [
        {"name": "probability", "datatype": "FP32", "shape": [3],
         "data": [pytest.approx(0.01), pytest.approx(0.02), pytest.approx(0.03)]}]}
    assert model.given == [[{"I1": 1, "C1": "a", "I2": 0.5}, {"I1": None, "C1": "", "I2": 1},
                            {"I1": 3, "C1": None, "I2": 2.5}]]


def test_v2_infer_takes_json_instances_in_one_bytes_input(client, model):
    instances = [["1", "", "a", "b"], {"C2": "x"}]
    response = client.post("/v2/models/ctr/infer", json={"inputs": [
        tensor("instances", "BYTES", [json.dumps(i) for i in instances])], "outputs": [{"name": "probability"}]})
    assert response.json()["outputs"][0]["data"] == [pytest.approx(0.01), pytest.approx(0.02)]
    assert model.given == [instances]


@pytest.mark.parametrize("inputs, expected", [
    ([tensor("C9", "BYTES", ["a"])], "input 'C9' is not a column of the model (columns: I1, I2, C1, C2;"),
    ([tensor("I1", "INT64", [1, "2"])], "instance 1, field I1: INT64 input holds str \"2\""),
    ([tensor("I1", "INT64", [True])], "instance 0, field I1: INT64 input holds bool true"),
    ([tensor("C1", "BYTES", ["a", 3])], "instance 1, field C1: BYTES input holds int 3"),
    ([tensor("C1", "UINT8", [1])], "input C1: datatype 'UINT8', expected one of BYTES, INT64, INT32, FP32, FP64"),
    ([tensor("C1", "BYTES", ["a"], shape=[2])], "input C1: shape [2] but data holds 1 values"),
    ([tensor("C1", "BYTES", ["a"], shape=[1, 2])], "input C1: shape [1, 2], expected [n] or [n, 1]"),
    ([tensor("C1", "BYTES", ["a"] * 5)], "a batch of 5 instances is over --max-batch 4: split it"),
    ([tensor("C1", "BYTES", ["a"]), tensor("C2", "BYTES", ["a", "b"])],
     "input C2 holds 2 values, input C1 1: every input holds one value per instance"),
    ([tensor("C1", "BYTES", ["a"]), tensor("C1", "BYTES", ["b"])], "input C1 is given twice"),
    ([{"name": "C1", "data": ["a"]}], "input 0: a v2 input is an object with name, shape, datatype and data"),
    ([], 'a v2 request is a JSON object {"inputs": [{"name", "shape", "datatype", "data"}, ...]}'),
    ([tensor("instances", "BYTES", ["[1, 2", "{}"])], "instance 0: not JSON (Expecting ',' delimiter"),
    ([tensor("instances", "BYTES", ['"x"'])], "instance 0: expected a JSON list of fields or an object keyed"),
    ([tensor("C1", "BYTES", ["bad"])], "instance 0, field C1: expected a string or a number, got a list"),
])
def test_v2_bad_requests_get_a_400_in_one_line(client, inputs, expected):
    assert expected in refusal(client.post("/v2/models/ctr/infer", json={"inputs": inputs}))


def test_v2_refuses_an_output_the_model_does_not_have(client):
    body = {"inputs": [tensor("C1", "BYTES", ["a"])], "outputs": [{"name": "logit"}]}
    assert refusal(client.post("/v2/models/ctr/infer", json=body)) == (
        "output 'logit' does not exist: the model outputs 'probability'")


def test_v2_metadata_and_health_name_the_version_served(client):
    assert client.get("/v2/health/live").json() == {"live": True}
    assert client.get("/v2/health/ready").json() == {"ready": True}
    assert client.get("/v2/models/ctr/ready").json() == {"name": "ctr", "ready": True}
    assert client.get("/v2").json()["extensions"] == []
    meta = client.get("/v2/models/ctr").json()
    assert meta["versions"] == ["7"] and meta["model_name"] == "deepfm"
    assert [i["name"] for i in meta["inputs"]] == COLUMNS
    assert meta["outputs"] == [{"name": "probability", "datatype": "FP32", "shape": [-1]}]


def test_metrics_count_requests_errors_instances_latency_and_the_version(client):
    client.post("/v1/models/ctr:predict", json={"instances": [[], []]})
    client.post("/v1/models/ctr:predict", content=b"{")
    client.post("/v2/models/ctr/infer", json={"inputs": [tensor("C1", "BYTES", ["a"])]})
    text = client.get("/metrics").text
    for line in ('ctr_serving_requests_total{protocol="v1"} 2.0', 'ctr_serving_requests_total{protocol="v2"} 1.0',
                 'ctr_serving_request_errors_total{protocol="v1",status="400"} 1.0',
                 "ctr_serving_instances_total 3.0", "ctr_serving_model_version 7.0",
                 'ctr_serving_request_seconds_count{protocol="v1"} 2.0'):
        assert line in text.splitlines(), line


# --- a real export ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """An export store holding one version of a small model."""
    root = tmp_path_factory.mktemp("server")
    prepare_synthetic(root / "data", rows=600, test_fraction=0.25, num_shards=1, vocab_size=VOCAB, seed=3)
    checkpoint = commit_checkpoint(root / "checkpoint", make_checkpoint(root / "data", "deepfm", seed=4))
    export_sharded(checkpoint, str(root / "store"), dataset_dir=root / "data")
    return root / "store"


def test_raw_instances_through_the_server_equal_the_model_in_process(store):
    model = InferenceModel.load(store)
    columns = list(model.transform.columns)
    instances = [[str(i + j) for j in range(len(columns))] for i in range(5)]
    instances += [{column: str(j) for j, column in enumerate(columns[: len(columns) // 2])}, {}]
    expected = model.predict_instances(instances)
    client = TestClient(create_app(lambda: model))
    v1 = client.post("/v1/models/ctr:predict", json={"instances": instances}).json()
    assert v1["model_version"] == "1"
    assert np.max(np.abs(np.asarray(v1["predictions"]) - expected)) <= 1e-6
    by_column = [tensor(column, "BYTES", [row[j] for row in instances[:5]]) for j, column in enumerate(columns)]
    v2 = client.post("/v2/models/ctr/infer", json={"inputs": by_column}).json()
    assert np.max(np.abs(np.asarray(v2["outputs"][0]["data"]) - expected[:5])) <= 1e-6
    too_long = instances[0] + ["1"]
    message = refusal(client.post("/v1/models/ctr:predict", json={"instances": [instances[0], too_long]}))
    assert message.startswith("instance 1")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_serve_answers_then_shuts_down_cleanly_on_sigterm(store):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "components.export.serving", "serve", "--model", str(store), "--port", str(port),
         "--poll-seconds", "0.2"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, server.communicate()[1].decode()[-2000:]
            try:
                with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=5) as response:
                    assert json.loads(response.read()) == {"ready": True}
                break
            except (ConnectionError, urllib.error.URLError):
                assert time.monotonic() < deadline, "the server never became ready"
                time.sleep(0.2)
        with urllib.request.urlopen(f"{url}/v2/models/ctr", timeout=10) as response:
            assert json.loads(response.read())["versions"] == ["1"]
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(f"{url}/v1/models/ctr:predict", b"{"), timeout=10)
        assert refused.value.code == 400
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=15) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    _, stderr = server.communicate()
    assert "Traceback" not in stderr.decode()
    assert f"serving version 1 of {store} as 'ctr' on {url}, following {store} every 0.2s" in stderr.decode()
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), timeout=5):
        pass
