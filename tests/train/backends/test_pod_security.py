"""Every pod this project generates meets the Pod Security Standards' "restricted" profile and has a read-only root
filesystem (issue 35, part 3): the PS job of each backend as the run directory holds it for review (and as Trainer
builds a TrainJob's JobSet), the launcher's own objects, the checked-in ClusterTrainingRuntime, and the
InferenceService.

The checker is written from the standard (kubernetes.io/docs/concepts/security/pod-security-standards, v1.30):
every "baseline" control and every "restricted" one, evaluated as the admission controller evaluates them (a
container-level field overrides the pod's). A pod template is any object with ``containers``; the KServe predictor
is one too (KServe copies its fields into the pod).
"""

import pytest
import yaml

from components.deploy.inference_service import inference_service
from pipelines.kubeflow import INFERENCE_SERVICE_FILE, PS_JOB_FILE, write_run_files
from tests.conftest import PROD, ROOT
from tests.train.backends.kube_controllers import trainjob_jobset

# Baseline: the capabilities a container may add (restricted: NET_BIND_SERVICE only), the safe sysctls.
RESTRICTED_CAPABILITIES = {"NET_BIND_SERVICE"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes"}
SELINUX_TYPES = {None, "", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
# Restricted: the only volume types allowed.
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}
VOLUME_META = {"name"}


def restricted_violations(pod: dict) -> list[str]:
    """What in the pod spec ``pod`` the restricted profile forbids (empty: it passes), plus a root filesystem that
    is not read-only."""
    found = []
    pod_sc = pod.get("securityContext") or {}
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            found.append(f"{field}: true")
    if (pod_sc.get("windowsOptions") or {}).get("hostProcess"):
        found.append("pod hostProcess")
    for sysctl in pod_sc.get("sysctls") or []:
        if sysctl["name"] not in SAFE_SYSCTLS:
            found.append(f"sysctl {sysctl['name']}")
    for volume in pod.get("volumes") or []:
        kinds = set(volume) - VOLUME_META
        if kinds - RESTRICTED_VOLUMES:
            found.append(f"volume {volume['name']} of type {sorted(kinds - RESTRICTED_VOLUMES)}")
    containers = [*pod.get("initContainers", []), *pod["containers"], *pod.get("ephemeralContainers", [])]
    for c in containers:
        sc, name = c.get("securityContext") or {}, c["name"]
        if sc.get("privileged"):
            found.append(f"{name}: privileged")
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            found.append(f"{name}: hostProcess")
        if any(port.get("hostPort") for port in c.get("ports", [])):
            found.append(f"{name}: hostPort")
        if sc.get("procMount") not in (None, "Default"):
            found.append(f"{name}: procMount {sc['procMount']}")
        selinux = {**(pod_sc.get("seLinuxOptions") or {}), **(sc.get("seLinuxOptions") or {})}
        if selinux.get("type") not in SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
            found.append(f"{name}: seLinuxOptions {selinux}")
        apparmor = (sc.get("appArmorProfile") or pod_sc.get("appArmorProfile") or {}).get("type")
        if apparmor not in (None, "RuntimeDefault", "Localhost"):
            found.append(f"{name}: appArmorProfile {apparmor}")
        if sc.get("allowPrivilegeEscalation") is not False:
            found.append(f"{name}: allowPrivilegeEscalation is not false")
        non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
        if non_root is not True:
            found.append(f"{name}: runAsNonRoot is not true")
        if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
            found.append(f"{name}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"{name}: seccompProfile {seccomp}")
        capabilities = sc.get("capabilities") or {}
        if "ALL" not in capabilities.get("drop", []):
            found.append(f"{name}: capabilities do not drop ALL")
        if set(capabilities.get("add", [])) - RESTRICTED_CAPABILITIES:
            found.append(f"{name}: adds capabilities {capabilities['add']}")
        if sc.get("readOnlyRootFilesystem") is not True:  # not in the profile: this project's rule
            found.append(f"{name}: root filesystem not read-only")
    return found


def pod_specs(obj, where="") -> list[tuple[str, dict]]:
    """``(path, spec)`` of every pod spec (an object with ``containers``) inside ``obj``."""
    if isinstance(obj, dict):
        if isinstance(obj.get("containers"), list):
            return [(where, obj)]
        return [found for key, value in obj.items() for found in pod_specs(value, f"{where}.{key}")]
    if isinstance(obj, list):
        return [found for i, value in enumerate(obj) for found in pod_specs(value, f"{where}[{i}]")]
    return []


def _assert_restricted(documents: list[dict]) -> int:
    checked = 0
    for doc in documents:
        for path, spec in pod_specs(doc):
            assert restricted_violations(spec) == [], f"{doc['kind']} {path}"
            checked += 1
    return checked


@pytest.mark.parametrize("backend", ["jobset", "trainjob", "paddlejob"])
def test_every_generated_pod_is_restricted_and_read_only(tmp_path, config, backend):
    cfg = config(*PROD, f"cluster.backend={backend}", "cluster.mesh_encryption=true")
    write_run_files(cfg, tmp_path)
    objects = list(yaml.safe_load_all((tmp_path / PS_JOB_FILE).read_text()))
    if backend == "trainjob":  # the pods Trainer makes: the runtime's, given the TrainJob's env and resources
        objects.append(trainjob_jobset(*objects[-2:]))
    objects.append(yaml.safe_load((tmp_path / INFERENCE_SERVICE_FILE).read_text()))
    # The PS job's two roles (and Trainer's JobSet of them), the online server.
    assert _assert_restricted(objects) == {"trainjob": 5}.get(backend, 3)


def test_the_checked_in_cluster_training_runtime_is_restricted_and_read_only():
    runtime = yaml.safe_load((ROOT / "k8s" / "cluster-training-runtime.yaml").read_text())
    assert _assert_restricted([runtime]) == 2


def test_the_checker_finds_what_the_profile_forbids(config):
    """The checker itself: each forbidden setting, put into a generated pod, is found."""
    isvc = inference_service(config(*PROD), "team-a")
    (_, pod), = pod_specs(isvc)
    assert restricted_violations(pod) == []
    container = pod["containers"][0]
    cases = {
        "hostNetwork: true": lambda: pod.update(hostNetwork=True),
        "volume host of type ['hostPath']": lambda: pod["volumes"].append({"name": "host", "hostPath": {"path": "/"}}),
        "kserve-container: privileged": lambda: container["securityContext"].update(privileged=True),
        "kserve-container: allowPrivilegeEscalation is not false": lambda: container["securityContext"].pop(
            "allowPrivilegeEscalation"),
        "kserve-container: runAsNonRoot is not true": lambda: container["securityContext"].pop("runAsNonRoot"),
        "kserve-container: runAsUser 0": lambda: container["securityContext"].update(runAsUser=0),
        "kserve-container: seccompProfile Unconfined": lambda: container["securityContext"].update(
            seccompProfile={"type": "Unconfined"}),
        "kserve-container: capabilities do not drop ALL": lambda: container["securityContext"].update(
            capabilities={"drop": ["NET_RAW"]}),
        "kserve-container: adds capabilities ['SYS_ADMIN']": lambda: container["securityContext"].update(
            capabilities={"drop": ["ALL"], "add": ["SYS_ADMIN"]}),
        "kserve-container: hostPort": lambda: container["ports"][0].update(hostPort=8080),
        "kserve-container: root filesystem not read-only": lambda: container["securityContext"].pop(
            "readOnlyRootFilesystem"),
    }
    for expected, break_it in cases.items():
        isvc = inference_service(config(*PROD), "team-a")
        (_, pod), = pod_specs(isvc)
        container = pod["containers"][0]
        break_it()
        assert restricted_violations(pod) == [expected]
