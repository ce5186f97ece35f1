"""The days a checkpoint store has trained (``DAYS.json`` beside ``LATEST``): what day-by-day training continues.

A run with day partitions (:mod:`components.days`) trains one day per PS job. When a day's job has succeeded, the
train step records it here, one entry per day in the order trained: the checkpoint the day delivered (the next day
starts from it), that day's row of ``days.csv`` (:data:`COLUMNS`), and its data's drift summary (the next day's data
prep compares against it). The ids every trained day held are kept beside it as one mergeable distinct-id counter
per slot (``DAYS/seen-<n>.npz``, bounded: :mod:`components.data_prep.distinct`), from which a day's new-id fraction
is estimated; each entry names the file that includes its own day, so a day recorded twice never counts itself.

A day is trained exactly when its entry is here: a rerun skips it, and a day killed before its entry was written is
trained again (resuming from its own last checkpoint, if it committed one).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Optional

from components.checkpoint.format import CheckpointError
from components.days import day_key

if TYPE_CHECKING:
    from components.checkpoint.store import CheckpointStore
    from components.data_prep.distinct import DistinctCounter

DAYS_FILE = "DAYS.json"
SEEN_DIR = "DAYS"
# days.csv: one row per day. eval_*: the model as it was before training on that day, scored on all of that day's
# rows (the next-day metric; empty on the first day); train_auc: of the day's last pass; table_rows and evicted_rows:
# the delivered checkpoint's; new_id_fraction: of the day's train ids, those no earlier day held; seconds: the day's
# train step.
COLUMNS = ("day", "train_rows", "eval_auc", "eval_logloss", "eval_calibration", "train_auc", "table_rows",
           "evicted_rows", "new_id_fraction", "seconds", "checkpoint")


def describe_day(row: dict[str, Any]) -> str:
    """A day's row, readable: the console's line per day and the report's table."""
    def number(key: str, spec: str = ".4f") -> str:
        return "-" if row.get(key) is None else format(row[key], spec)

    return (f"next-day auc {number('eval_auc')} (before training on it), logloss {number('eval_logloss')}, "
            f"calibration {number('eval_calibration')}; trained {row['train_rows']:,} rows, train auc "
            f"{number('train_auc')}; table {number('table_rows', ',')} rows, {number('evicted_rows', ',')} evicted; "
            f"new ids {number('new_id_fraction', '.1%')}; {number('seconds', '.1f')}s")


class DayOrderError(CheckpointError):
    """A day that cannot be trained on this store now (out of order with the days it has trained)."""


class DayLedger:
    def __init__(self, store: "CheckpointStore"):
        self.store = store

    def entries(self) -> list[dict[str, Any]]:
        """The trained days' entries, in the order trained."""
        return list((self.store.read_json(None, DAYS_FILE) or {}).get("days", []))

    def trained(self) -> list[str]:
        return [entry["day"] for entry in self.entries()]

    def entry(self, day: str) -> Optional[dict[str, Any]]:
        return next((e for e in self.entries() if e["day"] == str(day)), None)

    def last(self) -> Optional[dict[str, Any]]:
        entries = self.entries()
        return entries[-1] if entries else None

    def check_next(self, day: str) -> Optional[dict[str, Any]]:
        """Whether ``day`` may be trained now: its entry when it is trained already (skip it), None when it comes
        after every trained day. Raises :class:`DayOrderError` naming the day otherwise."""
        day, entries = str(day), self.entries()
        done = next((e for e in entries if e["day"] == day), None)
        if done is not None:
            return done
        last = entries[-1] if entries else None
        if last is not None and _sorts_before(day, last["day"]):
            raise DayOrderError(f"day {day!r} comes before day {last['day']!r}, which {self.store.display_uri} has "
                                "trained already: a store learns its days in order (train it into a new "
                                "checkpoint.uri, or drop it from data.days)")
        return None

    def plan(self, days: Iterable[str]) -> tuple[list[str], list[str]]:
        """``(days trained already, days to train)`` of ``days``, checked in order (:meth:`check_next`)."""
        trained = set(self.trained())
        done, todo = [], []
        for day in map(str, days):
            if day in trained:
                if todo:  # an untrained day before a trained one
                    raise DayOrderError(f"day {todo[0]!r} comes before day {day!r}, which {self.store.display_uri} "
                                        "has trained already: a store learns its days in order")
                done.append(day)
            else:
                self.check_next(day)
                todo.append(day)
        return done, todo

    def seen_ids(self) -> Optional[dict[str, "DistinctCounter"]]:
        """Every trained day's train ids, a counter per slot (None before the first day)."""
        last = self.last()
        return read_counters(self.store, last["seen"]) if last and last.get("seen") else None

    def record(self, row: dict[str, Any], drift: Optional[dict], day_ids: dict[str, "DistinctCounter"]) -> dict:
        """Record a trained day (replacing an entry of the same day): its ``days.csv`` row, its drift summary, and
        the union of the earlier days' ids with its own."""
        day = str(row["day"])
        entries = [e for e in self.entries() if e["day"] != day]
        seen = read_counters(self.store, entries[-1]["seen"]) if entries and entries[-1].get("seen") else None
        union = {slot: counter.copy() for slot, counter in day_ids.items()}
        for slot, counter in (seen or {}).items():
            if slot in union:
                union[slot].merge(counter)
            else:
                union[slot] = counter
        seen_rel = f"{SEEN_DIR}/seen-{len(entries):05d}.npz"
        write_counters(self.store, seen_rel, union)
        entry = {**{key: row.get(key) for key in COLUMNS}, "drift": drift, "seen": seen_rel}
        self.store.write_json(None, DAYS_FILE, {"days": entries + [entry]})
        return entry


def ledger_at(uri: str) -> DayLedger:
    """The day ledger of the checkpoint store at ``uri`` (what data prep's drift check reads)."""
    from components.checkpoint.store import CheckpointStore

    return DayLedger(CheckpointStore(uri))


def _sorts_before(day: str, other: str) -> bool:
    try:
        return day_key(day) < day_key(other)
    except TypeError:  # names of different shapes: only the list's own order tells
        return False


def write_counters(store: "CheckpointStore", rel: str, counters: dict[str, "DistinctCounter"]) -> None:
    import io

    from components.data_prep.distinct import save_counters

    buffer = io.BytesIO()
    save_counters(buffer, counters)
    store.put_bytes(rel, buffer.getvalue())


def read_counters(store: "CheckpointStore", rel: str) -> dict[str, "DistinctCounter"]:
    import io

    from components.data_prep.distinct import load_counters

    return load_counters(io.BytesIO(store.get_bytes(rel)))
