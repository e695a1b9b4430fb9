"""The payload plan of a live subscription: its selection, compiled once.

A subscription document's selection over a live union is the same for
every event: `plan_operation` compiles it (once per document, operation and
variables) into a `Plan` that turns one union member (a Reset, Upsert,
Remove or lane notice) into the exact ``data`` graphql-core's execution
would produce: the same response keys in the same order (aliases,
``__typename``, inline fragments, named fragments, ``@skip`` / ``@include``
evaluated against the operation's variables), leaves serialised by their
own GraphQL scalar or enum. It is pure: no I/O, no event loop.

What the plan cannot express makes `plan_operation` answer None, and the
operation runs through ordinary execution: a root selection other than one
field, an unknown directive, a field with arguments below the root, a field
with a resolver, permission classes or extensions, an abstract type below
the root, a schema extension with a ``resolve`` hook. A value the plan meets
at render time that ordinary execution would answer with an error (a null
in a non-null position, a value of another type, a leaf its scalar refuses)
raises `NotPlanned`, and that one event runs through ordinary execution.

`Plan.encode` serialises a member once: the text of ``data`` cut at the
member's ``revision``, so a cohort's sessions share one serialisation and
each frame differs only in its own revision (and operation id).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from graphql import (
    FieldNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    GraphQLEnumType,
    GraphQLIncludeDirective,
    GraphQLList,
    GraphQLNonNull,
    GraphQLObjectType,
    GraphQLOutputType,
    GraphQLScalarType,
    GraphQLSchema,
    GraphQLSkipDirective,
    GraphQLUnionType,
    InlineFragmentNode,
    OperationDefinitionNode,
    OperationType,
    SelectionSetNode,
    Undefined,
)
from graphql.execution.values import get_directive_values

__all__ = ["Encoded", "NotPlanned", "Plan", "Render", "dumps", "plan_operation"]

BACKREF = "strawberry-definition"
"""Where Strawberry keeps a GraphQL field's own definition."""

_KNOWN_DIRECTIVES = frozenset({"skip", "include"})
_REVISION = "revision"


def dumps(value: object) -> str:
    """JSON text exactly as Strawberry's views encode a message."""
    return json.dumps(value, separators=(",", ":"))


class NotPlanned(Exception):
    """This value is not one the plan renders as ordinary execution would."""


Render = Callable[[Any], Any]


@dataclass(frozen=True, slots=True)
class Encoded:
    """A member's ``data`` serialised once: ``chunks`` joined by its revision."""

    chunks: tuple[str, ...]
    revision: int | None

    def text(self) -> str:
        if len(self.chunks) == 1:
            return self.chunks[0]
        return str(self.revision).join(self.chunks)

    def with_revision(self, revision: int) -> Encoded:
        return Encoded(self.chunks, revision)

    def value(self) -> Any:
        """The decoded ``data`` (for a transport that needs the object)."""
        return json.loads(self.text())


@dataclass(eq=False, slots=True)
class Plan:
    """A live operation's payload, compiled: one renderer per member type."""

    root_key: str
    members: Mapping[str, Render]
    """Concrete member type name -> its renderer (the member object to the
    response object of the root field)."""
    marker: str = field(default_factory=lambda: f"\x00{secrets.token_hex(8)}\x00")

    def data(self, member: object) -> dict[str, Any]:
        """The ``data`` ordinary execution would give for ``member``."""
        return {self.root_key: self._render(member, None)}

    def encode(self, member: object) -> Encoded:
        """``data`` for ``member`` serialised, cut at its own ``revision``."""
        revision = getattr(member, _REVISION, None)
        if not isinstance(revision, int) or isinstance(revision, bool):
            return Encoded((dumps(self.data(member)),), None)
        text = dumps({self.root_key: self._render(member, self.marker)})
        return Encoded(tuple(text.split(dumps(self.marker))), revision)

    def _render(self, member: object, marker: str | None) -> Any:
        name = _type_name(member)
        render = self.members.get(name) if name is not None else None
        if render is None:
            raise NotPlanned(f"no plan for a {type(member).__name__}")
        out: dict[str, Any] = render(member)
        if marker is not None:
            # Only the member's own revision (under whatever alias it was
            # asked; not a nested view's) varies per session.
            for key in getattr(render, "revision_keys", ()):
                out[key] = marker
        return out


def _type_name(value: object) -> str | None:
    definition = getattr(type(value), "__strawberry_definition__", None)
    name = getattr(definition, "name", None)
    return name if isinstance(name, str) else None


def plan_operation(
    schema: GraphQLSchema,
    operation: OperationDefinitionNode,
    fragments: Mapping[str, FragmentDefinitionNode],
    variables: Any,
) -> Plan | None:
    """The plan of a subscription ``operation`` over a union of object
    types, or None when ordinary execution must serve it. ``variables`` are
    the operation's coerced variable values (graphql-core's
    ``VariableValues``, as an executor holds them)."""
    if operation.operation is not OperationType.SUBSCRIPTION:
        return None
    root = schema.subscription_type
    if root is None:
        return None
    planner = _Planner(schema, fragments, variables)
    try:
        grouped = planner.collect(root, [operation.selection_set])
        if len(grouped) != 1:
            return None
        ((root_key, nodes),) = grouped.items()
        field_def = root.fields.get(nodes[0].name.value)
        if field_def is None or any(n.name.value != nodes[0].name.value for n in nodes):
            return None
        union = _unwrap_non_null(field_def.type)
        if not isinstance(union, GraphQLUnionType):
            return None
        members = {
            member.name: planner.object_renderer(member, _sub_selections(nodes))
            for member in union.types
        }
    except _Unplannable:
        return None
    return Plan(root_key, members)


class _Unplannable(Exception):
    pass


def _unwrap_non_null(gtype: GraphQLOutputType) -> GraphQLOutputType:
    return gtype.of_type if isinstance(gtype, GraphQLNonNull) else gtype


def _sub_selections(nodes: Sequence[FieldNode]) -> list[SelectionSetNode]:
    return [n.selection_set for n in nodes if n.selection_set is not None]


class _Planner:
    def __init__(
        self,
        schema: GraphQLSchema,
        fragments: Mapping[str, FragmentDefinitionNode],
        variables: Any,
    ) -> None:
        self.schema = schema
        self.fragments = fragments
        self.variables = variables

    def _included(self, node: FieldNode | InlineFragmentNode | FragmentSpreadNode) -> bool:
        for directive in node.directives or ():
            if directive.name.value not in _KNOWN_DIRECTIVES:
                raise _Unplannable
        skip = get_directive_values(GraphQLSkipDirective, node, self.variables)
        if skip and skip.get("if") is True:
            return False
        include = get_directive_values(GraphQLIncludeDirective, node, self.variables)
        return not (include and include.get("if") is False)

    def _applies(self, condition: str | None, concrete: GraphQLObjectType) -> bool:
        if condition is None or condition == concrete.name:
            return True
        wanted = self.schema.get_type(condition)
        if isinstance(wanted, GraphQLUnionType):
            return concrete in wanted.types
        if wanted is None:
            raise _Unplannable
        return self.schema.is_sub_type(wanted, concrete)  # type: ignore[arg-type]

    def collect(
        self, concrete: GraphQLObjectType, selection_sets: Sequence[SelectionSetNode]
    ) -> dict[str, list[FieldNode]]:
        """graphql-core's CollectFields: response key -> its field nodes, in order."""
        grouped: dict[str, list[FieldNode]] = {}
        visited: set[str] = set()

        def walk(selection_set: SelectionSetNode) -> None:
            for selection in selection_set.selections:
                if isinstance(selection, FieldNode):
                    if not self._included(selection):
                        continue
                    key = selection.alias.value if selection.alias else selection.name.value
                    grouped.setdefault(key, []).append(selection)
                elif isinstance(selection, InlineFragmentNode):
                    condition = selection.type_condition
                    if not self._included(selection) or not self._applies(
                        condition.name.value if condition else None, concrete
                    ):
                        continue
                    walk(selection.selection_set)
                elif isinstance(selection, FragmentSpreadNode):
                    name = selection.name.value
                    if name in visited or not self._included(selection):
                        continue
                    visited.add(name)
                    fragment = self.fragments.get(name)
                    if fragment is None:
                        raise _Unplannable
                    if not self._applies(fragment.type_condition.name.value, concrete):
                        continue
                    walk(fragment.selection_set)
                else:
                    raise _Unplannable

        for selection_set in selection_sets:
            walk(selection_set)
        return grouped

    def object_renderer(
        self, gtype: GraphQLObjectType, selection_sets: Sequence[SelectionSetNode]
    ) -> Render:
        """The renderer of an object of ``gtype`` under these selections."""
        grouped = self.collect(gtype, selection_sets)
        steps: list[tuple[str, Render]] = []
        for key, nodes in grouped.items():
            name = nodes[0].name.value
            if name == "__typename":
                steps.append((key, _constant(gtype.name)))
                continue
            if name.startswith("__") or any(n.arguments for n in nodes):
                raise _Unplannable
            field_def = gtype.fields.get(name)
            if field_def is None:
                raise _Unplannable
            definition = (field_def.extensions or {}).get(BACKREF)
            if (
                definition is None
                or not getattr(definition, "is_basic_field", False)
                or getattr(definition, "extensions", None)
                or getattr(definition, "permission_classes", None)
            ):
                raise _Unplannable
            steps.append((key, _field_step(
                _getter(definition), self.completer(field_def.type, _sub_selections(nodes))
            )))
        revision_keys = tuple(k for k, nodes in grouped.items() if nodes[0].name.value == _REVISION)
        return _ObjectRender(gtype.name, tuple(steps), revision_keys)

    def completer(
        self, gtype: GraphQLOutputType, selection_sets: Sequence[SelectionSetNode]
    ) -> Render:
        """CompleteValue for ``gtype``: nulls, lists, leaves, objects."""
        if isinstance(gtype, GraphQLNonNull):
            inner = self.completer(gtype.of_type, selection_sets)

            def non_null(value: Any) -> Any:
                if value is None:
                    raise NotPlanned("a null in a non-null position")
                return inner(value)

            return non_null
        nullable = self._nullable_completer(gtype, selection_sets)

        def maybe(value: Any) -> Any:
            return None if value is None else nullable(value)

        return maybe

    def _nullable_completer(
        self, gtype: GraphQLOutputType, selection_sets: Sequence[SelectionSetNode]
    ) -> Render:
        if isinstance(gtype, GraphQLList):
            item = self.completer(gtype.of_type, selection_sets)

            def complete_list(value: Any) -> list[Any]:
                if isinstance(value, str | bytes | Mapping) or not hasattr(value, "__iter__"):
                    raise NotPlanned("a list field holds no list")
                return [item(v) for v in value]

            return complete_list
        if isinstance(gtype, GraphQLScalarType | GraphQLEnumType):
            if selection_sets:
                raise _Unplannable
            serialize = gtype.serialize

            def leaf(value: Any) -> Any:
                try:
                    out = serialize(value)
                except Exception as refused:
                    raise NotPlanned(str(refused)) from refused
                if out is Undefined or out is None:
                    raise NotPlanned("a leaf its type refuses")
                return out

            return leaf
        if isinstance(gtype, GraphQLObjectType):
            if not selection_sets or gtype.is_type_of is not None:
                raise _Unplannable
            return self.object_renderer(gtype, selection_sets)
        raise _Unplannable


def _constant(value: str) -> Render:
    def constant(_source: Any) -> str:
        return value

    return constant


def _field_step(get: Render, complete: Render) -> Render:
    def step(source: Any) -> Any:
        return complete(get(source))

    return step


@dataclass(frozen=True, slots=True)
class _ObjectRender:
    expected: str
    steps: tuple[tuple[str, Render], ...]
    revision_keys: tuple[str, ...]

    def __call__(self, source: Any) -> dict[str, Any]:
        # No type check here, as graphql-core makes none for an object type
        # without is_type_of (the engine's Cause is served as DeltaCause);
        # a type with one is not planned.
        return {key: step(source) for key, step in self.steps}


def _getter(definition: Any) -> Callable[[Any], Any]:
    python_name = definition.python_name
    resolver = getattr(definition, "default_resolver", getattr)
    if resolver is getattr:
        return lambda source: getattr(source, python_name)
    return lambda source: definition.get_result(source, info=None, args=[], kwargs={})
