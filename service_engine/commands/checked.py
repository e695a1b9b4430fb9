"""The checked form of a command (what registration answers and the
compiler and interpreter read): a pure value."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from .declaration import (
    Binding,
    Caused,
    Command,
    Create,
    Delete,
    Emit,
    Entity,
    Input,
    Mutate,
    Permit,
    Record,
    Require,
    Return,
    Service,
    Set,
    Transition,
    Workflow,
    WorkflowTransition,
)

__all__ = ["CheckedCommand", "DeleteStep", "EntityCatalog", "TransitionStep"]


class EntityCatalog(Protocol):
    """What a checked command reads of its catalog (`check.Catalog`)."""

    @property
    def entities(self) -> Mapping[str, Entity]: ...


@dataclass(frozen=True, slots=True)
class TransitionStep:
    clause: Transition
    workflow: Workflow
    move: WorkflowTransition


@dataclass(frozen=True, slots=True)
class DeleteStep:
    clause: Delete
    entity: Entity


@dataclass(frozen=True, slots=True)
class CheckedCommand:
    """A command that passed registration: what the runner executes."""

    declaration: Command
    inputs: tuple[Input, ...]
    services: tuple[Service, ...]
    idempotency_key: str | None
    bindings: tuple[Binding, ...]
    entities: Mapping[str, Entity]
    """The entity of each binding, by binding name."""
    requirements: tuple[Require | Permit, ...]
    effects: tuple[Set | Transition | Delete | Record | Caused | Emit, ...]
    transitions: Mapping[str, TransitionStep]
    """The transition of each binding that has one."""
    deletes: Mapping[str, DeleteStep]
    returns: Return
    outcomes: frozenset[str]
    catalog: EntityCatalog

    @property
    def name(self) -> str:
        return self.declaration.name

    @property
    def written(self) -> tuple[Binding, ...]:
        return tuple(b for b in self.bindings if isinstance(b, Mutate | Create))
