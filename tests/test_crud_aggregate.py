"""`CrudStore.AGGREGATE`: a dataclass aggregate whose fields are the columns
gives its store ``COLUMNS``, `to_row` and `from_row`; a store with neither
the aggregate nor both mappings is refused when built."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

from service_engine import Aggregate, CrudStore
from service_engine.errors import DeclarationError


@dataclass
class Note(Aggregate):
    id: str
    org: str
    body: str
    Store: ClassVar[Any]


class NoteStore(CrudStore[Note, str]):
    TABLE = "note"
    AGGREGATE = Note


def test_a_dataclass_aggregate_declares_the_columns_and_the_mapping() -> None:
    """The fields (not the ``Store`` class variable) are the columns; a note
    becomes its row and a row becomes an equal note."""
    store = NoteStore()
    note = Note("n1", "acme", "hello")
    assert NoteStore.COLUMNS == ("id", "org", "body")
    assert store.to_row(note) == {"id": "n1", "org": "acme", "body": "hello"}
    assert store.from_row({"id": "n1", "org": "acme", "body": "hello"}) == note
    assert store.key_of(note) == "n1"


def test_a_store_without_aggregate_or_mapping_is_refused() -> None:
    """Neither ``AGGREGATE`` nor `to_row` and `from_row`: `DeclarationError`
    naming both ways; a non-dataclass ``AGGREGATE`` is refused at the class."""

    class Bare(CrudStore[Note, str]):
        TABLE = "note"
        COLUMNS = ("id",)

    with pytest.raises(DeclarationError, match="AGGREGATE"):
        Bare()
    with pytest.raises(DeclarationError, match="dataclass"):

        class NotADataclass(CrudStore[Note, str]):
            TABLE = "note"
            AGGREGATE = str
