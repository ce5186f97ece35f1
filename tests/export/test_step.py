"""The pipeline's export step: the checkpoint a Model artifact points at, exported per export.format, its table
files fetched from the checkpoint store one at a time."""

import json
from pathlib import Path

import numpy as np
import pytest

from components.config import from_dict, to_dict
from components.data_prep.prepare import prepare_synthetic
from components.export import step
from components.export import signing
from components.export.manifest import MANIFEST, SIGNATURE, ServingModelError
from components.export.model import InferenceModel
from components.export.store import ExportStore, export_store_uri
from components.networks.scoring import read_test_split
from tests.export.checkpoints import SHARD_NUM, TABLE_DIR, VOCAB, commit_checkpoint, make_checkpoint
from tests.export.keys import new_key_pair
from tests.export.test_delta import evolved


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("step") / "data"
    prepare_synthetic(out, rows=1000, test_fraction=0.25, num_shards=1, vocab_size=VOCAB, seed=6)
    return out


def _pointer(ckpt: Path) -> dict:
    return {"uri": str(ckpt.parent), "id": ckpt.name}  # what the train step's Model artifact carries


def test_sharded_step_writes_the_next_version_fetching_one_table_file_at_a_time(data_dir, tmp_path, monkeypatch):
    first = make_checkpoint(data_dir, "dcn")
    ckpts = [commit_checkpoint(tmp_path / "c0", first), commit_checkpoint(tmp_path / "c1", evolved(first, 0))]
    config = to_dict(from_dict({"checkpoint": {"uri": str(ckpts[0].parent)}}))
    fetch_file = step.fetch_file
    fetched = []

    def one_at_a_time(uri, ckpt_id, rel, local_dir):
        assert not [p for p in Path(local_dir).rglob("part-*")]  # the file before was converted and dropped
        fetched.append(rel)
        return fetch_file(uri, ckpt_id, rel, local_dir)

    monkeypatch.setattr(step, "fetch_file", one_at_a_time)
    metadata = [step.export_serving_model(config, "unused", _pointer(ckpt), str(tmp_path / f"artifact-{i}"),
                                          str(data_dir))  # the Dataset artifact, as the pipeline passes it
                for i, ckpt in enumerate(ckpts)]
    assert fetched == [f"{TABLE_DIR}/part-{s // 2:03d}-{s:05d}" for s in range(SHARD_NUM)] * 2
    store = export_store_uri(from_dict(config))
    assert store == f"{ckpts[0].parent}-serving" and ExportStore(store).versions() == [1, 2]
    assert [(m["format"], m["version"], m["kind"], m["parent"], m["shards"]) for m in metadata] == [
        ("sharded", 1, "base", None, SHARD_NUM), ("sharded", 2, "delta", 1, SHARD_NUM)]
    assert metadata[1]["rows"] == len(evolved(first, 0).ids) and metadata[1]["checkpoint_id"] == ckpts[1].name
    # Each version carries the dataset's transform (the synthetic rows are raw Criteo records).
    assert all(m["transform"] for m in metadata)
    assert (tmp_path / "artifact-1" / "transform" / "transform.json").read_bytes() == (
        data_dir / "transform" / "transform.json").read_bytes()
    # The artifact is the version itself; the delta's loads its chain from the store.
    for i, meta in enumerate(metadata):
        artifact = tmp_path / f"artifact-{i}"
        assert json.loads((artifact / MANIFEST).read_text()) == ExportStore(store).manifest(meta["version"])
    _, dense, sparse = read_test_split(data_dir)
    assert np.array_equal(InferenceModel.load(tmp_path / "artifact-1").predict(dense, sparse),
                          InferenceModel.load(store).predict(dense, sparse))


def test_single_step_writes_the_whole_model_into_the_artifact(data_dir, tmp_path):
    checkpoint = make_checkpoint(data_dir, "dnn")
    ckpt = commit_checkpoint(tmp_path / "c0", checkpoint)
    config = to_dict(from_dict({"checkpoint": {"uri": str(ckpt.parent)}, "export": {"format": "single",
                                                                                    "dtype": "float16"}}))
    metadata = step.export_serving_model(config, "unused", _pointer(ckpt), str(tmp_path / "artifact"))
    assert (metadata["format"], metadata["rows"], metadata["embedding_dtype"]) == ("single", len(checkpoint.ids),
                                                                                   "float16")
    assert metadata["checkpoint_uri"] == str(ckpt.parent) and metadata["checkpoint_id"] == ckpt.name
    assert metadata["transform"] is False  # no dataset given: a model that scores shards only
    assert type(InferenceModel.load(tmp_path / "artifact")).__name__ == "SingleModel"
    assert not Path(f"{ckpt.parent}-serving").exists()  # no export store for a single-file model


def test_on_kubeflow_the_step_signs_with_the_mounted_secret_and_none_leaves_the_export_unsigned(data_dir, tmp_path,
                                                                                                monkeypatch):
    ckpt = commit_checkpoint(tmp_path / "c0", make_checkpoint(data_dir, "dnn"))
    secret = tmp_path / "secret"  # stands for export.signing_secret mounted at SECRET_MOUNT
    _, public = new_key_pair(secret)
    monkeypatch.setattr(signing, "SECRET_MOUNT", str(secret))
    single = {"checkpoint": {"uri": str(ckpt.parent)}, "export": {"format": "single"}}
    config = to_dict(from_dict({**single, "cluster": {"runner": "kubeflow"}}))
    step.export_serving_model(config, "unused", _pointer(ckpt), str(tmp_path / "kubeflow"))
    assert InferenceModel.load(tmp_path / "kubeflow", public_key=public).meta["format"] == "single"
    with pytest.raises(ServingModelError, match="signed with another key"):
        InferenceModel.load(tmp_path / "kubeflow")  # not the per-user key
    config = to_dict(from_dict({**single, "export": {"format": "single", "signing_key": "none"}}))
    step.export_serving_model(config, "unused", _pointer(ckpt), str(tmp_path / "unsigned"))
    assert not (tmp_path / "unsigned" / SIGNATURE).exists()

