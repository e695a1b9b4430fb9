"""A socket's operations: ``subscribe`` / ``complete`` / the live drains."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from graphql import GraphQLError, GraphQLSyntaxError
from strawberry.http.exceptions import WebSocketDisconnected
from strawberry.schema.exceptions import CannotGetOperationTypeError
from strawberry.types.execution import ExecutionResult, PreExecutionError

from . import wire_protocol as wp
from .app import refusal_of
from .live_op import LiveOp
from .wire_state import GATE_HOLDING, GATE_NONE, SocketState

_task_log = logging.getLogger("strawberry.ws.task")


__all__ = ["Drains", "Operation", "OperationStreamClosed", "SocketOperations"]

_log = logging.getLogger(__name__)


class Operation:
    """One ordinary operation: its task, and whether its last message went."""

    __slots__ = ("completed", "id", "socket", "task")

    def __init__(self, socket: SocketState, operation_id: Any) -> None:
        self.socket = socket
        self.id = operation_id
        self.completed = False
        self.task: asyncio.Task[None] | None = None

    async def send(self, message: dict[str, Any]) -> None:
        # Strawberry's Operation.send_operation_message.
        if self.completed:
            return
        if message["type"] in ("complete", "error"):
            self.completed = True
            self.socket._forget(self.id, self)
        await self.socket.send_json(message)

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
        self._sockets: list[SocketState] | None = None

    def add(self, socket: SocketState) -> None:
        sockets = self._sockets
        if sockets is None:
            self._sockets = [socket]
            self.loop.call_soon(self._run)
        else:
            sockets.append(socket)

    def _run(self) -> None:
        sockets, self._sockets = self._sockets, None
        for socket in sockets or ():
            try:
                socket._drain_live()
            except Exception:
                # One socket's failure is its own: the others still write.
                _log.exception("a socket's live operations failed to drain")


class SocketOperations(SocketState):
    """The socket's operations: a known-planned live one as a `LiveOp` in
    callback mode (drained in one loop callback per wake, or written from
    the render pass itself: the fused write), any other through
    Strawberry's ``schema.stream`` in one task."""

    __slots__ = ()

    def _subscribe(self, step: wp.Subscribe) -> None:
        payload = {"query": step.query, "variables": step.variables,
                   "operationName": step.operation_name}
        live = self._endpoint.live_ops.open(step.id, payload, self.context)
        if live is not None:
            # A known-planned live document: no task, no Strawberry; its
            # frames are drained into this socket's writes (callback mode).
            self._ops[step.id] = live
            live.start(self._wake, self._live_done, self._fused)
            if self._paused:
                live.pause()
            return
        operation = Operation(self, step.id)
        operation.task = self.loop.create_task(self._run(operation, step))
        operation.task.add_done_callback(_task_done)
        self._ops[step.id] = operation

    def _complete(self, operation_id: Any) -> None:
        try:
            operation = self._ops.pop(operation_id)
        except (KeyError, TypeError):
            return
        operation.close()

    def _forget(self, operation_id: Any, operation: Operation | LiveOp) -> None:
        if self._ops.get(operation_id) is operation:
            del self._ops[operation_id]

    def _stop_operations(self) -> None:
        operations, self._ops = self._ops, {}
        for operation in operations.values():
            operation.close()
        self._woken = None

    def _wake(self, live: LiveOp) -> None:
        # Called from inside the render pass (a put): only schedule. Every
        # op woken before the next turn drains into one transport.write, and
        # every socket woken before it in one loop callback (`Drains`).
        woken = self._woken
        if woken is None:
            self._woken = [live]
            self._endpoint.drains(self.loop).add(self)
        else:
            woken.append(live)

    def _fused(self, live: LiveOp, delta: Any, revision: int) -> bool:
        # Called from inside the render pass (a put into a caught-up
        # session): write the frame now when nothing is ahead of it on this
        # socket (no drain pending, not paused, not closing, past the attach
        # gate, no per-message deflate); False leaves it to the wake and drain.
        # A failure here is this socket's alone: the frame is left to the
        # drain (which logs and ends what fails), never raised into the pass.
        if (self._woken is not None or self._paused or self._closed
                or self._gate is not GATE_NONE or self._deflate):
            return False
        try:
            data = live.frame_bytes(delta, revision)
            if data is None:
                return False
            self.transport.write(data)
        except Exception:
            return False
        return True

    def _live_done(self, operation_id: str) -> None:
        # The session ended: the id is free before its complete is written.
        operation = self._ops.get(operation_id)
        if isinstance(operation, LiveOp):
            del self._ops[operation_id]

    def _drain_live(self) -> None:
        woken, self._woken = self._woken, None
        if not woken or self._closed:
            return
        if self._gate is GATE_HOLDING:
            self._leave_gate()  # attached: its first frames go now
        if len(woken) == 1:
            # One op woken (one subscription per socket, the common case):
            # its drain's texts go straight to the transport.
            live = woken[0]
            try:
                more = live.drain(self.write_texts)
            except Exception:
                _log.exception("live operation %s failed to drain", live.id)
                self._forget(live.id, live)
                live.close()
                return
            if more and not self._paused:
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
                self._forget(live.id, live)
                live.close()
        self.write_texts(texts)
        for live in again:
            if not self._paused:
                self._wake(live)

    async def _run(self, operation: Operation, step: wp.Subscribe) -> None:
        # Strawberry's run_operation and _send_result_stream.
        endpoint = self._endpoint
        try:
            # A known-planned live field teaches LiveOps its document.
            with endpoint.live_ops.learning(
                {"query": step.query, "operationName": step.operation_name}
            ):
                source = await endpoint.schema.stream(
                    step.query,
                    variable_values=step.variables,
                    context_value=self.context,
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
            self._forget(operation.id, operation)
            return
        except Exception as error:
            _task_log.exception("Exception in worker task", exc_info=error)
            with contextlib.suppress(Exception):
                await operation.send({"id": operation.id, "type": "complete"})
            self._forget(operation.id, operation)
            raise

    async def _pre_execution_error(self, operation: Operation, result: PreExecutionError
                                   ) -> None:
        assert result.errors
        reason = _pre_execution_close_reason(result.errors[0])
        if reason:
            self.close(4400, reason)
            self._forget(operation.id, operation)
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
