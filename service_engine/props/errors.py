"""The property contract's failures: ``{error_code, message}`` with an rc.

Every refusal a props verb answers with is a `PropsError`. Its
``error_code`` is one of the closed vocabulary below, its ``rc`` follows
from the code (10: the caller's request was refused; 20: the service could
not do it), and ``extra`` carries the code's additional fields
(``expected_version``/``current_version``, ``since_nseq``/``oldest_nseq``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypeAlias

from ..failures import ConfigError, EngineError

ErrorCode: TypeAlias = Literal[
    "auth_denied",
    "not_found",
    "validation_error",
    "conflict",
    "version_mismatch",
    "replay_window_exceeded",
    "grant_failed",
    "storage_error",
    "hook_error",
    "unavailable",
]

RC_OK = 0
RC_REFUSED = 10
RC_FAILED = 20

ERROR_RC: Mapping[str, int] = {
    "auth_denied": RC_REFUSED,
    "not_found": RC_REFUSED,
    "validation_error": RC_REFUSED,
    "conflict": RC_REFUSED,
    "version_mismatch": RC_REFUSED,
    "replay_window_exceeded": RC_REFUSED,
    "grant_failed": RC_REFUSED,
    "storage_error": RC_FAILED,
    "hook_error": RC_FAILED,
    "unavailable": RC_FAILED,
}
"""The closed vocabulary: each ``error_code`` and the rc it answers with."""

# Diagnostic prefixes carried in ``validation_error`` messages.
FLAT_PATH_MUTATION_DEFERRED = "flat_path_mutation_deferred"
FIELD_PATH_DEFERRED = "field_path_deferred"
GET_PROJECTION_DEFERRED = "get_projection_deferred"
LIST_OPTION_DEFERRED = "list_option_deferred"


class PropsError(EngineError):
    """A props verb refused or failed; answer the caller with `body()` and `rc`."""

    def __init__(self, code: ErrorCode, message: str, **extra: Any) -> None:
        if code not in ERROR_RC:
            raise ConfigError(f"unknown props error_code {code!r}")
        super().__init__(f"{code}: {message}")
        self.error_code: ErrorCode = code
        self.message = message
        self.extra = extra

    @property
    def rc(self) -> int:
        return ERROR_RC[self.error_code]

    def body(self) -> dict[str, Any]:
        """The failure body: ``{error_code, message}`` plus the code's extra fields."""
        return {"error_code": self.error_code, "message": self.message, **self.extra}


def validation(prefix: str | None, message: str) -> PropsError:
    """A ``validation_error`` whose message starts with ``prefix:`` when given."""
    return PropsError("validation_error", f"{prefix}: {message}" if prefix else message)


class HookRejected(Exception):
    """Raise from a namespace hook to reject a write as ``validation_error``.

    Any other exception a hook raises is an operational failure and answers
    ``hook_error``.
    """


class PropsStoreError(EngineError):
    """A store's storage failed (answered as ``storage_error``)."""


class PropsSchemaMismatch(PropsStoreError):
    """An existing SQLite database holds a props table whose DDL is not the
    frozen definition: the file was written by something else."""

    def __init__(self, table: str, found: str) -> None:
        super().__init__(f"props table {table} has unexpected DDL: {found!r}")
        self.table = table
        self.found = found
