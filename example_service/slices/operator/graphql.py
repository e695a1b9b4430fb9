"""``erasePerson(person: ID!)``: erase a person across every Erasable slice
(`Engine.erase`), for a passport holding the ops role only."""

from __future__ import annotations

import logging

import strawberry

from service_engine import MutationError, Reason
from service_engine.errors import ConfigError, EngineError
from service_engine.graphql import DEFAULT_OPS_ROLE, MutationResult

from ...kernel import Info

OPS_ROLE_REQUIRED = Reason(
    "operator.ops_role_required", f"an operator gesture needs the {DEFAULT_OPS_ROLE!r} role"
)
PERSON_INVALID = Reason("operator.person_invalid", "a person is a non-empty id")

_log = logging.getLogger(__name__)


@strawberry.type(description="The outcome of erasing a person.")
class ErasePersonResult(MutationResult):
    person: strawberry.ID | None = None
    fresh: bool = strawberry.field(default=False, description=(
        "False when the person was erased before (no second PersonErased is published)."))
    purged: bool = strawberry.field(default=False, description=(
        "Whether the post-commit purge (lane-A chunks, presence keys, blobs) finished; "
        "if not, the beat finishes it from the persisted manifest."))


@strawberry.type
class OperatorMutation:
    @strawberry.mutation(description=(
        "Erase a person from every slice holding their data, in one transaction, then purge "
        f"their lane data and blobs (needs the {DEFAULT_OPS_ROLE!r} role). Idempotent."))
    async def erase_person(self, info: Info, person: strawberry.ID) -> ErasePersonResult:
        principal = info.context.principal
        if not principal.has_role(DEFAULT_OPS_ROLE):
            return ErasePersonResult.refused(MutationError.refused(OPS_ROLE_REQUIRED))
        try:
            result = await info.context.engine.erase(str(person))
        except ConfigError:
            return ErasePersonResult.refused(MutationError.refused(PERSON_INVALID))
        except EngineError as exc:
            # The gesture rolled back whole and is idempotent: sending it again is safe.
            _log.warning("erasure of %s by %s failed: %s", person, principal.id, exc)
            return ErasePersonResult.refused(MutationError.database(retryable=True))
        _log.info(
            "ops erase person %s by %s: fresh=%s purged=%s",
            person, principal.id, result.fresh, result.purged,
            extra={"ops_action": "erase_person", "ops_actor": principal.id,
                   "ops_target": str(person), "ops_outcome": "erased"},
        )
        return ErasePersonResult(
            success=True, person=strawberry.ID(result.person), fresh=result.fresh,
            purged=result.purged,
        )
