-- The write path's per-commit work in Postgres, cheaper; nothing a write
-- stores or notifies changes.

-- A commit's offer marks (`offers.staging`): inserted, or their generation
-- bumped, and the drain woken, as the one statement sent before did. The
-- pipeline sends the call with every value inlined in COMMIT's round trip,
-- where a bare INSERT ... ON CONFLICT was parsed and planned on every
-- commit; the function's statement is planned once per session.
CREATE FUNCTION service_engine.mark_offers_dirty(offers text[], kv_keys text[], agg_keys text[])
RETURNS void LANGUAGE plpgsql VOLATILE AS $f$
BEGIN
  INSERT INTO service_engine.offer_dirty AS d (offer, kv_key, agg_key)
  SELECT m.o, m.k, m.a::jsonb FROM unnest(offers, kv_keys, agg_keys) AS m(o, k, a)
  ON CONFLICT (offer, kv_key) DO UPDATE
     SET gen = d.gen + 1, agg_key = EXCLUDED.agg_key, dirtied_at = clock_timestamp();
  IF FOUND THEN
    PERFORM pg_notify('service_engine_offer', '');
  END IF;
END
$f$;

-- No query reads an occupied value by its owner (every read and write of
-- command_occupancy goes by its primary key): one index fewer to maintain
-- on every claim, release and transfer.
DROP INDEX service_engine.command_occupancy_owner;
