-- The command-layer sample keys each row by its complete key: the
-- partition route (org) and the id. Two orgs may hold the same id, neither
-- observes the other's, and their writers never contend.

ALTER TABLE cmd_project DROP CONSTRAINT cmd_project_pkey, ADD PRIMARY KEY (org, id);
ALTER TABLE cmd_task DROP CONSTRAINT cmd_task_pkey, ADD PRIMARY KEY (org, id);
ALTER TABLE cmd_step DROP CONSTRAINT cmd_step_pkey, ADD PRIMARY KEY (org, id);

-- A pinned step is deleted (by its task's cascade) only by an admin.
ALTER TABLE cmd_step ADD COLUMN pinned boolean NOT NULL DEFAULT false;
