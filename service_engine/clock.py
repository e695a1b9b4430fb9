"""Timestamp and the clock the engine reads it from."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol


@dataclass(frozen=True, slots=True, order=True)
class Timestamp:
    """An instant in UTC truncated to microseconds at construction.

    PostgreSQL's ``timestamptz`` stores microseconds, so every `Timestamp`
    round-trips through the database equal to itself. A naive datetime is
    refused: an instant without a zone is ambiguous.
    """

    value: datetime

    def __post_init__(self) -> None:
        if self.value.tzinfo is None:
            raise ValueError("Timestamp needs an aware datetime")
        # datetime already carries microseconds at most; normalising the zone
        # is what makes two equal instants compare and hash equal.
        object.__setattr__(self, "value", self.value.astimezone(UTC))

    @classmethod
    def now(cls) -> Timestamp:
        return cls(datetime.now(UTC))

    @classmethod
    def from_epoch_micros(cls, micros: int) -> Timestamp:
        return cls(datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=micros))

    @property
    def epoch_micros(self) -> int:
        delta = self.value - datetime(1970, 1, 1, tzinfo=UTC)
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds

    def __add__(self, other: timedelta) -> Timestamp:
        return Timestamp(self.value + _whole_micros(other))

    def __sub__(self, other: timedelta) -> Timestamp:
        return Timestamp(self.value - _whole_micros(other))

    def isoformat(self) -> str:
        return self.value.isoformat()


def _whole_micros(delta: timedelta) -> timedelta:
    return timedelta(microseconds=round(delta / timedelta(microseconds=1)))


class Clock(Protocol):
    """Where the engine reads the current instant (a driven clock in tests)."""

    def now(self) -> Timestamp: ...


class SystemClock:
    """The wall clock."""

    def now(self) -> Timestamp:
        return Timestamp.now()
