"""Drift between days: what a day's data is, and how far it moved from the day before (README: drift checks).

Day by day, a model continues from the day before; a day whose logs broke (no clicks, a slot that stopped
arriving) would train it on garbage and deliver the result. Data prep summarises each day (:func:`day_summary`: rows,
CTR, missing values per slot, the fraction of train ids no earlier day held), the train step stores the summary in
the checkpoint store's ledger (:mod:`components.checkpoint.days`), and the next day's data prep compares against it
(:func:`compare`): a large shift is a warning, a broken day an error that stops the run before training.

Pure functions: the caller reads the ledger (:func:`components.data_prep.step.drift_check`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Optional

from components.config import DriftConfig
from components.data_prep.distinct import DistinctCounter


def new_id_fractions(today: Mapping[str, DistinctCounter],
                     seen: Optional[Mapping[str, DistinctCounter]]) -> tuple[Optional[float], dict[str, float]]:
    """``(overall, per slot)``: of today's distinct train ids, the fraction no earlier day held; ``(None, {})`` on
    the first day (``seen`` None).

    Per slot ``(|today ∪ seen| - |seen|) / |today|``, clipped to [0, 1]: exact while the counters are exact sets,
    else an estimate from sketches whose error is a fraction of the union (the ids of a slot no earlier day had are
    all new). Overall: the new ids of every slot over today's ids of every slot.
    """
    if seen is None:
        return None, {}
    fractions: dict[str, float] = {}
    new_ids = today_ids = 0
    for slot, counter in today.items():
        size = counter.count()
        before = seen.get(slot)
        union = counter.copy()
        if before is not None:
            union.merge(before)
        new = min(max(union.count() - (before.count() if before is not None else 0), 0), size)
        fractions[slot] = new / size if size else 0.0
        new_ids, today_ids = new_ids + new, today_ids + size
    return (new_ids / today_ids if today_ids else None), fractions


def day_summary(stats: Mapping, counters: Mapping[str, DistinctCounter],
                seen: Optional[Mapping[str, DistinctCounter]]) -> dict:
    """What the next day compares against (JSON-safe: the ledger stores it): the day's rows and CTR over every
    split, its missing fraction per slot (``stats["missing"]``) and its new-id fractions (``counters``: the day's
    train ids; ``seen``: every earlier day's)."""
    rows = sum(stats["rows"].values())
    # ctr is clicks / rows per split (None for an empty one): the clicks come back exactly as integers.
    clicks = sum(round(ctr * stats["rows"][split]) for split, ctr in stats["ctr"].items() if ctr is not None)
    overall, per_slot = new_id_fractions(counters, seen)
    return {"day": stats["day"], "rows": rows, "ctr": clicks / rows, "missing": dict(stats["missing"]),
            "new_id_fraction": overall, "new_id_fractions": per_slot}


def compare(summary: Mapping, previous: Optional[Mapping], drift: DriftConfig) -> dict:
    """``{"warnings": [...], "errors": [...]}``: one line each, naming the day, the slot and the numbers.

    Warnings: rows or CTR moved by more than ``drift.max_rows_change`` / ``max_ctr_change`` (relative), or a slot's
    new-id or missing fraction by more than ``max_new_id_change`` / ``max_missing_change`` (absolute). Errors: a day
    without a click (the first day too), a slot missing in every row that the day before had; ``allow_no_clicks`` /
    ``allow_missing_slot`` turn them into warnings. ``previous``: the day before's summary (None: the first day).
    """
    day = summary["day"]
    warnings: list[str] = []
    errors: list[str] = []
    no_clicks = summary["ctr"] == 0
    if no_clicks:
        message = f"day {day!r} has no clicks in its {summary['rows']} rows"
        if drift.allow_no_clicks:
            warnings.append(f"{message} (data.drift.allow_no_clicks=true: training anyway)")
        else:
            errors.append(f"{message}; a broken log pipeline? set data.drift.allow_no_clicks=true to train anyway")
    if previous is None:
        return {"warnings": warnings, "errors": errors}
    before = previous["day"]
    change = _relative_change(summary["rows"], previous["rows"])
    if change is not None and abs(change) > drift.max_rows_change:
        warnings.append(f"day {day!r}: {summary['rows']} rows, {change:+.1%} from {previous['rows']} on day "
                        f"{before!r} (data.drift.max_rows_change={drift.max_rows_change:g})")
    change = _relative_change(summary["ctr"], previous["ctr"])
    if not no_clicks and change is not None and abs(change) > drift.max_ctr_change:
        warnings.append(f"day {day!r}: CTR {summary['ctr']:.4f}, {change:+.1%} from {previous['ctr']:.4f} on day "
                        f"{before!r} (data.drift.max_ctr_change={drift.max_ctr_change:g})")
    for slot, fraction in summary["new_id_fractions"].items():
        earlier = previous["new_id_fractions"].get(slot)
        if earlier is not None and abs(fraction - earlier) > drift.max_new_id_change:
            warnings.append(f"day {day!r}: slot {slot}: {fraction:.1%} of its train ids are new ({earlier:.1%} on day "
                            f"{before!r}; data.drift.max_new_id_change={drift.max_new_id_change:g})")
    for slot, fraction in summary["missing"].items():
        earlier = previous["missing"].get(slot)
        if earlier is None:
            continue
        if fraction == 1.0 and earlier < 1.0:
            message = f"day {day!r}: slot {slot} is missing in every row ({earlier:.1%} missing on day {before!r})"
            if drift.allow_missing_slot:
                warnings.append(f"{message} (data.drift.allow_missing_slot=true: training anyway)")
            else:
                errors.append(f"{message}; a broken log pipeline? set data.drift.allow_missing_slot=true to train "
                              "anyway")
        elif abs(fraction - earlier) > drift.max_missing_change:
            warnings.append(f"day {day!r}: slot {slot} is missing in {fraction:.1%} of rows ({earlier:.1%} on day "
                            f"{before!r}; data.drift.max_missing_change={drift.max_missing_change:g})")
    return {"warnings": warnings, "errors": errors}


def _relative_change(value: float, previous: float) -> Optional[float]:
    """``value / previous - 1``; None when the day before had none (no change is relative to nothing)."""
    return value / previous - 1 if previous else None
