"""The whole-command proofs of a declared command, checked once its
clauses are (seeds/003; pure: no I/O).

`_Proofs` holds what the clause walk (`clauses`) bound and decides what
no single clause can: every create/mutate binding derives the same
partition route; every `Set` on an existing row carries a proof that it
loses nothing (a same-field arithmetic update, ``checked_by`` a
requirement, a caller-version fence, or ``overwrite=True``); every write
that affects a required relationship is proven by a dominating exact read
of its target; every written unique key declares its taken outcome; every
create sets each field without a default. Every refusal is a named
`CommandDeclarationError`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .checked import TransitionStep
from .declaration import Binding, Create, Entity, Mutate, Permit, Read, Require, Set
from .errors import (
    BindingError,
    CommandDeclarationError,
    MissingOutcome,
    MissingRelationshipProof,
    PartitionRouteMismatch,
    UnknownName,
    UnprovenSet,
)
from .expr import Add, And, Eq, Expr, Field, Sub, Var, references


def _init_fields(entity: Entity) -> dict[str, bool]:
    """The fields a command may set (the dataclass's init fields outside
    the key and the revision), each with whether it has a default."""
    return {
        f.name: f.default is not dataclasses.MISSING
        or f.default_factory is not dataclasses.MISSING
        for f in dataclasses.fields(entity.aggregate)
        if f.init and f.name in entity.fields
    }


def _same_field_arithmetic(clause: Set) -> bool:
    """``b.f = b.f + x`` / ``b.f - x`` (``x`` observing no binding)."""
    value = clause.value
    if not isinstance(value, Add | Sub):
        return False
    if value.left != Field(clause.binding, clause.field):
        return False
    return not any(isinstance(leaf, Field) for leaf in references(value.right))


def _fences(predicate: Expr, binding: str, revision: str) -> bool:
    """``Eq(Field(binding, revision), Var(...))`` (either side), alone or in a conjunction."""
    if isinstance(predicate, And):
        return _fences(predicate.left, binding, revision) or _fences(
            predicate.right, binding, revision
        )
    if not isinstance(predicate, Eq):
        return False
    sides = (predicate.left, predicate.right)
    return Field(binding, revision) in sides and any(isinstance(s, Var) for s in sides)


@dataclass(frozen=True, slots=True)
class _Proofs:
    """The proofs of the command ``where`` names, over its bindings: the
    entity bound under each name and the clause that bound it."""

    where: str
    bound: Mapping[str, Entity]
    binding_of: Mapping[str, Binding]

    def fail(self, error: type[CommandDeclarationError], message: str) -> CommandDeclarationError:
        return error(f"{self.where}: {message}")

    def set_proofs(
        self, sets: Sequence[tuple[Set, str]], requirements: Sequence[Require | Permit],
        transitions: Mapping[str, TransitionStep],
    ) -> None:
        """Every `Set` on an existing row carries a proof (seeds/003)."""
        checks = {r.name: r for r in requirements if isinstance(r, Require)}
        for clause, at in sets:
            what = f"set {clause.binding}.{clause.field} ({at})"
            if clause.checked_by is not None:
                requirement = checks.get(clause.checked_by)
                if requirement is None:
                    raise self.fail(UnknownName, f"{what}: checked_by {clause.checked_by!r} "
                                    "names no requirement of the command")
                if not any(isinstance(leaf, Field) and leaf.binding == clause.binding
                           for leaf in references(requirement.predicate)):
                    raise self.fail(UnprovenSet, f"{what}: checked_by {clause.checked_by} does "
                                    f"not observe {clause.binding}")
            if type(clause.overwrite) is not bool:
                raise self.fail(CommandDeclarationError, f"{what}: overwrite is a bool")
            if isinstance(self.binding_of[clause.binding], Create) or clause.overwrite:
                continue
            if clause.checked_by is not None or clause.binding in transitions:
                continue
            if _same_field_arithmetic(clause):
                continue
            revision = self.bound[clause.binding].revision
            if revision is not None and any(
                isinstance(r, Require) and _fences(r.predicate, clause.binding, revision)
                for r in requirements
            ):
                continue
            raise self.fail(
                UnprovenSet,
                f"{what} has no proof that it loses nothing: a set on an existing row needs a "
                "same-field arithmetic update, checked_by a requirement, a caller-version "
                "fence (a Transition, or a requirement comparing the revision with an input), "
                "or overwrite=True for a deliberate replacement",
            )

    def _route(self, binding: Binding) -> tuple[Expr, ...]:
        entity = self.bound[binding.as_]
        return tuple(binding.key[: len(entity.partition_by)])

    def routes(self, written: Sequence[Binding]) -> None:
        if not written:
            return
        first = written[0]
        route = self._route(first)
        for other in written[1:]:
            if self._route(other) != route:
                raise self.fail(
                    PartitionRouteMismatch,
                    f"{first.as_} routes by {route} but {other.as_} by {self._route(other)}: "
                    "every create/mutate binding derives the same complete partition route "
                    "(split a cross-partition operation into idempotent commands)",
                )

    def _field_expr(
        self, binding: Binding, set_fields: Mapping[str, Mapping[str, Expr]], name: str
    ) -> Expr | None:
        entity = self.bound[binding.as_]
        if name in entity.key:
            return binding.key[entity.key.index(name)]
        return set_fields.get(binding.as_, {}).get(name)

    def relationship_proofs(
        self, bindings: list[Binding], set_fields: Mapping[str, Mapping[str, Expr]]
    ) -> None:
        for position, binding in enumerate(bindings):
            if isinstance(binding, Read):
                continue
            entity = self.bound[binding.as_]
            changed = set(set_fields.get(binding.as_, {}))
            for rel in entity.relationships:
                if not rel.required:
                    continue
                if isinstance(binding, Mutate) and not changed & set(rel.fields):
                    continue
                exprs = tuple(self._field_expr(binding, set_fields, f) for f in rel.fields)
                proof = next(
                    (b for b in bindings[:position]
                     if isinstance(b, Read | Mutate) and b.entity == rel.target
                     and tuple(b.key) == exprs),
                    None,
                )
                if proof is None:
                    raise self.fail(
                        MissingRelationshipProof,
                        f"{binding.as_} affects {entity.name}.{rel.name} -> {rel.target}: read "
                        f"{rel.target} under exactly {rel.fields} before it (a dominating exact "
                        "read of the complete target key)",
                    )

    def unique_outcomes(
        self, written: Sequence[Binding], set_fields: Mapping[str, Mapping[str, Expr]]
    ) -> None:
        for binding in written:
            assert isinstance(binding, Mutate | Create)
            entity = self.bound[binding.as_]
            changed = set(set_fields.get(binding.as_, {}))
            for unique in entity.unique:
                touches = isinstance(binding, Create) or bool(changed & set(unique.fields))
                if touches and unique.name not in binding.taken:
                    raise self.fail(MissingOutcome, f"{binding.as_} writes unique key "
                                    f"{entity.name}.{unique.name}: declare its taken outcome")

    def creates_initialised(
        self, written: Sequence[Binding], set_fields: Mapping[str, Mapping[str, Expr]]
    ) -> None:
        for binding in written:
            if not isinstance(binding, Create):
                continue
            entity = self.bound[binding.as_]
            for name, defaulted in _init_fields(entity).items():
                if defaulted or name in entity.key:
                    continue
                if self._field_expr(binding, set_fields, name) is None:
                    raise self.fail(
                        BindingError,
                        f"create {binding.as_}: field {entity.name}.{name} is never set",
                    )
