"""A Kubernetes API server on loopback for the launcher's tests, which the real ``kubernetes`` client (and the
kubeflow SDK) talk HTTP to: kmock's ``KubernetesEmulator`` (objects in memory, served with lists, watches, merge
patches and deletes), run in a thread with its own event loop, plus what the launcher and the SDK rely on and
kmock 0.8 lacks:

* ``?watch=True``, the Python client's spelling of a boolean, is a watch (kmock recognises only ``true``);
* label selectors on lists and watches (kmock returns every object of the resource);
* a watch ends after its ``timeoutSeconds`` and when the server closes (kmock keeps it open forever, so the
  server could not close under an open watch);
* what the API server sets on create: the namespace from the URL, ``uid``, ``creationTimestamp``;
* pod logs (``pods/<name>/log``, with ``timestamps`` and ``tailLines``), which kmock answers with the pod itself;
* custom resources validated against their CRD's schema on create (HTTP 422), as the API server does;
* ``resourceVersion`` (raised by every write) and ``generation`` (raised when a replace changes the spec);
* replace (PUT), which kmock does not serve: the object replaced whole, only at the ``resourceVersion`` it holds
  (HTTP 409 otherwise), validated, its status kept as a status subresource keeps it.

Nothing plays a controller here: a test does, over HTTP too, watching the job kind (:meth:`EmulatedCluster.watch`).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import threading
import uuid
from typing import Any, Callable, Optional

import aiohttp.web
import attrs
import jsonschema
import kmock
from kubernetes import client, watch

from components.deploy import inference_service
from components.train.backends import manifests
from components.train.backends.kubernetes.api import KubeApis
from tests.train.backends.kube_controllers import selects

# The resources of a cluster with Trainer, JobSet and paddle-operator installed: (group/version/plural, kind).
RESOURCES = {
    "v1/pods": "Pod", "v1/configmaps": "ConfigMap", "v1/secrets": "Secret",
    "networking.k8s.io/v1/networkpolicies": "NetworkPolicy",
    f"{manifests.TRAINER_API}/trainjobs": "TrainJob", f"{manifests.TRAINER_API}/trainingruntimes": "TrainingRuntime",
    f"{manifests.TRAINER_API}/clustertrainingruntimes": "ClusterTrainingRuntime",
    f"{manifests.JOBSET_API}/jobsets": "JobSet", f"{manifests.PADDLEJOB_API}/paddlejobs": "PaddleJob",
    f"{inference_service.SERVING_API}/{inference_service.PLURAL}": inference_service.KIND,
}
CLUSTER_SCOPED = {"ClusterTrainingRuntime"}
def _labels(obj: Any) -> dict:
    return ((obj or {}).get("metadata") or {}).get("labels") or {}


@attrs.define(kw_only=True)
class _Emulator(kmock.KubernetesEmulator):
    schemas: dict = attrs.field(factory=dict)  # kind -> the openAPIV3Schema its objects must fit
    validators: dict = attrs.field(init=False)  # built once: checking a CRD's schema itself takes seconds
    logs: dict = attrs.field(factory=dict)  # (namespace, pod) -> [(RFC 3339 stamp, line)]
    closing: asyncio.Event = attrs.field(factory=asyncio.Event)
    versions: Any = attrs.field(factory=lambda: itertools.count(1))  # resourceVersions, one per write

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.validators = {kind: jsonschema.validators.validator_for(schema)(schema)
                           for kind, schema in self.schemas.items()}

    async def __call__(self, raw_request):
        if raw_request.query.get("watch", "").lower() == "true":
            raw_request = raw_request.clone(rel_url=raw_request.rel_url.update_query(watch="true"))
        return await super().__call__(raw_request)

    async def _handle(self, request):
        if request.action == kmock.action.CREATE and isinstance(request.data, dict):
            self._admit(request)
        elif request.action == kmock.action.UPDATE and isinstance(request.data, dict):  # a merge patch
            request.data.setdefault("metadata", {})["resourceVersion"] = str(next(self.versions))
        elif request.method == kmock.method.PUT and request.name and isinstance(request.data, dict):
            return await self._replace(request)
        return await super()._handle(request)

    def _validate(self, body: dict) -> None:
        validator = self.validators.get(body.get("kind"))
        error = jsonschema.exceptions.best_match(validator.iter_errors(body)) if validator else None
        if error is not None:
            raise kmock.KubernetesError(status=422, reason="Invalid",
                                        message=f"{body['kind']} is invalid: {error.message}")

    def _admit(self, request) -> None:
        body = request.data
        self._validate(body)
        metadata = body.setdefault("metadata", {})
        if request.namespace:
            metadata["namespace"] = request.namespace
        metadata.setdefault("uid", str(uuid.uuid4()))
        metadata.setdefault("creationTimestamp", dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
        metadata["resourceVersion"], metadata["generation"] = str(next(self.versions)), 1

    async def _replace(self, request):
        body, key = request.data, (request.resource, request.namespace, request.name)
        async with self._lock:
            if key not in self._objects or self._objects[key].deleted:
                raise kmock.KubernetesObjectNotFoundError()
            stored = self._objects[key]
            current = stored.raw
            held, sent = current["metadata"].get("resourceVersion"), body.get("metadata", {}).get("resourceVersion")
            if sent != held:
                raise kmock.KubernetesError(status=409, reason="Conflict", message=(
                    f"Operation cannot be fulfilled on {request.resource.plural} \"{request.name}\": the object has "
                    "been modified; please apply your changes to the latest version and try again"))
            self._validate(body)
            body["metadata"]["resourceVersion"] = str(next(self.versions))
            body["metadata"]["generation"] = (current["metadata"].get("generation", 1)
                                              + (body.get("spec") != current.get("spec")))
            body.pop("status", None)
            if "status" in current:
                body["status"] = current["status"]
            stored.create(body)
            await self._buses[request.resource].put({"type": "MODIFIED", "object": body})
        return aiohttp.web.json_response(body)

    async def _serve_list(self, request):
        listed = await super()._serve_list(request)
        selector = request.params.get("labelSelector")
        return {**listed, "items": [item for item in listed["items"] if selects(selector, _labels(item))]}

    async def _serve_watch(self, request):
        selector = request.params.get("labelSelector")
        timeout = float(request.params.get("timeoutSeconds") or 0) or None
        deadline = asyncio.get_running_loop().time() + timeout if timeout else None
        events = super()._serve_watch(request).__aiter__()
        closing = asyncio.ensure_future(self.closing.wait())
        try:
            while True:
                left = None if deadline is None else max(0.0, deadline - asyncio.get_running_loop().time())
                following = asyncio.ensure_future(events.__anext__())
                await asyncio.wait({following, closing}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
                if not following.done():  # the watch timed out, or the server closes
                    following.cancel()
                    await asyncio.gather(following, return_exceptions=True)
                    return
                try:
                    event = following.result()
                except StopAsyncIteration:
                    return
                if not isinstance(event, dict) or selects(selector, _labels(event.get("object"))):
                    yield event
        finally:
            closing.cancel()
            await events.aclose()

    async def _serve_fetch(self, request):
        if request.subresource != "log":
            return await super()._serve_fetch(request)
        await super()._serve_fetch(request)  # a pod that does not exist has no log (404)
        lines = self.logs.get((request.namespace, request.name), [])
        tail = int(request.params.get("tailLines") or 0)
        stamped = request.params.get("timestamps", "").lower() == "true"
        return "".join(f"{stamp} {line}\n" if stamped else f"{line}\n"
                       for stamp, line in (lines[-tail:] if tail else lines)).encode()


class EmulatedCluster:
    """The emulator served on 127.0.0.1 from a thread of its own while entered; ``schemas``: kind -> CRD schema
    its custom resources are validated against."""

    def __init__(self, schemas: dict[str, dict]):
        self.emulator = _Emulator(schemas=schemas)
        for resource, kind in RESOURCES.items():
            self.emulator.resources[resource] = kmock.ResourceInfo(kind=kind, namespaced=kind not in CLUSTER_SCOPED)
        self.url = ""
        self.watchers: list[Watcher] = []
        self._clock = itertools.count()
        self._ready = threading.Event()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._stop: Optional[asyncio.Event] = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), name="kube-emulator", daemon=True)

    async def _serve(self) -> None:
        async with self.emulator, kmock.Server(self.emulator) as server:
            self.url = str(server.url).rstrip("/")
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            self._ready.set()
            await self._stop.wait()
            self.emulator.closing.set()  # ends the open watches: the server closes only once they are done

    def __enter__(self) -> "EmulatedCluster":
        self._thread.start()
        assert self._ready.wait(30), "the emulator did not start"
        return self

    def __exit__(self, *exc_info) -> None:
        for watcher in self.watchers:
            watcher.stop()
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        for watcher in self.watchers:
            watcher.thread.join(10)
        errors = [w.error for w in self.watchers if w.error]
        if errors and not exc_info[1]:
            raise errors[0]

    def configuration(self) -> client.Configuration:
        return client.Configuration(host=self.url)

    def apis(self) -> KubeApis:
        return KubeApis.of(self.configuration())

    def objects(self, resource: str) -> list[dict]:
        """The objects of ``resource`` (``group/version/plural``) that exist now."""
        return [obj.raw for (res, _, _), obj in list(self.emulator.objects.items())
                if res == kmock.resource(resource) and not obj.deleted]

    def requests(self, method: str, resource: str) -> list:
        """The requests of ``method`` on ``resource`` the emulator was sent, oldest first."""
        return [r for r in list(self.emulator) if r.method.value == method and r.resource == kmock.resource(resource)]

    def write_log(self, namespace: str, pod: str, *lines: str) -> None:
        """Append ``lines`` to a pod's log, stamped as the kubelet stamps them (increasing, RFC 3339)."""
        start = dt.datetime(2026, 11, 29, 16, 45, tzinfo=dt.timezone.utc)
        log = self.emulator.logs.setdefault((namespace, pod), [])
        for line in lines:
            log.append(((start + dt.timedelta(milliseconds=50 * next(self._clock))).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                        line))

    def watch(self, resource: str, namespace: str, on_event: Callable[[str, dict], None]) -> None:
        """``on_event(type, object)`` for each event of a watch on ``resource`` (``group/version/plural``), from
        now until the cluster closes."""
        watcher = Watcher(self, resource, namespace, on_event)
        self.watchers.append(watcher)
        watcher.thread.start()


class Watcher:
    """Watches one resource through the real client, in a thread, handing each event to ``on_event`` (the watch
    begins with an ADDED event per object that exists, so none created before it connects is missed); what
    ``on_event`` raises fails the test when the cluster closes."""

    def __init__(self, cluster: EmulatedCluster, resource: str, namespace: str,
                 on_event: Callable[[str, dict], None]):
        self.group, self.version, self.plural = resource.split("/")
        self.namespace, self.on_event = namespace, on_event
        self.custom = client.CustomObjectsApi(client.ApiClient(cluster.configuration()))
        self.watching = watch.Watch()
        self.stopping = False
        self.error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._run, name=f"watch-{self.plural}", daemon=True)

    def stop(self) -> None:
        """Stop once the server ends the watch (it does when it closes)."""
        self.stopping = True
        self.watching.stop()

    def _run(self) -> None:
        try:
            for event in self.watching.stream(self.custom.list_namespaced_custom_object, self.group, self.version,
                                              self.namespace, self.plural):
                self.on_event(event["type"], event["object"])
        except Exception as err:
            if not self.stopping:  # else the connection closed with the server
                self.error = err
