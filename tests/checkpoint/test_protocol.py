"""How a running PS job takes a checkpoint: the workers' rows when the servers cannot save the table."""

import numpy as np

from components.checkpoint import protocol
from components.checkpoint.store import CheckpointStore


def test_worker_rows_merge_averages_geo_copies_and_keeps_pulled_rows_exact(tmp_path):
    store = CheckpointStore(str(tmp_path / "store"))
    pulled = np.array([[0.1, -0.7], [1 / 3, 2e-8]], np.float32)  # one barrier's rows: equal on every worker
    protocol.upload_worker_rows(store, 1, 0, np.array([5, 9]), pulled, tmp_path)
    protocol.upload_worker_rows(store, 1, 1, np.array([9, 2**63 + 1], np.uint64), np.vstack([pulled[1], [4, 4]]), tmp_path)
    ids, rows = protocol.merged_worker_rows(store, 1, workers=2, staging=tmp_path / "local")
    assert ids.tolist() == [5, 9, 2**63 + 1]
    assert rows[1].tobytes() == pulled[1].tobytes()  # bit-exact: the mean of equal copies
    protocol.upload_worker_rows(store, 2, 0, np.array([7]), np.array([[1.0, 0.0]], np.float32), tmp_path)
    protocol.upload_worker_rows(store, 2, 1, np.array([7]), np.array([[3.0, 1.0]], np.float32), tmp_path)
    _, geo = protocol.merged_worker_rows(store, 2, workers=2, staging=tmp_path / "local2")
    np.testing.assert_array_equal(geo, [[2.0, 0.5]])
    assert (tmp_path / "local2" / protocol.WORKER_ROWS / "worker-1.npz").is_file()  # kept in the checkpoint
    assert not store.fs.exists(store.fs_path(None, f"{protocol.WORKER_ROWS_SCRATCH}/e0002"))
