"""The command layer's named errors.

A malformed declaration fails registration (boot) with one of the
`CommandDeclarationError` subclasses below, each naming the command or
entity and the clause at fault, the way a contract compiler refuses a
contract. They are `ConfigError`s: the fix is in the declaration, never at
run time.
"""

from __future__ import annotations

from ..failures import DeclarationError, EngineError

__all__ = [
    "BindingError",
    "ClauseOrderError",
    "CommandDeclarationError",
    "CommandNotInstalled",
    "DeletePolicyError",
    "DuplicateName",
    "IdempotencyDeclarationError",
    "MissingOutcome",
    "MissingRelationshipProof",
    "NotCompilable",
    "PartitionRouteMismatch",
    "RouteIdentifiesRow",
    "ServiceValueError",
    "TypeMismatch",
    "UnboundReference",
    "UniqueKeyOutsidePartition",
    "UnknownName",
    "UnprovenSet",
    "ValueMissing",
    "WorkflowError",
]


class CommandDeclarationError(DeclarationError):
    """A command, entity or workflow declaration the layer refuses (a
    `DeclarationError`, so a `ConfigError`)."""


class ClauseOrderError(CommandDeclarationError):
    """A clause out of the visible order: inputs and service values, the
    idempotency key, bindings, requirements, effects, return."""


class DuplicateName(CommandDeclarationError):
    """Two declarations share a name in one namespace (an input and a
    binding of one command, two outcomes or requirements of one command,
    two entities); the message names both, the first by its position."""


class TypeMismatch(CommandDeclarationError):
    """An expression the declared types cannot hold: a comparison of
    unlike types, a constant outside an enum-like field's values, a `Set`
    value the field cannot store, a non-boolean requirement or policy."""


class UnprovenSet(CommandDeclarationError):
    """A `Set` on an existing row without a proof that it loses nothing:
    declare initialisation, a same-field arithmetic update, ``checked_by``,
    a caller-version fence, or ``overwrite=True`` (seeds/003)."""


class UnknownName(CommandDeclarationError):
    """A clause names an entity, field, input, index, workflow or transition
    that is not declared."""


class UnboundReference(CommandDeclarationError):
    """A clause observes a name bound only later (or never): bind everything
    a requirement or effect observes before writing it."""


class BindingError(CommandDeclarationError):
    """A binding key that is not the entity's complete key, or derives from
    something other than inputs, service values, principal facts or constants."""


class PartitionRouteMismatch(CommandDeclarationError):
    """The create/mutate bindings of one command derive different partition
    routes: a command writes inside one partition only."""


class UniqueKeyOutsidePartition(CommandDeclarationError):
    """A unique key that does not begin with the entity's partition route
    (uniqueness is enforced inside one partition)."""


class RouteIdentifiesRow(CommandDeclarationError):
    """An entity with a unique key or reverse index whose partition route is
    its whole key: every partition holds one row, so the index is vacuous."""


class MissingRelationshipProof(CommandDeclarationError):
    """A create or mutation affects a required relationship without a
    dominating exact read of its complete target key."""


class DeletePolicyError(CommandDeclarationError):
    """A delete policy incomplete or inconsistent with the declared
    relationships (or a delete of an entity that declares none)."""


class WorkflowError(CommandDeclarationError):
    """A workflow that does not close its state graph, a transition outside
    it, or a write of a workflow state outside a revision-checked transition."""


class MissingOutcome(CommandDeclarationError):
    """A clause that can refuse declares no typed outcome for it, or an
    outcome name is not an identifier."""


class IdempotencyDeclarationError(CommandDeclarationError):
    """An idempotency key that is not a declared string input, or declared twice."""


class ServiceValueError(CommandDeclarationError):
    """A service value of an unknown kind, or in a command that is not a
    durably idempotent mutation (service values need both)."""


class NotCompilable(CommandDeclarationError):
    """A declaration the command compiler does not translate into its
    database function (the message names the clause or entity and what to
    declare instead): registration refuses it, so no command reaches run
    time uncompiled."""


class CommandNotInstalled(EngineError):
    """A registered command's database function is missing: the schema
    owner has not installed this declaration (``service-engine migrate
    --commands``, or `install_commands` on the owner's connection)."""

    code = "commands_not_installed"


class ValueMissing(EngineError, TypeError):
    """A set, cause or record value evaluated to nothing when the command
    ran (a declared fact the acting principal lacks, a field its row does
    not hold): the command wrote nothing. `CommandRunner.run` answers it as
    the `MutationError` ``value_missing`` naming the clause."""

    code = "value_missing"
