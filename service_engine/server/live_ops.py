"""Task-free live operations: a known live subscribe served without GraphQL per operation.

The first ``subscribe`` of a document runs the ordinary way (Strawberry's
operation: parse and validation, cached, the limiters, the context, the kit's
live resolver). When that run comes out valid as exactly one root field that
is a kit live field (`SubscriptionUnion.field`, no ``info`` parameter, scalar
arguments) whose delivery plan covers its union, the live resolver reports
it and `LiveOps` keeps the fact per (document text, operationName) in a
bounded LRU. A later ``subscribe`` of that document is a `LiveOp`: its
variables coerced by graphql-core (`get_variable_values`), the field's
arguments computed (`get_argument_values`), the slice's `LiveRequest` called,
the session attached and its deltas turned into frames by the plan: no
Strawberry operation, no graphql-core execution, no task per operation.
Anything else (a first subscribe, variables that fail coercion, a request
that raises) is left to the ordinary path, which gives the same messages.

The operation itself, its frames and flow control, is `LiveOp`
(`live_op`); what a document's first run established, `Known`
(`live_known`).
"""

from __future__ import annotations

import contextlib
import enum
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from graphql import FieldNode, VariableValues
from graphql.execution import get_argument_values, get_variable_values
from strawberry.extensions import SchemaExtension

from ..graphql import subscriptions
from ..graphql.subscriptions import Live, LiveRequest, SubscriptionUnion
from .delivery import SharedPlan, plan_for, seen
from .live_known import Known, document_key, known_parameters
from .live_op import LiveOp

if TYPE_CHECKING:
    from strawberry import Schema

__all__ = ["KNOWN_DOCUMENTS", "LiveOps", "per_operation_extensions"]

KNOWN_DOCUMENTS = 1024
"""Known-planned (document text, operationName) kept per app (an LRU)."""

MAX_COERCION_ERRORS = 50
"""graphql-core's default bound on variable coercion errors (as the ordinary path)."""

_OPERATION_HOOKS = (
    "on_operation", "on_parse", "on_validate", "on_execute", "resolve",
    "get_results", "on_stream_result",
)


def per_operation_extensions(
    schema: Schema, deterministic: tuple[type[SchemaExtension], ...] = ()
) -> list[str]:
    """The extensions of ``schema`` that act on each operation (any
    lifecycle hook), besides the ``deterministic`` ones (whose effect is
    fixed by the document text: the limiters, the caches). A known live
    document skips every hook: none may be left."""
    acting: list[str] = []
    for extension in schema.get_extensions():
        cls = type(extension)
        if isinstance(extension, deterministic):
            continue
        if any(getattr(cls, hook) is not getattr(SchemaExtension, hook)
               for hook in _OPERATION_HOOKS):
            acting.append(cls.__name__)
    return acting


class _Fixed(NamedTuple):
    """A document without variables: its field's arguments and its plan."""

    values: Mapping[str, Any]
    shared: SharedPlan


_IMMUTABLE = (str, int, float, enum.Enum, type(None))


def _immutable(values: Mapping[str, Any]) -> bool:
    """Whether ``values`` may be handed to every request (each list is
    copied per request; any other mutable value, a custom scalar's, is
    computed afresh for each, as the ordinary path does)."""
    return all(
        isinstance(value, _IMMUTABLE)
        or (type(value) is list and all(isinstance(item, _IMMUTABLE) for item in value))
        for value in values.values()
    )


class LiveOps:
    """The known-planned live documents of one app, and their operations.

    ``schema`` is the schema the app serves (the limited copy);
    ``encode`` is the app's JSON encoder for messages the plan does not
    write (Strawberry's ``encode_json``: an executed event, ``complete``).
    ``enabled`` False (a schema directive, or an extension that acts per
    operation, `per_operation_extensions`) makes `open` always answer None.
    """

    def __init__(
        self,
        schema: Schema,
        *,
        encode: Callable[[object], str | bytes],
        enabled: bool = True,
        size: int = KNOWN_DOCUMENTS,
    ) -> None:
        self.schema = schema
        self._encode = encode
        self.enabled = enabled
        self._size = size
        self._known: OrderedDict[tuple[str, str | None], Known] = OrderedDict()
        self._fixed: dict[Known, _Fixed] = {}
        """What a known document without variables gives every ``subscribe``
        alike: its coerced (no) variables, the field's arguments, its plan."""

    @property
    def known(self) -> int:
        """How many documents are known planned now."""
        return len(self._known)

    def encode(self, message: object) -> str:
        """A message's text, as the app's encoder gives it."""
        text = self._encode(message)
        return text.decode() if isinstance(text, bytes) else text

    def learning(self, payload: Mapping[str, object]) -> contextlib.AbstractContextManager[None]:
        """A context manager to wrap the ordinary run of a ``subscribe``
        (``payload`` is its message's payload: query, variables,
        operationName): if the kit's live resolver runs under it and its
        document is one `open` can serve, the document becomes known. Enter
        it in the operation's own task (it sets a context variable)."""
        key = document_key(payload)
        if not self.enabled or key is None or key in self._known:
            return contextlib.nullcontext()
        return subscriptions.reporting(
            lambda union, request, info: self._learn(key, union, request, info)
        )

    def _learn(
        self, key: tuple[str, str | None], union: SubscriptionUnion[Any], request: LiveRequest,
        info: Any,
    ) -> None:
        # Strawberry's public Info (its operation and field name), the
        # operation as its validation saw it (`delivery.seen`), the field
        # from the schema (`get_field_for_type`).
        found = seen(self.schema, info.operation)
        if found is None:
            return
        selections = found.operation.selection_set.selections
        node = selections[0] if len(selections) == 1 else None
        if (not isinstance(node, FieldNode) or node.directives
                or node.name.value != info.field_name):
            return  # a root spread, a @skip / @include at the root: leave it ordinary
        root = found.schema.subscription_type
        if root is None:
            return
        field_def = root.fields.get(node.name.value)
        field = self.schema.get_field_for_type(node.name.value, root.name)
        if field_def is None or field is None:
            return
        parameters = known_parameters(field, field_def, request, self.schema.config)
        if parameters is None or plan_for(
            found.schema, found.operation, found.fragments, info.variable_values
        ) is None:
            return
        self._known[key] = Known(
            found.operation, found.fragments, key[1], found.schema, field_def, node,
            parameters[0], parameters[1], union, request,
        )
        if len(self._known) > self._size:
            _, evicted = self._known.popitem(last=False)
            self._fixed.pop(evicted, None)

    def open(
        self, operation_id: str, payload: Mapping[str, object], context: Any
    ) -> LiveOp | None:
        """The live operation serving this ``subscribe`` (``payload`` its
        message's payload, ``context`` the socket's `GraphQLContext`, its
        principal resolved), or None: run it the ordinary way.

        Synchronous and cheap: nothing is attached yet (`LiveOp.start`
        does). The caller has already checked the protocol
        (acknowledged, the id free, the socket's subscription bound)."""
        if not self.enabled:
            return None
        key = document_key(payload)
        known = self._known.get(key) if key is not None else None
        if key is None or known is None:
            return None
        self._known.move_to_end(key)
        variables = payload.get("variables")
        if variables is not None and not isinstance(variables, dict):
            return None
        fixed = self._fixed.get(known)
        coerced: VariableValues | None = None
        if fixed is None:
            found_values = get_variable_values(
                known.schema, known.operation.variable_definitions or (), variables or {},
                max_errors=MAX_COERCION_ERRORS,
            )
            if isinstance(found_values, list):
                return None  # the ordinary path reports the errors
            coerced = found_values
        try:
            values: Mapping[str, Any]
            if coerced is not None:
                values = get_argument_values(known.field_def, known.field_node, coerced)
            else:
                assert fixed is not None
                values = fixed.values  # no variables: the arguments are the last ones'
            live = self._request(known, values)
            principal = context.principal
            lanes = context.engine.lanes_of(live.projector)
        except Exception:
            return None  # the ordinary path raises it where it reports it
        if fixed is not None:
            shared = fixed.shared
        else:
            assert coerced is not None
            found = plan_for(known.schema, known.operation, known.fragments, coerced)
            if found is None:
                return None
            shared = found
            if not known.operation.variable_definitions and _immutable(values):
                self._fixed[known] = _Fixed(values, shared)
        return LiveOp(self, known, operation_id, context, principal, live, shared,
                      variables, lanes)

    def _request(self, known: Known, values: Mapping[str, Any]) -> Live:
        """The field's `Live`: the request called with the field's
        arguments as graphql-core coerced them (``values``, from
        `get_argument_values`; `known_parameters` maps their names)."""
        names = known.arguments
        # (A list copied, as Strawberry does: graphql-core shares a default's.)
        kwargs = {names[name]: list(value) if isinstance(value, list) else value
                  for name, value in values.items()}
        live = known.request(None, **kwargs) if known.takes_self else known.request(**kwargs)
        if not isinstance(live, Live):
            raise TypeError(f"{type(live).__name__} is not Live")
        return live


