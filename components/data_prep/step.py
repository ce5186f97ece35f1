"""What the data-prep steps run: plain functions over :mod:`components.data_prep.prepare` (no KFP needed).

On a pipeline, data prep is three steps: ``plan-data`` lists the input and groups its units (one group per pod,
``data.prep_parallelism`` of them), ``convert-data`` runs once per group (a ``dsl.ParallelFor``, each a pool of
``data.prep_processes`` processes), ``merge-data`` joins the groups' parts into the dataset. :func:`prepare_dataset`
does all three on one machine (the compose file's ``prep`` service).

Day partitions (``data.uri`` with a ``{day}`` placeholder): the plan reads the input of ``data.day``, and the merge
compares the day with the one the checkpoint store trained last (:func:`drift_check`) before it writes the dataset.

The merge reads only the plan's items and the parts, so a pipeline caches it (and the converts) on the data settings
and the input files' fingerprints: a run that changes a training key reuses the prepared dataset.
"""

import dataclasses
from typing import Any, Callable, Optional

from components.config import CtrConfig, DataSource, DriftConfig, from_dict, ints_from_struct
from components.data_prep.distinct import DistinctCounter
from components.data_prep.drift import compare, day_summary
from components.data_prep.plan import DataPlan, plan_files, plan_synthetic
from components.data_prep.prepare import DriftCheck, convert, merge, prepare
from components.data_prep.sources import DataPrepError, Unit, group_units
from components.days import day_uri, is_daily


# checkpoint.uri -> its day ledger (components.checkpoint.days.ledger_at): data prep reads the ledger, the layers
# above it open it (data prep sits below the checkpoint store: CONTRIBUTING.md, the layout).
LedgerAt = Callable[[str], Any]


def data_plan(cfg: CtrConfig) -> DataPlan:
    """Shards: one per worker reader (``ps.workers * data.shards_per_worker``), as the launcher expects."""
    data = cfg.data
    # The counting pass also runs for the servers' admission: the memory planner reads how many ids reach it.
    common = dict(test_fraction=data.test_fraction, valid_fraction=data.valid_fraction,
                  num_shards=cfg.ps.workers * data.shards_per_worker,
                  vocab_size=cfg.table.vocab_size, seed=data.seed, negative_sample_rate=data.negative_sample_rate,
                  min_id_count=data.min_id_count, count_ids=cfg.table.admission.embedx_threshold > 0)
    if data.source is DataSource.synthetic:
        return plan_synthetic(rows=data.rows, **common)
    uri = data.uri
    if is_daily(uri):
        if data.day is None:
            raise DataPrepError(f"data.uri {uri!r} holds a {{day}} placeholder but data.day names no day: a run "
                                "trains one day of data.days (set data.day)")
        uri = day_uri(uri, data.day)
    return plan_files(uri=uri, fmt=data.format.value, max_malformed_fraction=data.max_malformed_fraction,
                      slots=list(data.slots) if data.slots else None, split=data.split.value, day=data.day,
                      processes=data.prep_processes, weight_column=data.weight_column, **common)


def plan_dataset(config: Any) -> list[dict]:
    """One item per convert task: ``{"plan": the plan without its units, "units": the units it converts,
    "processes": data.prep_processes (absent: every core)}``: all a convert task takes.

    The plan's units travel once, split over the items (a large input has thousands); :func:`merge_parts` joins
    them back.
    """
    cfg = from_dict(config)
    plan = data_plan(cfg)
    groups = group_units([Unit.from_dict(unit) for unit in plan.units], cfg.data.prep_parallelism)
    print(f"data plan: {len(plan.units)} unit(s) of {plan.source or 'synthetic data'} in {len(groups)} group(s); "
          f"fingerprint {plan.fingerprint}", flush=True)
    core = {**plan.to_dict(), "units": []}
    processes = {"processes": cfg.data.prep_processes} if cfg.data.prep_processes else {}
    # A day's merge checks its drift against the store's last day (its output depends on the store: not cached).
    drift = ({"drift": {"checkpoint_uri": cfg.checkpoint.uri, "settings": dataclasses.asdict(cfg.data.drift)}}
             if is_daily(cfg.data.uri) else {})
    return [{"plan": core, "units": [plan.units[i] for i in group], **processes, **drift} for group in groups]


def _joined(groups: list[dict]) -> DataPlan:
    units = sorted((unit for group in groups for unit in group["units"]), key=lambda unit: int(unit["index"]))
    return DataPlan.from_dict({**groups[0]["plan"], "units": units})


def convert_units(group: dict, parts_dir: str) -> None:
    """Convert one group of the plan's units into parts under ``parts_dir``. A plan that counts ids has every
    task count the whole input first (each lists it again), so that all map ids by the same counts."""
    group = ints_from_struct(group)
    plan = DataPlan.from_dict({**group["plan"], "units": group["units"]})
    convert(plan, [int(unit["index"]) for unit in plan.units], parts_dir, group.get("processes"))


def merge_parts(groups: list[dict], parts_dirs: list[str], out_dir: str, ledger_at: LedgerAt) -> dict:
    """The dataset from every group's parts; returns the Dataset artifact's metadata. It reads nothing but the plan
    and the parts (a day's drift settings travel in the plan's items: :func:`plan_dataset`), so that a pipeline
    caches it on them; a day reads the ledger ``ledger_at`` opens."""
    drift = ints_from_struct(groups[0]).get("drift")
    check = drift_check(ledger_at(drift["checkpoint_uri"]), DriftConfig(**drift["settings"])) if drift else None
    return dataset_metadata(merge(_joined(groups), parts_dirs, out_dir, check))


def prepare_dataset(config: Any, out_dir: str, ledger_at: LedgerAt, processes: Optional[int] = None) -> dict:
    """Build the dataset ``cfg.data`` describes into ``out_dir`` on this machine; returns the stats dict."""
    cfg = from_dict(config)
    check = drift_check(ledger_at(cfg.checkpoint.uri), cfg.data.drift) if is_daily(cfg.data.uri) else None
    return prepare(data_plan(cfg), out_dir, processes or cfg.data.prep_processes, check_drift=check)


def drift_check(ledger: Any, settings: DriftConfig) -> DriftCheck:
    """Day partitions: the check of a day's dataset against the last day ``ledger`` (the checkpoint store's
    :class:`~components.checkpoint.days.DayLedger`) trained.

    It prints each warning and returns ``stats["drift"]``: ``{"summary"`` (what the train step records for the next
    day), ``"previous_day"``, ``"warnings"``, ``"errors"}``; a day with errors raises DataPrepError with the first,
    before the dataset is written (a broken day must not train the model).
    """

    def check(stats: dict, counters: dict[str, DistinctCounter]) -> dict:
        last = ledger.last()
        previous = last.get("drift") if last else None
        summary = day_summary(stats, counters, ledger.seen_ids())
        found = compare(summary, previous, settings)
        for warning in found["warnings"]:
            print(f"warning: {warning}", flush=True)
        for error in found["errors"][1:]:
            print(f"error: {error}", flush=True)
        if found["errors"]:
            raise DataPrepError(found["errors"][0])
        return {"summary": summary, "previous_day": previous["day"] if previous else None, **found}

    return check


def dataset_metadata(stats: dict) -> dict:
    """The few stats worth showing on the Dataset artifact (the full set is ``stats.json`` inside it)."""
    meta = {"format": stats["format"], "rows": stats["rows"], "ctr": stats["ctr"]}
    if stats.get("bayes"):
        meta["bayes"] = stats["bayes"]
    if stats.get("day") is not None:
        meta["day"] = stats["day"]
    if stats.get("drift") and stats["drift"]["warnings"]:
        meta["drift_warnings"] = stats["drift"]["warnings"]
    return meta
