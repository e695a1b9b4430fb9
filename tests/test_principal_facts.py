"""The principal fact loaders: the principals asked for in one loop turn
load together (a ``many`` loader called once for them all), in
registration order, fail-closed per principal."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, cast

import pytest

from service_engine.failures import ConfigError
from service_engine.principal_facts import PrincipalFactLoaders, PrincipalFactLoadFailed


@dataclasses.dataclass(frozen=True)
class Who:
    id: str
    facts: tuple[str, ...] = ()


def with_fact(who: Who, fact: str) -> Who:
    return dataclasses.replace(who, facts=(*who.facts, fact))


async def test_one_turn_is_one_call_of_a_many_loader() -> None:
    """Principals asked for in the same loop turn reach a ``many`` loader
    in one call, and each caller gets its own principal back with its fact."""
    calls: list[list[str]] = []

    async def teams(principals: list[Who]) -> list[Who]:
        calls.append([p.id for p in principals])
        return [with_fact(p, f"team:{p.id}") for p in principals]

    loaders = PrincipalFactLoaders()
    loaders.register(teams, many=True)
    loaded = await asyncio.gather(*(loaders.load(Who(name)) for name in ("a", "b", "c")))
    assert loaded == [Who("a", ("team:a",)), Who("b", ("team:b",)), Who("c", ("team:c",))]
    assert calls == [["a", "b", "c"]]
    # A later turn is a batch of its own.
    assert await loaders.load(Who("d")) == Who("d", ("team:d",))
    assert calls[-1] == ["d"]


async def test_loaders_run_in_registration_order_over_the_batch() -> None:
    """A single-principal loader and a ``many`` loader both run, in the
    order they were registered, each seeing what the one before added."""
    seen: list[tuple[str, tuple[str, ...]]] = []

    async def first(who: Who) -> Who:
        seen.append(("first", who.facts))
        return with_fact(who, "one")

    async def second(principals: list[Who]) -> list[Who]:
        seen.extend(("second", p.facts) for p in principals)
        return [with_fact(p, "two") for p in principals]

    loaders = PrincipalFactLoaders()
    loaders.register(first)
    loaders.register(second, many=True)
    loaded = await asyncio.gather(loaders.load(Who("a")), loaders.load(Who("b")))
    assert [w.facts for w in loaded] == [("one", "two"), ("one", "two")]
    assert seen == [("first", ()), ("first", ()), ("second", ("one",)), ("second", ("one",))]


async def test_a_failed_batch_refuses_only_the_principal_whose_own_load_fails() -> None:
    """When a ``many`` loader raises for a batch, each principal is loaded
    again alone: the one whose own load fails is refused with
    `PrincipalFactLoadFailed`, the others are served."""
    calls: list[list[str]] = []

    async def teams(principals: list[Who]) -> list[Who]:
        calls.append([p.id for p in principals])
        if any(p.id == "bad" for p in principals):
            raise RuntimeError("the fact table is unreachable")
        return [with_fact(p, "team") for p in principals]

    loaders = PrincipalFactLoaders()
    loaders.register(teams, many=True)
    results = await asyncio.gather(
        loaders.load(Who("a")), loaders.load(Who("bad")), loaders.load(Who("c")),
        return_exceptions=True)
    assert results[0] == Who("a", ("team",)) and results[2] == Who("c", ("team",))
    assert isinstance(results[1], PrincipalFactLoadFailed)
    assert "teams" in str(results[1]) and "RuntimeError" in str(results[1])
    assert calls[0] == ["a", "bad", "c"] and sorted(calls[1:]) == [["a"], ["bad"], ["c"]]


@pytest.mark.parametrize("answer", [
    lambda ps: ps[:-1],  # one short
    lambda ps: [None for _ in ps],  # nothing loaded
    lambda ps: None,  # not a list
])
async def test_a_wrong_answer_is_a_refusal(answer: object) -> None:
    """A ``many`` loader that answers a list of another length, a None in
    it, or no list at all refuses the principals (fail-closed)."""
    async def teams(principals: list[Who]) -> object:
        assert callable(answer)
        return answer(principals)

    loaders = PrincipalFactLoaders()
    loaders.register(teams, many=True)
    results = await asyncio.gather(loaders.load(Who("a")), loaders.load(Who("b")),
                                   return_exceptions=True)
    assert all(isinstance(r, PrincipalFactLoadFailed) for r in results), results


async def test_a_single_loader_answering_none_is_a_refusal() -> None:
    """A single-principal loader answering None refuses that principal."""
    async def nothing(who: Who) -> None:
        return None

    loaders = PrincipalFactLoaders()
    loaders.register(nothing)
    with pytest.raises(PrincipalFactLoadFailed, match="answered None"):
        await loaders.load(Who("a"))


async def test_a_cancelled_caller_leaves_the_batch_served() -> None:
    """A caller cancelled while its batch waits (its socket went away) is
    left out; the others of its turn are served."""
    called = asyncio.Event()
    release = asyncio.Event()

    async def slow(principals: list[Who]) -> list[Who]:
        assert [p.id for p in principals] == ["gone", "kept"]  # one batch of both
        called.set()
        await release.wait()
        return [with_fact(p, "x") for p in principals]

    loaders = PrincipalFactLoaders()
    loaders.register(slow, many=True)
    gone = asyncio.ensure_future(loaders.load(Who("gone")))
    kept = asyncio.ensure_future(loaders.load(Who("kept")))
    await asyncio.wait_for(called.wait(), 5)  # the batch is loading
    gone.cancel()
    release.set()
    assert await kept == Who("kept", ("x",))
    assert gone.cancelled()


async def test_no_loader_answers_the_principal_as_it_is() -> None:
    """With no loader registered the principal is answered as given."""
    who = Who("a")
    assert await PrincipalFactLoaders().load(who) is who


def test_a_loader_registered_twice_is_refused() -> None:
    """The same loader registered twice, or a loader that is not callable,
    is a `ConfigError`."""
    async def teams(principals: list[Who]) -> list[Who]:
        return principals

    loaders = PrincipalFactLoaders()
    loaders.register(teams, many=True)
    with pytest.raises(ConfigError, match="twice"):
        loaders.register(teams)
    with pytest.raises(ConfigError, match="async callable"):
        loaders.register(cast(Any, "teams"))


async def test_an_inline_caller_loads_alone_in_its_own_task() -> None:
    """A caller the engine marks inline (its task holds a pool connection)
    runs the loaders in its own task, alone: a ``many`` loader gets a list
    of one, and its failure is raised to that caller."""
    tasks: list[tuple[asyncio.Task[object] | None, list[str]]] = []

    async def teams(principals: list[Who]) -> list[Who]:
        tasks.append((asyncio.current_task(), [p.id for p in principals]))
        if principals[0].id == "bad":
            raise RuntimeError("refused")
        return [with_fact(p, "team") for p in principals]

    loaders = PrincipalFactLoaders(inline=lambda: True)
    loaders.register(teams, many=True)

    async def caller(name: str) -> tuple[object, asyncio.Task[object] | None]:
        try:
            return await loaders.load(Who(name)), asyncio.current_task()
        except PrincipalFactLoadFailed as exc:
            return exc, asyncio.current_task()

    (a, task_a), (bad, _) = await asyncio.gather(caller("a"), caller("bad"))
    assert a == Who("a", ("team",))
    assert isinstance(bad, PrincipalFactLoadFailed)
    assert isinstance(bad.__cause__, RuntimeError)
    assert [names for _, names in tasks] == [["a"], ["bad"]]
    assert tasks[0][0] is task_a
