"""The schema-version singleton: one engine+service version owns a store.

Boot claims the row under a per-service advisory lock. A *live* row (its
heartbeat within ``schema_version_liveness``) of another version refuses the
claim; a stale row is taken over. Pods of the same version share the row and
each refreshes its heartbeat on the beat. A pod whose refresh finds another
version's live row has been displaced.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from enum import Enum

from ..failures import SchemaVersionConflict
from .locks import named_lock_key
from .types import Conn


@dataclass(frozen=True, slots=True)
class VersionIdentity:
    engine_version: str
    service_version: str

    def __str__(self) -> str:
        return f"engine {self.engine_version} / service {self.service_version}"


class Claim(Enum):
    OWNED = "owned"
    """The row is ours (claimed, refreshed, or taken over from a stale version)."""
    DISPLACED = "displaced"
    """A live pod of another version holds the row."""


@dataclass(frozen=True, slots=True)
class ClaimResult:
    claim: Claim
    holder: VersionIdentity


async def claim_schema_version(
    conn: Conn,
    ours: VersionIdentity,
    *,
    pod_id: str,
    service: str | None,
    liveness: timedelta,
) -> ClaimResult:
    """Claim or refresh the singleton for ``ours``; never raises on a conflict.

    Liveness is judged by the database clock.
    """
    lock = named_lock_key("service_engine.schema_version", service or "")
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", lock)
        row = await conn.fetchrow(
            """SELECT engine_version, service_version,
                      heartbeat_at > now() - $1::interval AS live
                 FROM service_engine.schema_version FOR UPDATE"""
            , liveness,
        )
        if row is not None:
            holder = VersionIdentity(row["engine_version"], row["service_version"])
            if holder == ours:
                await conn.execute(
                    "UPDATE service_engine.schema_version SET heartbeat_at = now()"
                )
                return ClaimResult(Claim.OWNED, ours)
            if row["live"]:
                return ClaimResult(Claim.DISPLACED, holder)
        await conn.execute(
            """INSERT INTO service_engine.schema_version
                   (singleton, engine_version, service_version, claimed_by)
               VALUES (true, $1, $2, $3)
               ON CONFLICT (singleton) DO UPDATE
                  SET engine_version = EXCLUDED.engine_version,
                      service_version = EXCLUDED.service_version,
                      claimed_by = EXCLUDED.claimed_by,
                      claimed_at = now(), heartbeat_at = now()""",
            ours.engine_version, ours.service_version, pod_id,
        )
        return ClaimResult(Claim.OWNED, ours)


async def claim_at_boot(
    conn: Conn,
    ours: VersionIdentity,
    *,
    pod_id: str,
    service: str | None,
    liveness: timedelta,
) -> None:
    """Claim the singleton at boot; raise `SchemaVersionConflict` if a live
    pod of another version holds it."""
    result = await claim_schema_version(
        conn, ours, pod_id=pod_id, service=service, liveness=liveness
    )
    if result.claim is Claim.DISPLACED:
        raise SchemaVersionConflict(str(ours), str(result.holder))
