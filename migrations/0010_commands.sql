-- The declarative command layer (service_engine.commands): idempotency
-- records and unique-key occupancy, written in the command's own
-- transaction with its effect.

-- The first run of an idempotency key: its outcome (success or a declared
-- zero-mutation outcome) and the service values sealed for it. A retry
-- with the same key and inputs answers from here; scope is the acting
-- principal, so two callers never share a key. Swept past its retention.
CREATE TABLE service_engine.command_idempotency (
    command      text        NOT NULL,
    scope        text        NOT NULL,
    key          text        NOT NULL CHECK (key <> ''),
    input_digest text        NOT NULL,
    outcome      jsonb       NOT NULL,
    sealed       jsonb       NOT NULL DEFAULT '{}',
    recorded_at  timestamptz NOT NULL,
    PRIMARY KEY (command, scope, key)
);
CREATE INDEX command_idempotency_recorded_at
    ON service_engine.command_idempotency (recorded_at);

-- One occupied unique value inside one partition (partition and value are
-- canonical JSON), owned by one row (its store key, canonical JSON). The
-- writer holds the row's advisory lock, so two writers of one value
-- serialise and the second sees the first's row; the primary key is the
-- backstop.
CREATE TABLE service_engine.command_occupancy (
    entity      text        NOT NULL,
    index_name  text        NOT NULL,
    partition   text        NOT NULL,
    value       text        NOT NULL,
    owner       text        NOT NULL,
    occupied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (entity, index_name, partition, value)
);
CREATE INDEX command_occupancy_owner ON service_engine.command_occupancy (entity, owner);
