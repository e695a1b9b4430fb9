"""The write path's floor on the engine's own stack: a mutation over HTTP with
nothing of the engine, served by the libraries the engine serves with.

    python bench/mutation.py --writers 16,64 --floor      # beside the engine, interleaved

Run by ``mutation.py --floor`` as two more variants (a child process each,
under the reference service's environment contract: ``EXAMPLE_SERVICE_DATA``,
``EXAMPLE_SERVICE_HTTP_ADDR``, ``EXAMPLE_SERVICE_ADDR_FILE``, ``/readyz``):

- ``floor-gql`` (``--graphql``): a Strawberry schema with the reference
  service's ``createBoard`` and ``renameBoard`` fields (same arguments,
  same result shape) and Strawberry's parser and validation caches (each
  document parsed and validated once, as the engine does), served by
  Strawberry's ASGI app under Starlette under uvicorn with httptools, as
  the engine's pod is;
- ``floor-http``: the same two writes behind a plain Starlette route that
  reads the request's JSON and answers the same JSON, no GraphQL.

Each write is the issue's target shape on an asyncpg pool (the engine's
driver) against an embedded, durable Postgres: ``BEGIN``; one statement
(the insert, or the update of the writer's own row); ``pg_notify`` with
``COMMIT`` in one simple query: three round trips. The writer's principal
is its ``X-Passport`` header's JSON, parsed per request. Nothing else: no
command layer, no authorization, no impacts, offers or outbox, no NATS, no
render side. What the engine spends above ``floor-gql`` is the engine;
what ``floor-gql`` spends above ``floor-http`` is GraphQL; ``floor-http``
is what HTTP and three round trips cost on this machine.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import asyncpg
import strawberry
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from strawberry.asgi import GraphQL
from strawberry.extensions import ParserCache, ValidationCache
from strawberry.types import Info

from service_engine.embedded import EmbeddedPostgres

POOL = 10
SCHEMA = """
CREATE TABLE IF NOT EXISTS floor_board (
  org text NOT NULL, id text NOT NULL, title text NOT NULL,
  created_by text NOT NULL, PRIMARY KEY (org, id))
"""
INSERT = "INSERT INTO floor_board (org, id, title, created_by) VALUES ($1, $2, $3, $4)"
UPDATE = "UPDATE floor_board SET title = $3 WHERE org = $1 AND id = $2"
COMMIT = "SELECT pg_notify('floor', ''); COMMIT"


async def write(pool: asyncpg.Pool, passport: str, statement: str, board: str, title: str
                ) -> str | None:
    """One write in three round trips; the error code of a refused one."""
    principal = json.loads(passport)
    org, actor = principal["org"], principal["sub"]
    async with pool.acquire() as conn:
        await conn.execute("BEGIN")
        try:
            args = (org, board, title, actor) if statement is INSERT else (org, board, title)
            status = await conn.execute(statement, *args)
        except asyncpg.UniqueViolationError:
            await conn.execute("ROLLBACK")
            return "conflict"
        if status == "UPDATE 0":
            await conn.execute("ROLLBACK")
            return "not_found"
        await conn.execute(COMMIT)
    return None


@strawberry.type
class MutationError:
    code: str
    message: str


@strawberry.type
class WriteResult:
    success: bool
    error: MutationError | None = None


def _result(code: str | None) -> WriteResult:
    return WriteResult(success=code is None,
                       error=None if code is None else MutationError(code=code, message=code))


@strawberry.type
class Query:
    @strawberry.field
    def ok(self) -> bool:
        return True


@strawberry.type
class Mutation:
    @strawberry.mutation
    async def create_board(self, info: Info, title: str, id: strawberry.ID | None = None
                           ) -> WriteResult:
        request = info.context["request"]
        return _result(await write(request.app.state.pool, request.headers["x-passport"],
                                   INSERT, str(id), title))

    @strawberry.mutation
    async def rename_board(self, info: Info, id: strawberry.ID, title: str) -> WriteResult:
        request = info.context["request"]
        return _result(await write(request.app.state.pool, request.headers["x-passport"],
                                   UPDATE, str(id), title))


async def plain(request: Request) -> Response:
    """``floor-http``: the same writes, the field named in the document."""
    body = json.loads(await request.body())
    variables = body["variables"]
    field = "createBoard" if "createBoard" in body["query"] else "renameBoard"
    code = await write(request.app.state.pool, request.headers["x-passport"],
                       INSERT if field == "createBoard" else UPDATE,
                       variables["id"], variables["title"])
    outcome: dict[str, Any] = {"success": code is None,
                               "error": None if code is None else {"code": code, "message": code}}
    return JSONResponse({"data": {field: outcome}})


async def ready(_request: Request) -> Response:
    return PlainTextResponse("ok")


async def main(graphql: bool, listening: socket.socket) -> None:
    data = Path(os.environ["EXAMPLE_SERVICE_DATA"])
    pg = EmbeddedPostgres(data / "postgres")
    await asyncio.to_thread(pg.start)
    try:
        pool = await asyncpg.create_pool(pg.admin_url, min_size=POOL, max_size=POOL)
        await pool.execute(SCHEMA)
        endpoint: Any = (GraphQL(strawberry.Schema(
            query=Query, mutation=Mutation, extensions=[ParserCache, ValidationCache]))
                         if graphql else plain)
        app = Starlette(routes=[Route("/graphql", endpoint, methods=["POST"]),
                                Route("/readyz", ready)])
        app.state.pool = pool
        server = uvicorn.Server(uvicorn.Config(app, lifespan="off", log_level="warning",
                                               http="httptools"))
        await server.serve(sockets=[listening])
        await pool.close()
    finally:
        await asyncio.to_thread(pg.stop)


if __name__ == "__main__":
    host, _, port = os.environ["EXAMPLE_SERVICE_HTTP_ADDR"].rpartition(":")
    # IPPROTO_TCP, not 0, as the engine's pod binds (`service_engine.server.host`):
    # asyncio sets TCP_NODELAY only on such sockets' connections.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind((host, int(port)))
    sock.listen(2048)
    bound = sock.getsockname()
    # Ready once /readyz answers (the bench polls it after reading this).
    Path(os.environ["EXAMPLE_SERVICE_ADDR_FILE"]).write_text(f"{bound[0]}:{bound[1]}\n")
    asyncio.run(main("--graphql" in sys.argv, sock))
