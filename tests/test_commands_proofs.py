"""What registration proves about a command's rows (pure: no database): a
`Set` proven by ``checked_by`` needs a requirement that reads the row it
sets (one reading only inputs or another binding proves nothing and is
refused, naming the set and the requirement), and a workflow's states
type only its own entity's state field."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import pytest

from service_engine.commands import (
    TRANSACTION_TIME,
    Catalog,
    Caused,
    Command,
    Const,
    Entity,
    Eq,
    Field,
    IdempotencyKey,
    Input,
    Outcome,
    Permit,
    Read,
    Require,
    Return,
    Service,
    Set,
    TypeMismatch,
    UnboundReference,
    Unless,
    UnprovenSet,
    Var,
)
from service_engine.gates import Reason

from .test_commands_check import (
    CATALOG,
    COMMENT,
    FLOW,
    MUTATE_POST,
    POST,
    POST_ID,
    SITE,
    post_command,
)

OTHER = Read("Post", (Var("site"), Var("text")), as_="other", else_=Outcome("OtherMissing"))


def test_checked_by_a_requirement_reading_only_inputs_is_refused() -> None:
    """A requirement over inputs alone does not observe the row set."""
    with pytest.raises(UnprovenSet) as refused:
        CATALOG.command(post_command(
            MUTATE_POST, Require("Named", Eq(Var("text"), Const("x")), else_=Outcome("No")),
            Set("post", "title", Var("text"), checked_by="Named")))
    assert str(refused.value) == (
        "command Bad: set post.title (clause 7 (Set post.title)): checked_by Named does not "
        "observe post")


def test_checked_by_a_requirement_reading_another_row_is_refused() -> None:
    """A requirement reading another binding's row does not observe the row
    set; one reading the row set itself is a proof."""
    with pytest.raises(UnprovenSet) as refused:
        CATALOG.command(post_command(
            MUTATE_POST, OTHER,
            Require("Other", Eq(Field("other", "title"), Const("x")), else_=Outcome("No")),
            Set("post", "title", Var("text"), checked_by="Other")))
    assert str(refused.value) == (
        "command Bad: set post.title (clause 8 (Set post.title)): checked_by Other does not "
        "observe post")
    checked = CATALOG.command(post_command(
        MUTATE_POST, Require("Own", Eq(Field("post", "title"), Const("x")), else_=Outcome("No")),
        Set("post", "title", Var("text"), checked_by="Own")))
    assert checked.name == "Bad"


class _Store:
    async def load(self, conn: Any, key: Any) -> None:
        return None


@dataclass
class Ticket:
    site: str
    id: str
    state: str
    Store: ClassVar[Any] = _Store()


def test_a_workflow_closes_only_its_own_entity_state() -> None:
    """A workflow's states close the state field of its own entity only:
    another entity's field of the same name keeps its plain type, and a
    comparison with a value outside the workflow's states is accepted there
    and refused on the workflow's entity."""
    catalog = Catalog([replace(POST, delete_policy=None), Entity("Ticket", Ticket, key=("site", "id"),
                                                               table="ticket")],
                      [FLOW])

    def reading(entity: str) -> Command:
        return Command(
            "Check", Input("site", str), Input("id", str),
            Read(entity, (Var("site"), Var("id")), as_="row", else_=Outcome("Missing")),
            Require("Open", Eq(Field("row", "state"), Const("open")), else_=Outcome("Closed")),
            Return("Ok"),
        )

    assert catalog.command(reading("Ticket")).name == "Check"
    with pytest.raises(TypeMismatch):
        catalog.command(reading("Post"))


def test_a_checked_command_holds_every_part_of_its_declaration() -> None:
    """Registration answers the command as the runner executes it: its
    inputs and service values, key, bindings with their entities,
    requirements, effects in order, return, outcomes and catalog."""
    key, stamp = Input("key", str), Service("at", TRANSACTION_TIME)
    requirement = Require("Titled", Eq(Field("post", "title"), Var("text")),
                          else_=Outcome("Untitled"))
    effect = Set("post", "title", Var("text"), checked_by="Titled")
    returned = Return("Done", title=Field("post", "title"))
    declared = Command("Retitle", key, SITE, POST_ID, Input("text", str), stamp,
                       IdempotencyKey("key"), MUTATE_POST, requirement, effect, returned)
    checked = CATALOG.command(declared)
    assert checked.declaration is declared and checked.name == "Retitle"
    assert [i.name for i in checked.inputs] == ["key", "site", "post_id", "text"]
    assert checked.services == (stamp,) and checked.idempotency_key == "key"
    assert checked.bindings == (MUTATE_POST,) and checked.written == (MUTATE_POST,)
    assert dict(checked.entities) == {"post": POST}
    assert checked.requirements == (requirement,) and checked.effects == (effect,)
    assert dict(checked.transitions) == {} and dict(checked.deletes) == {}
    assert checked.returns is returned and checked.catalog is CATALOG
    assert checked.outcomes == frozenset({"PostMissing", "TitleTaken", "Untitled", "Done"})


def test_a_checked_command_keeps_its_effects_in_order() -> None:
    """Causes are effects like sets, kept in the order declared, and a
    service value types like the value it samples."""
    stamp = Service("at", TRANSACTION_TIME)
    cause = Caused("post", "post", "post.retitled", {"at": Var("at")})
    effect = Set("post", "title", Var("text"), overwrite=True)
    checked = NOUNED.command(Command(
        "Retitle", Input("key", str), SITE, POST_ID, Input("text", str), stamp,
        IdempotencyKey("key"), MUTATE_POST, effect, cause, Return("Done")))
    assert checked.effects == (effect, cause)
    with pytest.raises(TypeMismatch):
        CATALOG.command(Command(
            "Bad", Input("key", str), SITE, POST_ID, stamp, IdempotencyKey("key"), MUTATE_POST,
            Set("post", "title", Var("at"), overwrite=True), Return("Done")))


NOUNED = Catalog([replace(POST, nouns=("post",)), COMMENT], [FLOW])


def test_permits_and_causes_are_kept_with_their_kind() -> None:
    """A permit is a requirement and a cause an effect of the checked command,
    in declared order; a cause's data is observed like any value and named
    when it reads nothing."""
    gate = Permit("edit", Unless(Reason("post.no"), Eq(Field("post", "state"), Const("draft"))))
    cause = Caused("post", "post", "post.retitled", {"text": Var("text")})
    effect = Set("post", "title", Var("text"), overwrite=True)
    checked = NOUNED.command(post_command(MUTATE_POST, gate, effect, cause))
    assert checked.requirements == (gate,) and checked.effects == (effect, cause)
    with pytest.raises(UnboundReference) as refused:
        NOUNED.command(post_command(MUTATE_POST, effect, Caused(
            "post", "post", "post.retitled", {"text": Var("nope")})))
    assert str(refused.value) == (
        "command Bad: caused post.retitled.text reads 'nope', not an input or service value "
        "declared before it")
