"""A checkpoint's files, its manifest and its export."""

import json

import numpy as np
import pytest

from components.checkpoint import format as checkpoint
from tests.conftest import commit_staged_checkpoint


def test_commit_verify_detects_missing_and_altered_files(tmp_path):
    root = tmp_path / "ckpt"
    checkpoint.save_export(root, np.array([1, 2], np.uint64), np.ones((2, 3), np.float32), {"w": np.zeros(4)})
    with pytest.raises(checkpoint.CheckpointError, match="MANIFEST.json is missing"):
        checkpoint.verify(root)
    root = commit_staged_checkpoint(root, {"paddle_version": "2.6.2"})
    manifest = checkpoint.verify(root)
    assert set(manifest["files"]) == {"model.json", "export/embedding.npz", "export/dense.npz"}
    assert checkpoint.load(root).rows.shape == (2, 3)
    dense = root / "export" / "dense.npz"
    dense.write_bytes(dense.read_bytes()[:-10])
    with pytest.raises(checkpoint.CheckpointError, match="export/dense.npz.*checksum"):
        checkpoint.load(root)
    dense.unlink()
    with pytest.raises(checkpoint.CheckpointError, match="dense.npz.*missing"):
        checkpoint.verify(root)
    assert json.loads((root / "model.json").read_text()) == {"paddle_version": "2.6.2"}


@pytest.mark.parametrize("name", ["../outside.npz", "/etc/hostname", "export/../../outside.npz"])
def test_verify_refuses_a_manifest_naming_a_file_outside_the_checkpoint(tmp_path, name):
    root = tmp_path / "ckpt"
    checkpoint.save_export(root, np.array([1, 2], np.uint64), np.ones((2, 3), np.float32), {"w": np.zeros(4)})
    root = commit_staged_checkpoint(root, {"paddle_version": "2.6.2"})
    manifest_path = root / checkpoint.MANIFEST
    manifest = json.loads(manifest_path.read_text())
    manifest["files"][name] = manifest["files"]["model.json"]
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(checkpoint.CheckpointError) as refused:
        checkpoint.verify(root)
    assert "\n" not in str(refused.value) and f"bad file name {name!r}" in str(refused.value)
