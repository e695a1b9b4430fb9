"""Offer declarations, KV keys and the dirty marks a transaction stages:
pure, no I/O."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ClassVar

import pytest

from service_engine import Aggregate, CrudStore, EngineConfig
from service_engine.errors import ConfigError, DeclarationError, DuplicateRegistration
from service_engine.offers import Offer, Published
from service_engine.offers.model import offers_of, register_offer_type
from service_engine.offers.staging import DirtyMarks


@dataclass
class Thing(Aggregate):
    id: str
    label: str

    Store: ClassVar[Any]


class ThingStore(CrudStore[Thing, str]):
    TABLE = "thing"
    COLUMNS = ("id", "label")

    def to_row(self, thing: Thing) -> dict[str, object]:
        return {"id": thing.id, "label": thing.label}

    def from_row(self, row: Any) -> Thing:
        return Thing(row["id"], row["label"])


Thing.Store = ThingStore()


class ThingPublished(Published):
    BUCKET: ClassVar[str] = "PUBLISHED_unit"
    PREFIX: ClassVar[str] = "unit.thing"
    id: str
    label: str


class ThingOffer(Offer[Thing, str, ThingPublished]):
    NAME = "unit_things"
    ROW = Thing
    PUBLISHED = ThingPublished

    def publish(self, row: Thing) -> ThingPublished | None:
        return ThingPublished(id=row.id, label=row.label)

    async def keys(self, conn: Any) -> Iterable[str]:
        return []


def test_an_offer_takes_its_bucket_and_prefix_from_its_published_language() -> None:
    """An offer's bucket, key prefix and lease slot derive from its published language; a key is
    prefix.key."""
    offer = ThingOffer()
    offer.validate()
    assert (offer.bucket, offer.prefix, offer.slot) == (
        "PUBLISHED_unit", "unit.thing", "offer:unit_things",
    )
    assert offer.kv_key("t-1") == "unit.thing.t-1"


def test_a_published_value_encodes_canonically() -> None:
    """A published value encodes as canonical JSON and decodes back equal."""
    a = ThingPublished(id="1", label="x")
    assert a.encode() == b'{"id":"1","label":"x"}'
    assert ThingPublished.decode(a.encode()) == a


def test_a_key_that_is_no_kv_token_is_refused_where_it_is_staged() -> None:
    """A key that is not a KV token is refused when it is staged, naming why."""
    with pytest.raises(DeclarationError, match="not a KV key token"):
        ThingOffer().kv_key("has space")


@pytest.mark.parametrize(
    ("attrs", "message"),
    [
        ({"NAME": "bad name"}, "NAME"),
        ({"ROW": int}, "ROW"),
        ({"PUBLISHED": dict}, "PUBLISHED"),
        ({"PREFIX": "bad..prefix"}, "PREFIX"),
        ({"BUCKET": "bad.bucket"}, "BUCKET"),
    ],
)
def test_a_malformed_offer_is_refused_with_a_declaration_error(
    attrs: dict[str, Any], message: str
) -> None:
    """A malformed name, row type, published type, prefix or bucket is a DeclarationError naming the
    attribute."""
    broken = type("Broken", (ThingOffer,), attrs)
    with pytest.raises(DeclarationError, match=message):
        broken().validate()


def test_an_offer_must_implement_publish_and_keys() -> None:
    """An offer that does not implement publish is refused."""
    class NoPublish(Offer[Thing, str, ThingPublished]):
        NAME = "np"
        ROW = Thing
        PUBLISHED = ThingPublished

    with pytest.raises(DeclarationError, match="publish"):
        NoPublish().validate()


def test_registering_marks_the_noun_and_refuses_another_class_under_the_name() -> None:
    """Registering an offer marks its noun as offered (again is a no-op); another class under the
    same name is DuplicateRegistration."""
    register_offer_type(ThingOffer())
    register_offer_type(ThingOffer())  # a second pod in one process: a no-op
    assert [o.NAME for o in offers_of(Thing)] == ["unit_things"]

    class Impostor(ThingOffer):
        pass

    with pytest.raises(DuplicateRegistration):
        register_offer_type(Impostor())


def test_dirty_marks_collapse_per_key_and_skip_unoffered_nouns() -> None:
    """Dirty marks collapse per key, in order, and skip nouns no offer carries."""
    register_offer_type(ThingOffer())
    marks = DirtyMarks()
    marks.aggregate(Thing, "a")
    marks.aggregate(Thing, "a")
    marks.aggregate(Thing, "b")
    marks.aggregate(int, "c")
    assert [(m.offer, m.kv_key, m.agg_key) for m in marks.marks()] == [
        ("unit_things", "unit.thing.a", '"a"'),
        ("unit_things", "unit.thing.b", '"b"'),
    ]


def test_the_reconcile_and_mirror_bounds_are_validated() -> None:
    """The offer and mirror bounds default as documented and refuse reconciles not longer than the
    beat, a backoff above its cap, and a zero drain batch."""
    config = EngineConfig()
    assert config.offer_reconcile == timedelta(minutes=5)
    with pytest.raises(ConfigError, match="offer_reconcile > beat_interval"):
        EngineConfig(offer_reconcile=timedelta(milliseconds=500))
    with pytest.raises(ConfigError, match="mirror_reconcile > beat_interval"):
        EngineConfig(mirror_reconcile=timedelta(0))
    with pytest.raises(ConfigError, match="mirror_restart_backoff_cap"):
        EngineConfig(mirror_restart_backoff=timedelta(seconds=60))
    with pytest.raises(ConfigError, match="offer_drain_batch > 0"):
        EngineConfig(offer_drain_batch=0)
