"""The deploy step against an HTTP Kubernetes API on loopback (:mod:`tests.train.backends.kube_emulator`), through
the real ``kubernetes`` client: the InferenceService created (validated against KServe's CRD when ../shared is
there) or replaced at the resourceVersion it was read at, a write that lost a race read again, and the wait for a
Ready status of the spec just written. Each test plays KServe's controller over HTTP: it watches the kind and
writes the status."""

import threading

import pytest

pytest.importorskip("kmock", reason="kmock (the HTTP Kubernetes API emulator, test extra) is not installed")

from components.config_rules import validate  # noqa: E402
from components.deploy.inference_service import KIND, PLURAL, SERVING_API, inference_service  # noqa: E402
from components.deploy.step import DeployError, deploy  # noqa: E402
from tests.conftest import PROD  # noqa: E402
from tests.train.backends.crds import SERVING_CRD_FILES, crd_schemas  # noqa: E402
from tests.train.backends.kube_emulator import EmulatedCluster  # noqa: E402

NAMESPACE = "team-a"
RESOURCE = f"{SERVING_API}/{PLURAL}"
GROUP, VERSION = SERVING_API.split("/")
POLL_S = 0.02


@pytest.fixture
def cluster(monkeypatch):
    monkeypatch.setenv("POD_NAMESPACE", NAMESPACE)  # the step's pod, as the downward API names its namespace
    with EmulatedCluster(crd_schemas(tuple(SERVING_CRD_FILES))) as emulated:
        yield emulated


@pytest.fixture
def prod(config):
    def composed(*overrides):
        cfg = config(*PROD, "cluster.serving.deploy=true", "cluster.serving.ready_timeout_s=20", *overrides)
        validate(cfg)
        return cfg
    return composed


def url_of(generation: int) -> str:
    return f"http://ctr-g{generation}.{NAMESPACE}.example.com"


def ready_status(generation: int) -> dict:
    return {"observedGeneration": generation, "url": url_of(generation),
            "conditions": [{"type": "PredictorReady", "status": "True"}, {"type": "Ready", "status": "True"}]}


def play_kserve(cluster: EmulatedCluster, status=ready_status) -> None:
    """KServe's controller, over HTTP: each spec it has not reconciled yet gets ``status(generation)``."""
    apis = cluster.apis()

    def reconcile(kind: str, body: dict) -> None:
        generation = body["metadata"]["generation"]
        if kind != "DELETED" and (body.get("status") or {}).get("observedGeneration") != generation:
            apis.custom.patch_namespaced_custom_object_status(GROUP, VERSION, NAMESPACE, PLURAL,
                                                              body["metadata"]["name"], {"status": status(generation)})

    cluster.watch(RESOURCE, NAMESPACE, reconcile)


def test_an_absent_inference_service_is_created_and_its_url_returned_once_ready(prod, cluster):
    play_kserve(cluster)
    cfg = prod()
    assert deploy(cfg, cluster.apis(), poll_s=POLL_S) == url_of(1)
    (created,) = cluster.requests("POST", RESOURCE)  # it fit the CRD's schema, or the emulator would have said 422
    assert created.data["spec"] == inference_service(cfg, NAMESPACE)["spec"]
    assert cluster.requests("PUT", RESOURCE) == []
    (stored,) = cluster.objects(RESOURCE)
    assert stored["metadata"]["namespace"] == NAMESPACE and stored["metadata"]["name"] == "ctr"


def test_an_existing_one_is_replaced_at_its_resource_version_keeping_what_others_set(prod, cluster):
    apis = cluster.apis()
    first = inference_service(prod(), NAMESPACE)
    first["metadata"]["annotations"] = {"serving.kserve.io/deploymentMode": "RawDeployment"}
    first["metadata"]["finalizers"] = ["inferenceservice.finalizers"]
    apis.custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, first)
    apis.custom.patch_namespaced_custom_object_status(GROUP, VERSION, NAMESPACE, PLURAL, "ctr",
                                                      {"status": ready_status(1)})
    play_kserve(cluster)

    # A new spec: the Ready status of generation 1 must not end the wait; generation 2's does.
    assert deploy(prod("cluster.serving.max_replicas=3"), apis, poll_s=POLL_S) == url_of(2)
    (replaced,) = cluster.requests("PUT", RESOURCE)
    (stored,) = cluster.objects(RESOURCE)
    assert stored["spec"]["predictor"]["maxReplicas"] == 3 and stored["metadata"]["generation"] == 2
    assert stored["metadata"]["annotations"] == first["metadata"]["annotations"]
    assert stored["metadata"]["finalizers"] == ["inferenceservice.finalizers"]
    assert int(replaced.data["metadata"]["resourceVersion"]) < int(stored["metadata"]["resourceVersion"])

    # The same spec again: written, the generation unchanged, Ready at once.
    assert deploy(prod("cluster.serving.max_replicas=3"), apis, poll_s=POLL_S) == url_of(2)
    assert len(cluster.requests("PUT", RESOURCE)) == 2
    assert cluster.objects(RESOURCE)[0]["metadata"]["generation"] == 2


def test_a_write_that_lost_a_race_reads_the_object_again(prod, cluster):
    apis = cluster.apis()
    apis.custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, inference_service(prod(), NAMESPACE))
    play_kserve(cluster)
    get, raced = apis.custom.get_namespaced_custom_object, threading.Event()

    def get_then_someone_writes(*args, **kwargs):
        read = get(*args, **kwargs)
        if not raced.is_set():  # someone labels the object between the step's read and its write
            raced.set()
            apis.custom.patch_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, "ctr",
                                                       {"metadata": {"labels": {"team": "ads"}}})
        return read

    apis.custom.get_namespaced_custom_object = get_then_someone_writes
    assert deploy(prod("cluster.serving.max_replicas=2"), apis, poll_s=POLL_S) == url_of(2)
    assert len(cluster.requests("PUT", RESOURCE)) == 2  # the first refused (409), the second at the new version
    (stored,) = cluster.objects(RESOURCE)
    assert stored["metadata"]["labels"]["team"] == "ads" and stored["spec"]["predictor"]["maxReplicas"] == 2


def test_one_that_never_gets_ready_fails_the_step_in_one_line_naming_why(prod, cluster):
    def failing(generation: int) -> dict:
        return {"observedGeneration": generation, "conditions": [
            {"type": "PredictorReady", "status": "False", "reason": "RevisionMissing",
             "message": "Revision \"ctr-predictor-00001\" failed with message: Back-off pulling image"},
            {"type": "Ready", "status": "False", "reason": "RevisionMissing"}]}

    play_kserve(cluster, failing)
    with pytest.raises(DeployError) as raised:
        deploy(prod("cluster.serving.ready_timeout_s=0.3"), cluster.apis(), poll_s=POLL_S)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"{KIND} ctr in {NAMESPACE} was not Ready after 0.3 s")
    assert "PredictorReady: RevisionMissing (Revision \"ctr-predictor-00001\" failed" in message
    assert "kubectl describe inferenceservice ctr -n team-a" in message


def test_without_a_controller_the_timeout_says_kserve_wrote_no_status(prod, cluster):
    with pytest.raises(DeployError, match="no status from KServe yet"):
        deploy(prod("cluster.serving.ready_timeout_s=0.2"), cluster.apis(), poll_s=POLL_S)
