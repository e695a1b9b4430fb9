-- The command-layer sample (conformance/test_commands*.py): projects, the
-- tasks that reference them (restrict) and the steps of a task (cascade).
-- No SQL foreign keys: the command layer's relationship proofs and delete
-- policies are what keeps the references whole.

CREATE TABLE cmd_project (
    id      text    PRIMARY KEY,
    org     text    NOT NULL,
    name    text    NOT NULL,
    version integer NOT NULL CHECK (version >= 1)
);

CREATE TABLE cmd_task (
    id           text        PRIMARY KEY,
    org          text        NOT NULL,
    project_id   text        NOT NULL,
    title        text        NOT NULL,
    state        text        NOT NULL CHECK (state IN ('queued', 'running', 'done')),
    locked       boolean     NOT NULL DEFAULT false,
    execution_id uuid,
    started_at   timestamptz,
    version      integer     NOT NULL CHECK (version >= 1)
);
CREATE INDEX cmd_task_by_project ON cmd_task (org, project_id, id);

CREATE TABLE cmd_step (
    id      text    PRIMARY KEY,
    org     text    NOT NULL,
    task_id text    NOT NULL,
    label   text    NOT NULL,
    version integer NOT NULL CHECK (version >= 1)
);
CREATE INDEX cmd_step_by_task ON cmd_step (org, task_id, id);

GRANT SELECT, INSERT, UPDATE, DELETE ON cmd_project, cmd_task, cmd_step TO service_engine_app;
