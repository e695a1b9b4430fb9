"""The GraphQL fields a slice's data declares (what `SliceFragment` derives
from its ``projectors`` and ``mutations``).

A projector's ``NAME`` names a query field (the caller's views, in window
order) and a live subscription field over its generated union, both of
the view type its ``Projector[Row, View, Principal, Query]`` base names,
described by its class docstring. A ``None`` query gives fields without
arguments; a dataclass query's fields are the fields' arguments
(``PeopleQuery(limit: int = 100)``: ``people(limit: Int! = 100)``). A
projector reading under RLS, taking another query or rendering a view that
is not a Strawberry type is registered only: declare its fields with a
`Views`. A field the slice declares itself (same Python name, same root)
wins::

    notes: [NoteView!]!                    # the caller's views, now
    subscription { notes: NotesMessage! }  # Reset / Upsert / Remove, live

A handler (``async def create_note(cx, body: str) -> strawberry.ID``) is a
mutation field named after it (``createNote``), its arguments its
annotated parameters after ``cx``, its docstring the field's description.
It runs as the caller on the engine's executor and answers a
`MutationResult` (`MutationResult.of`) carrying its value: in ``id`` for a
``strawberry.ID`` (``IdResult``), in a field named after a Strawberry type
it returns (``NoteView``: ``noteView`` in ``NoteViewResult``), in ``value``
for another scalar (``StringResult``, ``IntResult``, ...); a handler
returning None answers the bare ``MutationResult``. The result types are
shared by every slice.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import types
import typing
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union, get_args, get_origin

import strawberry
from strawberry.types.base import has_object_definition

from ..failures import ConfigError
from ..render.projector import Projector, projector_types
from ..render.windows import Query, WindowSpec
from .reads import Views, camel_case
from .results import MutationResult

__all__ = ["Derived", "derive_fields", "mutation_field", "result_type"]

_SCALARS: dict[Any, str] = {str: "String", int: "Int", float: "Float", bool: "Boolean"}


@dataclass(frozen=True)
class Derived:
    """What a slice's data derives: its root objects (None where nothing is
    derived), the types it owns, and the `Views` it serves (kept, so
    ``graphql_app`` checks their projectors are registered)."""

    query: type[Any] | None
    mutation: type[Any] | None
    subscription: type[Any] | None
    types: tuple[Any, ...]
    views: tuple[Views[Any], ...]


def derive_fields(
    slice_name: str,
    projectors: Sequence[Projector[Any, Any, Any, Any]],
    mutations: Sequence[Callable[..., Any]],
    *,
    declared: Mapping[str, Collection[str]] | None = None,
) -> Derived:
    """The root objects, types and `Views` ``projectors`` and ``mutations``
    declare (see the module docstring). ``declared`` maps a root kind
    (``"query"``, ...) to the Python names of the fields the slice declares
    itself: a derived field of one of those names is left out (the slice's
    own wins)."""
    own = declared or {}
    queries: dict[str, Any] = {}
    lives: dict[str, Any] = {}
    owned: list[Any] = []
    views: list[Views[Any]] = []
    for projector in projectors:
        found = live_views(projector)
        if found is None:
            continue
        served, query_type = found
        name, description = type(projector).NAME, _doc(type(projector))
        arguments = _query_arguments(query_type)
        kept = False
        if name not in own.get("query", ()):
            queries[name] = _window_field(served, query_type, arguments, description)
            kept = True
        if name not in own.get("subscription", ()):
            lives[name] = served.field(description=description)(_window(query_type, arguments))
            kept = True
        if kept:  # both its own: the slice declares the types with its fields
            owned.extend((served.view_type, *served.types))
            views.append(served)
    changes = {
        handler.__name__: mutation_field(handler) for handler in mutations
        if handler.__name__ not in own.get("mutation", ())
    }
    camel = camel_case(slice_name)
    return Derived(
        query=_root(f"{camel}DerivedQuery", queries),
        mutation=_root(f"{camel}DerivedMutation", changes),
        subscription=_root(f"{camel}DerivedSubscription", lives),
        types=tuple(dict.fromkeys(owned)),
        views=tuple(views),
    )


def live_views(projector: Projector[Any, Any, Any, Any]) -> tuple[Views[Any], Any] | None:
    """The `Views` of a projector whose view type is a Strawberry type and
    whose window takes no query (``None``) or a dataclass (its fields the
    fields' arguments), reading without RLS, and that query type; None for
    any other (it is registered only)."""
    found = projector_types(type(projector))
    if found is None or projector.RLS:
        return None
    _, view_type, _, query_type = found
    if query_type is type(None):
        query_type = None
    takes = query_type is None or (
        isinstance(query_type, type) and dataclasses.is_dataclass(query_type))
    if not takes or not has_object_definition(view_type):
        return None
    return Views(type(projector).NAME, view_type), query_type


def _query_arguments(query_type: Any) -> list[inspect.Parameter]:
    """A dataclass query's init fields as keyword parameters (its
    annotations and defaults); none for no query."""
    if query_type is None:
        return []
    hints = typing.get_type_hints(query_type)
    parameters = []
    for f in dataclasses.fields(query_type):
        if not f.init:
            continue
        default: Any = inspect.Parameter.empty
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        parameters.append(inspect.Parameter(
            f.name, inspect.Parameter.KEYWORD_ONLY, annotation=hints[f.name], default=default))
    return parameters


_SELF = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
_INFO = inspect.Parameter("info", inspect.Parameter.KEYWORD_ONLY, annotation=strawberry.Info)

_F = typing.TypeVar("_F", bound=Callable[..., Any])


def _signed(function: _F, parameters: list[inspect.Parameter]) -> _F:
    """``function``, whose `inspect.signature` answers ``parameters`` (its
    ``__signature__``, PEP 362): how Strawberry reads a derived resolver's
    arguments, which exist only at run time."""
    vars(function)["__signature__"] = inspect.Signature(parameters)
    return function


def _query_of(query_type: Any, arguments: Mapping[str, Any]) -> Any:
    return None if query_type is None else query_type(**arguments)


def _window(query_type: Any, arguments: list[inspect.Parameter]) -> Callable[..., Any]:
    """A live field's function: its arguments to the window of their query."""

    def window(self: Any, **given: Any) -> WindowSpec[Any]:
        return WindowSpec(Query(_query_of(query_type, given)))

    return _signed(window, [_SELF, *arguments])


def _window_field(
    views: Views[Any], query_type: Any, arguments: list[inspect.Parameter],
    description: str | None,
) -> Any:
    async def read(self: Any, info: strawberry.Info, **given: Any) -> Any:
        return await views.window(info.context, _query_of(query_type, given))

    return strawberry.field(
        resolver=_signed(read, [_SELF, _INFO, *arguments]),
        graphql_type=types.GenericAlias(list, (views.view_type,)),
        description=description,
    )


def mutation_field(handler: Callable[..., Any]) -> Any:
    """The mutation field of ``handler`` (``async def name(cx, ...) ->
    value``): its arguments, its `result_type`, its description."""
    if not inspect.iscoroutinefunction(handler):
        raise ConfigError(f"a mutation handler is an async function, got {handler!r}")
    hints = typing.get_type_hints(handler)
    parameters = list(inspect.signature(handler).parameters.values())[1:]
    untyped = [p.name for p in parameters if p.name not in hints]
    if untyped or any(p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in parameters):
        raise ConfigError(
            f"mutation {handler.__qualname__}: annotate each argument after cx "
            f"(no *args or **kwargs){'; unannotated: ' + ', '.join(untyped) if untyped else ''}"
        )
    result, into = result_type(hints.get("return"), handler.__qualname__)

    async def resolve(self: Any, info: strawberry.Info, **arguments: Any) -> Any:
        return result.of(await info.context.execute(handler, **arguments), into)

    _signed(resolve, [_SELF, _INFO, *(
        p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=hints[p.name])
        for p in parameters)])
    resolve.__name__ = resolve.__qualname__ = handler.__name__
    return strawberry.mutation(
        resolver=resolve, graphql_type=result, description=inspect.getdoc(handler)
    )


_RESULTS: dict[Any, tuple[type[MutationResult], str | None]] = {}


def result_type(
    returned: Any, owner: str = "a mutation"
) -> tuple[type[MutationResult], str | None]:
    """The kit's result type for a handler returning ``returned``, and the
    field its value lands in (see the module docstring); one type per
    returned type, shared by every slice."""
    if returned in (None, type(None)):
        return MutationResult, None
    if get_origin(returned) in (Union, types.UnionType):
        members = [t for t in get_args(returned) if t is not type(None)]
        returned = members[0] if len(members) == 1 else returned
    known = _RESULTS.get(returned)
    if known is not None:
        return known
    if returned is strawberry.ID:
        name, into = "Id", "id"
    elif returned in _SCALARS:
        name, into = _SCALARS[returned], "value"
    elif has_object_definition(returned):
        name = returned.__strawberry_definition__.name
        into = re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()
    else:
        raise ConfigError(
            f"{owner} returns {returned!r}: a derived mutation answers an ID, a scalar or a "
            "Strawberry type; declare its field by hand with a MutationResult subclass"
        )
    namespace = {
        "__annotations__": {into: returned | None},
        into: None,
        "__module__": __name__,
        "__qualname__": f"{name}Result",
    }
    built = strawberry.type(
        type(f"{name}Result", (MutationResult,), namespace),
        description=f"The outcome of a mutation answering {'an' if name == 'Id' else 'a'} "
                    f"{name}: it is in {into!r} once committed.",
    )
    _RESULTS[returned] = (built, into)
    return built, into


def _root(name: str, fields: dict[str, Any]) -> type[Any] | None:
    if not fields:
        return None
    namespace = {**fields, "__module__": __name__, "__qualname__": name}
    root: type[Any] = strawberry.type(type(name, (), namespace))
    return root


def _doc(cls: type) -> str | None:
    own = cls.__dict__.get("__doc__")
    return inspect.cleandoc(own) if own else None
