"""A binding's key read from a principal fact of the wrong type, on both
paths of a declared command (real Postgres): the compiled function and the
interpreter answer alike, on the random comparison's declarations."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from service_engine.embedded import ProvisionedDatabase

from .test_commands_compiled import Grammar, _example


@pytest.mark.slow
def test_a_key_read_from_a_fact_of_the_wrong_type_names_no_row(
    database: ProvisionedDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A principal fact the service declares ``str`` but hands over as an int, read as a
    binding's key, names no row on either path: the compiled function and the interpreter
    both answer the binding's else outcome (the compiled function does not turn ``7`` into
    the key ``"7"``, the interpreter does not fail on the store)."""
    drawn = Grammar.principal
    monkeypatch.setattr(Grammar, "principal",
                        lambda self, side, org: replace(drawn(self, side, org), home=7))
    for seed in range(100, 120):
        asyncio.run(_example(database, seed))
