-- the layout as it is (bench/proto/run.sh): the claim updates the live rows, the ack moves them to mail_done
WITH c AS (
UPDATE gatekeeper.mail_live l SET state = 'claimed', attempt = l.attempt + 1, lease_until = now() + interval '5 min', worker = 'w'
 WHERE l.ctid = ANY (ARRAY(SELECT d.ctid FROM gatekeeper.mail_live d WHERE d.queue = 'bench' AND d.state = 'scheduled' AND d.priority = 0 AND d.send_at <= now() ORDER BY d.send_at, d.id LIMIT 1000 FOR UPDATE SKIP LOCKED))
RETURNING l.id, l.attempt, (SELECT m.body FROM gatekeeper.mail m WHERE m.id = l.id AND m.segment = l.segment) AS body)
SELECT coalesce(array_agg(id), '{}') AS ids, coalesce(array_agg(attempt), '{}') AS atts FROM c \gset
WITH f AS (DELETE FROM gatekeeper.mail_live l USING unnest(:ids::bigint[], :atts::int[]) AS u(id, attempt)
  WHERE l.id = u.id AND l.attempt = u.attempt AND l.state = 'claimed' RETURNING l.*)
INSERT INTO gatekeeper.mail_done (id, queue, state, attempt, uncharged, send_at, worker, message_id, last_error, dedupe_key, finished_at, segment)
SELECT f.id, f.queue, 'sent', f.attempt, f.uncharged, f.send_at, f.worker, f.message_id, f.last_error, f.dedupe_key, now(), f.segment FROM f;
