"""The network plan against the bytes real local PS jobs put on their servers' connections (bench/wire.py)."""

import json
import socket
import subprocess

import pytest

from bench.wire import WireBytes, local_job_ports
from components.config import from_dict
from components.data_prep.prepare import prepare_synthetic
from components.train.network_plan import plan_network
from components.train.process_plan import data_shape
from components.train.step import launch_ps_job

TOLERANCE = 0.25


def test_wire_bytes_counts_what_a_connection_carried_each_way():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client, listener.accept()[0] as server:
            with WireBytes(lambda: {port: 0}, period_s=0.05) as wire:
                client.sendall(b"x" * 300_000)
                got = 0
                while got < 300_000:
                    got += len(server.recv(1 << 16))
                server.sendall(b"y" * 70_000)
                got = 0
                while got < 70_000:
                    got += len(client.recv(1 << 16))
                [counted] = wire.per_server()
    assert (counted.received, counted.sent) == (300_000, 70_000)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("wire")
    stats = prepare_synthetic(root, rows=40_000, test_fraction=0.1, num_shards=2, vocab_size=1 << 20, seed=3)
    return root, stats


def _measured_job(tmp_path, data_dir, **ps):
    cfg = from_dict({"ps": {"servers": 2, "workers": 2, "epochs": 1, **ps},
                     "checkpoint": {"uri": str(tmp_path / "ckpt")}, "run_dir": str(tmp_path)})
    logs = tmp_path / "logs"
    with WireBytes(lambda: local_job_ports(str(logs))) as wire:
        result = launch_ps_job(cfg, data_dir, logs, echo=lambda line: None)
    assert "components.ps.role" not in subprocess.run(["pgrep", "-af", str(tmp_path)], capture_output=True,
                                                      text=True).stdout
    return cfg, result.epochs[-1]["examples"], wire.per_server()


def test_network_plan_is_within_a_quarter_of_a_jobs_measured_bytes(tmp_path, data):
    data_dir, stats = data
    cfg, examples, servers = _measured_job(tmp_path, data_dir)
    plan = plan_network(cfg, data_shape(cfg, stats), json.loads((data_dir / "stats.json").read_text()))
    for index, server in enumerate(servers):
        # the job's own reads and writes of its PS port: pushes and pull requests in, pull answers out
        assert server.received / examples == pytest.approx(plan.to_servers / 2, rel=TOLERANCE), index
        assert server.sent / examples == pytest.approx(plan.to_workers / 2, rel=TOLERANCE), index


@pytest.mark.slow
def test_compressed_pushes_carry_fewer_bytes_to_the_servers(tmp_path, data):
    """ps.compress reaches the workers' PS clients: gzip shrinks what they send (their pushes); the servers'
    answers (pulls) stay as they were."""
    data_dir, _ = data
    _, examples, plain = _measured_job(tmp_path / "none", data_dir)
    _, _, gzipped = _measured_job(tmp_path / "gzip", data_dir, compress="gzip")
    received = sum(s.received for s in gzipped) / sum(s.received for s in plain)
    sent = sum(s.sent for s in gzipped) / sum(s.sent for s in plain)
    assert received < 0.85 and sent == pytest.approx(1.0, rel=0.1), (received, sent)
