"""More registration diagnostics, word for word: each names the command, the
clause (by its position and label) and what is wrong (pure: no database)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from service_engine.commands import (
    UUID_V7,
    BindingError,
    Caused,
    ClauseOrderError,
    Command,
    CommandDeclarationError,
    Const,
    Delete,
    DuplicateName,
    Emit,
    Eq,
    Field,
    IdempotencyDeclarationError,
    IdempotencyKey,
    Input,
    MissingOutcome,
    NotCompilable,
    Outcome,
    Permit,
    Read,
    Record,
    Require,
    Return,
    Service,
    ServiceValueError,
    Set,
    TypeMismatch,
    UnboundReference,
    UnknownName,
    Unless,
    Var,
    WorkflowError,
)
from service_engine.gates import Reason

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
OVERWRITE = Set("post", "title", Var("text"), overwrite=True)
DELETE = Delete("post", referenced=Outcome("Referenced"))
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
    "a bound on an input that is no str": (
        CommandDeclarationError,
        "command Bad: input x: max_length bounds a str input by a positive int",
        lambda: CATALOG.command(Command("Bad", Input("x", int, max_length=3), SITE, POST_ID,
                                        READ_POST, Return("X")))),
    "a bound below one": (
        CommandDeclarationError,
        "command Bad: input x: max_length bounds a str input by a positive int",
        lambda: CATALOG.command(Command("Bad", Input("x", str, max_length=0), SITE, POST_ID,
                                        READ_POST, Return("X")))),
    "a service value without an idempotent write": (
        ServiceValueError,
        "command Bad: service values need a durably idempotent mutation: declare an "
        "idempotency_key and a create or mutate binding",
        lambda: CATALOG.command(Command("Bad", SITE, POST_ID, Service("s", UUID_V7), READ_POST,
                                        Return("X")))),
    "a service value of no kind": (
        ServiceValueError,
        "command Bad: service s: unknown kind 'nope' (transaction_time or uuid_v7)",
        lambda: CATALOG.command(Command("Bad", SITE, POST_ID, Service("s", "nope"), READ_POST,
                                        Return("X")))),
    "a requirement that is no bool": (
        TypeMismatch, "command Bad: require R (clause 6 (Require R)) is str, not a bool",
        lambda: CATALOG.command(post_command(READ_POST, Require(
            "R", Field("post", "title"), else_=Outcome("No"))))),
    "a requirement name that is no identifier": (
        CommandDeclarationError,
        "command Bad: a requirement name must be an identifier, got 'bad name'",
        lambda: CATALOG.command(post_command(READ_POST, Require(
            "bad name", Eq(Var("text"), Const("x")), else_=Outcome("No"))))),
    "two requirements of one name": (
        DuplicateName,
        "command Bad: require R at clause 7 (Require R): requirement 'R' is first declared at "
        "clause 6 (Require R)",
        lambda: CATALOG.command(post_command(
            READ_POST, require(Var("text"), Const("x")),
            Require("R", Eq(Var("text"), Const("y")), else_=Outcome("No2"))))),
    "a permit reading no binding": (
        UnboundReference, "command Bad: permit edit rule 1 reads nope.state before (or without) "
        "binding it",
        lambda: CATALOG.command(post_command(Permit("edit", Unless(
            Reason("post.no"), Eq(Field("nope", "state"), Const("draft"))))))),
    "a permit without rules": (
        CommandDeclarationError,
        "command Bad: permit edit: its rules are one or more Unless(reason, condition, ...)",
        lambda: CATALOG.command(post_command(MUTATE_POST, Permit("edit"), OVERWRITE))),
    "a set of a workflow state": (
        WorkflowError,
        "command Bad: set post.state: a workflow state is initialised by a create (to a "
        "declared state) and changes only by a revision-checked Transition",
        lambda: CATALOG.command(post_command(MUTATE_POST, Set("post", "state", Const("x"),
                                                              overwrite=True)))),
    "one field set twice": (
        DuplicateName,
        "command Bad: set post.title at clause 7 (Set post.title): set 'post.title' is first "
        "declared at clause 6 (Set post.title)",
        lambda: CATALOG.command(post_command(MUTATE_POST, OVERWRITE, OVERWRITE))),
    "a set of another type": (
        TypeMismatch,
        "command Bad: set post.title (clause 6 (Set post.title)): the value is int, the field "
        "is str",
        lambda: CATALOG.command(post_command(MUTATE_POST, Set("post", "title", Var("rev"),
                                                              overwrite=True)))),
    "a record without a fact type": (
        CommandDeclarationError, "command Bad: record needs a fact type",
        lambda: CATALOG.command(post_command(MUTATE_POST, Record("post", "", {})))),
    "a record on a store without facts": (
        NotCompilable,
        "command Bad: record on post (clause 6 (Record post)): Post's store keeps no facts "
        "table (a soft-EDA store's FACTS_TABLE, keyed by its single KEY column)",
        lambda: CATALOG.command(post_command(MUTATE_POST, Record("post", "t",
                                                                 {"x": Var("nope")})))),
    "a record on a read": (
        BindingError,
        "command Bad: record 'post': a read binding is not written; declare it mutate",
        lambda: CATALOG.command(post_command(READ_POST, Record("post", "t", {})))),
    "a cause of a noun the entity lacks": (
        UnknownName, "command Bad: caused post: Post impacts no noun 'nope' (nouns ())",
        lambda: CATALOG.command(post_command(MUTATE_POST, OVERWRITE,
                                             Caused("post", "nope", "c", {})))),
    "an emit of no event class": (
        CommandDeclarationError, "command Bad: emit (clause 7 (Emit)): the event is an "
        "OutboundEvent class (a pydantic model), got 5",
        lambda: CATALOG.command(post_command(MUTATE_POST, OVERWRITE,
                                             Emit(5)))),  # type: ignore[arg-type]
    "a return in lower case": (
        MissingOutcome, "command Bad: return 'x' must be PascalCase",
        lambda: CATALOG.command(Command("Bad", SITE, POST_ID, READ_POST, Return("x")))),
    "a return of the engine's own": (
        DuplicateName, "command Bad: return 'Refused' reuses an outcome",
        lambda: CATALOG.command(Command("Bad", SITE, POST_ID, READ_POST, Return("Refused")))),
    "a return field that is no identifier": (
        CommandDeclarationError, "command Bad: a return field must be an identifier, got "
        "'bad name'",
        lambda: CATALOG.command(Command("Bad", SITE, POST_ID, READ_POST,
                                        Return("X", **{"bad name": Var("site")})))),
    "a return field reading no input": (
        UnboundReference,
        "command Bad: return X.t reads 'nope', not an input or service value declared before it",
        lambda: CATALOG.command(Command("Bad", SITE, POST_ID, READ_POST,
                                        Return("X", t=Var("nope"))))),
    "a mutate never written": (
        BindingError, "command Bad: mutate post is never written: read it",
        lambda: CATALOG.command(post_command(MUTATE_POST))),
    "an idempotency key that is no str input": (
        IdempotencyDeclarationError,
        "command Bad: idempotency_key 'n' must name a required str input declared before it",
        lambda: CATALOG.command(Command("Bad", SITE, POST_ID, Input("n", int), IdempotencyKey("n"),
                                        MUTATE_POST, OVERWRITE, Return("X")))),
    "a requirement outcome in lower case": (
        MissingOutcome,
        "command Bad: require R: outcome 'no' must be PascalCase and " + ENGINE_OUTCOMES,
        lambda: CATALOG.command(post_command(READ_POST, Require(
            "R", Eq(Var("text"), Const("x")), else_=Outcome("no"))))),
    "a permit condition that is not a bool": (
        TypeMismatch, "command Bad: permit edit rule 1 (clause 6 (Permit)) is str, not a bool",
        lambda: CATALOG.command(post_command(MUTATE_POST, Permit("edit", Unless(
            Reason("post.no"), Field("post", "title"))), OVERWRITE))),
    "a set after a delete": (
        BindingError,
        "command Bad: set post.title (clause 7 (Set post.title)): post is deleted before it",
        lambda: CATALOG.command(post_command(MUTATE_POST, DELETE, OVERWRITE))),
    "a transition after a delete": (
        BindingError,
        "command Bad: transition on post (clause 7 (Transition Life.Publish)): post is deleted "
        "before it",
        lambda: CATALOG.command(post_command(MUTATE_POST, DELETE, TRANSITION))),
    "a set value reading no input": (
        UnboundReference,
        "command Bad: set post.title reads 'nope', not an input or service value declared "
        "before it",
        lambda: CATALOG.command(post_command(MUTATE_POST, Set("post", "title", Var("nope"),
                                                              overwrite=True)))),
    "a cause on a read": (
        BindingError,
        "command Bad: caused 'post': a read binding is not written; declare it mutate",
        lambda: CATALOG.command(post_command(READ_POST, Caused("post", "n", "c", {})))),
    "an input of no supported type": (
        CommandDeclarationError, "command Bad: input x has unsupported type <class 'bytes'>",
        lambda: CATALOG.command(Command("Bad", Input("x", bytes), SITE, POST_ID,  # type: ignore[arg-type]
                                        READ_POST, Return("X")))),
}


def test_a_bound_of_one_is_a_bound() -> None:
    """A str input may be bounded to one character."""
    checked = CATALOG.command(Command("Ok", Input("x", str, max_length=1), SITE, POST_ID,
                                      READ_POST, Return("X")))
    assert [i.max_length for i in checked.inputs] == [1, None, None]


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_refusal_names_the_clause_and_what_is_wrong(case: str) -> None:
    """Each malformed declaration is refused with its typed error, naming the
    command, the clause and the fault exactly."""
    error, message, declare = CASES[case]
    with pytest.raises(error) as refused:
        declare()
    assert str(refused.value) == message
