"""The planner against real local PS jobs: server RSS per row, where the rows land, how evenly they spread."""

import re
import subprocess

import pytest

from components.checkpoint.store import CheckpointStore
from components.config import from_dict
from components.data_prep.prepare import prepare_synthetic
from components.data_prep.synthetic import SyntheticSpec
from components.train import planner
from components.table.accessor import row_floats
from components.train.step import launch_ps_job

DATA_ROWS = 100_000
# Ids drawn uniformly per slot: every key of a batch is distinct at both sizes, so two jobs push the same
# traffic and differ only in the rows they leave on the servers (~130k and ~900k per server of 2).
UNIFORM_CATEGORIES = {"small": 10_000, "large": 150_000}
TOLERANCE = 0.25


@pytest.fixture(scope="module")
def uniform_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("uniform")

    def make(size):
        cards = UNIFORM_CATEGORIES[size]
        prepare_synthetic(root / size, rows=DATA_ROWS, test_fraction=0.05, num_shards=2, vocab_size=1 << 26, seed=0,
                          spec=SyntheticSpec(cardinalities=(cards,) * 26, zipf_exponent=0.0))
        return root / size

    return make


def _job(tmp_path, data_dir, servers, workers=2, vocab=1 << 26):
    # The planner's constants were measured with this shape (bench/memory.py): batch 256, dim 9, adagrad.
    cfg = from_dict({"ps": {"servers": servers, "workers": workers, "epochs": 1, "batch_size": 256},
                     "model": {"hidden": [16]}, "table": {"vocab_size": vocab},
                     "checkpoint": {"uri": str(tmp_path / "ckpt")}, "run_dir": str(tmp_path)})
    result = launch_ps_job(cfg, data_dir, tmp_path / "logs", echo=lambda line: None)
    left = subprocess.run(["pgrep", "-af", str(tmp_path)], capture_output=True, text=True).stdout
    assert "components.ps.role" not in left
    return cfg, result


def _saved_lines_per_server(cfg, result):
    """Lines of the sparse shard files each server saved (``part-<server>-<shard>``), read from the store."""
    store = CheckpointStore(cfg.checkpoint.uri)
    ckpt_id = result.checkpoints[-1]["id"]
    lines, widths = [0] * cfg.ps.servers, set()
    for rel in store.manifest(ckpt_id)["files"]:
        match = re.search(r"tables/000/part-(\d{3})-\d{5}", rel)
        if match:
            with open(store.fs_path(ckpt_id, rel)) as f:  # the servers save uncompressed text
                for line in f:
                    lines[int(match[1])] += 1
                    widths.add(len(line.split()))
    return lines, widths


def _growth(memory):
    return memory["peak_rss"] - memory["serving_rss"]


def test_server_rss_matches_the_memory_plan(tmp_path, uniform_data):
    cfg, result = _job(tmp_path, uniform_data("small"), servers=2)
    rows = result.checkpoints[-1]["servers"]["rows"]
    # The rows each server saved are where the planner routes them, and every row has the planned layout.
    lines, widths = _saved_lines_per_server(cfg, result)
    assert lines == rows and sum(rows) > 250_000
    assert widths == {1 + row_floats(cfg.table)}  # key + the accessor's floats
    assert result.plan.shard_num == 16 and result.plan.rows >= sum(rows)  # distinct ids per slot bound the rows
    for server, memory in enumerate(result.server_memory):
        planned = planner.serving_buffer_bytes(cfg.table) + rows[server] * result.plan.bytes_per_row
        assert abs(_growth(memory) / planned - 1) < TOLERANCE, (server, memory, rows[server], planned)
        assert abs(memory["serving_rss"] / planner.SERVER_PROCESS_BYTES - 1) < TOLERANCE, (server, memory)


def test_zipf_ids_spread_evenly_over_three_servers(tmp_path):
    """The default synthetic data is Zipf-skewed; the default shard_num gives each server 8 of 24 shards."""
    prepare_synthetic(tmp_path / "data", rows=60_000, test_fraction=0.2, num_shards=1, vocab_size=1 << 20, seed=3)
    cfg, result = _job(tmp_path, tmp_path / "data", servers=3, workers=1, vocab=1 << 20)
    rows = result.checkpoints[-1]["servers"]["rows"]
    assert result.plan.shard_num == 24
    assert _saved_lines_per_server(cfg, result)[0] == rows
    assert planner.max_over_mean(rows) <= 1.1, rows


@pytest.mark.slow
def test_bytes_per_row_is_the_slope_of_server_rss(tmp_path, uniform_data):
    """Between two jobs of equal traffic, a server's RSS grows by the planner's bytes per row (within 25%)."""
    (cfg, small), (_, large) = (_job(tmp_path / size, uniform_data(size), servers=2) for size in UNIFORM_CATEGORIES)
    for server in range(2):
        rows = [job.checkpoints[-1]["servers"]["rows"][server] for job in (small, large)]
        growth = [_growth(job.server_memory[server]) for job in (small, large)]
        assert rows[1] > 5 * rows[0]
        slope = (growth[1] - growth[0]) / (rows[1] - rows[0])
        assert abs(slope / large.plan.bytes_per_row - 1) < TOLERANCE, (server, slope, large.plan.bytes_per_row)
        planned = planner.serving_buffer_bytes(cfg.table) + rows[1] * large.plan.bytes_per_row
        assert abs(growth[1] / planned - 1) < TOLERANCE, (server, growth[1], planned)
