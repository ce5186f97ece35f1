"""The ClusterTrainingRuntime of a PS job (``k8s/cluster-training-runtime.yaml``): installed once per cluster, it lets
anyone with the kubeflow SDK run the job without the pipeline::

    python -m components.train.backends.cluster_runtime [overrides...] --data-uri s3://.../dataset \\
        --baseline-uri s3://.../baseline --out k8s/cluster-training-runtime.yaml
    kubectl apply -f k8s/cluster-training-runtime.yaml      # a cluster admin, once

It is the launcher's own TrainingRuntime (:func:`components.train.backends.manifests.training_runtime`, as the
train step would create it for this config) made cluster-scoped, with the workers' env and resources in its
``node`` container rather than in a TrainJob (the SDK's TrainJob carries only what its caller gives). Pods name
their hosts after the TrainJob that runs them (:func:`~components.train.backends.manifests.host_base`), so a
TrainJob of any name works. What it bakes in: the config (model, table, servers and workers), the prepared
dataset at ``--data-uri`` (what a pipeline run's ``merge-data`` step wrote), the fitted baseline at
``--baseline-uri`` (its ``fit-baseline`` step's, which the model blends in) and ``checkpoint.uri``; the storage
Secrets of ``cluster.storage_secrets`` must exist in the namespace of each TrainJob. Its PS plane is plaintext
(``ps.tls`` off, said in the file's header, unless ``cluster.mesh_encryption``): a job's TLS certificates are issued
by the pipeline's launcher when it creates the job, and no launcher creates the SDK's TrainJobs. Kubeflow Trainer gives a
TrainJob's ``numNodes`` to the ``node`` job: keep it the runtime's (``ps.workers``), which the workers' env names.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import yaml

from components.config import ClusterBackend, ConfigError, CtrConfig, PsTls
from components.ps.tls import plaintext_warning
from components.train.backends import manifests
from components.train.backends.docker_compose import load_config

NAME = "ctr-ps"
# What makes the composed config a Kubeflow one that runs as a TrainJob; the command line's overrides follow.
BASE_OVERRIDES = ("+cluster=prod", "cluster.backend=trainjob", "cluster.submit=false")
# The checked-in file's: a bucket of the examples' (regenerate with yours).
DEFAULT_OVERRIDES = ("checkpoint.uri=s3://ctr-bucket/ctr/checkpoints",)
DEFAULT_DATA_URI = "s3://ctr-bucket/ctr/dataset"
DEFAULT_BASELINE_URI = "s3://ctr-bucket/ctr/baseline"
CHECKED_IN = Path("k8s") / "cluster-training-runtime.yaml"
REGENERATE = (f"python -m components.train.backends.cluster_runtime {' '.join(DEFAULT_OVERRIDES)} "
              f"--data-uri {DEFAULT_DATA_URI} --baseline-uri {DEFAULT_BASELINE_URI} --out {CHECKED_IN}")


def plaintext_config(cfg: CtrConfig) -> CtrConfig:
    """``cfg`` with its PS plane in the clear: a ClusterTrainingRuntime serves every TrainJob of the cluster, and no
    launcher issues a job's certificates for them (``ps.tls=on`` is refused)."""
    if cfg.ps.tls is PsTls.on:
        raise ConfigError("ps.tls", cfg.ps.tls.value, "auto or off for a ClusterTrainingRuntime",
                          "it serves every TrainJob of the cluster and no launcher issues a job's certificates: the "
                          "pipeline's train step does (cluster.backend=trainjob); or set cluster.mesh_encryption=true")
    return replace(cfg, ps=replace(cfg.ps, tls=PsTls.off))


def cluster_training_runtime(cfg: CtrConfig, data_uri: str, name: str = NAME, baseline_uri: str = "") -> dict:
    """The ClusterTrainingRuntime ``name`` running ``cfg``'s PS job on the dataset at ``data_uri``, its model
    blending in the baseline fitted at ``baseline_uri`` (``model.blend_baseline``)."""
    if cfg.cluster.backend is not ClusterBackend.trainjob:
        raise ConfigError("cluster.backend", cfg.cluster.backend.value, "trainjob",
                          "a ClusterTrainingRuntime is Kubeflow Trainer's")
    if cfg.model.blend_baseline and not baseline_uri:
        raise ConfigError("model.blend_baseline", True, "false without --baseline-uri",
                          "give --baseline-uri (what a pipeline run's fit-baseline step wrote), or set "
                          "model.blend_baseline=false to deliver the network alone")
    runtime, trainjob = manifests.review_manifests(plaintext_config(cfg), data_uri, name=name,
                                                   baseline_uri=baseline_uri)[-2:]
    workers = next(rjob for rjob in runtime["spec"]["template"]["spec"]["replicatedJobs"]
                   if rjob["name"] == manifests.TRAINER_NODE)
    node = workers["template"]["spec"]["template"]["spec"]["containers"][0]
    trainer = trainjob["spec"]["trainer"]
    node["env"], node["resources"] = trainer["env"], trainer["resourcesPerNode"]
    del runtime["metadata"]["namespace"]
    return {**runtime, "kind": "ClusterTrainingRuntime"}


def generate(overrides: list[str], data_uri: str, out: Path, baseline_uri: str = "") -> str:
    """The YAML of ``out``: the runtime of the config composed with :data:`BASE_OVERRIDES` and ``overrides``,
    under a header naming the command that regenerates it."""
    cfg = load_config([*BASE_OVERRIDES, *overrides])
    runtime = cluster_training_runtime(cfg, data_uri, baseline_uri=baseline_uri)
    plaintext = plaintext_warning(plaintext_config(cfg))
    command = " ".join(["python -m components.train.backends.cluster_runtime", *overrides, "--data-uri", data_uri,
                        *(["--baseline-uri", baseline_uri] if baseline_uri else []), "--out", str(out)])
    header = (f"# Generated by `{command}`; do not edit, regenerate.\n"
              f"# Install once per cluster (kubectl apply -f); run it with the kubeflow SDK (README, Kubeflow).\n"
              + (f"# {plaintext}\n" if plaintext else ""))
    unshared = json.loads(json.dumps(runtime))  # the manifests share some lists: no YAML anchors in the file
    return header + yaml.safe_dump(unshared, sort_keys=False, width=1 << 20)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m components.train.backends.cluster_runtime", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as for python -m pipelines.ctr")
    parser.add_argument("--data-uri", required=True, help="the prepared dataset the pods read (s3://...)")
    parser.add_argument("--baseline-uri", default="",
                        help="the fitted baseline the model blends in (a pipeline run's fit-baseline output)")
    parser.add_argument("--out", required=True, type=Path, help="the YAML file to write")
    args = parser.parse_args(argv)
    try:
        text = generate(args.overrides, args.data_uri, args.out, args.baseline_uri)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
