"""The twin and the card slice share no code, only the wire: each message
one side writes is read by the other, with the same coordinates."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import BaseModel

from example_service.slices.card import messages as service
from example_service.slices.card.reactions import reactions
from example_twin import contract as twin

PAIRS: list[tuple[type[BaseModel], type[BaseModel]]] = [
    # (writer, reader)
    (twin.CreateCard, service.CreateCard),
    (twin.AdvanceCard, service.AdvanceCard),
    (twin.ReviewApproved, service.ReviewApproved),
    (service.CardCreated, twin.CardCreated),
    (service.CardAdvanced, twin.CardAdvanced),
    (service.CardReviewed, twin.CardReviewed),
    (service.CardRejected, twin.CardRejected),
]

SAMPLES: dict[type[BaseModel], BaseModel] = {
    twin.CreateCard: twin.CreateCard(card_id="c-1", org="acme", title="t", due_in_seconds=2.5),
    twin.AdvanceCard: twin.AdvanceCard(card_id="c-1", expected_revision=1),
    twin.ReviewApproved: twin.ReviewApproved(card_id="c-1"),
    service.CardCreated: service.CardCreated(
        card_id="c-1", version=1, org="acme", title="t", stage="todo",
        due_at=datetime(2030, 1, 1, tzinfo=UTC),
    ),
    service.CardAdvanced: service.CardAdvanced(card_id="c-1", version=2, stage="doing"),
    service.CardReviewed: service.CardReviewed(card_id="c-1", version=3, reviewed_by="twin"),
    service.CardRejected: service.CardRejected(
        card_id="c-1", command="card.create", code="card.exists", message="exists"
    ),
}


@pytest.mark.parametrize(("writer", "reader"), PAIRS, ids=lambda t: t.__qualname__)
def test_what_one_side_writes_the_other_reads_unchanged(
    writer: type[BaseModel], reader: type[BaseModel]
) -> None:
    """For each message the twin and the service exchange, what the writer writes the reader reads
    unchanged, and the reader expects no field the writer does not write."""
    wire = SAMPLES[writer].model_dump(mode="json")
    read = reader.model_validate(wire)
    shared = set(reader.model_fields) & set(writer.model_fields)
    assert shared == set(reader.model_fields), "the reader expects a field nobody writes"
    assert read.model_dump(mode="json") == {name: wire[name] for name in reader.model_fields}


def test_the_twins_coordinates_are_the_reactions_coordinates() -> None:
    """The twin's aggregates, verbs and facts are the reference service's reactions' coordinates and
    subjects."""
    by_name = {r.name: r for r in reactions("example")}
    assert (by_name["create_card"].aggregate, by_name["create_card"].action) == (
        twin.CARD, twin.CreateCard.VERB)
    assert (by_name["advance_card"].aggregate, by_name["advance_card"].action) == (
        twin.CARD, twin.AdvanceCard.VERB)
    review = by_name["record_review"]
    assert (review.service, review.aggregate, review.action) == (
        service.REVIEWER, twin.REVIEW, twin.ReviewApproved.FACT)
    assert review.subject("example") == "integration.evt.twin.review.approved"
    assert by_name["create_card"].subject("example") == "integration.cmd.example.card.create"
    assert by_name["expire_card"].subject("example") == "integration.evt.example.card.due"
