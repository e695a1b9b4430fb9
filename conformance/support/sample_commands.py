"""The command-layer sample: projects, tasks and steps, declared once.

Every entity is partitioned by ``org`` with the conflict key ``id``: its
store key (and table primary key) is the complete key ``[org, id]``, so
two orgs may hold the same id and never contend.

* `Project` (``cmd_project``): deletable while no task references it
  (``restrict`` through ``Task.by_project``) by a member of its org;
* `Task` (``cmd_task``): a workflow (``queued`` → ``running`` → ``done``),
  a unique title per org, a required relationship to its project, an update
  row policy (the caller's org; a locked task only for an admin) that its
  delete obeys too, deletable with a ``cascade`` of at most `MAX_STEPS`
  steps;
* `Step` (``cmd_step``): references its task, ``no_inbound``; a ``pinned``
  step is deleted (by its task's cascade) only by an admin.

`COMMANDS` holds the checked commands; `runner_for` a `CommandRunner`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ClassVar, Literal
from uuid import UUID

import asyncpg

from service_engine import Database, EngineConfig
from service_engine.commands import (
    TRANSACTION_TIME,
    UUID_V7,
    And,
    Cascade,
    CascadeEdge,
    Catalog,
    Caused,
    CheckedCommand,
    Command,
    CommandConfig,
    CommandRunner,
    Const,
    Create,
    Delete,
    Entity,
    Eq,
    Fact,
    Field,
    IdempotencyKey,
    IndexRef,
    Input,
    Mutate,
    NoInbound,
    Not,
    Or,
    Outcome,
    Read,
    Relationship,
    Require,
    Restrict,
    Return,
    ReverseIndex,
    Row,
    RowPolicy,
    Service,
    Set,
    Transition,
    Unique,
    Var,
    Workflow,
    WorkflowTransition,
    install_commands,
    row_policy_gate,
)
from service_engine.db.types import Conn
from service_engine.gates import Reason
from service_engine.metrics import Metrics
from service_engine.persistence import Aggregate, Style
from service_engine.pipeline import MutationExecutor

MAX_STEPS = 3
"""The cascade maximum of a task's steps."""

TASK_UPDATE = RowPolicy(
    And(Eq(Row("org"), Fact("org")), Or(Not(Row("locked")), Fact("admin"))),
    Reason("task.update_denied", "a task of your org; a locked one only for an admin"),
)
TASK_FIELDS = ("org", "id", "project_id", "title", "state", "locked", "version")
STEP_DELETE = RowPolicy(
    And(Eq(Row("org"), Fact("org")), Or(Not(Row("pinned")), Fact("admin"))),
    Reason("step.delete_denied", "a step of your org; a pinned one only for an admin"),
)
PROJECT_DELETE = RowPolicy(Eq(Row("org"), Fact("org")),
                           Reason("project.other_org", "a project of your org"))
FACTS: Mapping[str, object] = {"org": str | None, "admin": bool, "id": str}
"""The principal facts the sample's commands and policies read."""
TaskState = Literal["queued", "running", "done"]


@dataclass(frozen=True)
class Principal:
    id: str
    org: str | None = "acme"
    admin: Any = False


ALICE = Principal("alice")
ROOT = Principal("root", admin=True)
EVE = Principal("eve", org="umbrella")


class OrgStore:
    """A table keyed by the complete key ``(org, id)``: the store key is
    ``[org, id]``. ``lock_rows=False`` loads without pinning the row (a
    store without row locks; the command layer's read dependency still
    keeps a checked transition from losing a write)."""

    STYLE: ClassVar[Style] = Style.CRUD
    TABLE: ClassVar[str]
    COLUMNS: ClassVar[tuple[str, ...]]

    def __init__(self, *, lock_rows: bool = True, store_type: str | None = None) -> None:
        self.lock_rows = lock_rows
        self._store_type = store_type or f"sample.{self.TABLE}"
        cols = ", ".join(self.COLUMNS)
        self._select = f"SELECT {cols} FROM {self.TABLE} WHERE org = $1 AND id = $2"
        others = [c for c in self.COLUMNS if c not in ("org", "id")]
        self._update = (
            f"UPDATE {self.TABLE} SET "
            + ", ".join(f"{c} = ${n}" for n, c in enumerate(others, start=3))
            + " WHERE org = $1 AND id = $2"
        )
        self._others = others

    @property
    def store_type(self) -> str:
        return self._store_type

    def to_row(self, aggregate: Any) -> Mapping[str, object]:
        return {c: getattr(aggregate, c) for c in self.COLUMNS}

    def from_row(self, row: Mapping[str, Any]) -> Any:
        raise NotImplementedError

    def key_of(self, aggregate: Any) -> list[str]:
        return [aggregate.org, aggregate.id]

    async def load(self, conn: Conn, key: Sequence[str]) -> Any:
        row = await conn.fetchrow(self._select, key[0], key[1])
        return None if row is None else self.from_row(dict(row))

    async def load_locked(self, conn: Conn, key: Sequence[str]) -> Any:
        sql = self._select + (" FOR UPDATE" if self.lock_rows else "")
        row = await conn.fetchrow(sql, key[0], key[1])
        return None if row is None else self.from_row(dict(row))

    async def read_many(self, conn: Conn, keys: Sequence[Sequence[str]]) -> list[Any]:
        found = [await self.load(conn, key) for key in keys]
        return [a for a in found if a is not None]

    async def lock(self, conn: Conn, key: Sequence[str]) -> None:
        if self.lock_rows:
            await conn.execute(f"SELECT 1 FROM {self.TABLE} WHERE org = $1 AND id = $2"
                               " FOR UPDATE", key[0], key[1])

    async def create(self, conn: Conn, aggregate: Any) -> None:
        row = self.to_row(aggregate)
        cols = ", ".join(self.COLUMNS)
        values = ", ".join(f"${n}" for n in range(1, len(self.COLUMNS) + 1))
        await conn.execute(f"INSERT INTO {self.TABLE} ({cols}) VALUES ({values})",
                           *(row[c] for c in self.COLUMNS))

    async def save(self, conn: Conn, aggregate: Any) -> None:
        row = self.to_row(aggregate)
        await conn.execute(self._update, row["org"], row["id"], *(row[c] for c in self._others))

    async def delete(self, conn: Conn, aggregate: Any) -> None:
        await conn.execute(f"DELETE FROM {self.TABLE} WHERE org = $1 AND id = $2",
                           aggregate.org, aggregate.id)


@dataclass
class Project(Aggregate):
    org: str
    id: str
    name: str
    version: int = 1

    Store: ClassVar[ProjectStore]

    can_delete = row_policy_gate("delete", PROJECT_DELETE, ("org", "id", "name", "version"))


class ProjectStore(OrgStore):
    TABLE = "cmd_project"
    COLUMNS = ("id", "org", "name", "version")

    def from_row(self, row: Mapping[str, Any]) -> Project:
        return Project(row["org"], row["id"], row["name"], row["version"])


Project.Store = ProjectStore()


@dataclass
class Task(Aggregate):
    org: str
    id: str
    project_id: str
    title: str
    state: TaskState
    locked: bool = False
    execution_id: UUID | None = None
    started_at: datetime | None = None
    version: int = 1

    Store: ClassVar[TaskStore]

    can_update = row_policy_gate("update", TASK_UPDATE, TASK_FIELDS)
    can_delete = row_policy_gate("delete", TASK_UPDATE, TASK_FIELDS)


class TaskStore(OrgStore):
    TABLE = "cmd_task"
    COLUMNS = (
        "id", "org", "project_id", "title", "state", "locked", "execution_id", "started_at",
        "version",
    )

    def from_row(self, row: Mapping[str, Any]) -> Task:
        return Task(
            row["org"], row["id"], row["project_id"], row["title"], row["state"], row["locked"],
            row["execution_id"], row["started_at"], row["version"],
        )


Task.Store = TaskStore()


@dataclass
class Step(Aggregate):
    org: str
    id: str
    task_id: str
    label: str
    pinned: bool = False
    version: int = 1

    Store: ClassVar[StepStore]

    can_delete = row_policy_gate("delete", STEP_DELETE, ("org", "id", "pinned"))


class StepStore(OrgStore):
    TABLE = "cmd_step"
    COLUMNS = ("id", "org", "task_id", "label", "pinned", "version")

    def from_row(self, row: Mapping[str, Any]) -> Step:
        return Step(row["org"], row["id"], row["task_id"], row["label"], row["pinned"],
                    row["version"])


Step.Store = StepStore()


PROJECT = Entity(
    "Project", Project, key=("org", "id"), partition_by=("org",), conflict_key=("id",),
    revision="version",
    delete_policy=Restrict((IndexRef("Task", "by_project"),)),
    create_policy=RowPolicy(Eq(Row("org"), Fact("org")),
                            Reason("project.other_org", "a project is created in your org")),
    delete_row_policy=PROJECT_DELETE,
    nouns=("cmd_project",),
)
TASK = Entity(
    "Task", Task, key=("org", "id"), partition_by=("org",), conflict_key=("id",),
    revision="version",
    unique=(Unique("by_title", ("org", "title")),),
    relationships=(Relationship("project", "Project", ("org", "project_id")),),
    indexes=(ReverseIndex("by_project", ("org", "project_id"), table="cmd_task"),),
    delete_policy=Cascade((CascadeEdge("Step", "task", "by_task", MAX_STEPS),)),
    update_policy=TASK_UPDATE,
    nouns=("cmd_task",),
)
STEP = Entity(
    "Step", Step, key=("org", "id"), partition_by=("org",), conflict_key=("id",),
    revision="version",
    relationships=(Relationship("task", "Task", ("org", "task_id")),),
    indexes=(ReverseIndex("by_task", ("org", "task_id"), table="cmd_step"),),
    delete_policy=NoInbound(),
    delete_row_policy=STEP_DELETE,
)
LIFECYCLE = Workflow(
    "TaskLifecycle", "Task", "state", ("queued", "running", "done"),
    (WorkflowTransition("Start", ("queued",), "running"),
     WorkflowTransition("Finish", ("running",), "done")),
)
CATALOG = Catalog([PROJECT, TASK, STEP], [LIFECYCLE], FACTS)

KEY = Input("request_key", str, max_length=128)
ORG = Input("org", str)

CREATE_PROJECT = Command(
    "CreateProject",
    KEY, ORG, Input("project_id", str), Input("name", str),
    IdempotencyKey("request_key"),
    Create("Project", (Var("org"), Var("project_id")), as_="project",
           else_=Outcome("ProjectExists")),
    Set("project", "name", Var("name")),
    Return("Created", project_id=Field("project", "id")),
)
CREATE_TASK = Command(
    "CreateTask",
    KEY, ORG, Input("task_id", str), Input("project_id", str), Input("title", str),
    Service("created_id", UUID_V7),
    IdempotencyKey("request_key"),
    Read("Project", (Var("org"), Var("project_id")), as_="project",
         else_=Outcome("ProjectMissing")),
    Create("Task", (Var("org"), Var("task_id")), as_="task", else_=Outcome("TaskExists"),
           taken={"by_title": Outcome("TitleTaken")}),
    Set("task", "project_id", Var("project_id")),
    Set("task", "title", Var("title")),
    Set("task", "state", Const("queued")),
    Set("task", "locked", Const(False)),
    Set("task", "execution_id", Var("created_id")),
    Set("task", "started_at", Const(None)),
    Return("Created", task_id=Field("task", "id"), revision=Field("task", "version"),
           created_id=Var("created_id")),
)
START_TASK = Command(
    "StartTask",
    KEY, ORG, Input("task_id", str), Input("expected_revision", int),
    Service("execution_id", UUID_V7),
    Service("started_at", TRANSACTION_TIME),
    IdempotencyKey("request_key"),
    Mutate("Task", (Var("org"), Var("task_id")), as_="task", else_=Outcome("Missing")),
    Transition("TaskLifecycle.Start", on="task", revision=Var("expected_revision"),
               stale=Outcome("StaleRevision"), illegal=Outcome("IllegalState")),
    Set("task", "execution_id", Var("execution_id")),
    Set("task", "started_at", Var("started_at")),
    Return("Started", revision=Field("task", "version"), execution_id=Var("execution_id"),
           started_at=Var("started_at")),
)
FINISH_TASK = Command(
    "FinishTask",
    ORG, Input("task_id", str), Input("expected_revision", int),
    Mutate("Task", (Var("org"), Var("task_id")), as_="task", else_=Outcome("Missing")),
    Require("Unlocked", Not(Field("task", "locked")), else_=Outcome("Locked")),
    Transition("TaskLifecycle.Finish", on="task", revision=Var("expected_revision"),
               stale=Outcome("StaleRevision"), illegal=Outcome("IllegalState")),
    Return("Finished", revision=Field("task", "version")),
)
RENAME_TASK = Command(
    "RenameTask",
    ORG, Input("task_id", str), Input("title", str),
    Mutate("Task", (Var("org"), Var("task_id")), as_="task", else_=Outcome("Missing"),
           taken={"by_title": Outcome("TitleTaken")}),
    # A rename replaces the title whatever it was: a deliberate overwrite.
    Set("task", "title", Var("title"), overwrite=True),
    Caused("task", "cmd_task", "task.renamed", {"title": Var("title")}),
    Return("Renamed", revision=Field("task", "version")),
)
LOCK_TASK = Command(
    "LockTask",
    ORG, Input("task_id", str), Input("locked", bool),
    Mutate("Task", (Var("org"), Var("task_id")), as_="task", else_=Outcome("Missing")),
    Set("task", "locked", Var("locked"), overwrite=True),
    Return("Locked"),
)
LOCK_PAIR = Command(
    "LockPair",
    ORG, Input("first", str), Input("second", str),
    Mutate("Task", (Var("org"), Var("first")), as_="a", else_=Outcome("FirstMissing")),
    Mutate("Task", (Var("org"), Var("second")), as_="b", else_=Outcome("SecondMissing")),
    Set("a", "locked", Const(True), overwrite=True),
    Set("b", "locked", Const(True), overwrite=True),
    Return("Locked"),
)
SWAP_TITLES = Command(
    "SwapTitles",
    ORG, Input("first", str), Input("second", str),
    Mutate("Task", (Var("org"), Var("first")), as_="a", else_=Outcome("FirstMissing"),
           taken={"by_title": Outcome("FirstTaken")}),
    Mutate("Task", (Var("org"), Var("second")), as_="b", else_=Outcome("SecondMissing"),
           taken={"by_title": Outcome("SecondTaken")}),
    # Each takes the other's title as read under both locks in this
    # transaction: a deliberate replacement of both (the unique claims keep
    # the titles distinct), not a lost update.
    Set("a", "title", Field("b", "title"), overwrite=True),
    Set("b", "title", Field("a", "title"), overwrite=True),
    Return("Swapped"),
)
ADD_STEP = Command(
    "AddStep",
    ORG, Input("task_id", str), Input("step_id", str), Input("label", str),
    Read("Task", (Var("org"), Var("task_id")), as_="task", else_=Outcome("TaskMissing")),
    Create("Step", (Var("org"), Var("step_id")), as_="step", else_=Outcome("StepExists")),
    Set("step", "task_id", Var("task_id")),
    Set("step", "label", Var("label")),
    Return("Added"),
)
PIN_STEP = Command(
    "PinStep",
    ORG, Input("step_id", str), Input("expected_revision", int),
    Mutate("Step", (Var("org"), Var("step_id")), as_="step", else_=Outcome("Missing")),
    Require("Current", Eq(Field("step", "version"), Var("expected_revision")),
            else_=Outcome("StaleRevision")),
    # Fenced: the caller's revision was compared with the row's.
    Set("step", "pinned", Const(True)),
    Return("Pinned", revision=Field("step", "version")),
)
DELETE_PROJECT = Command(
    "DeleteProject",
    ORG, Input("project_id", str),
    Mutate("Project", (Var("org"), Var("project_id")), as_="project",
           else_=Outcome("Missing")),
    Delete("project", referenced=Outcome("Referenced")),
    Return("Deleted"),
)
DELETE_TASK = Command(
    "DeleteTask",
    ORG, Input("task_id", str),
    Mutate("Task", (Var("org"), Var("task_id")), as_="task", else_=Outcome("Missing")),
    Delete("task", too_many=Outcome("TooManySteps")),
    Return("Deleted"),
)

COMMANDS: dict[str, CheckedCommand] = {
    decl.name: CATALOG.command(decl)
    for decl in (
        CREATE_PROJECT, CREATE_TASK, START_TASK, FINISH_TASK, RENAME_TASK, LOCK_TASK,
        LOCK_PAIR, SWAP_TITLES, ADD_STEP, PIN_STEP, DELETE_PROJECT, DELETE_TASK,
    )
}


def executor_for(db: Database, **config: Any) -> MutationExecutor:
    settings = {"service": "sample", "lock_timeout": timedelta(seconds=5), **config}
    return MutationExecutor(db, EngineConfig(**settings), Metrics("sample", "pod-1"))


def runner_for(db: Database, **config: Any) -> CommandRunner:
    return CommandRunner(executor_for(db), CommandConfig(**config))


async def install(owner_url: str, *commands: CheckedCommand) -> None:
    """Install ``commands``' functions as the schema owner (what the service's
    migrate does): a test declaring commands of its own runs this first."""
    owner = await asyncpg.connect(owner_url)
    try:
        await install_commands(owner, commands)
    finally:
        await owner.close()


async def install_samples(owner: Any) -> None:
    """The sample `COMMANDS`' functions, on the owner's connection (the
    session template's setup)."""
    await install_commands(owner, COMMANDS.values())


ALL_COMMANDS = tuple(COMMANDS.values())
"""The sample's commands, for ``service-engine migrate --commands``."""
