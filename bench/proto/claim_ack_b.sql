-- prototype B (bench/proto/run.sh): the due order in its own table, the live row updated HOT, one lease row per batch
WITH s AS (DELETE FROM t_sched d WHERE d.ctid = ANY (ARRAY(SELECT d.ctid FROM t_sched d WHERE d.queue = 'bench' AND d.priority = 0 AND d.send_at <= now() ORDER BY d.send_at, d.id LIMIT 1000 FOR UPDATE SKIP LOCKED)) RETURNING d.id),
c AS (UPDATE t_live l SET state = 'claimed', attempt = l.attempt + 1, lease_until = now() + interval '5 min', worker = 'w'
  FROM s WHERE l.id = s.id
  RETURNING l.id, l.attempt, (SELECT m.body FROM gatekeeper.mail m WHERE m.id = l.id AND m.segment = l.segment) AS body),
b AS (INSERT INTO t_batch (lease_until, ids) SELECT now() + interval '5 min', array_agg(c.id) FROM c)
SELECT coalesce(array_agg(id), '{}') AS ids, coalesce(array_agg(attempt), '{}') AS atts FROM c \gset
WITH f AS (DELETE FROM t_live l USING unnest(:ids::bigint[], :atts::int[]) AS u(id, attempt)
  WHERE l.id = u.id AND l.attempt = u.attempt AND l.state = 'claimed' RETURNING l.*)
INSERT INTO gatekeeper.mail_done (id, queue, state, attempt, uncharged, send_at, worker, message_id, last_error, dedupe_key, finished_at, segment)
SELECT f.id, f.queue, 'sent', f.attempt, f.uncharged, f.send_at, f.worker, f.message_id, f.last_error, f.dedupe_key, now(), f.segment FROM f;
