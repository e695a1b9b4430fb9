"""A socket's operations (a unit of `service_engine.server.wire.WireSocket`):
``subscribe`` / ``complete``, the live drains and an ordinary operation's sends."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from graphql import GraphQLError, GraphQLSyntaxError
from strawberry.http.exceptions import WebSocketDisconnected
from strawberry.schema.exceptions import CannotGetOperationTypeError
from strawberry.types.execution import ExecutionResult, PreExecutionError

from . import wire_protocol as wp
from .app import GraphQLContext, refusal_of
from .live_op import LiveOp
from .wire_writer import SocketWriter

_task_log = logging.getLogger("strawberry.ws.task")


__all__ = ["Drains", "Host", "Operation", "OperationStreamClosed", "SocketOperations"]

_log = logging.getLogger(__name__)


class Host(Protocol):
    """What a socket's operations need of the socket (`wire.WireSocket`):
    its context and loop, its close, `answered` (an operation answered: its
    attach turn ends) and its fused write (`LiveOp.start`'s ``direct``)."""

    _endpoint: Any  # its `wire.WireEndpoint` (built on this module, not imported)
    loop: asyncio.AbstractEventLoop
    context: GraphQLContext[Any] | None

    def close(self, code: int, reason: str) -> None: ...
    def answered(self) -> None: ...
    def _fused(self, live: LiveOp, delta: Any, revision: int) -> bool: ...


class Operation:
    """One ordinary operation: its task, and whether its last message went."""

    __slots__ = ("completed", "id", "operations", "task")

    def __init__(self, operations: SocketOperations, operation_id: Any) -> None:
        self.operations = operations
        self.id = operation_id
        self.completed = False
        self.task: asyncio.Task[None] | None = None

    async def send(self, message: dict[str, Any]) -> None:
        # Strawberry's Operation.send_operation_message.
        if self.completed:
            return
        if message["type"] in ("complete", "error"):
            self.completed = True
            self.operations.forget(self.id, self)
        await self.operations.send_json(message)

    def close(self) -> None:
        """Stop the operation (its task is cancelled; nothing more is sent)."""
        if self.task is not None:
            self.task.cancel()


class OperationStreamClosed(Exception):
    """The operation closed the socket (a document the handler refuses with 4400)."""


class Drains:
    """The sockets whose live operations were woken since the loop last
    drained them: one loop callback drains them all, in wake order (a
    render pass's slice wakes many sockets; each then costs its drain and
    write, not a callback of its own)."""

    __slots__ = ("_sockets", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._sockets: list[SocketOperations] | None = None

    def add(self, operations: SocketOperations) -> None:
        sockets = self._sockets
        if sockets is None:
            self._sockets = [operations]
            self.loop.call_soon(self._run)
        else:
            sockets.append(operations)

    def _run(self) -> None:
        sockets, self._sockets = self._sockets, None
        for operations in sockets or ():
            try:
                operations.drain()
            except Exception:
                # One socket's failure is its own: the others still write.
                _log.exception("a socket's live operations failed to drain")


class SocketOperations:
    """One socket's operations by id (`ops`), made at its first
    ``subscribe``: a known-planned live one as a `LiveOp` in callback mode
    (drained in one loop callback per wake, or written from the render pass
    itself: the socket's fused write), any other through Strawberry's
    ``schema.stream`` in one task. Their frames go to the socket's
    `SocketWriter`."""

    __slots__ = ("ops", "socket", "woken", "writer")

    def __init__(self, socket: Host, writer: SocketWriter) -> None:
        self.socket = socket
        self.writer = writer
        self.ops: dict[Any, Operation | LiveOp] = {}
        self.woken: list[LiveOp] | None = None
        """The live operations woken since the last `drain` (None: no drain pending)."""

    def subscribe(self, step: wp.Subscribe) -> None:
        socket = self.socket
        payload = {"query": step.query, "variables": step.variables,
                   "operationName": step.operation_name}
        live = socket._endpoint.live_ops.open(step.id, payload, socket.context)
        if live is not None:
            # A known-planned live document: no task, no Strawberry; its
            # frames are drained into this socket's writes (callback mode).
            self.ops[step.id] = live
            live.start(self._wake, self._live_done, socket._fused)
            if self.writer.paused:
                live.pause()
            return
        operation = Operation(self, step.id)
        operation.task = socket.loop.create_task(self._run(operation, step))
        operation.task.add_done_callback(_task_done)
        self.ops[step.id] = operation

    def complete(self, operation_id: Any) -> None:
        try:
            operation = self.ops.pop(operation_id)
        except (KeyError, TypeError):
            return
        operation.close()

    def forget(self, operation_id: Any, operation: Operation | LiveOp) -> None:
        if self.ops.get(operation_id) is operation:
            del self.ops[operation_id]

    def stop(self) -> None:
        """Stop every operation (nothing more is sent)."""
        operations, self.ops = self.ops, {}
        for operation in operations.values():
            operation.close()
        self.woken = None

    def pause(self) -> None:
        """The transport paused writing: the live operations take nothing
        (their sessions collapse, as any slow subscriber's do)."""
        for operation in self.ops.values():
            if isinstance(operation, LiveOp):
                operation.pause()

    def resume(self) -> None:
        for operation in list(self.ops.values()):
            if isinstance(operation, LiveOp):
                operation.resume()

    def _wake(self, live: LiveOp) -> None:
        # Called from inside the render pass (a put): only schedule. Every
        # op woken before the next turn drains into one transport.write, and
        # every socket woken before it in one loop callback (`Drains`).
        woken = self.woken
        if woken is None:
            self.woken = [live]
            socket = self.socket
            socket._endpoint.drains(socket.loop).add(self)
        else:
            woken.append(live)

    def _live_done(self, operation_id: str) -> None:
        # The session ended: the id is free before its complete is written.
        operation = self.ops.get(operation_id)
        if isinstance(operation, LiveOp):
            del self.ops[operation_id]

    def drain(self) -> None:
        """Write the frames of the live operations woken since the last drain."""
        woken, self.woken = self.woken, None
        writer = self.writer
        if not woken or writer.closed:
            return
        self.socket.answered()  # attached: its first frames go now
        if len(woken) == 1:
            # One op woken (one subscription per socket, the common case):
            # its drain's texts go straight to the transport.
            live = woken[0]
            try:
                more = live.drain(writer.write_texts)
            except Exception:
                _log.exception("live operation %s failed to drain", live.id)
                self.forget(live.id, live)
                live.close()
                return
            if more and not writer.paused:
                self._wake(live)
            return
        texts: list[str] = []
        write = texts.extend
        again: list[LiveOp] = []
        for live in woken:
            try:
                if live.drain(write):
                    again.append(live)
            except Exception:
                # One op's failure is its own: the others' frames are written.
                _log.exception("live operation %s failed to drain", live.id)
                self.forget(live.id, live)
                live.close()
        writer.write_texts(texts)
        for live in again:
            if not writer.paused:
                self._wake(live)

    async def send_json(self, message: Mapping[str, object]) -> None:
        """Send one message when the socket is writable (Strawberry's
        ``send_json``; raises `WebSocketDisconnected` once it is closed)."""
        socket, writer = self.socket, self.writer
        socket.answered()  # an operation's first answer
        await writer.wait_writable(socket.loop)
        if writer.closed:
            raise WebSocketDisconnected
        writer.write(socket._endpoint.encode_json(message).encode())

    async def _run(self, operation: Operation, step: wp.Subscribe) -> None:
        # Strawberry's run_operation and _send_result_stream.
        endpoint = self.socket._endpoint
        try:
            # A known-planned live field teaches LiveOps its document.
            with endpoint.live_ops.learning(
                {"query": step.query, "operationName": step.operation_name}
            ):
                source = await endpoint.schema.stream(
                    step.query,
                    variable_values=step.variables,
                    context_value=self.socket.context,
                    root_value=None,
                    operation_name=step.operation_name,
                )
                async with contextlib.aclosing(source):
                    first = True
                    async for result in source:
                        if first and isinstance(result, PreExecutionError):
                            await self._pre_execution_error(operation, result)
                            return
                        if not isinstance(result, ExecutionResult):
                            await operation.send({
                                "id": operation.id, "type": "error",
                                "payload": [GraphQLError(
                                    "Incremental delivery is not supported over "
                                    "graphql-transport-ws").formatted],
                            })
                            return
                        await self._send_next(operation, result)
                        first = False
            await operation.send({"id": operation.id, "type": "complete"})
        except OperationStreamClosed:
            return
        except WebSocketDisconnected:
            self.forget(operation.id, operation)
            return
        except Exception as error:
            _task_log.exception("Exception in worker task", exc_info=error)
            with contextlib.suppress(Exception):
                await operation.send({"id": operation.id, "type": "complete"})
            self.forget(operation.id, operation)
            raise

    async def _pre_execution_error(self, operation: Operation, result: PreExecutionError
                                   ) -> None:
        assert result.errors
        reason = _pre_execution_close_reason(result.errors[0])
        if reason:
            self.socket.close(4400, reason)
            self.forget(operation.id, operation)
            raise OperationStreamClosed
        await operation.send({"id": operation.id, "type": "error",
                              "payload": [err.formatted for err in result.errors]})

    async def _send_next(self, operation: Operation, result: ExecutionResult) -> None:
        payload: dict[str, Any] = {"data": result.data}
        if result.errors:
            payload["errors"] = [err.formatted for err in result.errors]
        if result.extensions:
            payload["extensions"] = result.extensions
        await operation.send({"id": operation.id, "type": "next", "payload": payload})


def _pre_execution_close_reason(error: GraphQLError) -> str | None:
    """The 4400 reason of an error before execution (graphql-transport-ws: a
    document that does not parse, or names no operation), or None when it
    is the operation's ``error`` message (a refusal of the limiters among
    them: the socket and its other operations stay up)."""
    if refusal_of(error) is not None:
        return None
    if isinstance(error, GraphQLSyntaxError):
        return error.message
    if isinstance(error.original_error, CannotGetOperationTypeError):
        return error.original_error.as_http_error_reason()
    return None


def _task_done(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()
