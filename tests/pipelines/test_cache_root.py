"""Where a local run keeps kfp.local's step cache (pipelines.local.local_cache_root): above the dated run directories
conf/config.yaml composes, so a rerun on another day reuses the prepared data."""

from pathlib import Path

from hydra import compose, initialize_config_dir

from components.config import from_dict, register_configs
from pipelines.local import local_config
from tests.conftest import CONF, compose_config


def _hydra_dirs():
    """``hydra.run`` and ``hydra.sweep`` as conf/config.yaml composes them today (relative to the working directory)."""
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", return_hydra_config=True).hydra


def _cache_root(run_dir: Path, *overrides: str) -> str:
    return local_config(from_dict(compose_config(run_dir, *overrides))).cluster.local_cache_root


def test_runs_of_different_days_share_one_cache_root_under_outputs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    hydra = _hydra_dirs()
    today = Path(hydra.run.dir)  # outputs/<date>/<time>-<token>
    another_day = today.parent.with_name("2027-01-31") / "09-30-00-000001"
    assert today.parts[0] == "outputs" and today.parent != another_day.parent
    assert _cache_root(today) == _cache_root(another_day) == str(tmp_path / "outputs" / ".kfp-cache")
    # A sweep's jobs, today's and another day's, share theirs likewise.
    sweep = Path(hydra.sweep.dir)  # multirun/<date>/<time>-<token>, each job in <job number>/
    later_sweep = sweep.parent.with_name("2027-01-31") / "09-30-00-000001"
    assert _cache_root(sweep / "0") == _cache_root(later_sweep / "1") == str(tmp_path / "multirun" / ".kfp-cache")


def test_a_run_dir_outside_the_dated_layout_or_a_given_root_keeps_its_own(tmp_path):
    assert _cache_root(tmp_path / "runs" / "first") == str(tmp_path / "runs" / ".kfp-cache")
    given = tmp_path / "cache"
    assert _cache_root(tmp_path / "outputs" / "2026-12-05" / "x", f"cluster.local_cache_root={given}") == str(given)
