"""How the online server is started, the same wherever it runs (a local run's summary, the compose file's
``serving`` service, the KServe InferenceService of :mod:`components.deploy`): its command line, port, health path
and the variable naming the export signing key it verifies with. The server itself is
:mod:`components.export.serving` ``serve``; this module imports nothing of it (nor paddle), so that the generators
of those files need neither."""

from __future__ import annotations

import json
import shlex

SERVING_PORT = 8080  # KServe's default predictor port, and the one every caller here uses
READY_PATH = "/v2/health/ready"  # the Open Inference Protocol's readiness endpoint
# A PEM public key file the server verifies the export's signature with (components/export/signing.py).
PUBLIC_KEY_ENV = "CTR_SERVING_PUBLIC_KEY"


def serve_command(model: str, name: str, host: str = "127.0.0.1", port: int = SERVING_PORT) -> list[str]:
    """``python -m components.export.serving serve`` of the export store (or version directory) ``model``,
    serving it as ``name`` on ``host:port``."""
    return ["python", "-m", "components.export.serving", "serve", "--model", model, "--host", host,
            "--port", str(port), "--name", name]


def example_request(name: str, host: str = "127.0.0.1", port: int = SERVING_PORT) -> str:
    """A ``curl`` of one KServe v1 prediction from the server ``name`` at ``host:port``: one instance as an object
    keyed by column name, here with no key, so every field is missing as training reads an empty one (valid for
    every input format)."""
    body = json.dumps({"instances": [{}]})
    return (f"curl -s -H 'Content-Type: application/json' -d {shlex.quote(body)} "
            f"http://{host}:{port}/v1/models/{name}:predict")
