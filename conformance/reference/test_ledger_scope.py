"""The reference ledger slice's erase scope, end to end: the slice
contributes `LEDGER_ERASE`, the running engine declares it to Identity
before it reports UP, and the scope-gated ``eraseLedgerPerson`` runs
through the write pipeline (the log rewrite and the views' reset commit in
one transaction) so a live window re-renders without the person."""

from __future__ import annotations

from example_service.graphql import build_app
from example_service.register import register
from example_service.slices import compose
from example_service.slices.ledger.commands import open_ledger, post_to_ledger
from example_service.slices.ledger.domain import LEDGER_ERASE, NOUN
from service_engine import Engine, ReadinessHandle, connect_pool
from service_engine.embedded import EmbeddedNats, ProvisionedDatabase
from service_engine.graphql import Passport
from service_engine.impacts import ImpactKind
from service_engine.messaging.nats import open_nats
from service_engine.scopes.identity import ScopeIdentity, known_scopes

from ..support.example_support import Running, example_config, person, serving_engine
from ..support.nats_support import engine_nats
from ..support.sample_counter import listen_impacts

ERASE = """mutation($p: String!) { eraseLedgerPerson(person: $p) {
    success ledgers error { code } } }"""
VIEW = "name owner recent { memo by }"
LEDGERS = (f"subscription {{ ledgers {{ __typename ... on LedgersReset {{ revision "
           f"views {{ {VIEW} }} }} ... on LedgersUpsert {{ revision view {{ {VIEW} }} }} }} }}")



async def test_ledger_contributes_its_erase_scope(
    store: ProvisionedDatabase, nats_server: EmbeddedNats
) -> None:
    """The ledger slice contributes ``ledger:erase``: the running engine's
    declaration to Identity names it and the pod is UP only once Identity
    confirmed it. A principal holding the granted scope erases a person
    over GraphQL: the rewrite and one projector-reset impact of the ledger
    noun commit together, and the live window re-renders without them; a
    principal without the scope is refused and nothing changes."""
    identity_conn = await open_nats(nats_server.url)
    identity = await ScopeIdentity(
        identity_conn.client, known_scopes({LEDGER_ERASE})
    ).start()
    db = await connect_pool(store.app_url, max_size=10)
    try:
        async with engine_nats(nats_server) as nats:
            readiness = ReadinessHandle()
            engine = await Engine.boot(example_config(), db, nats, readiness)
            service = compose(("ledger",))
            register(engine, service)
            declaration = engine.declare_contributed_scopes()
            assert declaration is not None and declaration.scopes == (LEDGER_ERASE,)
            async with serving_engine(engine, build_app(engine, service)) as (addr, http):
                run = Running(engine, db, service, readiness, addr, http)
                assert [r.declaration.scopes for r in identity.requests] == [(LEDGER_ERASE,)]
                executor = engine.mutation_executor()
                alice = person("alice")
                await executor.execute(alice, open_ledger, "live")
                await executor.execute(alice, post_to_ledger, "live", 30, "alice's lunch")

                carol = Passport(sub="carol", org="acme", roles=(LEDGER_ERASE,))
                async with run.socket(carol) as ws:
                    await ws.subscribe("l", LEDGERS)
                    reset = (await ws.next("l"))["ledgers"]
                    assert reset["views"][0]["owner"] == "alice"

                    async def erase(passport: Passport) -> dict[str, object]:
                        answer: dict[str, object] = (
                            await run.gql(ERASE, {"p": "alice"}, passport)
                        )["eraseLedgerPerson"]
                        return answer

                    refused = await erase(Passport(sub="bob", org="acme"))
                    assert refused == {"success": False, "ledgers": 0,
                                       "error": {"code": "ledger.erase_scope_required"}}
                    await ws.quiet(0.3)

                    async with listen_impacts(db) as probe:
                        assert await erase(carol) == {"success": True, "ledgers": 1, "error": None}
                        impacts = await probe.next()
                    assert [(i.kind, i.noun) for i in impacts] == [
                        (ImpactKind.PROJECTOR_RESET, NOUN)
                    ]
                    again = (await ws.next("l"))["ledgers"]
                    assert again["revision"] == reset["revision"] + 1
                    shown = again["view"] if again["__typename"] == "LedgersUpsert" \
                        else again["views"][0]
                    assert shown == {"name": "live", "owner": "erased",
                                     "recent": [{"memo": "", "by": "erased"}]}
                    # Erasing again touches nothing and resets nothing.
                    assert await erase(carol) == {"success": True, "ledgers": 0, "error": None}
                    await ws.quiet(0.3)
    finally:
        await db.aclose()
        await identity.aclose()
        await identity_conn.aclose()
