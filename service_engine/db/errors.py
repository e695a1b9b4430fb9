"""The database's typed failures, and the one place driver errors are
translated into them.

Every asyncpg error raised inside a pipeline transaction (the pipeline's own
statements, a store's SQL run through ``cx.load`` / ``cx.save`` / ...) is
turned into a `DatabaseError` by `translate_db_error` and raised ``from`` the
driver error, so a slice author branches on engine types and an operator
still finds the driver's error in the chain.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from contextlib import contextmanager

import asyncpg

from ..failures import EngineError

__all__ = [
    "ConstraintViolation",
    "DatabaseError",
    "DatabaseFault",
    "LockTimeout",
    "Stage",
    "TransientConflict",
    "is_lock_refusal",
    "translate_db_error",
    "translating",
]


class Stage(enum.Enum):
    """Where in the pipeline a statement ran (named in logs and faults)."""

    BEGIN = "begin"
    CLAIM = "claim"
    LOCK = "lock"
    LOAD = "load"
    CREATE = "create"
    SAVE = "save"
    DELETE = "delete"
    SCHEDULE = "schedule"
    FLUSH = "flush"
    COMMIT = "commit"
    LEASE = "lease"
    DEAD_LETTER = "dead_letter"
    RELAY = "relay"
    READ = "read"
    """A render-side read: attach's snapshot, a render pass, page, fetch."""


class DatabaseError(EngineError):
    """A database error inside the pipeline transaction; the transaction is lost.

    ``code`` is the `MutationError` code it answers with; ``retryable`` says
    whether running the command again may succeed; ``stage`` says where it
    happened. The driver's error is ``__cause__``. Let it propagate: the
    transaction cannot continue after it.
    """

    code = "database"
    retryable = False

    def __init__(self, message: str, stage: Stage, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.stage = stage
        self.sqlstate = sqlstate


class LockTimeout(DatabaseError):
    """A lock was not granted within ``lock_timeout`` (SQLSTATE 55P03).

    Retryable, never terminal: another command holds the aggregate.
    """

    code = "lock_timeout"
    retryable = True


class TransientConflict(DatabaseError):
    """A deadlock or serialisation failure (40P01, 40001): retry the command."""

    code = "serialization_failure"
    retryable = True


class ConstraintViolation(DatabaseError):
    """A unique, foreign-key, check, not-null or exclusion constraint refused
    the write; the state row and its events rolled back together.

    ``kind`` is ``unique``, ``foreign_key``, ``check``, ``not_null`` or
    ``exclusion``; ``constraint`` and ``table`` name what refused it (for
    logs; the client sees only the code ``<kind>_violation``).
    """

    def __init__(
        self,
        kind: str,
        constraint: str | None,
        table: str | None,
        stage: Stage,
        sqlstate: str | None,
    ) -> None:
        where = f" {constraint}" if constraint else ""
        on = f" on {table}" if table else ""
        super().__init__(f"{kind} constraint{where} violated{on}", stage, sqlstate)
        self.kind = kind
        self.constraint = constraint
        self.table = table
        self.code = f"{kind}_violation"


class DatabaseFault(DatabaseError):
    """Any other database failure: the caller sees ``mutation failed: database``.

    ``retryable`` is true for failures that say nothing about the command
    (a lost connection, the server shutting down, resources exhausted, a
    pool with no free connection).
    """

    def __init__(
        self, message: str, stage: Stage, sqlstate: str | None = None, *, retryable: bool = False
    ) -> None:
        super().__init__(message, stage, sqlstate)
        self.retryable = retryable


_CONSTRAINT_KINDS = {
    "23505": "unique",
    "23503": "foreign_key",
    "23514": "check",
    "23502": "not_null",
    "23P01": "exclusion",
}

# Connection exceptions (08), insufficient resources (53), operator
# intervention (57: shutdown, cancel, statement timeout): the command itself
# is not at fault.
_RETRYABLE_CLASSES = ("08", "53", "57")

DRIVER_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    # A connection lost mid-statement can leave the protocol in the wrong
    # state: the driver then raises this rather than a connection error.
    asyncpg.InternalClientError,
    OSError,
    TimeoutError,
)
"""What `translate_db_error` accepts: catch exactly these around driver calls."""


def is_lock_refusal(exc: BaseException) -> bool:
    """A lock timeout, deadlock or serialisation failure (all retryable)."""
    return isinstance(
        exc, asyncpg.LockNotAvailableError | asyncpg.DeadlockDetectedError
        | asyncpg.SerializationError
    )


def translate_db_error(exc: BaseException, stage: Stage) -> DatabaseError:
    """Translate a driver error raised at ``stage`` into a `DatabaseError`.

    Raise the result ``from exc``.
    """
    sqlstate = getattr(exc, "sqlstate", None)
    if not isinstance(sqlstate, str):
        sqlstate = None
    if isinstance(exc, asyncpg.LockNotAvailableError):
        return LockTimeout(f"lock not granted within lock_timeout at stage {stage.value}",
                           stage, sqlstate)
    if isinstance(exc, asyncpg.SerializationError | asyncpg.DeadlockDetectedError):
        return TransientConflict(f"transaction conflict at stage {stage.value} "
                                 f"(SQLSTATE {sqlstate})", stage, sqlstate)
    if sqlstate in _CONSTRAINT_KINDS:
        return ConstraintViolation(
            _CONSTRAINT_KINDS[sqlstate],
            getattr(exc, "constraint_name", None),
            getattr(exc, "table_name", None),
            stage,
            sqlstate,
        )
    if sqlstate is None:
        # Client side: the connection is gone or the pool had none to give.
        retryable = isinstance(exc, OSError | TimeoutError)
        return DatabaseFault(f"database fault at stage {stage.value} ({type(exc).__name__})",
                             stage, None, retryable=retryable)
    return DatabaseFault(
        f"database fault at stage {stage.value} (SQLSTATE {sqlstate})",
        stage,
        sqlstate,
        retryable=sqlstate.startswith(_RETRYABLE_CLASSES),
    )


@contextmanager
def translating(stage: Stage) -> Iterator[None]:
    """Run driver calls with their errors translated: a driver error raised in
    the block leaves it as the `DatabaseError` for ``stage``, ``from`` the
    driver error. Engine errors and everything else pass through untouched.

    ``with translating(Stage.LEASE): await conn.fetchval(...)``
    """
    try:
        yield
    except DRIVER_ERRORS as exc:
        raise translate_db_error(exc, stage) from exc
