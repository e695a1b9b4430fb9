"""`CommandConfig`: the command layer's bounds, validated at construction."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from ..failures import ConfigError

__all__ = [
    "MAX_IDEMPOTENCY_RETENTION",
    "MIN_IDEMPOTENCY_RETENTION",
    "CommandConfig",
]

MIN_IDEMPOTENCY_RETENTION = timedelta(minutes=1)
MAX_IDEMPOTENCY_RETENTION = timedelta(days=30)


class CommandConfig(BaseModel):
    """How long an idempotency record answers retries, and how much one sweep removes.

    ``idempotency_retention`` (1 minute to 30 days, default a day): a retry
    within it gets the stored outcome; past it the key is free again and the
    record is swept. ``sweep_batch`` (1 to 100 000) bounds one sweep's delete.
    A bad bound raises `ConfigError` naming it.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    idempotency_retention: timedelta = timedelta(days=1)
    sweep_batch: int = 1000

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            problems = "; ".join(
                str(e["msg"]).removeprefix("Value error, ") for e in exc.errors()
            )
            raise ConfigError(f"invalid CommandConfig: {problems}") from exc

    @model_validator(mode="after")
    def _bounds(self) -> Self:
        if not MIN_IDEMPOTENCY_RETENTION <= self.idempotency_retention <= MAX_IDEMPOTENCY_RETENTION:
            raise ValueError(
                f"idempotency_retention must be between {MIN_IDEMPOTENCY_RETENTION} and "
                f"{MAX_IDEMPOTENCY_RETENTION}, got {self.idempotency_retention}"
            )
        if not 1 <= self.sweep_batch <= 100_000:
            raise ValueError(f"sweep_batch must be 1..100000, got {self.sweep_batch}")
        return self
