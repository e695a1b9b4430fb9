"""The ergonomic projector surface: what a slice author writes to serve a view
(re-exported as ``service_engine.Projector`` and friends).

A `Projector` declares, as class attributes, its ``NAME``, the ``NOUN`` it
renders, the ``STORE`` its rows load through (the engine calls the store's
``read_many``: the author writes no render SQL) and its ``VISIBILITY``; it
implements two methods:

* ``async populate(cx, query)`` lists a window's keys in order, reading
  through the `Populate` context (a cursor when paging back); optionally
  ``async populate_many(windows)`` lists many sessions' windows in one
  statement (a burst of attaches reads them together);
* ``project(row, principal)`` turns one visible row into the principal's view.

Visibility is declared once (`Visibility`: ``cohorts(row)`` and
``memberships(principal)``) and one rule — a principal sees a row when they
share a cohort — gives all three enforcement points: the filter populate
applies (``cx.cohorts``), the render-time gate (`Projector.visible`, so a
row that leaves the principal's cohorts is Removed and one that enters is
Upserted), and the removal of rows when the principal's facts change.
`Unrestricted` is the explicit "no cohort gate here" (RLS-gated or public
projectors).

The common case is declared by its window alone: a projector with a
``WINDOW = TableWindow("note", cohort="org")`` and no ``VISIBILITY`` sees
a row when the row's ``org`` equals its principal's ``org``
(`CohortColumn`), groups its sessions by that value (`Projector.cohort`),
watches the noun ``"note"`` (the window's table) and reads through its row
type's ``Store`` (``Projector[Note, ...]``: ``Note.Store``); each of
``NOUN``, ``STORE`` and ``VISIBILITY`` declared explicitly wins
(`derive_declaration`).

The render-pass hooks have defaults: `Projector.cohort` (one cohort per
principal), `Projector.view_key` (none: every session projects its own
views), ``RESET_THRESHOLD`` (the engine's ``reset_threshold``),
`Projector.emission` (coalesced) and ``RLS`` (False).

This module holds no I/O: the runtime implements `Populate` and calls the
author's methods.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar, get_args, get_origin

from ..failures import AttachError, ConfigError, EngineError
from ..impacts.model import Impact, JsonValue
from .cohort import CohortKey, HasPrincipalId
from .deltas import KeyText
from .interest import Inverse, Route
from .table_window import TableWindow
from .windows import Emission, WindowSpec

if TYPE_CHECKING:
    from ..db.types import Conn
    from ..persistence.base import Persistence

__all__ = [
    "Coalesced",
    "CohortColumn",
    "Emission",
    "InvalidProjector",
    "MissingRlsApplier",
    "PerImpact",
    "Populate",
    "Projector",
    "RlsApplier",
    "RlsRegimeMismatch",
    "Unrestricted",
    "Visibility",
    "VisibilityMismatch",
    "check_projector",
    "check_window_matches_visibility",
    "check_window_spec",
    "cohort_of",
    "derive_declaration",
    "projector_types",
    "reset_threshold_for",
    "route_of",
]

RowT = TypeVar("RowT")
ViewT = TypeVar("ViewT")
PrincipalT = TypeVar("PrincipalT", bound=HasPrincipalId)
QueryT = TypeVar("QueryT")
R = TypeVar("R")
P = TypeVar("P")
P_co = TypeVar("P_co", covariant=True)
P_contra = TypeVar("P_contra", contravariant=True)

PerImpact = Emission.PER_IMPACT
"""One delta per caused impact, with its cause."""
Coalesced = Emission.COALESCED
"""One delta per changed key per frame (the default)."""


# -- visibility ---------------------------------------------------------------


class Visibility(ABC, Generic[R, P]):
    """Who may see which rows, declared once as cohorts.

    Implement `cohorts` (the cohorts a row belongs to) and `memberships`
    (the cohorts a principal belongs to); a principal sees a row exactly
    when the two share a cohort. Cohort values are any hashable values
    (``("org", 7)``, ``"team:3"``). Do not override `visible`: the one rule
    is what keeps the populate filter, the render gate and the removal on a
    facts change in agreement.
    """

    @abstractmethod
    def cohorts(self, row: R) -> Iterable[Hashable]:
        """The cohorts ``row`` belongs to."""

    @abstractmethod
    def memberships(self, principal: P) -> Iterable[Hashable]:
        """The cohorts ``principal`` belongs to."""

    def window(self, principal: P) -> frozenset[Hashable] | None:
        """The filter populate applies (``cx.cohorts``): a row belongs to a
        window when one of its cohorts is in this set. ``None``: no filter."""
        return frozenset(self.memberships(principal))

    def visible(self, row: R, principal: P) -> bool:
        """The cohort-intersection rule."""
        return not frozenset(self.memberships(principal)).isdisjoint(self.cohorts(row))

    def gate(self, principal: P) -> Callable[[R], bool]:
        """`visible` for one principal, its memberships computed once: the
        render pass builds it once per principal resolution and calls it per row."""
        memberships = frozenset(self.memberships(principal))
        cohorts = self.cohorts
        return lambda row: not memberships.isdisjoint(cohorts(row))


class Unrestricted(Visibility[Any, Any]):
    """No cohort gate: every row is visible to every principal.

    Declare it explicitly for a projector gated by Postgres RLS or open to
    every viewer; there is no permissive default.
    """

    def cohorts(self, row: Any) -> Iterable[Hashable]:
        return ()

    def memberships(self, principal: Any) -> Iterable[Hashable]:
        return ()

    def window(self, principal: Any) -> frozenset[Hashable] | None:
        return None

    def visible(self, row: Any, principal: Any) -> bool:
        return True

    def gate(self, principal: Any) -> Callable[[Any], bool]:
        return _always


def _always(row: object) -> bool:
    return True


class CohortColumn(Visibility[Any, Any]):
    """A principal sees a row when the row's attribute ``column`` equals
    the principal's attribute of the same name (``"org"``: the row's org is
    the caller's); with ``kind``, the cohorts are ``(kind, value)`` pairs,
    as a `TableWindow` with that ``kind`` filters them. What a projector
    with a cohort `TableWindow` and no ``VISIBILITY`` declares."""

    __slots__ = ("column", "kind")

    def __init__(self, column: str, kind: str | None = None) -> None:
        self.column = column
        self.kind = kind

    def _cohort(self, value: Any) -> Hashable:
        return value if self.kind is None else (self.kind, value)

    def cohorts(self, row: Any) -> Iterable[Hashable]:
        return (self._cohort(getattr(row, self.column)),)

    def memberships(self, principal: Any) -> Iterable[Hashable]:
        return (self._cohort(getattr(principal, self.column)),)

    def gate(self, principal: Any) -> Callable[[Any], bool]:
        wanted = getattr(principal, self.column)
        column = self.column
        return lambda row: getattr(row, column) == wanted

    def __repr__(self) -> str:
        return f"CohortColumn({self.column!r}, {self.kind!r})"


# -- what the runtime hands the author ---------------------------------------------


class Populate(Protocol[P_co]):
    """The context ``populate`` reads through; the runtime implements it.

    ``conn`` is a connection inside a read transaction (with the RLS
    context applied when the projector declares ``RLS``); it takes no row
    lock. ``cursor`` is ``None`` for the live head and the client's cursor
    when paging back. ``cohorts`` is ``VISIBILITY.window(principal)``: filter
    with it so the window is scoped at populate time (``None``: no filter).
    """

    @property
    def principal(self) -> P_co: ...

    @property
    def cursor(self) -> JsonValue: ...

    @property
    def cohorts(self) -> frozenset[Hashable] | None: ...

    @property
    def conn(self) -> Conn: ...

    def cohort_values(self, kind: str | None = None) -> list[Any]:
        """The values to filter a cohort column by: with ``kind``, the
        ``value`` of each ``(kind, value)`` cohort of ``cohorts``; without,
        each plain cohort (`service_engine.render.table_window.cohort_values`)."""
        ...


class RlsApplier(Protocol[P_contra]):
    """Sets the Postgres RLS context of a transaction for a principal
    (typically ``SET LOCAL app.current_org_id``); required to attach to an
    ``RLS`` projector. The runtime calls it on every read of that projector:
    populate, snapshot, render pass, repair and fetch."""

    async def apply(self, conn: Conn, principal: P_contra) -> None: ...


# -- the projector --------------------------------------------------------------


class Projector(ABC, Generic[RowT, ViewT, PrincipalT, QueryT]):
    """A live view over one noun, personalised per principal.

    Declare ``NAME`` (unique per engine), ``NOUN`` (the impacts' noun; its
    keys are the window's keys), ``STORE`` (the `Persistence` store whose
    ``read_many`` loads the rows and whose ``key_of`` keys them) and ``VISIBILITY`` (a `Visibility`
    instance, or `Unrestricted`). Optional: ``RESET_THRESHOLD`` (send a
    Reset instead of more than this many deltas in one frame; ``None`` uses
    the engine's ``reset_threshold``) and ``RLS`` (rows are read under the
    principal's RLS context; every read then groups per principal).

    With a ``WINDOW``, ``NOUN``, ``STORE`` and ``VISIBILITY`` may be left
    out: they derive from the window and the row type (see the module
    docstring and `derive_declaration`).

    Register the class (or an instance) with the engine. Methods must not
    keep per-session state: one instance serves every session.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        derive_declaration(cls)

    NAME: ClassVar[str]
    NOUN: ClassVar[str]
    STORE: ClassVar[Persistence[Any, Any]]
    VISIBILITY: ClassVar[Visibility[Any, Any]]
    RESET_THRESHOLD: ClassVar[int | None] = None
    RLS: ClassVar[bool] = False
    WINDOW: ClassVar[TableWindow | None] = None
    """The window as data (`TableWindow`: a table, its cohort column, an
    order): the default `populate` reads it. None: implement `populate`."""
    JOINS: ClassVar[Mapping[str, Inverse]] = {}
    """The escape hatch for a view that joins other nouns: each joined noun
    maps to an inverse from its changed key to this projector's keys it
    affects (``None`` from the inverse: every key). The store's ``read_many``
    does the join; the engine re-renders the mapped keys."""

    async def populate(self, cx: Populate[PrincipalT], query: QueryT) -> Sequence[JsonValue]:
        """List the window's keys for ``query``, in window order.

        Filter by ``cx.cohorts`` (``cx.cohort_values(kind)``) and honour
        ``cx.cursor`` (keys after it, one page's worth). Return keys, not
        rows: the engine loads rows through the store. The default reads
        ``WINDOW`` (a ``limit`` attribute of ``query`` asks for a smaller page).
        """
        window = type(self).WINDOW
        if window is None:
            raise NotImplementedError(f"{type(self).__qualname__} declares no WINDOW")
        return await window.keys(cx, getattr(query, "limit", None))

    async def populate_many(
        self, windows: Sequence[tuple[Populate[PrincipalT], QueryT]]
    ) -> Sequence[Sequence[JsonValue]]:
        """List several sessions' windows at once: for each ``(cx, query)``
        of ``windows``, in the same order, the keys `populate` lists for it.

        The engine calls it when sessions of this projector attach or are
        re-snapshotted together (a reconnect burst): every ``cx`` reads
        through the same ``cx.conn``, inside one read transaction. The
        default lists a declared ``WINDOW``'s windows in one statement, and
        otherwise calls `populate` for each in turn (one statement each).
        Override it when your `populate` can read many windows in one query;
        the result must be what `populate` would list for each.
        """
        window = type(self).WINDOW
        if window is not None and type(self).populate is Projector.populate:
            return await window.keys_many(
                [cx for cx, _ in windows], [getattr(query, "limit", None) for _, query in windows]
            )
        return [await self.populate(cx, query) for cx, query in windows]

    @abstractmethod
    def project(self, row: RowT, principal: PrincipalT) -> ViewT:
        """The view of one visible ``row`` for ``principal``. Pure: no I/O."""

    def visible(self, row: RowT, principal: PrincipalT) -> bool:
        """Whether ``principal`` may see ``row``; defaults to ``VISIBILITY``.

        Override only to narrow it further; a row it refuses is Removed from
        (or never enters) the principal's window.
        """
        return self.VISIBILITY.visible(row, principal)

    def render_gate(self, principal: PrincipalT) -> Callable[[RowT], bool]:
        """`visible` bound to one principal. The runtime calls this once per
        principal resolution and the result once per row."""
        if type(self).visible is Projector.visible:
            return self.VISIBILITY.gate(principal)
        visible = self.visible
        return lambda row: visible(row, principal)

    def cohort(self, principal: PrincipalT) -> CohortKey:
        """The sessions a frame loads together; default: one per principal.

        Override with `CohortKey.of_parts` when every principal with equal
        parts sees exactly the same rows (say, ``("org", principal.org_id)``
        under an org-cohort `Visibility`). It must be a pure function of the
        principal; the debug check of the render pass enforces it. An
        ``RLS`` projector may not override it. Under a `CohortColumn`
        visibility (and `visible` not narrowed) the default is already the
        column's value: every principal of one org loads together.
        """
        visibility = getattr(type(self), "VISIBILITY", None)
        if isinstance(visibility, CohortColumn) and type(self).visible is Projector.visible:
            return CohortKey.of_parts(visibility.column, getattr(principal, visibility.column))
        return CohortKey.of_principal(principal.id)

    def view_key(self, principal: PrincipalT) -> Hashable | None:
        """What of the principal `project` reads, when that is less than all
        of it; default ``None``: every session projects its own views.

        Return a hashable value such that two principals with equal view keys
        get equal views of *every* row (say, ``(principal.org,
        principal.roles)`` for a view whose affordances read nothing else).
        A render pass, a snapshot batch and a page then project a row once
        per view key and the sessions hold the one view object, so a cohort
        of a thousand subscribers costs one projection, not a thousand. The
        key only shares the projection: which rows a session sees is still
        its own principal's (`visible`). Like `cohort`, it must be a pure
        function of the principal; in debug the pass re-projects one sharing
        session's view and, on a difference, logs it and stops sharing that
        projector's views (every session then projects its own).
        """
        return None

    def emission(self, impact: Impact) -> Emission:
        """How a caused impact of this projector's noun is delivered:
        `Coalesced` (default) or `PerImpact`. Only caused impacts are asked;
        a causeless one is always folded coalesced."""
        return Emission.COALESCED


# -- checks and derivations the runtime uses ------------------------------------------


class InvalidProjector(ConfigError):
    """A projector's declaration is incomplete or contradictory."""


class RlsRegimeMismatch(AttachError):
    """A window's ``rls`` assertion contradicts the projector's ``RLS``."""


class MissingRlsApplier(AttachError):
    """An attach to an ``RLS`` projector without an `RlsApplier`."""


class VisibilityMismatch(EngineError):
    """A window holds a row its principal may not see, or lacks one they may."""


def projector_types(cls: type) -> tuple[Any, Any, Any, Any] | None:
    """The ``(row, view, principal, query)`` types a projector class names
    in its ``Projector[...]`` base (its own or an ancestor's), or None when
    it names none (a TypeVar is answered as is)."""
    for klass in cls.__mro__:
        for base in klass.__dict__.get("__orig_bases__", ()):
            if get_origin(base) is Projector:
                row, view, principal, query = get_args(base)
                return row, view, principal, query
    return None


def derive_declaration(cls: type[Projector[Any, Any, Any, Any]]) -> None:
    """Fill what a projector class leaves out and its ``WINDOW`` and row
    type say: ``NOUN`` (the window's table), ``STORE`` (the row type's
    ``Store``) and ``VISIBILITY`` (`CohortColumn` of the window's cohort
    column; a window without one derives none). Idempotent; run when the
    class is made and again at registration (a ``Store`` assigned after
    the class is found then)."""
    window = getattr(cls, "WINDOW", None)
    if not isinstance(window, TableWindow):
        window = None
    if window is not None and getattr(cls, "NOUN", None) is None:
        cls.NOUN = window.table
    if window is not None and window.cohort and getattr(cls, "VISIBILITY", None) is None:
        cls.VISIBILITY = CohortColumn(window.cohort, window.kind)
    if getattr(cls, "STORE", None) is None:
        types = projector_types(cls)
        store = getattr(types[0], "Store", None) if types is not None else None
        if store is not None:
            cls.STORE = store


def check_projector(projector: Projector[Any, Any, Any, Any]) -> None:
    """Refuse an incomplete or contradictory declaration at registration
    with `InvalidProjector` naming every problem."""
    cls = type(projector)
    derive_declaration(cls)
    problems: list[str] = []
    for attr in ("NAME", "NOUN"):
        value = getattr(cls, attr, None)
        if not isinstance(value, str) or not value:
            problems.append(f"{attr} must be a non-empty str")
    store = getattr(cls, "STORE", None)
    if not all(callable(getattr(store, name, None)) for name in ("read_many", "key_of")):
        problems.append("STORE must be a Persistence store (read_many, key_of)")
    visibility = getattr(cls, "VISIBILITY", None)
    if not isinstance(visibility, Visibility):
        problems.append("VISIBILITY must be a Visibility instance (Unrestricted() for none), "
                        "or WINDOW a TableWindow with a cohort column")
    elif isinstance(visibility, CohortColumn):
        principal = (projector_types(cls) or (None,) * 4)[2]
        if isinstance(principal, type) and not _declares(principal, visibility.column):
            problems.append(f"the cohort column {visibility.column!r} is no attribute of the "
                            f"principal type {principal.__qualname__}")
    threshold = getattr(cls, "RESET_THRESHOLD", None)
    if threshold is not None and (type(threshold) is not int or threshold < 1):
        problems.append("RESET_THRESHOLD must be None or a positive int")
    joins = getattr(cls, "JOINS", {})
    if not isinstance(joins, Mapping) or not all(
        isinstance(noun, str) and noun and callable(inverse) for noun, inverse in joins.items()
    ):
        problems.append("JOINS must map joined nouns to inverse callables")
    elif getattr(cls, "NOUN", None) in joins:
        problems.append("JOINS must not name the projector's own NOUN")
    window = getattr(cls, "WINDOW", None)
    if window is not None and not isinstance(window, TableWindow):
        problems.append("WINDOW must be a TableWindow (or None)")
    elif window is None and cls.populate is Projector.populate:
        problems.append("declare WINDOW = TableWindow(...) or implement populate")
    if type(getattr(cls, "RLS", None)) is not bool:
        problems.append("RLS must be a bool")
    elif cls.RLS and cls.cohort is not Projector.cohort:
        problems.append("an RLS projector renders per principal: it may not override cohort()")
    if problems:
        raise InvalidProjector(f"projector {cls.__qualname__}: " + "; ".join(problems))


def _declares(cls: type, name: str) -> bool:
    return hasattr(cls, name) or any(
        name in getattr(klass, "__annotations__", {}) for klass in cls.__mro__
    )


def route_of(projector: Projector[Any, Any, Any, Any]) -> Route:
    """The `Route` Interest needs: ``{NOUN: identity}``, and the emission
    hook only when overridden (so a coalesced projector costs no call)."""
    cls = type(projector)
    emission = projector.emission if cls.emission is not Projector.emission else None
    nouns: dict[str, Inverse | None] = {noun: inverse for noun, inverse in cls.JOINS.items()}
    nouns[cls.NOUN] = None
    return Route(cls.NAME, nouns, emission)


def cohort_of(projector: Projector[Any, Any, PrincipalT, Any], principal: PrincipalT) -> CohortKey:
    """The cohort a session of ``principal`` is grouped under: the exact
    principal for an ``RLS`` projector (two principals never share an RLS
    render), otherwise the projector's `Projector.cohort`."""
    if projector.RLS:
        return CohortKey.of_principal(principal.id)
    return projector.cohort(principal)


def reset_threshold_for(projector: Projector[Any, Any, Any, Any], default: int) -> int:
    """``RESET_THRESHOLD`` when declared, else the engine's ``reset_threshold``."""
    threshold = projector.RESET_THRESHOLD
    return default if threshold is None else threshold


def check_window_spec(
    projector: Projector[Any, Any, Any, Any],
    spec: WindowSpec[Any],
    applier: RlsApplier[Any] | None,
) -> None:
    """Validate an attach: the window's ``rls`` assertion must match the
    projector's ``RLS`` (`RlsRegimeMismatch`), and an RLS projector needs
    an applier (`MissingRlsApplier`)."""
    if spec.rls != projector.RLS:
        declared = "renders under RLS" if projector.RLS else "does not render under RLS"
        raise RlsRegimeMismatch(
            f"projector {projector.NAME!r} {declared}; the window asserted rls={spec.rls}"
        )
    if projector.RLS and applier is None:
        raise MissingRlsApplier(f"projector {projector.NAME!r} renders under RLS: no applier")


def check_window_matches_visibility(
    projector: Projector[RowT, Any, PrincipalT, Any],
    principal: PrincipalT,
    candidates: Mapping[KeyText, RowT],
    window: Iterable[KeyText],
) -> None:
    """Raise `VisibilityMismatch` unless ``window`` holds exactly the
    ``candidates`` (key text -> committed row, the rows the window's
    population covers) that ``principal`` may see."""
    held = set(window)
    expected = {key for key, row in candidates.items() if projector.visible(row, principal)}
    extra = sorted(held - expected)
    missing = sorted(expected - held)
    if extra or missing:
        raise VisibilityMismatch(
            f"projector {projector.NAME!r}: window holds invisible or unknown {extra}, "
            f"lacks visible {missing}"
        )
