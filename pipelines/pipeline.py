"""The CTR pipeline: resolve the config -> prepare data (plan, convert in parallel, merge) -> PS training ->
evaluation -> the export, when the evaluation passes the AUC gate (on Kubeflow with ``cluster.serving.deploy``, then
the online server's InferenceService created or updated: :data:`DEPLOY_TASK`).

:func:`ctr_pipeline` builds the pipeline for one composed config. What is structural (server and worker
counts, images, resources, model, mode, ...) is compiled in as a constant; the knobs worth changing per
run are pipeline parameters whose defaults are the composed values (:data:`RUN_PARAMETERS`). The first
step, ``resolve-config``, applies them and outputs the effective config that every later step takes.

A daily pipeline on Kubeflow (``data.uri`` holding ``{day}``: one day per run) puts every step after
``resolve-config`` inside a condition on its ``train`` output, so a run whose day the checkpoint store has trained
already does nothing more (and the UI shows those steps skipped).

On Kubeflow every step runs inside an exit handler whose exit task deletes whatever PS job objects the run left
(:data:`EXIT_TASK`), however the run ended. KFP allows no pipeline outputs from inside a condition or an exit
handler, so a Kubeflow pipeline has none: its tasks' artifacts are in the UI, and the driver reads the run's
metrics from the checkpoint store (:mod:`pipelines.kubeflow`).

``kfp.local`` executes this pipeline for a local run (:mod:`pipelines.local`); :func:`compile_pipeline`
turns it into the IR YAML that Kubeflow Pipelines runs (:mod:`pipelines.kubeflow`).
"""

# No `from __future__ import annotations`: KFP reads the pipeline and component annotations as types.
import contextlib
import dataclasses
import os
from typing import NamedTuple

from kfp import compiler, dsl
from kfp.dsl import HTML, Artifact, Metrics, Model

from components.cleanup.component import clean_up_run
from components.config import ClusterBackend, ClusterConfig, CtrConfig, DataSource, PipelineRunner
from components.data_prep.component import convert_data, merge_data, plan_data
from components.days import is_daily
from components.deploy.component import deploy_model
from components.evaluate.component import evaluate_model, fit_baseline
from components.export.component import export_model
from components.export.signing import AUTO, SECRET_MOUNT
from components.resolve.component import resolve_config
from components.resolve.step import RUN_PARAMETERS, config_struct, day_gated, run_parameters
from components.train.backends.manifests import (KFP_RUN_LABEL, KFP_WORKFLOW_LABEL, LAUNCHER_ACCOUNT_ENV,
                                                 PIPELINE_RUN_ENV, PIPELINE_RUN_NAME_ENV)
from components.train.component import train

PIPELINE_NAME = "ctr-ps-training"
# Every task. convert-data runs inside the data-prep fan-out: a ParallelFor over the plan's groups, the root DAG's
# PREP_LOOP; export-model inside the AUC gate, the root DAG's EXPORT_GATE.
# fit-baseline needs only the dataset. A model that blends it in (model.blend_baseline, the default) needs it only
# when its workers first judge a checkpoint on the blended predictions, so its fit runs beside the train step and
# publishes itself to the workers (components.networks.baseline_handoff). On Kubeflow fit-baseline is that fit. On
# kfp.local, which runs one task at a time, the train step of a local job fits it beside its processes
# (components.train.fit_beside), and fit-baseline, after it, takes the published fit; beside a job of another
# backend it is fitted first. The evaluation waits for both.
BASELINE_TASK = "fit-baseline"
TASKS = ("resolve-config", "plan-data", "convert-data", "merge-data", "train", BASELINE_TASK, "evaluate-model",
         "export-model")
PREP_LOOP, EXPORT_GATE = "for-loop-1", "condition-2"
# With cluster.serving.deploy (Kubeflow only), inside the AUC gate after the export: the online server's
# InferenceService created or updated (components.deploy), acting as the launcher account.
DEPLOY_TASK = "deploy-model"
# What each task of the root DAG waits for, in a topological order, as kfp.local runs the default config (a local
# job, model.blend_baseline): the export on the evaluation that gates it.
DEPENDENCIES = {"resolve-config": (), "plan-data": ("resolve-config",), PREP_LOOP: ("plan-data",),
                "merge-data": ("plan-data", PREP_LOOP), "train": ("resolve-config", "merge-data"),
                BASELINE_TASK: ("merge-data", "train"),
                "evaluate-model": ("resolve-config", "merge-data", BASELINE_TASK, "train"),
                EXPORT_GATE: ("resolve-config", "merge-data", "train", "evaluate-model")}
# kfp.local beside a job of another backend (its pods or containers read the fit from fit-baseline's artifact).
FIT_FIRST_DEPENDENCIES = {**DEPENDENCIES, "train": ("resolve-config", "merge-data", BASELINE_TASK),
                          BASELINE_TASK: ("merge-data",)}
# On Kubeflow fit-baseline takes the run's checkpoint store, where it publishes its fit, and the train step runs
# beside it.
KUBEFLOW_DEPENDENCIES = {**DEPENDENCIES, BASELINE_TASK: ("resolve-config", "merge-data")}
# On Kubeflow the root DAG holds EXIT_HANDLER, the group of every task above, and EXIT_TASK, which runs once that
# group ended however it ended (succeeded, failed, cancelled) and deletes the PS job objects the run left
# (components.train.backends.kubernetes.cleanup): a launcher killed outright, or cancelled before it could delete
# its job, leaves no pods behind. kfp.local has no use for it (its backend starts no Kubernetes objects).
EXIT_HANDLER, EXIT_HANDLER_NAME = "exit-handler-1", "the run's steps"
EXIT_TASK = "clean-up-run"
# A daily pipeline on Kubeflow (components.resolve.step.day_gated): the exit handler holds resolve-config and DAY_GATE,
# the condition on resolve-config's `train` output around every other task (as DEPENDENCIES, numbered after them:
# KFP numbers the groups in the order they open, the exit handler first).
DAY_GATE, DAY_GATE_NAME = "condition-2", "the run's day is not trained yet"
# The steps that may simply run again after a failure (a lost node, a storage blip): they replace their outputs
# whole, or, the clean-up, find nothing left to delete. Not resolve-config and plan-data (their failures are the
# config's or the input's) nor train (the PS job restarts itself).
RETRIED_TASKS = ("convert-data", "merge-data", BASELINE_TASK, "evaluate-model", "export-model", EXIT_TASK, DEPLOY_TASK)
EXPORT_TASK = "export-model"
RETRY_BACKOFF = "60s"  # then doubling
# Each task's pod resources on Kubeflow: the ClusterConfig.steps field.
STEP_RESOURCES = {"resolve-config": "resolve", "plan-data": "resolve", "convert-data": "prepare",
                  "merge-data": "prepare", BASELINE_TASK: "baseline", "train": "train", "evaluate-model": "evaluate",
                  "export-model": "export",
                  EXIT_TASK: "resolve", DEPLOY_TASK: "resolve"}
# The train step's launcher makes its own pod the owner of the PS job it creates, and labels that job with the
# pipeline run it belongs to (downward API: KFP labels every pod of a run with its id), and names it after the run's
# workflow; the exit task finds the run's objects by that label. Both act as the launcher account (LAUNCHER_TASKS:
# add_launcher_access).
LAUNCHER_POD_FIELDS = {"POD_NAME": "metadata.name", "POD_UID": "metadata.uid", "POD_NAMESPACE": "metadata.namespace",
                       PIPELINE_RUN_ENV: f"metadata.labels['{KFP_RUN_LABEL}']",
                       PIPELINE_RUN_NAME_ENV: f"metadata.labels['{KFP_WORKFLOW_LABEL}']"}
LAUNCHER_TASKS = ("train", EXIT_TASK)
# The deploy step acts as the launcher account too, in its own pod's namespace; it owns and labels nothing (the
# InferenceService outlives the run): its pod's name and uid only bind the launcher tokens it requests.
DEPLOY_POD_FIELDS = {"POD_NAME": "metadata.name", "POD_UID": "metadata.uid", "POD_NAMESPACE": "metadata.namespace"}

# Pipeline outputs: what a local run copies into its run directory. The serving model is not one: the AUC gate
# may skip its export (pipelines.local finds it when it was made).
Outputs = NamedTuple("Outputs", [("checkpoint", Model), ("logs", Artifact), ("metrics", Metrics), ("report", HTML)])


def compiled_config(cfg: CtrConfig) -> CtrConfig:
    """The config a pipeline carries, without what only the driver uses: ``run_dir`` (Hydra's folder) and
    ``cluster.image_signing_key`` (a file on the driver's machine, read into ``k8s/image-policy.yaml``)."""
    return dataclasses.replace(cfg, run_dir=".", cluster=dataclasses.replace(cfg.cluster, image_signing_key=None))


def local_handoff_root(cfg: CtrConfig) -> str:
    """Where kfp.local's train step publishes the baseline it fits beside its job: the step cache's root, which a
    sweep's jobs and the runs of every day share, as they share fit-baseline's cached result."""
    if cfg.cluster.local_cache_root is None:
        raise ValueError("a local run's config names its step cache (pipelines.local.local_config sets "
                         "cluster.local_cache_root)")
    return cfg.cluster.local_cache_root


def display_names(cfg: CtrConfig) -> dict[str, str]:
    """What the KFP UI calls each task."""
    data = "synthetic data" if cfg.data.source is DataSource.synthetic else f"{cfg.data.format.value} files"
    return {"resolve-config": "Resolve the run's config", "plan-data": f"Plan the prep of {data}",
            "convert-data": f"Convert a group of {data}", "merge-data": "Merge the prepared groups",
            BASELINE_TASK: "Fit the logistic-regression baseline",
            "train": f"Train: {cfg.ps.servers} PS servers + {cfg.ps.workers} workers ({cfg.cluster.backend.value})",
            "evaluate-model": "Evaluate on the test split", "export-model": "Export the serving model",
            EXIT_TASK: f"Clean up the run's PS job objects ({cfg.cluster.backend.value})",
            DEPLOY_TASK: f"Deploy the online server (InferenceService {cfg.cluster.serving.name})"}


def ctr_pipeline(cfg: CtrConfig):
    """The pipeline for ``cfg``; call it with :func:`run_parameters` (kfp.local) or compile it."""
    config = config_struct(compiled_config(cfg))
    defaults = run_parameters(cfg)
    image = cfg.cluster.pipeline_image.reference
    on_kubeflow = cfg.cluster.runner is PipelineRunner.kubeflow
    gated = day_gated(cfg)
    hygiene = dsl.PipelineConfig(ttl_seconds_after_finished=cfg.cluster.run_ttl_s,
                                 active_deadline_seconds=cfg.cluster.run_deadline_s) if on_kubeflow else None
    decorator = dsl.pipeline(name=PIPELINE_NAME, description="Parameter-server training of a CTR model on PaddlePaddle",
                             pipeline_root=cfg.cluster.pipeline_root, pipeline_config=hygiene)

    def pipeline_steps(arguments: dict) -> dict:
        """Every task (by :data:`TASKS` name) of a run given these arguments (the run parameters, among others)."""
        parameters = {name: arguments[name] for name in RUN_PARAMETERS}
        # Only where the steps are gated on Kubeflow: kfp.local 2.17 fails on the placeholder.
        scheduled = {"schedule_time": dsl.PIPELINE_JOB_SCHEDULE_TIME_UTC_PLACEHOLDER} if gated else {}
        resolved = resolve_config(config=config, **parameters, **scheduled)
        # It checks the resume target and the trained days against the checkpoint store, whose content changes
        # between runs.
        resolved.set_caching_options(False)
        effective = resolved.outputs["config"]
        day_gate = (dsl.If(resolved.outputs["train"] == True, name=DAY_GATE_NAME)  # noqa: E712 (a pipeline channel)
                    if gated else contextlib.nullcontext())
        with day_gate:
            planned = plan_data(config=effective)
            # It lists the input files, which change between runs; the steps after it are cached on its plan, whose
            # fingerprint covers the files (their ETags or mtimes and sizes) and the settings: the same glob over
            # new files is prepared anew.
            planned.set_caching_options(False)
            # A convert task takes nothing but its loop item (kfp.local 2.17 passes the loop item for every other
            # task output a task inside a ParallelFor takes).
            with dsl.ParallelFor(planned.output, parallelism=cfg.data.prep_parallelism) as group:
                converted = convert_data(group=group)
            prep = merge_data(groups=planned.output, parts=dsl.Collected(converted.outputs["parts"]))
            if is_daily(cfg.data.uri):  # a day's drift check reads the checkpoint store, which changes between runs
                prep.set_caching_options(False)
            # The baseline reads the dataset alone: cached per dataset (and where its fit is published). A model
            # that blends it in (model.blend_baseline) trains beside its fit (BASELINE_TASK's comment).
            blended = cfg.model.blend_baseline
            fitted_by_train = blended and not on_kubeflow and cfg.cluster.backend is ClusterBackend.local
            handoff_root = (resolved.outputs["checkpoint_uri"] if on_kubeflow and blended else
                            local_handoff_root(cfg) if fitted_by_train else None)

            def baseline_step():
                return fit_baseline(dataset=prep.outputs["dataset"], rows=cfg.eval.baseline_rows,
                                    features=cfg.eval.baseline_features,
                                    **({"handoff_root": handoff_root} if handoff_root is not None else {}))

            baseline = baseline_step() if (cfg.eval.baseline or blended) and not fitted_by_train else None
            handed = ({} if not blended else
                      {"baseline": baseline.outputs["baseline"]} if handoff_root is None else  # fitted first
                      {"baseline_root": handoff_root, **({"fits_baseline": True} if fitted_by_train else {})})
            fit = train(config=effective, dataset=prep.outputs["dataset"], **handed)
            if fitted_by_train:  # after it, the fit it published
                baseline = baseline_step().after(fit)
            # The checkpoint lives outside the artifact store (checkpoint.uri): a cached step would only point at it.
            fit.set_caching_options(False)
            scored = evaluate_model(config=effective, dataset=prep.outputs["dataset"],
                                    checkpoint=fit.outputs["checkpoint"],
                                    **({"baseline": baseline.outputs["baseline"]} if baseline is not None else {}))
            gate = f"test AUC >= eval.min_auc {cfg.eval.min_auc:g}"
            with dsl.If(scored.outputs["Output"] >= cfg.eval.min_auc, name=gate):  # evaluate-model: the test AUC
                served = export_model(config=effective, checkpoint=fit.outputs["checkpoint"],
                                      dataset=prep.outputs["dataset"])
                # It changes the cluster (a cached run would skip the update); the config, not the version, decides
                # what it writes: the server follows the export store.
                deployed = (deploy_model(config=effective, serving_model=served.outputs["serving_model"])
                            .set_caching_options(False) if cfg.cluster.serving.deploy else None)
        tasks = {"resolve-config": resolved, "plan-data": planned, "convert-data": converted, "merge-data": prep,
                 BASELINE_TASK: baseline, "train": fit, "evaluate-model": scored, "export-model": served,
                 DEPLOY_TASK: deployed}
        return {name: task for name, task in tasks.items() if task is not None}

    def steps(arguments: dict) -> dict:
        """:func:`pipeline_steps` with their settings; on Kubeflow inside the exit handler, whose exit task
        (:data:`EXIT_TASK`) the tasks then include."""
        if on_kubeflow:
            # It takes the compiled-in cluster settings (no run parameter changes them), so that it runs even when
            # resolve-config fails; its input never changes, and a cached clean-up would delete nothing.
            cleanup = clean_up_run(cluster=config["cluster"]).set_caching_options(False)
            with dsl.ExitHandler(cleanup, name=EXIT_HANDLER_NAME):
                tasks = pipeline_steps(arguments)
            tasks[EXIT_TASK] = cleanup
        else:
            tasks = pipeline_steps(arguments)
        for task in tasks.values():
            task.set_env_variable("PYTHONUNBUFFERED", "1")  # progress lines reach the logs as they happen
            task.set_container_image(image)
        if on_kubeflow:
            add_kubeflow_settings(cfg, tasks)
        return tasks

    # Two pipelines that differ only in their outputs, which KFP allows from neither a condition (the day gate) nor an
    # exit handler, so only kfp.local's pipeline has them; `locals()` holds the run parameters it was called with.
    if on_kubeflow:
        @decorator
        def kubeflow_pipeline(data_uri: str = defaults["data_uri"], epochs: int = defaults["epochs"],
                              learning_rate: float = defaults["learning_rate"],
                              table_learning_rate: float = defaults["table_learning_rate"],
                              batch_size: int = defaults["batch_size"],
                              checkpoint_uri: str = defaults["checkpoint_uri"], resume: str = defaults["resume"],
                              day: str = defaults["day"]):
            steps(locals())

        return kubeflow_pipeline

    @decorator
    def pipeline(data_uri: str = defaults["data_uri"], epochs: int = defaults["epochs"],
                 learning_rate: float = defaults["learning_rate"],
                 table_learning_rate: float = defaults["table_learning_rate"],
                 batch_size: int = defaults["batch_size"], checkpoint_uri: str = defaults["checkpoint_uri"],
                 resume: str = defaults["resume"], day: str = defaults["day"]) -> Outputs:
        tasks = steps(locals())
        fit, scored = tasks["train"], tasks["evaluate-model"]
        return Outputs(checkpoint=fit.outputs["checkpoint"], logs=fit.outputs["logs"],
                       metrics=scored.outputs["metrics"], report=scored.outputs["report"])

    return pipeline


def add_kubeflow_settings(cfg: CtrConfig, tasks: dict) -> None:
    """What the Kubeflow run's tasks get (kfp.local has no use for it): display names; CPU and memory requests and
    limits (quota-enforced namespaces refuse pods without them), accelerators where configured; retries of the
    steps that can run again; and the pods' Kubernetes settings (:func:`add_kubernetes_settings`).

    The fit-baseline, evaluate and export steps' memory is the larger of ``cluster.steps.<step>.memory`` and their plan with a
    margin (:func:`components.train.process_plan.step_memories`: from the config alone, the table's rows bounded by
    ``table.vocab_size``), so a step is not OOM-killed for a table or a split the config already names. The train
    step's launcher keeps its configured memory: on Kubeflow it starts the PS pods and holds neither table nor data.
    """
    from components.train.process_plan import step_memories

    names = display_names(cfg)
    planned = {step: quantity for step, (quantity, _) in step_memories(cfg).items()}
    for name, task in tasks.items():
        task.set_display_name(names[name])
        resources = getattr(cfg.cluster.steps, STEP_RESOURCES[name])
        task.set_cpu_request(resources.cpu).set_cpu_limit(resources.cpu_limit or resources.cpu)
        memory = planned.get(STEP_RESOURCES[name], resources.memory)
        task.set_memory_request(memory).set_memory_limit(memory)
        if resources.gpus:
            task.set_accelerator_type("nvidia.com/gpu").set_accelerator_limit(resources.gpus)
        if name in RETRIED_TASKS and cfg.cluster.step_retries:
            task.set_retry(num_retries=cfg.cluster.step_retries, backoff_duration=RETRY_BACKOFF, backoff_factor=2.0)
    add_kubernetes_settings(cfg.cluster, tasks)
    if cfg.export.signing_key == AUTO:
        add_signing_key(cfg.export.signing_secret, tasks[EXPORT_TASK])


def add_signing_key(secret: str, task) -> None:
    """The export step's signing key: the Secret ``export.signing_secret`` (``key.pem``, ``key.pub``) mounted at
    :data:`components.export.signing.SECRET_MOUNT`, into that step alone (no other step signs)."""
    from kfp import kubernetes

    kubernetes.use_secret_as_volume(task, secret_name=secret, mount_path=SECRET_MOUNT)


def add_kubernetes_settings(cluster: ClusterConfig, tasks: dict) -> None:
    """Pod settings of the Kubeflow run: storage credentials as secret references only (not to the exit task nor the
    deploy task, which read no storage: the InferenceService's pods get their own references), non-root, image pull
    secrets; and the launcher's access for :data:`LAUNCHER_TASKS` and the deploy task (:func:`add_launcher_access`)."""
    from kfp import kubernetes

    for name, task in tasks.items():
        for secret in cluster.storage_secrets if name not in (EXIT_TASK, DEPLOY_TASK) else ():
            kubernetes.use_secret_as_env(task, secret_name=secret.name,
                                         secret_key_to_env={key: env for env, key in secret.keys.items()})
        kubernetes.set_security_context(task, run_as_user=cluster.run_as_user, run_as_non_root=True)
        if cluster.image_pull_secrets:
            kubernetes.set_image_pull_secrets(task, list(cluster.image_pull_secrets))
    for name in LAUNCHER_TASKS:
        add_launcher_access(cluster, tasks[name])
    if DEPLOY_TASK in tasks:
        add_launcher_access(cluster, tasks[DEPLOY_TASK], DEPLOY_POD_FIELDS)


def add_launcher_access(cluster: ClusterConfig, task, pod_fields: dict[str, str] = LAUNCHER_POD_FIELDS) -> None:
    """What a task that acts on PS jobs (or the InferenceService) needs: what it reads of its own pod
    (``pod_fields``, env name -> field path: :data:`LAUNCHER_POD_FIELDS`, its pod's identity and run) and, mounted
    into it alone, the name of the account that may create and delete PS jobs, whose short-lived tokens it
    requests (the run's pods run as ``cluster.pipeline_service_account``, which may not act on PS jobs itself)."""
    from kfp import kubernetes

    for env, field_path in pod_fields.items():
        kubernetes.use_field_path_as_env(task, env_name=env, field_path=field_path)
    task.set_env_variable(LAUNCHER_ACCOUNT_ENV, cluster.service_account)


def compile_pipeline(cfg: CtrConfig, path: str | os.PathLike) -> str:
    """Write the IR YAML of ``cfg``'s pipeline to ``path`` (with the Kubernetes platform spec when
    ``cluster.runner=kubeflow``); returns the path."""
    path = os.fspath(path)
    compiler.Compiler().compile(pipeline_func=ctr_pipeline(cfg), package_path=path)
    return path
