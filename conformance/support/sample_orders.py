"""The orders sample of the inbound battery.

The ``orders`` service handles the ``order.place`` command: `place_order`
creates the order, records one effect row and emits ``order.placed`` as
its confirmation. A ``warehouse`` service publishes sequenced
``order.shipped`` / ``order.packed`` facts (sequence: the order id and a
version) that `on_shipped` / `on_packed` record as effects.

Every effect a reaction runs is one `Effect` row (``sample_order_effect``),
so a test counts how many times an effect landed and on which pod.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel

from service_engine import Projector, TableWindow, Unrestricted
from service_engine.inbound.declaration import InboundReaction
from service_engine.messaging.envelope import DeclaredSequence
from service_engine.messaging.reactions import Disposition, ReactionBudget, Retry
from service_engine.persistence import Aggregate, CrudStore
from service_engine.persistence.base import Row
from service_engine.pipeline import DatabaseError, Reaction

SERVICE = "orders"
WAREHOUSE = "warehouse"
NOUN = "order"


# -- wire payloads -------------------------------------------------------------------


class PlaceOrder(BaseModel):
    """The command ``integration.cmd.orders.order.place``."""

    SERVICE: ClassVar[str] = SERVICE
    AGGREGATE: ClassVar[str] = "order"
    VERB: ClassVar[str] = "place"
    VERSION: ClassVar[int] = 1

    order_id: str
    item: str = "widget"
    qty: int = 1

    def sequence(self) -> DeclaredSequence | None:
        return None


class OrderPlaced(BaseModel):
    """The confirmation ``integration.evt.orders.order.placed``."""

    AGGREGATE: ClassVar[str] = "order"
    FACT: ClassVar[str] = "placed"
    VERSION: ClassVar[int] = 1

    order_id: str
    qty: int

    def sequence(self) -> DeclaredSequence | None:
        return None


class _WarehouseFact(BaseModel):
    AGGREGATE: ClassVar[str] = "order"
    FACT: ClassVar[str]
    VERSION: ClassVar[int] = 1

    order_id: str
    version: int

    def sequence(self) -> DeclaredSequence | None:
        return DeclaredSequence(self.order_id, self.version)


class OrderShipped(_WarehouseFact):
    """``integration.evt.warehouse.order.shipped``, sequenced per order."""

    FACT: ClassVar[str] = "shipped"


class OrderPacked(_WarehouseFact):
    """``integration.evt.warehouse.order.packed``, sequenced per order."""

    FACT: ClassVar[str] = "packed"


class Fulfil(BaseModel):
    """A sequenced command the orders service sends the warehouse."""

    SERVICE: ClassVar[str] = WAREHOUSE
    AGGREGATE: ClassVar[str] = "order"
    VERB: ClassVar[str] = "fulfil"
    VERSION: ClassVar[int] = 1

    order_id: str
    version: int = 1

    def sequence(self) -> DeclaredSequence | None:
        return DeclaredSequence(self.order_id, self.version)


# -- aggregates ------------------------------------------------------------------------


@dataclass
class Order(Aggregate):
    id: str
    item: str
    qty: int
    status: str = "placed"

    Store: ClassVar[OrderStore]


class OrderStore(CrudStore[Order, str]):
    TABLE = "sample_order"
    COLUMNS = ("id", "item", "qty", "status")

    def to_row(self, order: Order) -> Mapping[str, object]:
        return {"id": order.id, "item": order.item, "qty": order.qty, "status": order.status}

    def from_row(self, row: Row) -> Order:
        return Order(row["id"], row["item"], row["qty"], row["status"])


Order.Store = OrderStore()


class OrdersView(Projector[Order, Order, Any, None]):
    """The orders, unrestricted: the projector that watches ``order`` (an
    engine refuses an impact on a noun no projector watches)."""

    NAME = "orders"
    NOUN = NOUN
    STORE = Order.Store
    VISIBILITY = Unrestricted()
    WINDOW = TableWindow("sample_order")

    def project(self, row: Order, principal: Any) -> Order:
        return row


@dataclass
class Effect(Aggregate):
    id: uuid.UUID
    reaction: str
    order_id: str
    message_id: uuid.UUID
    seq: int | None
    pod: str

    Store: ClassVar[EffectStore]


class EffectStore(CrudStore[Effect, uuid.UUID]):
    TABLE = "sample_order_effect"
    COLUMNS = ("id", "reaction", "order_id", "message_id", "seq", "pod")

    def to_row(self, e: Effect) -> Mapping[str, object]:
        return {
            "id": e.id, "reaction": e.reaction, "order_id": e.order_id,
            "message_id": e.message_id, "seq": e.seq, "pod": e.pod,
        }

    def from_row(self, row: Row) -> Effect:
        return Effect(
            row["id"], row["reaction"], row["order_id"], row["message_id"], row["seq"], row["pod"]
        )


Effect.Store = EffectStore()


@dataclass
class Prerequisite(Aggregate):
    order_id: str

    Store: ClassVar[PrerequisiteStore]


class PrerequisiteStore(CrudStore[Prerequisite, str]):
    TABLE = "sample_order_prerequisite"
    KEY = "order_id"
    COLUMNS = ("order_id",)

    def to_row(self, p: Prerequisite) -> Mapping[str, object]:
        return {"order_id": p.order_id}

    def from_row(self, row: Row) -> Prerequisite:
        return Prerequisite(row["order_id"])


Prerequisite.Store = PrerequisiteStore(lock_rows=False)


async def record_effect(
    cx: Reaction[Any], reaction: str, order_id: str, pod: str = "", seq: int | None = None
) -> None:
    """One effect row, written in the reaction's transaction."""
    await cx.create(Effect(uuid.uuid4(), reaction, order_id, cx.message_id, seq, pod))


# -- reactions -------------------------------------------------------------------------

Hook = Callable[[Reaction[Any], BaseModel], Awaitable[Disposition | None]]


def place_order(
    pod: str = "",
    *,
    before: Hook | None = None,
    budget: ReactionBudget | None = None,
    concurrency: int = 16,
    name: str = "place_order",
) -> InboundReaction[PlaceOrder]:
    """``order.place``: create the order (unless it exists), record the
    effect (every time it runs: the engine's claim, not the handler, makes
    it exactly once), confirm ``order.placed``.

    A database fault is mapped coarsely to `Retry`, as a careless slice
    would: the engine must still treat an integrity violation as terminal.
    ``before`` runs first and may answer a disposition (test behaviour).
    """

    async def handle(cx: Reaction[Any], command: PlaceOrder) -> Disposition | None:
        if before is not None:
            answer = await before(cx, command)
            if answer is not None:
                return answer
        try:
            existing = await cx.load_optional(Order, command.order_id)
            if existing is None:
                await cx.create(Order(command.order_id, command.item, command.qty))
            # Recorded on every run, so a second run of the effect shows.
            await record_effect(cx, name, command.order_id, pod)
        except DatabaseError as exc:
            return Retry("store", str(exc))
        cx.emit(OrderPlaced(order_id=command.order_id, qty=command.qty))
        cx.impact(NOUN, command.order_id)
        return None

    return InboundReaction.command(
        name, aggregate="order", verb="place", payload=PlaceOrder, handler=handle,
        budget=budget, concurrency=concurrency,
    )


def on_warehouse_fact(
    fact: type[_WarehouseFact], name: str, pod: str = "", *, budget: ReactionBudget | None = None
) -> InboundReaction[Any]:
    """Record each sequenced warehouse fact of ``fact`` as an effect."""

    async def handle(cx: Reaction[Any], event: _WarehouseFact) -> None:
        await record_effect(cx, name, event.order_id, pod, event.version)

    return InboundReaction.event(
        name, producer=WAREHOUSE, aggregate="order", fact=fact.FACT, payload=fact,
        handler=handle, budget=budget,
    )
