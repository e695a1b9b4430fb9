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
    And,
    BindingError,
    Cascade,
    CascadeEdge,
    Catalog,
    ClauseOrderError,
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
    IdempotencyDeclarationError,
    IdempotencyKey,
    IndexRef,
    Input,
    MissingOutcome,
    MissingRelationshipProof,
    Mutate,
    NoInbound,
    NotCompilable,
    Outcome,
    PartitionRouteMismatch,
    Permit,
    Read,
    Relationship,
    Require,
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
    TypeMismatch,
    UnboundReference,
    Unique,
    UniqueKeyOutsidePartition,
    UnknownName,
    Unless,
    UnprovenSet,
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
    delete_policy=Restrict((IndexRef("Comment", "by_post"),)), table="post",
)
COMMENT = Entity(
    "Comment", Comment, key=("site", "id"), partition_by=("site",), conflict_key=("id",),
    revision="version",
    relationships=(Relationship("post", "Post", ("site", "post_id")),),
    indexes=(ReverseIndex("by_post", ("site", "post_id"), table="comment"),),
    delete_policy=NoInbound(), table="comment",
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
    """A well-formed command registers with its idempotency key, every outcome it can
    answer, and only the bindings it writes listed as written."""
    checked = CATALOG.command(add_comment())
    assert checked.idempotency_key == "key"
    assert checked.outcomes == {"PostMissing", "CommentExists", "NotPublished", "Added"}
    assert [b.as_ for b in checked.written] == ["comment"]


def test_declaration_errors_are_config_errors() -> None:
    """A command declaration error is a ConfigError: code catching bad configuration catches it."""
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
    """A clause out of its place (a binding before an input, a key after a binding, a requirement
    after a Set, anything after the Return, two Returns or none) is refused."""
    with pytest.raises(ClauseOrderError):
        CATALOG.command(Command("Bad", *clauses))


def test_a_requirement_observes_only_what_was_bound_before_it() -> None:
    """A requirement naming a binding or an input not declared before it, and a key naming
    an undeclared input, are refused as unbound references."""
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
    """Two inputs of one name, an outcome declared twice in a command, and two entities of one
    name in a catalog are refused as duplicates."""
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
    """A binding of an undeclared entity, a field the entity lacks, an undeclared workflow
    transition and a gate the aggregate lacks are refused as unknown names."""
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
    with pytest.raises(UnboundReference):
        CATALOG.command(Command("Bad", SITE, POST_ID, READ_POST, Permit(
            "fly", Unless(Reason("post.no"), Field("poster", "state"))), Return("X")))


def test_a_binding_key_is_the_complete_key_of_inputs() -> None:
    """A binding key missing a key field, or taking a component from another binding's field
    instead of an input, is refused."""
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
    """An outcome not in PascalCase or named like one of the engine's own (Refused) is refused,
    as is a rename of a unique field that declares no outcome for a taken value."""
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
    """An idempotency key on a non-string input, declared twice, or naming no declared input
    is refused."""
    with pytest.raises(IdempotencyDeclarationError):
        CATALOG.command(Command("Bad", Input("n", int), IdempotencyKey("n"), Return("X")))
    with pytest.raises(IdempotencyDeclarationError):
        CATALOG.command(Command("Bad", KEY, IdempotencyKey("key"), IdempotencyKey("key"),
                                Return("X")))
    with pytest.raises(IdempotencyDeclarationError):
        CATALOG.command(Command("Bad", IdempotencyKey("key"), Return("X")))


def test_service_values_need_a_durably_idempotent_mutation() -> None:
    """A service value in a command that writes nothing or declares no idempotency key is
    refused, and so is a service value of an unknown kind."""
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
    """A command whose writes would land in two partitions (rows keyed by two site inputs)
    is refused."""
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
    """A create whose required relationship is not proven by an earlier read of the very target
    row (no read at all, or a read of another post) is refused."""
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
    """A create that never sets a field without a default (the comment's body) is refused."""
    with pytest.raises(BindingError):
        CATALOG.command(Command(
            "Bad", SITE, POST_ID, Input("comment_id", str), READ_POST,
            Create("Comment", (Var("site"), Var("comment_id")), as_="comment",
                   else_=Outcome("Exists")),
            Set("comment", "post_id", Var("post_id")), Return("X"),
        ))


def test_a_unique_key_begins_with_the_partition_route() -> None:
    """A unique key that does not begin with the partition route, or holds nothing beyond it,
    is refused."""
    with pytest.raises(UniqueKeyOutsidePartition):
        Catalog([replace(POST, unique=(Unique("by_title", ("title",)),)), COMMENT])
    with pytest.raises(UniqueKeyOutsidePartition):
        Catalog([replace(POST, unique=(Unique("by_site", ("site",)),)), COMMENT])


def test_a_route_that_identifies_one_row_makes_indexes_vacuous() -> None:
    """An entity whose partition route is its whole key may declare no unique key: each
    partition holds one row, so the key would be vacuous."""
    with pytest.raises(RouteIdentifiesRow):
        Catalog([replace(POST, partition_by=("site", "id"),
                         unique=(Unique("by_title", ("site", "id", "title")),)), COMMENT])


def test_entity_keys_partitions_and_conflict_keys_are_checked() -> None:
    """A partition route that is not a prefix of the key, a conflict key beyond the key fields,
    and a relationship to an undeclared entity are refused."""
    with pytest.raises(BindingError):
        Catalog([replace(POST, partition_by=("id",))])
    with pytest.raises(BindingError):
        Catalog([replace(POST, conflict_key=("title",))])
    with pytest.raises(UnknownName):
        Catalog([COMMENT])  # its relationship targets an undeclared Post


def test_delete_policies_match_the_relationship_graph() -> None:
    """A delete policy that misfits the relationships targeting its entity, or names an unknown
    index, is refused; a bounded cascade through a reverse index led by the reference registers."""
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
    """A delete under restrict must declare its referenced outcome and may not declare
    too_many; an entity without a delete policy cannot be deleted."""
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
    """A workflow moving outside its states or on an entity without a revision is refused, and
    so is a command that sets the state field, transitions a read binding, or fixes the revision."""
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
    """A row policy naming a command input, or a field the entity lacks, is refused."""
    with pytest.raises(CommandDeclarationError):
        Catalog([replace(POST, update_policy=RowPolicy(Eq(Var("x"), Const(1)), Reason("no"))),
                 COMMENT])
    with pytest.raises(UnknownName):
        Catalog([replace(POST, update_policy=RowPolicy(Row("colour"), Reason("no"))), COMMENT])


def test_a_permit_is_rules_of_boolean_conditions() -> None:
    """A permit's rules each take a reason and boolean conditions over the
    bindings, inputs and declared facts; anything else is refused."""
    CATALOG.command(Command("Edit", SITE, POST_ID, READ_POST, Permit(
        "edit", Unless(Reason("post.draft"), Eq(Field("post", "state"), Const("draft")))),
        Return("Edited")))
    with pytest.raises(TypeMismatch):
        CATALOG.command(Command("Bad", SITE, POST_ID, READ_POST, Permit(
            "edit", Unless(Reason("post.x"), Field("post", "title"))), Return("X")))
    with pytest.raises(CommandDeclarationError):
        CATALOG.command(Command("Bad", SITE, POST_ID, READ_POST, Permit("edit"), Return("X")))
    with pytest.raises(CommandDeclarationError):
        CATALOG.command(Command("Bad", SITE, POST_ID, READ_POST, Permit(
            "edit", Unless("post.x", Const(True))), Return("X")))  # type: ignore[arg-type]


def test_an_entity_without_a_table_is_not_compilable() -> None:
    """Registration compiles every command: an entity naming no table (and
    whose store has no ``TABLE``) is refused with `NotCompilable`."""
    catalog = Catalog([replace(POST, table=None), COMMENT], [FLOW])
    with pytest.raises(NotCompilable, match="names no table"):
        catalog.command(Command("Edit", SITE, POST_ID, READ_POST, Return("Edited")))


# -- every refusal names its declaration ----------------------------------------------


def refused(error: type[Exception], message: str, make: Any) -> None:
    with pytest.raises(error, match=message):
        make()


def test_catalog_duplicates_name_the_first_declaration() -> None:
    """Every duplicate name, in a catalog or a command, is refused naming its own position
    and the position of the first declaration."""
    refused(DuplicateName, r"^entity Post \(entity #2\): the name is first declared by entity #1$",
            lambda: Catalog([POST, POST, COMMENT]))
    refused(DuplicateName, r"^entity Post \(entity #3\): the name is first declared by entity #2$",
            lambda: Catalog([COMMENT, POST, POST]))
    refused(DuplicateName,
            r"^workflow Life \(workflow #2\): the name is first declared by workflow #1$",
            lambda: Catalog([POST, COMMENT], [FLOW, FLOW]))
    two = (Unique("by_title", ("site", "title")), Unique("by_title", ("site", "state")))
    refused(DuplicateName, r"unique key by_title \(unique #2\): the name is first declared by "
            r"unique #1$", lambda: Catalog([replace(POST, unique=two), COMMENT]))
    index = ReverseIndex("by_title", ("site", "title"), table="post")
    refused(DuplicateName, r"index by_title \(index #1\): the name is first declared by "
            r"unique #1$", lambda: Catalog([replace(POST, indexes=(index,)), COMMENT]))
    rels = (Relationship("post", "Post", ("site", "post_id")),) * 2
    refused(DuplicateName, r"relationship post \(relationship #2\): the name is first declared "
            r"by relationship #1$", lambda: Catalog([POST, replace(COMMENT, relationships=rels)]))
    moves = (WorkflowTransition("Publish", ("draft",), "published"),) * 2
    refused(DuplicateName, r"transition Publish \(transition #2\): the name is first declared "
            r"by transition #1$",
            lambda: Catalog([POST, COMMENT], [replace(FLOW, transitions=moves)]))
    refused(DuplicateName, r"command Bad: site at clause 2 \(Input site\): name 'site' is first "
            r"declared at clause 1 \(Input site\)$",
            lambda: CATALOG.command(Command("Bad", SITE, SITE, Return("X"))))
    refused(DuplicateName, r"command Bad: return X at clause 4 \(Return X\): outcome 'X' is "
            r"first declared at clause 3 \(Read post\)$",
            lambda: CATALOG.command(Command("Bad", SITE, POST_ID, replace(
                READ_POST, else_=Outcome("X")), Return("X"))))


def test_entities_are_checked_field_by_field() -> None:
    """Each malformed part of an entity (aggregate, revision, conflict key, unique, index,
    relationship, row policy) is refused naming it, while the valid variants register."""
    class NoStore:
        pass

    refused(CommandDeclarationError, "aggregate must be a class naming a Store",
            lambda: Catalog([Entity("X", NoStore, key=("id",))]))
    refused(CommandDeclarationError, "aggregate must be a class naming a Store",
            lambda: Catalog([Entity("X", "Post", key=("id",))]))  # type: ignore[arg-type]
    refused(UnknownName, r"entity Post: Post has no typed field \['colour'\]",
            lambda: Catalog([replace(POST, revision="colour"), COMMENT]))
    refused(BindingError, r"conflict_key \(\) must be key fields",
            lambda: Catalog([replace(POST, conflict_key=()), COMMENT]))
    Catalog([replace(POST, conflict_key=("site", "id")), COMMENT])  # the whole key is fine
    refused(CommandDeclarationError, "the revision 'id' cannot be a key field",
            lambda: Catalog([replace(POST, revision="id"), COMMENT]))
    Catalog([replace(POST, revision=None), replace(COMMENT, revision=None)])
    refused(UnknownName, r"unique by_x names unknown fields \['x'\]",
            lambda: Catalog([replace(POST, unique=(Unique("by_x", ("site", "x")),)), COMMENT]))
    refused(UnknownName, r"index by_x names unknown fields \['x'\]", lambda: Catalog([
        POST, replace(COMMENT, indexes=(ReverseIndex("by_x", ("site", "x"), table="c"),))]))
    refused(CommandDeclarationError, "index by_post columns do not match", lambda: Catalog([
        POST, replace(COMMENT, indexes=(ReverseIndex("by_post", ("site", "post_id"), table="c",
                                                     columns=("site",)),))]))
    refused(CommandDeclarationError, r"index by_post key_columns must hold the key", lambda: (
        Catalog([POST, replace(COMMENT, indexes=(ReverseIndex(
            "by_post", ("site", "post_id"), table="c", key_columns=("id",)),))])))
    Catalog([POST, replace(COMMENT, indexes=(ReverseIndex(
        "by_post", ("site", "post_id"), table="c", key_columns=("site", "comment_id")),))])
    refused(UnknownName, r"relationship post names unknown fields \['x'\]", lambda: Catalog([
        POST, replace(COMMENT, relationships=(Relationship("post", "Post", ("site", "x")),))]))
    refused(BindingError, "must reference the complete key", lambda: Catalog([
        POST, replace(COMMENT, relationships=(Relationship("post", "Post", ("post_id",)),))]))
    refused(TypeMismatch, r"the update row policy: \(row.title == 5\) compares str with 5",
            lambda: Catalog([replace(POST, update_policy=RowPolicy(
                Eq(Row("title"), Const(5)), Reason("no"))), COMMENT]))
    refused(TypeMismatch, r"'publishd' is not one of \{'draft', 'published'\}",
            lambda: Catalog([replace(POST, create_policy=RowPolicy(
                Eq(Row("state"), Const("publishd")), Reason("no"))), COMMENT], [FLOW]))
    # A workflow closes only its own entity's field.
    Catalog([POST, replace(COMMENT, update_policy=RowPolicy(
        Eq(Row("body"), Const("publishd")), Reason("no")))],
        [replace(FLOW, state="title", states=("publishd",), transitions=())])


def test_delete_policies_are_checked_edge_by_edge() -> None:
    """Each malformed restrict or cascade edge (unknown or wrong index, maximum outside
    1..MAX_CASCADE, unknown or foreign relationship, repeated edge) is refused naming it."""
    refused(UnknownName, r"restrict names unknown index Nope\.by_post", lambda: Catalog([
        replace(POST, delete_policy=Restrict((IndexRef("Nope", "by_post"),))), COMMENT]))
    other = ReverseIndex("by_body", ("site", "body"), table="comment")
    refused(DeletePolicyError, r"restrict Comment\.by_body is not a reverse index", lambda: (
        Catalog([replace(POST, delete_policy=Restrict((IndexRef("Comment", "by_body"),))),
                 replace(COMMENT, indexes=(*COMMENT.indexes, other))])))
    refused(DeletePolicyError, r"restrict, but nothing targets Post: declare no_inbound",
            lambda: Catalog([replace(POST, delete_policy=Restrict(())),
                             replace(COMMENT, relationships=())]))
    edge = CascadeEdge("Comment", "post", "by_post", 1)
    Catalog([replace(POST, delete_policy=Cascade((edge,))), COMMENT])
    Catalog([replace(POST, delete_policy=Cascade((replace(edge, maximum=MAX_CASCADE),))),
             COMMENT])
    for maximum in (0, -1, MAX_CASCADE + 1, 1.0, True):
        refused(DeletePolicyError, "cascade maximum must be", lambda m=maximum: Catalog([
            replace(POST, delete_policy=Cascade((replace(edge, maximum=m),))), COMMENT]))
    refused(DeletePolicyError, r"cascade names Nope\.post", lambda: Catalog([
        replace(POST, delete_policy=Cascade((replace(edge, entity="Nope"),))), COMMENT]))
    refused(DeletePolicyError, r"cascade names Comment\.nope", lambda: Catalog([
        replace(POST, delete_policy=Cascade((replace(edge, relationship="nope"),))), COMMENT]))
    refused(DeletePolicyError, r"needs a reverse index of Comment starting with", lambda: (
        Catalog([replace(POST, delete_policy=Cascade((replace(edge, index="nope"),))),
                 COMMENT])))
    refused(DuplicateName, r"cascade lists Comment\.post twice", lambda: Catalog([
        replace(POST, delete_policy=Cascade((edge, edge))), COMMENT]))
    # A relationship of a child towards another entity is not an edge of this one.
    refused(DeletePolicyError, r"cascade names Comment\.post, which is not a relationship "
            r"targeting Comment", lambda: Catalog([
                POST, replace(COMMENT, delete_policy=Cascade((edge,)))]))


def test_workflows_are_checked_state_by_state() -> None:
    """A workflow on an unknown entity or field, with missing, repeated or mistyped states, a
    sourceless transition, or a second one on the same field is refused naming it."""
    refused(UnknownName, r"workflow Life: unknown entity 'Nope'",
            lambda: Catalog([POST, COMMENT], [replace(FLOW, entity="Nope")]))
    refused(UnknownName, r"workflow Life: Post declares no field 'colour'",
            lambda: Catalog([POST, COMMENT], [replace(FLOW, state="colour")]))
    refused(WorkflowError, "declare each state once",
            lambda: Catalog([POST, COMMENT], [replace(FLOW, states=())]))
    refused(WorkflowError, "declare each state once",
            lambda: Catalog([POST, COMMENT], [replace(FLOW, states=("draft", "draft"))]))
    refused(WorkflowError, "no source state", lambda: Catalog([POST, COMMENT], [replace(
        FLOW, transitions=(WorkflowTransition("Publish", (), "published"),))]))
    refused(WorkflowError, r"Post\.state has two workflows", lambda: Catalog(
        [POST, COMMENT], [FLOW, replace(FLOW, name="Other")]))
    Catalog([POST, COMMENT], [FLOW, replace(FLOW, name="Titles", state="title",
                                                 transitions=())])
    refused(WorkflowError, r"states \[5\] are not values of Post\.state",
            lambda: Catalog([POST, COMMENT], [replace(FLOW, states=("draft", 5))]))  # type: ignore[arg-type]


def post_command(*clauses: Any) -> Command:
    return Command("Bad", SITE, POST_ID, Input("rev", int), Input("text", str), *clauses,
                   Return("X"))


def test_command_clauses_are_checked_one_by_one() -> None:
    """Each malformed clause is refused with a message naming its command and clause, and a
    well-formed transition resolves to its workflow and move."""
    transition = Transition("Life.Publish", on="post", revision=Var("rev"),
                            stale=Outcome("Stale"), illegal=Outcome("Illegal"))
    cases: list[tuple[type[Exception], str, Command]] = [
        (MissingOutcome, r"read post declares no Outcome, got 'Missing'",
         post_command(replace(READ_POST, else_="Missing"))),  # type: ignore[arg-type]
        (UnboundReference, r"set 'other': no binding of that name",
         post_command(READ_POST, Set("other", "title", Var("text")))),
        (BindingError, r"set 'post': a read binding is not written; declare it mutate",
         post_command(READ_POST, Set("post", "title", Var("text"), overwrite=True))),
        (BindingError, r"delete 'post': a read binding is not written", post_command(
            READ_POST, Delete("post", referenced=Outcome("Referenced")))),
        (DeletePolicyError, r"delete 'post': name a mutate binding", post_command(
            Create("Post", (Var("site"), Var("post_id")), as_="post", else_=Outcome("Exists"),
                   taken={"by_title": Outcome("Taken")}),
            Set("post", "title", Var("text")), Set("post", "state", Const("draft")),
            Delete("post", referenced=Outcome("Referenced")))),
        (DeletePolicyError, r"delete 'post' twice", post_command(
            MUTATE_POST, Delete("post", referenced=Outcome("Referenced")),
            Delete("post", referenced=Outcome("Referenced2")))),
        (UnknownName, r"transition 'Life': not a declared Workflow\.Transition",
         post_command(MUTATE_POST, replace(transition, transition="Life"))),
        (UnknownName, r"transition 'Nope\.Publish': not a declared",
         post_command(MUTATE_POST, replace(transition, transition="Nope.Publish"))),
        (UnknownName, r"transition 'Life\.Publish\.x': not a declared",
         post_command(MUTATE_POST, replace(transition, transition="Life.Publish.x"))),
        (WorkflowError, r"two transitions on 'post'",
         post_command(MUTATE_POST, transition, replace(transition, stale=Outcome("S2"),
                                                       illegal=Outcome("I2")))),
        (BindingError, r"may not read the binding 'post'",
         post_command(MUTATE_POST, replace(transition, revision=Field("post", "version")))),
        (TypeMismatch, r"the revision is str, not an int",
         post_command(MUTATE_POST, replace(transition, revision=Var("text")))),
        (CommandDeclarationError, r"not a command clause", post_command(READ_POST, "Set")),
        (CommandDeclarationError, r"require R is not an expression", post_command(
            READ_POST, Require("R", True, Outcome("No")))),  # type: ignore[arg-type]
    ]
    for error, message, declaration in cases:
        with pytest.raises(error, match=f"^command Bad: .*{message}"):
            CATALOG.command(declaration)
    optional_rev = Command(
        "Bad", SITE, POST_ID, Input("rev", int, optional=True), MUTATE_POST,
        replace(transition, revision=Var("rev")), Return("X"))
    refused(TypeMismatch, "the revision is int | None", lambda: CATALOG.command(optional_rev))
    other = Workflow("Notes", "Comment", "body", ("a", "b"),
                     (WorkflowTransition("Go", ("a",), "b"),))
    two = Catalog([POST, COMMENT], [FLOW, other])
    refused(WorkflowError, r"transition Notes\.Go: workflow of Comment, binding post is a Post",
            lambda: two.command(post_command(MUTATE_POST, replace(transition,
                                                                  transition="Notes.Go"))))
    checked = CATALOG.command(post_command(MUTATE_POST, transition))
    step = checked.transitions["post"]
    assert (step.clause, step.workflow, step.move.name) == (transition, FLOW, "Publish")


def test_a_membership_observes_what_is_declared() -> None:
    """A Contains over a declared fact and a bound field registers; one reading a later input
    or an unbound binding is refused, naming its requirement."""
    catalog = Catalog([POST, COMMENT], [FLOW], facts={"tags": frozenset[str]})
    catalog.command(post_command(READ_POST, Require(
        "Tagged", Contains(Fact("tags"), Field("post", "title")), Outcome("No"))))
    for contains in (Contains(Fact("tags"), Var("later")), Contains(Var("later"), Var("text")),
                     Contains(Fact("tags"), Field("other", "title"))):
        with pytest.raises(UnboundReference, match="command Bad: require Tagged"):
            catalog.command(post_command(READ_POST, Require("Tagged", contains, Outcome("No"))))


def test_further_refusals_name_their_declaration() -> None:
    """Further refusals (repeated key field, unknown taken key, cascade without too_many, Row in
    a command, unproven Set, unproven relationship, incomplete create) name their declaration."""
    refused(DuplicateName, r"entity Post key: 'id' appears twice",
            lambda: Catalog([replace(POST, key=("site", "id", "id")), COMMENT]))
    refused(UnknownName, r"mutate post: Post has no unique key 'by_nope'", lambda: (
        CATALOG.command(post_command(replace(MUTATE_POST, taken={
            "by_title": Outcome("Taken"), "by_nope": Outcome("Nope")}),
            Set("post", "title", Var("text"), overwrite=True)))))
    cascade = Catalog([replace(POST, delete_policy=Cascade(
        (CascadeEdge("Comment", "post", "by_post", 10),))), COMMENT], [FLOW])
    refused(MissingOutcome, r"command Bad: delete post: cascade needs the too_many outcome",
            lambda: cascade.command(post_command(MUTATE_POST, Delete("post"))))
    refused(CommandDeclarationError, r"command Bad: require R: Row is for row policies only",
            lambda: CATALOG.command(post_command(READ_POST, Require(
                "R", Eq(Row("title"), Var("text")), Outcome("No")))))
    # A fence on the left of a conjunction fences the binding too.
    CATALOG.command(post_command(
        MUTATE_POST,
        Require("Current", And(Eq(Field("post", "version"), Var("rev")),
                               Eq(Var("text"), Const("x"))), Outcome("Stale")),
        Set("post", "title", Var("text"))))
    # Each Set after a fenced one is still checked.
    refused(UnprovenSet, r"set comment\.body", lambda: CATALOG.command(Command(
        "Bad", SITE, POST_ID, Input("rev", int), Input("text", str), Input("cid", str),
        MUTATE_POST,
        Mutate("Comment", (Var("site"), Var("cid")), as_="comment", else_=Outcome("NoComment")),
        Require("Current", Eq(Field("post", "version"), Var("rev")), Outcome("Stale")),
        Set("post", "title", Var("text")), Set("comment", "body", Var("text")),
        Return("X"))))
    # A mutation that moves a required relationship proves its new target.
    refused(MissingRelationshipProof, r"comment affects Comment\.post", lambda: CATALOG.command(
        Command("Bad", SITE, Input("cid", str), Input("other", str),
                Mutate("Comment", (Var("site"), Var("cid")), as_="comment",
                       else_=Outcome("Missing")),
                Set("comment", "post_id", Var("other"), overwrite=True), Return("X"))))
    CATALOG.command(Command(
        "Move", SITE, Input("cid", str), Input("other", str),
        Read("Post", (Var("site"), Var("other")), as_="post", else_=Outcome("NoPost")),
        Mutate("Comment", (Var("site"), Var("cid")), as_="comment", else_=Outcome("Missing")),
        Set("comment", "post_id", Var("other"), overwrite=True), Return("Moved")))
    # Every create initialises every field without a default.
    refused(BindingError, r"create second: field Comment\.body is never set", lambda: (
        CATALOG.command(Command(
            "Bad", SITE, POST_ID, Input("a", str), Input("b", str), READ_POST,
            Create("Comment", (Var("site"), Var("a")), as_="first", else_=Outcome("E1")),
            Create("Comment", (Var("site"), Var("b")), as_="second", else_=Outcome("E2")),
            Set("first", "post_id", Var("post_id")), Set("first", "body", Var("a")),
            Set("second", "post_id", Var("post_id")), Return("X")))))
