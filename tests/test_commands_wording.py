"""More registration diagnostics, word for word: each names the command, the
clause (by its position and label) and what is wrong (pure: no database)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from service_engine.commands import (
    BindingError,
    ClauseOrderError,
    Command,
    CommandDeclarationError,
    Const,
    DuplicateName,
    Eq,
    Field,
    IdempotencyDeclarationError,
    IdempotencyKey,
    Input,
    MissingOutcome,
    Outcome,
    Read,
    Require,
    Return,
    TypeMismatch,
    UnboundReference,
    UnknownName,
    Var,
)

from .test_commands_check import (
    CATALOG,
    KEY,
    MUTATE_POST,
    POST_ID,
    READ_POST,
    SITE,
    post_command,
)
from .test_commands_diagnostics import ENGINE_OUTCOMES, TRANSITION


def read(*key: object, entity: str = "Post", as_: str = "p") -> Read:
    return Read(entity, key, as_=as_, else_=Outcome("M"))  # type: ignore[arg-type]


def require(left: object, right: object) -> Require:
    return Require("R", Eq(left, right), else_=Outcome("No"))  # type: ignore[arg-type]


SITE_ID = (Var("site"), Var("post_id"))
ORDER = ("clauses follow the order inputs and service values, idempotency key, bindings, "
         "requirements, effects, return")
CASES: dict[str, tuple[type[Exception], str, Callable[[], object]]] = {
    "an outcome a transition declares again": (
        DuplicateName,
        "command Bad: transition Life.Publish stale at clause 6 (Transition Life.Publish): "
        "outcome 'Stale' is first declared at clause 5 (Mutate post)",
        lambda: CATALOG.command(post_command(replace(MUTATE_POST, else_=Outcome("Stale")),
                                             TRANSITION))),
    "a field read before its binding": (
        UnboundReference,
        "command Bad: require R reads post.title before (or without) binding it",
        lambda: CATALOG.command(post_command(require(Field("post", "title"), Const("x"))))),
    "a field the entity lacks": (
        UnknownName, "command Bad: require R reads unknown field Post.nope",
        lambda: CATALOG.command(post_command(READ_POST, require(Field("post", "nope"),
                                                                Const("x"))))),
    "a comparison of two types": (
        TypeMismatch,
        "command Bad: require R (clause 6 (Require R)): (post.title == 5) compares str with "
        "5 (int)",
        lambda: CATALOG.command(post_command(READ_POST, require(Field("post", "title"),
                                                                Const(5))))),
    "a binding name that is no identifier": (
        CommandDeclarationError, "command Bad: a name must be an identifier, got 'bad-name'",
        lambda: CATALOG.command(post_command(read(*SITE_ID, as_="bad-name")))),
    "a binding of no entity": (
        UnknownName, "command Bad: read p: unknown entity 'Nope'",
        lambda: CATALOG.command(post_command(read(*SITE_ID, entity="Nope")))),
    "a key of another length": (
        BindingError, "command Bad: read p: the key of Post is ('site', 'id'), got 1 values",
        lambda: CATALOG.command(post_command(read(Var("site"))))),
    "a key reading a binding": (
        BindingError, "command Bad: read p key may not read the binding 'post'",
        lambda: CATALOG.command(post_command(READ_POST, read(Var("site"),
                                                             Field("post", "title"))))),
    "a key reading no input": (
        UnboundReference,
        "command Bad: read p key reads 'nope', not an input or service value declared before it",
        lambda: CATALOG.command(post_command(read(Var("site"), Var("nope"))))),
    "a taken outcome in lower case": (
        MissingOutcome,
        "command Bad: mutate post taken by_title: outcome 'taken' must be PascalCase and "
        + ENGINE_OUTCOMES,
        lambda: CATALOG.command(post_command(replace(
            MUTATE_POST, taken={"by_title": Outcome("taken")})))),
    "a command name that is no identifier": (
        CommandDeclarationError, "a command name must be an identifier, got 'bad name'",
        lambda: CATALOG.command(Command("bad name", SITE, POST_ID, READ_POST, Return("X")))),
    "a command without clauses": (
        CommandDeclarationError, "command Bad: declares no clauses",
        lambda: CATALOG.command(Command("Bad"))),
    "an input after a binding": (
        ClauseOrderError,
        "command Bad: Input (inputs and service values) after bindings: " + ORDER,
        lambda: CATALOG.command(Command("Bad", SITE, POST_ID, READ_POST, Input("late", str),
                                        Return("X")))),
    "a binding after a requirement": (
        ClauseOrderError, "command Bad: Read (bindings) after requirements: " + ORDER,
        lambda: CATALOG.command(Command("Bad", SITE, POST_ID, require(Var("site"), Const("x")),
                                        READ_POST, Return("X")))),
    "something that is no clause": (
        CommandDeclarationError, "command Bad: clause 2 is not a command clause: 'junk'",
        lambda: CATALOG.command(Command("Bad", SITE, "junk", Return("X")))),  # type: ignore[arg-type]
    "two idempotency keys": (
        IdempotencyDeclarationError, "command Bad: declares two idempotency keys",
        lambda: CATALOG.command(Command("Bad", SITE, POST_ID, KEY, IdempotencyKey("key"),
                                        IdempotencyKey("key"), READ_POST, Return("X")))),
    "two returns": (
        ClauseOrderError, "command Bad: declares two returns",
        lambda: CATALOG.command(Command("Bad", SITE, POST_ID, READ_POST, Return("X"),
                                        Return("Y")))),
    "no return": (
        ClauseOrderError, "command Bad: ends without a Return",
        lambda: CATALOG.command(Command("Bad", SITE, POST_ID, READ_POST))),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_refusal_names_the_clause_and_what_is_wrong(case: str) -> None:
    """Each malformed declaration is refused with its typed error, naming the
    command, the clause and the fault exactly."""
    error, message, declare = CASES[case]
    with pytest.raises(error) as refused:
        declare()
    assert str(refused.value) == message
