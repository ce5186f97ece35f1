"""Day-by-day training on Kubeflow: the daily pipeline (golden; its day gate), the resolve step's day (from the `day`
run parameter or the run's scheduled time, against the checkpoint store's trained days), and the submission of a day,
of data.days in order, and of a recurring run (``cluster.schedule``), against the fake KFP API of
:mod:`tests.pipelines.test_kubeflow`.

The golden file ``tests/pipelines/golden/kubeflow_daily_pipeline.yaml`` pins the compiled pipeline of a recurring daily
run; regenerate it as that module's docstring says (``-k golden`` runs both).
"""

import json
import os
from pathlib import Path

import fsspec
import pytest
import yaml
from google.protobuf import json_format
from kfp import dsl
from kfp.pipeline_spec import pipeline_spec_pb2

import pipelines.kubeflow
from components.checkpoint.days import DayLedger
from components.checkpoint.store import CheckpointStore, make_id
from components.config import ConfigError, from_dict
from components.resolve.step import RUN_PARAMETERS, config_struct, effective_config, run_parameters
from pipelines.ctr import run
from pipelines.kubeflow import RunError, SubmitError
from pipelines.local import local_config
from pipelines.pipeline import (DAY_GATE, DAY_GATE_NAME, DEPENDENCIES, EXIT_HANDLER, EXIT_TASK, TASKS, compile_pipeline,
                               compiled_config)
from tests.conftest import compose_config
from tests.pipelines.test_kubeflow import (GOLDEN_OVERRIDES, PROD, FakeKfpApi, _normalised,  # noqa: F401
                                           fake_credentials)

GOLDEN_DAILY = Path(__file__).parent / "golden" / "kubeflow_daily_pipeline.yaml"
DAILY = ("data=criteo", "data.uri='s3://ctr-bucket/logs/day_{day}.tsv'")
CRON = "0 0 2 * * *"
SCHEDULED = (*DAILY, f"cluster.schedule='{CRON}'")
DAYS = ("2026-11-01", "2026-11-02", "2026-11-03")
POLLED = ("cluster.poll_s=0.05",)


def _dag_tasks(spec: pipeline_spec_pb2.PipelineSpec, dag) -> set[str]:
    """Every task inside ``dag``, those of its groups (conditions, loops) included; the groups themselves not."""
    found = set()
    for name, task in dag.tasks.items():
        component = spec.components[task.component_ref.name]
        found |= _dag_tasks(spec, component.dag) if component.WhichOneof("implementation") == "dag" else {name}
    return found


def test_compiled_daily_pipeline_gates_its_steps_on_the_day_and_matches_golden(tmp_path, fake_credentials):
    cfg = from_dict(compose_config(tmp_path / "hydra-run-dir", *GOLDEN_OVERRIDES, *SCHEDULED))
    pipelines.kubeflow.write_run_files(cfg, tmp_path / "compiled")
    documents = list(yaml.safe_load_all((tmp_path / "compiled" / "pipeline.yaml").read_text()))
    spec = json_format.ParseDict(documents[0], pipeline_spec_pb2.PipelineSpec())
    parameters = spec.root.input_definitions.parameters
    assert set(parameters) == set(RUN_PARAMETERS) and parameters["day"].default_value.string_value == ""
    # Inside the exit handler: resolve-config, then the day gate on its `train` output around every other task.
    assert set(spec.root.dag.tasks) == {EXIT_HANDLER, EXIT_TASK}
    root = spec.components[spec.root.dag.tasks[EXIT_HANDLER].component_ref.name].dag.tasks
    assert set(root) == {"resolve-config", DAY_GATE}
    gate = root[DAY_GATE]
    assert gate.task_info.name == DAY_GATE_NAME and list(gate.dependent_tasks) == ["resolve-config"]
    assert gate.trigger_policy.condition == "inputs.parameter_values['pipelinechannel--resolve-config-train'] == true"
    assert _dag_tasks(spec, spec.components[gate.component_ref.name].dag) == set(TASKS) - {"resolve-config"}
    # resolve-config takes the run's scheduled time, which KFP fills in, and outputs the config and the gate's input.
    resolve = root["resolve-config"].inputs.parameters
    assert resolve["schedule_time"].runtime_value.constant.string_value == \
        dsl.PIPELINE_JOB_SCHEDULE_TIME_UTC_PLACEHOLDER
    assert json_format.MessageToDict(resolve["config"].runtime_value.constant) == config_struct(compiled_config(cfg))
    outputs = spec.components["comp-resolve-config"].output_definitions.parameters
    assert {name: p.parameter_type for name, p in outputs.items()} == {
        "config": pipeline_spec_pb2.ParameterType.STRUCT, "train": pipeline_spec_pb2.ParameterType.BOOLEAN,
        "checkpoint_uri": pipeline_spec_pb2.ParameterType.STRING}
    # KFP allows no pipeline outputs from inside a condition.
    assert not spec.root.output_definitions.artifacts and not spec.root.output_definitions.parameters

    normalised = _normalised(documents)
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN_DAILY.write_text(normalised)
    assert normalised == GOLDEN_DAILY.read_text(), "the compiled daily pipeline changed: see the module docstring"


def test_a_local_daily_pipeline_runs_its_steps_ungated(tmp_path):
    """kfp.local 2.17 reads a condition on a named task output as false and fails on the schedule-time placeholder:
    a local daily pipeline has neither (its driver skips the trained days)."""
    cfg = local_config(from_dict(compose_config(tmp_path, "data=criteo", "data.uri='/logs/day_{day}.tsv'",
                                                "data.days=[0,1]")))
    spec = next(yaml.safe_load_all(Path(compile_pipeline(cfg, tmp_path / "pipeline.yaml")).read_text()))
    assert set(spec["root"]["dag"]["tasks"]) == set(DEPENDENCIES)
    assert "schedule_time" not in spec["root"]["dag"]["tasks"]["resolve-config"]["inputs"]["parameters"]


# -- the resolve step: the run's day, its input, the store's trained days ----------------------------------------

@pytest.fixture
def daily(tmp_path, s3_endpoint):
    """A compiled recurring daily Kubeflow config on the loopback S3, the input of DAYS there, an empty store."""
    for day in DAYS:
        with fsspec.open(f"{s3_endpoint}/logs/day_{day}.tsv", "w") as f:
            f.write("1\t3\t5\tab12\n0\t1\t2\tcd34\n")
    cfg = from_dict(compose_config(tmp_path, "+cluster=prod", "cluster.host=https://kubeflow.example.com/pipeline",
                                   f"checkpoint.uri={s3_endpoint}/ckpt", "data=criteo",
                                   f"data.uri='{s3_endpoint}/logs/day_{{day}}.tsv'", f"cluster.schedule='{CRON}'"))
    return cfg


def _resolve(cfg, schedule_time: str = "", **parameters):
    return effective_config(config_struct(compiled_config(cfg)), schedule_time=schedule_time,
                            **{**run_parameters(cfg), **parameters})


def _record(cfg, *days: str) -> dict[str, str]:
    """The store's ledger with ``days`` trained; their checkpoints."""
    ledger = DayLedger(CheckpointStore(cfg.checkpoint.uri))
    checkpoints = {day: make_id(1, 10 * n) for n, day in enumerate(days, 1)}
    for day, checkpoint in checkpoints.items():
        ledger.record({"day": day, "checkpoint": checkpoint}, drift=None, day_ids={})
    return checkpoints


def test_the_day_parameter_names_the_day(daily):
    resolved = _resolve(daily, schedule_time="2026-12-24T02:00:00Z", day="2026-11-02")
    assert resolved.train is True
    assert from_dict(resolved.config).data.day == "2026-11-02"  # the parameter wins over the scheduled time


def test_a_scheduled_run_trains_the_day_before_its_time(daily, capsys):
    _record(daily, "2026-11-01")
    resolved = _resolve(daily, schedule_time="2026-11-03T02:00:00Z")  # day "": a recurring run's
    assert resolved.train is True and from_dict(resolved.config).data.day == "2026-11-02"  # data.day_lag=1
    assert "day '2026-11-02': the run's scheduled time 2026-11-03T02:00:00Z minus data.day_lag=1" in \
        capsys.readouterr().out


@pytest.mark.parametrize("schedule_time", ["", dsl.PIPELINE_JOB_SCHEDULE_TIME_UTC_PLACEHOLDER],
                         ids=["none", "unresolved"])
def test_a_run_without_a_day_or_a_scheduled_time_fails(daily, schedule_time):
    with pytest.raises(ConfigError) as err:
        _resolve(daily, schedule_time=schedule_time)
    assert err.value.key == "data.day" and "a daily run needs its day" in str(err.value)


def test_a_trained_day_has_nothing_to_do(daily, capsys):
    checkpoints = _record(daily, "2026-11-01", "2026-11-02")
    resolved = _resolve(daily, day="2026-11-02")
    assert resolved.train is False and from_dict(resolved.config).data.day == "2026-11-02"
    lines = capsys.readouterr().out.splitlines()
    assert f"day '2026-11-02' is trained already (checkpoint {checkpoints['2026-11-02']}): nothing to do" in lines
    assert _resolve(daily, day="2026-11-03").train is True  # the next day trains


def test_a_day_before_a_trained_one_is_refused(daily):
    _record(daily, "2026-11-02")
    with pytest.raises(ConfigError) as err:
        _resolve(daily, day="2026-11-01")
    assert err.value.key == "data.day" and err.value.value == "2026-11-01"
    assert "day '2026-11-01' comes before day '2026-11-02'" in str(err.value)


@pytest.mark.parametrize("content", [None, ""], ids=["missing", "empty"])
def test_a_day_without_input_fails_its_run_in_one_line(daily, content):
    if content is not None:
        with fsspec.open(daily.data.uri.replace("{day}", "2026-11-04"), "w") as f:
            f.write(content)
    with pytest.raises(ConfigError) as err:
        _resolve(daily, day="2026-11-04")
    message = str(err.value)
    assert "day '2026-11-04'" in message and "\n" not in message


def test_a_local_run_of_a_trained_day_is_refused(tmp_path):
    """kfp.local cannot skip the steps after resolve-config: training the day again would be the only way on."""
    (tmp_path / "day_0.tsv").write_text("1\t3\n")
    cfg = from_dict(compose_config(tmp_path, "data=criteo", f"data.uri='{tmp_path}/day_{{day}}.tsv'", "data.days=[0]",
                                   f"checkpoint.uri={tmp_path / 'ckpt'}"))
    _record(cfg, "0")
    with pytest.raises(ConfigError, match="day '0' is trained already") as err:
        _resolve(cfg, day="0")
    assert err.value.key == "data.day"


# -- submission: a day, data.days in order, a recurring run -------------------------------------------------------

def _day_runs(api) -> list[str]:
    return [body["runtime_config"]["parameters"]["day"] for body in api.posts("/apis/v2beta1/runs")]


def test_data_day_submits_the_run_of_that_day(tmp_path, fake_credentials):
    with FakeKfpApi() as api:
        assert run(compose_config(tmp_path / "run", *PROD, f"cluster.host={api.url}", *DAILY,
                                  "data.day=2026-11-02")).metrics == {}
    assert _day_runs(api) == ["2026-11-02"]
    [body] = api.posts("/apis/v2beta1/runs")
    assert "2026-11-02" in body["display_name"]


def test_data_days_are_submitted_in_order_each_after_the_day_before_ended(tmp_path, capsys, fake_credentials):
    run_dir = tmp_path / "run"
    with FakeKfpApi() as api:
        metrics = run(compose_config(run_dir, *PROD, *POLLED, f"cluster.host={api.url}", *DAILY,
                                       "data.days=[2026-11-01..2026-11-03]")).metrics
    assert metrics == {}  # no cluster.wait: nothing measured here, though each day was waited for
    assert _day_runs(api) == list(DAYS)
    # Each run is submitted after the run before it was last polled: it had ended.
    order = [(r["method"], r["path"].rsplit("/", 1)[-1]) for r in api.requests if "/runs" in r["path"]]
    run_ids = list(api.runs)
    for before, after in zip(run_ids, run_ids[1:]):
        last_poll = max(i for i, (method, path) in enumerate(order) if method == "GET" and path == before)
        assert last_poll < order.index(("POST", "runs"), last_poll), (before, after)
        assert api.runs[before]["state"] == "SUCCEEDED"
    out = capsys.readouterr().out
    for n, (day, run_id) in enumerate(zip(DAYS, run_ids), 1):
        assert f"day '{day}' ({n} of 3): Kubeflow run {run_id} submitted: {api.url}/#/runs/details/{run_id}" in out
    record = json.loads((run_dir / "kubeflow_runs.json").read_text())
    assert [(r["run_id"], r["parameters"]["day"]) for r in record] == list(zip(run_ids, DAYS))
    assert (run_dir / "pipeline.yaml").is_file() and (run_dir / "config.yaml").is_file()


def test_a_failed_day_stops_the_days_there(tmp_path, fake_credentials):
    run_dir = tmp_path / "run"
    with FakeKfpApi(outcome=["SUCCEEDED", "FAILED", "SUCCEEDED"]) as api:
        with pytest.raises(RunError) as err:
            run(compose_config(run_dir, *PROD, *POLLED, f"cluster.host={api.url}", *DAILY,
                               "data.days=[2026-11-01..2026-11-03]"))
    assert _day_runs(api) == ["2026-11-01", "2026-11-02"]  # the day after the failed one was not submitted
    failed = list(api.runs)[1]
    message = str(err.value)
    assert message.startswith(f"day '2026-11-02' (2 of 3): Kubeflow run {failed} ended FAILED")
    assert message.endswith("not submitted: 1 more, from day '2026-11-03'") and "\n" not in message
    assert isinstance(err.value, SubmitError)  # the CLI's one-line error, exit status 3
    assert len(json.loads((run_dir / "kubeflow_runs.json").read_text())) == 2


def test_a_schedule_creates_one_recurring_run(tmp_path, capsys, fake_credentials):
    run_dir = tmp_path / "run"
    with FakeKfpApi() as api:
        cfg = compose_config(run_dir, *PROD, f"cluster.host={api.url}", *SCHEDULED)
        assert run(cfg).metrics == {}
    assert api.posts("/apis/v2beta1/runs") == []
    [body] = api.posts("/apis/v2beta1/recurringruns")
    [recurring_id] = api.recurring_runs
    [experiment_id] = api.experiments
    assert body["experiment_id"] == experiment_id and body["mode"] == "ENABLE"
    assert body["trigger"] == {"cron_schedule": {"cron": CRON}}
    assert int(body["max_concurrency"]) == 1 and body["no_catchup"] is False
    # Each run takes its day from its scheduled time.
    assert body["runtime_config"]["parameters"] == {**run_parameters(from_dict(cfg)), "day": ""}
    assert body["service_account"] == "default-editor"
    compiled = list(yaml.safe_load_all((run_dir / "pipeline.yaml").read_text()))
    assert body["pipeline_spec"] == {"pipeline_spec": compiled[0], "platform_spec": compiled[1]}
    assert (run_dir / "config.yaml").is_file()
    record = json.loads((run_dir / "kubeflow_recurring_run.json").read_text())
    assert record["recurring_run_id"] == recurring_id and record["cron"] == CRON
    assert record["url"] == f"{api.url}/#/recurringrun/details/{recurring_id}"
    assert recurring_id in capsys.readouterr().out


@pytest.mark.parametrize("overrides, key", [
    ((*SCHEDULED, "data.days=[2026-11-01]"), "data.days"),
    ((*SCHEDULED, "data.day=2026-11-01"), "data.day"),
    ((*DAILY, "cluster.schedule='0 2 * * *'"), "cluster.schedule"),  # Unix cron: no seconds field
])
def test_a_schedule_needs_six_fields_and_no_days_of_its_own(tmp_path, overrides, key):
    with FakeKfpApi() as api:
        with pytest.raises(ConfigError) as err:
            run(compose_config(tmp_path / "run", *PROD, f"cluster.host={api.url}", *overrides))
    assert err.value.key == key
    assert api.requests == []
