"""Property tests: the parser refuses anything with a typed PropsError only,
and both stores agree on every reply, refusal and event for any sequence of
writes."""

from __future__ import annotations

import asyncio
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service_engine.props import (
    Actor,
    FieldSpec,
    MemoryStore,
    Namespace,
    PropsError,
    Store,
    open_sqlite_store,
    parse_command,
)

HEADER_NAMES = st.sampled_from([
    "namespace", "key", "if_version", "cause", "merge", "view", "since_nseq", "path",
    "field_path", "cursor", "limit", "order_by", "filter", "fields", "other",
])


@given(
    st.sampled_from(["set", "delete", "get", "list", "describe", "watch", "audit.watch", "nope", "audit"]),
    st.dictionaries(HEADER_NAMES, st.text(max_size=8), max_size=6),
    st.binary(max_size=30) | st.sampled_from([b"{}", b'{"a": 1}', b"[]", b"null"]),
)
def test_parser_refuses_only_with_props_errors(verb: str, headers: dict[str, str], body: bytes) -> None:
    """The props parser refuses any request only with a validation PropsError, and an accepted one
    names its namespace header (property test)."""
    try:
        cmd = parse_command("demo", f"demo.props.{verb}", headers, body)
    except PropsError as exc:
        assert exc.rc in (10, 20) and exc.error_code == "validation_error"
        return
    assert cmd.namespace == headers["namespace"]


NS = Namespace("items", (FieldSpec("a", "integer"), FieldSpec("b", "string"), FieldSpec("s", "string", secret=True)))
AT = datetime(2026, 12, 1, tzinfo=UTC)

field_values = st.dictionaries(
    st.sampled_from(["a", "b", "s", "zz"]),
    st.integers(-3, 3) | st.text(max_size=3) | st.none(),
    max_size=3,
)
ops = st.lists(
    st.tuples(
        st.sampled_from(["set", "delete"]),
        st.sampled_from(["k1", "k2"]),
        field_values,
        st.booleans(),
        st.none() | st.integers(0, 4),
    ),
    max_size=12,
)


async def run(store: Store, sequence: list[tuple[str, str, dict[str, Any], bool, int | None]]) -> list[Any]:
    await store.register(NS)
    out: list[Any] = []
    for verb, key, fields, merge, fence in sequence:
        actor = Actor("A/alice", AT)
        try:
            if verb == "set":
                c = await store.set(NS, key, fields, merge=merge, if_version=fence, actor=actor)
            else:
                c = await store.delete(NS, key, if_version=fence, actor=actor)
            out.append(("ok", c.key, c.version, c.nseq, c.created))
        except PropsError as exc:
            out.append(("refused", exc.error_code, exc.extra))
    nseq, records = await store.list_records("items")
    out.append((nseq, [(r.key, r.version, dict(r.fields)) for r in records]))
    events = await store.events("items", 0, nseq)
    out.append([(e.nseq, e.key, e.kind, e.version, e.fields_changed, e.secret_fields_changed_count) for e in events])
    return out


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_both_stores_agree(sequence: list[tuple[str, str, dict[str, Any], bool, int | None]]) -> None:
    """The in-memory and SQLite stores answer any sequence of sets and deletes identically (property
    test)."""
    async def both() -> tuple[list[Any], list[Any]]:
        memory = MemoryStore()
        with tempfile.TemporaryDirectory() as folder:
            sqlite = await open_sqlite_store(Path(folder) / "p.db")
            try:
                return await run(memory, sequence), await run(sqlite, sequence)
            finally:
                await sqlite.aclose()

    in_memory, on_disk = asyncio.run(both())
    assert in_memory == on_disk
