"""What the first ordinary run of a live document established (`Known`),
read from Strawberry's public `Info` and the schema: the operation, the kit's
live field and how its GraphQL arguments map onto the slice's
`LiveRequest` parameters (`known_parameters`, None when Strawberry would
convert one itself). `LiveOps` keeps them; a `LiveOp` serves from them."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from graphql import (
    DocumentNode,
    FieldNode,
    FragmentDefinitionNode,
    GraphQLEnumType,
    GraphQLField,
    GraphQLScalarType,
    GraphQLSchema,
    OperationDefinitionNode,
    get_named_type,
)
from strawberry.relay import GlobalID

from ..graphql.subscriptions import LiveRequest, SubscriptionUnion

if TYPE_CHECKING:
    from strawberry.types.field import StrawberryField


@dataclass(frozen=True, slots=True, eq=False)
class Known:
    """A known-planned document: what its ordinary run established."""

    operation: OperationDefinitionNode
    fragments: Mapping[str, FragmentDefinitionNode]
    operation_name: str | None
    schema: GraphQLSchema
    field_def: GraphQLField
    field_node: FieldNode
    arguments: Mapping[str, str]
    """The field's GraphQL argument names to the request's parameter names."""
    takes_self: bool
    union: SubscriptionUnion[Any]
    request: LiveRequest

    def document(self) -> DocumentNode:
        return DocumentNode(definitions=(self.operation, *self.fragments.values()))


def known_parameters(
    field: StrawberryField, field_def: GraphQLField, request: LiveRequest, config: Any
) -> tuple[dict[str, str], bool] | None:
    """The field's GraphQL argument names to ``request``'s parameter names,
    and whether it takes ``self``; None (the ordinary path) unless every
    argument is a scalar or an enum (or a list of them): those graphql-core
    hands over as Strawberry would (it converts input objects, ``Maybe``,
    ``GlobalID`` and what field extensions map)."""
    if field.extensions:
        return None
    names: dict[str, str] = {}
    for argument in field.arguments:
        name = config.name_converter.from_argument(argument)
        graphql_argument = field_def.args.get(name)
        if graphql_argument is None or argument.is_maybe or _innermost(argument.type) is GlobalID:
            return None
        named = get_named_type(graphql_argument.type)
        if not isinstance(named, GraphQLScalarType | GraphQLEnumType):
            return None
        names[name] = argument.python_name
    parameters = list(inspect.signature(request).parameters)
    takes_self = bool(parameters) and parameters[0] == "self"
    if set(parameters[1 if takes_self else 0:]) != set(names.values()):
        return None  # a parameter Strawberry fills itself (root, parent, info)
    return names, takes_self


def _innermost(declared: Any) -> Any:
    while hasattr(declared, "of_type"):  # StrawberryOptional, StrawberryList
        declared = declared.of_type
    return declared


def document_key(payload: Mapping[str, object]) -> tuple[str, str | None] | None:
    query = payload.get("query")
    name = payload.get("operationName")
    if not isinstance(query, str) or not (name is None or isinstance(name, str)):
        return None
    return query, name
