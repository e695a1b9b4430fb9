"""One projector's views, declared once (`Views`): read for a query field
exactly as a subscription's session renders them (the same populate,
render and RLS regime), streamed by its live field, and answered by a
mutation's result after the commit::

    BOARD_VIEWS = Views("boards", BoardView)

    @strawberry.field(description="The boards the caller sees.")
    async def boards(self, info: Info, limit: int = 100) -> list[BoardView]:
        return await BOARD_VIEWS.window(info.context, BoardsQuery(limit))

A slice listing a projector in its `SliceFragment` gets its `Views` and
fields derived (`service_engine.graphql.declared`); a `Views` by hand is
for a window that takes arguments, a read under RLS, or a field of
another shape.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

import strawberry
from strawberry.types.base import has_object_definition

from ..failures import ConfigError, EngineError
from .subscriptions import Live, SubscriptionUnion, live_field, subscription_union

if TYPE_CHECKING:
    from strawberry.schema.base import BaseSchema

    from ..blobs.model import DownloadUrl
    from ..engine import Engine
    from ..impacts.model import JsonValue
    from ..render.projector import RlsApplier
    from ..render.windows import WindowSpec
    from .context import GraphQLContext

__all__ = ["ProjectorViewMismatch", "UnregisteredProjector", "Views", "check_views"]

V = TypeVar("V")


class ProjectorViewMismatch(EngineError):
    """A projector rendered a view of another type than the one its `Views`
    names: the projector and the query field disagree."""


class UnregisteredProjector(ConfigError):
    """The schema serves a `Views` (a query field, a live field, a result's
    view) naming a projector the engine never registered: register it
    (its slice's ``register``) or fix the name. ``names`` are the unknown
    names, ``registered`` the registered ones."""

    def __init__(self, names: tuple[str, ...], registered: tuple[str, ...]) -> None:
        known = ", ".join(map(repr, registered)) or "none"
        super().__init__(
            f"the schema serves views of {', '.join(map(repr, names))}, which no registered "
            f"projector is named (registered projectors: {known})"
        )
        self.names = names
        self.registered = registered


LiveFunction = Callable[..., Any]
"""A live field's function over `Views`: its arguments to the `WindowSpec`
to attach (or a whole `Live`)."""

_DECLARED: weakref.WeakSet[Views[Any]] = weakref.WeakSet()
"""Every `Views` built, so a schema that serves one can be checked at boot."""


@dataclass(frozen=True, slots=True, weakref_slot=True, eq=False)
class Views(Generic[V]):
    """The views ``projector`` renders, each a ``view_type`` (another type
    is refused with `ProjectorViewMismatch`); ``applier`` is the projector's
    RLS applier, if it reads under RLS. ``union_name`` names the live
    field's generated types (default: the projector's name in CamelCase);
    ``description`` says whose views they are in those types."""

    projector: str
    view_type: type[V]
    applier: RlsApplier[Any] | None = None
    union_name: str | None = dataclass_field(default=None, kw_only=True)
    description: str | None = dataclass_field(default=None, kw_only=True)
    _union: SubscriptionUnion[V] | None = dataclass_field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        _DECLARED.add(self)

    @property
    def union(self) -> SubscriptionUnion[V]:
        """The typed subscription union of these views (built on first use)."""
        if self._union is None:
            name = self.union_name or camel_case(self.projector)
            union = subscription_union(name, self.view_type, description=self.description)
            object.__setattr__(self, "_union", union)
            return union
        return self._union

    @property
    def types(self) -> tuple[type[Any], ...]:
        """The subscription's generated types, for the slice's `SliceFragment`."""
        return self.union.types

    @overload
    def field(self, request: LiveFunction, /) -> Any: ...

    @overload
    def field(self, request: None = None, /, *, name: str | None = None,
              description: str | None = None, deprecation_reason: str | None = None
              ) -> Callable[[LiveFunction], Any]: ...

    def field(self, request: LiveFunction | None = None, /, *, name: str | None = None,
              description: str | None = None, deprecation_reason: str | None = None) -> Any:
        """Declare a live subscription field over these views (a decorator,
        with or without arguments): its function maps the field's arguments
        to the `WindowSpec` to attach (or to a whole `Live`, for a client's
        ``session_id``), as `SubscriptionUnion.field`::

            @NOTE_VIEWS.field(description="The notes of the caller's org, live.")
            def notes(self) -> WindowSpec[None]:
                return WindowSpec(Query(None))
        """
        return live_field(
            self.union, request, name=name, description=description,
            deprecation_reason=deprecation_reason, session=self.live,
        )

    def live(self, window: WindowSpec[Any], *, session_id: str | None = None) -> Live:
        """The `Live` session a subscription field over these views attaches."""
        return Live(self.projector, window, self.applier, session_id)

    def after_commit(
        self, key: str, *, principal: str | None = None, description: str | None = None
    ) -> Any:
        """A result type's field answering the view, read after the commit,
        of the key its attribute ``key`` holds (``None``: no view), as the
        caller (or as the principal the attribute ``principal`` holds) sees it::

            class NoteResult(MutationResult):
                note_id: strawberry.Private[str | None] = None
                note: NoteView | None = NOTE_VIEWS.after_commit("note_id")

        Read only when the caller selects it. The write committed whatever
        the read does: a read that fails answers the field ``null`` with the
        read's error on that field's path alone, and ``success`` stays true.
        """
        views = self

        async def read(self: Any, info: strawberry.Info) -> Any:
            found = getattr(self, key)
            if found is None:
                return None
            who = None if principal is None else getattr(self, principal)
            return await views.one(info.context, found, principal=who)

        return strawberry.field(
            resolver=read, graphql_type=self.view_type | None,
            description=description or (
                "The view as the caller sees it after the commit: null when the caller "
                "does not see it, or when the read failed (its error is beside it)."
            ),
        )

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


def camel_case(name: str) -> str:
    """A snake_case name in CamelCase (``org_boards``: ``OrgBoards``)."""
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


def check_views(engine: Engine, schema: BaseSchema) -> None:
    """Raise `UnregisteredProjector` when ``schema`` serves the view type of
    a `Views` whose projector ``engine`` has not registered (and no other
    `Views` of that view type names a registered one: a view type shared by
    projectors of several services is checked by the service that serves
    one of them)."""
    registered = engine.render.projector_names
    by_type: dict[type[Any], set[str]] = {}
    for views in list(_DECLARED):
        by_type.setdefault(views.view_type, set()).add(views.projector)
    unknown = sorted({
        name for view_type, names in by_type.items()
        if names.isdisjoint(registered) and _serves(schema, view_type) for name in names
    })
    if unknown:
        raise UnregisteredProjector(tuple(unknown), registered)


def _serves(schema: BaseSchema, view_type: type[Any]) -> bool:
    if not has_object_definition(view_type):
        return False
    found = schema.get_type_by_name(view_type.__strawberry_definition__.name)
    return getattr(found, "origin", None) is view_type

