"""The day-by-day table and plot (``days.csv``, ``days.png``): one row per trained day, from the store's ledger
(:mod:`components.checkpoint.days`, whose :data:`~components.checkpoint.days.COLUMNS` are the CSV's)."""

from __future__ import annotations

import csv
import os
from typing import Any, Mapping, Sequence

import numpy as np

from components.checkpoint.days import COLUMNS, describe_day
from components.evaluate.report import _figure, _save_png

DAYS_CSV, DAYS_PNG = "days.csv", "days.png"


def write_days_csv(path: str | os.PathLike[str], entries: Sequence[Mapping[str, Any]]) -> None:
    with open(path, "w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for entry in entries:
            writer.writerow({key: "" if entry.get(key) is None else entry[key] for key in COLUMNS})


def write_days_png(path: str | os.PathLike[str], entries: Sequence[Mapping[str, Any]]) -> None:
    """Next-day AUC and train AUC; next-day logloss; new-id fraction and table rows, against the day."""
    days = [str(e["day"]) for e in entries]
    x = np.arange(len(days))

    def column(key: str) -> np.ndarray:
        return np.array([np.nan if e.get(key) is None else float(e[key]) for e in entries])

    figure = _figure((12, 3.8))
    auc_axes, loss_axes, ids_axes = figure.subplots(1, 3)
    auc_axes.plot(x, column("eval_auc"), marker="o", label="next day (before training on it)")
    auc_axes.plot(x, column("train_auc"), marker=".", linestyle="--", label="train (last pass)")
    auc_axes.set_title("AUC")
    auc_axes.legend(loc="best")
    loss_axes.plot(x, column("eval_logloss"), marker="o")
    loss_axes.set_title("Next-day logloss")
    ids_axes.plot(x, column("new_id_fraction"), marker="o", color="tab:green")
    ids_axes.set_title("New-id fraction (green) and table rows")
    rows_axes = ids_axes.twinx()
    rows_axes.plot(x, column("table_rows"), marker=".", color="tab:gray")
    for axes in (auc_axes, loss_axes, ids_axes):
        axes.set_xticks(x, days, rotation=45 if len(days) > 8 else 0)
        axes.set_xlabel("Day")
        axes.grid(alpha=0.3)
    _save_png(figure, path)


def day_rows(entries: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """The report's day table: day -> its row, readable."""
    return {str(e["day"]): describe_day(e) for e in entries}
