"""brpc's own TLS in real PS roles (components/ps/brpc_tls.cc, preloaded as a compose or Kubernetes role has it):
a local job trains through it, and while it trains its server answers a client with the job's certificate only.
(containers/tls_check.sh does the same on the compose job's network, with packet captures.)"""

from __future__ import annotations

import importlib.util
import shutil
import ssl
import time
from pathlib import Path

import pytest

from components.ps import brpc_tls
from components.ps.tls_certs import issue_job_credentials
from components.train.backends.local import LocalJob
from components.train.job import prepare_job
from tests.conftest import job_processes
from tests.ps.test_lifecycle import Running, _config, _in_pass, _wait_for, datasets  # noqa: F401 - a fixture

pytestmark = pytest.mark.skipif(shutil.which("g++") is None,
                                reason="g++ builds the brpc TLS library (apt-get install g++)")
ROOT = Path(__file__).resolve().parents[2]
PS_STOP_SERVER, UNKNOWN_COMMAND = 12, 999  # PsCmdID values (sendrecv.proto of the wheel)


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> Path:
    return brpc_tls.build(tmp_path_factory.mktemp("brpc-tls") / "libbrpc_tls.so")


def _stranger():
    """containers/ps_stranger.py, the probe tls_check.sh runs on the compose job's network."""
    spec = importlib.util.spec_from_file_location("ps_stranger", ROOT / "containers" / "ps_stranger.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_job_trains_through_brpc_tls_and_its_server_answers_only_the_jobs_certificate(
        tmp_path, datasets, library, monkeypatch):
    issued = issue_job_credentials("job", {"localhost": []})["localhost"]
    (tmp_path / "role.pem").write_bytes(issued.cert + issued.key)
    (tmp_path / "ca.crt").write_bytes(issued.ca)
    for name, value in brpc_tls.preload_env(str(tmp_path / "role.pem"), str(tmp_path / "ca.crt"),
                                            {brpc_tls.LIBRARY_ENV: str(library)}).items():
        monkeypatch.setenv(name, value)  # the roles' env: the local launcher passes its own on
    data_dir, stats = datasets[1]
    cfg = _config(tmp_path, epochs=3)
    job = LocalJob(prepare_job(cfg, None), data_dir, tmp_path / "logs", echo=lambda line: None)
    running = Running(job.run)
    _wait_for(lambda: _in_pass(job, "worker-0", 1) or not running.thread.is_alive(), what="the worker to train")
    assert running.thread.is_alive(), running.error
    stranger, endpoint = _stranger(), job.layout.server_endpoints[0]
    stop = stranger.brpc_request(PS_STOP_SERVER)
    tries = {"plain": stranger.attempt(endpoint, stop, None),
             "tls-none": stranger.attempt(endpoint, stop, ssl._create_unverified_context()),
             "tls-foreign": stranger.attempt(endpoint, stop, stranger.foreign_context(tmp_path))}
    own_context = brpc_tls.client_context({brpc_tls.PEM_ENV: str(tmp_path / "role.pem"),
                                           brpc_tls.CA_ENV: str(tmp_path / "ca.crt")})  # the job's certificate
    own = stranger.attempt(endpoint, stranger.brpc_request(UNKNOWN_COMMAND), own_context)
    assert own["result"] == "answered" and own["brpc"], own  # the port speaks brpc inside the job's TLS
    assert {name: t["result"] for name, t in tries.items()} == dict.fromkeys(tries, "closed"), tries
    # The server's sidecar reports it alive while brpc answers /health: over the same TLS, with the role's files.
    # Three beats later (ps.progress_period_s=1), past what the server said when it started serving:
    time.sleep(3)
    assert running.thread.is_alive(), "the job ended before its server's heartbeats could be read"
    last_beat = job.liveness.reports.get("server-0", (float("-inf"),))[0]
    assert job.liveness.clock() - last_beat < 2.5, job.liveness.reports
    running.join(180)
    assert running.error is None, running.error  # PS_STOP_SERVER in the clear stopped nothing
    assert [e["examples"] for e in running.result.epochs] == [stats["rows"]["train"]] * 3
    assert not job_processes(str(tmp_path))
