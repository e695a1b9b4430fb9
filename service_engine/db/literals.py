"""SQL literals for statements that ride in another round trip.

A statement without parameters can share one simple-protocol round trip
with others (the pipeline sends the rows a handler staged in front of
COMMIT). Each value is formatted from its own type: text dollar-quoted
(no escape processing whatever the server's settings, under a tag the
value does not contain), ids, numbers, instants and intervals from their
Python values, JSON as the pool's codec encodes it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta

__all__ = ["dollar_quoted", "sql_bigint", "sql_interval", "sql_json", "sql_timestamptz",
           "sql_uuid", "sql_uuids"]


def dollar_quoted(value: str | None) -> str:
    """``value`` as a dollar-quoted SQL literal (``NULL`` for None)."""
    if value is None:
        return "NULL"
    if "\x00" in value:
        raise ValueError("a text value cannot hold NUL")
    n = 0
    while (tag := f"$m{n}$") in value or value.endswith(tag[:-1]):
        n += 1
    return f"{tag}{value}{tag}"


def sql_uuid(value: uuid.UUID | str) -> str:
    """A UUID literal (parsed first: its text is hex and dashes)."""
    return f"'{uuid.UUID(str(value))}'::uuid"


def sql_uuids(values: Iterable[uuid.UUID | str]) -> str:
    """A ``uuid[]`` literal."""
    return "ARRAY[" + ", ".join(sql_uuid(v) for v in values) + "]::uuid[]"


def sql_bigint(value: int | None) -> str:
    return "NULL::bigint" if value is None else f"{int(value):d}::bigint"


def sql_timestamptz(value: datetime) -> str:
    """An aware instant as a ``timestamptz`` literal (ISO 8601: digits,
    dashes, colons, a dot, a sign)."""
    if value.tzinfo is None:
        raise ValueError("a timestamptz literal needs an aware datetime")
    return f"'{value.isoformat()}'::timestamptz"


def sql_interval(value: timedelta) -> str:
    """An exact ``interval`` literal (days, seconds, microseconds as ints)."""
    return (f"'{value.days:d} days {value.seconds:d} seconds "
            f"{value.microseconds:d} microseconds'::interval")


def sql_json(value: object) -> str:
    """``value`` as the pool's jsonb codec encodes a parameter (compact JSON)."""
    return f"{dollar_quoted(json.dumps(value, separators=(',', ':')))}::jsonb"
