"""The delivery plan's caches: a document validated once (`document_seen_rule`),
its payload planned once per (document, operation, variables) (`plan_for`),
and a member a cohort shares serialised once for every session (`SharedPlan`).
"""

from __future__ import annotations

import json
import operator
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from graphql import (
    FragmentDefinitionNode,
    GraphQLError,
    GraphQLSchema,
    OperationDefinitionNode,
    ValidationContext,
    ValidationRule,
    VariableValues,
)
from strawberry.schema import BaseSchema
from strawberry.types import ExecutionContext
from strawberry.types.base import StrawberryList

from ..graphql.delivery_plan import Encoded, Plan, plan_operation
from ..render.deltas import Reset

__all__ = [
    "Seen", "SharedPlan", "document_seen_rule", "plan_for", "report_errors", "seen",
]

DOCUMENT_CACHE_SIZE = 1024
"""Document texts whose parse and validation are kept (per app)."""
PLAN_CACHE_SIZE = 1024
"""Planned (document, operation, variables) kept (per process)."""
ENCODED_PER_PLAN = 512
"""Serialised shared members kept per plan (a cohort's burst reuses them)."""
RESETS_PER_PLAN = 256
"""Serialised Reset windows kept per plan (a reconnect burst's cohorts reuse them)."""

_REVISION = "revision"


class SharedPlan:
    """A plan and its cache of serialised shared members."""

    __slots__ = ("_encoded", "_resets", "last_frame", "operation", "plan")

    def __init__(self, operation: OperationDefinitionNode, plan: Plan) -> None:
        self.operation = operation
        self.plan = plan
        self._encoded: dict[tuple[Any, ...], tuple[tuple[object, ...], Encoded]] = {}
        self._resets: dict[tuple[str, ...], tuple[tuple[object, ...], Encoded]] = {}
        self.last_frame: tuple[object, int, str, bytes] | None = None
        """The last whole frame a caught-up reader wrote (`LiveOp.frame_bytes`):
        (delta object, revision, the ``next`` message's head, bytes). A
        cohort's sessions mostly read the same delta at the same revision
        under the same id: one frame built, the rest reuse it."""

    def encode(self, member: object) -> Encoded:
        """``member`` serialised; a member whose other fields are the objects
        (or equal values: a view is projected per principal, and principals
        of one cohort mostly see the same) another session's member carried
        is serialised once."""
        member_type = type(member)
        fields = _identity_fields(member_type)
        if fields is None:
            return self.plan.encode(member)
        refs = _refs(fields, member)
        key = (member_type, refs[0] if isinstance(refs[0], str) else id(refs[0]))
        hit = self._encoded.get(key)
        if hit is not None and hit[0] == refs:
            encoded = hit[1]
            revision = getattr(member, _REVISION)
            return encoded if encoded.revision is None else encoded.with_revision(revision)
        encoded = self.plan.encode(member)
        if len(self._encoded) >= ENCODED_PER_PLAN:
            self._encoded.clear()
        self._encoded[key] = (refs, encoded)
        return encoded

    def encode_reset(self, message: Callable[[Any], object], reset: Reset[Any]) -> Encoded:
        """The member of ``reset`` (``message(reset)``, built only when
        needed) serialised, cut at its revision: a Reset carrying the same
        keys in the same order with the same view objects (or equal ones)
        as one serialised already (a cohort's sessions attaching together,
        each its own Reset of one window) is serialised once. Its
        ``revision`` is the first such Reset's: splice in ``reset``'s."""
        views = reset.views
        keys = tuple(views)
        values = tuple(views.values())
        hit = self._resets.get(keys)
        if hit is not None and hit[0] == values:
            return hit[1]
        encoded = self.plan.encode(message(reset))
        if len(self._resets) >= RESETS_PER_PLAN:
            self._resets.clear()
        self._resets[keys] = (values, encoded)
        return encoded

    def shared(self, member_type: type[Any], source: object) -> Encoded | None:
        """The serialisation of the ``member_type`` member that ``source``'s
        fields make (an engine delta carries its member's field names), when
        one with the same fields was serialised already (its ``revision`` is
        that member's: splice in ``source``'s); None otherwise (build the
        member and `encode` it)."""
        # Per frame of every session: the lookups inlined.
        fields = _FIELDS.get(member_type, _UNKNOWN)
        if fields is _UNKNOWN:
            fields = _identity_fields(member_type)
        if fields is None:
            return None
        refs = fields(source)
        if type(refs) is not tuple:
            refs = (refs,)
        first = refs[0]
        hit = self._encoded.get((member_type, first if type(first) is str else id(first)))
        if hit is None or hit[0] != refs:
            return None
        return hit[1]


def _refs(fields: Callable[[object], Any], source: object) -> tuple[object, ...]:
    refs = fields(source)
    return refs if isinstance(refs, tuple) else (refs,)


_FIELDS: dict[type[Any], Callable[[object], Any] | None] = {}
_UNKNOWN: Any = object()


def _identity_fields(cls: type[Any]) -> Callable[[object], Any] | None:
    """A getter of the fields besides its revision that identify a cacheable
    member of type ``cls`` (compared with ``==``, identity first, as tuples
    do); None: not cacheable (a lane notice has no revision; a Reset's lists
    are each session's own)."""
    try:
        return _FIELDS[cls]
    except KeyError:
        pass
    definition = getattr(cls, "__strawberry_definition__", None)
    fields = list(getattr(definition, "fields", ()))
    names = tuple(f.python_name for f in fields if f.python_name != _REVISION)
    getter: Callable[[object], Any] | None = operator.attrgetter(*names) if names else None
    if len(names) == len(fields) or any(
        isinstance(f.type, StrawberryList) for f in fields
    ):
        getter = None
    _FIELDS[cls] = getter
    return getter


_PLANS: OrderedDict[tuple[int, int, str], SharedPlan | None] = OrderedDict()


def plan_for(
    schema: GraphQLSchema,
    operation: OperationDefinitionNode,
    fragments: Mapping[str, Any],
    variables: Any,
) -> SharedPlan | None:
    """The shared plan of an operation (planned on first use), or None.

    ``variables`` are the coerced values as an executor holds them
    (graphql-core's ``VariableValues``) or as Strawberry hands them to a
    resolver (the plain ``coerced`` dict)."""
    coerced = getattr(variables, "coerced", variables)
    try:
        variables_key = json.dumps(coerced, sort_keys=True, default=repr)
    except (TypeError, ValueError):
        return None
    key = (id(schema), id(operation), variables_key)
    if key in _PLANS:
        shared = _PLANS[key]
        if shared is None or shared.operation is operation:
            _PLANS.move_to_end(key)
            return shared
    if not hasattr(variables, "coerced"):
        # @skip / @include read only the coerced values.
        variables = VariableValues({}, dict(coerced or {}))
    plan = plan_operation(schema, operation, fragments, variables)
    shared = SharedPlan(operation, plan) if plan is not None else None
    _PLANS[key] = shared
    if len(_PLANS) > PLAN_CACHE_SIZE:
        _PLANS.popitem(last=False)
    return shared


class Seen(NamedTuple):
    """An operation as its validation saw it (`document_seen_rule`)."""

    operation: OperationDefinitionNode
    fragments: dict[str, FragmentDefinitionNode]
    schema: GraphQLSchema


_SEEN: OrderedDict[tuple[int, int], Seen] = OrderedDict()


def document_seen_rule(served: BaseSchema) -> type[ValidationRule]:
    """A validation rule recording each operation of a document validated
    for ``served``, with its fragments and graphql-core schema (from the
    public ``ValidationContext``): what the plan needs, read back by `seen`."""

    class DocumentSeen(ValidationRule):
        def __init__(self, context: ValidationContext) -> None:
            super().__init__(context)
            definitions = context.document.definitions
            fragments = {d.name.value: d for d in definitions
                         if isinstance(d, FragmentDefinitionNode)}
            for definition in definitions:
                if isinstance(definition, OperationDefinitionNode):
                    key = (id(served), id(definition))
                    _SEEN[key] = Seen(definition, fragments, context.schema)
                    _SEEN.move_to_end(key)
            while len(_SEEN) > 2 * DOCUMENT_CACHE_SIZE:
                _SEEN.popitem(last=False)

    return DocumentSeen


def seen(served: BaseSchema, operation: OperationDefinitionNode) -> Seen | None:
    """``operation`` as a validation for ``served`` recorded it, or None
    (not validated here, or forgotten since: the ordinary path serves it)."""
    found = _SEEN.get((id(served), id(operation)))
    return found if found is not None and found.operation is operation else None


def report_errors(schema: BaseSchema, errors: list[GraphQLError],
                  execution_context: ExecutionContext | None = None) -> None:
    """Report ``errors`` as ``schema.execute`` does: field suggestions
    removed when the schema's config disables them, then the schema's
    ``process_errors`` (Strawberry's logger, or the service's override)."""
    if schema.config.disable_field_suggestions:
        for error in errors:
            schema.remove_field_suggestion(error)
    schema.process_errors(errors, execution_context)
