"""The write pipeline: contexts, the transaction around a handler, outcomes.

`run` holds the pipeline itself, `contexts` what a handler may do (`Ops`,
`Mutation`, `Bulk`, `Reaction`), `executor` the `MutationExecutor` entry point,
`outcomes` what the synchronous channel answers and `errors` the typed
failures driver errors are translated into.
"""

from __future__ import annotations

from ..db.errors import (
    ConstraintViolation,
    DatabaseError,
    DatabaseFault,
    LockTimeout,
    Stage,
    TransientConflict,
    translate_db_error,
)
from ..outbox.staging import OutboxRow
from .contexts import Bulk, Mutation, Reaction, principal_actor
from .executor import MutationExecutor
from .ops import BULK_PATH, Ops, Staged
from .outcomes import (
    DATABASE_FAULT_MESSAGE,
    MutationError,
    MutationOutcome,
    OneShot,
    SecretSpent,
    Success,
)
from .run import StageHook, flush, run_pipeline

__all__ = [
    "BULK_PATH",
    "DATABASE_FAULT_MESSAGE",
    "Bulk",
    "ConstraintViolation",
    "DatabaseError",
    "DatabaseFault",
    "LockTimeout",
    "Mutation",
    "MutationError",
    "MutationExecutor",
    "MutationOutcome",
    "OneShot",
    "Ops",
    "OutboxRow",
    "Reaction",
    "SecretSpent",
    "Stage",
    "StageHook",
    "Staged",
    "Success",
    "TransientConflict",
    "flush",
    "principal_actor",
    "run_pipeline",
    "translate_db_error",
]
