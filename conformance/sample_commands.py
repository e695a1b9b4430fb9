"""The command-layer sample: projects, tasks and steps, declared once.

* `Project` (``cmd_project``): partition ``org``, deletable while no task
  references it (``restrict`` through ``Task.by_project``);
* `Task` (``cmd_task``): partition ``org``, conflict key ``id``, a
  workflow (``queued`` → ``running`` → ``done``), a unique title per org,
  a required relationship to its project, an update row policy (the
  caller's org; a locked task only for an admin), deletable with a
  ``cascade`` of at most `MAX_STEPS` steps;
* `Step` (``cmd_step``): references its task, ``no_inbound``.

`COMMANDS` holds the checked commands; `runner_for` a `CommandRunner`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ClassVar
from uuid import UUID

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
    row_policy_gate,
)
from service_engine.gates import Reason
from service_engine.metrics import Metrics
from service_engine.persistence import Aggregate, CrudStore
from service_engine.pipeline import MutationExecutor

MAX_STEPS = 3
"""The cascade maximum of a task's steps."""

TASK_UPDATE = RowPolicy(
    And(Eq(Row("org"), Fact("org")), Or(Not(Row("locked")), Fact("admin"))),
    Reason("task.update_denied", "a task of your org; a locked one only for an admin"),
)
TASK_FIELDS = ("org", "id", "project_id", "title", "state", "locked", "version")


@dataclass(frozen=True)
class Principal:
    id: str
    org: str | None = "acme"
    admin: Any = False


ALICE = Principal("alice")
ROOT = Principal("root", admin=True)
EVE = Principal("eve", org="umbrella")


@dataclass
class Project(Aggregate):
    org: str
    id: str
    name: str
    version: int = 1

    Store: ClassVar[ProjectStore]


class ProjectStore(CrudStore[Project, str]):
    TABLE = "cmd_project"
    COLUMNS = ("id", "org", "name", "version")

    def to_row(self, p: Project) -> Mapping[str, object]:
        return {"id": p.id, "org": p.org, "name": p.name, "version": p.version}

    def from_row(self, row: Mapping[str, Any]) -> Project:
        return Project(row["org"], row["id"], row["name"], row["version"])


Project.Store = ProjectStore()


@dataclass
class Task(Aggregate):
    org: str
    id: str
    project_id: str
    title: str
    state: str
    locked: bool = False
    execution_id: UUID | None = None
    started_at: datetime | None = None
    version: int = 1

    Store: ClassVar[TaskStore]

    can_update = row_policy_gate("update", TASK_UPDATE, TASK_FIELDS)


class TaskStore(CrudStore[Task, str]):
    TABLE = "cmd_task"
    COLUMNS = (
        "id", "org", "project_id", "title", "state", "locked", "execution_id", "started_at",
        "version",
    )

    def to_row(self, t: Task) -> Mapping[str, object]:
        return {
            "id": t.id, "org": t.org, "project_id": t.project_id, "title": t.title,
            "state": t.state, "locked": t.locked, "execution_id": t.execution_id,
            "started_at": t.started_at, "version": t.version,
        }

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
    version: int = 1

    Store: ClassVar[StepStore]


class StepStore(CrudStore[Step, str]):
    TABLE = "cmd_step"
    COLUMNS = ("id", "org", "task_id", "label", "version")

    def to_row(self, s: Step) -> Mapping[str, object]:
        return {"id": s.id, "org": s.org, "task_id": s.task_id, "label": s.label,
                "version": s.version}

    def from_row(self, row: Mapping[str, Any]) -> Step:
        return Step(row["org"], row["id"], row["task_id"], row["label"], row["version"])


Step.Store = StepStore()


PROJECT = Entity(
    "Project", Project, key=("org", "id"), partition_by=("org",), conflict_key=("id",),
    fields={"name": str}, revision="version",
    delete_policy=Restrict((IndexRef("Task", "by_project"),)),
    create_policy=RowPolicy(Eq(Row("org"), Fact("org")),
                            Reason("project.other_org", "a project is created in your org")),
    nouns=("cmd_project",),
)
TASK = Entity(
    "Task", Task, key=("org", "id"), partition_by=("org",), conflict_key=("id",),
    fields={"project_id": str, "title": str, "state": str, "locked": bool,
            "execution_id": UUID, "started_at": datetime},
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
    fields={"task_id": str, "label": str}, revision="version",
    relationships=(Relationship("task", "Task", ("org", "task_id")),),
    indexes=(ReverseIndex("by_task", ("org", "task_id"), table="cmd_step"),),
    delete_policy=NoInbound(),
)
LIFECYCLE = Workflow(
    "TaskLifecycle", "Task", "state", ("queued", "running", "done"),
    (WorkflowTransition("Start", ("queued",), "running"),
     WorkflowTransition("Finish", ("running",), "done")),
)
CATALOG = Catalog([PROJECT, TASK, STEP], [LIFECYCLE])

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
    Transition("TaskLifecycle.Finish", on="task", revision=Var("expected_revision"),
               stale=Outcome("StaleRevision"), illegal=Outcome("IllegalState")),
    Return("Finished", revision=Field("task", "version")),
)
RENAME_TASK = Command(
    "RenameTask",
    ORG, Input("task_id", str), Input("title", str),
    Mutate("Task", (Var("org"), Var("task_id")), as_="task", else_=Outcome("Missing"),
           taken={"by_title": Outcome("TitleTaken")}),
    Set("task", "title", Var("title")),
    Caused("task", "cmd_task", "task.renamed", {"title": Var("title")}),
    Return("Renamed", revision=Field("task", "version")),
)
LOCK_TASK = Command(
    "LockTask",
    ORG, Input("task_id", str), Input("locked", bool),
    Mutate("Task", (Var("org"), Var("task_id")), as_="task", else_=Outcome("Missing")),
    Set("task", "locked", Var("locked")),
    Return("Locked"),
)
LOCK_PAIR = Command(
    "LockPair",
    ORG, Input("first", str), Input("second", str),
    Mutate("Task", (Var("org"), Var("first")), as_="a", else_=Outcome("FirstMissing")),
    Mutate("Task", (Var("org"), Var("second")), as_="b", else_=Outcome("SecondMissing")),
    Set("a", "locked", Const(True)),
    Set("b", "locked", Const(True)),
    Return("Locked"),
)
SWAP_TITLES = Command(
    "SwapTitles",
    ORG, Input("first", str), Input("second", str),
    Mutate("Task", (Var("org"), Var("first")), as_="a", else_=Outcome("FirstMissing"),
           taken={"by_title": Outcome("FirstTaken")}),
    Mutate("Task", (Var("org"), Var("second")), as_="b", else_=Outcome("SecondMissing"),
           taken={"by_title": Outcome("SecondTaken")}),
    Set("a", "title", Field("b", "title")),
    Set("b", "title", Field("a", "title")),
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
        LOCK_PAIR, SWAP_TITLES, ADD_STEP, DELETE_PROJECT, DELETE_TASK,
    )
}


def executor_for(db: Database, **config: Any) -> MutationExecutor:
    settings = {"service": "sample", "lock_timeout": timedelta(seconds=5), **config}
    return MutationExecutor(db, EngineConfig(**settings), Metrics("sample", "pod-1"))


def runner_for(db: Database, **config: Any) -> CommandRunner:
    return CommandRunner(executor_for(db), CommandConfig(**config))
