"""What a transaction stages for blobs: new reference rows and releases.

`BlobStaging` collects, per pipeline transaction, the rows ``cx.blob`` /
``cx.blob_owned`` minted and the references released — by
``cx.release_blob``, or by the pipeline's diff of `Aggregate.blob_refs`
between load and save (`released_refs`: a dropped or repointed reference),
or by ``cx.delete`` (every reference the aggregate held). `stage_blobs`
writes them in the transaction, so a rollback mints and releases nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta

from ..db.literals import dollar_quoted, sql_bigint, sql_interval, sql_uuid, sql_uuids
from ..db.types import Conn
from ..failures import DeclarationError
from .model import parse_reference

__all__ = [
    "BlobStaging", "NewBlob", "blob_refs_of", "blob_statement", "released_refs", "stage_blobs",
]


@dataclass(frozen=True, slots=True)
class NewBlob:
    """One minted upload, as its ``service_engine.blob`` row."""

    id: uuid.UUID
    kind: str
    object_key: str
    content_type: str | None
    max_bytes: int
    orphan_after: timedelta
    owner_store: str | None = None
    owner_key: str | None = None
    """The owner's key as canonical JSON text."""


def blob_refs_of(aggregate: object) -> frozenset[str]:
    """The live references ``aggregate`` lists (`Aggregate.blob_refs`; none
    when the class declares no such method), normalised to uuid text."""
    method = getattr(aggregate, "blob_refs", None)
    if method is None:
        return frozenset()
    refs = method()
    if isinstance(refs, str):
        raise DeclarationError(
            f"{type(aggregate).__qualname__}.blob_refs returns an iterable of references, not a str"
        )
    return frozenset(str(parse_reference(ref)) for ref in refs if ref is not None)


def released_refs(before: Iterable[str], after: Iterable[str]) -> frozenset[str]:
    """The references ``before`` listed that ``after`` no longer does."""
    return frozenset(before) - frozenset(after)


@dataclass
class BlobStaging:
    """A transaction's blob rows and releases (empty for most commands)."""

    minted: list[NewBlob] = field(default_factory=list)
    released: set[str] = field(default_factory=set)

    def mint(self, blob: NewBlob) -> None:
        self.minted.append(blob)

    def release(self, refs: Iterable[str]) -> None:
        self.released.update(refs)

    def __bool__(self) -> bool:
        return bool(self.minted or self.released)


def blob_statement(staging: BlobStaging) -> str:
    """`stage_blobs`'s writes with their values inlined (`db.literals`), to
    ride in another round trip of the caller's transaction; ``""`` when
    nothing was minted or released."""
    statements = []
    if staging.minted:
        values = ", ".join(
            f"({sql_uuid(b.id)}, {dollar_quoted(b.kind)}, {dollar_quoted(b.object_key)},"
            f" {dollar_quoted(b.content_type)}, {sql_bigint(b.max_bytes)},"
            f" {dollar_quoted(b.owner_store)},"
            f" {'NULL' if b.owner_key is None else dollar_quoted(b.owner_key)}::jsonb,"
            f" {sql_interval(b.orphan_after)})"
            for b in staging.minted
        )
        statements.append(
            "INSERT INTO service_engine.blob (id, kind, object_key, content_type, max_bytes,"
            f" owner_store, owner_key, orphan_after) VALUES {values}"
        )
    if staging.released:
        statements.append(
            "UPDATE service_engine.blob SET state = 'released', released_at = clock_timestamp()"
            f" WHERE id = ANY({sql_uuids(sorted(staging.released))}) AND state <> 'released'"
        )
    return "; ".join(statements)


async def stage_blobs(conn: Conn, staging: BlobStaging) -> None:
    """Insert the minted rows and mark the released references, in the
    caller's transaction. A release of a reference minted by this very
    transaction releases it too (it never reached an aggregate)."""
    if staging.minted:
        # ``owner_key`` is already canonical JSON text: cast from text, so the
        # connection's jsonb codec does not encode it a second time.
        await conn.executemany(
            "INSERT INTO service_engine.blob (id, kind, object_key, content_type, max_bytes,"
            " owner_store, owner_key, orphan_after)"
            " VALUES ($1, $2, $3, $4, $5, $6, $7::text::jsonb, $8)",
            [
                (b.id, b.kind, b.object_key, b.content_type, b.max_bytes, b.owner_store,
                 b.owner_key, b.orphan_after)
                for b in staging.minted
            ],
        )
    if staging.released:
        await conn.execute(
            "UPDATE service_engine.blob SET state = 'released', released_at = clock_timestamp()"
            " WHERE id = ANY($1::uuid[]) AND state <> 'released'",
            sorted(staging.released),
        )
