"""Worker 0's progress reaches a stand-in of the Kubeflow Trainer status endpoint, throttled, and a failing endpoint
never fails the caller."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from components.ps import trainer_status as ts


class _Endpoint:
    """An HTTP server on loopback that records each POST (path, headers, JSON body) and answers ``status``."""

    def __init__(self, status: int = 200):
        self.posts: list[dict] = []
        self.status = status
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                endpoint.posts.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
                self.send_response(endpoint.status)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/apis/trainer/v1alpha1/status"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def endpoint():
    served = _Endpoint()
    yield served
    served.close()


class _Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_progress_arrives_with_the_token_and_is_throttled(endpoint, tmp_path):
    token = tmp_path / "token"
    token.write_text("secret-token\n")
    clock = _Clock()
    reporter = ts.TrainerStatusReporter.from_env({ts.SERVER_URL_ENV: endpoint.url, ts.TOKEN_ENV: str(token)})
    reporter.clock = clock
    publish = ts.progress_publisher(reporter, epochs=2)

    publish(dict(epoch=1, examples=500, pass_examples=1000, pass_seconds=10.0, loss=0.45, auc=0.71,
                 validation_auc=None, examples_per_s=50.0))
    clock.now += 1.0  # inside the throttle: not posted
    publish(dict(epoch=1, examples=600, pass_examples=1000, pass_seconds=12.0, loss=0.44, auc=0.72))
    clock.now += ts.MIN_INTERVAL_S
    publish(dict(epoch=2, examples=250, pass_examples=1000, pass_seconds=5.0, loss=0.40, auc=0.75,
                 validation_auc=0.74))

    assert len(endpoint.posts) == 2 and reporter.posted == 2
    first, second = (post["body"]["trainerStatus"] for post in endpoint.posts)
    assert endpoint.posts[0]["auth"] == "Bearer secret-token"
    # half of pass 1 of 2: 25 %; the pass takes 20 s, so 10 s of it and one more pass are left
    assert first["progressPercentage"] == 25 and first["estimatedRemainingSeconds"] == 30
    assert {m["name"]: m["value"] for m in first["metrics"]} == {"loss": "0.45", "auc": "0.71",
                                                                "examples_per_s": "50", "epoch": "1"}
    assert second["progressPercentage"] == 62 and second["estimatedRemainingSeconds"] == 15
    assert {m["name"]: m["value"] for m in second["metrics"]}["validation_auc"] == "0.74"
    assert "lastUpdatedTime" in first


def test_a_failing_endpoint_never_raises_and_warns_once(capsys):
    failing = _Endpoint(status=500)
    try:
        clock = _Clock()
        reporter = ts.TrainerStatusReporter(failing.url, None, None, clock=clock)
        for _ in range(3):
            assert reporter.report(10, 100, {"loss": 0.5}) is False
            clock.now += ts.MIN_INTERVAL_S
        assert len(failing.posts) == 3
    finally:
        failing.close()
    unreachable = ts.TrainerStatusReporter("http://127.0.0.1:9/status", None, None, clock=clock)
    assert unreachable.report(10, 100, {}) is False
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2 and "HTTP 500" in warnings[0]


def test_outside_a_trainer_pod_nothing_is_posted():
    assert ts.TrainerStatusReporter.from_env({}) is None
    assert ts.pass_progress(1, 2, 10, None, 1.0) == (None, None)
