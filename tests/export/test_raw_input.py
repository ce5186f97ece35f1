"""Raw records in: an export made with its dataset holds the dataset's transform, and its predictions from raw
records (and from serving instances) are those from data prep's shards of the same records, in every input format
and both export formats; an export without a transform still scores shards and refuses raw input in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from components.data_prep.multislot import read_shards
from components.data_prep.transform import ID_COUNTS_FILE, TRANSFORM_DIR, TRANSFORM_FILE, InstanceError
from components.export.delta import LAYOUT_KEYS
from components.export.manifest import MANIFEST, ServingModelError
from components.export.model import InferenceModel
from components.export.serving import main
from components.export.sharded import export_sharded
from components.export.single import export_single
from components.export.store import VERSION_NAME
from tests.data_prep.inputs import instances_of, prepare_records, record_lines, shard_files
from tests.export.checkpoints import VOCAB, commit_checkpoint, make_checkpoint
from tests.export.test_delta import evolved

CASES = {"raw": ("raw", False, 1), "raw-min-id-count-2": ("raw", False, 2), "raw-weighted": ("raw", True, 1),
         "slot": ("slot", False, 1), "feasign": ("feasign", False, 1), "feasign-weighted": ("feasign", True, 2)}
TOLERANCE = 1e-6


@pytest.fixture(scope="module", params=sorted(CASES))
def exported(request, tmp_path_factory):
    """A dataset of the case's records, a checkpoint on it, and both exports made with the dataset."""
    fmt, weighted, min_id_count = CASES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    lines = record_lines(fmt, 300, weighted)
    stats = prepare_records(root / "data", fmt, lines, VOCAB, weighted, min_id_count)
    ckpt = commit_checkpoint(root / "checkpoint", make_checkpoint(root / "data", "dnn"))
    export_sharded(ckpt, str(root / "store"), dataset_dir=root / "data")
    export_single(ckpt, root / "single", dataset_dir=root / "data")
    return {"fmt": fmt, "weighted": weighted, "lines": lines, "root": root, "stats": stats, "ckpt": ckpt}


@pytest.mark.parametrize("model_format", ["single", "sharded"])
def test_raw_records_and_instances_score_as_the_shards(exported, model_format):
    root = exported["root"]
    model = InferenceModel.load(root / ("single" if model_format == "single" else "store"))
    assert model.transform is not None and model.transform.schema == model.schema
    from_shards = model.predict_files(shard_files(root / "data", exported["stats"]))
    lines = exported["lines"]
    from_records = model.predict_records(("\n".join(lines) + "\n").encode())
    assert len(from_records) == len(lines) and np.abs(from_records - from_shards).max() <= TOLERANCE
    # The ids themselves are the shards', bit for bit.
    _, _, sparse = read_shards(shard_files(root / "data", exported["stats"]), model.schema)
    rows = model.transform.rows_of_records(("\n".join(lines) + "\n").encode())
    assert all(np.array_equal(a.values, b.values) for a, b in zip(rows.sparse, sparse))
    objects = [instances_of(exported["fmt"], line, model.transform.columns) for line in lines]
    assert np.array_equal(model.predict_instances(objects), from_records)
    lists = [[instance.get(column) for column in model.transform.columns] for instance in objects]
    assert np.array_equal(model.predict_instances(lists), from_records)
    assert model.predict_instances([]).shape == (0,) and model.predict_records(b"\n").shape == (0,)
    with pytest.raises(InstanceError, match=r"^instance 2, field nope: unknown column"):
        model.predict_instances([objects[0], objects[1], {"nope": 1}])


def test_the_export_lists_and_describes_its_transform(exported):
    root = exported["root"]
    counted = exported["stats"]["min_id_count"] > 1
    expected = [f"{TRANSFORM_DIR}/{TRANSFORM_FILE}", *([f"{TRANSFORM_DIR}/{ID_COUNTS_FILE}"] if counted else [])]
    dataset_transform = json.loads((root / "data" / TRANSFORM_DIR / TRANSFORM_FILE).read_text())
    for directory in (root / "single", root / "store" / VERSION_NAME.format(1)):
        meta = json.loads((directory / MANIFEST).read_text())
        assert sorted(rel for rel in meta["files"] if rel.startswith(TRANSFORM_DIR)) == sorted(expected)
        assert meta["transform"] == dataset_transform
        for rel in expected:
            assert (directory / rel).read_bytes() == (root / "data" / rel).read_bytes()


def test_predict_reads_raw_records_by_default_and_shards_when_asked(exported, tmp_path, capsys):
    root, lines = exported["root"], exported["lines"]
    half = len(lines) // 2
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("\n".join(lines[:half]) + "\n")
    (tmp_path / "in" / "b.txt").write_text("\n".join(lines[half:]))  # the last line without its newline
    assert main(["predict", "--model", str(root / "store"), "--input", str(tmp_path / "in" / "*.txt"),
                 "--output", str(tmp_path / "records.txt")]) == 0
    assert "of records" in capsys.readouterr().out
    shards = [str(path) for path in shard_files(root / "data", exported["stats"])]
    assert main(["predict", "--model", str(root / "store"), "--input-format", "shards", "--input", *shards,
                 "--output", str(tmp_path / "shards.txt")]) == 0
    from_records = np.loadtxt(tmp_path / "records.txt", dtype=np.float32)
    from_shards = np.loadtxt(tmp_path / "shards.txt", dtype=np.float32)
    assert len(from_records) == len(lines) and np.abs(from_records - from_shards).max() <= TOLERANCE


def test_a_malformed_record_is_refused_naming_its_file_and_line(exported, tmp_path, capsys):
    lines = exported["lines"]
    # A weighted input's row without its weight refuses the input as data prep refuses it.
    bad = (" ".join(t for t in lines[3].split(" ") if not t.startswith("w:")) if exported["fmt"] == "feasign"
           else lines[3].rsplit("\t", 1)[0]) if exported["weighted"] else "not a record"
    (tmp_path / "in.txt").write_text("\n".join([*lines[:3], bad, *lines[3:5]]) + "\n")
    assert main(["predict", "--model", str(exported["root"] / "single"), "--input", str(tmp_path / "in.txt"),
                 "--output", str(tmp_path / "out.txt")]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"error: {tmp_path / 'in.txt'}:4: ") and error.count("\n") == 1
    assert not (tmp_path / "out.txt").exists()


@pytest.fixture(scope="module")
def raw_case(tmp_path_factory):
    root = tmp_path_factory.mktemp("raw-chain")
    lines = record_lines("raw", 300)
    stats = prepare_records(root / "data", "raw", lines, VOCAB)
    first = make_checkpoint(root / "data", "dnn")
    return root, lines, stats, first


def test_an_export_without_a_transform_scores_shards_and_refuses_raw_input(raw_case, tmp_path, capsys):
    root, lines, stats, first = raw_case
    ckpt = commit_checkpoint(tmp_path / "checkpoint", first)
    assert main(["export", "--checkpoint", str(ckpt), "--out", str(tmp_path / "store")]) == 0
    model = InferenceModel.load(tmp_path / "store")
    assert model.transform is None and json.loads((tmp_path / "store" / VERSION_NAME.format(1) / MANIFEST)
                                                  .read_text())["transform"] is None
    with pytest.raises(ServingModelError, match=r"exported without its dataset's transform: it scores MultiSlot "
                                                r"shards, not raw records; export it again with the dataset"):
        model.predict_records(lines[0].encode())
    with pytest.raises(ServingModelError, match="not instances"):
        model.predict_instances([{}])
    shards = [str(path) for path in shard_files(root / "data", stats)]
    assert main(["predict", "--model", str(tmp_path / "store"), "--input", *shards,
                 "--output", str(tmp_path / "preds.txt")]) == 0  # shards: the default without a transform
    assert np.array_equal(np.loadtxt(tmp_path / "preds.txt", dtype=np.float32), model.predict_files(shards))
    capsys.readouterr()
    # The next version, a delta, exported with its dataset (the CLI's --dataset), carries its own transform.
    ckpt2 = commit_checkpoint(tmp_path / "checkpoint2", evolved(first, 0))
    assert main(["export", "--checkpoint", str(ckpt2), "--out", str(tmp_path / "store"),
                 "--dataset", str(root / "data")]) == 0
    delta = json.loads((tmp_path / "store" / VERSION_NAME.format(2) / MANIFEST).read_text())
    assert delta["kind"] == "delta" and delta["transform"] is not None and "transform" not in LAYOUT_KEYS
    model = InferenceModel.load(tmp_path / "store")
    assert model.version == 2 and model.transform is not None
    assert np.abs(model.predict_records(("\n".join(lines) + "\n").encode())
                  - model.predict_files(shards)).max() <= TOLERANCE


def test_an_altered_transform_is_refused(raw_case, tmp_path):
    root, _, _, first = raw_case
    ckpt = commit_checkpoint(tmp_path / "checkpoint", first)
    single = export_single(ckpt, tmp_path / "single", dataset_dir=root / "data")
    path = single / TRANSFORM_DIR / TRANSFORM_FILE
    path.write_text(path.read_text().replace('"vocab_size": 5000', '"vocab_size": 4999'))
    with pytest.raises(ServingModelError, match="transform/transform.json has sha256"):
        InferenceModel.load(single)
    with pytest.raises(ServingModelError, match="is not the transform serving.json describes"):
        InferenceModel.load(single, verify=False)


def test_a_dataset_of_another_schema_is_refused_at_export(raw_case, tmp_path):
    _, _, _, first = raw_case
    ckpt = commit_checkpoint(tmp_path / "checkpoint", first)
    other = tmp_path / "feasign"
    prepare_records(other, "feasign", record_lines("feasign", 200), VOCAB)
    with pytest.raises(ServingModelError, match="give the dataset the checkpoint trained on"):
        export_single(ckpt, tmp_path / "single", dataset_dir=other)
    assert not (tmp_path / "single").exists()
