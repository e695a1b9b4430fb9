"""Registration checks: a `Catalog` of entities and workflows, and the
checked form of each command (pure: no I/O).

`Catalog(entities, workflows)` checks the entity graph (keys, partition
routes, unique keys, relationships, reverse indexes, delete policies,
workflows); `Catalog.command(decl)` checks one command clause by clause in
its visible order and answers the `CheckedCommand` the runner executes.
Every refusal is a named `CommandDeclarationError`.
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from types import MappingProxyType

from ..gates import Reason
from .checked import CheckedCommand, DeleteStep, TransitionStep
from .compile import compiled
from .declaration import (
    MAX_CASCADE,
    OUTCOME_NAME,
    TRANSACTION_TIME,
    UUID_V7,
    Binding,
    Cascade,
    Caused,
    Clause,
    Command,
    Create,
    Delete,
    Emit,
    Entity,
    IdempotencyKey,
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
    Service,
    Set,
    Transition,
    Unless,
    Workflow,
)
from .errors import (
    BindingError,
    ClauseOrderError,
    CommandDeclarationError,
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
    WorkflowError,
)
from .expr import Add, And, Const, Eq, Expr, Field, Row, Sub, Var, is_expr, references
from .typecheck import (
    SERVICE_TYPES,
    TypeScope,
    ValueType,
    admits,
    assignable,
    input_type,
    value_type,
)

__all__ = ["Catalog", "CheckedCommand", "DeleteStep", "TransitionStep"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INPUT_TYPES: tuple[type, ...] = (str, int, bool, float, uuid.UUID, datetime)
_SECTION_NAMES = (
    "inputs and service values", "the idempotency key", "bindings", "requirements",
    "effects", "return",
)
_ENGINE_OUTCOMES = frozenset({"Refused", "IdempotencyConflict"})


def _section(clause: Clause) -> int:
    if isinstance(clause, Input | Service):
        return 0
    if isinstance(clause, IdempotencyKey):
        return 1
    if isinstance(clause, Read | Mutate | Create):
        return 2
    if isinstance(clause, Require | Permit):
        return 3
    if isinstance(clause, Set | Transition | Delete | Record | Caused | Emit):
        return 4
    if isinstance(clause, Return):
        return 5
    return -1


def _identifier(what: str, name: object) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise CommandDeclarationError(f"{what} must be an identifier, got {name!r}")
    return name


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
        if e.revision is not None and e.types[e.revision].base is not int:
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


def _init_fields(entity: Entity) -> dict[str, bool]:
    """The fields a command may set (the dataclass's init fields outside
    the key and the revision), each with whether it has a default."""
    return {
        f.name: f.default is not dataclasses.MISSING
        or f.default_factory is not dataclasses.MISSING
        for f in dataclasses.fields(entity.aggregate)
        if f.init and f.name in entity.fields
    }


def _label(clause: Clause) -> str:
    kind = type(clause).__name__
    for attr in ("name", "as_", "binding", "transition", "input"):
        value = getattr(clause, attr, None)
        if isinstance(value, str):
            extra = f".{clause.field}" if isinstance(clause, Set) else ""
            return f"{kind} {value}{extra}"
    return kind


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


def _typed_bool(scope: TypeScope, expr: Expr, what: str) -> None:
    found = _typed(scope, expr, what)
    if found.base is not None and (found.base is not bool or found.optional):
        raise TypeMismatch(f"{what} is {found.describe()}, not a bool")


def _typed(scope: TypeScope, expr: Expr, what: str) -> ValueType:
    try:
        return scope.type_of(expr)
    except LookupError as exc:
        raise UnknownName(f"{what}: {exc.args[0]}") from None
    except TypeError as exc:
        raise TypeMismatch(f"{what}: {exc}") from None


def _unique_names(where: str, names: Iterable[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise DuplicateName(f"{where}: {name!r} appears twice")
        seen.add(name)


class _CommandChecker:
    def __init__(self, catalog: Catalog, declaration: Command) -> None:
        self.catalog = catalog
        self.decl = declaration
        self.where = f"command {declaration.name}"
        self.values: dict[str, Input | Service] = {}
        self.bound: dict[str, Entity] = {}
        self.binding_of: dict[str, Binding] = {}
        self.outcomes: set[str] = set()
        self.at = ""
        """Where the clause being checked is: ``clause 4 (Require Published)``."""
        self.first: dict[tuple[str, str], str] = {}
        """Where each name was first declared, by (namespace, name)."""
        self.value_types: dict[str, ValueType] = {}
        self.binding_types: dict[str, dict[str, ValueType]] = {}

    def fail(self, error: type[CommandDeclarationError], message: str) -> CommandDeclarationError:
        return error(f"{self.where}: {message}")

    def declare(self, namespace: str, name: str, what: str) -> None:
        """Record ``name`` in ``namespace`` (refused when it is there already,
        naming where it was first declared)."""
        first = self.first.get((namespace, name))
        if first is not None:
            raise self.fail(DuplicateName, f"{what} at {self.at}: {namespace} {name!r} is first "
                            f"declared at {first}")
        self.first[(namespace, name)] = self.at

    def scope(self) -> TypeScope:
        return TypeScope(self.value_types, self.binding_types, self.catalog.facts)

    def outcome(self, outcome: object, what: str) -> None:
        if not isinstance(outcome, Outcome):
            raise self.fail(MissingOutcome, f"{what} declares no Outcome, got {outcome!r}")
        if not OUTCOME_NAME.fullmatch(outcome.name) or outcome.name in _ENGINE_OUTCOMES:
            raise self.fail(
                MissingOutcome,
                f"{what}: outcome {outcome.name!r} must be PascalCase and not one of the "
                f"engine's own {sorted(_ENGINE_OUTCOMES)}",
            )
        self.declare("outcome", outcome.name, what)
        self.outcomes.add(outcome.name)

    def observe(self, expr: object, what: str, *, allow_bindings: bool = True) -> ValueType:
        if not is_expr(expr):
            raise self.fail(CommandDeclarationError, f"{what} is not an expression: {expr!r}")
        for leaf in references(expr):
            if isinstance(leaf, Var) and leaf.name not in self.values:
                raise self.fail(UnboundReference, f"{what} reads {leaf.name!r}, not an input or "
                                "service value declared before it")
            if isinstance(leaf, Field):
                if not allow_bindings:
                    raise self.fail(BindingError, f"{what} may not read the binding "
                                    f"{leaf.binding!r}")
                entity = self.bound.get(leaf.binding)
                if entity is None:
                    raise self.fail(UnboundReference, f"{what} reads {leaf.binding}.{leaf.name} "
                                    "before (or without) binding it")
                if leaf.name not in entity.all_fields:
                    raise self.fail(UnknownName, f"{what} reads unknown field "
                                    f"{entity.name}.{leaf.name}")
            if isinstance(leaf, Row):
                raise self.fail(CommandDeclarationError, f"{what}: Row is for row policies only")
        return _typed(self.scope(), expr, f"{self.where}: {what} ({self.at})")

    def check(self) -> CheckedCommand:
        decl = self.decl
        _identifier("a command name", decl.name)
        if not decl.clauses:
            raise self.fail(CommandDeclarationError, "declares no clauses")
        section = 0
        for position, clause in enumerate(decl.clauses, start=1):
            now = _section(clause)
            if now < 0:
                raise self.fail(CommandDeclarationError,
                                f"clause {position} is not a command clause: {clause!r}")
            if now < section:
                raise self.fail(
                    ClauseOrderError,
                    f"{type(clause).__name__} ({_SECTION_NAMES[now]}) after "
                    f"{_SECTION_NAMES[section]}: clauses follow the order inputs and service "
                    "values, idempotency key, bindings, requirements, effects, return",
                )
            if now == 1 and section == 1:
                raise self.fail(IdempotencyDeclarationError, "declares two idempotency keys")
            if now == 5 and section == 5:
                raise self.fail(ClauseOrderError, "declares two returns")
            section = now
        if not isinstance(decl.clauses[-1], Return):
            raise self.fail(ClauseOrderError, "ends without a Return")

        inputs: list[Input] = []
        services: list[Service] = []
        idem: str | None = None
        bindings: list[Binding] = []
        requirements: list[Require | Permit] = []
        effects: list[Set | Transition | Delete | Record | Caused | Emit] = []
        transitions: dict[str, TransitionStep] = {}
        deletes: dict[str, DeleteStep] = {}
        returns: Return | None = None
        set_fields: dict[str, dict[str, Expr]] = {}
        sets: list[tuple[Set, str]] = []
        deleted: set[str] = set()

        for position, clause in enumerate(decl.clauses, start=1):
            self.at = f"clause {position} ({_label(clause)})"
            if isinstance(clause, Input):
                self._name(clause.name)
                if clause.type not in _INPUT_TYPES:
                    raise self.fail(
                        CommandDeclarationError,
                        f"input {clause.name} has unsupported type {clause.type!r}",
                    )
                if clause.max_length is not None and (
                    clause.type is not str or type(clause.max_length) is not int
                    or clause.max_length < 1
                ):
                    raise self.fail(
                        CommandDeclarationError,
                        f"input {clause.name}: max_length bounds a str input by a positive int",
                    )
                self.values[clause.name] = clause
                self.value_types[clause.name] = input_type(clause.type, clause.optional)
                inputs.append(clause)
            elif isinstance(clause, Service):
                self._name(clause.name)
                if clause.kind not in (TRANSACTION_TIME, UUID_V7):
                    raise self.fail(ServiceValueError, f"service {clause.name}: unknown kind "
                                    f"{clause.kind!r} (transaction_time or uuid_v7)")
                self.values[clause.name] = clause
                self.value_types[clause.name] = SERVICE_TYPES[clause.kind]
                services.append(clause)
            elif isinstance(clause, IdempotencyKey):
                declared = self.values.get(clause.input)
                if not isinstance(declared, Input) or declared.type is not str or declared.optional:
                    raise self.fail(IdempotencyDeclarationError,
                                    f"idempotency_key {clause.input!r} must name a required str "
                                    "input declared before it")
                idem = clause.input
            elif isinstance(clause, Read | Mutate | Create):
                self._binding(clause)
                bindings.append(clause)
            elif isinstance(clause, Require):
                _identifier(f"{self.where}: a requirement name", clause.name)
                self.declare("requirement", clause.name, f"require {clause.name}")
                found = self.observe(clause.predicate, f"require {clause.name}")
                if found.base is not None and (found.base is not bool or found.optional):
                    raise self.fail(TypeMismatch, f"require {clause.name} ({self.at}) is "
                                    f"{found.describe()}, not a bool")
                self.outcome(clause.else_, f"require {clause.name}")
                requirements.append(clause)
            elif isinstance(clause, Permit):
                _identifier(f"{self.where}: a permit's action", clause.action)
                if not clause.rules or not all(isinstance(r, Unless) for r in clause.rules):
                    raise self.fail(CommandDeclarationError, f"permit {clause.action}: its rules "
                                    "are one or more Unless(reason, condition, ...)")
                for n, rule in enumerate(clause.rules, start=1):
                    what = f"permit {clause.action} rule {n}"
                    if not isinstance(rule.reason, Reason) or not rule.conditions:
                        raise self.fail(CommandDeclarationError, f"{what}: Unless takes a Reason "
                                        "and at least one condition")
                    for condition in rule.conditions:
                        found = self.observe(condition, what)
                        if found.base is not None and found.base is not bool:
                            raise self.fail(TypeMismatch, f"{what} ({self.at}) is "
                                            f"{found.describe()}, not a bool")
                requirements.append(clause)
            elif isinstance(clause, Set):
                entity = self._written(clause.binding, "set")
                if clause.binding in deleted:
                    raise self.fail(BindingError, f"set {clause.binding}.{clause.field} "
                                    f"({self.at}): {clause.binding} is deleted before it")
                if clause.field not in _init_fields(entity):
                    raise self.fail(UnknownName, f"set {clause.binding}.{clause.field}: "
                                    f"{entity.name} declares no such field")
                if clause.field in entity.key:
                    raise self.fail(BindingError, f"set {clause.binding}.{clause.field}: a key "
                                    "field is fixed by the binding")
                flow = self.catalog.workflow_of(entity.name, clause.field)
                if flow is not None and not (
                    isinstance(self.binding_of[clause.binding], Create)
                    and isinstance(clause.value, Const) and clause.value.value in flow.states
                ):
                    raise self.fail(
                        WorkflowError,
                        f"set {clause.binding}.{clause.field}: a workflow state is initialised "
                        "by a create (to a declared state) and changes only by a "
                        "revision-checked Transition",
                    )
                self.declare("set", f"{clause.binding}.{clause.field}",
                             f"set {clause.binding}.{clause.field}")
                found = self.observe(clause.value, f"set {clause.binding}.{clause.field}")
                target = self.binding_types[clause.binding][clause.field]
                why = assignable(target, found)
                if why is not None:
                    raise self.fail(TypeMismatch, f"set {clause.binding}.{clause.field} "
                                    f"({self.at}): the value {why}")
                set_fields.setdefault(clause.binding, {})[clause.field] = clause.value
                sets.append((clause, self.at))
                effects.append(clause)
            elif isinstance(clause, Transition):
                if clause.on in deleted:
                    raise self.fail(BindingError, f"transition on {clause.on} ({self.at}): "
                                    f"{clause.on} is deleted before it")
                transitions[clause.on] = self._transition(clause, transitions)
                effects.append(clause)
            elif isinstance(clause, Delete):
                deletes[clause.binding] = self._delete(clause, deletes)
                deleted.add(clause.binding)
                effects.append(clause)
            elif isinstance(clause, Record):
                entity = self._written(clause.binding, "record")
                if not isinstance(clause.type, str) or not clause.type:
                    raise self.fail(CommandDeclarationError, "record needs a fact type")
                if entity.fact_log is None:
                    raise self.fail(NotCompilable, f"record on {clause.binding} ({self.at}): "
                                    f"{entity.name}'s store keeps no facts table (a soft-EDA "
                                    "store's FACTS_TABLE, keyed by its single KEY column)")
                for name, value in clause.data.items():
                    self.observe(value, f"record {clause.type}.{name}")
                effects.append(clause)
            elif isinstance(clause, Caused):
                entity = self._written(clause.binding, "caused")
                if clause.noun not in entity.nouns:
                    raise self.fail(UnknownName, f"caused {clause.binding}: {entity.name} "
                                    f"impacts no noun {clause.noun!r} (nouns {entity.nouns})")
                for name, value in clause.data.items():
                    self.observe(value, f"caused {clause.name}.{name}")
                effects.append(clause)
            elif isinstance(clause, Emit):
                model = getattr(clause.event, "model_fields", None)
                if not isinstance(clause.event, type) or not isinstance(model, Mapping):
                    raise self.fail(CommandDeclarationError, f"emit ({self.at}): the event is "
                                    "an OutboundEvent class (a pydantic model), got "
                                    f"{clause.event!r}")
                name = clause.event.__qualname__
                unknown = sorted(set(clause.fields) - set(model))
                if unknown:
                    raise self.fail(UnknownName, f"emit {name}: no field {unknown} (fields "
                                    f"{sorted(model)})")
                unset = sorted(k for k, f in model.items()
                               if f.is_required() and k not in clause.fields)
                if unset:
                    raise self.fail(CommandDeclarationError, f"emit {name}: required fields "
                                    f"{unset} are not given")
                for field_name, value in clause.fields.items():
                    self.observe(value, f"emit {name}.{field_name}")
                effects.append(clause)
            elif isinstance(clause, Return):
                if not OUTCOME_NAME.fullmatch(clause.name):
                    raise self.fail(MissingOutcome, f"return {clause.name!r} must be PascalCase")
                if clause.name in _ENGINE_OUTCOMES:
                    raise self.fail(DuplicateName, f"return {clause.name!r} reuses an outcome")
                self.declare("outcome", clause.name, f"return {clause.name}")
                self.outcomes.add(clause.name)
                for name, value in clause.fields.items():
                    _identifier(f"{self.where}: a return field", name)
                    self.observe(value, f"return {clause.name}.{name}")
                returns = clause

        written = [b for b in bindings if isinstance(b, Mutate | Create)]
        for binding in bindings:
            if isinstance(binding, Mutate) and not any(
                getattr(e, "binding", getattr(e, "on", None)) == binding.as_ for e in effects
                if not isinstance(e, Emit | Caused)
            ):
                raise self.fail(BindingError, f"mutate {binding.as_} is never written: read it")
        if services and (idem is None or not written):
            raise self.fail(
                ServiceValueError,
                "service values need a durably idempotent mutation: declare an "
                "idempotency_key and a create or mutate binding",
            )
        self._routes(written)
        self._set_proofs(sets, requirements, transitions)
        self._proofs(bindings, set_fields)
        self._unique_outcomes(written, set_fields)
        self._creates_initialised(written, set_fields)
        assert returns is not None
        return CheckedCommand(
            declaration=decl,
            inputs=tuple(inputs),
            services=tuple(services),
            idempotency_key=idem,
            bindings=tuple(bindings),
            entities=MappingProxyType(dict(self.bound)),
            requirements=tuple(requirements),
            effects=tuple(effects),
            transitions=MappingProxyType(transitions),
            deletes=MappingProxyType(deletes),
            returns=returns,
            outcomes=frozenset(self.outcomes),
            catalog=self.catalog,
        )

    def _name(self, name: str) -> None:
        _identifier(f"{self.where}: a name", name)
        self.declare("name", name, name)

    def _set_proofs(
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

    def _bound(self, name: str, what: str) -> Entity:
        entity = self.bound.get(name)
        if entity is None:
            raise self.fail(UnboundReference, f"{what} {name!r}: no binding of that name")
        return entity

    def _written(self, name: str, what: str) -> Entity:
        entity = self._bound(name, what)
        if isinstance(self.binding_of[name], Read):
            raise self.fail(BindingError, f"{what} {name!r}: a read binding is not written; "
                            "declare it mutate")
        return entity

    def _binding(self, clause: Binding) -> None:
        kind = type(clause).__name__.lower()
        entity = self.catalog.entities.get(clause.entity)
        if entity is None:
            raise self.fail(UnknownName, f"{kind} {clause.as_}: unknown entity {clause.entity!r}")
        self._name(clause.as_)
        if len(clause.key) != len(entity.key):
            raise self.fail(BindingError, f"{kind} {clause.as_}: the key of {entity.name} is "
                            f"{entity.key}, got {len(clause.key)} values")
        for name, part in zip(entity.key, clause.key, strict=True):
            found = self.observe(part, f"{kind} {clause.as_} key", allow_bindings=False)
            why = assignable(entity.types[name], found)
            if why is not None and found.base is not type(None):
                raise self.fail(TypeMismatch, f"{kind} {clause.as_} ({self.at}): the key "
                                f"{entity.name}.{name} {why}")
        self.outcome(clause.else_, f"{kind} {clause.as_}")
        if isinstance(clause, Mutate | Create):
            names = {u.name for u in entity.unique}
            for index, outcome in clause.taken.items():
                if index not in names:
                    raise self.fail(UnknownName, f"{kind} {clause.as_}: {entity.name} has no "
                                    f"unique key {index!r}")
                self.outcome(outcome, f"{kind} {clause.as_} taken {index}")
        self.bound[clause.as_] = entity
        self.binding_of[clause.as_] = clause
        self.binding_types[clause.as_] = self.catalog._row_types(entity)

    def _transition(
        self, clause: Transition, seen: Mapping[str, TransitionStep]
    ) -> TransitionStep:
        self._bound(clause.on, "transition")
        if not isinstance(self.binding_of[clause.on], Mutate):
            raise self.fail(WorkflowError, f"transition on {clause.on!r}: name a mutate binding")
        entity = self._written(clause.on, "transition")
        flow_name, dot, move_name = clause.transition.partition(".")
        workflow = self.catalog.workflows.get(flow_name)
        move = None if workflow is None or not dot else workflow.transition(move_name)
        if workflow is None or move is None:
            raise self.fail(UnknownName, f"transition {clause.transition!r}: not a declared "
                            "Workflow.Transition")
        if workflow.entity != entity.name:
            raise self.fail(WorkflowError, f"transition {clause.transition}: workflow of "
                            f"{workflow.entity}, binding {clause.on} is a {entity.name}")
        if clause.on in seen:
            raise self.fail(WorkflowError, f"two transitions on {clause.on!r}")
        revision = self.observe(clause.revision, f"transition {clause.transition} revision",
                                allow_bindings=False)
        if revision.base not in (None, int) or revision.optional:
            raise self.fail(TypeMismatch, f"transition {clause.transition} ({self.at}): the "
                            f"revision is {revision.describe()}, not an int")
        if not any(isinstance(leaf, Var) for leaf in references(clause.revision)):
            raise self.fail(WorkflowError, f"transition {clause.transition}: the revision is "
                            "supplied by the caller (an input)")
        self.outcome(clause.stale, f"transition {clause.transition} stale")
        self.outcome(clause.illegal, f"transition {clause.transition} illegal")
        return TransitionStep(clause, workflow, move)

    def _delete(self, clause: Delete, seen: Mapping[str, DeleteStep]) -> DeleteStep:
        entity = self._written(clause.binding, "delete")
        if not isinstance(self.binding_of[clause.binding], Mutate):
            raise self.fail(DeletePolicyError, f"delete {clause.binding!r}: name a mutate binding")
        if clause.binding in seen:
            raise self.fail(DeletePolicyError, f"delete {clause.binding!r} twice")
        policy = entity.delete_policy
        if policy is None:
            raise self.fail(DeletePolicyError, f"delete {clause.binding}: {entity.name} declares "
                            "no delete policy")
        if isinstance(policy, Restrict) and clause.referenced is None:
            raise self.fail(MissingOutcome, f"delete {clause.binding}: restrict needs the "
                            "referenced outcome")
        if isinstance(policy, Cascade) and clause.too_many is None:
            raise self.fail(MissingOutcome, f"delete {clause.binding}: cascade needs the "
                            "too_many outcome")
        for name, outcome in (("referenced", clause.referenced), ("too_many", clause.too_many)):
            if outcome is not None:
                wanted = Restrict if name == "referenced" else Cascade
                if not isinstance(policy, wanted):
                    raise self.fail(DeletePolicyError, f"delete {clause.binding}: {name} does "
                                    f"not apply to {type(policy).__name__}")
                self.outcome(outcome, f"delete {clause.binding} {name}")
        return DeleteStep(clause, entity)

    def _route(self, binding: Binding) -> tuple[Expr, ...]:
        entity = self.bound[binding.as_]
        return tuple(binding.key[: len(entity.partition_by)])

    def _routes(self, written: Sequence[Binding]) -> None:
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

    def _proofs(
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

    def _unique_outcomes(
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

    def _creates_initialised(
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

