"""The card's declared commands: its stage changes as revision-checked
workflow transitions with idempotency keys (the command layer,
`service_engine.commands`).

The card's stages close one workflow, ``CardStages``: ``Start`` (todo →
doing) and ``Finish`` (doing → done). `START_CARD` and `FINISH_CARD` each
name the revision the caller saw (``expected_revision``, the card's
``revision`` on its view) and an idempotency key:

* the ``advance`` permit first (``Refused`` with its reason: the rules of
  `Card.can_advance`, the view's ``advance`` affordance, declared over the
  card row and the principal's facts so the command compiles);
* a revision other than the card's is ``StaleRevision``, the right revision
  in another stage ``IllegalStage`` — both change nothing;
* otherwise the stage moves, the card's revision counts it, its
  ``card.advanced`` fact is recorded and its ``CardAdvanced`` event emitted,
  all in the commit that stores the key's outcome: a retry with the key
  answers that outcome again and runs nothing.

An unknown card is ``CardMissing``; a card of another org is the permit's
``card.forbidden``.
"""

from __future__ import annotations

from service_engine.commands import (
    Catalog,
    Caused,
    CheckedCommand,
    Command,
    Const,
    Contains,
    Emit,
    Entity,
    Eq,
    Fact,
    Field,
    IdempotencyKey,
    Input,
    Mutate,
    Ne,
    Outcome,
    Permit,
    Record,
    Return,
    Transition,
    Unless,
    Var,
    Workflow,
    WorkflowTransition,
)

from .domain import ADVANCE_SCOPE, CARD_ADVANCE, DONE, FORBIDDEN, NOUN, STAGES, Card
from .messages import CardAdvanced

__all__ = ["CARD", "CARD_STAGES", "CATALOG", "COMMANDS", "FINISH_CARD", "START_CARD"]

# Cards are one partition (the fixed scope: a card is addressed by its id
# alone, and who may change it is its gates' business, so the refusal of a
# card of another org is the gate's ``card.forbidden``, as its affordance
# says); writers contend only on the card id, the conflict key.
CARD = Entity("Card", Card, key=("id",), conflict_key=("id",), revision="version", nouns=(NOUN,))
CARD_STAGES = Workflow(
    "CardStages", "Card", "stage", STAGES,
    (WorkflowTransition("Start", ("todo",), "doing"),
     WorkflowTransition("Finish", ("doing",), "done")),
)
CATALOG = Catalog([CARD], [CARD_STAGES], facts={
    "id": str, "org": str | None, "kind": str, "roles": frozenset[str],
})

A_SERVICE = Eq(Fact("kind"), Const("service"))
ADVANCE = Permit(
    "advance",
    # `Card.acts_on`: a service on its own authority, or a person of its org.
    Unless(FORBIDDEN, A_SERVICE, Eq(Field("card", "org"), Fact("org"))),
    Unless(ADVANCE_SCOPE, A_SERVICE, Contains(Fact("roles"), Const(CARD_ADVANCE))),
    Unless(DONE, Ne(Field("card", "stage"), Const("done"))),
)
"""`Card.can_advance` (the view's ``advance`` affordance), rule for rule."""


def _stage_change(name: str, transition: str, to: str, success: str) -> CheckedCommand:
    return CATALOG.command(Command(
        name,
        Input("idempotency_key", str, max_length=128),
        Input("card_id", str, max_length=64),
        Input("expected_revision", int),
        IdempotencyKey("idempotency_key"),
        Mutate("Card", (Var("card_id"),), as_="card", else_=Outcome("CardMissing")),
        ADVANCE,
        Transition(f"CardStages.{transition}", on="card", revision=Var("expected_revision"),
                   stale=Outcome("StaleRevision"), illegal=Outcome("IllegalStage")),
        Record("card", "card.advanced", {"stage": Const(to), "by": Fact("id")}),
        Caused("card", NOUN, "card.advanced",
               {"card": Var("card_id"), "by": Fact("id"), "stage": Const(to)}),
        Emit(CardAdvanced, card_id=Field("card", "id"), version=Field("card", "version"),
             stage=Field("card", "stage")),
        Return(success, revision=Field("card", "version"), stage=Field("card", "stage")),
    ))


START_CARD = _stage_change("StartCard", "Start", "doing", "Started")
FINISH_CARD = _stage_change("FinishCard", "Finish", "done", "Finished")
COMMANDS = (START_CARD, FINISH_CARD)
"""The card's commands: the schema owner installs their functions, a pod
registers them (`Engine.register_commands`)."""
