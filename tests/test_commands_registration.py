"""Registration answers exactly the command the runner executes, and each
refusal says which declaration is wrong and why (pure: no database).

Every case here is one a wrong check would let through: a relationship
after an optional one, a required field after a defaulted one, a create
that sets nothing, the delete step the runner reads its policy from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

from service_engine.commands import (
    BindingError,
    Catalog,
    Command,
    Const,
    Create,
    Delete,
    Entity,
    Eq,
    Field,
    IndexRef,
    Input,
    MissingRelationshipProof,
    Mutate,
    NoInbound,
    Outcome,
    Read,
    Relationship,
    Require,
    Restrict,
    Return,
    ReverseIndex,
    Set,
    Var,
)
from service_engine.commands.check import DeleteStep


class _Store:
    TABLE = "rows"  # what the compiler writes into the generated function (no I/O here)

    async def load(self, conn: Any, key: Any) -> None:
        return None


@dataclass
class Board:
    org: str
    id: str
    title: str
    version: int = 1
    Store: ClassVar[Any] = _Store()


@dataclass
class Lane:
    org: str
    id: str
    name: str
    version: int = 1
    Store: ClassVar[Any] = _Store()


@dataclass(kw_only=True)
class Card:
    """Keyword-only: a defaulted field may precede a required one."""

    org: str
    id: str
    note: str = ""
    lane_id: str | None = None
    board_id: str
    title: str
    version: int = 1
    Store: ClassVar[Any] = _Store()


BOARD = Entity("Board", Board, key=("org", "id"), partition_by=("org",), conflict_key=("id",),
               revision="version", delete_policy=Restrict((IndexRef("Card", "by_board"),)))
LANE = Entity("Lane", Lane, key=("org", "id"), partition_by=("org",), conflict_key=("id",),
              revision="version")
# The optional relationship first: a required one after it is still proven.
CARD = Entity(
    "Card", Card, key=("org", "id"), partition_by=("org",), conflict_key=("id",),
    revision="version",
    relationships=(Relationship("lane", "Lane", ("org", "lane_id"), required=False),
                   Relationship("board", "Board", ("org", "board_id"))),
    indexes=(ReverseIndex("by_board", ("org", "board_id"), table="card"),),
    delete_policy=NoInbound(),
)
CATALOG = Catalog([BOARD, LANE, CARD])

ORG, CARD_ID, BOARD_ID = Input("org", str), Input("card_id", str), Input("board_id", str)
READ_BOARD = Read("Board", (Var("org"), Var("board_id")), as_="board",
                  else_=Outcome("BoardMissing"))
CREATE_CARD = Create("Card", (Var("org"), Var("card_id")), as_="card",
                     else_=Outcome("CardExists"))
MUTATE_CARD = Mutate("Card", (Var("org"), Var("card_id")), as_="card",
                     else_=Outcome("CardMissing"))


def test_a_required_relationship_after_an_optional_one_needs_its_proof() -> None:
    """A create that sets a required relationship after an optional one is refused until the related row is read under its exact key first."""
    unproven = Command(
        "AddCard", ORG, CARD_ID, BOARD_ID, CREATE_CARD,
        Set("card", "board_id", Var("board_id")), Set("card", "title", Const("t")),
        Return("Added"))
    with pytest.raises(MissingRelationshipProof,
                       match=r"^command AddCard: card affects Card\.board -> Board: read Board "
                       r"under exactly \('org', 'board_id'\) before it"):
        CATALOG.command(unproven)
    CATALOG.command(Command(
        "AddCard", ORG, CARD_ID, BOARD_ID, READ_BOARD, CREATE_CARD,
        Set("card", "board_id", Var("board_id")), Set("card", "title", Const("t")),
        Return("Added")))


def test_a_mutation_leaving_one_relationship_alone_still_proves_another_it_moves() -> None:
    """A mutation that moves one required relationship needs that relationship's proof even when it leaves another relationship untouched."""
    # Card.lane (optional) is untouched; Card.board moves without a read of the board.
    with pytest.raises(MissingRelationshipProof, match=r"card affects Card\.board -> Board"):
        CATALOG.command(Command(
            "Move", ORG, CARD_ID, BOARD_ID, MUTATE_CARD,
            Set("card", "board_id", Var("board_id"), overwrite=True), Return("Moved")))
    # Two required relationships: the first untouched, the second moved.
    both = Catalog([BOARD, LANE, Entity(
        "Card", Card, key=("org", "id"), partition_by=("org",), conflict_key=("id",),
        revision="version",
        relationships=(Relationship("lane", "Lane", ("org", "lane_id")),
                       Relationship("board", "Board", ("org", "board_id"))),
        indexes=(ReverseIndex("by_board", ("org", "board_id"), table="card"),),
        delete_policy=NoInbound())])
    with pytest.raises(MissingRelationshipProof, match=r"card affects Card\.board -> Board"):
        both.command(Command(
            "Move", ORG, CARD_ID, BOARD_ID, MUTATE_CARD,
            Set("card", "board_id", Var("board_id"), overwrite=True), Return("Moved")))


def test_a_create_sets_a_required_field_after_a_defaulted_one() -> None:
    """A create that never sets a required field declared after a defaulted one is refused, naming the field."""
    with pytest.raises(BindingError,
                       match=r"^command AddCard: create card: field Card\.title is never set$"):
        CATALOG.command(Command(
            "AddCard", ORG, CARD_ID, BOARD_ID, READ_BOARD, CREATE_CARD,
            Set("card", "board_id", Var("board_id")), Return("Added")))


def test_a_create_after_a_mutation_is_checked_too() -> None:
    """A create that follows a mutation in the same command is checked for its unset fields too."""
    with pytest.raises(BindingError, match=r"create second: field Card\.title is never set"):
        CATALOG.command(Command(
            "Copy", ORG, CARD_ID, BOARD_ID, Input("copy_id", str), READ_BOARD, MUTATE_CARD,
            Create("Card", (Var("org"), Var("copy_id")), as_="second",
                   else_=Outcome("CopyExists")),
            Set("card", "title", Const("moved"), overwrite=True),
            Set("second", "board_id", Var("board_id")), Return("Copied")))


def test_a_create_that_sets_nothing_names_the_first_field_it_misses() -> None:
    """A create that sets nothing is refused naming the first required field it misses (or the relationship it does not prove)."""
    with pytest.raises(BindingError, match=r"^command AddLane: create lane: field Lane\.name "
                       r"is never set$"):
        CATALOG.command(Command(
            "AddLane", ORG, Input("lane_id", str),
            Create("Lane", (Var("org"), Var("lane_id")), as_="lane", else_=Outcome("Exists")),
            Return("Added")))
    with pytest.raises(MissingRelationshipProof, match=r"card affects Card\.board"):
        CATALOG.command(Command(
            "AddCard", ORG, CARD_ID, CREATE_CARD, Return("Added")))


def test_the_checked_delete_is_the_clause_and_its_entity() -> None:
    """The checked command records each delete as its clause and entity, among its effects, with the delete's outcome among the command's outcomes."""
    clause = Delete("board", referenced=Outcome("Referenced"))
    checked = CATALOG.command(Command(
        "DeleteBoard", ORG, BOARD_ID,
        Mutate("Board", (Var("org"), Var("board_id")), as_="board", else_=Outcome("Missing")),
        Require("Titled", Eq(Field("board", "title"), Const("x")), Outcome("Untitled")),
        clause, Return("Deleted")))
    assert dict(checked.deletes) == {"board": DeleteStep(clause, BOARD)}
    assert checked.effects == (clause,)
    assert checked.outcomes == {"Missing", "Untitled", "Referenced", "Deleted"}

