"""The pure planner of every commit (records.py): what each verb decides
against the current state, the event it produces and the refusal it raises,
without a store."""

from __future__ import annotations

from datetime import UTC

import pytest

from service_engine.props import FieldSpec, HookRejected, Namespace, PropsError
from service_engine.props.records import (
    Actor,
    Planned,
    RecordState,
    make_event,
    now,
    plan_complete,
    plan_delete,
    plan_reconcile,
    plan_set,
    state_version,
)

ITEMS = Namespace("items", (FieldSpec("title", "string"), FieldSpec("token", "string", secret=True)))
FENCED = Namespace("fenced", (FieldSpec("title", "string"),), require_version=True, deletion="soft")
PREFS = Namespace("prefs", (FieldSpec("theme", "string"),), cardinality="singleton")
LIVE = RecordState(3, {"title": "t", "token": "s"}, "active", None)
TOMBSTONE = RecordState(4, None)


def refusal(call: object) -> PropsError:
    assert callable(call)
    with pytest.raises(PropsError) as caught:
        call()
    return caught.value


def test_now_is_utc() -> None:
    """The props clock's now is aware UTC."""
    assert now().tzinfo is UTC


def test_a_fence_mismatch_names_both_versions() -> None:
    """A version fence mismatch is version_mismatch naming the expected and the current version."""
    err = refusal(lambda: plan_set(ITEMS, "k", LIVE, {"title": "u"}, merge=True, if_version=2))
    assert (err.error_code, err.extra) == ("version_mismatch", {"expected_version": 2, "current_version": 3})
    assert err.message == "if_version 2 does not match the current version 3"


def test_set_counts_secret_changes_apart_from_named_ones() -> None:
    """A set plan names changed non-secret fields and only counts changed secret ones."""
    planned = plan_set(ITEMS, "k", LIVE, {"token": "new", "title": "u"}, merge=True, if_version=None)
    assert (planned.fields_changed, planned.secret_fields_changed_count) == (("title",), 1)
    plain = plan_set(ITEMS, "k", LIVE, {"title": "u"}, merge=True, if_version=None)
    assert (plain.fields_changed, plain.secret_fields_changed_count) == (("title",), 0)


def test_set_under_require_version_needs_a_fence() -> None:
    """A set in a namespace requiring versions without if_version is a validation_error naming the
    namespace."""
    err = refusal(lambda: plan_set(FENCED, "k", None, {"title": "t"}, merge=True, if_version=None))
    assert (err.error_code, err.message) == ("validation_error", "namespace 'fenced' requires if_version")


def test_set_runs_the_hook_with_the_key_and_keeps_the_lifecycle() -> None:
    """A set plan runs the validate hook with the key and fields and keeps the lifecycle given."""
    seen: list[tuple[str, dict[str, object]]] = []
    hooked = Namespace("hooked", (FieldSpec("title", "string"),), validate=lambda key, f: seen.append((key, dict(f))))
    planned = plan_set(hooked, "k1", None, {"title": "t"}, merge=True, if_version=None, lifecycle="provisioning")
    assert seen == [("k1", {"title": "t"})]
    assert planned.state == RecordState(1, {"title": "t"}, "provisioning", None)


def test_complete_needs_a_live_provisioned_record() -> None:
    """Completing a missing or deleted record is a conflict rc 10; completing a live one plans the
    next version with the lifecycle and reason."""
    for current in (None, TOMBSTONE):
        err = refusal(lambda current=current: plan_complete(ITEMS, current, "active", None))
        assert (err.error_code, err.rc, err.message) == ("conflict", 10, "nothing provisioned to complete in 'items'")
    planned = plan_complete(ITEMS, LIVE, "failed", "quota")
    assert planned == Planned(RecordState(4, LIVE.fields, "failed", "quota"), "completed", "set", False, dict(LIVE.fields or {}))


def test_delete_runs_the_hook_with_the_key_first() -> None:
    """A delete plan runs the on_delete hook with the key first, and its rejection is a
    validation_error with its message."""
    seen: list[str] = []

    def refuse(key: str) -> None:
        seen.append(key)
        raise HookRejected("kept")

    hooked = Namespace("hooked", (FieldSpec("title", "string"),), on_delete=refuse)
    err = refusal(lambda: plan_delete(hooked, "k1", None, if_version=None))
    assert (seen, err.error_code, err.message) == (["k1"], "validation_error", "kept")


def test_delete_refusals() -> None:
    """A delete is refused on a singleton, without a required fence, on a missing or deleted record,
    and at a stale version."""
    singleton = refusal(lambda: plan_delete(PREFS, "current", LIVE, if_version=None))
    assert (singleton.error_code, singleton.message) == ("validation_error", "delete is for collections; 'prefs' is a singleton")
    unfenced = refusal(lambda: plan_delete(FENCED, "k", LIVE, if_version=None))
    assert (unfenced.error_code, unfenced.message) == ("validation_error", "namespace 'fenced' requires if_version")
    for current in (None, TOMBSTONE):
        missing = refusal(lambda current=current: plan_delete(ITEMS, "k", current, if_version=None))
        assert (missing.error_code, missing.message) == ("not_found", "no record 'k' in 'items'")
    stale = refusal(lambda: plan_delete(FENCED, "k", LIVE, if_version=1))
    assert stale.error_code == "version_mismatch"


def test_delete_plans_hard_and_soft() -> None:
    """A hard delete plans no state (its version the next one), a soft delete a tombstone at the
    next version."""
    hard = plan_delete(ITEMS, "k", LIVE, if_version=3)
    assert hard == Planned(None, "deleted", "delete", False, None)
    assert state_version(hard, LIVE) == 4
    soft = plan_delete(FENCED, "k", LIVE, if_version=3)
    assert soft == Planned(RecordState(4, None), "deleted", "delete", False, None)


def test_reconcile_replaces_against_the_current_record() -> None:
    """A reconcile replaces the fields at the next version, raising the audit epoch, creating when
    missing or deleted; unknown fields are refused."""
    planned = plan_reconcile(ITEMS, LIVE, {"title": "t", "token": "rotated"})
    assert planned == Planned(
        RecordState(4, {"title": "t", "token": "rotated"}, "active", None),
        "reconciled", "reconcile", False, {"title": "t", "token": "rotated"}, (), 1,
    )
    fresh = plan_reconcile(ITEMS, None, {"title": "t"})
    assert (fresh.state, fresh.created, fresh.fields_changed) == (RecordState(1, {"title": "t"}), True, ("title",))
    revived = plan_reconcile(ITEMS, TOMBSTONE, {"title": "t"})
    assert (revived.state, revived.created) == (RecordState(5, {"title": "t"}), True)
    assert plan_reconcile(ITEMS, RecordState(1, {}), {"title": "t"}).created is False
    assert refusal(lambda: plan_reconcile(ITEMS, LIVE, {"ghost": 1})).error_code == "validation_error"


def test_state_version_of_a_write_and_of_a_hard_delete() -> None:
    """The version a plan commits is the new state's, or the next after the current for a hard
    delete (1 when none)."""
    assert state_version(Planned(RecordState(7, {}), "updated", "set", False, {}), LIVE) == 7
    assert state_version(Planned(None, "deleted", "delete", False, None), None) == 1


def test_only_a_completion_event_carries_lifecycle_and_reason() -> None:
    """Only a completion event carries the lifecycle and reason; set and reconcile events do not."""
    actor = Actor("A/alice", now(), "c-1")
    provisioning = plan_set(ITEMS, "k", None, {"title": "t"}, merge=True, if_version=None, lifecycle="provisioning")
    event = make_event(ITEMS, "k", provisioning, 1, 1, 0, actor, "d")
    assert (event.kind, event.lifecycle, event.reason, event.cause) == ("created", None, None, "c-1")
    failed = RecordState(2, {"title": "t"}, "failed", "quota")
    assert make_event(ITEMS, "k", plan_reconcile(ITEMS, failed, {"title": "u"}), 3, 3, 1, actor, "d").lifecycle is None
    completed = make_event(ITEMS, "k", plan_complete(ITEMS, LIVE, "failed", "quota"), 4, 4, 0, actor, "d")
    assert (completed.lifecycle, completed.reason) == ("failed", "quota")


def test_a_record_carries_its_lifecycle_and_reason() -> None:
    """A live record state reads as a record with its lifecycle and reason; a tombstone as no
    record."""
    record = RecordState(2, {"title": "t"}, "failed", "quota").as_record("k")
    assert record is not None and (record.lifecycle, record.reason) == ("failed", "quota")
    assert TOMBSTONE.as_record("k") is None
