"""The idempotency record of a compiled command's function body: looked up
before anything is decided, written after the decision.

A keyed run whose record is still within its window answers that record
again (a replay), or `IdempotencyConflict` where the record was made for
other input; otherwise the run decides, and its answer (success or a
declared outcome) is recorded with its seal, two expired records swept by
the same statement. `function_body` calls `replayed` after the advisory
locks and `recorded` after the decision, for a command with an
idempotency key only; this is apart because it is one protocol over the
engine's own ``command_idempotency`` table, the same for every command
but for its name.
"""

from __future__ import annotations

from collections.abc import Sequence

from .sql_expr import _name_lit


def replayed(command: str) -> list[str]:
    """The record of ``command``'s run looked up: one within its window
    answers at once (replayed, or a conflict for other input)."""
    return [
        "  SELECT input_digest, outcome, sealed, recorded_at INTO rec"
        " FROM service_engine.command_idempotency"
        f" WHERE command = {_name_lit(command)} AND scope = ctl ->> 'scope'"
        " AND key = ctl ->> 'key';",
        "  IF FOUND AND rec.recorded_at >= (ctl ->> 'since')::timestamptz THEN",
        "    IF rec.input_digest <> ctl ->> 'digest' THEN",
        "      RETURN jsonb_build_object('name', 'IdempotencyConflict', 'ok', false,"
        " 'conflict', true);",
        "    END IF;",
        "    RETURN jsonb_build_object('replay', rec.outcome, 'sealed', rec.sealed);",
        "  END IF;",
    ]


def recorded(command: str, carried: Sequence[tuple[str, str]], emits: bool) -> list[str]:
    """The run's answer recorded (``out_name``, ``out_ok``, ``out_data``) and
    returned with what a success ``carried`` (each ``key, value``, SQL) and,
    where the command ``emits``, its events."""
    events = "CASE WHEN out_ok THEN emits ELSE '[]' END"
    return [
        "  WITH swept AS (DELETE FROM service_engine.command_idempotency WHERE ctid IN ("
        " SELECT ctid FROM service_engine.command_idempotency"
        " WHERE recorded_at < (ctl ->> 'since')::timestamptz"
        " ORDER BY recorded_at LIMIT 2 FOR UPDATE SKIP LOCKED))"
        " INSERT INTO service_engine.command_idempotency"
        " (command, scope, key, input_digest, outcome, sealed, recorded_at)"
        f" VALUES ({_name_lit(command)}, ctl ->> 'scope', ctl ->> 'key',"
        " ctl ->> 'digest', jsonb_build_object('name', out_name, 'ok', out_ok,"
        " 'data', out_data), ctl -> 'sealed', (ctl ->> 'now')::timestamptz)"
        " ON CONFLICT (command, scope, key) DO UPDATE SET"
        " input_digest = EXCLUDED.input_digest, outcome = EXCLUDED.outcome,"
        " sealed = EXCLUDED.sealed, recorded_at = EXCLUDED.recorded_at;",
        "  RETURN jsonb_build_object('name', out_name, 'ok', out_ok, 'data', out_data"
        + "".join(f", {k}, {v}" for k, v in carried)
        + (f", 'emits', {events});" if emits else ");"),
    ]
