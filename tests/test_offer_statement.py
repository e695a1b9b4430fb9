"""The offer marks' literal statement (`offer_dirty_statement`): every value
dollar-quoted under a tag it cannot end early, so the statement can ride in
COMMIT's round trip without parameters."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from service_engine.offers.staging import DirtyMark, dollar_quoted, offer_dirty_statement


def _body(literal: str) -> str:
    """What Postgres's lexer reads from a dollar-quoted literal: from the
    opening tag to the first occurrence of the same tag after it."""
    tag = literal[: literal.index("$", 1) + 1]
    end = literal.index(tag, len(tag))
    assert end + len(tag) == len(literal), "text after the closing tag"
    return literal[len(tag):end]


@pytest.mark.parametrize("value", [
    "", "plain", "O'Brien", "back\\slash", '"json"', "$m0$", "ends $m0", "$m0$m1$",
    "$", "$$", "m0$", '{"a": "$m0$\\u0027"}',
])
def test_a_value_reads_back_whole(value: str) -> None:
    """Quotes, backslashes and the tags themselves end nothing early."""
    assert _body(dollar_quoted(value)) == value


@given(st.text(alphabet=st.characters(blacklist_characters="\x00")))
def test_any_text_reads_back_whole(value: str) -> None:
    """For any text without NUL, the literal's body is the text."""
    assert _body(dollar_quoted(value)) == value


def test_none_is_null_and_nul_is_refused() -> None:
    """A dollar-quoted None is NULL, and text holding a NUL byte is refused."""
    assert dollar_quoted(None) == "NULL"
    with pytest.raises(ValueError):
        dollar_quoted("a\x00b")


def test_the_statement_inlines_every_mark_and_nothing_when_empty() -> None:
    """One statement for the marks, in order; none for no marks."""
    assert offer_dirty_statement([]) == ""
    sql = offer_dirty_statement([
        DirtyMark("boards", "example.board.b-1", '"b-1"'),
        DirtyMark("boards", "example.board.b-2", None),
    ])
    assert "$m0$example.board.b-1$m0$, $m0$example.board.b-2$m0$" in sql
    assert '$m0$"b-1"$m0$, NULL' in sql
    assert sql.startswith("SELECT service_engine.mark_offers_dirty(") and "$1" not in sql
