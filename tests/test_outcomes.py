"""Mutation outcomes: Success, MutationError on the wire, and the OneShot that
cannot travel anywhere but to its caller (each refusal tested)."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle
from typing import Any

import pydantic
import pytest
from pydantic_core import PydanticSerializationError

from service_engine.gates import ActionName, Reason
from service_engine.impacts import Cause, Impact
from service_engine.persistence import DomainEvent
from service_engine.pipeline import (
    DATABASE_FAULT_MESSAGE,
    MutationError,
    OneShot,
    OutboxRow,
    SecretSpent,
    Success,
)


def test_success_on_the_wire() -> None:
    """Success reads {"success": true} on the wire."""
    assert Success().to_wire() == {"success": True}


def test_mutation_error_carries_the_reason_code() -> None:
    """A refusal's MutationError carries the reason code, the action, a default or explained
    message, and is not retryable."""
    refused = MutationError.refused(Reason("counter.frozen"), ActionName("increment"))
    assert refused.code == "counter.frozen" and not refused.retryable
    assert refused.reason == Reason("counter.frozen")
    assert refused.to_wire() == {
        "code": "counter.frozen", "message": "increment refused: counter.frozen",
        "retryable": False, "action": "increment",
    }
    explained = MutationError.refused(Reason("counter.frozen", "frozen since Monday"))
    assert explained.message == "frozen since Monday"


def test_the_database_fault_is_generic() -> None:
    """A database fault answers the generic code and message, retryable only when said so."""
    fault = MutationError.database()
    assert (fault.code, fault.message) == ("database", "mutation failed: database")
    assert DATABASE_FAULT_MESSAGE == "mutation failed: database"
    assert MutationError.database(retryable=True).retryable


def test_one_shot_reveals_once() -> None:
    """A OneShot reveals its value once; a second reveal raises SecretSpent."""
    secret = OneShot("s3cr3t")
    assert not secret.spent
    assert secret.reveal() == "s3cr3t"
    assert secret.spent
    with pytest.raises(SecretSpent):
        secret.reveal()


def test_one_shot_never_shows_its_value() -> None:
    """A OneShot's value appears in no repr, str, format or default JSON rendering."""
    secret = OneShot("s3cr3t")
    for text in (repr(secret), str(secret), f"{secret}", f"{secret!r}", f"{secret:>20}"):
        assert "s3cr3t" not in text
    assert "s3cr3t" not in json.dumps({"x": secret}, default=str)


def test_one_shot_is_not_json() -> None:
    """A OneShot cannot be JSON-encoded."""
    with pytest.raises(TypeError):
        json.dumps({"token": OneShot("s3cr3t")})


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_one_shot_cannot_be_pickled(protocol: int) -> None:
    """A OneShot cannot be pickled under any protocol."""
    with pytest.raises(TypeError, match="OneShot"):
        pickle.dumps(OneShot("s3cr3t"), protocol=protocol)


def test_one_shot_cannot_be_copied() -> None:
    """A OneShot cannot be copied, deep-copied or turned into a dict by dataclasses.asdict."""
    secret = OneShot("s3cr3t")
    with pytest.raises(TypeError):
        copy.copy(secret)
    with pytest.raises(TypeError):
        copy.deepcopy({"nested": [secret]})

    @dataclasses.dataclass
    class View:
        token: Any

    with pytest.raises(TypeError):
        dataclasses.asdict(View(secret))


def test_one_shot_cannot_be_subclassed() -> None:
    """A OneShot cannot be subclassed (a subclass could leak it)."""
    with pytest.raises(TypeError):
        type("Leaky", (OneShot,), {"__reduce__": lambda self: (str, ("x",))})


def test_one_shot_is_refused_by_pydantic() -> None:
    """pydantic refuses a OneShot field, and cannot serialise one held in an Any field."""
    with pytest.raises(TypeError, match="pydantic"):
        pydantic.create_model("View", token=(OneShot[str], ...))

    class Loose(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(arbitrary_types_allowed=True)
        token: Any

    with pytest.raises(PydanticSerializationError):
        Loose(token=OneShot("s3cr3t")).model_dump_json()
    with pytest.raises(PydanticSerializationError):
        Loose(token=OneShot("s3cr3t")).model_dump(mode="json")
    with pytest.raises(PydanticSerializationError):
        pydantic.TypeAdapter(Any).dump_json(OneShot("s3cr3t"))


def test_one_shot_cannot_enter_an_impact_event_or_outbox_row() -> None:
    """Refused at runtime; a type checker already flags each of these lines
    (a OneShot is not a JsonValue), hence the ignores."""
    secret = OneShot("s3cr3t")
    with pytest.raises(TypeError):
        Cause("leak", {"token": secret})  # type: ignore[dict-item]
    with pytest.raises(TypeError):
        Impact.entity("counter", secret)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        DomainEvent("leak", {"token": secret})  # type: ignore[dict-item]
    with pytest.raises(TypeError):
        OutboxRow("integration.evt.x", {"token": secret})  # type: ignore[dict-item]
    with pytest.raises(TypeError):
        OutboxRow("integration.evt.x", {}, headers={"X": secret})  # type: ignore[dict-item]
    assert not secret.spent


# -- the one code table ----------------------------------------------------------


def _answered_errors() -> list[Any]:
    from service_engine.db.errors import DatabaseFault, LockTimeout, Stage
    from service_engine.errors import CauseTooLarge, TooManyImpacts
    from service_engine.gates import Refused
    from service_engine.persistence.base import HydrationFailed, NotFound

    return [
        Refused(Reason("counter.frozen"), ActionName("increment")),
        NotFound("Counter", "c1"),
        HydrationFailed("counter", "c1", "gap"),
        TooManyImpacts("too many"),
        CauseTooLarge("too large"),
        LockTimeout("lock", Stage.LOCK, "55P03"),
        DatabaseFault("fault", Stage.SAVE, "XX000"),
    ]


def test_every_answered_error_is_in_the_table_and_answers_its_code() -> None:
    """The mutation answer and the reaction's dead letter read one code, the
    error's own: the executor's codes are never spelled out a second time."""
    from datetime import timedelta

    from service_engine.gates import Refused
    from service_engine.inbound.dispatch import classify_failure
    from service_engine.messaging.reactions import DeadLetterIt, ReactionBudget
    from service_engine.pipeline.outcomes import ANSWERED, mutation_error

    for exc in _answered_errors():
        assert isinstance(exc, ANSWERED)
        answer = mutation_error(exc)
        routed = classify_failure(exc, delivered=1, age=timedelta(0), budget=ReactionBudget())
        if isinstance(exc, Refused):
            assert answer.code == exc.reason.code
            assert routed == DeadLetterIt(f"refused:{exc.reason.code}", str(exc))
        elif getattr(exc, "retryable", False):
            assert answer.code == exc.code and answer.retryable
            assert not isinstance(routed, DeadLetterIt) and routed.reason == exc.code
        else:
            assert answer.code == exc.code
            assert isinstance(routed, DeadLetterIt) and routed.reason == exc.code


def test_translating_turns_driver_errors_into_engine_errors() -> None:
    """`db.errors.translating` lets no driver error out: a lock refusal is
    the retryable `LockTimeout`, a lost connection a retryable fault, both
    raised from the driver error; an engine error passes untouched."""
    import asyncpg

    from service_engine.db.errors import DatabaseFault, LockTimeout, Stage, translating
    from service_engine.errors import ShuttingDown

    with pytest.raises(LockTimeout) as caught, translating(Stage.LEASE):
        raise asyncpg.LockNotAvailableError("busy")
    assert caught.value.stage is Stage.LEASE and caught.value.retryable
    assert isinstance(caught.value.__cause__, asyncpg.LockNotAvailableError)
    with pytest.raises(DatabaseFault) as fault, translating(Stage.DEAD_LETTER):
        raise ConnectionResetError("gone")
    assert fault.value.retryable and fault.value.stage is Stage.DEAD_LETTER
    with pytest.raises(ShuttingDown), translating(Stage.RELAY):
        raise ShuttingDown("stop")


def test_declaration_mistakes_are_config_errors() -> None:
    """A store declared wrong is refused with a `ConfigError` (a
    `DeclarationError` for a wrong shape), never a bare ValueError/TypeError."""
    from service_engine.errors import ConfigError, DeclarationError
    from service_engine.persistence.crud import quote_ident

    with pytest.raises(ConfigError):
        quote_ident("bad; drop table")
    with pytest.raises(DeclarationError):
        OutboxRow("a.subject", ["not", "an", "object"])  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        OutboxRow("", {})
