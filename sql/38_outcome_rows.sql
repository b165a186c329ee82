-- Finished mail's outcome rows are written into mail_done past the
-- executor (src/done_writer.c), not by an INSERT ... SELECT FROM unnest.
-- They must be what the statement wrote: each column from the claim,
-- finished_at the transaction's time, the queues' totals counted; and
-- where mail_done has an insert trigger of the user's own, the statement
-- runs and the trigger fires.
SET client_min_messages = warning;
\set VERBOSITY terse
SELECT gatekeeper.create_queue('dw', max_attempts => 1);
INSERT INTO gatekeeper.mail (queue, recipient, subject, body, dedupe_key)
SELECT 'dw', 'dw' || i || '@example.com', 's', 'b', CASE WHEN i = 1 THEN 'k1' END
  FROM generate_series(1, 6) i;
CREATE TEMP TABLE c AS
SELECT id, attempt, message_id, row_number() OVER (ORDER BY id) AS n
  FROM gatekeeper.claim('w', 10, queues => ARRAY['dw']);

-- three acked, one failed for good, one unclaimed, in one transaction
BEGIN;
SELECT gatekeeper.ack_batch(array_agg(id), array_agg(attempt)) AS acked FROM c WHERE n <= 3;
SELECT gatekeeper.nack(id, attempt, '550 no such user', true) AS failed FROM c WHERE n = 4;
SELECT d.state, d.attempt = c.attempt AS attempt_kept, d.message_id = c.message_id AS message_id_kept,
       d.worker, d.last_error, d.dedupe_key, d.finished_at = now() AS finished_now,
       d.send_at = m.send_at AS send_at_kept, d.segment = m.segment AS segment_kept, d.uncharged
  FROM c JOIN gatekeeper.mail_done d USING (id) JOIN gatekeeper.mail m USING (id)
 ORDER BY c.n;
COMMIT;
SELECT sent, failed FROM gatekeeper.queue_stats WHERE queue = 'dw';

-- an insert trigger of the user's own on mail_done: the statement writes,
-- and the trigger sees the row
CREATE TABLE dw_seen (id bigint, state text);
CREATE FUNCTION dw_note() RETURNS trigger LANGUAGE plpgsql AS
$$BEGIN INSERT INTO public.dw_seen VALUES (NEW.id, NEW.state); RETURN NULL; END$$;
CREATE TRIGGER dw_note AFTER INSERT ON gatekeeper.mail_done
	FOR EACH ROW EXECUTE FUNCTION dw_note();
SELECT gatekeeper.ack(id, attempt) AS acked FROM c WHERE n = 5;
SELECT s.state, s.id = c.id AS the_acked_mail FROM dw_seen s, c WHERE c.n = 5;
SELECT sent, failed FROM gatekeeper.queue_stats WHERE queue = 'dw';
DROP TRIGGER dw_note ON gatekeeper.mail_done;
DROP FUNCTION dw_note();
DROP TABLE dw_seen;
