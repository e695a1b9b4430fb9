"""The clause-by-clause check of one declared command (pure: no I/O).

`_CommandChecker` walks a command's clauses in their visible order
(inputs and service values, idempotency key, bindings, requirements,
effects, return): each name is declared once, each expression observes
only what is declared before it and is typed (`typecheck`), each binding
names a catalog entity by its complete key, each outcome is declared; then
the whole-command proofs (`proofs`) and the `CheckedCommand` the runner
executes. Every refusal is a named `CommandDeclarationError`, naming the
clause at fault.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from datetime import datetime
from types import MappingProxyType
from typing import Protocol

from ..gates import Reason
from .checked import CheckedCommand, DeleteStep, EntityCatalog, TransitionStep
from .declaration import (
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
    Outcome,
    Permit,
    Read,
    Record,
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
    NotCompilable,
    ServiceValueError,
    TypeMismatch,
    UnboundReference,
    UnknownName,
    WorkflowError,
)
from .expr import Const, Expr, Field, Row, Var, is_expr, references
from .proofs import _init_fields, _Proofs
from .typecheck import SERVICE_TYPES, TypeScope, ValueType, assignable, input_type

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


def _label(clause: Clause) -> str:
    kind = type(clause).__name__
    for attr in ("name", "as_", "binding", "transition", "input"):
        value = getattr(clause, attr, None)
        if isinstance(value, str):
            extra = f".{clause.field}" if isinstance(clause, Set) else ""
            return f"{kind} {value}{extra}"
    return kind


def _typed(scope: TypeScope, expr: Expr, what: str) -> ValueType:
    try:
        return scope.type_of(expr)
    except LookupError as exc:
        raise UnknownName(f"{what}: {exc.args[0]}") from None
    except TypeError as exc:
        raise TypeMismatch(f"{what}: {exc}") from None


class _Catalog(EntityCatalog, Protocol):
    """What checking a command reads of its catalog (`check.Catalog`)."""

    @property
    def workflows(self) -> Mapping[str, Workflow]: ...

    @property
    def facts(self) -> Mapping[str, ValueType]: ...

    def _row_types(self, e: Entity) -> dict[str, ValueType]: ...

    def workflow_of(self, entity: str, field_name: str) -> Workflow | None: ...


class _CommandChecker:
    def __init__(self, catalog: _Catalog, declaration: Command) -> None:
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
                if clause.field in entity.key:
                    raise self.fail(BindingError, f"set {clause.binding}.{clause.field}: a key "
                                    "field is fixed by the binding")
                if clause.field == entity.revision:
                    raise self.fail(CommandDeclarationError,
                                    f"set {clause.binding}.{clause.field}: the revision is the "
                                    "engine's (every write of the row sets the next one)")
                if clause.field not in _init_fields(entity):
                    raise self.fail(UnknownName, f"set {clause.binding}.{clause.field}: "
                                    f"{entity.name} declares no such field")
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
        proofs = _Proofs(self.where, self.bound, self.binding_of)
        proofs.routes(written)
        proofs.set_proofs(sets, requirements, transitions)
        proofs.relationship_proofs(bindings, set_fields)
        proofs.unique_outcomes(written, set_fields)
        proofs.creates_initialised(written, set_fields)
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
