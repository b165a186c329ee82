-- A claim's batch rows are written into mail_claim past the executor
-- (src/claim_writer.c), not by an INSERT ... SELECT FROM generate_series.
-- They must be what the statement wrote: one row per 128 mails of a queue
-- in id order, the batch number from its sequence, gone empty, the lease
-- from the transaction's start, each mail's claim record; and where
-- mail_claim has an insert trigger of the user's own, the statement runs
-- and the trigger fires.
SET client_min_messages = warning;
\set VERBOSITY terse
SELECT gatekeeper.create_queue('cw');
INSERT INTO gatekeeper.mail (queue, recipient, subject, body)
SELECT 'cw', 'cw' || i || '@example.com', 's', 'b' FROM generate_series(1, 600) i;

-- the rows of one claim, as a user reads them, against what it returned
CREATE TEMP TABLE claimed (id bigint, attempt int);
CREATE FUNCTION pg_temp.batches(since bigint) RETURNS TABLE (
	nth bigint, worker text, open int, gone bigint[], lease_from_start interval,
	ids_in_order boolean, ids_are_the_claims boolean, lo_hi_are_the_ends boolean,
	records_claimed boolean, batch_after_the_last boolean)
LANGUAGE sql AS $$
	SELECT row_number() OVER (ORDER BY b.batch), b.worker, b.open, b.gone,
		   b.lease_until - now(),
		   (SELECT array_agg(r.id) = array_agg(r.id ORDER BY r.id) FROM unnest(b.mails) r),
		   (SELECT bool_and(c.id IS NOT NULL) FROM unnest(b.mails) r LEFT JOIN claimed c
			   ON c.id = r.id AND c.attempt = r.attempt),
		   (SELECT min(r.id) = b.lo AND max(r.id) = b.hi AND count(*) = b.open FROM unnest(b.mails) r),
		   (SELECT bool_and(r.state = 'claimed' AND r.worker = b.worker AND r.queue = 'cw')
			  FROM unnest(b.mails) r),
		   b.batch > since
	  FROM gatekeeper.mail_claim b
	 WHERE b.queue = 'cw' AND b.batch > since
	 ORDER BY b.batch
$$;

-- 300 mails: rows of 128, 128 and 44
BEGIN;
SELECT coalesce(max(batch), 0) AS last_batch FROM gatekeeper.mail_claim \gset
INSERT INTO claimed
SELECT id, attempt FROM gatekeeper.claim('cw-1', 300, interval '7 minutes', ARRAY['cw']);
SELECT count(*) AS claimed FROM claimed;
SELECT * FROM pg_temp.batches(:last_batch);
COMMIT;

-- an insert trigger of the user's own on mail_claim: the statement writes
-- the same rows, and the trigger sees them
CREATE TABLE cw_seen (batch bigint, lo bigint, hi bigint, open int);
CREATE FUNCTION cw_note() RETURNS trigger LANGUAGE plpgsql AS
$$BEGIN INSERT INTO public.cw_seen VALUES (NEW.batch, NEW.lo, NEW.hi, NEW.open); RETURN NULL; END$$;
CREATE TRIGGER cw_note AFTER INSERT ON gatekeeper.mail_claim
	FOR EACH ROW EXECUTE FUNCTION cw_note();
BEGIN;
SELECT coalesce(max(batch), 0) AS last_batch FROM gatekeeper.mail_claim \gset
TRUNCATE claimed;
INSERT INTO claimed SELECT id, attempt FROM gatekeeper.claim('cw-2', 300, interval '7 minutes', ARRAY['cw']);
SELECT count(*) AS claimed FROM claimed;
SELECT * FROM pg_temp.batches(:last_batch);
SELECT count(*) AS seen, sum(s.open) AS mails_seen,
	   bool_and(s.lo = b.lo AND s.hi = b.hi) AS as_written
  FROM cw_seen s JOIN gatekeeper.mail_claim b USING (batch);
COMMIT;
DROP TRIGGER cw_note ON gatekeeper.mail_claim;
DROP FUNCTION cw_note();
DROP TABLE cw_seen;

-- the mails of both kinds of row are acked alike, each once
SELECT count(*) FILTER (WHERE a) AS acked
  FROM gatekeeper.mail_claim b, unnest(b.mails) r,
	   LATERAL gatekeeper.ack(r.id, r.attempt) a
 WHERE b.queue = 'cw';
SELECT count(*) AS left_claimed FROM gatekeeper.mail_claim WHERE queue = 'cw' AND open > 0;
SELECT sent, scheduled FROM gatekeeper.queue_stats WHERE queue = 'cw';
