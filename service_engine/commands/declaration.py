"""What a service declares: entities, workflows and commands (pure values).

An **entity** names an aggregate dataclass (its ``Store`` is the
pipeline's; its annotated fields are the entity's typed fields), its
complete key (the store key and the pipeline's lock), the partition route
(a prefix of the key: the locality unit a command writes in) and the
conflict key (what writers contend on), plus its unique keys,
relationships, reverse indexes, delete policy and row policies.

A **command** is a sequence of clauses in one visible order::

    Command(
        "StartWork",
        Input("request_key", str, max_length=128),
        Input("org", str), Input("work_id", str), Input("expected_revision", int),
        Service("execution_id", UUID_V7),
        IdempotencyKey("request_key"),
        Mutate("WorkItem", (Var("org"), Var("work_id")), as_="work", else_=Outcome("Missing")),
        Transition("WorkLifecycle.Start", on="work", revision=Var("expected_revision"),
                   stale=Outcome("StaleRevision"), illegal=Outcome("IllegalState")),
        Set("work", "execution_id", Var("execution_id")),
        Return("Started", revision=Field("work", "version")),
    )

`Catalog.command` checks it at registration (`check`), so a wrong
declaration fails boot with a named `CommandDeclarationError`.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any, Literal, TypeAlias

from ..gates import Reason
from .expr import Expr
from .typecheck import UNKNOWN, ValueType, admits, field_types

__all__ = [
    "TRANSACTION_TIME",
    "UUID_V7",
    "Binding",
    "Cascade",
    "CascadeEdge",
    "Caused",
    "Clause",
    "Command",
    "Create",
    "Delete",
    "DeletePolicy",
    "Emit",
    "Entity",
    "IdempotencyKey",
    "IndexRef",
    "Input",
    "Mutate",
    "NoInbound",
    "Outcome",
    "Permit",
    "Read",
    "Record",
    "Relationship",
    "Require",
    "Restrict",
    "Return",
    "ReverseIndex",
    "RowPolicy",
    "Service",
    "Set",
    "Transition",
    "Unique",
    "Unless",
    "Workflow",
    "WorkflowTransition",
]

TRANSACTION_TIME = "transaction_time"
"""A service value: the transaction's instant (`Timestamp`), sealed once."""
UUID_V7 = "uuid_v7"
"""A service value: a time-ordered UUID the engine generates, sealed once."""

ServiceKind: TypeAlias = Literal["transaction_time", "uuid_v7"]
InputType: TypeAlias = type[str] | type[int] | type[bool] | type[float] | type[uuid.UUID] | type[
    datetime
]

OUTCOME_NAME = re.compile(r"[A-Z][A-Za-z0-9]*")


# -- entities ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Unique:
    """A unique key: durable occupancy rows inside the writing partition.

    ``fields`` must begin with the entity's partition route.
    """

    name: str
    fields: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Relationship:
    """``fields`` of this entity reference the complete key of ``target``
    (positionally). A required relationship needs a proof in every command
    that creates the row or changes those fields."""

    name: str
    target: str
    fields: tuple[str, ...]
    required: bool = True


@dataclass(frozen=True, slots=True)
class ReverseIndex:
    """A partition-local index over ``fields`` of this entity's table, used
    to prove there are no referencing rows (restrict) or to enumerate them
    (cascade). ``table``/``columns`` say where it lives: ``columns`` default
    to ``fields``; ``key_columns`` (default: the entity's key fields) hold
    the complete key of each row it finds."""

    name: str
    fields: tuple[str, ...]
    table: str
    columns: tuple[str, ...] | None = None
    key_columns: tuple[str, ...] | None = None

    @property
    def sql_columns(self) -> tuple[str, ...]:
        return self.columns if self.columns is not None else self.fields


@dataclass(frozen=True, slots=True)
class IndexRef:
    """``entity.index``: a reverse index of another entity."""

    entity: str
    index: str


@dataclass(frozen=True, slots=True)
class NoInbound:
    """Deletable: no declared relationship may target the entity."""


@dataclass(frozen=True, slots=True)
class Restrict:
    """Deletable only while no row references it: one reverse index per
    inbound relationship proves it (the delete declares its outcome)."""

    indexes: tuple[IndexRef, ...]


@dataclass(frozen=True, slots=True)
class CascadeEdge:
    """One inbound relationship a cascade deletes along, at most ``maximum`` rows."""

    entity: str
    relationship: str
    index: str
    maximum: int


@dataclass(frozen=True, slots=True)
class Cascade:
    """Deleting the entity deletes the rows of every direct inbound
    relationship (one bounded hop; each child entity declares `NoInbound`)."""

    edges: tuple[CascadeEdge, ...]


DeletePolicy: TypeAlias = NoInbound | Restrict | Cascade

MAX_CASCADE = 1000
"""The largest fan-out maximum a cascade edge may declare."""


@dataclass(frozen=True, slots=True)
class RowPolicy:
    """A boolean predicate over the row (`Row`), principal facts (`Fact`)
    and constants; ``reason`` is the code a denial answers with."""

    predicate: Expr
    reason: Reason


@dataclass(frozen=True, slots=True)
class Entity:
    """An aggregate-owned entity the command layer reads and writes.

    ``aggregate`` is a dataclass naming its ``Store``: its annotated fields
    (and typed properties) are the entity's fields and their types, never
    listed a second time. ``key`` lists the fields forming the complete key;
    ``partition_by`` is a prefix of it (the locality and visibility unit);
    ``conflict_key`` (default: the key) lists what writers contend on, and
    together with the route it covers the complete key: the store key (and
    the pipeline's lock) is the complete key, so two partitions may hold
    the same id and never contend. ``revision`` names the field counting
    the entity's changes (the layer bumps it on every write).
    ``nouns`` are the render nouns
    every write impacts, keyed by the store key. ``table`` names the
    table the compiled commands read and write (default: the ``TABLE`` of
    the aggregate's store).

    Row policies: ``create_policy`` judges a created row, ``update_policy``
    the current and the proposed row of an update, ``delete_row_policy``
    the current row of a delete and of every row a cascade takes (default:
    the entity's ``update_policy``).
    """

    name: str
    aggregate: type
    key: tuple[str, ...]
    partition_by: tuple[str, ...] = ()
    conflict_key: tuple[str, ...] | None = None
    revision: str | None = None
    unique: tuple[Unique, ...] = ()
    relationships: tuple[Relationship, ...] = ()
    indexes: tuple[ReverseIndex, ...] = ()
    delete_policy: DeletePolicy | None = None
    create_policy: RowPolicy | None = None
    update_policy: RowPolicy | None = None
    delete_row_policy: RowPolicy | None = None
    nouns: tuple[str, ...] = ()
    table: str | None = None
    """The table holding the rows, one column per field named as the field
    (default: the store's ``TABLE``)."""
    types: Mapping[str, ValueType] = field(init=False, repr=False, compare=False)
    """Every field's type, derived from ``aggregate`` (empty when it is not
    a dataclass: registration refuses it)."""
    fields: Mapping[str, ValueType] = field(init=False, repr=False, compare=False)
    """The fields outside the key and the revision, typed."""

    def __post_init__(self) -> None:
        try:
            derived = field_types(self.aggregate)
        except (TypeError, NameError):
            derived = {}
        object.__setattr__(self, "types", MappingProxyType(derived))
        object.__setattr__(self, "fields", MappingProxyType({
            name: t for name, t in derived.items()
            if name not in self.key and name != self.revision
        }))

    def admits_key(self, parts: Sequence[object]) -> bool:
        """Whether each key part is a value its key field's type admits: a
        part of another type (a service's fact of the wrong type, say) names
        no row, so its binding answers its else outcome."""
        return all(admits(self.types.get(name, UNKNOWN), part)
                   for name, part in zip(self.key, parts, strict=True))

    @property
    def table_name(self) -> str | None:
        """The table holding the rows (``table``, else the store's ``TABLE``)."""
        if self.table is not None:
            return self.table
        found = getattr(getattr(self.aggregate, "Store", None), "TABLE", None)
        return found if isinstance(found, str) else None

    @property
    def fact_log(self) -> tuple[str, str, str, str] | None:
        """Where a `Record` of this entity is written: ``(table, key column,
        type column, payload column)`` of its soft-EDA store's facts table
        (keyed by the store's single ``KEY``), or ``None``."""
        store = getattr(self.aggregate, "Store", None)
        table = getattr(store, "FACTS_TABLE", None)
        if not isinstance(table, str) or len(self.key) != 1:
            return None
        key = getattr(store, "FACT_KEY", None) or getattr(store, "KEY", self.key[0])
        return (table, str(key), str(getattr(store, "FACT_TYPE", "fact_type")),
                str(getattr(store, "FACT_PAYLOAD", "payload")))

    @property
    def conflict_fields(self) -> tuple[str, ...]:
        return self.key if self.conflict_key is None else self.conflict_key

    @property
    def all_fields(self) -> tuple[str, ...]:
        extra = list(self.fields)
        if self.revision is not None and self.revision not in self.key:
            extra.append(self.revision)
        return (*self.key, *extra)

    @property
    def delete_check(self) -> RowPolicy | None:
        """The row policy a delete of this entity satisfies."""
        return self.delete_row_policy if self.delete_row_policy is not None else (
            self.update_policy
        )

    def key_of_values(self, values: Mapping[str, Any]) -> Any:
        """The store key of the row with these key values: the complete key
        (its single value, or a list of the values in key order)."""
        parts = [values[name] for name in self.key]
        return parts[0] if len(parts) == 1 else parts

    def relationship(self, name: str) -> Relationship | None:
        return next((r for r in self.relationships if r.name == name), None)

    def index(self, name: str) -> ReverseIndex | None:
        return next((i for i in self.indexes if i.name == name), None)


@dataclass(frozen=True, slots=True)
class WorkflowTransition:
    """A legal move: from any of ``sources`` to ``to``."""

    name: str
    sources: tuple[str, ...]
    to: str


@dataclass(frozen=True, slots=True)
class Workflow:
    """The closed state graph of one entity's ``state`` attribute."""

    name: str
    entity: str
    state: str
    states: tuple[str, ...]
    transitions: tuple[WorkflowTransition, ...]

    def transition(self, name: str) -> WorkflowTransition | None:
        return next((t for t in self.transitions if t.name == name), None)


# -- command clauses -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Outcome:
    """A declared outcome: a PascalCase name (unique within its command)."""

    name: str


@dataclass(frozen=True, slots=True)
class Input:
    """A caller-supplied input. ``max_length`` bounds a string."""

    name: str
    type: InputType
    max_length: int | None = None
    optional: bool = False


@dataclass(frozen=True, slots=True)
class Service:
    """A service-owned value (`TRANSACTION_TIME` or `UUID_V7`): sampled by
    the engine, sealed with the idempotency record, never a caller input."""

    name: str
    kind: str


@dataclass(frozen=True, slots=True)
class IdempotencyKey:
    """The input whose value makes retries idempotent."""

    input: str


@dataclass(frozen=True, slots=True)
class Read:
    """An exact read of the entity under ``key`` (its complete key, in
    order); ``else_`` is the absence outcome."""

    entity: str
    key: tuple[Expr, ...]
    as_: str
    else_: Outcome


@dataclass(frozen=True, slots=True)
class Mutate:
    """A read of an entity the command writes; ``else_`` when absent;
    ``taken`` maps each unique key a change may collide on to its outcome."""

    entity: str
    key: tuple[Expr, ...]
    as_: str
    else_: Outcome
    taken: Mapping[str, Outcome] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Create:
    """A new entity under ``key``; ``else_`` when one exists; ``taken`` maps
    each unique key to the outcome of a value already occupied."""

    entity: str
    key: tuple[Expr, ...]
    as_: str
    else_: Outcome
    taken: Mapping[str, Outcome] = field(default_factory=dict)


Binding: TypeAlias = Read | Mutate | Create


@dataclass(frozen=True, slots=True)
class Require:
    """A named requirement: ``predicate`` must be ``True``, else ``else_``."""

    name: str
    predicate: Expr
    else_: Outcome


@dataclass(frozen=True, slots=True, init=False)
class Unless:
    """One rule of a `Permit`: it passes when any of ``conditions`` is
    ``True`` (each judged on its own, so an invalid one, such as a missing
    fact, is simply not true); else the permit refuses with ``reason``."""

    reason: Reason
    conditions: tuple[Expr, ...]

    def __init__(self, reason: Reason, /, *conditions: Expr) -> None:
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "conditions", tuple(conditions))


@dataclass(frozen=True, slots=True, init=False)
class Permit:
    """The principal may perform ``action`` on the bound rows: the rules are
    judged in order and the first that fails answers ``Refused`` with its
    reason and ``action`` (what a gate of the same name answers as an
    affordance). Its conditions observe the bindings, inputs and declared
    principal facts, so the command compiles into the database::

        Permit("rename",
               Unless(FORBIDDEN, Eq(Field("board", "org"), Fact("org")),
                      Contains(Fact("board_memberships"), Field("board", "id"))),
               Unless(ARCHIVED, Not(Field("board", "archived"))))
    """

    action: str
    rules: tuple[Unless, ...]

    def __init__(self, action: str, /, *rules: Unless) -> None:
        object.__setattr__(self, "action", action)
        object.__setattr__(self, "rules", tuple(rules))


@dataclass(frozen=True, slots=True)
class Set:
    """Assign ``binding.field = value``, with a proof that the write loses
    nothing (seeds/003): a created binding is initialised; ``value`` may be
    a same-field arithmetic update (``Add(Field(b, f), x)``); ``checked_by``
    names the requirement (declared before it, observing the binding) that
    checked the row; a binding whose caller-supplied revision is compared
    (a `Transition`, or a requirement ``Eq(Field(b, revision), Var(...))``)
    is fenced; ``overwrite=True`` declares a deliberate replacement. A `Set`
    with none of these is refused at registration."""

    binding: str
    field: str
    value: Expr
    checked_by: str | None = None
    overwrite: bool = False


@dataclass(frozen=True, slots=True)
class Transition:
    """A revision-checked workflow transition (``"Workflow.Transition"``) on a
    mutable binding: the caller's ``revision`` is compared first (``stale``
    on a mismatch), then the source state (``illegal`` outside it)."""

    transition: str
    on: str
    revision: Expr
    stale: Outcome
    illegal: Outcome


@dataclass(frozen=True, slots=True)
class Delete:
    """Delete the bound entity under its declared delete policy:
    ``referenced`` is the outcome of a restrict proof that fails,
    ``too_many`` of a cascade beyond its maximum."""

    binding: str
    referenced: Outcome | None = None
    too_many: Outcome | None = None


@dataclass(frozen=True, slots=True)
class Record:
    """Record a fact (``DomainEvent``) on a bound soft/full-EDA aggregate."""

    binding: str
    type: str
    data: Mapping[str, Expr] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Caused:
    """The impact a write of ``binding`` stages on ``noun`` (one of its
    entity's nouns) carries the cause ``name`` with ``data`` (for PerImpact
    projectors); without it the impact carries none."""

    binding: str
    noun: str
    name: str
    data: Mapping[str, Expr] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, init=False)
class Emit:
    """Emit the integration event ``event(**fields)`` (an ``OutboundEvent``
    class: a pydantic model) with the commit; each field is an expression
    observing the rows as written (as `Return` does)::

        Emit(CardAdvanced, card_id=Field("card", "id"),
             version=Field("card", "version"), stage=Field("card", "stage"))
    """

    event: type
    fields: Mapping[str, Expr]

    def __init__(self, event: type, /, **fields: Expr) -> None:
        object.__setattr__(self, "event", event)
        object.__setattr__(self, "fields", dict(fields))


@dataclass(frozen=True, slots=True)
class Return:
    """The success outcome and its fields."""

    name: str
    fields: Mapping[str, Expr] = field(default_factory=dict)

    def __init__(self, name: str, /, **fields: Expr) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "fields", dict(fields))


Clause: TypeAlias = (
    Input | Service | IdempotencyKey | Read | Mutate | Create | Require | Permit
    | Set | Transition | Delete | Record | Caused | Emit | Return
)


@dataclass(frozen=True, slots=True, init=False)
class Command:
    """A command: its name and clauses, in the visible order."""

    name: str
    clauses: tuple[Clause, ...]

    def __init__(self, name: str, *clauses: Clause) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "clauses", tuple(clauses))
