"""Planned operations over HTTP: a known query or mutation executed without
Strawberry's per-request machinery.

The first POST of a document runs the ordinary way (Strawberry's
``Schema.execute``: the parse and validation caches, the limiters, the edge's
refusal codes, the extension runner). When that run's validation passes,
`HttpOps` keeps the parsed document per (document text, operationName) in a
bounded LRU, with its `OperationPlan`: for each root field whose result the
delivery plan's encoder can serialise (`delivery_plan.plan_value`:
``__typename``, aliases, fragments, nested objects, lists, enums,
nullability; no resolver below the root), the compiled renderer of its
result. A later request of that document is executed by graphql-core's own
executor (Strawberry's execution-context class, built as Strawberry builds
it), without Strawberry's execution context, extension runner, middleware
manager or the parse and validation lookups:

* variables are coerced by graphql-core (``Executor.build``), so a bad
  variable gets exactly the errors the ordinary path gives;
* each root field is resolved by graphql-core (its arguments from
  variables or literals, then Strawberry's own resolver wrapper: argument
  conversion, a real ``Info``, permission classes, field extensions); a
  mutation's root fields one after the other, in order;
* a planned root field's result is rendered by its plan instead of
  graphql-core's ``complete_value``; a value the plan does not render as
  graphql-core would (a null in a non-null position, an enum its type
  refuses, an object the resolver answered wrongly) is completed by
  graphql-core after all, so its errors are graphql-core's, located where
  graphql-core locates them;
* errors go through the schema's ``process_errors`` (the edge's logging).

What stays ordinary: a first request, a document that failed to parse or
validate, a subscription, GET, batches, a request carrying ``extensions``,
and any schema with an extension acting per operation (`enabled` False:
`live_ops.per_operation_extensions`). The planning (`plan_http_operation`) is
pure; `HttpOps.execute` is the thin I/O part.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from graphql import (
    DocumentNode,
    FieldNode,
    FragmentDefinitionNode,
    GraphQLError,
    GraphQLObjectType,
    GraphQLSchema,
    OperationDefinitionNode,
    OperationType,
    SelectionSetNode,
    Visitor,
    visit,
)
from graphql.pyutils import Path
from strawberry.execution import optimized_is_awaitable
from strawberry.types import ExecutionContext, ExecutionResult
from strawberry.types.graphql import OperationType as StrawberryOperationType

from ..graphql.delivery_plan import Render, plan_value
from .delivery import graphql_schema, report_errors

if TYPE_CHECKING:
    from strawberry import Schema

__all__ = [
    "KNOWN_HTTP_DOCUMENTS",
    "MAX_KNOWN_DOCUMENT_CHARS",
    "HttpOps",
    "OperationPlan",
    "plan_http_operation",
    "validated",
]

KNOWN_HTTP_DOCUMENTS = 1024
"""Known (document text, operationName) kept per app (an LRU)."""

MAX_KNOWN_DOCUMENT_CHARS = 65_536
"""A longer document text is never kept (it stays ordinary): the LRU holds
at most `KNOWN_HTTP_DOCUMENTS` texts of at most this many characters."""

MAX_COERCION_ERRORS = 50
"""graphql-core's default bound on variable coercion errors (as the ordinary path)."""

Validated = Callable[[ExecutionContext], None]

_VALIDATED: ContextVar[Validated | None] = ContextVar("http_ops_validated", default=None)


def validated(execution_context: ExecutionContext) -> None:
    """Called by the app's refusal-code extension when a document passed
    validation; tells the `HttpOps.learning` block around the run, if any."""
    seen = _VALIDATED.get()
    if seen is not None and not execution_context.pre_execution_errors:
        seen(execution_context)


@dataclass(frozen=True, slots=True, eq=False)
class OperationPlan:
    """A query or mutation document the app knows valid, and how to answer it."""

    document: DocumentNode
    operation_name: str | None
    """The name graphql-core selects the operation by (Strawberry's
    ``ExecutionContext.operation_name``: the provided name, or the first
    operation's own)."""
    operation_type: StrawberryOperationType
    renders: Mapping[str, Render]
    """Root response key -> the renderer of that field's result; a key not
    here is completed by graphql-core."""


def _operation(
    document: DocumentNode, operation_name: str | None
) -> OperationDefinitionNode | None:
    """graphql-core's choice of the operation to execute, or None."""
    found: OperationDefinitionNode | None = None
    for definition in document.definitions:
        if not isinstance(definition, OperationDefinitionNode):
            continue
        if operation_name is None:
            if found is not None:
                return None
            found = definition
        elif definition.name is not None and definition.name.value == operation_name:
            return definition
    return found


class _HasDirective(Visitor):
    found = False

    def enter_directive(self, *_args: Any) -> Any:
        self.found = True
        return Visitor.BREAK


def _has_directives(document: DocumentNode) -> bool:
    seen = _HasDirective()
    visit(document, seen)
    return seen.found


def plan_http_operation(
    schema: GraphQLSchema, document: DocumentNode, operation_name: str | None
) -> OperationPlan | None:
    """The plan of a validated query or mutation ``document`` (the operation
    ``operation_name`` selects, as graphql-core selects it), or None when it
    is not one (a subscription; no operation by that name). Root fields whose
    result cannot be planned are completed by graphql-core; a document with
    directives (``@skip`` / ``@include`` depend on the variables) plans
    none."""
    operation = _operation(document, operation_name)
    if operation is None:
        return None
    if operation.operation is OperationType.QUERY:
        root, kind = schema.query_type, StrawberryOperationType.QUERY
    elif operation.operation is OperationType.MUTATION:
        root, kind = schema.mutation_type, StrawberryOperationType.MUTATION
    else:
        return None
    if root is None:
        return None
    fragments = {
        d.name.value: d for d in document.definitions if isinstance(d, FragmentDefinitionNode)
    }
    renders: dict[str, Render] = {}
    if not _has_directives(document):
        renders = _root_renders(schema, root, operation.selection_set, fragments)
    name = operation.name.value if operation.name is not None else None
    return OperationPlan(document, operation_name or name, kind, renders)


def _root_renders(
    schema: GraphQLSchema,
    root: GraphQLObjectType,
    selection_set: SelectionSetNode,
    fragments: Mapping[str, FragmentDefinitionNode],
) -> dict[str, Render]:
    keys: dict[str, list[FieldNode]] = {}
    plain: list[FieldNode] = []
    for selection in selection_set.selections:
        if not isinstance(selection, FieldNode):
            return {}  # a root fragment: graphql-core collects the root
        key = selection.alias.value if selection.alias else selection.name.value
        keys.setdefault(key, []).append(selection)
        plain.append(selection)
    renders: dict[str, Render] = {}
    for key, nodes in keys.items():
        if len(nodes) != 1:
            continue  # merged fields: graphql-core merges them
        node = nodes[0]
        if node.name.value.startswith("__"):
            continue
        field_def = root.fields.get(node.name.value)
        if field_def is None:
            continue
        selections = [node.selection_set] if node.selection_set is not None else []
        render = plan_value(schema, field_def.type, selections, fragments, None)
        if render is not None:
            renders[key] = render
    return renders


_PLANNED_CLASSES: dict[type[Any], type[Any]] = {}


def planned_executor_class(base: type[Any]) -> type[Any]:
    """``base`` (Strawberry's execution-context class) with a root field's
    result rendered by its plan when one is set (``planned``)."""
    cls = _PLANNED_CLASSES.get(base)
    if cls is not None:
        return cls

    class PlannedExecutor(base):  # type: ignore[misc]
        planned: Mapping[str, Render] = {}

        def complete_value(
            self, return_type: Any, field_details_list: Any, info: Any, path: Path,
            result: Any, *rest: Any,
        ) -> Any:
            if path.prev is None and not isinstance(result, Exception):
                render = self.planned.get(str(path.key))
                if render is not None:
                    try:
                        return render(result)
                    except Exception:  # graphql-core completes it, with its errors
                        pass
            return super().complete_value(
                return_type, field_details_list, info, path, result, *rest
            )

    PlannedExecutor.__name__ = f"Planned{base.__name__}"
    PlannedExecutor.__qualname__ = PlannedExecutor.__name__
    _PLANNED_CLASSES[base] = PlannedExecutor
    return PlannedExecutor


class HttpOps:
    """The known query and mutation documents of one app, and their execution.

    ``schema`` is the schema the app serves (the limited copy). ``enabled``
    False (the switch off, or an extension acting per operation) makes
    `known` always answer None and `learning` do nothing.
    """

    def __init__(
        self, schema: Schema, *, enabled: bool = True, size: int = KNOWN_HTTP_DOCUMENTS
    ) -> None:
        self.schema = schema
        self.enabled = enabled and not schema.config.enable_experimental_incremental_execution
        self._size = size
        self._known: OrderedDict[tuple[str, str | None], OperationPlan] = OrderedDict()
        self._executor_class = planned_executor_class(schema.execution_context_class)

    @property
    def _gschema(self) -> GraphQLSchema:
        """The graphql-core schema (known once a document was validated,
        which a known document was)."""
        found = graphql_schema(self.schema)
        if found is None:
            raise RuntimeError("no document was validated against this schema yet")
        return found

    @property
    def count(self) -> int:
        """How many documents are known now."""
        return len(self._known)

    def known(self, query: str, operation_name: object) -> OperationPlan | None:
        """The plan of a known document, or None: run it the ordinary way."""
        if not self.enabled or not (operation_name is None or isinstance(operation_name, str)):
            return None
        key = (query, operation_name)
        plan = self._known.get(key)
        if plan is not None:
            self._known.move_to_end(key)
        return plan

    def learning(
        self, query: object, operation_name: object
    ) -> contextlib.AbstractContextManager[None]:
        """Wrap the ordinary run of a POST's ``Schema.execute``: if its
        document passes validation (`validated`), it becomes known."""
        if (
            not self.enabled
            or not isinstance(query, str)
            or len(query) > MAX_KNOWN_DOCUMENT_CHARS
            or not (operation_name is None or isinstance(operation_name, str))
            or (query, operation_name) in self._known
        ):
            return contextlib.nullcontext()
        return self._learning((query, operation_name))

    @contextlib.contextmanager
    def _learning(self, key: tuple[str, str | None]) -> Iterator[None]:
        learnt = False

        def seen(execution_context: ExecutionContext) -> None:
            # Only the request's own document, once: a nested execute (a
            # resolver running GraphQL) or a task spawned during the run sees
            # this callback too, and its document must not be kept under
            # this key.
            nonlocal learnt
            document = execution_context.graphql_document
            if learnt or document is None or execution_context.query != key[0]:
                return
            learnt = True
            try:
                name = execution_context.operation_name
            except RuntimeError:
                return
            plan = plan_http_operation(self._gschema, document, name)
            if plan is not None:
                self._known[key] = plan
                if len(self._known) > self._size:
                    self._known.popitem(last=False)

        token = _VALIDATED.set(seen)
        try:
            yield
        finally:
            _VALIDATED.reset(token)

    async def execute(
        self,
        plan: OperationPlan,
        query: str,
        variables: dict[str, Any] | None,
        context: Any,
    ) -> ExecutionResult:
        """``plan``'s document executed for ``context`` with ``variables``:
        the result Strawberry's ``Schema.execute`` would give."""
        data: dict[str, Any] | None
        errors: list[GraphQLError] | None
        try:
            built = self._executor_class.build(
                self._gschema, plan.document, None, context, variables, plan.operation_name,
                max_coercion_errors=MAX_COERCION_ERRORS,
                is_awaitable=optimized_is_awaitable,
                operation_extensions=None,
            )
            if isinstance(built, list):
                data, errors = None, built
            else:
                built.planned = plan.renders
                result = built.execute_operation()
                if optimized_is_awaitable(result):
                    result = await result
                data, errors = result.data, result.errors
        except Exception as error:  # as Schema.execute answers it
            data = None
            errors = [error if isinstance(error, GraphQLError)
                      else GraphQLError(str(error), original_error=error)]
        if errors:
            self._report(errors, plan, query, variables, context)
        return ExecutionResult(data=data, errors=errors)

    def _report(
        self,
        errors: list[GraphQLError],
        plan: OperationPlan,
        query: str,
        variables: dict[str, Any] | None,
        context: Any,
    ) -> None:
        execution_context = ExecutionContext(
            query=query,
            schema=self.schema,
            allowed_operations=(plan.operation_type,),
            context=context,
            variables=variables,
            provided_operation_name=plan.operation_name,
            graphql_document=plan.document,
            pre_execution_errors=errors,
        )
        report_errors(self.schema, errors, execution_context)
