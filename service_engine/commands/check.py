"""Registration checks: a `Catalog` of entities and workflows, and the
checked form of each command (pure: no I/O).

`Catalog(entities, workflows)` checks the entity graph (keys, partition
routes, unique keys, relationships, reverse indexes, delete policies,
workflows); `Catalog.command(decl)` checks one command clause by clause in
its visible order (`clauses`), then the proofs no single clause gives
(`proofs`), and answers the `CheckedCommand` the runner executes. Every
refusal is a named `CommandDeclarationError`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from types import MappingProxyType

from .checked import CheckedCommand, DeleteStep, TransitionStep
from .clauses import _CommandChecker, _identifier, _typed
from .compile import compiled
from .declaration import (
    MAX_CASCADE,
    Cascade,
    Command,
    Entity,
    NoInbound,
    Relationship,
    Restrict,
    Workflow,
)
from .errors import (
    BindingError,
    CommandDeclarationError,
    DeletePolicyError,
    DuplicateName,
    RouteIdentifiesRow,
    TypeMismatch,
    UniqueKeyOutsidePartition,
    UnknownName,
    WorkflowError,
)
from .expr import Expr, Field, Row, Var, is_expr, references
from .typecheck import TypeScope, ValueType, admits, value_type

__all__ = ["Catalog", "CheckedCommand", "DeleteStep", "TransitionStep"]


class Catalog:
    """The entities and workflows commands are declared over, checked once.

    ``facts`` declares the principal facts a `Fact` may read, with their
    types (``{"org": str | None, "admin": bool}``): an undeclared or
    mistyped fact is refused at registration.
    """

    def __init__(
        self, entities: Iterable[Entity], workflows: Iterable[Workflow] = (),
        facts: Mapping[str, object] | None = None,
    ) -> None:
        by_name: dict[str, Entity] = {}
        for n, entity in enumerate(entities, start=1):
            if not isinstance(entity, Entity):
                raise CommandDeclarationError(f"not an Entity: {entity!r}")
            _identifier("an entity name", entity.name)
            if entity.name in by_name:
                first = list(by_name).index(entity.name) + 1
                raise DuplicateName(f"entity {entity.name} (entity #{n}): the name is first "
                                    f"declared by entity #{first}")
            by_name[entity.name] = entity
        self.entities: Mapping[str, Entity] = MappingProxyType(by_name)
        flows: dict[str, Workflow] = {}
        for n, workflow in enumerate(workflows, start=1):
            _identifier("a workflow name", workflow.name)
            if workflow.name in flows:
                first = list(flows).index(workflow.name) + 1
                raise DuplicateName(f"workflow {workflow.name} (workflow #{n}): the name is "
                                    f"first declared by workflow #{first}")
            flows[workflow.name] = workflow
        self.workflows: Mapping[str, Workflow] = MappingProxyType(flows)
        declared: dict[str, ValueType] = {}
        for name, annotation in (facts or {}).items():
            _identifier("a principal fact", name)
            declared[name] = value_type(annotation)
        self.facts: Mapping[str, ValueType] = MappingProxyType(declared)
        for entity in by_name.values():
            self._check_entity(entity)
        for entity in by_name.values():
            self._check_delete_policy(entity)
        for workflow in flows.values():
            self._check_workflow(workflow)

    # -- entities -------------------------------------------------------------

    def _check_entity(self, e: Entity) -> None:
        where = f"entity {e.name}"
        if not isinstance(e.aggregate, type) or getattr(e.aggregate, "Store", None) is None:
            raise CommandDeclarationError(f"{where}: aggregate must be a class naming a Store")
        if not dataclasses.is_dataclass(e.aggregate) or not e.types:
            raise CommandDeclarationError(
                f"{where}: aggregate {e.aggregate.__qualname__} must be a dataclass with "
                "annotated fields (its fields and their types are the entity's)"
            )
        if not e.key:
            raise BindingError(f"{where}: declares no key")
        _unique_names(where + " key", e.key)
        missing = [name for name in (*e.key, *(() if e.revision is None else (e.revision,)))
                   if name not in e.types]
        if missing:
            raise UnknownName(f"{where}: {e.aggregate.__qualname__} has no typed field "
                              f"{missing} (fields {sorted(e.types)})")
        if tuple(e.key[: len(e.partition_by)]) != tuple(e.partition_by):
            raise BindingError(f"{where}: partition_by {e.partition_by} is not a prefix of the "
                               f"key {e.key}")
        if not e.conflict_fields or not set(e.conflict_fields) <= set(e.key):
            raise BindingError(f"{where}: conflict_key {e.conflict_fields} must be key fields")
        uncovered = [f for f in e.key if f not in e.partition_by and f not in e.conflict_fields]
        if uncovered:
            raise BindingError(
                f"{where}: key fields {uncovered} are in neither partition_by "
                f"{e.partition_by} nor conflict_key {e.conflict_fields}: the store key is the "
                "complete key (route + conflict key)"
            )
        known = set(e.all_fields)
        if e.revision is not None and e.revision in e.key:
            raise CommandDeclarationError(
                f"{where}: the revision {e.revision!r} cannot be a key field"
            )
        if e.revision is not None and (e.types[e.revision].base is not int
                                       or e.types[e.revision].optional):
            raise CommandDeclarationError(f"{where}: the revision {e.revision!r} must be an int "
                                          f"field, is {e.types[e.revision].describe()}")
        seen: dict[str, str] = {}
        for n, unique in enumerate(e.unique, start=1):
            _identifier(f"{where}: a unique key name", unique.name)
            if unique.name in seen:
                raise DuplicateName(f"{where}: unique key {unique.name} (unique #{n}): the name "
                                    f"is first declared by {seen[unique.name]}")
            seen[unique.name] = f"unique #{n}"
            missing = [f for f in unique.fields if f not in known]
            if missing:
                raise UnknownName(f"{where}: unique {unique.name} names unknown fields {missing}")
            if tuple(unique.fields[: len(e.partition_by)]) != tuple(e.partition_by) or len(
                unique.fields
            ) <= len(e.partition_by):
                raise UniqueKeyOutsidePartition(
                    f"{where}: unique {unique.name} {unique.fields} must begin with the "
                    f"partition route {e.partition_by} (and add a field to it)"
                )
        for n, index in enumerate(e.indexes, start=1):
            _identifier(f"{where}: an index name", index.name)
            if index.name in seen:
                raise DuplicateName(f"{where}: index {index.name} (index #{n}): the name is "
                                    f"first declared by {seen[index.name]}")
            seen[index.name] = f"index #{n}"
            missing = [f for f in index.fields if f not in known]
            if missing:
                raise UnknownName(f"{where}: index {index.name} names unknown fields {missing}")
            if len(index.sql_columns) != len(index.fields):
                raise CommandDeclarationError(
                    f"{where}: index {index.name} columns do not match fields"
                )
            if index.key_columns is not None and len(index.key_columns) != len(e.key):
                raise CommandDeclarationError(
                    f"{where}: index {index.name} key_columns must hold the key {e.key}"
                )
        if (e.unique or e.indexes) and set(e.partition_by) == set(e.key):
            raise RouteIdentifiesRow(
                f"{where}: partition_by {e.partition_by} is the whole key, so each partition "
                "holds one row and its unique keys and indexes are vacuous; partition by the "
                "scope it is searched within and keep the row id in the conflict key"
            )
        rels: dict[str, int] = {}
        for n, rel in enumerate(e.relationships, start=1):
            _identifier(f"{where}: a relationship name", rel.name)
            if rel.name in rels:
                raise DuplicateName(f"{where}: relationship {rel.name} (relationship #{n}): the "
                                    f"name is first declared by relationship #{rels[rel.name]}")
            rels[rel.name] = n
            target = self.entities.get(rel.target)
            if target is None:
                raise UnknownName(f"{where}: relationship {rel.name} targets unknown entity "
                                  f"{rel.target!r}")
            if len(rel.fields) != len(target.key):
                raise BindingError(
                    f"{where}: relationship {rel.name} must reference the complete key "
                    f"{target.key} of {target.name}, got {rel.fields}"
                )
            missing = [f for f in rel.fields if f not in known]
            if missing:
                raise UnknownName(f"{where}: relationship {rel.name} names unknown fields "
                                  f"{missing}")
        for kind, policy in (("create", e.create_policy), ("update", e.update_policy),
                             ("delete", e.delete_row_policy)):
            if policy is None:
                continue
            if not is_expr(policy.predicate):
                raise CommandDeclarationError(f"{where}: the {kind} row policy is not an "
                                              f"expression: {policy.predicate!r}")
            for leaf in references(policy.predicate):
                if isinstance(leaf, Var | Field):
                    raise CommandDeclarationError(
                        f"{where}: a row policy observes the row (Row), principal facts "
                        f"(Fact) and constants, not {leaf!r}"
                    )
                if isinstance(leaf, Row) and leaf.name not in known:
                    raise UnknownName(f"{where}: a row policy reads unknown field {leaf.name!r}")
            scope = TypeScope({}, {}, self.facts, row=self._row_types(e))
            _typed_bool(scope, policy.predicate, f"{where}: the {kind} row policy")

    def _row_types(self, e: Entity) -> dict[str, ValueType]:
        """The entity's field types, a workflow state's closed to its states."""
        found = dict(e.types)
        for w in self.workflows.values():
            if w.entity == e.name and w.state in found:
                found[w.state] = found[w.state].with_domain(frozenset(w.states))
        return found

    def inbound(self, target: str) -> list[tuple[Entity, Relationship]]:
        """Every declared relationship that targets ``target``."""
        return [
            (e, rel) for e in self.entities.values() for rel in e.relationships
            if rel.target == target
        ]

    def _check_delete_policy(self, e: Entity) -> None:
        policy = e.delete_policy
        where = f"entity {e.name}: delete policy"
        inbound = self.inbound(e.name)
        if policy is None or isinstance(policy, NoInbound):
            if isinstance(policy, NoInbound) and inbound:
                names = [f"{c.name}.{r.name}" for c, r in inbound]
                raise DeletePolicyError(f"{where} no_inbound, but {names} target it")
            return
        if isinstance(policy, Restrict):
            proven: set[tuple[str, str]] = set()
            for ref in policy.indexes:
                child = self.entities.get(ref.entity)
                index = None if child is None else child.index(ref.index)
                if child is None or index is None:
                    raise UnknownName(f"{where} restrict names unknown index "
                                      f"{ref.entity}.{ref.index}")
                matched = [r for c, r in inbound if c.name == child.name
                           and tuple(index.fields[: len(r.fields)]) == r.fields]
                if not matched:
                    raise DeletePolicyError(
                        f"{where} restrict {ref.entity}.{ref.index} is not a reverse index of a "
                        f"relationship targeting {e.name} (it must start with the "
                        "relationship's fields: the target's partition and key)"
                    )
                proven.update((child.name, r.name) for r in matched)
            missing = [f"{c.name}.{r.name}" for c, r in inbound if (c.name, r.name) not in proven]
            if missing or not inbound:
                raise DeletePolicyError(
                    f"{where} restrict leaves inbound relationships {missing} unproven"
                    if missing else f"{where} restrict, but nothing targets {e.name}: "
                    "declare no_inbound"
                )
            return
        if isinstance(policy, Cascade):
            covered: set[tuple[str, str]] = set()
            for edge in policy.edges:
                child = self.entities.get(edge.entity)
                rel = None if child is None else child.relationship(edge.relationship)
                if child is None or rel is None or rel.target != e.name:
                    raise DeletePolicyError(
                        f"{where} cascade names {edge.entity}.{edge.relationship}, which is not "
                        f"a relationship targeting {e.name}"
                    )
                index = child.index(edge.index)
                if index is None or tuple(index.fields[: len(rel.fields)]) != rel.fields:
                    raise DeletePolicyError(
                        f"{where} cascade {edge.entity}.{edge.relationship} needs a reverse "
                        f"index of {edge.entity} starting with {rel.fields}, got {edge.index!r}"
                    )
                if (
                    type(edge.maximum) is not int or not 1 <= edge.maximum <= MAX_CASCADE
                ):
                    raise DeletePolicyError(
                        f"{where} cascade maximum must be 1..{MAX_CASCADE}, got {edge.maximum!r}"
                    )
                if not isinstance(child.delete_policy, NoInbound):
                    raise DeletePolicyError(
                        f"{where} cascade reaches {child.name}, which must declare no_inbound "
                        "(a cascade is one bounded hop, never recursive)"
                    )
                if (child.name, rel.name) in covered:
                    raise DuplicateName(f"{where} cascade lists {child.name}.{rel.name} twice")
                covered.add((child.name, rel.name))
            missing = [f"{c.name}.{r.name}" for c, r in inbound if (c.name, r.name) not in covered]
            if missing:
                raise DeletePolicyError(f"{where} cascade does not enumerate {missing}")
            return
        raise DeletePolicyError(f"{where}: not a delete policy: {policy!r}")

    def _check_workflow(self, w: Workflow) -> None:
        where = f"workflow {w.name}"
        entity = self.entities.get(w.entity)
        if entity is None:
            raise UnknownName(f"{where}: unknown entity {w.entity!r}")
        if w.state not in entity.fields:
            raise UnknownName(f"{where}: {w.entity} declares no field {w.state!r}")
        state_type = entity.fields[w.state]
        wrong = [s for s in w.states if not admits(state_type, s)]
        if wrong:
            raise WorkflowError(f"{where}: states {wrong} are not values of {w.entity}.{w.state} "
                                f"({state_type.describe()})")
        if entity.revision is None:
            raise WorkflowError(f"{where}: {w.entity} declares no revision to check transitions on")
        if not w.states or len(set(w.states)) != len(w.states):
            raise WorkflowError(f"{where}: declare each state once")
        names: dict[str, int] = {}
        for n, move in enumerate(w.transitions, start=1):
            _identifier(f"{where}: a transition name", move.name)
            if move.name in names:
                raise DuplicateName(f"{where}: transition {move.name} (transition #{n}): the "
                                    f"name is first declared by transition #{names[move.name]}")
            names[move.name] = n
            outside = [s for s in (*move.sources, move.to) if s not in w.states]
            if outside or not move.sources:
                raise WorkflowError(
                    f"{where}: transition {move.name} leaves the closed state graph {w.states}: "
                    f"{outside or 'no source state'}"
                )
        if any(
            other.entity == w.entity and other.state == w.state and other.name != w.name
            for other in self.workflows.values()
        ):
            raise WorkflowError(f"{where}: {w.entity}.{w.state} has two workflows")

    def workflow_of(self, entity: str, field_name: str) -> Workflow | None:
        return next(
            (w for w in self.workflows.values() if w.entity == entity and w.state == field_name),
            None,
        )

    # -- commands ---------------------------------------------------------------

    def command(self, declaration: Command) -> CheckedCommand:
        """Check ``declaration`` against this catalog and compile it (its
        database function, `compile.compiled`); the checked command. Raises a
        `CommandDeclarationError` naming the clause at fault, `NotCompilable`
        for what the compiler does not translate."""
        checked = _CommandChecker(self, declaration).check()
        compiled(checked)
        return checked


def _typed_bool(scope: TypeScope, expr: Expr, what: str) -> None:
    found = _typed(scope, expr, what)
    if found.base is not None and (found.base is not bool or found.optional):
        raise TypeMismatch(f"{what} is {found.describe()}, not a bool")


def _unique_names(where: str, names: Iterable[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise DuplicateName(f"{where}: {name!r} appears twice")
        seen.add(name)
