"""A `Set` proven by ``checked_by`` needs a requirement that reads the row it
sets: one reading only inputs or another binding proves nothing and is
refused at registration, naming the set and the requirement (pure: no
database)."""

from __future__ import annotations

import pytest

from service_engine.commands import (
    Const,
    Eq,
    Field,
    Outcome,
    Read,
    Require,
    Set,
    UnprovenSet,
    Var,
)

from .test_commands_check import CATALOG, MUTATE_POST, post_command

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
