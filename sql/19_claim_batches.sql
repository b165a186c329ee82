-- Claimed mail in gatekeeper.mail_claim: a claim moves the mails that go
-- out of mail_live into one batch per queue; the ack takes them out of
-- their batch, fenced by (id, attempt); the mails that do not go end in
-- mail_live (deferred) or mail_done, never nowhere and never twice.
SET client_min_messages = warning;
\set VERBOSITY terse
\i sql/error_of.inc

-- where a mail is: its live row, the batches it is open in, its outcome
CREATE FUNCTION pg_temp.where_is(mail bigint) RETURNS text
LANGUAGE sql AS $$
	SELECT concat_ws(' ',
		(SELECT 'live:' || l.state || '/' || l.attempt FROM gatekeeper.mail_live l WHERE l.id = mail),
		(SELECT 'claim:' || string_agg(r.state || '/' || r.attempt, ',')
		   FROM gatekeeper.mail_claim c, unnest(c.mails) r
		  WHERE r.id = mail AND NOT mail = ANY (c.gone)),
		(SELECT 'done:' || d.state || '/' || d.attempt FROM gatekeeper.mail_done d WHERE d.id = mail))
$$;

SELECT gatekeeper.create_queue('cb_a');
SELECT gatekeeper.create_queue('cb_b');
SELECT gatekeeper.create_queue('cb_gated', gates => '{smart_sending}', on_gate_closed => 'defer');

--
-- a claim takes its mails out of mail_live into one batch per queue
--
SELECT gatekeeper.enqueue('a' || i || '@example.com', 'A' || i, 'b', 'cb_a') AS a1
  FROM generate_series(1, 3) i ORDER BY 1 LIMIT 1 \gset
SELECT gatekeeper.enqueue('b1@example.com', 'B1', 'b', 'cb_b') AS b1 \gset
BEGIN;
SELECT count(*) AS claimed, count(DISTINCT message_id) AS message_ids, min(attempt), max(attempt)
  FROM gatekeeper.claim('w1', 10, queues => ARRAY['cb_a', 'cb_b']);
SELECT queue, worker, open, gone, lo = min_id AS lo_least, hi = max_id AS hi_greatest,
       cardinality(mails) AS records, lease_until = now() + interval '5 minutes' AS lease
  FROM gatekeeper.mail_claim c,
       LATERAL (SELECT min(r.id) AS min_id, max(r.id) AS max_id FROM unnest(c.mails) r) m
 WHERE c.queue LIKE 'cb\_%'
 ORDER BY queue;
COMMIT;
SELECT r.id - :a1 AS a, r.state, r.attempt, r.worker, r.message_id IS NOT NULL AS has_message_id
  FROM gatekeeper.mail_claim c, unnest(c.mails) r WHERE c.queue = 'cb_a' ORDER BY r.id;
SELECT i AS a, pg_temp.where_is(:a1 + i) FROM generate_series(0, 2) i ORDER BY i;
SELECT pg_temp.where_is(:b1) AS b1;
SELECT count(*) AS live_left FROM gatekeeper.mail_live WHERE queue IN ('cb_a', 'cb_b');

--
-- ack_batch takes exactly the fenced claims; a partial ack leaves the
-- batch with the rest open and its records as they were
--
SELECT md5(mails::text) AS mails_before FROM gatekeeper.mail_claim WHERE queue = 'cb_a' \gset
-- a wrong attempt is refused
SELECT gatekeeper.ack_batch(ARRAY[:a1], ARRAY[2]) AS wrong_attempt;
SELECT gatekeeper.ack(:a1, 0) AS wrong_attempt_single;
SELECT pg_temp.where_is(:a1) AS a0;
-- two of cb_a's three, one given twice, and an id no batch holds
SELECT gatekeeper.ack_batch(ARRAY[:a1, :a1 + 1, :a1, :a1 + 1000], ARRAY[1, 1, 1, 1]) AS acked;
SELECT open, gone = ARRAY[:a1, :a1 + 1]::bigint[] AS gone_taken,
       md5(mails::text) = :'mails_before' AS mails_unchanged
  FROM gatekeeper.mail_claim WHERE queue = 'cb_a';
SELECT i AS a, pg_temp.where_is(:a1 + i) FROM generate_series(0, 2) i ORDER BY i;
SELECT d.id - :a1 AS a, d.state, d.attempt, d.worker, d.message_id IS NOT NULL AS has_message_id
  FROM gatekeeper.mail_done d WHERE d.queue = 'cb_a' ORDER BY d.id;
-- a second ack of the same claims takes nothing
SELECT gatekeeper.ack_batch(ARRAY[:a1, :a1 + 1], ARRAY[1, 1]) AS acked_again;
SELECT gatekeeper.ack(:a1, 1) AS ack_again;
-- ack() takes the last open mail: the batch goes
SELECT gatekeeper.ack(:a1 + 2, 1) AS ack_last;
SELECT gatekeeper.ack(:a1 + 2, 1) AS ack_last_again;
SELECT count(*) AS cb_a_batches FROM gatekeeper.mail_claim WHERE queue = 'cb_a';
SELECT pg_temp.where_is(:a1 + 2) AS a2;
-- a whole batch at once is deleted
SELECT gatekeeper.ack_batch(ARRAY[:b1], ARRAY[1]) AS acked_b;
SELECT count(*) AS batches_left FROM gatekeeper.mail_claim WHERE queue LIKE 'cb\_%';
SELECT pg_temp.where_is(:b1) AS b1;
-- bad arrays
SELECT gatekeeper.ack_batch(ARRAY[1, 2]::bigint[], ARRAY[1]);
SELECT gatekeeper.ack_batch(ARRAY[1, NULL]::bigint[], ARRAY[1, 1]);
SELECT gatekeeper.ack_batch('{}', '{}') AS empty;

--
-- batches whose id ranges overlap: an ack takes from each only its own
--
SELECT gatekeeper.enqueue('x' || i || '@example.com', 'X' || i, 'b',
                          CASE WHEN i % 2 = 0 THEN 'cb_a' ELSE 'cb_b' END) AS x0
  FROM generate_series(0, 5) i ORDER BY 1 LIMIT 1 \gset
SELECT queue, count(*) AS claimed FROM gatekeeper.claim('w3', 10, queues => ARRAY['cb_a', 'cb_b'])
 GROUP BY queue ORDER BY queue;
SELECT queue, lo - :x0 AS lo, hi - :x0 AS hi, open FROM gatekeeper.mail_claim
 WHERE queue LIKE 'cb\_%' ORDER BY queue;
-- all of cb_a's (0, 2, 4) and one of cb_b's (1)
SELECT gatekeeper.ack_batch(ARRAY[:x0 + 4, :x0 + 1, :x0, :x0 + 2], ARRAY[1, 1, 1, 1]) AS acked;
SELECT queue, open, (SELECT array_agg(g - :x0 ORDER BY g) FROM unnest(gone) g) AS gone
  FROM gatekeeper.mail_claim WHERE queue LIKE 'cb\_%' ORDER BY queue;
SELECT i AS x, pg_temp.where_is(:x0 + i) FROM generate_series(0, 5) i ORDER BY i;
SELECT gatekeeper.ack_batch(ARRAY[:x0 + 3, :x0 + 5, :x0 + 1], ARRAY[1, 1, 1]) AS acked_rest;
SELECT count(*) AS batches_left FROM gatekeeper.mail_claim WHERE queue LIKE 'cb\_%';

--
-- gate losers go back into mail_live, scheduled, their claim undone
--
SELECT gatekeeper.enqueue('same@example.com', 'G1', 'b', 'cb_gated') AS g1 \gset
SELECT gatekeeper.enqueue('same@example.com', 'G2', 'b', 'cb_gated') AS g2 \gset
SELECT count(*) AS claimed, min(id) = :g1 AS first_won FROM gatekeeper.claim('w1', 10, queues => ARRAY['cb_gated']);
SELECT pg_temp.where_is(:g1) AS g1, pg_temp.where_is(:g2) AS g2;
SELECT state, attempt, worker, send_at > now() AS later, last_error
  FROM gatekeeper.mail_live WHERE id = :g2;
SELECT open, cardinality(mails) AS records FROM gatekeeper.mail_claim WHERE queue = 'cb_gated';

--
-- a suppressed recipient's claimed mail and mail past its send_by end in
-- mail_done
--
SELECT gatekeeper.suppress('blocked@example.com', 'manual');
SELECT gatekeeper.enqueue('blocked@example.com', 'S', 'b', 'cb_b') AS s1 \gset
SELECT gatekeeper.enqueue('late@example.com', 'L', 'b', 'cb_b') AS l1 \gset
UPDATE gatekeeper.mail SET send_by = now() - interval '1 hour' WHERE id = :l1;
SELECT count(*) AS claimed FROM gatekeeper.claim('w2', 10, queues => ARRAY['cb_b']);
SELECT pg_temp.where_is(:s1) AS s1, pg_temp.where_is(:l1) AS l1;
SELECT id = :s1 AS is_s1, state, attempt, worker, last_error
  FROM gatekeeper.mail_done WHERE id IN (:s1, :l1) ORDER BY id;
SELECT count(*) AS cb_b_batches FROM gatekeeper.mail_claim WHERE queue = 'cb_b';

--
-- every mail of these queues is in exactly one place
--
SELECT m.queue, coalesce(array_length(string_to_array(pg_temp.where_is(m.id), ' '), 1), 0) AS places,
       count(*)
  FROM gatekeeper.mail m WHERE m.queue LIKE 'cb\_%'
 GROUP BY 1, 2 ORDER BY 1, 2;

--
-- reap(): a lapsed batch goes; its open mails back to scheduled, or
-- failed past max_attempts, or unknown for at_most_once
--
SELECT gatekeeper.create_queue('cb_once', max_attempts => 1);
SELECT gatekeeper.create_queue('cb_amo', delivery => 'at_most_once');
SELECT gatekeeper.enqueue('r' || i || '@example.com', 'R' || i, 'b', 'cb_a') AS r0
  FROM generate_series(0, 2) i ORDER BY 1 LIMIT 1 \gset
SELECT gatekeeper.enqueue('once@example.com', 'O', 'b', 'cb_once') AS o1 \gset
SELECT gatekeeper.enqueue('amo@example.com', 'M', 'b', 'cb_amo') AS m1 \gset
SELECT count(*) AS claimed FROM gatekeeper.claim('w4', 10, '1 hour', ARRAY['cb_a', 'cb_once', 'cb_amo']);
SELECT gatekeeper.ack(:r0, 1) AS acked_one;
SELECT gatekeeper.reap() AS reaped_none;
-- every batch lapses: these four open mails, and cb_gated's one from above
UPDATE gatekeeper.mail_claim SET lease_until = now() - interval '1 second' WHERE queue LIKE 'cb\_%';
SELECT gatekeeper.reap() AS reaped;
SELECT count(*) AS batches_left FROM gatekeeper.mail_claim WHERE queue LIKE 'cb\_%';
SELECT i AS r, pg_temp.where_is(:r0 + i) FROM generate_series(0, 2) i ORDER BY i;
SELECT pg_temp.where_is(:o1) AS o1, pg_temp.where_is(:m1) AS m1;
SELECT id - :r0 AS r, state, attempt, worker, last_error
  FROM gatekeeper.mail_live WHERE id IN (:r0 + 1, :r0 + 2) ORDER BY id;
-- a reaped mail is claimed again with the next attempt; the old claim is stale
SELECT count(*) AS reclaimed, min(attempt) AS attempt FROM gatekeeper.claim('w5', 10, queues => ARRAY['cb_a']);
SELECT gatekeeper.ack_batch(ARRAY[:r0 + 1, :r0 + 2], ARRAY[1, 1]) AS stale_ack;
SELECT gatekeeper.ack_batch(ARRAY[:r0 + 1, :r0 + 2], ARRAY[2, 2]) AS ack;
SELECT i AS r, pg_temp.where_is(:r0 + i) FROM generate_series(0, 2) i ORDER BY i;

--
-- status() and mail_status read a claimed mail from its batch
--
SELECT gatekeeper.enqueue('st' || i || '@example.com', 'S' || i, 'b', 'cb_a') AS st0
  FROM generate_series(0, 1) i ORDER BY 1 LIMIT 1 \gset
BEGIN;
SELECT count(*) AS claimed FROM gatekeeper.claim('w6', 10, '2 minutes', ARRAY['cb_a']);
SELECT id - :st0 AS st, state, attempt, message_id IS NOT NULL AS has_message_id, finished_at
  FROM gatekeeper.status(:st0);
SELECT id - :st0 AS st, state, attempt, worker, lease_until = now() + interval '2 minutes' AS lease
  FROM gatekeeper.mail_status WHERE id IN (:st0, :st0 + 1) ORDER BY id;
COMMIT;
SELECT gatekeeper.ack(:st0, 1) AS acked;
SELECT id - :st0 AS st, state, attempt, worker FROM gatekeeper.mail_status
 WHERE id IN (:st0, :st0 + 1) ORDER BY id;

--
-- a claimed mail keeps its dedupe key (gatekeeper.mail_key): an enqueue
-- of the key returns it, a bulk insert of the key fails and writes nothing;
-- once it is sent, the key (the queue's dedupe window is '0': held only
-- while unfinished) makes a new mail
--
SELECT gatekeeper.create_queue('cb_key', dedupe_window => '0');
SELECT gatekeeper.enqueue('k@example.com', 'K1', 'first', 'cb_key', dedupe_key => 'k') AS k1 \gset
SELECT count(*) AS claimed FROM gatekeeper.claim('w7', 10, queues => ARRAY['cb_key']);
SELECT pg_temp.where_is(:k1) AS k1;
SELECT gatekeeper.enqueue('k@example.com', 'K2', 'while claimed', 'cb_key', dedupe_key => 'k') = :k1
       AS same_id_while_claimed;
SELECT pg_temp.error_of($$
INSERT INTO gatekeeper.mail (recipient, subject, body, queue, dedupe_key)
VALUES ('k@example.com', 'K3', 'other', 'cb_key', 'other'),
       ('k@example.com', 'K3', 'insert', 'cb_key', 'k')
$$) AS insert_while_claimed;
COPY gatekeeper.mail (recipient, subject, body, queue, dedupe_key) FROM STDIN (FORMAT csv);
k@example.com,K4,copy,cb_key,other
k@example.com,K4,copy,cb_key,k
\.
SELECT count(*) AS mails, count(*) FILTER (WHERE l.id IS NOT NULL) AS live
  FROM gatekeeper.mail m LEFT JOIN gatekeeper.mail_live l USING (id) WHERE m.queue = 'cb_key';
SELECT dedupe_key, id = :k1 AS is_k1 FROM gatekeeper.mail_key WHERE queue = 'cb_key' ORDER BY 1;
-- sent: the key's row is stale, and the next enqueue takes it over
SELECT gatekeeper.ack(:k1, 1) AS acked;
SELECT dedupe_key, id = :k1 AS is_k1 FROM gatekeeper.mail_key WHERE queue = 'cb_key' ORDER BY 1;
SELECT gatekeeper.enqueue('k@example.com', 'K5', 'after sent', 'cb_key', dedupe_key => 'k') AS k2 \gset
SELECT :k2 <> :k1 AS new_id_after_sent;
SELECT dedupe_key, id = :k2 AS is_k2 FROM gatekeeper.mail_key WHERE queue = 'cb_key' ORDER BY 1;
-- held again, by a scheduled mail this time: the bulk insert fails as before
SELECT pg_temp.error_of($$
INSERT INTO gatekeeper.mail (recipient, subject, body, queue, dedupe_key)
VALUES ('k@example.com', 'K6', 'insert', 'cb_key', 'k')
$$) AS insert_while_scheduled;
SELECT id - :k1 AS k, state, body FROM gatekeeper.mail_status WHERE queue = 'cb_key' ORDER BY id;
-- a bulk insert takes over a stale key too, and purge's pass deletes the
-- stale rows no insert took over, and only those
SELECT count(*) AS claimed FROM gatekeeper.claim('w7', 10, queues => ARRAY['cb_key']);
SELECT gatekeeper.ack(:k2, 1) AS acked;
INSERT INTO gatekeeper.mail (recipient, subject, body, queue, dedupe_key)
VALUES ('k@example.com', 'K7', 'insert after sent', 'cb_key', 'k'),
       ('k@example.com', 'K7', 'other', 'cb_key', 'gone');
SELECT count(*) AS claimed FROM gatekeeper.claim('w7', 10, queues => ARRAY['cb_key']);
SELECT gatekeeper.ack(id, 1) AS acked FROM gatekeeper.mail
 WHERE queue = 'cb_key' AND dedupe_key = 'gone';
SELECT dedupe_key, gatekeeper._mail_key_held(id, queue, dedupe_key) AS held
  FROM gatekeeper.mail_key WHERE queue = 'cb_key' ORDER BY 1;
-- a batch whose window of pages covers the table: earlier tests' keys of
-- mail finished within their windows make it more than a page
SELECT gatekeeper._mail_key_prune(1000000) >= 1 AS pruned;
SELECT dedupe_key, gatekeeper._mail_key_held(id, queue, dedupe_key) AS held
  FROM gatekeeper.mail_key WHERE queue = 'cb_key' ORDER BY 1;
SELECT gatekeeper.enqueue('k@example.com', 'K8', 'held', 'cb_key', dedupe_key => 'k') =
       (SELECT id FROM gatekeeper.mail WHERE queue = 'cb_key' AND subject = 'K7' AND dedupe_key = 'k')
       AS same_id_claimed_again;
-- a scheduled mail whose key an update changed is found by its new key
SELECT gatekeeper.enqueue('k@example.com', 'K9', 'rekeyed', 'cb_key', dedupe_key => 'old') AS k9 \gset
UPDATE gatekeeper.mail SET dedupe_key = 'new' WHERE id = :k9;
SELECT gatekeeper.enqueue('k@example.com', 'K10', 'by new key', 'cb_key', dedupe_key => 'new') = :k9
       AS same_id_by_new_key;

--
-- nack, nack_batch, unclaim, extend and drop_queue on batches
--
SELECT gatekeeper.create_queue('cb_ops', max_attempts => 2);
SELECT gatekeeper.enqueue('op' || i || '@example.com', 'O' || i, 'b', 'cb_ops') AS op0
  FROM generate_series(0, 4) i ORDER BY 1 LIMIT 1 \gset
SELECT count(*) AS claimed FROM gatekeeper.claim('w7', 10, '1 minute', ARRAY['cb_ops']);
-- extend of one claim moves its batch's lease, for every open mail of it
BEGIN;
SELECT gatekeeper.extend(:op0, 1, '1 hour') AS extended, gatekeeper.extend(:op0, 2, '1 hour') AS wrong_attempt;
SELECT id - :op0 AS op, lease_until = now() + interval '1 hour' AS lease
  FROM gatekeeper.mail_status WHERE id BETWEEN :op0 AND :op0 + 4 ORDER BY id;
COMMIT;
-- the queue has no scheduled mail, but claimed mail: it is not dropped
SELECT pg_temp.error_of($$SELECT gatekeeper.drop_queue('cb_ops')$$) AS drop_claimed;
-- a retry goes back into mail_live, scheduled later; a permanent failure into mail_done
SELECT gatekeeper.nack(:op0, 1, '451 later') AS nack_retry,
       gatekeeper.nack(:op0, 1, '451 again') AS nack_stale,
       gatekeeper.nack(:op0 + 1, 1, '554 5.7.1 no', true) AS nack_failed;
SELECT gatekeeper.nack_batch(ARRAY[:op0 + 2, :op0 + 3, :op0 + 2, :op0], ARRAY[1, 1, 1, 1],
							 ARRAY['421 first', '421 busy', '421 repeat', '421 stale']) AS nacked;
SELECT gatekeeper.unclaim(ARRAY[:op0 + 4, :op0 + 4], ARRAY[1, 1], 'no relay', '10 minutes') AS unclaimed;
SELECT i AS op, pg_temp.where_is(:op0 + i) FROM generate_series(0, 4) i ORDER BY i;
SELECT id - :op0 AS op, state, attempt, uncharged, worker, last_error, send_at > now() AS later
  FROM gatekeeper.mail_status WHERE id BETWEEN :op0 AND :op0 + 4 ORDER BY id;
SELECT count(*) AS batches_left FROM gatekeeper.mail_claim WHERE queue = 'cb_ops';
-- queue_stats: claimed from the open mails of the batches, lapsed ones too
UPDATE gatekeeper.mail_live SET send_at = now() WHERE queue = 'cb_ops';
SELECT count(*) AS claimed FROM gatekeeper.claim('w8', 2, queues => ARRAY['cb_ops']);
SELECT scheduled, claimed, lease_expired FROM gatekeeper.queue_stats WHERE queue = 'cb_ops';
UPDATE gatekeeper.mail_claim SET lease_until = now() - interval '1 second' WHERE queue = 'cb_ops';
SELECT scheduled, claimed, lease_expired FROM gatekeeper.queue_stats WHERE queue = 'cb_ops';
SELECT pg_temp.error_of($$SELECT gatekeeper.drop_queue('cb_ops')$$) AS drop_lapsed;
SELECT gatekeeper.reap() AS reaped;
SELECT gatekeeper.cancel_queue('cb_ops') AS cancelled;
SELECT gatekeeper.drop_queue('cb_ops');

--
-- find() sees a claimed mail by its dedupe key, and the sent one after
--
SELECT gatekeeper.create_queue('cb_find');
SELECT gatekeeper.enqueue('f@example.com', 'F', 'b', 'cb_find', dedupe_key => 'fk') AS fk \gset
SELECT gatekeeper.find('cb_find', 'fk') = :fk AS found_scheduled;
SELECT count(*) AS claimed FROM gatekeeper.claim('wf', 1, '1 minute', ARRAY['cb_find']);
SELECT gatekeeper.find('cb_find', 'fk') = :fk AS found_claimed;
SELECT gatekeeper.ack(:fk, 1) AS acked;
SELECT gatekeeper.find('cb_find', 'fk') = :fk AS found_sent;

--
-- a large claim is kept in batch rows of up to 128 mails of consecutive
-- ids; a single ack touches its own row only; a shorter lease is one
-- mail's alone, a longer one its row's
--
SELECT gatekeeper.create_queue('cb_big');
SELECT min(gatekeeper.enqueue('big' || i || '@example.com', 'G' || i, 'b', 'cb_big')) AS g0
  FROM generate_series(0, 299) i \gset
SELECT count(*) AS claimed FROM gatekeeper.claim('wg', 300, '1 minute', ARRAY['cb_big']);
SELECT lo - :g0 AS lo, hi - :g0 AS hi, open, cardinality(mails) AS records,
       (SELECT min(r.id) = c.lo AND max(r.id) = c.hi FROM unnest(c.mails) r) AS range_holds
  FROM gatekeeper.mail_claim c WHERE queue = 'cb_big' ORDER BY lo;
SELECT count(*) AS open_once
  FROM (SELECT r.id FROM gatekeeper.mail_claim c, unnest(c.mails) r
         WHERE c.queue = 'cb_big' GROUP BY r.id HAVING count(*) = 1) o;
SELECT md5(string_agg(mails::text || gone::text, ',' ORDER BY lo)) AS rows_before
  FROM gatekeeper.mail_claim WHERE queue = 'cb_big' AND lo > :g0 \gset
SELECT gatekeeper.ack(:g0 + 5, 1) AS acked;
SELECT lo - :g0 AS lo, open, gone = ARRAY[:g0 + 5]::bigint[] AS gone_taken
  FROM gatekeeper.mail_claim WHERE queue = 'cb_big' AND lo = :g0;
SELECT md5(string_agg(mails::text || gone::text, ',' ORDER BY lo)) = :'rows_before' AS others_untouched
  FROM gatekeeper.mail_claim WHERE queue = 'cb_big' AND lo > :g0;
SELECT lease_until AS lease0 FROM gatekeeper.mail_claim WHERE queue = 'cb_big' AND lo = :g0 + 128 \gset
BEGIN;
-- shorter: nothing changes (a lease is never shortened, issue 44): the
-- mail stays in its row, with its row's lease
SELECT gatekeeper.extend(:g0 + 130, 1, '10 seconds') AS shortened;
SELECT id - :g0 AS g, lease_until = now() + interval '10 seconds' AS ten_seconds,
       lease_until = :'lease0' AS claims_lease
  FROM gatekeeper.mail_status WHERE id IN (:g0 + 129, :g0 + 130, :g0 + 131) ORDER BY id;
SELECT lo - :g0 AS lo, hi - :g0 AS hi, open FROM gatekeeper.mail_claim
 WHERE queue = 'cb_big' AND lo <= :g0 + 130 AND hi >= :g0 + 130 ORDER BY lo;
-- longer: the whole row the mail is open in, and no other row
SELECT gatekeeper.extend(:g0 + 1, 1, '1 hour') AS lengthened;
SELECT count(*) FILTER (WHERE lease_until = now() + interval '1 hour') AS hour,
       count(*) FILTER (WHERE lease_until = :'lease0') AS claims,
       count(*) FILTER (WHERE lease_until = now() + interval '10 seconds') AS seconds
  FROM gatekeeper.mail_status WHERE queue = 'cb_big' AND state = 'claimed';
COMMIT;
SELECT gatekeeper.extend(:g0 + 130, 2, '1 hour') AS wrong_attempt;
SELECT gatekeeper.ack_batch(array_agg(id), array_agg(attempt)) AS acked_rest
  FROM gatekeeper.mail_status WHERE queue = 'cb_big' AND state = 'claimed';
SELECT count(*) AS rows_left FROM gatekeeper.mail_claim WHERE queue = 'cb_big';
SELECT count(*) FILTER (WHERE state = 'sent') AS sent FROM gatekeeper.mail_status WHERE queue = 'cb_big';
SELECT gatekeeper.drop_queue('cb_big');
-- purge's pass over mail_key reads a window of pages, not the whole
-- table (at batch 100, one page): two stale keys pages apart, with 3,000
-- scheduled keyed mails between them, are not both pruned by one pass;
-- passes go on until they are
DO $$
BEGIN
	FOR i IN 1 .. 5000 LOOP
		EXIT WHEN NOT EXISTS (SELECT FROM gatekeeper.mail_key k
							   WHERE NOT gatekeeper._mail_key_held(k.id, k.queue, k.dedupe_key));
		PERFORM gatekeeper._mail_key_prune(100);
	END LOOP;
END
$$;
SELECT gatekeeper.create_queue('cb_prune', dedupe_window => '0');
SELECT gatekeeper.enqueue('p@example.com', 'P', 'stale', 'cb_prune', dedupe_key => 'stale-a') AS pa \gset
INSERT INTO gatekeeper.mail (recipient, subject, body, queue, dedupe_key, send_at)
SELECT 'p' || i || '@example.com', 'P', 'held', 'cb_prune', 'held-' || i, now() + interval '1 day'
  FROM generate_series(1, 3000) i;
SELECT gatekeeper.enqueue('p@example.com', 'P', 'stale', 'cb_prune', dedupe_key => 'stale-b') AS pb \gset
SELECT count(*) AS claimed FROM gatekeeper.claim('w8', 10, queues => ARRAY['cb_prune']);
SELECT gatekeeper.ack_batch(ARRAY[:pa, :pb]::bigint[], '{1,1}') AS acked;
SELECT abs((a.ctid::text::point)[0] - (b.ctid::text::point)[0]) > 1 AS pages_apart
  FROM gatekeeper.mail_key a, gatekeeper.mail_key b
 WHERE a.dedupe_key = 'stale-a' AND b.dedupe_key = 'stale-b';
SELECT gatekeeper._mail_key_prune(100) <= 1 AS pruned_at_most_one;
DO $$
BEGIN
	FOR i IN 1 .. 5000 LOOP
		EXIT WHEN NOT EXISTS (SELECT FROM gatekeeper.mail_key
							   WHERE queue = 'cb_prune' AND dedupe_key LIKE 'stale-%');
		PERFORM gatekeeper._mail_key_prune(100);
	END LOOP;
END
$$;
SELECT count(*) AS keys, count(*) FILTER (WHERE dedupe_key LIKE 'stale-%') AS stale
  FROM gatekeeper.mail_key WHERE queue = 'cb_prune';
DELETE FROM gatekeeper.mail WHERE queue = 'cb_prune';
SELECT gatekeeper.drop_queue('cb_prune');
