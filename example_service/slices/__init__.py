"""The service's slices, each listed once.

Every slice is a folder here exposing ``SLICE`` (a `SliceFragment`); this
list is the only place a slice is named. Remove a slice by deleting its
folder and its line below: no kernel, ``register`` or ``graphql`` edit.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib import import_module

from service_engine.commands import CheckedCommand
from service_engine.graphql import ComposedService, SliceFragment, compose_service

SLICES: tuple[str, ...] = (
    "board",
    "card",
    "ledger",
    "operator",
    "reply",
    "roster",
)


def slice_fragment(name: str) -> SliceFragment:
    """The `SliceFragment` of the slice folder ``name``."""
    fragment: SliceFragment = import_module(f"{__name__}.{name}").SLICE
    return fragment


def compose(names: Iterable[str] = SLICES) -> ComposedService:
    """The service composed from the slices ``names`` (default: all of them)."""
    return compose_service([slice_fragment(name) for name in names])


def commands(names: Iterable[str] = SLICES) -> tuple[CheckedCommand, ...]:
    """The declared commands of the slices ``names`` (each slice's
    ``COMMANDS``, where it declares any): the schema owner installs their
    functions when the service migrates (`install_commands`)."""
    found: list[CheckedCommand] = []
    for name in names:
        found.extend(getattr(import_module(f"{__name__}.{name}"), "COMMANDS", ()))
    return tuple(found)


SERVICE = compose()
