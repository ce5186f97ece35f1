"""The KFP pipeline: compiled IR, thin component wrappers, the Hydra entry point, one local end-to-end run."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from google.protobuf import json_format, struct_pb2
from kfp.pipeline_spec import pipeline_spec_pb2

from components.checkpoint.days import ledger_at
from components.config import ConfigError, DataSource, from_dict
from components.data_prep.component import convert_data, merge_data, plan_data
from components.data_prep.step import prepare_dataset
from components.evaluate.component import evaluate_model
from components.networks.scoring import Scorer, read_test_split
from components.export.component import export_model
from components.export.table import CheckpointTable
from components.resolve.component import resolve_config
from components.resolve.step import (RUN_PARAMETERS, apply_run_parameters, config_struct, effective_config,
                                     run_parameters)
from components.train.component import train
from components.checkpoint.format import Checkpoint
from components.checkpoint.pointer import read_pointer
from components.checkpoint.store import CheckpointStore
from pipelines.ctr import run
from pipelines.local import PipelineRunError, local_config, step_error
from pipelines.pipeline import (BASELINE_TASK, DEPENDENCIES, EXPORT_GATE, FIT_FIRST_DEPENDENCIES, PREP_LOOP, TASKS,
                               compile_pipeline)
from tests.conftest import CRITEO, committed_checkpoints, compose_config, needs_criteo, score_serving_model
from tests.pipelines.spec import pipeline_tasks



def _spec(tmp_path, *overrides) -> pipeline_spec_pb2.PipelineSpec:
    path = compile_pipeline(local_config(from_dict(compose_config(tmp_path, *overrides))), tmp_path / "pipeline.yaml")
    documents = list(yaml.safe_load_all(Path(path).read_text()))
    assert len(documents) == 1  # a local-runner pipeline carries no Kubernetes platform spec
    return json_format.ParseDict(documents[0], pipeline_spec_pb2.PipelineSpec())


def test_pipeline_compiles_with_data_prep_fanned_out_and_export_gated(tmp_path):
    spec = _spec(tmp_path, "data.prep_parallelism=4", "eval.min_auc=0.72")
    tasks = spec.root.dag.tasks
    assert set(tasks) == set(DEPENDENCIES)
    assert set(pipeline_tasks(spec)) == set(TASKS)
    # resolve-config feeds every step but the fan-out; plan-data -> (convert-data per group) -> merge-data ->
    # train -> evaluate-model -> export-model once the evaluation passed its gate.
    for i, name in enumerate(DEPENDENCIES):  # DEPENDENCIES is a topological order
        assert set(DEPENDENCIES[name]) == set(tasks[name].dependent_tasks) <= set(list(DEPENDENCIES)[:i]), name
    # The train step fits the baseline beside its local job, published under the step cache's root, where
    # fit-baseline, after it, takes it from (components.train.fit_beside).
    train_inputs, fit_inputs = tasks["train"].inputs, tasks[BASELINE_TASK].inputs
    cache_root = local_config(from_dict(compose_config(tmp_path))).cluster.local_cache_root
    assert _constant(train_inputs, "baseline_root") == _constant(fit_inputs, "handoff_root") == cache_root
    assert _constant(train_inputs, "fits_baseline") is True and "baseline" not in train_inputs.artifacts
    for name in ("plan-data", "train", "evaluate-model", "export-model"):
        task, group = pipeline_tasks(spec)[name]
        config = task.inputs.parameters["config"]
        if group is not None:  # inside the gate: passed on by its group
            config = group.inputs.parameters[config.component_input_parameter]
        producer = config.task_output_parameter
        assert (producer.producer_task, producer.output_parameter_key) == ("resolve-config", "config"), name
    loop = tasks[PREP_LOOP]
    assert loop.iterator_policy.parallelism_limit == 4
    assert loop.parameter_iterator.items.input_parameter == "pipelinechannel--plan-data-Output"
    inner = spec.components[loop.component_ref.name].dag.tasks
    assert set(inner) == {"convert-data"} and set(inner["convert-data"].inputs.parameters) == {"group"}
    parts = tasks["merge-data"].inputs.artifacts["parts"].task_output_artifact
    assert (parts.producer_task, parts.output_artifact_key) == (PREP_LOOP, "pipelinechannel--convert-data-parts")
    # plan-data lists the input, which changes between runs: never cached; what follows it is cached on its plan,
    # whose fingerprint covers the input files.
    assert not tasks["plan-data"].caching_options.enable_cache and tasks["merge-data"].caching_options.enable_cache
    gate = tasks[EXPORT_GATE]
    assert gate.trigger_policy.condition == \
        "inputs.parameter_values['pipelinechannel--evaluate-model-Output'] >= 0.72"
    source = gate.inputs.parameters["pipelinechannel--evaluate-model-Output"].task_output_parameter
    assert (source.producer_task, source.output_parameter_key) == ("evaluate-model", "Output")  # the test AUC
    assert set(spec.root.dag.outputs.artifacts) == {"checkpoint", "logs", "metrics", "report"}


def _constant(inputs, name):
    return json_format.MessageToDict(inputs.parameters[name].runtime_value.constant)


def test_beside_a_job_of_another_backend_kfp_local_fits_the_baseline_first_and_hands_its_artifact(tmp_path):
    tasks = _spec(tmp_path, "cluster.backend=jobset").root.dag.tasks
    for name in FIT_FIRST_DEPENDENCIES:
        assert set(FIT_FIRST_DEPENDENCIES[name]) == set(tasks[name].dependent_tasks), name
    source = tasks["train"].inputs.artifacts["baseline"].task_output_artifact
    assert (source.producer_task, source.output_artifact_key) == (BASELINE_TASK, "baseline")
    assert {"baseline_root", "fits_baseline"}.isdisjoint(tasks["train"].inputs.parameters)
    assert "handoff_root" not in tasks[BASELINE_TASK].inputs.parameters


def test_run_parameters_default_to_the_composed_config(tmp_path):
    overrides = ("ps.epochs=3", "ps.batch_size=128", "model.learning_rate=0.002", "table.learning_rate=0.1",
                 "data=criteo", "data.uri=/some/files", "checkpoint.uri=/ckpt", "checkpoint.resume=latest")
    parameters = _spec(tmp_path, *overrides).root.input_definitions.parameters
    assert set(parameters) == set(RUN_PARAMETERS)
    assert {name: json_format.MessageToDict(p.default_value) for name, p in parameters.items()} == \
        {"epochs": 3, "batch_size": 128, "learning_rate": 0.002, "table_learning_rate": 0.1,
         "data_uri": "/some/files", "checkpoint_uri": "/ckpt", "resume": "latest", "day": ""}
    types = pipeline_spec_pb2.ParameterType
    assert parameters["epochs"].parameter_type == types.NUMBER_INTEGER
    assert parameters["learning_rate"].parameter_type == types.NUMBER_DOUBLE
    assert parameters["data_uri"].parameter_type == types.STRING


def test_components_run_without_installing_anything(tmp_path):
    for component in (resolve_config, plan_data, convert_data, merge_data, train, evaluate_model, export_model):
        container = component.component_spec.implementation.container
        command = " ".join([*container.command, *(container.args or [])])
        assert "pip install" not in command and "kfp.dsl.executor_main" in command, component.name
    executors = _spec(tmp_path).deployment_spec["executors"]
    images = {executor["container"]["image"] for executor in executors.values()}
    assert len(images) == 1
    for executor in executors.values():
        assert "pip install" not in " ".join(executor["container"]["command"])
        assert {"name": "PYTHONUNBUFFERED", "value": "1"} in executor["container"]["env"]


def test_config_survives_the_struct_parameter(tmp_path):
    """A dict parameter travels as a protobuf Struct: ints become doubles, nulls are not allowed."""
    cfg = from_dict(compose_config(tmp_path, "data=criteo", "data.uri=/some/files"))
    struct = struct_pb2.Struct()
    struct.update(config_struct(cfg))
    assert from_dict(json_format.MessageToDict(struct)) == cfg


def test_run_parameters_override_the_compiled_config(tmp_path, capsys):
    compiled = from_dict(compose_config(tmp_path))
    assert compiled.data.source is DataSource.synthetic
    data = tmp_path / "day_0.tsv"
    data.write_text("1\t3\n")
    parameters = {**run_parameters(compiled), "data_uri": str(data), "epochs": 4, "learning_rate": 0.01,
                  "table_learning_rate": 0.2, "batch_size": 64, "checkpoint_uri": str(tmp_path / "ckpt")}
    resolved = from_dict(effective_config(config_struct(compiled), **parameters).config)
    assert (resolved.data.source, resolved.data.uri) == (DataSource.files, str(data))
    assert (resolved.ps.epochs, resolved.ps.batch_size, resolved.model.learning_rate, resolved.table.learning_rate) \
        == (4, 64, 0.01, 0.2)
    assert resolved.checkpoint.uri == str(tmp_path / "ckpt")
    assert apply_run_parameters(resolved, **run_parameters(compiled)) == compiled  # nothing else changed
    assert "effective config:" in capsys.readouterr().out
    # An empty data_uri means synthetic data, whatever the compiled config read.
    back = from_dict(effective_config(config_struct(resolved), **{**parameters, "data_uri": ""}).config)
    assert (back.data.source, back.data.uri) == (DataSource.synthetic, None)


def test_resolve_step_names_the_intact_checkpoint_it_fell_back_to_so_later_steps_start_from_it(tmp_path, capsys):
    intact, newest = committed_checkpoints(tmp_path, 2)
    (newest / "tables" / "part-000").unlink()
    compiled = from_dict(compose_config(tmp_path, "checkpoint.resume=latest", "ps.epochs=3"))
    parameters = {**run_parameters(compiled), "checkpoint_uri": str(intact.parent)}
    resolved = from_dict(effective_config(config_struct(compiled), **parameters).config)
    assert resolved.checkpoint.resume == intact.name  # the train step starts from it, and checks no other
    [warning] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warning:")]
    assert f"checkpoint {newest.name} in {intact.parent} is corrupt (tables/part-000, listed in MANIFEST.json, is " \
           f"missing); resuming from {intact.name} instead" in warning
    again = from_dict(effective_config(config_struct(resolved), **{**parameters, "resume": intact.name}).config)
    assert again.checkpoint.resume == intact.name and "warning:" not in capsys.readouterr().out


@pytest.mark.parametrize("parameter, value, key", [
    ("epochs", 0, "ps.epochs"),
    ("learning_rate", -0.1, "model.learning_rate"),
    ("data_uri", "/no/such/files_*.tsv", "data.uri"),
    ("resume", "20261129T000000000000Z-e0001-s0000000001", "checkpoint.resume"),
])
def test_resolve_step_rejects_a_bad_run_parameter(tmp_path, parameter, value, key):
    compiled = from_dict(compose_config(tmp_path))
    with pytest.raises(ConfigError) as err:
        effective_config(config_struct(compiled), **{**run_parameters(compiled), parameter: value})
    assert err.value.key == key


def test_checkpoint_pointer_from_metadata_or_file(tmp_path):
    (tmp_path / "pointer").write_text(json.dumps({"uri": "/ckpt/a", "id": "x1"}))
    assert read_pointer(tmp_path / "pointer") == ("/ckpt/a", "x1")
    assert read_pointer(tmp_path / "missing", {"uri": "s3://b/ckpt", "id": "x2"}) == ("s3://b/ckpt", "x2")


def test_step_error_keeps_the_role_and_log_tail():
    out = [
        "    [KFP Executor 12:00:00 INFO]: Got executor_input:",
        "    PS job abc: 1 server(s) + 1 worker(s), mode async",
        "    Traceback (most recent call last):",
        '      File "/x/launcher.py", line 178, in _supervise',
        "        raise self._failure(p, ...)",
        "    components.train.backends.local.PsJobError: PS job abc: worker-0 exited with code 1. Last lines of w.log:",
        "        Traceback (most recent call last):",
        "        ValueError: bad shard",
        "    ",
        "",
        "12:00:01.000 - ERROR - Task 'train' finished with status FAILURE",
        "-" * 80,
    ]
    assert step_error(out) == ("components.train.backends.local.PsJobError: PS job abc: worker-0 exited with code 1. "
                               "Last lines of w.log:\n    Traceback (most recent call last):\n"
                               "    ValueError: bad shard")
    err = PipelineRunError("Pipeline 'x' finished with status FAILURE. Inner task failed: 'train'.", step_error(out))
    assert err.step == "train" and "worker-0" in str(err)


@pytest.mark.parametrize("overrides, key", [
    (["ps.workers=0"], "ps.workers"),
    (["data=criteo"], "data.uri"),
    (["checkpoint.resume=20261129T000000000000Z-e0001-s0000000001"], "checkpoint.resume"),
    (["table=ssd", "checkpoint.resume=latest"], "checkpoint.resume"),
])
def test_bad_config_fails_before_anything_starts(tmp_path, overrides, key):
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError) as err:
        run(compose_config(run_dir, *overrides))
    assert err.value.key == key
    assert not run_dir.exists()  # no data, no logs, no kfp root


def test_unknown_enum_value_fails_at_composition(tmp_path):
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="ps.mode=bogus"):
        compose_config(tmp_path, "ps.mode=bogus")


def test_cli_reports_a_config_error_in_one_line(tmp_path):
    """From a directory outside the project: the config path resolves from the installed package."""
    proc = subprocess.run([sys.executable, "-m", "pipelines.ctr", "ps.workers=0", f"hydra.run.dir={tmp_path / 'run'}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": ""})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == "error: config key 'ps.workers' has value 0; allowed: a number > 0"
    assert not (tmp_path / "run" / "logs").exists()


def test_local_pipeline_end_to_end(tmp_path, capsys):
    run_dir = tmp_path / "run"
    returned = run(compose_config(run_dir, "experiment=tiny"))  # the Python API: a RunResult
    out = capsys.readouterr().out
    for name in ("metrics.json", "report.md", "report.html", "roc.png", "config.yaml",
                 "logs/worker-0.log", "logs/server-0.log", "checkpoint/LATEST", "serving_model/serving.json",
                 "serving_model/model.pdmodel", "serving_model/model.pdiparams",
                 "serving_model/shards/00000.ids.npy", "serving_model/shards/00000.rows.npy"):
        assert (run_dir / name).is_file(), name
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert returned.metrics == metrics and {"auc", "logloss", "baseline_auc", "lift_auc"} <= set(metrics)
    assert returned.test_auc == metrics["auc"] and returned.run_dir == run_dir
    assert returned.report == run_dir / "report.html"
    assert metrics["auc"] > 0.6, metrics
    # The PS job's progress came through kfp.local to this process's stdout as it trained, then the summary table;
    # its own lines went to the run's log file (no Hydra logging here: run.log).
    log = (run_dir / "run.log").read_text()
    assert "  epoch 2: 14,000/14,000 examples" in out and "== CTR pipeline done" in out and "test AUC" in out
    assert "== epoch 2 done" in log and "== epoch 2 done" not in out
    for text in (out, log):
        assert "Got executor_input" not in text and '"outputFile"' not in text  # kfp's plumbing dump is filtered
        assert "confidenceMetrics" not in text and "outputs:" not in text  # so are the tasks' artifact listings
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["checkpoint"]["uri"] == str(run_dir / "checkpoint")
    assert "Training" in (run_dir / "report.md").read_text()  # the train step's summary reached the report
    assert "## Confusion matrix at threshold" in (run_dir / "report.md").read_text()
    assert re.search(rf"serving model +{re.escape(str(run_dir / 'serving_model'))}\n", out)
    # The exact command that serves the run's export store, and a request to try it with.
    store = str(run_dir / "checkpoint-serving")
    assert re.search(rf"serve it +python -m components.export.serving serve --model {re.escape(store)} --host "
                     r"127\.0\.0\.1 --port 8080 --name ctr\n", out)
    assert re.search(r"then try +curl -s -H 'Content-Type: application/json' -d '\{\"instances\": \[\{\}\]\}' "
                     r"http://127\.0\.0\.1:8080/v1/models/ctr:predict\n", out)
    # The exported serving model scores the test split as the evaluated checkpoint does. The evaluation scored it
    # through the servers, which hold float32 rows; the export reads the servers' saved text, whose decimals round
    # a row value by up to 5e-7 of it: the same model to within that, not bit for bit.
    data_dir = next((run_dir / "kfp").rglob("stats.json")).parent
    served = score_serving_model(run_dir / "serving_model", data_dir)
    assert served["metrics"]["auc"] == pytest.approx(metrics["auc"], abs=1e-4)
    source = json.loads((run_dir / "serving_model" / "serving.json").read_text())["source_checkpoint"]
    assert source["uri"] == str(run_dir / "checkpoint")
    # The export step was given the dataset: the model carries its transform (synthetic rows are raw Criteo records).
    assert (run_dir / "serving_model" / "transform" / "transform.json").read_bytes() == (
        data_dir / "transform" / "transform.json").read_bytes()
    # The export serves the checkpoint the train step delivered: the best on the validation split, not the latest.
    delivered = json.loads(next(run_dir.glob("kfp/*/train/checkpoint")).read_text())["id"]
    assert source["id"] == delivered == returned.checkpoint and delivered in CheckpointStore(source["uri"]).committed()
    checkpoint = CheckpointStore(source["uri"]).download(source["id"], tmp_path / "fetched")
    table = CheckpointTable(checkpoint)
    ids, rows = table.whole()
    _, dense, sparse = read_test_split(data_dir)
    one_process = Scorer(Checkpoint(meta=table.meta, ids=ids, rows=rows, dense=table.dense()), calibrated=True)
    assert np.max(np.abs(served["preds"] - one_process.predict(dense, sparse))) < 1e-6


@needs_criteo
def test_local_pipeline_on_real_criteo_format(tmp_path):
    """Raw Criteo TSV from a glob of two files: prepared by two convert tasks of the ParallelFor (the same dataset
    as one machine makes), trained on the PS and scored from the checkpoint."""
    lines = (CRITEO / "raw_criteo_sample.tsv").read_text().splitlines(keepends=True)
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    (inputs / "day_0.tsv").write_text("".join(lines[:50]))
    (inputs / "day_1.tsv").write_text("".join(lines[50:]))
    run_dir = tmp_path / "run"
    overrides = ("experiment=tiny", "data=criteo", f"data.uri={inputs}/day_*.tsv", "data.test_fraction=0.3",
                 "data.prep_parallelism=2")
    objective = run(compose_config(run_dir, *overrides)).test_auc
    metrics = json.loads((run_dir / "metrics.json").read_text())
    dataset = next((run_dir / "kfp").rglob("stats.json")).parent
    stats = json.loads((dataset / "stats.json").read_text())
    assert stats["format"] == "raw" and sum(stats["rows"].values()) == 100
    assert metrics["count"] == stats["rows"]["test"] and objective == metrics["auc"]
    parts = {p.parent.parent for p in (run_dir / "kfp").rglob("unit-*/result.json")}
    assert len(parts) == 2  # each convert task of the fan-out converted one file
    prepare_dataset(config_struct(from_dict(compose_config(tmp_path / "one", *overrides))), str(tmp_path / "one"),
                    ledger_at)
    for rel in [rel for split in ("train", "valid", "test") for rel in stats["shards"][split]]:
        assert (tmp_path / "one" / rel).read_bytes() == (dataset / rel).read_bytes(), rel


def test_prep_cache_reuses_a_dataset_only_for_the_same_input_files(tmp_path):
    """kfp.local with its cache on, the prep steps wired as the pipeline wires them (checked on the compiled
    pipeline above): the same glob over new files is prepared anew, not served stale."""
    from kfp import dsl, local
    from kfp.dsl import Dataset

    data = tmp_path / "data"
    data.mkdir()

    def write_day(day: int, rows: int) -> None:
        (data / f"day_{day}.tsv").write_text("".join(
            "\t".join([str(i % 2)] + [str(i)] * 13 + [f"{i:08x}"] * 26) + "\n" for i in range(rows)))

    cfg = from_dict(compose_config(tmp_path, "experiment=tiny", "data=criteo", f"data.uri={data}/day_*.tsv",
                                   "data.test_fraction=0.4"))

    @dsl.pipeline(name="prep-cache")
    def prep_only() -> Dataset:
        planned = plan_data(config=config_struct(cfg))
        planned.set_caching_options(False)
        with dsl.ParallelFor(planned.output) as group:
            converted = convert_data(group=group)
        merged = merge_data(groups=planned.output,
                            parts=dsl.Collected(converted.outputs["parts"]))
        return merged.outputs["dataset"]

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "kfp"),
               enable_caching=True, cache_root=str(tmp_path / "cache"))

    def prepared():
        dataset = prep_only().output
        return dataset.uri, dataset.metadata

    write_day(0, 40)
    first_uri, first = prepared()
    again_uri, again = prepared()
    assert again_uri == first_uri and again == first  # the cache hit: nothing changed
    write_day(1, 20)  # the same glob now matches one more file
    new_uri, new = prepared()
    assert new_uri != first_uri
    assert sum(first["rows"].values()) == 40 and sum(new["rows"].values()) == 60


def _executor_output(run_dir: Path, task: str) -> dict:
    (path,) = (run_dir / "kfp").glob(f"ctr-ps-training-*/{task}/executor_output.json")
    return json.loads(path.read_text())


def test_a_local_run_below_min_auc_shows_the_confusion_matrix_and_skips_the_export(tmp_path, capsys):
    run_dir = tmp_path / "run"
    objective = run(compose_config(run_dir, "experiment=tiny", "eval.min_auc=0.99", "eval.threshold=0.3")).test_auc
    out = capsys.readouterr().out
    assert objective < 0.99
    assert evaluate_model.component_spec.outputs["roc"].type.startswith("system.ClassificationMetrics")
    roc = _executor_output(run_dir, "evaluate-model")["artifacts"]["roc"]["artifacts"][0]
    confusion = roc["metadata"]["confusionMatrix"]
    assert [c["displayName"] for c in confusion["annotationSpecs"]] == ["no click", "click"]
    counts = [row["row"] for row in confusion["rows"]]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert sum(map(sum, counts)) == metrics["count"] and counts[1][0] + counts[1][1] == metrics["positives"]
    assert roc["metadata"]["confusionMatrixThreshold"] == 0.3 and roc["metadata"]["confidenceMetrics"]
    markdown = _executor_output(run_dir, "evaluate-model")["artifacts"]["report_markdown"]["artifacts"][0]
    assert "## Confusion matrix at threshold 0.3000 (eval.threshold)" in Path(markdown["uri"]).read_text()
    # The gate: no export task ran, no serving model, and the summary says why.
    assert not list((run_dir / "kfp").glob("ctr-ps-training-*/export-model"))
    assert not (run_dir / "serving_model").exists()
    assert re.search(rf"serving model +not exported: test AUC {objective:.4f} < eval.min_auc 0.99\n", out)
    assert "serve it" not in out  # nothing to serve
