"""The runner's pure steps: inputs, uuid_v7, sealing, digests, lock order,
occupancy keys, and the configuration's bounds (no database)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from service_engine.clock import Timestamp
from service_engine.commands import (
    TRANSACTION_TIME,
    UUID_V7,
    Catalog,
    Command,
    CommandConfig,
    CommandOutcome,
    Create,
    Entity,
    IdempotencyKey,
    Input,
    InvalidInput,
    Outcome,
    Return,
    Service,
    Set,
    Unique,
    Var,
    uuid_v7,
)
from service_engine.commands.plan import (
    encode_value,
    input_digest,
    lock_identity,
    occupancy_keys,
    order_by_lock,
    seal,
    unseal,
    validate_inputs,
)
from service_engine.errors import ConfigError


class _Store:
    TABLE = "rows"  # what the compiler writes into the generated function (no I/O here)

    async def load(self, conn: Any, key: Any) -> None:
        return None


@dataclass
class Item:
    org: str
    id: str
    name: str
    version: int = 1
    Store: ClassVar[Any] = _Store()


ITEM = Entity("Item", Item, key=("org", "id"), partition_by=("org",), conflict_key=("id",),
              revision="version",
              unique=(Unique("by_name", ("org", "name")),))
CATALOG = Catalog([ITEM])
CREATE = CATALOG.command(Command(
    "CreateItem",
    Input("key", str, max_length=8), Input("org", str), Input("id", str), Input("name", str),
    Input("count", int, optional=True), Input("ref", uuid.UUID, optional=True),
    Input("at", datetime, optional=True), Input("ratio", float, optional=True),
    Service("made", UUID_V7), Service("when", TRANSACTION_TIME),
    IdempotencyKey("key"),
    Create("Item", (Var("org"), Var("id")), as_="item", else_=Outcome("Exists"),
           taken={"by_name": Outcome("NameTaken")}),
    Set("item", "name", Var("name")),
    Return("Created"),
))
BASE = {"key": "k", "org": "acme", "id": "i", "name": "n"}


def test_inputs_are_validated_strictly() -> None:
    """Inputs convert only losslessly (uuid text, int to float) and an absent optional is None;
    a missing, mistyped, naive, over-long, service-named or unknown input is InvalidInput."""
    values = validate_inputs(CREATE, {**BASE, "ref": "01900000-0000-7000-8000-000000000001",
                                      "ratio": 1})
    assert isinstance(values["ref"], uuid.UUID) and values["ratio"] == 1.0
    assert values["count"] is None
    for bad in (
        {k: v for k, v in BASE.items() if k != "name"},
        {**BASE, "count": True},
        {**BASE, "count": "1"},
        {**BASE, "ref": "nope"},
        {**BASE, "at": datetime(2026, 1, 1)},  # naive
        {**BASE, "key": "x" * 9},
        {**BASE, "made": str(uuid.uuid4())},
        {**BASE, "extra": 1},
    ):
        with pytest.raises(InvalidInput):
            validate_inputs(CREATE, bad)


@given(st.integers(0, (1 << 48) - 1), st.binary(min_size=10, max_size=10))
def test_uuid_v7_is_version_7_and_time_ordered(ms: int, rand: bytes) -> None:
    """uuid_v7 is an RFC 4122 version-7 uuid carrying its milliseconds in the top 48 bits, so
    one of a later millisecond sorts after it."""
    value = uuid_v7(ms, rand)
    assert value.version == 7 and value.variant == uuid.RFC_4122
    assert value.int >> 80 == ms
    later = uuid_v7(ms + 1, bytes(10)) if ms + 1 < 1 << 48 else None
    assert later is None or later > value


def test_sealed_values_round_trip() -> None:
    """Sealed service values (the transaction time and a uuid_v7 of that instant) unseal equal
    from their stored form; a stored instant that is not text is refused."""
    now = Timestamp(datetime(2026, 12, 1, 9, 0, tzinfo=UTC))
    sealed = seal(CREATE.services, now)
    assert sealed["when"] == now.value and isinstance(sealed["made"], uuid.UUID)
    assert uuid.UUID(str(sealed["made"])).int >> 80 == now.epoch_micros // 1000
    stored = {k: encode_value(v) for k, v in sealed.items()}
    assert unseal(CREATE.services, stored) == sealed
    with pytest.raises(ValueError, match=r"^sealed when is not text: 5$"):
        unseal(CREATE.services, {**stored, "when": 5})


def test_the_digest_ignores_the_key_and_sees_every_other_input() -> None:
    """The input digest is unchanged by the idempotency key and changed by any other input."""
    a = validate_inputs(CREATE, BASE)
    assert input_digest(CREATE, a) == input_digest(CREATE, {**a, "key": "other"})
    assert input_digest(CREATE, a) != input_digest(CREATE, {**a, "name": "m"})


@pytest.mark.slow
@given(st.lists(st.tuples(st.sampled_from(["s1", "s2"]), st.text(max_size=3)), max_size=12))
def test_lock_order_is_one_total_order(items: list[tuple[str, str]]) -> None:
    """Lock order is the same whatever order the rows arrive in and holds each row once, so
    two writers never lock in opposite orders."""
    forward = order_by_lock(items, lambda i: lock_identity(i[0], i[1]))
    backward = order_by_lock(list(reversed(items)), lambda i: lock_identity(i[0], i[1]))
    assert forward == backward
    assert len(forward) == len(set(items))


def test_occupancy_is_keyed_inside_the_partition() -> None:
    """A unique key's occupancy is keyed by partition and value, so one value in two
    partitions is two keys; a None value occupies nothing."""
    mine = occupancy_keys(ITEM, {"org": "acme", "id": "1", "name": "x"})["by_name"]
    theirs = occupancy_keys(ITEM, {"org": "umbrella", "id": "2", "name": "x"})["by_name"]
    assert (mine.partition, mine.value) == ('["acme"]', '["x"]')
    assert mine != theirs and mine.value == theirs.value
    assert occupancy_keys(ITEM, {"org": "acme", "id": "1", "name": None}) == {}


def test_the_command_config_bounds_its_retention() -> None:
    """Idempotency retention defaults to one day and is refused below a minute or beyond
    30 days, as is a sweep batch of zero."""
    assert CommandConfig().idempotency_retention == timedelta(days=1)
    with pytest.raises(ConfigError):
        CommandConfig(idempotency_retention=timedelta(seconds=5))
    with pytest.raises(ConfigError):
        CommandConfig(idempotency_retention=timedelta(days=31))
    with pytest.raises(ConfigError):
        CommandConfig(sweep_batch=0)


def test_an_outcome_is_a_typed_wire_value() -> None:
    """An outcome's wire form carries outcome, ok, data, sealed values and replayed; rebuilt
    from its stored record it is equal, marked replayed and not mutated."""
    outcome = CommandOutcome("C", "StaleRevision", False, {}, {"id": "x"})
    assert outcome.to_wire() == {"outcome": "StaleRevision", "ok": False, "data": {},
                                 "sealed": {"id": "x"}, "replayed": False}
    replay = CommandOutcome.from_record("C", outcome.to_record(), outcome.sealed)
    assert replay == outcome and replay.replayed and not replay.mutated


def test_an_outcome_names_its_stable_code() -> None:
    """An outcome's code is the namespace and its snake-cased name, a refusal's is the gate's
    reason, and a success has none."""
    assert CommandOutcome("C", "StaleRevision", False).code("card") == "card.stale_revision"
    assert CommandOutcome("C", "IdempotencyConflict", False).code("b") == "b.idempotency_conflict"
    refused = CommandOutcome("C", "Refused", False, {"reason": "card.done", "action": "advance"})
    assert refused.code("card") == "card.done"
    assert CommandOutcome("C", "Started", True).code("card") is None



def test_encode_value_keeps_plain_values_and_converts_the_rest() -> None:
    """Exact plain types are their own JSON; subclasses, uuids, instants and
    containers are converted as before the plain-type shortcut."""
    import enum

    class Level(enum.IntEnum):
        HIGH = 2

    for plain in ("t", 3, 2.5, True, None):
        assert encode_value(plain) is plain
    assert encode_value(Level.HIGH) == 2
    assert encode_value(uuid.UUID(int=1)) == "00000000-0000-0000-0000-000000000001"
    assert encode_value((1, [uuid.UUID(int=0)])) == [1, ["00000000-0000-0000-0000-000000000000"]]
    assert encode_value(datetime(2026, 1, 1, tzinfo=UTC)) == "2026-01-01T00:00:00+00:00"
    with pytest.raises(TypeError):
        encode_value(object())
