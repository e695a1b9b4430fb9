"""Fault injection for the write pipeline (tests only).

`InjectFault` is a `StageHook`: give it to ``MutationExecutor.with_hook`` and
it runs a statement inside the pipeline's transaction at one stage, so a
test makes the begin, the flush or the commit fail for real, through the
database, not by patching the engine.

* ``InjectFault(Stage.FLUSH)`` raises a real error at the flush (the default
  statement is `RAISE_SQL`);
* ``InjectFault(Stage.COMMIT, sql=...)`` with an insert into a table whose
  deferred constraint trigger raises makes COMMIT itself fail.

Until it fires, a hook sends nothing: a hooked pipeline sends the same
statements as production (BEGIN, the lock bound and the first advisory lock
in one round trip; ``conformance/write/test_fault_hook.py`` holds it so). A fault
that fires sends its one statement, inside the transaction, at its stage.

Nothing under ``service_engine/`` outside ``testing/`` imports this module.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..db.errors import Stage
from ..db.types import Conn

__all__ = ["RAISE_SQL", "InjectFault"]

RAISE_SQL = "DO $$ BEGIN RAISE EXCEPTION 'injected fault'; END $$"
"""A statement that fails with SQLSTATE P0001 ``injected fault``."""


@dataclass
class InjectFault:
    """Run ``sql`` at ``stage``, the next ``times`` times that stage is reached."""

    stage: Stage
    sql: str = RAISE_SQL
    times: int = 1
    fired: int = field(default=0, init=False)

    async def __call__(self, stage: Stage, conn: Conn) -> None:
        if stage is self.stage and self.fired < self.times:
            self.fired += 1
            await conn.execute(self.sql)
