"""The live follower on real exports: a delta made into a new model beside the served one (copy-on-write), new
versions swapped in under concurrent clients without a failed request, and tampered or misplaced versions refused
in one log line while the old version keeps serving."""

import json
import logging
import shutil
import threading
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from components.data_prep.multislot import RaggedIds
from components.data_prep.prepare import prepare_synthetic
from components.export.follow import LoadOptions, ModelFollower, followed_store
from components.export.manifest import MANIFEST, SIGNATURE, ServingModelError, write_manifest
from components.export.model import InferenceModel
from components.export.sharded import export_sharded
from components.export.signing import AUTO, signer
from components.networks.scoring import read_test_split
from tests.export.checkpoints import VOCAB, commit_checkpoint, make_checkpoint
from tests.export.test_delta import evolved

pytest.importorskip("fastapi")
CLIENTS = 8


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("follow") / "data"
    prepare_synthetic(out, rows=1200, test_fraction=0.25, num_shards=1, vocab_size=VOCAB, seed=5)
    return out


@pytest.fixture(scope="module")
def checkpoints(data_dir, tmp_path_factory) -> list[Path]:
    """Three committed checkpoints, each evolved from the one before."""
    root = tmp_path_factory.mktemp("checkpoints")
    checkpoint, committed = make_checkpoint(data_dir, "deepfm", seed=2), []
    for step in range(3):
        committed.append(commit_checkpoint(root / f"checkpoint-{step}", checkpoint))
        checkpoint = evolved(checkpoint, seed=10 + step)
    return committed


@pytest.fixture(scope="module")
def source(checkpoints, data_dir, tmp_path_factory) -> Path:
    """An export store of the three checkpoints: a base and two deltas on it."""
    store = tmp_path_factory.mktemp("exports") / "store"
    for checkpoint in checkpoints:
        export_sharded(checkpoint, str(store), dataset_dir=data_dir)
    return store


def publish(source: Path, store: Path, version: int) -> Path:
    """Publish ``version`` of ``source`` in ``store`` as the store does: complete, then renamed into place."""
    name = f"v{version:06d}"
    staging = store / f".{name}.tmp"
    shutil.copytree(source / name, staging)
    staging.rename(store / name)
    return store / name


@pytest.fixture
def served(source, tmp_path) -> Path:
    """A store that has published version 1 of ``source`` only."""
    store = tmp_path / "served"
    store.mkdir()
    publish(source, store, 1)
    return store


def test_with_delta_leaves_the_served_model_as_it_was(source, data_dir):
    _, dense, sparse = read_test_split(data_dir)
    first = InferenceModel.load(source / "v000001")
    before = first.predict(dense, sparse)
    second = first.with_delta(source / "v000002")
    assert (first.version, second.version) == (1, 2)
    assert np.array_equal(first.predict(dense, sparse), before)
    in_place = InferenceModel.load(source / "v000001")
    in_place.apply_delta(source / "v000002")
    assert np.array_equal(second.predict(dense, sparse), in_place.predict(dense, sparse))
    assert not np.array_equal(second.predict(dense, sparse), before)
    assert second.table.layers[0][0] is first.table.layers[0][0]  # the base's memory maps are shared
    assert [len(layers) for layers in first.table.layers] == [1] * len(first.table.layers)


def test_the_follower_applies_each_new_version_and_skips_to_the_latest(source, served):
    follower = ModelFollower(InferenceModel.load(served), str(served), LoadOptions(), poll_seconds=60)
    first = follower.model
    assert follower.poll() is None and follower.model is first
    publish(source, served, 2)
    publish(source, served, 3)
    assert follower.poll() == 3 and follower.model.version == 3 and first.version == 1
    latest = InferenceModel.load(source)
    assert [len(layers) for layers in follower.model.table.layers] == [3] * len(latest.table.layers)
    # A store is followed itself; a version directory, the store it was published in (its serving.json says).
    assert followed_store(str(served), first) == str(served)
    assert followed_store(str(served / "v000001"), first) == first.meta["store"] == str(source)


def test_a_remote_store_is_followed_through_downloads_delta_then_base(checkpoints, source, data_dir, tmp_path):
    from components.export.server import Metrics

    uri = f"memory://follow-{tmp_path.name}/store"
    export_sharded(checkpoints[0], uri, dataset_dir=data_dir)
    metrics = Metrics()
    follower = ModelFollower(InferenceModel.load(uri), uri, LoadOptions(), poll_seconds=60, prepare=metrics.prepare)
    _, dense, sparse = read_test_split(data_dir)
    export_sharded(checkpoints[1], uri, dataset_dir=data_dir)
    assert follower.poll() == 2
    assert np.array_equal(follower.model.predict(dense, sparse),
                          InferenceModel.load(source / "v000002").predict(dense, sparse))
    export_sharded(checkpoints[2], uri, base_every=0, dataset_dir=data_dir)  # a new base: loaded whole
    assert follower.poll() == 3 and follower.model.meta["kind"] == "base"
    assert np.array_equal(follower.model.predict(dense, sparse),
                          InferenceModel.load(source / "v000003").predict(dense, sparse))
    sample = metrics.registry.get_sample_value
    assert sample("ctr_serving_model_version") == 3 and sample("ctr_serving_rows_looked_up_total") > 0
    follower.stop()


def test_a_tampered_delta_is_refused_in_one_log_line_and_the_old_version_keeps_serving(source, served, caplog):
    follower = ModelFollower(InferenceModel.load(served), str(served), LoadOptions(), poll_seconds=60)
    delta = publish(source, served, 2)
    shard = next((delta / "shards").glob("*.rows.npy"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x01  # one byte of one row
    shard.write_bytes(bytes(data))
    with caplog.at_level(logging.INFO, logger="components.export.follow"):
        assert follower.poll() is None
        assert follower.poll() is None  # refused once: not tried (nor logged) again
    assert follower.model.version == 1
    (line,) = [r.getMessage() for r in caplog.records]
    assert "\n" not in line and line.startswith(f"refused version 2 of {served}, still serving version 1: ")
    assert f"{shard} has sha256" in line and "truncated or altered" in line


def test_a_delta_on_another_parent_is_refused_in_one_log_line(source, served, caplog):
    follower = ModelFollower(InferenceModel.load(served), str(served), LoadOptions(), poll_seconds=60)
    # Version 3 (a delta on 2) published with a chain that skips 2, signed with the exporter's own key: the parent
    # check refuses what the signature vouches for.
    delta = publish(source, served, 3)
    manifest = json.loads((delta / MANIFEST).read_text())
    write_manifest(delta, {**manifest, "chain": [1, 3]}, signer(AUTO))
    with caplog.at_level(logging.INFO, logger="components.export.follow"):
        assert follower.poll() is None
    (line,) = [r.getMessage() for r in caplog.records]
    assert "\n" not in line and line.startswith(f"refused version 3 of {served}, still serving version 1: ")
    assert "delta version 3 applies to version 2, the loaded model is version 1: refusing it" in line
    assert follower.model.version == 1


class RowsModel:
    """A served model whose instances are ``[row number]`` in the test split, scored by the real model: the concurrency
    test's stand-in for the raw-record transform (tests/export/test_server.py serves raw records)."""

    def __init__(self, model, dense: np.ndarray, sparse: list[RaggedIds]):
        self.model, self.dense, self.sparse = model, dense, sparse
        self.version, self.meta = model.version, model.meta
        self.transform = SimpleNamespace(columns=["row"])

    def predict_instances(self, instances: list) -> np.ndarray:
        rows = np.asarray([row for (row,) in instances], np.int64)
        sparse = []
        for slot in self.sparse:
            lengths = np.diff(slot.offsets)[rows]
            values = [slot.row(int(i)) for i in rows]
            sparse.append(RaggedIds(np.concatenate(values), np.concatenate([[0], np.cumsum(lengths)])))
        return self.model.predict(self.dense[rows], sparse)


def serve_in_thread(app):
    """``(url, stop)``: ``app`` on uvicorn on a free loopback port, in a thread."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]

    def stop():
        server.should_exit = True
        thread.join(30)
    return f"http://127.0.0.1:{port}", stop


def test_a_delta_published_under_concurrent_clients_is_applied_with_no_failed_request(source, served, data_dir):
    from components.export.server import create_app

    _, dense, sparse = read_test_split(data_dir)
    expected = {1: InferenceModel.load(source / "v000001").predict(dense, sparse),
                2: InferenceModel.load(source / "v000002").predict(dense, sparse)}
    assert np.max(np.abs(expected[1] - expected[2])) > 1e-4  # the versions answer differently
    follower = ModelFollower(InferenceModel.load(served), str(served), LoadOptions(), poll_seconds=0.05)
    url, stop_server = serve_in_thread(create_app(lambda: RowsModel(follower.model, dense, sparse)))
    follower.start()
    stop = threading.Event()
    answers: list[list] = [[] for _ in range(CLIENTS)]
    failures: list[str] = []

    def client(index: int) -> None:
        rng = np.random.default_rng(index)
        while not stop.is_set():
            rows = rng.choice(len(dense), 16, replace=False).tolist()
            request = urllib.request.Request(f"{url}/v1/models/ctr:predict", json.dumps({"instances": [[row] for row in rows]}).encode(),
                                             {"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    body = json.loads(response.read())
                    assert response.headers["model-version"] == body["model_version"]
                answers[index].append((int(body["model_version"]), rows, body["predictions"]))
            except Exception as err:  # every failure is counted, none may happen
                failures.append(f"{type(err).__name__}: {err} {getattr(err, 'read', lambda: b'')()[:200]}")

    clients = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    try:
        for thread in clients:
            thread.start()
        time.sleep(1.0)
        publish(source, served, 2)
        deadline = time.monotonic() + 30
        while follower.model.version != 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(1.0)
    finally:
        stop.set()
        for thread in clients:
            thread.join(60)
        follower.stop()
        stop_server()
    assert failures == []
    assert follower.model.version == 2
    for versions in ([version for version, _, _ in mine] for mine in answers):
        switch = versions.index(2)  # every client saw the switch, once, and never went back
        assert switch > 0 and set(versions[:switch]) == {1} and set(versions[switch:]) == {2}
    for version, rows, predictions in (answer for mine in answers for answer in mine):
        assert np.max(np.abs(np.asarray(predictions) - expected[version][rows])) <= 1e-6


@pytest.mark.parametrize("damage", ["unsigned", "path outside the version"])
def test_an_unsigned_or_escaping_delta_is_refused_in_one_log_line_and_the_old_version_keeps_serving(
        source, served, caplog, damage):
    follower = ModelFollower(InferenceModel.load(served), str(served), LoadOptions(), poll_seconds=60)
    delta = publish(source, served, 2)
    if damage == "unsigned":
        (delta / SIGNATURE).unlink()
        expected = "unsigned"
    else:  # signed with the exporter's own key: the path check refuses what the signature vouches for
        manifest = json.loads((delta / MANIFEST).read_text())
        files = dict(manifest["files"])
        files["../../escaped.npy"] = files.pop(next(iter(files)))
        write_manifest(delta, {**manifest, "files": files}, signer(AUTO))
        expected = "../../escaped.npy"
    with caplog.at_level(logging.INFO, logger="components.export.follow"):
        assert follower.poll() is None
    (line,) = [r.getMessage() for r in caplog.records if r.name == "components.export.follow"]
    assert "\n" not in line and line.startswith(f"refused version 2 of {served}, still serving version 1: ")
    assert expected in line
    assert follower.model.version == 1 and not (served.parent / "escaped.npy").exists()


def test_a_model_without_its_transform_is_not_served(checkpoints, tmp_path, caplog):
    store = tmp_path / "store"
    export_sharded(checkpoints[0], str(store))  # no dataset: no transform, so no raw records in
    with pytest.raises(ServingModelError, match=r"exported without its dataset's transform, so it cannot read raw"):
        LoadOptions().load(str(store))
