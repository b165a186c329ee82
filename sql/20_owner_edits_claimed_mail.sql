-- The owner's UPDATE and DELETE of gatekeeper.mail reach a claimed mail's
-- record in its mail_claim batch (_mail_sync), as they reached its live
-- row when claimed mail was in mail_live: queue, priority, send_at and
-- dedupe_key carry over into the record (what status() shows, what the
-- ack and a hand-back write); a deleted claimed mail leaves its batch, so
-- the claimer's ack of it returns false; the counts follow.
SET client_min_messages = warning;
\set VERBOSITY terse
\i sql/error_of.inc

-- a mail's open claim: its batch's queue and its record, or nothing
CREATE FUNCTION pg_temp.claim_of(mail bigint) RETURNS text
LANGUAGE sql AS $$
	SELECT string_agg(format('%s/%s p%s key:%s %s', c.queue, r.queue, r.priority,
							 coalesce(r.dedupe_key, '-'), r.state), ',')
	  FROM gatekeeper.mail_claim c, unnest(c.mails) r
	 WHERE r.id = mail AND NOT mail = ANY (c.gone)
$$;

SELECT gatekeeper.create_queue('cs_a');
SELECT gatekeeper.create_queue('cs_b');
SELECT gatekeeper.create_queue('cs_c');
SELECT gatekeeper.enqueue('s' || i || '@example.com', 'S' || i, 'b', 'cs_a',
						  dedupe_key => 'k' || i) AS s0
  FROM generate_series(0, 5) i ORDER BY 1 LIMIT 1 \gset
SELECT gatekeeper.enqueue('sched@example.com', 'Sched', 'b', 'cs_a', dedupe_key => 'sched',
						  send_at => now() + interval '1 hour') AS sched \gset
SELECT count(*) AS claimed FROM gatekeeper.claim('ws', 10, '1 minute', ARRAY['cs_a']);
SELECT queue, scheduled, claimed FROM gatekeeper.queue_stats WHERE queue LIKE 'cs\_%' ORDER BY queue;

--
-- UPDATE of send_at and priority: in the record, status() and the outcome
--
UPDATE gatekeeper.mail SET send_at = '2030-01-01 00:00+00', priority = 7 WHERE id = :s0;
SELECT pg_temp.claim_of(:s0) AS s0;
SELECT state, send_at = '2030-01-01 00:00+00' AS new_send_at FROM gatekeeper.status(:s0);
SELECT gatekeeper.ack(:s0, 1) AS acked;
SELECT state, send_at = '2030-01-01 00:00+00' AS new_send_at
  FROM gatekeeper.mail_done WHERE id = :s0;

--
-- UPDATE of dedupe_key: the new key is held, the old one free
--
UPDATE gatekeeper.mail SET dedupe_key = 'k1new' WHERE id = :s0 + 1;
SELECT pg_temp.claim_of(:s0 + 1) AS s1;
SELECT gatekeeper.find('cs_a', 'k1new') = :s0 + 1 AS found_by_new_key;
SELECT gatekeeper.enqueue('x@example.com', 'X', 'b', 'cs_a', dedupe_key => 'k1new') = :s0 + 1
       AS same_id_by_new_key;
SELECT gatekeeper.enqueue('x@example.com', 'X', 'b', 'cs_a', dedupe_key => 'k1') AS k1_again \gset
SELECT :k1_again <> :s0 + 1 AS old_key_free;
-- a key another unfinished mail holds is refused, nothing written
SELECT pg_temp.error_of(format($$UPDATE gatekeeper.mail SET dedupe_key = 'sched' WHERE id = %s$$,
							   :s0 + 2)) AS claimed_to_scheduled_key;
SELECT pg_temp.error_of(format($$UPDATE gatekeeper.mail SET dedupe_key = 'k3' WHERE id = %s$$,
							   :s0 + 2)) AS claimed_to_claimed_key;
SELECT pg_temp.error_of(format($$UPDATE gatekeeper.mail SET dedupe_key = 'k3' WHERE id = %s$$,
							   :sched)) AS scheduled_to_claimed_key;
SELECT pg_temp.claim_of(:s0 + 2) AS s2, dedupe_key FROM gatekeeper.mail WHERE id = :s0 + 2;
SELECT dedupe_key FROM gatekeeper.mail_status WHERE id = :sched;
-- the ack writes the new key into the outcome
SELECT gatekeeper.ack(:s0 + 1, 1) AS acked;
SELECT queue, dedupe_key FROM gatekeeper.mail_done WHERE id = :s0 + 1;

--
-- UPDATE of queue: the claim moves to a batch of the new queue, with the
-- batch's lease and worker; the counts move with it
--
UPDATE gatekeeper.mail SET queue = 'cs_b' WHERE id = :s0 + 2;
SELECT pg_temp.claim_of(:s0 + 2) AS s2;
SELECT queue, worker, open, cardinality(mails) AS records,
       lease_until = (SELECT lease_until FROM gatekeeper.mail_claim WHERE queue = 'cs_a') AS same_lease
  FROM gatekeeper.mail_claim WHERE queue LIKE 'cs\_%' ORDER BY queue;
SELECT queue, scheduled, claimed FROM gatekeeper.queue_stats WHERE queue LIKE 'cs\_%' ORDER BY queue;
SELECT queue, state, worker, lease_until IS NOT NULL AS leased FROM gatekeeper.mail_status WHERE id = :s0 + 2;
SELECT gatekeeper.find('cs_b', 'k2') = :s0 + 2 AS found_in_new_queue;
-- the one open mail of its batch: the batch itself moves
SELECT batch AS cs_b_batch FROM gatekeeper.mail_claim WHERE queue = 'cs_b' \gset
UPDATE gatekeeper.mail SET queue = 'cs_c' WHERE id = :s0 + 2;
SELECT pg_temp.claim_of(:s0 + 2) AS s2;
SELECT queue, batch = :cs_b_batch AS same_batch, open FROM gatekeeper.mail_claim
 WHERE queue LIKE 'cs\_%' ORDER BY queue;
SELECT queue, scheduled, claimed FROM gatekeeper.queue_stats WHERE queue LIKE 'cs\_%' ORDER BY queue;
SELECT gatekeeper.ack(:s0 + 2, 1) AS acked;
SELECT queue, state, dedupe_key FROM gatekeeper.mail_done WHERE id = :s0 + 2;

--
-- DELETE: the claimed mail leaves its batch; its ack returns false
--
DELETE FROM gatekeeper.mail WHERE id = :s0 + 3;
SELECT pg_temp.claim_of(:s0 + 3) AS s3;
SELECT open, :s0 + 3 = ANY (gone) AS s3_gone FROM gatekeeper.mail_claim WHERE queue = 'cs_a';
SELECT queue, scheduled, claimed FROM gatekeeper.queue_stats WHERE queue LIKE 'cs\_%' ORDER BY queue;
SELECT gatekeeper.ack(:s0 + 3, 1) AS ack_deleted;
SELECT count(*) AS outcomes FROM gatekeeper.mail_done WHERE id = :s0 + 3;
SELECT gatekeeper.enqueue('y@example.com', 'Y', 'b', 'cs_a', dedupe_key => 'k3') <> :s0 + 3
       AS deleted_key_free;
-- the batch's last open mails deleted: the batch goes, the acks return false
DELETE FROM gatekeeper.mail WHERE id IN (:s0 + 4, :s0 + 5);
SELECT count(*) AS batches FROM gatekeeper.mail_claim WHERE queue LIKE 'cs\_%';
SELECT gatekeeper.ack_batch(ARRAY[:s0 + 4, :s0 + 5], ARRAY[1, 1]) AS acked_deleted;
SELECT queue, scheduled, claimed FROM gatekeeper.queue_stats WHERE queue LIKE 'cs\_%' ORDER BY queue;

SELECT gatekeeper.cancel_queue('cs_a') >= 0 AS cancelled, gatekeeper.cancel_queue('cs_b') >= 0 AS cancelled,
       gatekeeper.cancel_queue('cs_c') >= 0 AS cancelled;
SELECT gatekeeper.drop_queue('cs_a'), gatekeeper.drop_queue('cs_b'), gatekeeper.drop_queue('cs_c');

--
-- TRUNCATE: the mails' state rows go with them, as with DELETE (in a
-- transaction rolled back, so the other tests' mail stays)
--
BEGIN;
SELECT gatekeeper.create_queue('cs_t');
INSERT INTO gatekeeper.mail (queue, recipient, subject, body, dedupe_key)
SELECT 'cs_t', 't' || g || '@example.com', 'T', 'b', 't' || g FROM generate_series(1, 4) AS g;
SELECT id AS t0 FROM gatekeeper.mail WHERE queue = 'cs_t' ORDER BY id LIMIT 1 \gset
SELECT count(*) AS claimed FROM gatekeeper.claim('t', 2, queues => '{cs_t}');
SELECT gatekeeper.ack(:t0, 1) AS acked;
TRUNCATE gatekeeper.mail RESTART IDENTITY;
SELECT (SELECT count(*) FROM gatekeeper.mail_live) AS live,
       (SELECT count(*) FROM gatekeeper.mail_claim) AS batches,
       (SELECT count(*) FROM gatekeeper.mail_key) AS keys,
       (SELECT count(*) FROM gatekeeper.mail_done) AS outcomes;
SELECT queue, scheduled, claimed FROM gatekeeper.queue_stats WHERE queue = 'cs_t';
SELECT gatekeeper.ack(:t0 + 1, 1) AS ack_truncated;
-- the ids and the keys start again, clear of the old state
INSERT INTO gatekeeper.mail (queue, recipient, subject, body, dedupe_key)
SELECT 'cs_t', 't' || g || '@example.com', 'T', 'b', 't' || g FROM generate_series(1, 4) AS g;
SELECT min(id) AS first_id, count(*) AS claimed FROM gatekeeper.claim('t', 10, queues => '{cs_t}');
-- tables the TRUNCATE names itself are emptied by it, not again
TRUNCATE gatekeeper.mail, gatekeeper.mail_live, gatekeeper.mail_claim;
SELECT (SELECT count(*) FROM gatekeeper.mail_live) AS live,
       (SELECT count(*) FROM gatekeeper.mail_claim) AS batches,
       (SELECT count(*) FROM gatekeeper.mail_key) AS keys,
       (SELECT count(*) FROM gatekeeper.mail_done) AS outcomes;
ROLLBACK;
