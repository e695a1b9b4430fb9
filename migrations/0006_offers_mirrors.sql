-- Leader work out and in: published-language offers and mirrors.

-- A key of an offer that changed and is not yet drained to its bucket.
-- Staged in the write's own transaction (INSERT ... ON CONFLICT bumps gen);
-- the drain deletes the marker only at the generation it drained, so a
-- write that lands during the drain leaves it for the next one. agg_key is
-- the aggregate key the image is resolved by (NULL: a bucket key with no
-- row behind it, found by a reconcile: retract it).
CREATE TABLE service_engine.offer_dirty (
    offer     text        NOT NULL,
    kv_key    text        NOT NULL,
    agg_key   jsonb,
    gen       bigint      NOT NULL DEFAULT 1,
    dirtied_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (offer, kv_key)
);
CREATE INDEX offer_dirty_by_age ON service_engine.offer_dirty (offer, dirtied_at);

-- The per-key watermark of a KV drain relay (an offer's relay is named
-- 'offer:<NAME>'): the highest version published for a key, Put or Retract.
-- A stale write at or below it is a no-op; reset_watermarks clears a
-- relay's rows after an operator truncated and rebuilt its bucket.
CREATE TABLE service_engine.kv_relay_watermark (
    relay      text        NOT NULL,
    key        text        NOT NULL,
    version    bigint      NOT NULL,
    retracted  boolean     NOT NULL DEFAULT false,
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (relay, key)
);

-- The bucket revision a mirror has projected up to, per consumed bucket,
-- advanced by the leader as it projects; a standby reports converged once
-- it reached the revision of its own boot read.
CREATE TABLE service_engine.mirror_watermark (
    mirror     text        NOT NULL,
    bucket     text        NOT NULL,
    revision   bigint      NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (mirror, bucket)
);
