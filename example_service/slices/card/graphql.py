"""The card slice's root fields: queries read rendered views through the
engine; mutations run on the engine's mutation executor (the import on its
bulk form); the subscriptions stream the cards projector's typed union, one
of them under a client-supplied session id that ``pageCards`` pages back.

``startCard`` and ``finishCard`` are declared commands (`workflow`): each
takes the card's ``revision`` as the caller saw it and an idempotency key,
and answers a `CardResult` whose ``outcome`` names the typed outcome:

* ``Started`` / ``Finished`` (``success: true``) — the stage moved;
* ``StaleRevision`` (``error.code`` ``card.stale_revision``) — the card
  changed since that revision; nothing changed;
* ``IllegalStage`` (``card.illegal_stage``) — the right revision, but the card
  is not in the stage the transition leaves; nothing changed;
* ``CardMissing`` (``card.card_missing``) — no such card;
* ``Refused`` — the ``advance`` gate's reason (``card.advance_scope_required``,
  ``card.done``, ...), the same code as the view's affordance;
* ``IdempotencyConflict`` (``card.idempotency_conflict``) — the key was used
  with other inputs.

Every answer but a conflict is stored under the key: a retry with it answers
the same outcome again (``replayed: true``) and runs nothing. ``card`` is the
card as the caller now sees it, on a refusal too (its current revision).
Failures of the pipeline itself keep `MutationError`'s codes (``lock_timeout``,
retryable, ...) with ``outcome`` null.
"""

from __future__ import annotations

import strawberry

from service_engine import MutationError, Query, WindowSpec
from service_engine.commands import CheckedCommand, CommandRunner
from service_engine.errors import EngineError, NoLiveSession
from service_engine.graphql import CommandResult, Live, MutationResult, Views

from ...kernel import Info
from .commands import ImportedCard, create_card, import_cards, rename_card
from .domain import NOUN, BadCursor, decode_cursor
from .views import CARDS, CardsQuery, CardView
from .workflow import FINISH_CARD, START_CARD

CARD_VIEWS = Views(CARDS, CardView, description="the caller's org's cards")


@strawberry.type(description="The outcome of a card mutation: the card as the caller now "
                             "sees it, or why nothing changed.")
class CardResult(CommandResult):
    card_id: strawberry.Private[str | None] = None
    card: CardView | None = CARD_VIEWS.after_commit("card_id")


@strawberry.type(description="The outcome of a bulk import.")
class ImportResult(MutationResult):
    imported: int = 0


@strawberry.type(description="The outcome of a page request: the page's cards arrive on the "
                             "session's subscription as Upserts; the keys released to keep "
                             "the window within its capacity are listed here.")
class PageResult(MutationResult):
    delivered: int = 0
    released: list[str] = strawberry.field(default_factory=list)
    truncated: int = 0


@strawberry.input(description="One card of a bulk import.")
class CardImport:
    title: str
    id: strawberry.ID | None = None


async def _command(
    info: Info, command: CheckedCommand, card_id: str, expected_revision: int,
    idempotency_key: str,
) -> CardResult:
    outcome = await CommandRunner(info.context.engine.mutation_executor()).run(
        command, info.context.principal, {
            "idempotency_key": idempotency_key, "card_id": card_id,
            "expected_revision": expected_revision,
        })
    return CardResult.of(outcome, noun=NOUN, card_id=card_id)


def _refused(code: str, message: str, retryable: bool = False) -> PageResult:
    return PageResult.refused(MutationError(code, message, retryable))


@strawberry.type
class CardQuery:
    @strawberry.field(description="The caller's org's newest cards.")
    async def cards(self, info: Info, limit: int = 50) -> list[CardView]:
        return await CARD_VIEWS.window(info.context, CardsQuery(limit))

    @strawberry.field(description="One card, if the caller sees it.")
    async def card(self, info: Info, id: strawberry.ID) -> CardView | None:
        return await CARD_VIEWS.one(info.context, str(id))


@strawberry.type
class CardMutation:
    @strawberry.mutation(description="Create a card in the caller's org; with dueInSeconds it "
                                     "is flagged overdue once the deadline passes undone.")
    async def create_card(
        self, info: Info, title: str, id: strawberry.ID | None = None,
        due_in_seconds: float | None = None,
    ) -> CardResult:
        outcome = await info.context.execute(
            create_card, title, None if id is None else str(id), due_in_seconds
        )
        return CardResult.of(outcome, "card_id")

    @strawberry.mutation
    async def rename_card(self, info: Info, id: strawberry.ID, title: str) -> CardResult:
        outcome = await info.context.execute(rename_card, str(id), title)
        return CardResult.of(outcome, card_id=str(id))

    @strawberry.mutation(description="Move a card from todo to doing (needs card:advance), "
                                     "if it is still at expectedRevision; idempotent under "
                                     "idempotencyKey. See CardResult.outcome.")
    async def start_card(
        self, info: Info, id: strawberry.ID, expected_revision: int, idempotency_key: str
    ) -> CardResult:
        return await _command(info, START_CARD, str(id), expected_revision, idempotency_key)

    @strawberry.mutation(description="Move a card from doing to done (needs card:advance), "
                                     "if it is still at expectedRevision; idempotent under "
                                     "idempotencyKey. See CardResult.outcome.")
    async def finish_card(
        self, info: Info, id: strawberry.ID, expected_revision: int, idempotency_key: str
    ) -> CardResult:
        return await _command(info, FINISH_CARD, str(id), expected_revision, idempotency_key)

    @strawberry.mutation(description="Create many cards in one transaction; live windows get "
                                     "one Reset rather than one Upsert per card.")
    async def import_cards(self, info: Info, cards: list[CardImport]) -> ImportResult:
        items = [ImportedCard(c.title, None if c.id is None else str(c.id)) for c in cards]
        outcome = await info.context.engine.mutation_executor().execute_bulk(
            info.context.principal, import_cards, items
        )
        return ImportResult.of(outcome, "imported")

    @strawberry.mutation(description="Append the page of cards older than cursor behind the "
                                     "live window of the caller's cardPageDeltas session.")
    async def page_cards(self, info: Info, session_id: str, cursor: str) -> PageResult:
        try:
            position = decode_cursor(cursor)
        except BadCursor:
            return _refused("card.cursor_invalid", "not a card cursor")
        try:
            page = await info.context.engine.page(session_id, info.context.principal, position)
        except NoLiveSession as exc:
            return _refused("no_live_session", str(exc))
        except EngineError as exc:  # the window was re-snapshotted meanwhile: ask again
            return _refused("page_interrupted", str(exc), True)
        return PageResult(
            success=True, delivered=len(page.deltas), released=list(page.released),
            truncated=page.truncated,
        )


@strawberry.type
class CardSubscription:
    @CARD_VIEWS.field(description="The caller's org's newest cards, live.")
    def cards(self, limit: int = 50) -> WindowSpec[CardsQuery]:
        return WindowSpec(Query(CardsQuery(limit)))

    @CARD_VIEWS.field(description="The caller's org's newest cards, live, under the client's "
                                  "sessionId: pageCards(sessionId, cursor) appends older cards "
                                  "to this window as Upserts.")
    def card_page_deltas(self, session_id: str, limit: int = 50) -> Live:
        return CARD_VIEWS.live(WindowSpec(Query(CardsQuery(limit))), session_id=session_id)


TYPES = (CardView, CardResult, ImportResult, PageResult, CardImport, *CARD_VIEWS.types)
