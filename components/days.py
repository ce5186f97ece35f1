"""Day partitions: the names in ``data.days``, their order, and the input of one day.

Ads and recommendation models are trained day by day: each day's logs are a partition of the input
(``data.uri`` holds a ``{day}`` placeholder), and a run trains the days in order, each continuing the model the
day before delivered (README: day-by-day training). A day's name is substituted into the URI as it is written
(``2026-11-01``, ``3``, ``dt=20261101``); an item ``<first>..<last>`` of ``data.days`` is every day of that
range, for dates (``2026-11-01..2026-11-07``, ``20261101..20261107``, with a common prefix such as ``dt=``) and
for integers (``0..6``).
"""

from __future__ import annotations

import datetime as _dt
import re
from typing import Iterable, Optional

DAY_PLACEHOLDER = "{day}"
_RANGE = re.compile(r"^(?P<first>.+?)\.\.(?P<last>.+)$")
_DATE = re.compile(r"^(?P<prefix>.*?)(?P<date>\d{4}-\d{2}-\d{2}|\d{8})$")
_DATE_FORMATS = ("%Y-%m-%d", "%Y%m%d")
_NUMBER_RUNS = re.compile(r"(\d+)")
MAX_RANGE_DAYS = 10_000


class DayError(ValueError):
    """A day list that cannot be trained in order; the message names the day."""


def day_uri(uri: str, day: str) -> str:
    """``uri`` with its ``{day}`` placeholder replaced by ``day`` (only that placeholder: a URI may hold braces)."""
    return uri.replace(DAY_PLACEHOLDER, str(day))


def is_daily(uri: Optional[str]) -> bool:
    return bool(uri) and DAY_PLACEHOLDER in uri  # type: ignore[operator]


def day_of(cfg) -> Optional[str]:
    """The day a run of ``cfg`` (a :class:`components.config.CtrConfig`) trains; None without day partitions."""
    return str(cfg.data.day) if is_daily(cfg.data.uri) and cfg.data.day is not None else None


def _parse_date(text: str) -> Optional[tuple[str, _dt.date, str]]:
    """``(prefix, date, format)`` of a name ending in a date, else None."""
    found = _DATE.match(text)
    if not found:
        return None
    for fmt in _DATE_FORMATS:
        try:
            return found["prefix"], _dt.datetime.strptime(found["date"], fmt).date(), fmt
        except ValueError:
            continue
    return None


def _expand_range(item: str, first: str, last: str) -> list[str]:
    if first.isdigit() and last.isdigit():
        start, stop, width = int(first), int(last), len(first) if first.startswith("0") and len(first) > 1 else 0
        names = [str(n).zfill(width) for n in range(start, stop + 1)]
    else:
        a, b = _parse_date(first), _parse_date(last)
        if a is None or b is None or a[0] != b[0] or a[2] != b[2]:
            raise DayError(f"day range {item!r}: both ends must be integers, or dates written alike "
                           "(2026-11-01..2026-11-07, 20261101..20261107, dt=20261101..dt=20261107)")
        prefix, start_date, fmt = a
        count = (b[1] - start_date).days + 1
        names = [prefix + (start_date + _dt.timedelta(days=n)).strftime(fmt) for n in range(max(count, 0))]
    if not names:
        raise DayError(f"day range {item!r} is empty: its first day comes after its last")
    if len(names) > MAX_RANGE_DAYS:
        raise DayError(f"day range {item!r} holds {len(names)} days; at most {MAX_RANGE_DAYS}")
    return names


def expand_days(items: Iterable) -> list[str]:
    """The day names of ``data.days``, ranges expanded; raises :class:`DayError` for an empty name, a bad range, a
    day listed twice or days out of order (naming the day)."""
    days: list[str] = []
    for raw in items:
        item = str(raw).strip()
        if not item:
            raise DayError("an empty day name")
        ranged = _RANGE.match(item)
        days += _expand_range(item, ranged["first"], ranged["last"]) if ranged else [item]
    check_order(days)
    return days


def day_key(day: str) -> tuple:
    """Sort key of a day name: dates by date, numbers by value (``9`` before ``10``), the rest as text."""
    parsed = _parse_date(day)
    if parsed is not None:
        return (0, parsed[0], parsed[1].toordinal())
    return (1, tuple(int(run) if run.isdigit() else run for run in _NUMBER_RUNS.split(day) if run))


def check_order(days: list[str]) -> None:
    for before, day in zip(days, days[1:]):
        if day == before:
            raise DayError(f"day {day!r} is listed twice")
        try:
            ordered = day_key(before) < day_key(day)
        except TypeError:  # names of different shapes (a number, then text): the order is theirs as listed
            ordered = True
        if not ordered:
            raise DayError(f"day {day!r} comes after {before!r} in data.days but sorts before it: list the days "
                           "in the order they happened")


def scheduled_day(scheduled_utc: str, day_format: str, lag_days: int) -> str:
    """The day a recurring run trains: its scheduled time (RFC 3339, UTC) minus ``lag_days``, as ``day_format``."""
    when = _dt.datetime.fromisoformat(scheduled_utc.strip().replace("Z", "+00:00"))
    return (when - _dt.timedelta(days=lag_days)).strftime(day_format)
