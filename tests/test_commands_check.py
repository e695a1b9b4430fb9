"""Registration refuses each malformed command or entity declaration with
its named error (pure: no database)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import pytest

from service_engine.commands import (
    MAX_CASCADE,
    TRANSACTION_TIME,
    UUID_V7,
    BindingError,
    Cascade,
    CascadeEdge,
    Catalog,
    ClauseOrderError,
    Command,
    CommandDeclarationError,
    Const,
    Create,
    Delete,
    DeletePolicyError,
    DuplicateName,
    Entity,
    Eq,
    Field,
    IdempotencyDeclarationError,
    IdempotencyKey,
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
    Require,
    RequireGate,
    Restrict,
    Return,
    ReverseIndex,
    RouteIdentifiesRow,
    Row,
    RowPolicy,
    Service,
    ServiceValueError,
    Set,
    Transition,
    UnboundReference,
    Unique,
    UniqueKeyOutsidePartition,
    UnknownName,
    Var,
    Workflow,
    WorkflowError,
    WorkflowTransition,
)
from service_engine.errors import ConfigError
from service_engine.gates import Gate, Reason, gated


class _Store:
    async def load(self, conn: Any, key: Any) -> None:
        return None


@dataclass
class Post:
    site: str
    id: str
    state: str
    title: str
    version: int = 1
    Store: ClassVar[Any] = _Store()

    @gated("edit")
    def can_edit(self, principal: Any) -> Gate:
        return Gate.allow()


@dataclass
class Comment:
    site: str
    id: str
    post_id: str
    body: str
    version: int = 1
    Store: ClassVar[Any] = _Store()


POST = Entity(
    "Post", Post, key=("site", "id"), partition_by=("site",), conflict_key=("id",),
    revision="version",
    unique=(Unique("by_title", ("site", "title")),),
    delete_policy=Restrict((IndexRef("Comment", "by_post"),)),
)
COMMENT = Entity(
    "Comment", Comment, key=("site", "id"), partition_by=("site",), conflict_key=("id",),
    revision="version",
    relationships=(Relationship("post", "Post", ("site", "post_id")),),
    indexes=(ReverseIndex("by_post", ("site", "post_id"), table="comment"),),
    delete_policy=NoInbound(),
)
FLOW = Workflow("Life", "Post", "state", ("draft", "published"),
                (WorkflowTransition("Publish", ("draft",), "published"),))
CATALOG = Catalog([POST, COMMENT], [FLOW])

SITE, POST_ID, KEY = Input("site", str), Input("post_id", str), Input("key", str)
READ_POST = Read("Post", (Var("site"), Var("post_id")), as_="post", else_=Outcome("PostMissing"))
MUTATE_POST = Mutate("Post", (Var("site"), Var("post_id")), as_="post",
                     else_=Outcome("PostMissing"), taken={"by_title": Outcome("TitleTaken")})


def add_comment(*extra: Any) -> Command:
    return Command(
        "AddComment", KEY, SITE, POST_ID, Input("comment_id", str), Input("body", str),
        Service("at", TRANSACTION_TIME), IdempotencyKey("key"),
        READ_POST,
        Create("Comment", (Var("site"), Var("comment_id")), as_="comment",
               else_=Outcome("CommentExists")),
        Require("Published", Eq(Field("post", "state"), Const("published")),
                else_=Outcome("NotPublished")),
        Set("comment", "post_id", Var("post_id")),
        Set("comment", "body", Var("body")),
        *extra,
        Return("Added", at=Var("at")),
    )


def test_a_well_formed_command_checks() -> None:
    checked = CATALOG.command(add_comment())
    assert checked.idempotency_key == "key"
    assert checked.outcomes == {"PostMissing", "CommentExists", "NotPublished", "Added"}
    assert [b.as_ for b in checked.written] == ["comment"]


def test_declaration_errors_are_config_errors() -> None:
    assert issubclass(CommandDeclarationError, ConfigError)


@pytest.mark.parametrize("clauses", [
    (READ_POST, SITE, Return("X")),
    (SITE, Return("X"), READ_POST),
    (KEY, SITE, POST_ID, MUTATE_POST, IdempotencyKey("key"),
     Set("post", "title", Var("key"), overwrite=True),
     Return("X")),
    (SITE, POST_ID, MUTATE_POST, Set("post", "title", Var("site"), overwrite=True),
     Require("R", Const(True), Outcome("No")), Return("X")),
    (SITE, Return("X"), Return("Y")),
    (SITE,),
])
def test_clauses_out_of_the_visible_order_are_refused(clauses: tuple[Any, ...]) -> None:
    with pytest.raises(ClauseOrderError):
        CATALOG.command(Command("Bad", *clauses))


def test_a_requirement_observes_only_what_was_bound_before_it() -> None:
    with pytest.raises(UnboundReference):
        CATALOG.command(Command(
            "Bad", SITE, POST_ID, READ_POST,
            Require("R", Eq(Field("other", "state"), Const("x")), Outcome("No")),
            Return("X"),
        ))
    with pytest.raises(UnboundReference):
        CATALOG.command(Command(
            "Bad", SITE, POST_ID, READ_POST,
            Require("R", Eq(Field("post", "state"), Var("later")), Outcome("No")),
            Return("X"),
        ))
    with pytest.raises(UnboundReference):
        CATALOG.command(Command("Bad", SITE, READ_POST, Return("X")))  # post_id undeclared


def test_names_are_unique_per_namespace() -> None:
    with pytest.raises(DuplicateName):
        CATALOG.command(Command("Bad", SITE, SITE, Return("X")))
    with pytest.raises(DuplicateName):
        CATALOG.command(Command(
            "Bad", SITE, POST_ID, READ_POST,
            Require("R", Const(True), Outcome("PostMissing")), Return("X"),
        ))
    with pytest.raises(DuplicateName):
        Catalog([POST, POST])


def test_unknown_entities_fields_and_transitions_are_refused() -> None:
    with pytest.raises(UnknownName):
        CATALOG.command(Command("Bad", SITE, POST_ID,
                                Read("Nope", (Var("site"), Var("post_id")), as_="x",
                                     else_=Outcome("Missing")), Return("X")))
    with pytest.raises(UnknownName):
        CATALOG.command(Command("Bad", SITE, POST_ID, READ_POST,
                                Require("R", Eq(Field("post", "colour"), Const(1)),
                                        Outcome("No")), Return("X")))
    with pytest.raises(UnknownName):
        CATALOG.command(Command("Bad", SITE, POST_ID, Input("rev", int), MUTATE_POST,
                                Transition("Life.Retract", on="post", revision=Var("rev"),
                                           stale=Outcome("Stale"), illegal=Outcome("Illegal")),
                                Return("X")))
    with pytest.raises(UnknownName):
        CATALOG.command(Command("Bad", SITE, POST_ID, READ_POST, RequireGate("post", "can_fly"),
                                Return("X")))


def test_a_binding_key_is_the_complete_key_of_inputs() -> None:
    with pytest.raises(BindingError):
        CATALOG.command(Command("Bad", SITE, Read("Post", (Var("site"),), as_="post",
                                                   else_=Outcome("Missing")), Return("X")))
    with pytest.raises(BindingError):
        CATALOG.command(Command(
            "Bad", SITE, POST_ID, READ_POST,
            Read("Post", (Var("site"), Field("post", "title")), as_="other",
                 else_=Outcome("OtherMissing")),
            Return("X"),
        ))


def test_every_outcome_is_declared_and_pascal_case() -> None:
    with pytest.raises(MissingOutcome):
        CATALOG.command(Command("Bad", SITE, POST_ID,
                                Read("Post", (Var("site"), Var("post_id")), as_="post",
                                     else_=Outcome("post_missing")), Return("X")))
    with pytest.raises(MissingOutcome):
        CATALOG.command(Command("Bad", SITE, POST_ID,
                                Read("Post", (Var("site"), Var("post_id")), as_="post",
                                     else_=Outcome("Refused")), Return("X")))
    # A rename of a unique field must say what a taken value answers.
    with pytest.raises(MissingOutcome):
        CATALOG.command(Command(
            "Bad", SITE, POST_ID, Input("title", str),
            Mutate("Post", (Var("site"), Var("post_id")), as_="post", else_=Outcome("Missing")),
            Set("post", "title", Var("title"), overwrite=True), Return("X"),
        ))


def test_the_idempotency_key_is_one_declared_string_input() -> None:
    with pytest.raises(IdempotencyDeclarationError):
        CATALOG.command(Command("Bad", Input("n", int), IdempotencyKey("n"), Return("X")))
    with pytest.raises(IdempotencyDeclarationError):
        CATALOG.command(Command("Bad", KEY, IdempotencyKey("key"), IdempotencyKey("key"),
                                Return("X")))
    with pytest.raises(IdempotencyDeclarationError):
        CATALOG.command(Command("Bad", IdempotencyKey("key"), Return("X")))


def test_service_values_need_a_durably_idempotent_mutation() -> None:
    with pytest.raises(ServiceValueError):
        CATALOG.command(Command("Bad", SITE, POST_ID, Service("id", UUID_V7), READ_POST,
                                Return("X")))
    with pytest.raises(ServiceValueError):
        CATALOG.command(Command("Bad", Service("id", "random"), Return("X")))
    with pytest.raises(ServiceValueError):
        CATALOG.command(Command(
            "Bad", SITE, POST_ID, Input("title", str), Service("id", UUID_V7), MUTATE_POST,
            Set("post", "title", Var("title"), overwrite=True), Return("X"),
        ))


def test_writes_derive_one_partition_route() -> None:
    with pytest.raises(PartitionRouteMismatch):
        CATALOG.command(Command(
            "Bad", SITE, Input("other_site", str), POST_ID, Input("comment_id", str),
            Input("body", str), MUTATE_POST,
            Create("Comment", (Var("other_site"), Var("comment_id")), as_="comment",
                   else_=Outcome("Exists")),
            Set("post", "title", Var("body"), overwrite=True),
            Set("comment", "post_id", Var("post_id")), Set("comment", "body", Var("body")),
            Return("X"),
        ))


def test_a_create_needs_a_dominating_read_of_its_relationship() -> None:
    with pytest.raises(MissingRelationshipProof):
        CATALOG.command(Command(
            "Bad", SITE, POST_ID, Input("comment_id", str), Input("body", str),
            Create("Comment", (Var("site"), Var("comment_id")), as_="comment",
                   else_=Outcome("Exists")),
            Set("comment", "post_id", Var("post_id")), Set("comment", "body", Var("body")),
            Return("X"),
        ))
    # A read of another post is no proof.
    with pytest.raises(MissingRelationshipProof):
        CATALOG.command(Command(
            "Bad", SITE, POST_ID, Input("other", str), Input("comment_id", str),
            Input("body", str),
            Read("Post", (Var("site"), Var("other")), as_="post", else_=Outcome("Missing")),
            Create("Comment", (Var("site"), Var("comment_id")), as_="comment",
                   else_=Outcome("Exists")),
            Set("comment", "post_id", Var("post_id")), Set("comment", "body", Var("body")),
            Return("X"),
        ))


def test_a_create_sets_every_field() -> None:
    with pytest.raises(BindingError):
        CATALOG.command(Command(
            "Bad", SITE, POST_ID, Input("comment_id", str), READ_POST,
            Create("Comment", (Var("site"), Var("comment_id")), as_="comment",
                   else_=Outcome("Exists")),
            Set("comment", "post_id", Var("post_id")), Return("X"),
        ))


def test_a_unique_key_begins_with_the_partition_route() -> None:
    with pytest.raises(UniqueKeyOutsidePartition):
        Catalog([replace(POST, unique=(Unique("by_title", ("title",)),)), COMMENT])
    with pytest.raises(UniqueKeyOutsidePartition):
        Catalog([replace(POST, unique=(Unique("by_site", ("site",)),)), COMMENT])


def test_a_route_that_identifies_one_row_makes_indexes_vacuous() -> None:
    with pytest.raises(RouteIdentifiesRow):
        Catalog([replace(POST, partition_by=("site", "id"),
                         unique=(Unique("by_title", ("site", "id", "title")),)), COMMENT])


def test_entity_keys_partitions_and_conflict_keys_are_checked() -> None:
    with pytest.raises(BindingError):
        Catalog([replace(POST, partition_by=("id",))])
    with pytest.raises(BindingError):
        Catalog([replace(POST, conflict_key=("title",))])
    with pytest.raises(UnknownName):
        Catalog([COMMENT])  # its relationship targets an undeclared Post


def test_delete_policies_match_the_relationship_graph() -> None:
    with pytest.raises(DeletePolicyError):  # something targets it
        Catalog([replace(POST, delete_policy=NoInbound()), COMMENT])
    with pytest.raises(DeletePolicyError):  # restrict proves nothing
        Catalog([replace(POST, delete_policy=Restrict(())), COMMENT])
    with pytest.raises(UnknownName):
        Catalog([replace(POST, delete_policy=Restrict((IndexRef("Comment", "nope"),))), COMMENT])
    cascade = Cascade((CascadeEdge("Comment", "post", "by_post", 10),))
    Catalog([replace(POST, delete_policy=cascade), COMMENT])
    with pytest.raises(DeletePolicyError):  # beyond the fixed maximum
        Catalog([replace(POST, delete_policy=Cascade(
            (CascadeEdge("Comment", "post", "by_post", MAX_CASCADE + 1),))), COMMENT])
    with pytest.raises(DeletePolicyError):  # not enumerated
        Catalog([replace(POST, delete_policy=Cascade(())), COMMENT])
    with pytest.raises(DeletePolicyError):  # the child must declare no_inbound
        Catalog([replace(POST, delete_policy=cascade), replace(COMMENT, delete_policy=None)])
    with pytest.raises(DeletePolicyError):  # an index that does not start with the reference
        Catalog([replace(POST, delete_policy=cascade), replace(COMMENT, indexes=(
            ReverseIndex("by_post", ("post_id", "site"), table="comment"),))])


def test_a_delete_declares_its_policy_outcome() -> None:
    delete = Command("Del", SITE, POST_ID, Mutate("Post", (Var("site"), Var("post_id")),
                                                  as_="post", else_=Outcome("Missing")),
                     Delete("post", referenced=Outcome("Referenced")), Return("Deleted"))
    CATALOG.command(delete)
    with pytest.raises(MissingOutcome):
        CATALOG.command(Command("Del", SITE, POST_ID, Mutate(
            "Post", (Var("site"), Var("post_id")), as_="post", else_=Outcome("Missing")),
            Delete("post"), Return("Deleted")))
    with pytest.raises(DeletePolicyError):  # too_many belongs to a cascade
        CATALOG.command(Command("Del", SITE, POST_ID, Mutate(
            "Post", (Var("site"), Var("post_id")), as_="post", else_=Outcome("Missing")),
            Delete("post", referenced=Outcome("R"), too_many=Outcome("T")), Return("Deleted")))
    no_policy = Catalog([replace(POST, delete_policy=None, unique=()),
                         replace(COMMENT, relationships=(), indexes=())], [FLOW])
    with pytest.raises(DeletePolicyError):
        no_policy.command(delete)


def test_workflows_close_their_graph_and_are_the_only_way_to_move_state() -> None:
    with pytest.raises(WorkflowError):
        Catalog([POST, COMMENT], [Workflow("Life", "Post", "state", ("draft",), (
            WorkflowTransition("Publish", ("draft",), "published"),))])
    with pytest.raises(WorkflowError):
        Catalog([replace(POST, revision=None), COMMENT], [FLOW])
    with pytest.raises(WorkflowError):  # no unconditional workflow update
        CATALOG.command(Command("Bad", SITE, POST_ID, MUTATE_POST,
                                Set("post", "state", Const("published")), Return("X")))
    with pytest.raises(WorkflowError):  # a transition names a mutate binding
        CATALOG.command(Command("Bad", SITE, POST_ID, Input("rev", int), READ_POST,
                                Transition("Life.Publish", on="post", revision=Var("rev"),
                                           stale=Outcome("Stale"), illegal=Outcome("Illegal")),
                                Return("X")))
    with pytest.raises(WorkflowError):  # the revision comes from the caller
        CATALOG.command(Command("Bad", SITE, POST_ID, MUTATE_POST,
                                Transition("Life.Publish", on="post", revision=Const(1),
                                           stale=Outcome("Stale"), illegal=Outcome("Illegal")),
                                Return("X")))


def test_row_policies_observe_rows_facts_and_constants_only() -> None:
    with pytest.raises(CommandDeclarationError):
        Catalog([replace(POST, update_policy=RowPolicy(Eq(Var("x"), Const(1)), Reason("no"))),
                 COMMENT])
    with pytest.raises(UnknownName):
        Catalog([replace(POST, update_policy=RowPolicy(Row("colour"), Reason("no"))), COMMENT])


def test_a_gate_judges_an_existing_row() -> None:
    CATALOG.command(Command("Edit", SITE, POST_ID, READ_POST, RequireGate("post", "can_edit"),
                            Return("Edited")))
    with pytest.raises(BindingError):
        CATALOG.command(add_comment().__class__(
            "Bad", *add_comment().clauses[:9], RequireGate("comment", "can_edit"),
            *add_comment().clauses[9:],
        ))
