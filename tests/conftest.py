"""Shared fixtures: a real S3 endpoint on loopback (moto's server), as s3fs's own test suite uses.

Nothing here reaches the internet: the server listens on 127.0.0.1, and the AWS variables (fake credentials,
region, ``AWS_ENDPOINT_URL``) point botocore/s3fs at it for the duration of one test.
"""

from __future__ import annotations

import logging
import socket
import threading
import urllib.request
import uuid

import pytest

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
