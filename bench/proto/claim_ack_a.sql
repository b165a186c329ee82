-- prototype A (bench/proto/run.sh): the claim deletes the live rows into one batch row; the ack turns the batch into outcome rows
WITH c AS (
DELETE FROM gatekeeper.mail_live l
 WHERE l.ctid = ANY (ARRAY(SELECT d.ctid FROM gatekeeper.mail_live d WHERE d.queue = 'bench' AND d.state = 'scheduled' AND d.priority = 0 AND d.send_at <= now() ORDER BY d.send_at, d.id LIMIT 1000 FOR UPDATE SKIP LOCKED))
RETURNING l.*, (SELECT m.body FROM gatekeeper.mail m WHERE m.id = l.id AND m.segment = l.segment) AS body),
b AS (INSERT INTO proto_claim (queue, worker, lease_until, mails)
  SELECT 'bench', 'w', now() + interval '5 min',
         array_agg(ROW(c.id, c.queue, c.priority, c.send_at, 'claimed', c.attempt + 1, c.uncharged, NULL, 'w', c.message_id, c.last_error, c.dedupe_key, c.segment)::gatekeeper.mail_live)
    FROM c RETURNING batch_id, mails)
SELECT b.batch_id AS bid, (SELECT array_agg(x.id) FROM unnest(b.mails) x) AS ids, (SELECT array_agg(x.attempt) FROM unnest(b.mails) x) AS atts FROM b \gset
WITH b AS (DELETE FROM proto_claim p WHERE p.batch_id = :bid
   AND (SELECT array_agg(x.id) FROM unnest(p.mails) x) = :ids::bigint[]
   AND (SELECT array_agg(x.attempt) FROM unnest(p.mails) x) = :atts::int[] RETURNING p.mails)
INSERT INTO gatekeeper.mail_done (id, queue, state, attempt, uncharged, send_at, worker, message_id, last_error, dedupe_key, finished_at, segment)
SELECT f.id, f.queue, 'sent', f.attempt, f.uncharged, f.send_at, f.worker, f.message_id, f.last_error, f.dedupe_key, now(), f.segment FROM b, unnest(b.mails) f;
