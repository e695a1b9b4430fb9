"""The kit's answers to a mutation's outcome (`MutationResult.of`,
`CommandResult`, `require_ok`) and the live field a `Views` declares."""

from __future__ import annotations

import pytest
import strawberry

from service_engine import ActionName, MutationError, Query, WindowSpec
from service_engine.commands import CommandOutcome
from service_engine.errors import NotFound, Refused
from service_engine.graphql import CommandResult, MutationResult, Refusal, Views, require_ok
from service_engine.graphql.subscriptions import Live


@strawberry.type
class NoteResult(MutationResult):
    id: strawberry.ID | None = None


@strawberry.type
class StepResult(CommandResult):
    step_id: strawberry.Private[str | None] = None


STALE = CommandOutcome("StartStep", "StaleRevision", False)
GATED = CommandOutcome("StartStep", "Refused", False, {"reason": "step.done", "action": "advance"})


def test_of_answers_a_value_a_refusal_or_a_bare_commit() -> None:
    """A committed value lands in the field named; a MutationError is refused with no other
    field; a commit with no field named is a bare success."""
    assert NoteResult.of("n-1", "id") == NoteResult(success=True, id=strawberry.ID("n-1"))
    error = MutationError("note.not_author", "only its author", False, ActionName("edit"))
    assert NoteResult.of(error, "id") == NoteResult(success=False, error=Refusal.of(error))
    assert NoteResult.of(None) == NoteResult(success=True)


def test_of_answers_a_declared_outcome_with_its_code_action_and_name() -> None:
    """A command's outcome answers its success, or its declared refusal coded under the noun
    (a gate's reason and action as is), never retryable; a CommandResult names the outcome."""
    done = CommandOutcome("StartStep", "Started", True, replayed=True)
    assert StepResult.of(done, noun="step", step_id="s-1") == StepResult(
        success=True, outcome="Started", replayed=True, step_id="s-1")
    assert StepResult.of(STALE, noun="step", step_id="s-1") == StepResult(
        success=False, outcome="StaleRevision", step_id="s-1", error=Refusal(
            code="step.stale_revision", message="StartStep: StaleRevision", retryable=False))
    gated = StepResult.of(GATED, noun="step")
    assert gated.error == Refusal(code="step.done", message="StartStep: Refused",
                                  retryable=False, action="advance")
    with pytest.raises(TypeError, match="noun"):
        StepResult.of(STALE)


def test_require_ok_raises_the_declared_refusal_inside_a_handler() -> None:
    """require_ok passes a success through; a declared refusal raises Refused with its code
    (the known reason's message) and action; the outcome named missing raises NotFound."""
    done = CommandOutcome("StartStep", "Started", True)
    assert require_ok(done, "step") is done
    with pytest.raises(Refused) as refused:
        require_ok(STALE, "step")
    assert refused.value.reason.code == "step.stale_revision"
    assert refused.value.action is None
    with pytest.raises(Refused) as gated:
        require_ok(GATED, "step")
    assert (gated.value.reason.code, gated.value.action) == ("step.done", "advance")
    missing = CommandOutcome("StartStep", "StepMissing", False)
    with pytest.raises(NotFound) as found:
        require_ok(missing, "step", missing=("StepMissing", "Step", "s-9"))
    assert (found.value.store_type, found.value.key) == ("Step", "s-9")


@strawberry.type
class Step:
    id: str


def test_views_derive_the_live_field_and_its_union() -> None:
    """A Views declares its live field over its own union, named from the projector (CamelCase,
    or as given); its session is of that projector."""
    views = Views("open_steps", Step)
    assert [t.__name__ for t in views.types] == [
        "OpenStepsReset", "OpenStepsUpsert", "OpenStepsRemove"]
    assert Views("steps_rls", Step, union_name="Steps").union.name == "Steps"

    @strawberry.type
    class Subscription:
        @views.field(description="The open steps, live.")
        def open_steps(self, limit: int = 10) -> WindowSpec[int]:
            return WindowSpec(Query(limit))

    @strawberry.type
    class Q:
        step: Step | None = None

    schema = strawberry.Schema(query=Q, subscription=Subscription, types=views.types)
    assert "openSteps(limit: Int! = 10): OpenStepsMessage!" in schema.as_str()
    spec = WindowSpec(Query(3))
    assert views.live(spec) == Live("open_steps", spec)
