-- The blob battery's sample: documents in orgs, each with at most one attachment.

CREATE TABLE sample_document (
    id         text PRIMARY KEY,
    org        text NOT NULL,
    attachment uuid
);

GRANT SELECT, INSERT, UPDATE, DELETE ON sample_document TO service_engine_app;
