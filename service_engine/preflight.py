"""What a pod checks before it serves, each refusal a typed error with
readiness left DOWN under its reason.

At `Engine.boot` (`check_boot`): the database posture, the schema version
(claimed for this pod's version), the listener's round trip. At
`Engine.run` (`check_start`): the app role's GRANTs on every registered
store's table, and the database function of every declared command.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from .beat.upkeep import check_grants, probe_listener
from .commands.checked import CheckedCommand
from .commands.install import assert_commands_installed
from .config import EngineConfig
from .db.pool import Database
from .db.posture import assert_posture
from .db.schema_version import VersionIdentity, claim_at_boot
from .failures import EngineError
from .readiness import ReadinessHandle

__all__ = ["check_boot", "check_start"]


async def check_boot(
    db: Database, config: EngineConfig, version: VersionIdentity, readiness: ReadinessHandle
) -> None:
    """Posture, schema version, listener, in order; a refusal raises its
    typed error with readiness DOWN under the error's reason."""
    try:
        async with db.pool.acquire() as conn:
            await assert_posture(conn)
            await claim_at_boot(
                conn, version, pod_id=config.pod_id,
                service=config.service, liveness=config.schema_version_liveness,
            )
        await probe_listener(db, config.listener_probe_timeout)
    except EngineError as exc:
        readiness.set_down(getattr(exc, "reason", "boot"), str(exc))
        raise


async def check_start(
    db: Database, readiness: ReadinessHandle, tables: Iterable[str],
    commands: Collection[CheckedCommand],
) -> None:
    """The GRANTs on ``tables`` (a missing one holds readiness DOWN, naming
    it: `check_grants`), then each of ``commands`` installed (a missing one
    raises, readiness DOWN under the error's code)."""
    await check_grants(db, readiness, tables)
    if not commands:
        return
    try:
        async with db.pool.acquire() as conn:
            await assert_commands_installed(conn, commands)
    except EngineError as exc:
        readiness.set_down(exc.code, str(exc))
        raise
