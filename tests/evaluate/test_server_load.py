"""The run report's per-server load against a brute-force count of the prepared shards' text."""

import json
import math

import pytest

from components.config import from_dict
from components.data_prep.prepare import prepare_synthetic
from components.data_prep.synthetic import SyntheticSpec
from components.evaluate.server_load import load_facts, row_transfer_bytes, server_load, train_ids


def _brute_force(data_dir, batch, shard_num, servers):
    """Per server: the distinct ids, and per batch of ``batch`` lines of each shard its distinct ids, summed."""
    stats = json.loads((data_dir / "stats.json").read_text())
    dense_dim = stats["schema"]["dense_dim"]
    local = math.ceil(shard_num / servers)
    touched, transfers = [set() for _ in range(servers)], [0] * servers
    for path in stats["shards"]["train"]:
        lines = (data_dir / path).read_text().splitlines()
        for start in range(0, len(lines), batch):
            in_batch = set()
            for line in lines[start:start + batch]:
                tokens = line.split()[2 + 1 + dense_dim:]  # "1 <click>", "<dense_dim> <values>", then the slots
                while tokens:
                    count = int(tokens[0])
                    in_batch.update(int(t) for t in tokens[1:1 + count])
                    tokens = tokens[1 + count:]
            for key in in_batch:
                server = (key % shard_num) // local
                transfers[server] += 1
                touched[server].add(key)
    return [len(ids) for ids in touched], transfers


@pytest.mark.parametrize("zipf", [1.05, 1.4])
def test_load_per_server_equals_a_brute_force_count_on_skewed_ids(tmp_path, zipf):
    spec = SyntheticSpec(cardinalities=(50_000, 3_000, 200, 7) * 2, zipf_exponent=zipf)
    prepare_synthetic(tmp_path, rows=3_000, test_fraction=0.1, num_shards=2, vocab_size=1 << 20, seed=1, spec=spec)
    cfg = from_dict({"ps": {"servers": 3, "batch_size": 64}, "run_dir": str(tmp_path)})
    shards, counted, total = train_ids(tmp_path)
    assert counted == total == 2_700
    load = server_load(cfg, shards, shard_num=7)  # 3 shards on servers 0 and 1, 1 on server 2
    rows, transfers = _brute_force(tmp_path, 64, 7, 3)
    assert load["rows"] == rows and load["row_transfers"] == transfers
    assert load["bytes"] == [n * row_transfer_bytes(cfg.table.embedding_dim) for n in transfers]


def test_the_report_lines_name_each_server_and_the_busiest_over_the_mean(tmp_path):
    prepare_synthetic(tmp_path, rows=2_000, test_fraction=0.1, num_shards=2, vocab_size=1 << 20, seed=1)
    cfg = from_dict({"ps": {"servers": 2, "batch_size": 64}, "run_dir": str(tmp_path)})
    facts = load_facts(cfg, tmp_path, shard_num=16)
    assert list(facts) == ["server 0 load", "server 1 load", "load, busiest server / mean"]
    assert "rows touched" in facts["server 0 load"] and "(every train row, batches of 64" in \
        facts["load, busiest server / mean"]
