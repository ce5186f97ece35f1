"""The kubeflow SDK (``TrainerClient``) and the logs helper against the HTTP Kubernetes API emulator on loopback
(:mod:`tests.train.backends.kube_emulator`): our runtimes listed, a TrainJob run on them and read back, the servers'
logs the SDK does not read, and the README's example, run as README.md has it (the block is read from the file)."""

import re
import textwrap

import pytest
import yaml

pytest.importorskip("kmock", reason="kmock (the HTTP Kubernetes API emulator, test extra) is not installed")

from components.ps.contract import Role  # noqa: E402
from components.train.backends import cluster_runtime, manifests  # noqa: E402
from components.train.backends.kubernetes import logs  # noqa: E402
from components.train.backends.kubernetes.api import KubeObject  # noqa: E402
from tests.conftest import ROOT  # noqa: E402
from tests.train.backends.test_kubernetes_emulated import (EPOCH, JOB_RESOURCE, NAMESPACE, PIPELINE_RUN,  # noqa: E402
                                                           SUCCEEDED, PlayedController, _cfg, _conditions,
                                                           _run_objects, cluster, kubeconfig)

__all__ = ["cluster", "kubeconfig"]  # fixtures of the launcher's emulated tests, used here too
README = ROOT / "docs" / "kubeflow.md"  # the TrainerClient example
SERVER_LINES = {0: ("I1129 server 0: 2 table shards loaded",), 1: ("I1129 server 1: 2 table shards loaded",)}


@pytest.fixture
def trainer(cluster):
    """The kubeflow SDK, against an emulated cluster whose Trainer control plane publishes its version as Trainer
    does."""
    trainer = pytest.importorskip("kubeflow.trainer", reason="the kubeflow SDK (test extra) is not installed")
    cluster.apis().core.create_namespaced_config_map("kubeflow-system", {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kubeflow-trainer-public"},
        "data": {"kubeflow_trainer_version": "v2.4.0"}})
    return trainer


@pytest.fixture
def trainer_client(cluster, trainer):
    """The SDK's TrainerClient, its Kubernetes backend pointed at the emulator."""
    return trainer, trainer.TrainerClient(backend_config=trainer.KubernetesBackendConfig(
        namespace=NAMESPACE, client_configuration=cluster.configuration()))


def _our_runtime(config, cluster, *, framework_label: bool = True) -> dict:
    """This project's TrainingRuntime for a trainjob config, created in the emulator."""
    runtime = _run_objects(_cfg(config, "trainjob"), PIPELINE_RUN)[1]
    if not framework_label:
        del runtime["metadata"]["labels"][manifests.TRAINER_FRAMEWORK_LABEL]
        runtime["metadata"]["name"] += "-unlabelled"
    KubeObject.of(runtime).create(cluster.apis(), runtime)
    return runtime


def test_the_sdk_lists_our_runtime_and_runs_a_trainjob_on_it(config, cluster, trainer_client):
    trainer, sdk = trainer_client
    runtime = _our_runtime(config, cluster)
    _our_runtime(config, cluster, framework_label=False)  # the SDK skips a runtime without the label

    (listed,) = sdk.list_runtimes()
    assert (listed.name, listed.trainer.framework, listed.trainer.num_nodes) == (
        runtime["metadata"]["name"], manifests.TRAINER_FRAMEWORK, 2)

    name = sdk.train(runtime=listed, trainer=trainer.CustomTrainerContainer(
        image="ctr-ps:test", num_nodes=2, env={"PS_EXTRA": "1"}))
    (held,) = cluster.objects(JOB_RESOURCE["trainjob"])  # it fit the TrainJob CRD, or the emulator refused it
    assert held["metadata"]["name"] == name and held["spec"]["runtimeRef"]["name"] == runtime["metadata"]["name"]
    assert held["spec"]["trainer"]["numNodes"] == 2 and held["spec"]["trainer"]["image"] == "ctr-ps:test"

    controller = PlayedController(cluster, "trainjob")
    for index in range(2):
        controller.pod(held, "worker", index, (f"worker {index}", EPOCH))
    controller.end(held, SUCCEEDED["trainjob"])
    job = sdk.wait_for_job_status(name, timeout=30, polling_interval=1)
    assert job.status == "Complete" and sdk.get_job(name).status == "Complete"
    assert sorted(step.name for step in job.steps) == ["node-0", "node-1"]
    assert list(sdk.get_job_logs(name)) == ["worker 0", EPOCH]  # worker 0's log, as the step's own output has it


def test_the_sdk_reads_a_failed_trainjob(config, cluster, trainer_client):
    trainer, sdk = trainer_client
    _our_runtime(config, cluster)
    (runtime,) = sdk.list_runtimes()
    name = sdk.train(runtime=runtime, trainer=trainer.CustomTrainerContainer(image="ctr-ps:test"))
    (held,) = cluster.objects(JOB_RESOURCE["trainjob"])
    PlayedController(cluster, "trainjob").end(held, _conditions("Failed", "JobSetFailed", "reached max restarts"))
    assert sdk.get_job(name).status == "Failed"
    with pytest.raises(RuntimeError, match=f"TrainJob {name} is Failed"):
        sdk.wait_for_job_status(name, timeout=30, polling_interval=1)


def _install_cluster_runtime(cluster) -> dict:
    """k8s/cluster-training-runtime.yaml, applied as a cluster admin would (the emulator checks it against the CRD)."""
    runtime = yaml.safe_load((ROOT / cluster_runtime.CHECKED_IN).read_text())
    cluster.apis().custom.create_cluster_custom_object(manifests.TRAINER_GROUP, "v1alpha1", "clustertrainingruntimes",
                                                       runtime)
    return runtime


def _runs_with_servers(controller: PlayedController, body: dict) -> None:
    """Trainer's part for a TrainJob on our runtime: its workers and servers ran and logged, and it completed."""
    for index in range(2):
        controller.pod(body, "worker", index, (f"worker {index}", EPOCH))
        controller.pod(body, "ps", index, SERVER_LINES[index])
    controller.end(body, SUCCEEDED["trainjob"])


def test_the_servers_logs_of_an_sdk_trainjob_come_from_the_logs_helper(cluster, kubeconfig, trainer_client, capsys):
    trainer, sdk = trainer_client
    _install_cluster_runtime(cluster)
    PlayedController(cluster, "trainjob").control(_runs_with_servers)
    name = sdk.train(runtime=sdk.get_runtime(cluster_runtime.NAME),
                     trainer=trainer.CustomTrainerContainer(image="ctr-ps:test"))
    sdk.wait_for_job_status(name, timeout=30, polling_interval=1)
    assert list(sdk.get_job_logs(name)) == ["worker 0", EPOCH]  # the SDK: worker 0 only

    assert list(logs.role_logs(name)) == [f"[server-{i}] {line}" for i in (0, 1) for line in SERVER_LINES[i]]
    assert list(logs.role_logs(name, Role.WORKER))[:2] == ["[worker-0] worker 0", f"[worker-0] {EPOCH}"]
    assert logs.main([name, "--role", "server", "--namespace", NAMESPACE]) == 0
    assert capsys.readouterr().out.splitlines() == [f"[server-{i}] {line}" for i in (0, 1) for line in SERVER_LINES[i]]
    assert logs.main(["no-such-job"]) == 1
    assert "no started server pod of no-such-job in namespace team-a" in capsys.readouterr().err


def _readme_example() -> str:
    """The TrainerClient example of docs/kubeflow.md, as the file has it."""
    blocks = [textwrap.dedent(code) for code in re.findall(r"^ *```python\n(.*?)^ *```", README.read_text(),
                                                           re.M | re.S)]
    (example,) = [code for code in blocks if "TrainerClient(" in code]
    return example


def test_the_readmes_trainerclient_example_runs_as_written(cluster, kubeconfig, trainer, capsys):
    _install_cluster_runtime(cluster)
    PlayedController(cluster, "trainjob").control(_runs_with_servers)
    exec(compile(_readme_example(), str(README), "exec"), {})  # TrainerClient() finds the cluster in the kubeconfig
    printed = capsys.readouterr().out.splitlines()
    (held,) = cluster.objects(JOB_RESOURCE["trainjob"])
    ref = held["spec"]["runtimeRef"]
    assert (ref["kind"], ref["name"]) == ("ClusterTrainingRuntime", cluster_runtime.NAME)
    assert held["metadata"]["namespace"] == NAMESPACE  # the kubeconfig context's
    assert printed == ["worker 0", EPOCH, *(f"[server-{i}] {line}" for i in (0, 1) for line in SERVER_LINES[i])]
