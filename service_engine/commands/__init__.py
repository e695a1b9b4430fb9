"""The declarative command layer, on the write pipeline (seeds/003 semantics).

Declare entities and workflows once in a `Catalog`, then commands as
clauses in their visible order (inputs and service values, idempotency
key, bindings, requirements, effects, return); `Catalog.command` checks a
command at registration and a wrong declaration fails boot with a named
`CommandDeclarationError` (`NotCompilable` for what the compiler does not
translate). `CommandRunner.run` executes a checked command's compiled function in one
pipeline transaction and answers a typed `CommandOutcome` (or the
pipeline's `MutationError` for a failure of the pipeline itself).

Modules: `declaration` (the clauses and entity declarations), `expr`
(expressions, strict evaluation), `typecheck` (field types derived from
the aggregate dataclass, expression types), `check` (registration: the
`Catalog` and its entity graph), `clauses` (one command checked clause by
clause), `proofs` (what the whole command must prove), `policy` (row
policies as gates), `plan` (the run's pure steps), `outcomes`, `config`,
`rows` (the engine rows of migration 0010), `compile` (a command's
generated database function: its name, creation and call),
`function_body` (the function's PL/pgSQL body; `function_idempotency`,
`function_deletes` and `function_occupancy` its parts written apart),
`sql_expr` (the SQL of expressions and its helper functions), `install`
(the schema owner creates the functions; a pod checks them at boot),
`run` (`CommandRunner`, `run_in`: the compiled run path), `runner` (the
interpreter: the oracle the compiled functions are proven equal to),
`errors`.
"""

from __future__ import annotations

from .check import Catalog, CheckedCommand
from .config import CommandConfig
from .declaration import (
    MAX_CASCADE,
    TRANSACTION_TIME,
    UUID_V7,
    Cascade,
    CascadeEdge,
    Caused,
    Command,
    Create,
    Delete,
    Emit,
    Entity,
    IdempotencyKey,
    IndexRef,
    Input,
    Mutate,
    NoInbound,
    Outcome,
    Permit,
    Read,
    Record,
    Relationship,
    Require,
    Restrict,
    Return,
    ReverseIndex,
    RowPolicy,
    Service,
    Set,
    Transition,
    Unique,
    Unless,
    Workflow,
    WorkflowTransition,
)
from .errors import (
    BindingError,
    ClauseOrderError,
    CommandDeclarationError,
    CommandNotInstalled,
    DeletePolicyError,
    DuplicateName,
    IdempotencyDeclarationError,
    MissingOutcome,
    MissingRelationshipProof,
    NotCompilable,
    PartitionRouteMismatch,
    RouteIdentifiesRow,
    ServiceValueError,
    TypeMismatch,
    UnboundReference,
    UniqueKeyOutsidePartition,
    UnknownName,
    UnprovenSet,
    ValueMissing,
    WorkflowError,
)
from .expr import (
    INVALID,
    Add,
    And,
    Const,
    Contains,
    Eq,
    Fact,
    Field,
    Ge,
    Gt,
    Le,
    Lt,
    Ne,
    Not,
    Or,
    Row,
    Sub,
    Var,
)
from .install import assert_commands_installed, install_commands, missing_commands
from .outcomes import IDEMPOTENCY_CONFLICT, REFUSED, CommandOutcome
from .plan import InvalidInput, uuid_v7
from .policy import check_row, row_policy_gate
from .rows import sweep_idempotency
from .run import INVALID_INPUT, CommandRunner, run_in

__all__ = [
    "IDEMPOTENCY_CONFLICT",
    "INVALID",
    "INVALID_INPUT",
    "MAX_CASCADE",
    "REFUSED",
    "TRANSACTION_TIME",
    "UUID_V7",
    "Add",
    "And",
    "BindingError",
    "Cascade",
    "CascadeEdge",
    "Catalog",
    "Caused",
    "CheckedCommand",
    "ClauseOrderError",
    "Command",
    "CommandConfig",
    "CommandDeclarationError",
    "CommandNotInstalled",
    "CommandOutcome",
    "CommandRunner",
    "Const",
    "Contains",
    "Create",
    "Delete",
    "DeletePolicyError",
    "DuplicateName",
    "Emit",
    "Entity",
    "Eq",
    "Fact",
    "Field",
    "Ge",
    "Gt",
    "IdempotencyDeclarationError",
    "IdempotencyKey",
    "IndexRef",
    "Input",
    "InvalidInput",
    "Le",
    "Lt",
    "MissingOutcome",
    "MissingRelationshipProof",
    "Mutate",
    "Ne",
    "NoInbound",
    "Not",
    "NotCompilable",
    "Or",
    "Outcome",
    "PartitionRouteMismatch",
    "Permit",
    "Read",
    "Record",
    "Relationship",
    "Require",
    "Restrict",
    "Return",
    "ReverseIndex",
    "RouteIdentifiesRow",
    "Row",
    "RowPolicy",
    "Service",
    "ServiceValueError",
    "Set",
    "Sub",
    "Transition",
    "TypeMismatch",
    "UnboundReference",
    "Unique",
    "UniqueKeyOutsidePartition",
    "UnknownName",
    "Unless",
    "UnprovenSet",
    "ValueMissing",
    "Var",
    "Workflow",
    "WorkflowError",
    "WorkflowTransition",
    "assert_commands_installed",
    "check_row",
    "install_commands",
    "missing_commands",
    "row_policy_gate",
    "run_in",
    "sweep_idempotency",
    "uuid_v7",
]
