-- Scheduled impacts: staged now, delivered when the database clock passes
-- due_at. Each row fires exactly once across pods (claimed SKIP LOCKED in
-- the transaction that stages its impacts and deletes it).
CREATE TABLE service_engine.scheduled_impact (
    id         bigserial PRIMARY KEY,
    due_at     timestamptz NOT NULL,
    impacts    jsonb       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX scheduled_impact_due ON service_engine.scheduled_impact (due_at, id);
