"""Pure parts of the reference service's card and ledger slices: the window
cursor, the version-1 amount, the ledger's fold, barrier and redactor."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from example_service.slices.card.domain import BadCursor, Card, decode_cursor, encode_cursor
from example_service.slices.ledger.domain import (
    ERASED,
    Ledger,
    cents_of,
    redact_person,
)
from service_engine import DomainEvent

IDS = st.from_regex(r"[A-Za-z0-9_-]{1,64}", fullmatch=True)


@pytest.mark.slow
@given(IDS, st.datetimes(timezones=st.just(UTC)))
def test_a_cursor_round_trips_a_cards_place(card_id: str, created: datetime) -> None:
    """A card's paging cursor decodes back to its creation time and id (property test)."""
    card = Card(card_id, "acme", "t", "bob", created)
    at, key = decode_cursor(encode_cursor(card))
    assert (datetime.fromisoformat(at), key) == (created, card_id)


@pytest.mark.parametrize("cursor", ["", "x", "2030-01-01~", "nonsense~c-1", "2030-01-01~bad id"])
def test_a_foreign_cursor_is_refused(cursor: str) -> None:
    """A cursor the card slice did not make is refused with BadCursor."""
    with pytest.raises(BadCursor):
        decode_cursor(cursor)


@pytest.mark.parametrize(("amount", "cents"), [("12.34", 1234), ("-5", -500), ("0.1", 10)])
def test_a_version_1_amount_reads_as_cents(amount: str, cents: int) -> None:
    """A version-1 decimal amount reads as whole cents."""
    assert cents_of(amount) == cents


@pytest.mark.parametrize("amount", ["1.234", "ten", ""])
def test_an_amount_that_is_no_whole_cents_is_refused(amount: str) -> None:
    """An amount with fractions of a cent or that is not a number is refused."""
    with pytest.raises(ValueError):
        cents_of(amount)


def test_the_upcast_brings_a_version_1_posting_to_version_2() -> None:
    """The ledger's upcast turns a version-1 posting into version 2 (cents, memo) and leaves other
    events alone."""
    old = DomainEvent("posted", {"amount": "1.50", "note": "tea", "by": "ann"})
    assert Ledger.upcast(old, 1) == DomainEvent("posted", {"cents": 150, "memo": "tea", "by": "ann"})
    opened = DomainEvent("opened", {"org": "o", "name": "n", "owner": "ann"})
    assert Ledger.upcast(opened, 1) == opened


def test_the_fold_keeps_the_latest_postings_and_the_barrier_judges_it() -> None:
    """The ledger's fold keeps its balance, count and the five latest postings (surviving a
    snapshot); the hydration barrier refuses a log with no opening and a negative balance."""
    ledger = Ledger.open("acme", "l", "ann")
    for i in range(7):
        ledger.post(10 + i, f"#{i}", "ann")
    assert (ledger.balance, ledger.postings) == (sum(range(10, 17)), 7)
    assert [memo for _, memo, _ in ledger.recent] == ["#2", "#3", "#4", "#5", "#6"]
    assert ledger.check_hydrated() is None
    assert Ledger.from_snapshot(["acme", "l"], ledger.to_snapshot()).recent == ledger.recent
    assert Ledger.genesis(["acme", "l"]).check_hydrated() == "the log has no opening event"
    overdrawn = Ledger("acme", "l", opened=True, balance=-1)
    assert "negative" in (overdrawn.check_hydrated() or "")


def test_the_redactor_touches_only_the_persons_events() -> None:
    """The ledger's erasure redactor blanks the erased person's name and memos in their events and
    leaves others' events alone."""
    posted = DomainEvent("posted", {"cents": 5, "memo": "ann's", "by": "ann"})
    assert redact_person(posted, "ann") == DomainEvent(
        "posted", {"cents": 5, "memo": "", "by": ERASED})
    assert redact_person(posted, "bob") is None
    opened = DomainEvent("opened", {"org": "o", "name": "n", "owner": "ann"})
    assert redact_person(opened, "ann") == DomainEvent(
        "opened", {"org": "o", "name": "n", "owner": ERASED})
