"""The online server: raw instances in, calibrated click probabilities out, on the protocols KServe speaks
(FastAPI on uvicorn).

* KServe v1: ``POST /v1/models/<name>:predict`` with ``{"instances": [...]}`` -> ``{"predictions": [p, ...],
  "model_version": "<version>"}``. An instance is one raw record as training read it, without label and weight:
  a list of the raw fields in column order, or an object keyed by column name (``Transform.rows_of_instances``).
* The Open Inference Protocol (v2): ``POST /v2/models/<name>/infer`` with one input tensor per column (``name`` the
  column, ``shape`` ``[n]`` or ``[n, 1]``, ``datatype`` BYTES, INT64, INT32, FP32 or FP64, ``data`` flat; a null
  element or a column left out is a missing value, as ``""`` is), or else a single BYTES input named
  ``instances`` whose elements are instances as JSON text (either form above); the output is the FP32 tensor
  ``probability`` ``[n]``. ``GET /v2``, ``/v2/health/live``, ``/v2/health/ready``, ``/v2/models/<name>`` (its
  ``versions`` name the export version served) and ``/v2/models/<name>/ready``.
* ``GET /metrics``: Prometheus counters of requests, errors, instances and embedding rows looked up, a latency
  histogram and the version served.

A bad request gets HTTP 400 (413 for a body over ``max_batch`` instances' worth of bytes) and ``{"error": one
line}`` naming the instance and the field; an error of the server's is a 500 with one line, its traceback logged.
Every response to a prediction carries the header ``model-version``. Predictions run in a thread pool, off the
event loop; each request reads the served model once (:class:`~components.export.follow.ModelFollower` swaps it)
and finishes on it.
"""

from __future__ import annotations

import json
import logging
import signal
import time
from typing import Any, Callable, Optional

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.concurrency import run_in_threadpool

from components.export.follow import LoadOptions, ModelFollower, followed_store
from components.export.manifest import ServingModelError

from components.data_prep.transform import InstanceError

log = logging.getLogger(__name__)

PACKAGE = "paddle-ps-pipelines"  # the server's name in the v2 server metadata
OUTPUT = "probability"  # the v2 output tensor
INSTANCES_INPUT = "instances"  # the v2 input holding JSON instances
BYTES_PER_INSTANCE = 16 * 1024  # the body limit per instance of --max-batch: a Criteo instance is ~0.5 KiB
# v2 datatypes an input column may have -> what a JSON element of it must be
DATATYPES = {"BYTES": (str,), "INT64": (int,), "INT32": (int,), "FP32": (int, float), "FP64": (int, float)}


class RequestError(ValueError):
    """A request the server refuses, with its HTTP status and a one-line reason."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


class Metrics:
    """The server's Prometheus metrics, in a registry of their own."""

    def __init__(self):
        self.registry = CollectorRegistry()
        self.requests = Counter("ctr_serving_requests", "Prediction requests, by protocol", ["protocol"],
                                registry=self.registry)
        self.errors = Counter("ctr_serving_request_errors", "Prediction requests answered with an error, by "
                              "protocol and HTTP status", ["protocol", "status"], registry=self.registry)
        self.latency = Histogram("ctr_serving_request_seconds", "Prediction request latency, body read to response",
                                 ["protocol"], registry=self.registry,
                                 buckets=(.0005, .001, .002, .005, .01, .02, .05, .1, .2, .5, 1, 2, 5, 10))
        self.instances = Counter("ctr_serving_instances", "Instances scored", registry=self.registry)
        self.rows = Counter("ctr_serving_rows_looked_up", "Embedding rows looked up in the shards (each id once "
                            "per batch)", registry=self.registry)
        self.version = Gauge("ctr_serving_model_version", "The export version served", registry=self.registry)

    def prepare(self, model) -> None:
        """Hook ``model`` up before it serves."""
        if hasattr(model, "on_lookup"):
            model.on_lookup = self.rows.inc
        self.version.set(model.version or 0)

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(PACKAGE)
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


def columns_of(model) -> list[str]:
    """The instance columns of ``model``'s transform (none for a model exported without one)."""
    return list(model.transform.columns) if model.transform is not None else []


def create_app(current: Callable[[], Any], name: str = "ctr", max_batch: int = 1024,
               metrics: Optional[Metrics] = None):
    """The FastAPI app serving ``current()`` (the model to score a request with, read once per request) as
    ``name``."""
    if max_batch < 1:
        raise ValueError(f"--max-batch must be >= 1, got {max_batch}")
    metrics = metrics or Metrics()
    metrics.prepare(current())
    body_limit = max_batch * BYTES_PER_INSTANCE
    app = FastAPI(title="CTR model server", docs_url=None, redoc_url=None, openapi_url=None)

    async def answer(request: Request, protocol: str, model_name: str,
                     handle: Callable[[Any, Any], dict]) -> Response:
        """Read the body, run ``handle(model, payload)`` in the thread pool, turn refusals into one line."""
        started = time.perf_counter()
        metrics.requests.labels(protocol).inc()
        model = current()
        try:
            if model_name != name:
                raise RequestError(not_served(model_name), 404)
            body = await read_body(request, body_limit, max_batch)
            result = await run_in_threadpool(lambda: handle(model, parse_json(body)))
            return JSONResponse(result, headers={"model-version": str(model.version)})
        except RequestError as err:
            return error_response(protocol, err.status, str(err))
        except Exception as err:
            if isinstance(err, ServingModelError):
                log.error("%s request: %s", protocol, err)
            else:
                log.exception("%s request failed", protocol)
            return error_response(protocol, 500, f"internal error ({type(err).__name__}); the server logged it")
        finally:
            metrics.latency.labels(protocol).observe(time.perf_counter() - started)

    def not_served(model_name: str) -> str:
        return f"model {model_name!r} is not served here: this server serves {name!r}"

    def error_response(protocol: str, status: int, message: str) -> Response:
        metrics.errors.labels(protocol, str(status)).inc()
        return JSONResponse({"error": " ".join(message.split("\n"))}, status_code=status)

    def scored(model, instances: list) -> np.ndarray:
        try:
            probabilities = np.asarray(model.predict_instances(instances), np.float32)
        except InstanceError as err:
            raise RequestError(str(err)) from None
        metrics.instances.inc(len(instances))
        return probabilities

    def v1(model, payload) -> dict:
        instances = v1_instances(payload, max_batch)
        return {"predictions": scored(model, instances).tolist(), "model_version": str(model.version)}

    def v2(model, payload) -> dict:
        instances = v2_instances(payload, columns_of(model), max_batch)
        out = {"model_name": name, "model_version": str(model.version),
               "outputs": [{"name": OUTPUT, "datatype": "FP32", "shape": [len(instances)],
                            "data": scored(model, instances).tolist()}]}
        if isinstance(payload.get("id"), str):
            out["id"] = payload["id"]
        return out

    @app.post("/v1/models/{model_name}:predict")
    async def v1_predict(model_name: str, request: Request) -> Response:
        return await answer(request, "v1", model_name, v1)

    @app.post("/v2/models/{model_name}/infer")
    async def v2_infer(model_name: str, request: Request) -> Response:
        return await answer(request, "v2", model_name, v2)

    @app.get("/v2")
    async def v2_server() -> dict:
        return {"name": PACKAGE, "version": package_version(), "extensions": []}

    @app.get("/v2/health/live")
    async def live() -> dict:
        return {"live": True}

    @app.get("/v2/health/ready")
    async def ready() -> dict:
        return {"ready": True}  # the model is loaded before the server listens

    @app.get("/v2/models/{model_name}/ready")
    async def model_ready(model_name: str) -> Response:
        if model_name != name:
            return JSONResponse({"error": not_served(model_name)}, status_code=404)
        return JSONResponse({"name": name, "ready": True})

    @app.get("/v2/models/{model_name}")
    async def metadata(model_name: str) -> Response:
        if model_name != name:
            return JSONResponse({"error": not_served(model_name)}, status_code=404)
        model = current()
        return JSONResponse({
            "name": name, "versions": [str(model.version)], "platform": "paddle",
            "model_name": model.meta.get("model_name"),
            "inputs": [{"name": column, "datatype": "BYTES", "shape": [-1]} for column in columns_of(model)],
            "outputs": [{"name": OUTPUT, "datatype": "FP32", "shape": [-1]}],
        }, headers={"model-version": str(model.version)})

    @app.get("/metrics")
    async def prometheus() -> Response:
        body, content_type = metrics.exposition()
        return Response(body, media_type=content_type)

    return app


async def read_body(request, limit: int, max_batch: int) -> bytes:
    """The request body, refused (413) as soon as it is over ``limit`` bytes."""
    too_big = RequestError(f"the request body is over {limit} bytes ({BYTES_PER_INSTANCE} per instance of "
                           f"--max-batch {max_batch}): send fewer instances per request", 413)
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_big
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_big
        chunks.append(chunk)
    return b"".join(chunks)


def parse_json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError as err:  # UnicodeDecodeError too
        raise RequestError(f"the request body is not JSON: {err}") from None


def checked_batch(n: int, max_batch: int) -> None:
    if n > max_batch:
        raise RequestError(f"a batch of {n} instances is over --max-batch {max_batch}: split it")


def v1_instances(payload: Any, max_batch: int) -> list:
    """The instances of a v1 request ``{"instances": [...]}``."""
    if not isinstance(payload, dict) or "instances" not in payload:
        raise RequestError('a v1 request is a JSON object {"instances": [...]}')
    extra = sorted(set(payload) - {"instances"})
    if extra:
        raise RequestError(f'unknown key(s) {extra} in the request: a v1 request is {{"instances": [...]}}')
    instances = payload["instances"]
    if not isinstance(instances, list):
        raise RequestError(f'"instances" must be a list, got {type(instances).__name__}')
    checked_batch(len(instances), max_batch)
    for index, instance in enumerate(instances):
        if not isinstance(instance, (list, dict)):
            raise RequestError(f"instance {index}: expected a list of fields or an object keyed by column, got "
                               f"{type(instance).__name__}")
    return instances


def v2_instances(payload: Any, columns: list[str], max_batch: int) -> list:
    """The instances of a v2 inference request: objects keyed by column, a column left out missing in each."""
    if not isinstance(payload, dict) or not isinstance(payload.get("inputs"), list) or not payload["inputs"]:
        raise RequestError('a v2 request is a JSON object {"inputs": [{"name", "shape", "datatype", "data"}, ...]}')
    for output in payload.get("outputs") or []:
        if not isinstance(output, dict) or output.get("name") != OUTPUT:
            raise RequestError(f"output {output.get('name') if isinstance(output, dict) else output!r} does not "
                               f"exist: the model outputs {OUTPUT!r}")
    inputs = payload["inputs"]
    if len(inputs) == 1 and isinstance(inputs[0], dict) and inputs[0].get("name") == INSTANCES_INPUT:
        return json_instances(inputs[0], max_batch)
    values: dict[str, list] = {}
    for position, tensor in enumerate(inputs):
        column, data = v2_column(tensor, position, columns, max_batch)
        if column in values:
            raise RequestError(f"input {column} is given twice")
        if values and len(data) != len(next(iter(values.values()))):
            first = next(iter(values))
            raise RequestError(f"input {column} holds {len(data)} values, input {first} "
                               f"{len(values[first])}: every input holds one value per instance")
        values[column] = data
    n = len(next(iter(values.values())))
    return [{column: data[i] for column, data in values.items()} for i in range(n)]


def v2_column(tensor: Any, position: int, columns: list[str], max_batch: int) -> tuple[str, list]:
    """``(column, values)`` of one v2 input tensor, each value of its datatype or None (missing)."""
    if not isinstance(tensor, dict) or not all(key in tensor for key in ("name", "shape", "datatype", "data")):
        raise RequestError(f"input {position}: a v2 input is an object with name, shape, datatype and data")
    column, shape, datatype, data = tensor["name"], tensor["shape"], tensor["datatype"], tensor["data"]
    if column not in columns:
        raise RequestError(f"input {column!r} is not a column of the model (columns: {', '.join(columns)}; or "
                           f"one BYTES input {INSTANCES_INPUT!r} of JSON instances)")
    if datatype not in DATATYPES:
        raise RequestError(f"input {column}: datatype {datatype!r}, expected one of {', '.join(DATATYPES)}")
    if (not isinstance(shape, list) or not 1 <= len(shape) <= 2 or not all(type(d) is int for d in shape)
            or len(shape) == 2 and shape[1] != 1):
        raise RequestError(f"input {column}: shape {shape!r}, expected [n] or [n, 1] (one value per instance)")
    checked_batch(shape[0], max_batch)
    if isinstance(data, list) and len(shape) == 2 and all(isinstance(v, list) and len(v) == 1 for v in data):
        data = [v[0] for v in data]  # [n, 1] sent nested, row-major
    if not isinstance(data, list) or len(data) != shape[0]:
        count = len(data) if isinstance(data, list) else type(data).__name__
        raise RequestError(f"input {column}: shape {shape} but data holds {count} values")
    kinds = DATATYPES[datatype]
    for index, value in enumerate(data):
        if value is not None and (isinstance(value, bool) or not isinstance(value, kinds)):
            raise RequestError(f"instance {index}, field {column}: {datatype} input holds "
                               f"{type(value).__name__} {json.dumps(value)[:40]}")
    return column, data


def json_instances(tensor: dict, max_batch: int) -> list:
    """The instances of the v2 input ``instances``: BYTES, each element one instance as JSON text."""
    data = tensor.get("data")
    if tensor.get("datatype") != "BYTES" or not isinstance(data, list):
        raise RequestError(f"input {INSTANCES_INPUT}: expected BYTES data, one JSON instance per element")
    checked_batch(len(data), max_batch)
    instances = []
    for index, text in enumerate(data):
        try:
            instance = json.loads(text) if isinstance(text, str) else None
        except ValueError as err:
            raise RequestError(f"instance {index}: not JSON ({err})") from None
        if not isinstance(instance, (list, dict)):
            raise RequestError(f"instance {index}: expected a JSON list of fields or an object keyed by column")
        instances.append(instance)
    return instances


def serve(model_uri: str, options: LoadOptions, host: str = "127.0.0.1", port: int = 8080, name: str = "ctr",
          poll_seconds: float = 10.0, max_batch: int = 1024) -> None:
    """Load the model at ``model_uri``, follow its export store (every ``poll_seconds``; 0: never) and serve it
    until SIGINT or SIGTERM (uvicorn's graceful shutdown: requests in flight are answered)."""
    import uvicorn

    model = options.load(model_uri)
    store = followed_store(model_uri, model) if poll_seconds > 0 else None
    metrics = Metrics()
    follower = ModelFollower(model, store, options, poll_seconds, metrics.prepare) if store else None
    app = create_app((lambda: follower.model) if follower else (lambda: model), name, max_batch, metrics)
    log.info("serving version %s of %s as %r on http://%s:%d%s", model.version, model_uri, name, host, port,
             f", following {follower.store.display_uri} every {poll_seconds:g}s" if follower else "")
    if follower:
        follower.start()
    # uvicorn shuts down gracefully on SIGTERM or SIGINT, then raises the signal again for the handler it found,
    # which by default would kill the process (status -15) after a clean shutdown: ours lets it end with 0.
    for stop_signal in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop_signal, lambda *_: None)
    try:
        uvicorn.run(app, host=host, port=port, log_level="info", access_log=False)
    finally:
        if follower:
            follower.stop()
