"""`CrudStore.AGGREGATE`: a dataclass aggregate whose fields are the columns
gives its store ``COLUMNS``, `to_row` and `from_row`; a store with neither
the aggregate nor both mappings is refused when built."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, cast

import pytest

from service_engine import Aggregate, CrudStore
from service_engine.errors import ConfigError, DeclarationError


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


class OrgNoteStore(CrudStore[Note, str]):
    TABLE = "note"
    AGGREGATE = Note

    def settings(self, aggregate: Note) -> dict[str, str]:
        return {"app.current_org_id": aggregate.org, "app.tag": "it's $m0$"}


def test_settings_are_one_statement_of_dollar_quoted_literals() -> None:
    """A store's settings become one ``SELECT set_config(..., true), ...``
    whose every name and value is a dollar-quoted literal (a value holding
    the quote's own tag gets another tag); a store without settings sends
    none, and a pinned save carries them in front of its UPDATE."""
    note = Note("n1", "acme", "hello")
    sql = OrgNoteStore().settings_sql(note)
    assert sql == ("SELECT set_config($m0$app.current_org_id$m0$, $m0$acme$m0$, true), "
                   "set_config($m0$app.tag$m0$, $m1$it's $m0$$m1$, true)")
    assert NoteStore().settings_sql(note) == ""
    later = OrgNoteStore().save_later(note)
    assert later is not None and later.inlined.startswith(f"{sql}; UPDATE \"note\"")
    plain = NoteStore().save_later(note)
    assert plain is not None and plain.inlined.startswith('UPDATE "note"')


def test_settings_that_are_not_text_are_refused_with_the_store_named() -> None:
    """A setting's name and value are text without NUL; anything else is a
    `DeclarationError` naming the store, before anything is sent."""

    class Numbered(NoteStore):
        def settings(self, aggregate: Note) -> dict[str, Any]:
            return {"app.current_org_id": 7}

    class Nul(NoteStore):
        def settings(self, aggregate: Note) -> dict[str, str]:
            return {"app.current_org_id": "a\x00b"}

    class NulName(NoteStore):
        def settings(self, aggregate: Note) -> dict[str, str]:
            return {"app.\x00": "acme"}

    class NoneToday(NoteStore):
        def settings(self, aggregate: Note) -> dict[str, str]:
            return {}

    assert NoneToday().settings_sql(Note("n1", "acme", "hello")) == ""
    for store in (Numbered(), Nul(), NulName()):
        with pytest.raises(DeclarationError, match=type(store).__qualname__):
            store.settings_sql(Note("n1", "acme", "hello"))


def test_only_the_stores_own_writes_are_inlined() -> None:
    """The inlined insert, update and delete read the row from one JSON
    literal; a subclass with its own `create`, `save` or `delete` keeps it
    (None), and so does a value JSON has no exact text for."""

    class Own(NoteStore):
        async def create(self, conn: Any, aggregate: Note) -> None: ...
        async def save(self, conn: Any, aggregate: Note) -> None: ...
        async def delete(self, conn: Any, aggregate: Note) -> None: ...

    note = Note("n1", "acme", "hello")
    store = NoteStore()
    assert store.create_inlined(note) == (
        'INSERT INTO "note" ("id", "org", "body") SELECT __r."id", __r."org", __r."body" '
        'FROM json_populate_record(NULL::"note", '
        '$m0${"id":"n1","org":"acme","body":"hello"}$m0$::json) AS __r'
    )
    assert store.delete_inlined(note) == (
        'DELETE FROM "note" AS __t USING json_populate_record(NULL::"note", '
        '$m0${"id":"n1"}$m0$::json) AS __r WHERE __t."id" = __r."id"'
    )
    own = Own()
    assert (own.create_inlined(note), own.save_inlined(note), own.delete_inlined(note)) == (
        None, None, None)
    assert store.create_inlined(Note("n1", "acme", cast(Any, float("nan")))) is None
    assert store.delete_inlined(Note(cast(Any, float("nan")), "acme", "hello")) is None


def test_an_inlined_write_needs_every_column_of_its_row() -> None:
    """A `to_row` that leaves a column out is a `ConfigError` naming the
    store and the columns, before anything is sent."""

    class Short(NoteStore):
        def to_row(self, aggregate: Note) -> dict[str, object]:
            return {"id": aggregate.id}

    with pytest.raises(ConfigError, match=r"\.Short\.to_row lacks columns \['org', 'body'\]$"):
        Short().create_inlined(Note("n1", "acme", "hello"))


def test_the_error_table_is_the_table_without_its_schema() -> None:
    """A constraint error names its table without the schema: the store's
    ``TABLE`` as the driver reports it."""

    class Qualified(NoteStore):
        TABLE = "app.notes"

    assert NoteStore().error_table == NoteStore.TABLE
    assert Qualified().error_table == "notes"
