"""A registration diagnostic is read by the service author: each names the
declaration that is wrong (entity, workflow, command and clause) and says
what is wrong with it, word for word (pure: no database)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import pytest

from service_engine.commands import (
    BindingError,
    Cascade,
    CascadeEdge,
    Catalog,
    Command,
    CommandDeclarationError,
    Const,
    Contains,
    Create,
    Delete,
    DeletePolicyError,
    DuplicateName,
    Entity,
    Eq,
    Fact,
    Field,
    IndexRef,
    Input,
    MissingOutcome,
    MissingRelationshipProof,
    Mutate,
    NoInbound,
    Outcome,
    PartitionRouteMismatch,
    Read,
    Relationship,
    Restrict,
    Return,
    ReverseIndex,
    RouteIdentifiesRow,
    Row,
    RowPolicy,
    Set,
    Transition,
    TypeMismatch,
    UnboundReference,
    Unique,
    UniqueKeyOutsidePartition,
    UnknownName,
    UnprovenSet,
    Var,
    WorkflowError,
    WorkflowTransition,
)
from service_engine.commands.expr import INVALID, show
from service_engine.gates import Reason

from .test_commands_check import (
    CATALOG,
    COMMENT,
    FLOW,
    MUTATE_POST,
    POST,
    POST_ID,
    READ_POST,
    SITE,
    post_command,
)


@dataclass
class Empty:
    Store: ClassVar[Any] = object()


TRANSITION = Transition("Life.Publish", on="post", revision=Var("rev"), stale=Outcome("Stale"),
                        illegal=Outcome("Illegal"))
CASCADE = Cascade((CascadeEdge("Comment", "post", "by_post", 10),))
BY_TITLE = ReverseIndex("by_x", ("site", "title"), table="post")
BY_BODY = ReverseIndex("by_body", ("site", "body"), table="comment")
PLAIN_MUTATE = Mutate("Post", (Var("site"), Var("post_id")), as_="post", else_=Outcome("Missing"))
NO_DELETE_POLICY = Catalog([replace(POST, delete_policy=None, unique=()),
                            replace(COMMENT, relationships=(), indexes=())], [FLOW])
CASCADING = Catalog([replace(POST, delete_policy=CASCADE), COMMENT], [FLOW])


def delete(*clauses: Any, mutate: Mutate = MUTATE_POST) -> Command:
    return Command("Bad", SITE, POST_ID, mutate, *clauses, Return("X"))


ENGINE_OUTCOMES = "not one of the engine's own ['IdempotencyConflict', 'Refused']"
CATALOG_CASES: dict[str, tuple[type[Exception], str, Callable[[], object]]] = {
    "a dataclass without fields": (
        CommandDeclarationError,
        "entity X: aggregate Empty must be a dataclass with annotated fields (its fields and "
        "their types are the entity's)",
        lambda: Catalog([Entity("X", Empty, key=("id",))])),
    "no key": (BindingError, "entity Post: declares no key",
               lambda: Catalog([replace(POST, key=()), COMMENT])),
    "a route that is not a key prefix": (
        BindingError, "entity Post: partition_by ('id',) is not a prefix of the key ('site', 'id')",
        lambda: Catalog([replace(POST, partition_by=("id",)), COMMENT])),
    "no_inbound while targeted": (
        DeletePolicyError, "entity Post: delete policy no_inbound, but ['Comment.post'] target it",
        lambda: Catalog([replace(POST, delete_policy=NoInbound()), COMMENT])),
    "restrict through another index": (
        DeletePolicyError,
        "entity Post: delete policy restrict Comment.by_body is not a reverse index of a "
        "relationship targeting Post (it must start with the relationship's fields: the "
        "target's partition and key)",
        lambda: Catalog([replace(POST, delete_policy=Restrict((IndexRef("Comment", "by_body"),))),
                         replace(COMMENT, indexes=(*COMMENT.indexes, BY_BODY))])),
    "restrict proving nothing": (
        DeletePolicyError,
        "entity Post: delete policy restrict leaves inbound relationships ['Comment.post'] "
        "unproven",
        lambda: Catalog([replace(POST, delete_policy=Restrict(())), COMMENT])),
    "a cascade into a targetable child": (
        DeletePolicyError,
        "entity Post: delete policy cascade reaches Comment, which must declare no_inbound (a "
        "cascade is one bounded hop, never recursive)",
        lambda: Catalog([replace(POST, delete_policy=CASCADE),
                         replace(COMMENT, delete_policy=None)])),
    "a cascade missing an edge": (
        DeletePolicyError, "entity Post: delete policy cascade does not enumerate ['Comment.post']",
        lambda: Catalog([replace(POST, delete_policy=Cascade(())), COMMENT])),
    "not a delete policy": (
        DeletePolicyError, "entity Post: delete policy: not a delete policy: 'drop'",
        lambda: Catalog([replace(POST, delete_policy="drop"),  # type: ignore[arg-type]
                         COMMENT])),
    "a workflow without a revision": (
        WorkflowError, "workflow Life: Post declares no revision to check transitions on",
        lambda: Catalog([replace(POST, revision=None), COMMENT], [FLOW])),
    "a transition name": (
        CommandDeclarationError,
        "workflow Life: a transition name must be an identifier, got 'publish it'",
        lambda: Catalog([POST, COMMENT], [replace(FLOW, transitions=(
            WorkflowTransition("publish it", ("draft",), "published"),))])),
    "a transition without a source": (
        WorkflowError,
        "workflow Life: transition Publish leaves the closed state graph ('draft', "
        "'published'): no source state",
        lambda: Catalog([POST, COMMENT], [replace(FLOW, transitions=(
            WorkflowTransition("Publish", (), "published"),))])),
    "a transition outside the graph": (
        WorkflowError,
        "workflow Life: transition Publish leaves the closed state graph ('draft', "
        "'published'): ['gone']",
        lambda: Catalog([POST, COMMENT], [replace(FLOW, transitions=(
            WorkflowTransition("Publish", ("draft",), "gone"),))])),
    "not an entity": (CommandDeclarationError, "not an Entity: 'Post'",
                      lambda: Catalog(["Post"])),  # type: ignore[list-item]
    "an entity name": (
        CommandDeclarationError, "an entity name must be an identifier, got 'my post'",
        lambda: Catalog([replace(POST, name="my post")])),
    "a workflow name": (
        CommandDeclarationError, "a workflow name must be an identifier, got 'my flow'",
        lambda: Catalog([POST, COMMENT], [replace(FLOW, name="my flow")])),
    "a principal fact name": (
        CommandDeclarationError, "a principal fact must be an identifier, got 'is-admin'",
        lambda: Catalog([POST, COMMENT], facts={"is-admin": bool})),
    "a key field outside route and conflict key": (
        BindingError,
        "entity Post: key fields ['site'] are in neither partition_by () nor conflict_key "
        "('id',): the store key is the complete key (route + conflict key)",
        lambda: Catalog([replace(POST, partition_by=(), conflict_key=("id",)), COMMENT])),
    "a unique key name": (
        CommandDeclarationError,
        "entity Post: a unique key name must be an identifier, got 'by title'",
        lambda: Catalog([replace(POST, unique=(Unique("by title", ("site", "title")),)),
                         COMMENT])),
    "an index name": (
        CommandDeclarationError, "entity Post: an index name must be an identifier, got 'by x'",
        lambda: Catalog([replace(POST, indexes=(replace(BY_TITLE, name="by x"),)), COMMENT])),
    "a relationship name": (
        CommandDeclarationError,
        "entity Comment: a relationship name must be an identifier, got 'the post'",
        lambda: Catalog([POST, replace(COMMENT, relationships=(
            Relationship("the post", "Post", ("site", "post_id")),))])),
    "a unique key outside the partition": (
        UniqueKeyOutsidePartition,
        "entity Post: unique by_title ('title',) must begin with the partition route ('site',) "
        "(and add a field to it)",
        lambda: Catalog([replace(POST, unique=(Unique("by_title", ("title",)),)), COMMENT])),
    "two indexes of one name": (
        DuplicateName,
        "entity Post: index by_x (index #2): the name is first declared by index #1",
        lambda: Catalog([replace(POST, unique=(), indexes=(BY_TITLE, BY_TITLE)), COMMENT])),
    "a route that is the whole key": (
        RouteIdentifiesRow,
        "entity Post: partition_by ('site', 'id') is the whole key, so each partition holds one "
        "row and its unique keys and indexes are vacuous; partition by the scope it is searched "
        "within and keep the row id in the conflict key",
        lambda: Catalog([replace(POST, partition_by=("site", "id"), unique=(
            Unique("by_title", ("site", "id", "title")),)), COMMENT])),
    "a relationship to nothing": (
        UnknownName, "entity Comment: relationship post targets unknown entity 'Nope'",
        lambda: Catalog([POST, replace(COMMENT, relationships=(
            Relationship("post", "Nope", ("site", "post_id")),))])),
    "a create row policy that is no bool": (
        TypeMismatch, "entity Post: the create row policy is str, not a bool",
        lambda: Catalog([replace(POST, create_policy=RowPolicy(Row("title"), Reason("no"))),
                         COMMENT])),
    "a mistyped delete row policy": (
        TypeMismatch,
        "entity Post: the delete row policy: (row.title == 5) compares str with 5 (int)",
        lambda: Catalog([replace(POST, delete_row_policy=RowPolicy(
            Eq(Row("title"), Const(5)), Reason("no"))), COMMENT])),
    "a delete row policy that is no expression": (
        CommandDeclarationError, "entity Post: the delete row policy is not an expression: True",
        lambda: Catalog([replace(POST, delete_row_policy=RowPolicy(
            True, Reason("no"))), COMMENT])),  # type: ignore[arg-type]
    "a row policy reading an input": (
        CommandDeclarationError,
        "entity Post: a row policy observes the row (Row), principal facts (Fact) and "
        "constants, not Var(name='x')",
        lambda: Catalog([replace(POST, update_policy=RowPolicy(
            Eq(Var("x"), Const(1)), Reason("no"))), COMMENT])),
    "a row policy reading no field": (
        UnknownName, "entity Post: a row policy reads unknown field 'colour'",
        lambda: Catalog([replace(POST, update_policy=RowPolicy(Row("colour"), Reason("no"))),
                         COMMENT])),
}

COMMAND_CASES: dict[str, tuple[type[Exception], str, Callable[[], object]]] = {
    "one outcome declared twice": (
        DuplicateName,
        "command Bad: read other at clause 6 (Read other): outcome 'PostMissing' is first "
        "declared at clause 5 (Read post)",
        lambda: CATALOG.command(post_command(READ_POST, Read(
            "Post", (Var("site"), Var("text")), as_="other", else_=Outcome("PostMissing"))))),
    "checked_by naming nothing": (
        UnknownName,
        "command Bad: set post.title (clause 6 (Set post.title)): checked_by 'Nope' names no "
        "requirement of the command",
        lambda: CATALOG.command(post_command(
            MUTATE_POST, Set("post", "title", Var("text"), checked_by="Nope")))),
    "a set without a proof": (
        UnprovenSet,
        "command Bad: set post.title (clause 6 (Set post.title)) has no proof that it loses "
        "nothing: a set on an existing row needs a same-field arithmetic update, checked_by a "
        "requirement, a caller-version fence (a Transition, or a requirement comparing the "
        "revision with an input), or overwrite=True for a deliberate replacement",
        lambda: CATALOG.command(post_command(MUTATE_POST, Set("post", "title", Var("text"))))),
    "a set of the revision": (
        CommandDeclarationError,
        "command Bad: set post.version: the revision is the engine's (every write of the row "
        "sets the next one)",
        lambda: CATALOG.command(post_command(
            MUTATE_POST, Set("post", "version", Const(5), overwrite=True)))),
    "a set of a key field": (
        BindingError, "command Bad: set post.id: a key field is fixed by the binding",
        lambda: CATALOG.command(post_command(
            MUTATE_POST, Set("post", "id", Const("p2"), overwrite=True)))),
    "a set of a field the entity lacks": (
        UnknownName, "command Bad: set post.nope: Post declares no such field",
        lambda: CATALOG.command(post_command(
            MUTATE_POST, Set("post", "nope", Const(5), overwrite=True)))),
    "a transition on no binding": (
        UnboundReference, "command Bad: transition 'nope': no binding of that name",
        lambda: CATALOG.command(post_command(replace(TRANSITION, on="nope")))),
    "a transition on a read": (
        WorkflowError, "command Bad: transition on 'post': name a mutate binding",
        lambda: CATALOG.command(post_command(READ_POST, TRANSITION))),
    "a transition revision never declared": (
        UnboundReference,
        "command Bad: transition Life.Publish revision reads 'nope', not an input or service "
        "value declared before it",
        lambda: CATALOG.command(post_command(MUTATE_POST, replace(TRANSITION,
                                                                  revision=Var("nope"))))),
    "a constant revision": (
        WorkflowError,
        "command Bad: transition Life.Publish: the revision is supplied by the caller (an input)",
        lambda: CATALOG.command(post_command(MUTATE_POST, replace(TRANSITION,
                                                                  revision=Const(1))))),
    "a stale outcome that is a string": (
        MissingOutcome, "command Bad: transition Life.Publish stale declares no Outcome, got "
        "'Stale'",
        lambda: CATALOG.command(post_command(MUTATE_POST, replace(
            TRANSITION, stale="Stale")))),  # type: ignore[arg-type]
    "an illegal outcome in lower case": (
        MissingOutcome,
        "command Bad: transition Life.Publish illegal: outcome 'illegal' must be PascalCase and "
        + ENGINE_OUTCOMES,
        lambda: CATALOG.command(post_command(MUTATE_POST, replace(
            TRANSITION, illegal=Outcome("illegal"))))),
    "a delete without a policy": (
        DeletePolicyError, "command Bad: delete post: Post declares no delete policy",
        lambda: NO_DELETE_POLICY.command(delete(Delete("post"), mutate=PLAIN_MUTATE))),
    "a restrict delete without its outcome": (
        MissingOutcome, "command Bad: delete post: restrict needs the referenced outcome",
        lambda: CATALOG.command(delete(Delete("post")))),
    "too_many on a restrict": (
        DeletePolicyError, "command Bad: delete post: too_many does not apply to Restrict",
        lambda: CATALOG.command(delete(Delete("post", referenced=Outcome("R"),
                                              too_many=Outcome("T"))))),
    "referenced on a cascade": (
        DeletePolicyError, "command Bad: delete post: referenced does not apply to Cascade",
        lambda: CASCADING.command(delete(Delete("post", referenced=Outcome("R"),
                                                too_many=Outcome("T"))))),
    "a delete outcome in lower case": (
        MissingOutcome,
        "command Bad: delete post referenced: outcome 'referenced' must be PascalCase and "
        + ENGINE_OUTCOMES,
        lambda: CATALOG.command(delete(Delete("post", referenced=Outcome("referenced"))))),
    "writes in two partitions": (
        PartitionRouteMismatch,
        "command Bad: post routes by (Var(name='site'),) but comment by "
        "(Var(name='other_site'),): every create/mutate binding derives the same complete "
        "partition route (split a cross-partition operation into idempotent commands)",
        lambda: CATALOG.command(Command(
            "Bad", SITE, Input("other_site", str), POST_ID, Input("comment_id", str),
            Input("body", str), MUTATE_POST,
            Create("Comment", (Var("other_site"), Var("comment_id")), as_="comment",
                   else_=Outcome("Exists")),
            Set("post", "title", Var("body"), overwrite=True),
            Set("comment", "post_id", Var("post_id")), Set("comment", "body", Var("body")),
            Return("X")))),
    "a unique key written without its outcome": (
        MissingOutcome, "command Bad: post writes unique key Post.by_title: declare its taken "
        "outcome",
        lambda: CATALOG.command(Command(
            "Bad", SITE, POST_ID, Input("title", str), PLAIN_MUTATE,
            Set("post", "title", Var("title"), overwrite=True), Return("X")))),
    "a create without a read of its target": (
        MissingRelationshipProof,
        "command Bad: comment affects Comment.post -> Post: read Post under exactly ('site', "
        "'post_id') before it (a dominating exact read of the complete target key)",
        lambda: CATALOG.command(Command(
            "Bad", SITE, POST_ID, Input("comment_id", str), Input("body", str),
            Create("Comment", (Var("site"), Var("comment_id")), as_="comment",
                   else_=Outcome("Exists")),
            Set("comment", "post_id", Var("post_id")), Set("comment", "body", Var("body")),
            Return("X")))),
}


@pytest.mark.parametrize("case", list(CATALOG_CASES))
def test_a_catalog_refusal_names_the_declaration_and_the_fault(case: str) -> None:
    """A catalog declaration refused at registration raises its typed error with a message naming the declaration and what is wrong, word for word."""
    error, message, declare = CATALOG_CASES[case]
    with pytest.raises(error) as refused:
        declare()
    assert str(refused.value) == message


@pytest.mark.parametrize("case", list(COMMAND_CASES))
def test_a_command_refusal_names_the_clause_and_the_fault(case: str) -> None:
    """A command refused at registration raises its typed error with a message naming the command, its clause and what is wrong, word for word."""
    error, message, declare = COMMAND_CASES[case]
    with pytest.raises(error) as refused:
        declare()
    assert str(refused.value) == message


def test_an_expression_shows_as_a_reader_writes_it() -> None:
    """A diagnostic shows an expression as its author writes it (a non-expression as its repr, INVALID as INVALID)."""
    assert show(Contains(Fact("tags"), Field("post", "title"))) == "post.title in Fact('tags')"
    assert show("title") == "'title'"  # not an expression: its repr
    assert repr(INVALID) == "INVALID"
