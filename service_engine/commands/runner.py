"""The command interpreter: the oracle the compiled commands are proven against.

No run path calls it: `CommandRunner` and `run_in` (`run`) execute a
command's compiled database function (`compile`). The interpreter says the
same semantics step by step in Python over the pipeline's context, and
``conformance/write/test_commands_compiled.py`` (``test_compiled_command_equals_
interpreter``) runs random declarations, rows, principals and inputs
through both and requires the same outcomes and rows; ``dev/mutate
commands`` mutates it to prove that test sees a change of semantics.
`interpret` runs one command inside a transaction a caller holds::

    idempotency record (lock, read)  -> a stored outcome answers at once
    bindings: every lock in one fixed order (the union of the command's
              conflict keys), then the exact reads, absence/existence outcomes
    requirements and permits, effects (revision-checked transitions, sets,
    records), row policies, delete proofs (restrict / bounded cascade),
    unique occupancy
    -> every zero-mutation outcome is decided before anything is written
    writes: cascaded children, deletes, creates, saves, occupancy moves,
            impacts, emitted events, the idempotency record

A declared outcome commits only the idempotency record (when a key was
given).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, cast

from ..db.errors import Stage, TransientConflict
from ..impacts.model import Cause, JsonValue, canonical_json
from ..persistence.base import Aggregate, DomainEvent, store_of
from ..pipeline import Ops
from .checked import CheckedCommand
from .config import CommandConfig
from .declaration import (
    Cascade,
    Caused,
    Create,
    Delete,
    Emit,
    Entity,
    Mutate,
    Outcome,
    Permit,
    Read,
    Record,
    Require,
    Restrict,
    Set,
    Transition,
)
from .errors import ValueMissing
from .expr import INVALID, Env, evaluate, truth
from .outcomes import IDEMPOTENCY_CONFLICT, REFUSED, CommandOutcome
from .plan import (
    InvalidInput,
    OccupancyKey,
    encode_value,
    input_digest,
    lock_identity,
    occupancy_keys,
    order_by_lock,
    seal,
    validate_inputs,
)
from .policy import check_row, row_of
from .rows import IdempotencyRecord, Occupancy, ReverseScan, claim_statement, claimed, scan_key
from .typecheck import admits

__all__ = ["interpret"]

_DEFAULT_CONFIG = CommandConfig()


class _Answer(Exception):
    """A zero-mutation outcome decided before any write (internal)."""

    def __init__(self, outcome: str, data: Mapping[str, JsonValue] | None = None) -> None:
        super().__init__(outcome)
        self.outcome = outcome
        self.data = dict(data or {})


async def interpret(
    cx: Ops,
    command: CheckedCommand,
    inputs: Mapping[str, object],
    *,
    principal: Any = None,
    config: CommandConfig | None = None,
) -> CommandOutcome:
    """Interpret ``command`` inside the transaction ``cx`` holds (the oracle
    of the compiled function, as `run_in` runs that). Raises `InvalidInput`
    for inputs that do not match the declaration."""
    values = validate_inputs(command, inputs)
    if principal is None:
        principal = getattr(cx, "try_principal", None) or getattr(cx, "principal", None)
    retention = (config or _DEFAULT_CONFIG).idempotency_retention
    return await _Run(command, cx, principal, values, retention).execute()


def _scope(principal: object) -> str:
    ident = getattr(principal, "id", None)
    return "" if ident is None else str(ident)


@dataclass(frozen=True, slots=True)
class _EntityPlan:
    """What the runner derives from an entity's declaration, once."""

    store_type: str
    all_fields: tuple[str, ...]


_PLANS: dict[int, tuple[Entity, _EntityPlan]] = {}


def _plan(entity: Entity) -> _EntityPlan:
    """``entity``'s plan, derived on its first use (declarations live for
    the process; the entry holds the entity, so its id stays its own)."""
    found = _PLANS.get(id(entity))
    if found is not None and found[0] is entity:
        return found[1]
    plan = _EntityPlan(store_of(entity.aggregate).store_type, entity.all_fields)
    _PLANS[id(entity)] = (entity, plan)
    return plan


def _identity_of(b: _Bound) -> tuple[str, str]:
    return b.identity


@dataclass(slots=True)
class _Bound:
    binding: Read | Mutate | Create
    entity: Entity
    key_values: dict[str, Any]
    store_key: Any
    identity: tuple[str, str]
    """The binding's lock, as `lock_identity` sorts it."""
    aggregate: Any = None
    current: dict[str, Any] = field(default_factory=dict)
    fields: dict[str, Any] = field(default_factory=dict)
    revision: Any = None
    changed: bool = False
    deleted: bool = False
    children: list[tuple[Entity, Any]] = field(default_factory=list)


class _Run:
    def __init__(
        self, command: CheckedCommand, cx: Ops, principal: Any, inputs: dict[str, object],
        retention: timedelta,
    ) -> None:
        self.command = command
        self.cx = cx
        self._principal = principal
        self.inputs = inputs
        self.retention = retention
        self.values: dict[str, object] = dict(inputs)
        self.sealed: dict[str, JsonValue] = {}
        self.bound: dict[str, _Bound] = {}
        self.records: list[tuple[str, DomainEvent]] = []
        self.release: list[OccupancyKey] = []
        self.claims: list[tuple[OccupancyKey, str, Outcome]] = []
        self.transfers: list[Occupancy] = []
        self.release_written = False  # the releases rode with the one claim
        self.causes: dict[tuple[str, str], Cause] = {}
        self.children: list[tuple[Entity, Any]] = []

    @property
    def principal(self) -> Any:
        return self._principal

    def env(self) -> Env:
        """What requirements and effects observe: every binding as it was
        read (effects see the rows before any effect, so ``a.x = b.x`` and
        ``b.x = a.x`` swap), a create's fields as set so far."""
        views: dict[str, object] = {}
        for name, b in self.bound.items():
            views[name] = b.fields if isinstance(b.binding, Create) else b.current
        return Env(self.values, views, None, self.principal)

    def after(self) -> Env:
        """What the return observes: the rows as written."""
        views = {name: b.aggregate for name, b in self.bound.items()}
        return Env(self.values, views, None, self.principal)

    async def execute(self) -> CommandOutcome:
        command = self.command
        key = None if command.idempotency_key is None else str(self.inputs[command.idempotency_key])
        digest = "" if key is None else input_digest(command, self.inputs)
        if key is not None:
            record = await self.cx.load_optional(
                IdempotencyRecord, [command.name, _scope(self.principal), key]
            )
            if record is not None and record.recorded_at >= (self.cx.now() - self.retention).value:
                if record.digest != digest:
                    return CommandOutcome(command.name, IDEMPOTENCY_CONFLICT, False)
                return CommandOutcome.from_record(command.name, record.outcome, record.sealed)
        if command.services:
            sealed_values = seal(command.services, self.cx.now())
            self.values.update(sealed_values)
            self.sealed = {name: encode_value(v) for name, v in sealed_values.items()}
        try:
            outcome = await self._decide_and_write()
        except _Answer as answer:
            outcome = CommandOutcome(command.name, answer.outcome, False, answer.data, self.sealed)
        if key is not None:
            await self.cx.create(IdempotencyRecord(
                command.name, _scope(self.principal), key, digest, outcome.to_record(),
                self.sealed, self.cx.now().value, (self.cx.now() - self.retention).value,
            ))
        return outcome

    # -- deciding -------------------------------------------------------------------

    async def _decide_and_write(self) -> CommandOutcome:
        await self._bind()
        self._require()
        self._effects()
        self._construct()
        self._policies()
        await self._delete_proofs()
        await self._occupancy()
        await self._read_dependencies()
        await self._write()
        env = self.after()
        data = {name: encode_value(_valued(evaluate(e, env), f"return {name}"))
                for name, e in self.command.returns.fields.items()}
        return CommandOutcome(self.command.name, self.command.returns.name, True, data, self.sealed)

    async def _bind(self) -> None:
        key_env = Env(self.values, {}, None, self.principal)
        pending: list[_Bound] = []
        invalid: dict[str, Outcome] = {}
        for binding in self.command.bindings:
            entity = self.command.entities[binding.as_]
            parts = [evaluate(e, key_env) for e in binding.key]
            if any(p is INVALID or p is None for p in parts) or not entity.admits_key(parts):
                invalid[binding.as_] = binding.else_
                continue
            values = dict(zip(entity.key, parts, strict=True))
            store_key = entity.key_of_values(values)
            pending.append(_Bound(binding, entity, values, store_key,
                                  lock_identity(_plan(entity).store_type, store_key)))
        loaded: dict[tuple[str, str], Any] = {}

        # The union of the command's locks, in the one fixed order.
        for b in order_by_lock(pending, _identity_of):
            loaded[b.identity] = await _load(self.cx, b.entity, b.store_key)
        by_name = {b.binding.as_: b for b in pending}
        for binding in self.command.bindings:
            if binding.as_ in invalid:
                raise _Answer(invalid[binding.as_].name)
            b = by_name[binding.as_]
            found = loaded[b.identity]
            if isinstance(binding, Create):
                if found is not None:
                    raise _Answer(binding.else_.name)
                b.fields = dict(b.key_values)
            else:
                if found is None:
                    raise _Answer(binding.else_.name)
                b.aggregate = found
                b.current = row_of(found, _plan(b.entity).all_fields)
                if b.entity.revision is not None:
                    b.revision = getattr(found, b.entity.revision, None)
            self.bound[binding.as_] = b

    def _require(self) -> None:
        env = self.env()
        for clause in self.command.requirements:
            if isinstance(clause, Require):
                if not truth(evaluate(clause.predicate, env)):
                    raise _Answer(clause.else_.name)
                continue
            assert isinstance(clause, Permit)
            for rule in clause.rules:
                if not any(truth(evaluate(c, env)) for c in rule.conditions):
                    raise _Answer(REFUSED, {"reason": rule.reason.code, "action": clause.action})

    def _effects(self) -> None:
        # One view for every effect: the rows as read and each create's
        # fields dict (the same objects as the effects fill in).
        env = self.env()
        for clause in self.command.effects:
            if isinstance(clause, Transition):
                step = self.command.transitions[clause.on]
                b = self.bound[clause.on]
                expected = evaluate(clause.revision, env)
                # The revision first: a stale caller learns it is stale even
                # when the state also moved on.
                if type(expected) is not int or type(b.revision) is not int or (
                    expected != b.revision
                ):
                    raise _Answer(clause.stale.name)
                if getattr(b.aggregate, step.workflow.state, INVALID) not in step.move.sources:
                    raise _Answer(clause.illegal.name)
                setattr(b.aggregate, step.workflow.state, step.move.to)
                b.changed = True
            elif isinstance(clause, Set):
                b = self.bound[clause.binding]
                value = _valued(evaluate(clause.value, env), f"set {clause.field}")
                declared = b.entity.fields[clause.field]
                if not admits(declared, value):
                    raise InvalidInput(f"set {clause.binding}.{clause.field}: {value!r} is not "
                                       f"a {declared.describe()}")
                if b.aggregate is None:
                    b.fields[clause.field] = value
                else:
                    setattr(b.aggregate, clause.field, value)
                    b.changed = True
            elif isinstance(clause, Delete):
                self.bound[clause.binding].deleted = True
            elif isinstance(clause, Record):
                data = {name: encode_value(_valued(evaluate(e, env), name))
                        for name, e in clause.data.items()}
                self.records.append((clause.binding, DomainEvent(clause.type, data)))
                self.bound[clause.binding].changed = True
            elif isinstance(clause, Caused):
                data = {name: encode_value(_valued(evaluate(e, env), name))
                        for name, e in clause.data.items()}
                self.causes[(clause.binding, clause.noun)] = Cause(clause.name, data)

    def _construct(self) -> None:
        for b in self.bound.values():
            if not isinstance(b.binding, Create):
                continue
            fields = dict(b.fields)
            if b.entity.revision is not None:
                fields.setdefault(b.entity.revision, 1)
            b.aggregate = b.entity.aggregate(**fields)
            b.changed = True

    def _policies(self) -> None:
        for b in self.bound.values():
            if b.deleted:
                # The row as it is (what the delete affordance judged).
                policy = b.entity.delete_check
                if policy is not None:
                    self._allow(check_row(policy, b.current, self.principal), "delete")
            elif isinstance(b.binding, Create) and b.entity.create_policy is not None:
                proposed = row_of(b.aggregate, _plan(b.entity).all_fields)
                self._allow(check_row(b.entity.create_policy, proposed, self.principal), "create")
            elif (
                isinstance(b.binding, Mutate) and b.changed and b.entity.update_policy is not None
            ):
                policy = b.entity.update_policy
                # Both rows: the one the affordance judged and the one written.
                self._allow(check_row(policy, b.current, self.principal), "update")
                proposed = row_of(b.aggregate, _plan(b.entity).all_fields)
                self._allow(check_row(policy, proposed, self.principal), "update")

    def _allow(self, verdict: Any, action: str) -> None:
        if verdict.reason is not None:
            raise _Answer(REFUSED, {"reason": verdict.reason.code, "action": action})

    async def _delete_proofs(self) -> None:
        catalog = self.command.catalog
        for name, step in self.command.deletes.items():
            b = self.bound[name]
            policy = step.entity.delete_policy
            target_key = [b.key_values[f] for f in step.entity.key]
            if isinstance(policy, Restrict):
                for ref in policy.indexes:
                    scan = await self._scan(catalog.entities[ref.entity], ref.index, target_key, 1)
                    if scan:
                        assert step.clause.referenced is not None
                        raise _Answer(step.clause.referenced.name)
            elif isinstance(policy, Cascade):
                for edge in policy.edges:
                    child = catalog.entities[edge.entity]
                    keys = await self._scan(child, edge.index, target_key, edge.maximum + 1)
                    if len(keys) > edge.maximum:
                        assert step.clause.too_many is not None
                        raise _Answer(step.clause.too_many.name, {"maximum": edge.maximum})
                    b.children.extend((child, k) for k in keys)
        # Every row a cascade takes, locked in the one fixed order and
        # judged by its own delete row policy, as its affordance is.
        children = [c for b in self.bound.values() for c in b.children]
        for entity, key in order_by_lock(
            children, lambda c: lock_identity(store_of(c[0].aggregate).store_type, c[1])
        ):
            child = await _load(self.cx, entity, key)
            if child is None:
                continue
            check = entity.delete_check
            if check is not None:
                row = row_of(child, _plan(entity).all_fields)
                self._allow(check_row(check, row, self.principal), "delete")
            self.children.append((entity, child))

    async def _scan(
        self, child: Entity, index_name: str, prefix: list[Any], limit: int
    ) -> list[Any]:
        """The store keys of ``child``'s rows under ``prefix`` in one of its
        reverse indexes (at most ``limit``)."""
        index = child.index(index_name)
        assert index is not None
        key_columns = index.key_columns if index.key_columns is not None else child.key
        scan = await self.cx.load_optional(ReverseScan, scan_key(
            index.table, key_columns, index.sql_columns[: len(prefix)], prefix, limit
        ))
        rows = [] if scan is None else scan.keys
        return [child.key_of_values(dict(zip(child.key, row, strict=True))) for row in rows]

    async def _occupancy(self) -> None:
        for b in self.bound.values():
            entity = b.entity
            if not entity.unique or isinstance(b.binding, Read):
                continue
            owner = canonical_json(encode_value(b.store_key))
            before = {} if isinstance(b.binding, Create) else occupancy_keys(entity, b.current)
            if b.deleted:
                self.release.extend(before.values())
                continue
            after = occupancy_keys(entity, row_of(b.aggregate, _plan(entity).all_fields))
            taken = b.binding.taken if isinstance(b.binding, Mutate | Create) else {}
            for index, occupancy in after.items():
                if before.get(index) == occupancy:
                    continue
                self.claims.append((occupancy, owner, taken[index]))
                if index in before:
                    self.release.append(before[index])
        # Children a cascade removes give up their unique values too.
        for entity, child in self.children:
            self.release.extend(occupancy_keys(entity, row_of(child, entity.all_fields)).values())
        # The claims in the one fixed order, each under its value's lock: a
        # conditional insert takes a free value; a value another row holds
        # answers the declared outcome, and the claims made so far are taken
        # back so the outcome changes nothing. Releases are written last.
        # Every value's lock, claimed or released, is taken first, in that
        # order, in one round trip.
        released = set(self.release)
        made: list[Occupancy] = []
        store = Occupancy.Store.store_type
        values = order_by_lock(
            [c[0] for c in self.claims] + self.release, lambda o: lock_identity(store, o.as_key())
        )
        if (
            len(self.claims) == 1 and self.claims[0][0] not in released
            and isinstance(self.cx, Ops)
        ):
            # One value claimed (a rename, a create): the locks, the claim
            # and, only when it took the value, the releases, in one round
            # trip. A held value releases nothing and answers below.
            (occupancy, owner, outcome), = self.claims
            row = Occupancy.of(occupancy.as_key(), owner)
            status = await self.cx._lock_all(
                [(Occupancy.Store, o.as_key()) for o in values],
                then=claim_statement(row, [o.as_key() for o in self.release]),
            )
            if claimed(status):
                self.release_written = True
                return
            held = await self.cx.load_optional(Occupancy, occupancy.as_key())
            if held is not None and held.owner == owner:
                return
            raise _Answer(outcome.name)
        if len(values) > 1 and isinstance(self.cx, Ops):
            await self.cx._lock_all([(Occupancy.Store, o.as_key()) for o in values])
        for occupancy, owner, outcome in order_by_lock(
            self.claims, lambda c: lock_identity(store, c[0].as_key())
        ):
            row = Occupancy.of(occupancy.as_key(), owner)
            await self.cx.create(row)
            if row.claimed:
                made.append(row)
                continue
            if occupancy in released:
                self.transfers.append(row)  # freed by this command, taken again
                continue
            held = await self.cx.load_optional(Occupancy, occupancy.as_key())
            if held is not None and held.owner == owner:
                continue
            for claim in made:
                await self.cx.delete(claim)
            raise _Answer(outcome.name)

    async def _read_dependencies(self) -> None:
        # A checked transition keeps the entity's version as a read
        # dependency: re-read it under the held lock; a write that slipped
        # past the lock (a store without row locks, a writer outside the
        # pipeline) fails the commit instead of being lost.
        for name in self.command.transitions:
            b = self.bound[name]
            fresh = await _load(self.cx, b.entity, b.store_key)
            revision = b.entity.revision
            assert revision is not None
            if fresh is None or getattr(fresh, revision, None) != b.revision:
                raise TransientConflict(
                    f"{b.entity.name} {b.store_key!r} changed between its check and the commit",
                    Stage.SAVE,
                )

    # -- writing --------------------------------------------------------------------

    async def _write(self) -> None:
        cx = self.cx
        for entity, child in self.children:
            await cx.delete(child)
            for noun in entity.nouns:
                cx.impact(noun, encode_value(store_of(entity.aggregate).key_of(child)))
        for binding_name, event in self.records:
            self.bound[binding_name].aggregate.record(event)
        for b in self.bound.values():
            if isinstance(b.binding, Read):
                continue
            if b.deleted:
                await cx.delete(b.aggregate)
            elif isinstance(b.binding, Create):
                await cx.create(b.aggregate)
            elif b.changed:
                if b.entity.revision is not None and type(b.revision) is int:
                    setattr(b.aggregate, b.entity.revision, b.revision + 1)
                await cx.save(b.aggregate)
            else:
                continue
            for noun in b.entity.nouns:
                cause = self.causes.get((b.binding.as_, noun))
                if cause is None:
                    cx.impact(noun, encode_value(b.store_key))
                else:
                    cx.impact_caused(noun, encode_value(b.store_key), cause)
        transferred = {tuple(row.occupancy_key) for row in self.transfers}
        for occupancy in [] if self.release_written else self.release:
            if tuple(occupancy.as_key()) not in transferred:
                await cx.delete(Occupancy.of(occupancy.as_key(), ""))
        for row in self.transfers:
            await cx.save(row)
        after = self.after()
        for clause in self.command.effects:
            if isinstance(clause, Emit):
                what = f"emit {clause.event.__qualname__}"
                cx.emit(clause.event(**{
                    name: encode_value(_valued(evaluate(e, after), f"{what}.{name}"))
                    for name, e in clause.fields.items()
                }))


def _valued(value: Any, what: str) -> Any:
    if value is INVALID:
        raise ValueMissing(f"{what} evaluated to nothing (a missing field or mistyped value)")
    return value


async def _load(cx: Ops, entity: Entity, key: Any) -> Any:
    aggregate_type = cast(type[Aggregate], entity.aggregate)
    return await cx.load_optional(aggregate_type, key)

