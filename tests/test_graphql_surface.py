"""Pure pieces of the GraphQL app: the GraphiQL rewrite, close reasons, the
context, and the mutation result shape the kit gives every slice."""

from __future__ import annotations

from typing import Any, cast

import pytest
import strawberry
from strawberry.http.ides import get_graphql_ide_html

from service_engine import ActionName, MutationError
from service_engine.graphql import (
    GraphQLContext,
    MutationResult,
    PassportMissing,
    ProjectorViewMismatch,
    Refusal,
    Views,
)
from service_engine.server.app import close_reason
from service_engine.server.graphiql import graphiql_html
from service_engine.server.http_route import new_context, resolve_context
from service_engine.server.passport import PassportMalformed


def test_graphiql_opens_subscriptions_on_the_ws_path() -> None:
    """The GraphiQL page opens subscriptions on the WebSocket path, relative to the page when it
    sits under the GraphQL path."""
    page = graphiql_html(get_graphql_ide_html("graphiql"), "/graphql", "/graphql/ws")
    # Relative to the page, so a path prefix in front of the service keeps working.
    assert 'httpUrlToWebSockeUrl(new URL("graphql/ws", fetchURL).toString())' in page
    assert "httpUrlToWebSockeUrl(fetchURL);" not in page
    elsewhere = graphiql_html(get_graphql_ide_html("graphiql"), "/graphql", "/subscriptions")
    assert 'new URL("/subscriptions", fetchURL)' in elsewhere


def test_a_changed_graphiql_page_fails_loud() -> None:
    """A GraphiQL page without the line the engine rewrites fails loud instead of serving a broken
    page."""
    with pytest.raises(RuntimeError, match="GraphiQL page changed"):
        graphiql_html("<html>no subscription line</html>", "/graphql", "/graphql/ws")


def test_a_close_reason_names_the_refusal_and_fits_a_close_frame() -> None:
    """A socket's close reason names the refusal code and fits the 123 bytes of a close frame."""
    assert close_reason(PassportMissing("no header")) == "passport_missing: no header"
    long = close_reason(PassportMalformed("é" * 200))
    assert long.startswith("passport_malformed: ")
    assert len(long.encode()) <= 123


class _NoFacts:
    """An engine with no principal-fact loader registered: facts pass through."""

    async def load_principal_facts(self, principal: Any) -> Any:
        return principal


async def test_the_context_refuses_a_principal_it_does_not_have() -> None:
    """The GraphQL context raises the passport's refusal (a fresh error per read) until a principal
    is resolved, and holds it once resolved."""
    context: GraphQLContext[str] = new_context(
        cast(Any, _NoFacts()), cast(Any, None), cast(Any, None)
    )
    with pytest.raises(PassportMissing):
        _ = context.principal
    await resolve_context(context, lambda p: p.sub.upper(), '{"sub": "u"}')
    assert context.principal == "U"
    assert context.refusal is None and context.passport is not None
    await resolve_context(context, lambda p: p.sub, "%%")
    with pytest.raises(PassportMalformed) as first:
        _ = context.principal
    with pytest.raises(PassportMalformed) as second:
        _ = context.principal
    assert first.value is not second.value  # a fresh error per read
    assert context.passport is None


@strawberry.type(description="The outcome of a rename.")
class RenameResult(MutationResult):
    title: str | None = None


@strawberry.type
class ResultQuery:
    @strawberry.field
    def refused(self) -> RenameResult:
        return RenameResult.refused(
            MutationError("board.archived", "archived", False, ActionName("rename"))
        )

    @strawberry.field
    def renamed(self) -> RenameResult:
        return RenameResult(success=True, title="new")


def test_a_result_type_extends_the_kits_success_and_refusal() -> None:
    """A slice's result type extends the kit's success and refusal fields, and answers both shapes
    over GraphQL."""
    schema = strawberry.Schema(query=ResultQuery)
    sdl = schema.as_str()
    result = sdl.split("type RenameResult {", 1)[1].split("}", 1)[0].split()
    assert result == ["success:", "Boolean!", "error:", "Refusal", "title:", "String"]
    refusal = sdl.split("type Refusal {", 1)[1].split("}", 1)[0].split()
    assert refusal == ["code:", "String!", "message:", "String!", "retryable:", "Boolean!",
                       "action:", "String"]
    answered = schema.execute_sync(
        "{ refused { success title error { code message retryable action } }"
        "  renamed { success title error { code } } }"
    )
    assert answered.errors is None
    assert answered.data == {
        "refused": {"success": False, "title": None, "error": {
            "code": "board.archived", "message": "archived", "retryable": False,
            "action": "rename"}},
        "renamed": {"success": True, "title": "new", "error": None},
    }


def test_a_refusal_carries_the_errors_wire_form() -> None:
    """Refusal.of carries a MutationError's wire form."""
    error = MutationError.database(retryable=True)
    assert Refusal.of(error) == Refusal(code="database", message=error.message, retryable=True)
    assert {**error.to_wire(), "action": None} == vars(Refusal.of(error))


@strawberry.type
class Board:
    id: str


def test_views_serve_only_the_bound_view_type() -> None:
    """A projector's views hand out only its bound view type; another is ProjectorViewMismatch
    naming both."""
    views = Views("boards", Board)
    board = Board(id="b-1")
    assert views.typed(board) is board
    with pytest.raises(ProjectorViewMismatch, match="rendered a dict, not a Board"):
        views.typed({"id": "b-1"})
