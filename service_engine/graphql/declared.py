"""The GraphQL fields a slice's data declares: a live view per projector, a
mutation per handler (what `SliceFragment` derives from its ``projectors``
and ``mutations``).

A projector listed by a slice is declared once: its ``NAME`` names a query
field (the caller's views, in window order) and a live subscription field
over its generated union (`service_engine.graphql.Views`), both of the view
type its ``Projector[Row, View, Principal, Query]`` base names; its class
docstring describes them. Only a projector whose window takes no query
(``Query`` is ``None``) and whose view is a Strawberry type gets fields
(one reading under RLS, or taking a query, is registered only: declare its
fields with a `Views`)::

    notes: [NoteView!]!                 # the caller's views, now
    subscription { notes: NotesMessage! }  # Reset / Upsert / Remove, live

A handler listed by a slice (``async def create_note(cx, body: str) ->
strawberry.ID``) is a mutation field named after it (``createNote``), its
GraphQL arguments its parameters after ``cx`` (by their annotations), its
docstring the field's description. It runs as the caller on the engine's
executor (`GraphQLContext.execute`) and answers a `MutationResult`
(`MutationResult.of`: a refusal's code, action and retryability as the
executor answered them) carrying the handler's value: in ``id`` when it
returns a ``strawberry.ID`` (``IdResult``), in a field named after a
Strawberry type it returns (``NoteView``: ``noteView``, in
``NoteViewResult``), in ``value`` for another scalar (``StringResult``,
``IntResult``, ``FloatResult``, ``BooleanResult``); a handler returning
None answers the bare ``MutationResult``. The result types are the kit's,
shared by every slice.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Union, get_args, get_origin

import strawberry
from strawberry.types.base import has_object_definition

from ..failures import ConfigError
from ..render.projector import Projector, projector_types
from ..render.windows import Query, WindowSpec
from .reads import Views
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
) -> Derived:
    """The root objects, types and `Views` ``projectors`` and ``mutations``
    declare (see the module docstring)."""
    queries: dict[str, Any] = {}
    lives: dict[str, Any] = {}
    owned: list[Any] = []
    views: list[Views[Any]] = []
    for projector in projectors:
        declared = live_views(projector)
        if declared is None:
            continue
        name, description = type(projector).NAME, _doc(type(projector))
        queries[name] = _window_field(declared, description)
        lives[name] = declared.field(description=description)(_default_window)
        owned.extend((declared.view_type, *declared.types))
        views.append(declared)
    changes = {handler.__name__: mutation_field(handler) for handler in mutations}
    camel = _camel(slice_name)
    return Derived(
        query=_root(f"{camel}DerivedQuery", queries),
        mutation=_root(f"{camel}DerivedMutation", changes),
        subscription=_root(f"{camel}DerivedSubscription", lives),
        types=tuple(dict.fromkeys(owned)),
        views=tuple(views),
    )


def live_views(projector: Projector[Any, Any, Any, Any]) -> Views[Any] | None:
    """The `Views` of a projector whose window takes no query and whose
    view type is a Strawberry type (and that reads without RLS); None
    for any other (it is registered only)."""
    found = projector_types(type(projector))
    if found is None or projector.RLS:
        return None
    _, view_type, _, query_type = found
    if query_type not in (None, type(None)) or not has_object_definition(view_type):
        return None
    return Views(type(projector).NAME, view_type)


def _default_window(self: Any) -> WindowSpec[None]:
    return WindowSpec(Query(None))


def _window_field(views: Views[Any], description: str | None) -> Any:
    async def read(self: Any, info: strawberry.Info) -> Any:
        return await views.window(info.context, None)

    return strawberry.field(
        resolver=read, graphql_type=list[views.view_type],  # type: ignore[name-defined]
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

    resolve.__signature__ = inspect.Signature([  # type: ignore[attr-defined]
        inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        inspect.Parameter("info", inspect.Parameter.KEYWORD_ONLY, annotation=strawberry.Info),
        *(p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=hints[p.name])
          for p in parameters),
    ])
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


def _camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))
