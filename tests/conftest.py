"""Shared fixtures: the real config composed through Hydra, ``../shared`` beside the checkout, and a real S3
endpoint on loopback (moto's server), as s3fs's own test suite uses.

Nothing here reaches the internet: the server listens on 127.0.0.1, and the AWS variables (fake credentials,
region, ``AWS_ENDPOINT_URL``) point botocore/s3fs at it for the duration of one test.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import threading
import urllib.request
import uuid
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
# ../shared beside the checkout: the real Criteo samples and the CRDs. CI has it; a clone on its own does not,
# and the tests that read it skip, saying why.
SHARED = ROOT.parent / "shared"
CRITEO = SHARED / "data" / "criteo"
SCHEMAS = SHARED / "schemas"
needs_criteo = pytest.mark.skipif(not CRITEO.is_dir(), reason=f"{CRITEO} (../shared beside the checkout) is absent")
needs_schemas = pytest.mark.skipif(not SCHEMAS.is_dir(), reason=f"{SCHEMAS} (../shared beside the checkout) is absent")
# The overrides of a Kubeflow config that compiles without a cluster.
PROD = ("+cluster=prod", "cluster.submit=false", "checkpoint.uri=s3://b/ckpt")


def compose_config(run_dir, *overrides: str):
    """The real ``conf/`` composed with Hydra ``overrides``, as ``python -m pipelines.ctr`` composes it (a
    DictConfig; :func:`components.config.from_dict` types it)."""
    from hydra import compose, initialize_config_dir

    from components.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=[f"run_dir={run_dir}", *overrides])


def commit_staged_checkpoint(staged: Path, meta: dict) -> Path:
    """``staged`` (a checkpoint's files, e.g. an export written by ``save_export``) committed by a local
    checkpoint store beside it, as a training job commits one; returns the committed checkpoint's directory."""
    from components.checkpoint.store import CheckpointStore, make_id

    store = CheckpointStore(str(staged.parent / f"{staged.name}.store"))
    ckpt_id = make_id(1, 0)
    store.commit(ckpt_id, store.upload_dir(staged, ckpt_id), meta)
    return Path(store.fs_path(ckpt_id))


def committed_checkpoints(tmp_path: Path, count: int) -> list[Path]:
    """``count`` small checkpoints (a state and one table file) committed one after another in one local store,
    oldest first: what a restore picks from, for tests that then damage some of them."""
    staged = tmp_path / "staged"
    (staged / "tables").mkdir(parents=True)
    (staged / "state.json").write_text('{"epoch": 1, "history": []}')
    (staged / "tables" / "part-000").write_bytes(bytes(range(256)) * 16)
    return [commit_staged_checkpoint(staged, {"rows": 0}) for _ in range(count)]


def score_serving_model(serving_dir, data_dir) -> dict:
    """The test split of ``data_dir`` scored by an exported serving model: ``{"labels", "preds", "metrics"}``,
    what a check that the served model is the evaluated one needs."""
    from components.metrics import binary_metrics
    from components.networks.scoring import read_test_split
    from components.export.model import InferenceModel

    model = InferenceModel.load(serving_dir)
    labels, dense, sparse = read_test_split(data_dir, model.schema)
    preds = model.predict(dense, sparse)
    return {"labels": labels, "preds": preds, "metrics": binary_metrics(labels, preds)}


@pytest.fixture(scope="session", autouse=True)
def per_user_config_in_tmp(tmp_path_factory):
    """``$XDG_CONFIG_HOME`` in this session's tmp dir: the per-user export signing key pair
    (:func:`components.export.signing.user_key_dir`) is made there on first use, never in the real home, and
    every test (and the processes it starts) signs and verifies with that one pair. Session-scoped, so it is
    in place before any module-scoped fixture exports."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.getbasetemp() / "xdg-config"))
        patch.delenv("CTR_SERVING_PUBLIC_KEY", raising=False)
        yield


@pytest.fixture
def composed(tmp_path):
    """``composed(*overrides, run_dir=tmp_path)``: :func:`compose_config` of this test."""
    return lambda *overrides, run_dir=tmp_path: compose_config(run_dir, *overrides)


@pytest.fixture
def config(composed):
    """``config(*overrides, run_dir=tmp_path)``: the composed config, typed (a CtrConfig)."""
    from components.config import from_dict

    return lambda *overrides, **kwargs: from_dict(composed(*overrides, **kwargs))

# A recognisable fake secret: tests assert it never shows up in an error message or a log line.
FAKE_SECRET = "fake-secret-Zq8vX2kP9wLm4nR7"
FAKE_KEY_ID = "AKIAFAKEKEYID0000001"


class MotoEndpoint:
    """moto's ``ThreadedMotoServer`` on 127.0.0.1 that can really go away and come back.

    ``stop()`` ends the server loop (werkzeug then closes the listening socket: new connections are refused)
    and cuts the connections it accepted (``ThreadedMotoServer.stop`` alone leaves keep-alive connections
    served by their handler threads, so a client with pooled connections would not notice). ``start()`` again
    listens on the same port; moto keeps its S3 state in process-wide backends, so what was stored before
    the stop is there after the restart, as with a real endpoint that had an outage.
    """

    def __init__(self, port: int = 0):
        self.host, self.port = "127.0.0.1", port
        self._server = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self) -> None:
        from moto.server import ThreadedMotoServer

        server = ThreadedMotoServer(ip_address=self.host, port=self.port, verbose=False)
        server.start()
        self.port = server.get_host_and_port()[1]
        wsgi = server._server  # the werkzeug server: record accepted connections so stop() can cut them
        serve = wsgi.process_request

        def process_request(request, client_address):
            with self._lock:
                self._conns.add(request)
            serve(request, client_address)

        wsgi.process_request = process_request
        self._server = server

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.stop()
        self._server = None
        with self._lock:
            conns, self._conns = self._conns, set()
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def reset(self) -> None:
        """Forget every bucket (moto's state is process-wide)."""
        if self._server is not None:
            urllib.request.urlopen(urllib.request.Request(f"{self.url}/moto-api/reset", method="POST"),
                                   timeout=10).close()


@pytest.fixture
def moto_endpoint(monkeypatch):
    """A running :class:`MotoEndpoint` with the AWS environment pointing at it; stopped and reset afterwards."""
    s3fs = pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    endpoint = MotoEndpoint()
    endpoint.start()
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
                 "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", FAKE_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", FAKE_SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint.url)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
    # botocore's own retries (5 tries, up to seconds of backoff) would slow the outage tests; the store's
    # retries are what the tests look at.
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    monkeypatch.setenv("AWS_RETRY_MODE", "standard")
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        yield endpoint
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
        if not endpoint.running:
            endpoint.start()
        try:
            endpoint.reset()
        finally:
            endpoint.stop()


@pytest.fixture
def s3_endpoint(moto_endpoint):
    """``s3://<bucket>/<prefix>`` on a fresh bucket of the loopback moto endpoint."""
    import boto3

    bucket = f"ckpt-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=moto_endpoint.url).create_bucket(Bucket=bucket)
    yield f"s3://{bucket}/runs/test"


def job_processes(marker: str) -> list[str]:
    """Command lines of the running processes (zombies, which have exited, excluded) that mention ``marker``,
    e.g. a test's tmp_path: every process of a job started there (roles, sidecars, Paddle's children) does."""
    from components.ps.liveness import process_exists

    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in command and process_exists(int(entry.name)):
            found.append(f"{entry.name} {command.strip()}")
    return found


def listening_sockets(marker: str) -> set[tuple[str, int]]:
    """``(address, port)`` of every TCP socket in LISTEN state held by a process of ``marker``
    (:func:`job_processes`), read from /proc/net/tcp and /proc/net/tcp6 (0.0.0.0 / :: = every interface)."""
    inodes = set()
    for line in job_processes(marker):
        fd_dir = Path("/proc") / line.split()[0] / "fd"
        try:
            for fd in fd_dir.iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:  # exited meanwhile
            continue
    found = set()
    for table in ("tcp", "tcp6"):
        for row in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = row.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: TCP_LISTEN
                address, port = fields[1].split(":")
                raw = bytes.fromhex(address)
                # /proc prints each 32-bit word of the address in host (little-endian) order
                words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                found.add((str(ipaddress.ip_address(words)), int(port, 16)))
    return found


def calibrated_reference(preds, calibration: dict) -> np.ndarray:
    """Platt's ``sigmoid(a * logit(p) + b)`` in float64: the reference the programs' float32 calibration is held to."""
    from components.metrics import LOGLOSS_EPS

    clipped = np.clip(np.asarray(preds, dtype=np.float64), LOGLOSS_EPS, 1.0 - LOGLOSS_EPS)
    return 1.0 / (1.0 + np.exp(-(calibration["a"] * (np.log(clipped) - np.log1p(-clipped)) + calibration["b"])))
