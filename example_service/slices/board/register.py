"""What the board slice registers beyond its declared data: its principal
fact loader (it reads the engine's database) and its erasure (the person's
memberships)."""

from __future__ import annotations

from functools import partial

from service_engine import Engine, Erase

from .domain import NOUN, Board, with_memberships

ERASED = "erased"
"""What an erased person's name is replaced with on a board or an invite."""


def register(engine: Engine) -> None:
    """The `BOARD_MEMBERSHIPS` fact loader: the boards the principal joined
    (one read for the principals resolved together)."""
    engine.register_principal_fact(partial(with_memberships, engine.db), many=True)


class BoardErasure:
    """Erasable: the person's board memberships go (their facts re-gated);
    a board belongs to its org, so a board they own or an invite they made
    or redeemed stays, its person named ``erased``. Each board they owned
    is re-offered (its published image loses their name) and re-rendered."""

    async def erase(self, cx: Erase, person: str) -> None:
        await cx.execute("DELETE FROM board_member WHERE person = $1", person)
        cx.impact_principal_facts(person, [NOUN])
        owned = await cx.fetch("SELECT id FROM board WHERE owner = $1", person)
        await cx.execute("UPDATE board SET owner = $2 WHERE owner = $1", person, ERASED)
        await cx.execute(
            "UPDATE board_invite SET created_by = $2 WHERE created_by = $1", person, ERASED
        )
        await cx.execute(
            "UPDATE board_invite SET redeemed_by = $2 WHERE redeemed_by = $1", person, ERASED
        )
        for row in owned:
            board_id = str(row["id"])
            cx.dirty_offer(Board, board_id)
            cx.impact(NOUN, board_id)
