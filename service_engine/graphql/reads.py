"""A query field's read of one projector's views, for the caller.

A slice binds its projector to the view type it renders once, and its query
fields read through it, exactly as a subscription's session renders (the
same populate, render and RLS regime)::

    BOARD_VIEWS = Views(BOARDS, BoardView)

    @strawberry.field(description="The boards the caller sees.")
    async def boards(self, info: Info, limit: int = 100) -> list[BoardView]:
        return await BOARD_VIEWS.window(info.context, BoardsQuery(limit))

    @strawberry.field(description="One board, if the caller sees it.")
    async def board(self, info: Info, id: strawberry.ID) -> BoardView | None:
        return await BOARD_VIEWS.one(info.context, str(id))

The caller is ``context.principal``; a view the projector renders that is
not of the bound type is refused (`ProjectorViewMismatch`), never served
under the wrong GraphQL type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ..failures import EngineError

if TYPE_CHECKING:
    from ..blobs.model import DownloadUrl
    from ..impacts.model import JsonValue
    from ..render.projector import RlsApplier
    from .context import GraphQLContext

__all__ = ["ProjectorViewMismatch", "Views"]

V = TypeVar("V")


class ProjectorViewMismatch(EngineError):
    """A projector rendered a view of another type than the one its `Views`
    names: the projector and the query field disagree."""


@dataclass(frozen=True, slots=True)
class Views(Generic[V]):
    """The views ``projector`` renders (each a ``view_type``), read for a
    query field; ``applier`` is the projector's RLS applier, if it reads
    under RLS."""

    projector: str
    view_type: type[V]
    applier: RlsApplier[Any] | None = None

    async def window(self, context: GraphQLContext[Any], query: Any) -> list[V]:
        """The views of the window ``query`` selects, in window order (what a
        session's Reset would carry)."""
        found = await context.engine.fetch_window(
            self.projector, query, context.principal, self.applier
        )
        return [self.typed(view) for _, view in found]

    async def one(
        self, context: GraphQLContext[Any], key: JsonValue, *, principal: Any = None
    ) -> V | None:
        """The view of ``key``, or ``None`` when the caller does not see it.
        ``principal`` reads for another principal than the context's (the
        caller's refreshed self after a mutation changed its facts)."""
        view = await context.engine.fetch(
            self.projector, key, context.principal if principal is None else principal,
            self.applier,
        )
        return None if view is None else self.typed(view)

    async def download(
        self, context: GraphQLContext[Any], key: JsonValue, reference: JsonValue
    ) -> DownloadUrl | None:
        """A presigned GET of the blob ``reference`` the view of ``key``
        holds, only while the caller sees that view and its row still lists
        the reference (`Engine.download`: `one`'s own read and gate); None
        otherwise. Hand its ``url`` to the caller; never store it."""
        return await context.engine.download(
            self.projector, key, reference, context.principal, self.applier
        )

    def typed(self, view: object) -> V:
        """``view`` as the bound type; `ProjectorViewMismatch` when it is not."""
        if not isinstance(view, self.view_type):
            raise ProjectorViewMismatch(
                f"projector {self.projector!r} rendered a {type(view).__name__}, "
                f"not a {self.view_type.__name__}"
            )
        return view
