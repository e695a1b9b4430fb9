"""The command layer's named errors.

A malformed declaration fails registration (boot) with one of the
`DeclarationError` subclasses below, each naming the command or entity and
the clause at fault, the way a contract compiler refuses a contract. They
are `ConfigError`s: the fix is in the declaration, never at run time.
"""

from __future__ import annotations

from ..errors import ConfigError

__all__ = [
    "BindingError",
    "ClauseOrderError",
    "DeclarationError",
    "DeletePolicyError",
    "DuplicateName",
    "IdempotencyDeclarationError",
    "MissingOutcome",
    "MissingRelationshipProof",
    "PartitionRouteMismatch",
    "RouteIdentifiesRow",
    "ServiceValueError",
    "UnboundReference",
    "UniqueKeyOutsidePartition",
    "UnknownName",
    "WorkflowError",
]


class DeclarationError(ConfigError):
    """A command, entity or workflow declaration the layer refuses."""


class ClauseOrderError(DeclarationError):
    """A clause out of the visible order: inputs and service values, the
    idempotency key, bindings, requirements, effects, return."""


class DuplicateName(DeclarationError):
    """Two declarations share a name in one namespace (an input and a
    binding of one command, two outcomes of one command, two entities)."""


class UnknownName(DeclarationError):
    """A clause names an entity, field, input, index, workflow or transition
    that is not declared."""


class UnboundReference(DeclarationError):
    """A clause observes a name bound only later (or never): bind everything
    a requirement or effect observes before writing it."""


class BindingError(DeclarationError):
    """A binding key that is not the entity's complete key, or derives from
    something other than inputs, service values, principal facts or constants."""


class PartitionRouteMismatch(DeclarationError):
    """The create/mutate bindings of one command derive different partition
    routes: a command writes inside one partition only."""


class UniqueKeyOutsidePartition(DeclarationError):
    """A unique key that does not begin with the entity's partition route
    (uniqueness is enforced inside one partition)."""


class RouteIdentifiesRow(DeclarationError):
    """An entity with a unique key or reverse index whose partition route is
    its whole key: every partition holds one row, so the index is vacuous."""


class MissingRelationshipProof(DeclarationError):
    """A create or mutation affects a required relationship without a
    dominating exact read of its complete target key."""


class DeletePolicyError(DeclarationError):
    """A delete policy incomplete or inconsistent with the declared
    relationships (or a delete of an entity that declares none)."""


class WorkflowError(DeclarationError):
    """A workflow that does not close its state graph, a transition outside
    it, or a write of a workflow state outside a revision-checked transition."""


class MissingOutcome(DeclarationError):
    """A clause that can refuse declares no typed outcome for it, or an
    outcome name is not an identifier."""


class IdempotencyDeclarationError(DeclarationError):
    """An idempotency key that is not a declared string input, or declared twice."""


class ServiceValueError(DeclarationError):
    """A service value of an unknown kind, or in a command that is not a
    durably idempotent mutation (service values need both)."""
