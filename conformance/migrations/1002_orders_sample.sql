-- The orders sample of the inbound battery: an order aggregate a command
-- reaction creates, an append-only effect log (one row per effect a
-- reaction ran, so a test counts exactly-once) and the prerequisite a
-- parked reaction waits for.

CREATE TABLE sample_order (
    id     text PRIMARY KEY,
    item   text NOT NULL,
    qty    int  NOT NULL CHECK (qty > 0),
    status text NOT NULL DEFAULT 'placed'
);

CREATE TABLE sample_order_effect (
    id          uuid        PRIMARY KEY,
    reaction    text        NOT NULL,
    order_id    text        NOT NULL,
    message_id  uuid        NOT NULL,
    seq         bigint,
    pod         text        NOT NULL DEFAULT '',
    recorded_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX sample_order_effect_order ON sample_order_effect (order_id, reaction);

CREATE TABLE sample_order_prerequisite (
    order_id text PRIMARY KEY
);

GRANT SELECT, INSERT, UPDATE, DELETE ON
    sample_order, sample_order_effect, sample_order_prerequisite
    TO service_engine_app;
