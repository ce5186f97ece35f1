"""The console of a default-shaped run through the real entry point (a pipe: plain lines), its log file, its report's
training curve, and ``plan=true`` against the run it plans."""

import json
import os
import re
import subprocess
import sys

import pytest

from pipelines.console import PassProgress, RunConsole
from tests.conftest import ROOT

# Two workers, each reporting often enough that a pass of a second gives every worker points of the curve.
TINY = ("experiment=tiny", "ps.workers=2", "ps.progress_period_s=0.2")


def _cli(run_dir, *overrides):
    return subprocess.run([sys.executable, "-m", "pipelines.ctr", *overrides, f"hydra.run.dir={run_dir}"],
                          cwd=run_dir.parent, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "CI": "true"})


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """``plan=true`` and then the run it plans, both through ``python -m pipelines.ctr``."""
    root = tmp_path_factory.mktemp("console")
    plan = _cli(root / "plan", *TINY, "plan=true")
    run = _cli(root / "run", *TINY)
    assert plan.returncode == 0, plan.stderr
    assert run.returncode == 0, run.stdout + run.stderr
    return plan, run, root / "run"


def test_console_fits_on_a_screen(tiny_run):
    _, run, run_dir = tiny_run
    lines = (run.stdout + run.stderr).splitlines()
    assert len(lines) < 40, "\n".join(lines)
    text = "\n".join(lines)
    assert lines[0] == "CTR pipeline: synthetic data, 20,000 rows"
    assert "1 server(s) x 2 worker(s)" in text and str(run_dir) in text
    for step in ("resolve-config", "plan-data", "convert-data", "merge-data", "train", "evaluate-model", "export-model"):
        assert re.search(rf"^  {step} +\d+\.\ds", text, re.M), step
    assert "14,000 train, 2,000 validation, 4,000 test rows" in text
    assert re.search(r"^  epoch 2: 14,000/14,000 examples \(100%\) in [\d.]+s, [\d,]+ ex/s, train AUC 0\.\d{4}", text, re.M)
    assert "== CTR pipeline done" in text and "test AUC" in text
    # The config, KFP's executor lines and the PS job's own lines are not on the screen.
    for noise in ("effective config", "KFP Executor", "memory plan", "Cleaned up workspace", "Traceback"):
        assert noise not in text, noise


def test_log_file_keeps_every_line(tiny_run):
    _, run, run_dir = tiny_run
    log = (run_dir / "ctr.log").read_text()
    assert "effective config:" in log and "  embedding_dim: 9" in log
    for executor in ("Looking for component `train`", "Loading KFP component \"train\"", "Wrote executor output file"):
        assert executor in log, executor
    assert "memory plan: shard_num 8" in log and "== epoch 2 done: 14,000 examples" in log
    assert "Cleaned up workspace" in log  # the driver's own log records, as before
    assert "\x1b[" not in log


def test_plan_numbers_are_what_the_run_did(tiny_run):
    plan, _, run_dir = tiny_run
    planned = plan.stdout
    assert not (run_dir.parent / "plan").exists()  # the plan's run directory: no .hydra/, no ctr.log, removed
    stats = json.loads(next((run_dir / "kfp").rglob("merge-data/*/stats.json")).read_text())
    rows = stats["rows"]
    assert f"{sum(rows.values()):,} rows ({rows['train']:,} train, {rows['valid']:,} validation, {rows['test']:,} test)" \
        in planned
    assert f"{len(stats['shards']['train'])} train shard(s), 1 per worker" in planned and "2 train shard(s)" in planned
    ran = (run_dir / "ctr.log").read_text()
    # The same table layout: shards, bytes per row, base; the run bounds the rows by the ids data prep counted.
    shard_line = re.search(r"memory plan: (shard_num \d+ \(.*?\)): ", ran)[1]
    assert f"memory plan: {shard_line}" in planned
    per_row = re.search(r" x (\d+ B/row \(.*?\))", ran)[1]
    assert per_row in planned
    base = re.search(r"\+ ([\d.]+ MiB base)", ran)[1]
    assert base in planned
    assert "1 server(s) + 2 worker(s) on this machine" in planned
    assert not (run_dir.parent / "plan" / "checkpoint").exists() and not (run_dir.parent / "plan" / "kfp").exists()


def test_every_row_of_the_report_has_a_readable_name(tiny_run):
    _, _, run_dir = tiny_run
    names = re.findall(r"^\| ([^|]+?) \|", (run_dir / "report.md").read_text(), re.M)
    raw = [name for name in names if re.fullmatch(r"[a-z]+(_[a-z0-9]+)*", name) and len(name) > 1]
    assert "ROC AUC" in names and not raw, raw


def test_report_has_the_training_curve_of_every_worker(tiny_run):
    _, _, run_dir = tiny_run
    png = (run_dir / "training_curve.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    # The points it was drawn from: what the train step recorded on the Model artifact (its pointer file).
    summary = json.loads(next((run_dir / "kfp").glob("ctr-ps-training-*/train/checkpoint")).read_text())
    curve = summary["curve"]
    assert sorted(curve) == ["worker-0", "worker-1"]
    for points in curve.values():
        assert points, curve
        examples = [point[0] for point in points]
        assert examples == sorted(examples) and examples[-1] <= 14_000  # 7,000 a pass each, over 2 passes
    assert "![Training curve (running loss and AUC of each worker)](training_curve.png)" in (run_dir / "report.md").read_text()
    html = (run_dir / "report.html").read_text()
    assert '<img alt="Training curve (running loss and AUC of each worker)" src="data:image/png;base64,' in html
    assert re.search(r"<td>server 0</td><td>[\d,]+ rows, peak RSS [\d,.]+ MiB</td>", html)
    # The load of every server, counted from the train split's ids as Paddle routes them.
    assert re.search(r"<td>server 0 load</td><td>[\d,]+ rows touched, [\d,]+ rows pulled and pushed", html)
    assert re.search(r"<td>load, busiest server / mean</td><td>rows 1\.\d+x, bytes 1\.\d+x \(every train row", html)


def test_progress_of_all_workers_together():
    state = PassProgress(epoch=1, total=1000)
    state.workers[0] = {"examples": 300, "examples_per_s": 100.0, "loss": 0.5, "auc": 0.6}
    state.workers[1] = {"examples": 100, "examples_per_s": 50.0, "loss": 0.7, "auc": 0.8}
    assert state.examples == 400 and state.examples_per_s == 150.0
    assert state.eta_s == pytest.approx(600 / 150)
    assert state.metrics() == "loss 0.5500 auc 0.6500"  # weighted by each worker's examples
    assert state.line() == "  epoch 1: 400/1,000 examples (40%), 150 ex/s, ETA 0:04, loss 0.5500 auc 0.6500"


def test_the_ps_jobs_events_drive_the_bars_and_the_log_keeps_their_readable_lines(tmp_path):
    screen, log = (tmp_path / "screen").open("w"), (tmp_path / "log").open("w")
    console = RunConsole(screen, log, verbose=False, period_s=0, dataset_step="merge-data",
                         dataset_stats=lambda: {"rows": {"train": 1000}})
    progress = {"role": "worker", "index": 0, "epoch": 1, "examples": 400, "examples_per_s": 200.0, "loss": 0.5,
                "auc": 0.6}
    console.take(f"    @progress {json.dumps(progress)}")
    console.take('    @progress {"role": "server", "index": 0, "state": "saving", "rows": 5000, "rows_per_s": 100.0}')
    console.take('    @epoch {"epoch": 1, "examples": 1000, "seconds": 2.5, "auc": 0.61}')
    screen.close(), log.close()
    assert (tmp_path / "screen").read_text().splitlines() == [
        "  epoch 1: 400/1,000 examples (40%), 200 ex/s, ETA 0:03, loss 0.5000 auc 0.6000",
        "  epoch 1: 1,000/1,000 examples (100%) in 2.5s, 400 ex/s, train AUC 0.6100 (all workers)"]
    assert (tmp_path / "log").read_text().splitlines() == [
        "    [worker 0] epoch 1 | 400 examples | 200 ex/s | loss 0.5000 | auc 0.6000",
        "    [server 0] saving: 5,000 rows written (100 rows/s)",
        "    == epoch 1 done: 1,000 examples in 2.5s, global train AUC 0.6100"]


def test_verbose_shows_every_line(tmp_path):
    screen, log = (tmp_path / "screen").open("w"), (tmp_path / "log").open("w")
    quiet = RunConsole(screen, log, verbose=False, period_s=5, dataset_step="merge-data", dataset_stats=lambda: None)
    quiet.take("    [KFP Executor 2026-12-01 10:05:25,560 INFO]: Looking for component `train`")
    loud = RunConsole(screen, log, verbose=True, period_s=5, dataset_step="merge-data", dataset_stats=lambda: None)
    loud.take("    effective config:")
    screen.close(), log.close()
    assert (tmp_path / "screen").read_text() == "    effective config:\n"
    assert (tmp_path / "log").read_text().count("\n") == 2


def test_a_restart_of_the_ps_job_is_shown_as_its_one_line(tmp_path):
    screen, log = (tmp_path / "screen").open("w"), (tmp_path / "log").open("w")
    console = RunConsole(screen, log, verbose=False, period_s=5, dataset_step="merge-data", dataset_stats=lambda: None)
    restart = ("restart 1 of 2: PS job b28056af3918: worker-0 exited with code -9 (killed by SIGKILL); attempt 2 of 3 "
               "resuming from checkpoint c1 (after pass 1, 160,000 examples); at least 87,424 examples to train again "
               "(7s of training lost)")
    console.take(f"    {restart}")
    console.take("    PS job b28056af3918: 1 server(s) + 1 worker(s), mode async, logs in /r/logs")  # not shown
    screen.close(), log.close()
    assert (tmp_path / "screen").read_text() == f"  {restart}\n"


@pytest.mark.parametrize("overrides, plaintext", [
    ({"cluster": {"backend": "paddlejob"}}, True),  # pods across nodes, no terminator there, no mesh
    ({"cluster": {"backend": "jobset"}}, False),  # each role behind its terminator
    ({"cluster": {"backend": "jobset", "mesh_encryption": True}}, False),
    ({}, False),  # local roles on loopback
])
def test_the_run_header_says_when_the_ps_plane_crosses_hosts_in_plaintext(overrides, plaintext):
    from omegaconf import OmegaConf

    from components.config import CtrConfig, from_dict
    from pipelines.console import header_lines

    cfg = from_dict(OmegaConf.merge(OmegaConf.structured(CtrConfig), overrides))
    said = [line for line in header_lines(cfg) if "plaintext" in line]
    assert len(said) == int(plaintext)
    if plaintext:
        assert said[0].strip().startswith("warning: ps.tls=auto: the PS plane")
