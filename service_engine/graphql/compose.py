"""Compose a service's GraphQL schema from its slices, naming each slice once.

Each slice declares what it adds as one `SliceFragment`: its projectors and
mutation handlers (fields derived, `service_engine.graphql.declared`), its
own root objects and types, and what it registers with the engine::

    # slices/__init__.py: the one place a slice is named
    SERVICE = compose_service([board.SLICE, invite.SLICE])
    SERVICE.register(engine)
    schema = SERVICE.schema()

Assembly fails loud (`DuplicateSchemaMember`, `UndeclaredSchemaMember`).
Deleting a slice is deleting its folder and its line in the list.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias, cast, get_args, get_origin

import graphql
import strawberry
from strawberry.schema.config import StrawberryConfig
from strawberry.schema.name_converter import NameConverter
from strawberry.tools import merge_types
from strawberry.types.base import has_object_definition
from strawberry.types.enum import has_enum_definition
from strawberry.types.scalar import ScalarDefinition, ScalarWrapper
from strawberry.types.union import StrawberryUnion

from ..failures import EngineError
from .declared import derive_fields
from .reads import camel_case
from .results import Refusal
from .subscriptions import DeltaCause, LanesPaused, LanesResumed

if TYPE_CHECKING:
    from ..engine import Engine

__all__ = [
    "ENGINE_OWNER", "PLACEHOLDER_QUERY_FIELD", "RESERVED_TYPE_NAMES", "ComposedService",
    "DuplicateSchemaMember", "RegisterFn", "RootKind", "SliceFragment", "UndeclaredSchemaMember",
    "compose_service",
]

RootKind: TypeAlias = Literal["query", "mutation", "subscription"]
ROOT_KINDS: tuple[RootKind, ...] = ("query", "mutation", "subscription")
_ROOT_TYPE_NAMES: Mapping[RootKind, str] = {
    "query": "Query", "mutation": "Mutation", "subscription": "Subscription",
}

RegisterFn: TypeAlias = "Callable[[Engine], None]"
"""A slice's registration: registers its projectors, reactions, offers, ..."""

ENGINE_OWNER = "service_engine"
"""The owner named for the members the engine itself contributes."""

PLACEHOLDER_QUERY_FIELD = "engineVersion"
"""The engine's own Query field, present only when no slice declares a
query field (GraphQL requires Query to have one)."""

_SLICE_NAME = re.compile(r"[a-z][a-z0-9_]*")


class DuplicateSchemaMember(EngineError):
    """Two slices claim one schema member: ``kind`` is ``"query field"`` /
    ... (one GraphQL name), ``"query attribute"`` / ... (one Python name on
    two merged roots), ``"type"`` or ``"slice"``; ``owners`` the two
    claimants (``service_engine`` for what the engine reserves). Rename one.
    """

    def __init__(self, kind: str, member: str, owners: tuple[str, str]) -> None:
        super().__init__(
            f"duplicate schema member: {kind} {member!r} is claimed by "
            f"{owners[0]!r} and {owners[1]!r}"
        )
        self.kind = kind
        self.member = member
        self.owners = owners


class UndeclaredSchemaMember(EngineError):
    """The composed schema has a root field no slice declared (a root type
    built by hand, an extension adding fields): declare it in a slice's
    `SliceFragment` instead."""

    def __init__(self, kind: RootKind, fields: Sequence[str]) -> None:
        names = ", ".join(repr(f) for f in fields)
        super().__init__(
            f"undeclared schema member: {_ROOT_TYPE_NAMES[kind]} has field(s) {names} "
            "that no slice declares"
        )
        self.root = kind
        self.fields = tuple(fields)


@dataclass(frozen=True, eq=False)
class SliceFragment:
    """What one slice adds to the service's schema, declared once::

        SLICE = SliceFragment("notes", projectors=[NotesView()],
                              mutations=[create_note, edit_note])

    ``name`` identifies the slice (``[a-z][a-z0-9_]*``). ``query`` /
    ``mutation`` / ``subscription`` are Strawberry types whose fields become
    root fields of the service. ``types`` are the GraphQL types the slice
    owns (including ``subscription_union(...).types``), so two slices
    defining one name are caught at assembly; kernel-shared types are
    declared by nobody.

    ``projectors`` (instances, or classes taking no argument) each get a
    query field and a live subscription field named by their ``NAME`` when
    their window takes no query or a dataclass query; ``mutations`` are
    handlers (``async def create_note(cx, body: str) -> strawberry.ID``),
    each a mutation field named after it (`service_engine.graphql.declared`).
    A field of the slice's own root of the same name wins.

    `ComposedService.register` registers the projectors, ``mirrors``,
    ``offers``, ``reactions``, ``commands``, ``scopes`` and ``erasure``
    (under the slice's name) with the engine, which decides what each needs
    (without NATS a mirror's table stays as it is and an offer is left
    unpublished), then calls ``register`` for what takes the engine itself
    (a principal fact loader, a cron naming its service).
    """

    name: str
    query: type[Any] | None = None
    mutation: type[Any] | None = None
    subscription: type[Any] | None = None
    types: tuple[Any, ...] = ()
    register: RegisterFn | None = None
    projectors: Sequence[Any] = ()
    mutations: Sequence[Callable[..., Any]] = ()
    mirrors: Sequence[Any] = ()
    offers: Sequence[Any] = ()
    reactions: Sequence[Any] = ()
    commands: Sequence[Any] = ()
    scopes: Sequence[str] = ()
    erasure: Any = None
    views: tuple[Any, ...] = field(default=(), init=False, repr=False)
    """The `Views` of the derived live fields (kept for ``graphql_app``'s check)."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _SLICE_NAME.fullmatch(self.name):
            raise ValueError(f"a slice name is [a-z][a-z0-9_]*, got {self.name!r}")
        for kind in ROOT_KINDS:
            root = self.root(kind)
            if root is not None and not has_object_definition(root):
                raise TypeError(
                    f"slice {self.name!r}: {kind} root {root!r} is not a Strawberry type "
                    "(decorate it with @strawberry.type)"
                )
        projectors = tuple(p() if isinstance(p, type) else p for p in self.projectors)
        object.__setattr__(self, "projectors", projectors)
        for listed in ("mutations", "mirrors", "offers", "reactions", "commands", "scopes"):
            value = getattr(self, listed)
            if isinstance(value, str):
                raise TypeError(f"slice {self.name!r}: {listed} is a list, got {value!r}")
            object.__setattr__(self, listed, tuple(value))
        if projectors or self.mutations:
            self._derive(projectors)
        object.__setattr__(self, "types", tuple(self.types))
        for declared in self.types:
            graphql_type_name(declared)  # refuses what is not a GraphQL type

    def _derive(self, projectors: tuple[Any, ...]) -> None:
        """Join the fields ``projectors`` and ``mutations`` derive to the
        slice's own roots (a field of its own wins), and their types."""
        own: dict[str, set[str]] = {
            kind: {f.python_name for f in root.__strawberry_definition__.fields}
            for kind in ROOT_KINDS if (root := self.root(kind)) is not None
        }
        derived = derive_fields(self.name, projectors, self.mutations, declared=own)
        for kind in ROOT_KINDS:
            mine, more = self.root(kind), getattr(derived, kind)
            if more is not None:
                merged = more if mine is None else merge_types(
                    f"{camel_case(self.name)}{_ROOT_TYPE_NAMES[kind]}", (mine, more))
                object.__setattr__(self, kind, merged)
        types = (*self.types, *(t for t in derived.types if t not in self.types))
        object.__setattr__(self, "types", types)
        object.__setattr__(self, "views", derived.views)

    def root(self, kind: RootKind) -> type[Any] | None:
        root: type[Any] | None = getattr(self, kind)
        return root

    def root_fields(self, kind: RootKind, converter: NameConverter | None = None
                    ) -> tuple[str, ...]:
        """The GraphQL names of the fields this slice adds to the ``kind`` root."""
        root = self.root(kind)
        if root is None:
            return ()
        convert = converter or NameConverter()
        return tuple(
            convert.get_graphql_name(f) for f in root.__strawberry_definition__.fields
        )

    def type_names(self) -> tuple[str, ...]:
        """The GraphQL names of the types this slice declares it owns."""
        return tuple(graphql_type_name(t) for t in self.types)


def graphql_type_name(declared: Any) -> str:
    """The GraphQL name of a Strawberry type, enum, scalar or named union."""
    if has_object_definition(declared) or has_enum_definition(declared):
        name: str = declared.__strawberry_definition__.name
        return name
    if isinstance(declared, ScalarWrapper):
        # (Typed for Strawberry types and classes; it names a scalar wrapper too.)
        return NameConverter().get_name_from_type(cast(Any, declared))
    if isinstance(declared, ScalarDefinition):
        return declared.name
    if isinstance(declared, StrawberryUnion) and declared.graphql_name:
        return declared.graphql_name
    if get_origin(declared) is Annotated:
        for meta in get_args(declared)[1:]:
            if isinstance(meta, StrawberryUnion) and meta.graphql_name:
                return meta.graphql_name
    raise TypeError(f"{declared!r} is not a named GraphQL type Strawberry knows")


RESERVED_TYPE_NAMES = frozenset(
    graphql_type_name(t) for t in (DeltaCause, LanesPaused, LanesResumed, Refusal)
)
"""GraphQL type names the kit owns (``DeltaCause``, ``LanesPaused``,
``LanesResumed``, ``Refusal``); a slice may not declare them."""


@dataclass(frozen=True, eq=False)
class ComposedService:
    """The service's schema roots and registration, merged from its slices
    by `compose_service`: ``query`` / ``mutation`` / ``subscription`` are the
    merged root types (``None`` when no slice adds to that root)."""

    slices: tuple[SliceFragment, ...]
    query: type[Any]
    mutation: type[Any] | None
    subscription: type[Any] | None
    owners: Mapping[str, str] = field(repr=False)
    """Every declared member (``"query field engineVersion"``, ``"type Board"``)
    -> the slice that declared it."""

    @property
    def slice_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.slices)

    def register(self, engine: Engine) -> None:
        """Register what each slice declares with ``engine``, slice by slice
        in listing order: its projectors, mirrors, offers, reactions,
        commands, scopes and erasure, then its ``register``."""
        for fragment in self.slices:
            for projector in fragment.projectors:
                engine.register_projector(projector)
            for mirror in fragment.mirrors:
                engine.register_mirror(mirror)
            for offer in fragment.offers:
                engine.register_offer(offer)
            for reaction in fragment.reactions:
                engine.register_reaction(reaction)
            if fragment.commands:
                engine.register_commands(*fragment.commands)
            if fragment.scopes:
                engine.contribute_scopes(list(fragment.scopes))
            if fragment.erasure is not None:
                engine.register_erasable(fragment.name, fragment.erasure)
            if fragment.register is not None:
                fragment.register(engine)

    def schema_types(self) -> tuple[Any, ...]:
        """The declared types a schema must list explicitly (objects and enums;
        unions and scalars are reached through fields)."""
        return tuple(
            t for s in self.slices for t in s.types
            if has_object_definition(t) or has_enum_definition(t)
        )

    def schema(self, **options: Any) -> strawberry.Schema:
        """Build the service's Strawberry schema and `verify` it; ``options``
        (``extensions``, ``config``, more ``types``) go to `strawberry.Schema`."""
        extra_types = tuple(options.pop("types", ()))
        schema = strawberry.Schema(
            query=self.query,
            mutation=self.mutation,
            subscription=self.subscription,
            types=(*self.schema_types(), *extra_types),
            **options,
        )
        self.verify(schema)
        return schema

    def verify(self, schema: strawberry.Schema) -> None:
        """Raise `UndeclaredSchemaMember` unless every root field of
        ``schema`` was declared by a slice (or is the engine's own)."""
        config: StrawberryConfig = schema.config
        self.verify_sdl(schema.as_str(), converter=config.name_converter)

    def verify_sdl(self, sdl: str, *, converter: NameConverter | None = None) -> None:
        """`verify` over the schema's SDL text (``converter`` names the fields
        the way the schema did; the default camel-cases them)."""
        built = graphql.build_schema(sdl)
        roots: Mapping[RootKind, graphql.GraphQLObjectType | None] = {
            "query": built.query_type,
            "mutation": built.mutation_type,
            "subscription": built.subscription_type,
        }
        for kind in ROOT_KINDS:
            root = roots[kind]
            if root is None:
                continue
            declared = set(self.declared_fields(kind, converter))
            undeclared = sorted(name for name in root.fields if name not in declared)
            if undeclared:
                raise UndeclaredSchemaMember(kind, undeclared)

    def declared_fields(self, kind: RootKind, converter: NameConverter | None = None
                        ) -> tuple[str, ...]:
        """Every root field of ``kind`` a slice (or the engine) declared."""
        names = [name for s in self.slices for name in s.root_fields(kind, converter)]
        if kind == "query" and not names:
            names.append(PLACEHOLDER_QUERY_FIELD)
        return tuple(names)


def _engine_version() -> str:
    from ..engine import ENGINE_VERSION

    return ENGINE_VERSION


@strawberry.type(name="Query", description="The engine host with no slice query fields.")
class _PlaceholderQuery:
    engine_version: str = strawberry.field(
        resolver=_engine_version, name=PLACEHOLDER_QUERY_FIELD, description="The engine's version."
    )


def compose_service(slices: Iterable[SliceFragment]) -> ComposedService:
    """Merge the slices' root objects into the service's roots. Raises
    `DuplicateSchemaMember` when two slices share a name, claim one root
    field, or declare one type (or one of `RESERVED_TYPE_NAMES`). With no
    slice query field the ``Query`` root holds only ``engineVersion``.
    """
    fragments = tuple(slices)
    owners: dict[str, str] = {f"type {name}": ENGINE_OWNER for name in RESERVED_TYPE_NAMES}

    def claim(kind: str, member: str, owner: str) -> None:
        key = f"{kind} {member}"
        if key in owners:
            raise DuplicateSchemaMember(kind, member, (owners[key], owner))
        owners[key] = owner

    for fragment in fragments:
        if not isinstance(fragment, SliceFragment):
            raise TypeError(f"compose_service takes SliceFragments, got {fragment!r}")
        claim("slice", fragment.name, fragment.name)
        for kind in ROOT_KINDS:
            root = fragment.root(kind)
            if root is None:
                continue
            for f in root.__strawberry_definition__.fields:
                # Both names: the GraphQL one is what clients see; the
                # Python one is what the merged class would silently shadow.
                claim(f"{kind} field", NameConverter().get_graphql_name(f), fragment.name)
                claim(f"{kind} attribute", f.python_name, fragment.name)
        for name in fragment.type_names():
            claim("type", name, fragment.name)

    merged: dict[RootKind, type[Any] | None] = {}
    for kind in ROOT_KINDS:
        roots = tuple(r for f in fragments if (r := f.root(kind)) is not None)
        merged[kind] = merge_types(_ROOT_TYPE_NAMES[kind], roots) if roots else None
    query = merged["query"] or _PlaceholderQuery
    if merged["query"] is None:
        owners[f"query field {PLACEHOLDER_QUERY_FIELD}"] = ENGINE_OWNER
    return ComposedService(
        slices=fragments,
        query=query,
        mutation=merged["mutation"],
        subscription=merged["subscription"],
        owners=MappingProxyType(owners),
    )
