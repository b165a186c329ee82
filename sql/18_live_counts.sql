-- Live counts: queue_stats' scheduled comes from
-- gatekeeper.mail_live_count, kept by every statement that changes
-- mail_live, not from a count of mail_live; due is counted on the smaller
-- side of now(); claimed from the open counts of mail_claim's batches.
-- After each way a mail changes state, the counts must be what mail_live
-- and the batches hold, for every queue of the database.
SET client_min_messages = warning;
\set VERBOSITY terse

\i sql/error_of.inc

-- queues whose kept counts differ from mail_live's rows and the claimed
-- mail in mail_claim's batches, or from the due mail, the oldest due mail
-- and the lapsed leases (queue_stats counts due
-- mail in one pass for queues of up to 1,000 scheduled mails, larger ones
-- by _live_due: lc_b below has 4,024)
CREATE FUNCTION pg_temp.miscounted() RETURNS text
LANGUAGE sql AS $$
	SELECT coalesce(string_agg(format('%s: kept %s/%s/%s/%s, counted %s/%s/%s/%s', s.queue,
									  s.scheduled, s.claimed, s.due, s.lease_expired,
									  coalesce(r.scheduled, 0), coalesce(r.claimed, 0),
									  coalesce(r.due, 0), coalesce(r.lease_expired, 0)),
							   '; ' ORDER BY s.queue), 'none')
	  FROM gatekeeper.queue_stats s
	  LEFT JOIN (
		SELECT l.queue,
			   count(*) FILTER (WHERE l.state = 'scheduled') AS scheduled,
			   count(*) FILTER (WHERE l.state = 'claimed') AS claimed,
			   count(*) FILTER (WHERE l.state = 'scheduled' AND l.send_at <= now()) AS due,
			   min(l.send_at) FILTER (WHERE l.state = 'scheduled' AND l.send_at <= now()) AS oldest,
			   count(*) FILTER (WHERE l.state = 'claimed' AND l.lease_until < now()) AS lease_expired
		  FROM (SELECT l.queue, l.state, l.send_at, NULL::timestamptz AS lease_until FROM gatekeeper.mail_live l
				UNION ALL
				-- the mails of runs: scheduled
				SELECT r.queue, 'scheduled', r.send_at, NULL
				  FROM gatekeeper.mail_run r CROSS JOIN LATERAL generate_series(r.id, r.last_id)
				UNION ALL
				-- claimed mail: each record of a batch whose mail has not left it
				SELECT r.queue, r.state, r.send_at, c.lease_until
				  FROM gatekeeper.mail_claim c CROSS JOIN LATERAL unnest(c.mails) r
				 WHERE NOT r.id = ANY (c.gone)) l
		 GROUP BY l.queue) r ON r.queue = s.queue
	 WHERE s.scheduled <> coalesce(r.scheduled, 0)
		OR s.claimed <> coalesce(r.claimed, 0)
		OR s.due <> coalesce(r.due, 0)
		OR s.lease_expired <> coalesce(r.lease_expired, 0)
		OR s.oldest_due_age IS DISTINCT FROM now() - r.oldest
$$;

SELECT gatekeeper.create_queue('lc_a', max_attempts => 2);
SELECT gatekeeper.create_queue('lc_b');
SELECT gatekeeper.create_queue('lc_gated', gates => '{smart_sending}', on_gate_closed => 'defer');

-- enqueue() one at a time, a multi-row INSERT, a COPY
SELECT count(gatekeeper.enqueue('lc' || i || '@example.com', 's', 'b', 'lc_a'))
  FROM generate_series(1, 5) AS i;
INSERT INTO gatekeeper.mail (queue, recipient, subject, body, send_at, priority)
SELECT 'lc_b', 'lcb' || i || '@example.com', 's', 'b', now() + (i % 2) * interval '1 day', i % 3
  FROM generate_series(1, 30) AS i;
COPY gatekeeper.mail (queue, recipient, subject, body) FROM stdin;
lc_a	copy1@example.com	s	b
lc_a	copy2@example.com	s	b
\.
SELECT queue, scheduled, due, claimed FROM gatekeeper.queue_stats WHERE queue LIKE 'lc\_%' ORDER BY queue;
SELECT pg_temp.miscounted() AS after_enqueue;

-- a statement that fails counts nothing; nor does a rolled-back one
SELECT pg_temp.error_of($$INSERT INTO gatekeeper.mail (queue, recipient, subject, body)
	VALUES ('lc_a', 'fine@example.com', 's', 'b'), ('lc_a', 'not an address', 's', 'b')$$) AS bad_row;
BEGIN;
SELECT gatekeeper.enqueue('rolled@example.com', 's', 'b', 'lc_a') > 0 AS enqueued;
ROLLBACK;
SELECT pg_temp.miscounted() AS after_failures;

-- claims, an ack, a nack that retries and one that fails the mail, a
-- hand-back, a lease extended, a claim in a rolled-back savepoint
CREATE TEMP TABLE c AS SELECT id, attempt FROM gatekeeper.claim('lc', 4, queues => '{lc_a}');
SELECT count(*) AS claimed FROM c;
SELECT pg_temp.miscounted() AS after_claim;
SELECT gatekeeper.ack(id, attempt) FROM c ORDER BY id LIMIT 1;
SELECT gatekeeper.nack(id, attempt, 'try again') FROM c ORDER BY id OFFSET 1 LIMIT 1;
SELECT gatekeeper.nack(id, attempt, 'no such user', true) FROM c ORDER BY id OFFSET 2 LIMIT 1;
SELECT gatekeeper.extend(id, attempt, '1 hour') FROM c ORDER BY id OFFSET 3;
SELECT pg_temp.miscounted() AS after_ack_nack;
SELECT gatekeeper.unclaim(array_agg(id), array_agg(attempt), 'no relay') FROM c WHERE id = (SELECT max(id) FROM c);
BEGIN;
SAVEPOINT s;
SELECT count(*) AS claimed_then_undone FROM gatekeeper.claim('lc', 100, queues => '{lc_a}');
ROLLBACK TO SAVEPOINT s;
COMMIT;
SELECT pg_temp.miscounted() AS after_unclaim_rollback;

-- a lapsed lease, seen by queue_stats, then reaped
SELECT count(*) AS claimed FROM gatekeeper.claim('lc', 2, '1 second', '{lc_a}');
UPDATE gatekeeper.mail_claim SET lease_until = now() - interval '1 minute'
 WHERE queue = 'lc_a';
SELECT lease_expired FROM gatekeeper.queue_stats WHERE queue = 'lc_a';
SELECT pg_temp.miscounted() AS with_lapsed_lease;
SELECT gatekeeper.reap() >= 2 AS reaped;
SELECT pg_temp.miscounted() AS after_reap;

-- a gate that defers the second mail to one recipient, and a suppressed
-- recipient the claim finishes
SELECT gatekeeper.enqueue('same@example.com', 's', 'b', 'lc_gated') > 0,
	   gatekeeper.enqueue('same@example.com', 's', 'b', 'lc_gated') > 0,
	   gatekeeper.enqueue('gone@example.com', 's', 'b', 'lc_gated') > 0;
SELECT gatekeeper.suppress('gone@example.com');
SELECT count(*) AS claimed FROM gatekeeper.claim('lc', 10, queues => '{lc_gated}');
SELECT state, count(*) FROM gatekeeper.mail_status WHERE queue = 'lc_gated' GROUP BY 1 ORDER BY 1;
SELECT pg_temp.miscounted() AS after_gate_and_suppression;

-- mail past its send_by expires in the claim
SELECT gatekeeper.enqueue('late@example.com', 's', 'b', 'lc_a', send_at => now() - interval '2 seconds',
						  send_by => now() - interval '1 second') > 0;
SELECT count(*) AS claimed FROM gatekeeper.claim('lc', 100, queues => '{lc_a}');
SELECT state, last_error FROM gatekeeper.mail_status WHERE recipient = 'late@example.com';
SELECT pg_temp.miscounted() AS after_expiry;

-- the owner moves mail between queues and deletes it; cancel, cancel_queue
UPDATE gatekeeper.mail SET queue = 'lc_a'
 WHERE id IN (SELECT id FROM gatekeeper.mail_live WHERE queue = 'lc_b' AND state = 'scheduled' ORDER BY id LIMIT 3);
DELETE FROM gatekeeper.mail
 WHERE id IN (SELECT id FROM gatekeeper.mail_live WHERE queue = 'lc_b' AND state = 'scheduled' ORDER BY id LIMIT 2);
SELECT gatekeeper.cancel((SELECT min(id) FROM gatekeeper.mail_live WHERE queue = 'lc_b'));
SELECT pg_temp.miscounted() AS after_owner_changes;
SELECT gatekeeper.cancel_queue('lc_a') > 0 AS cancelled;
SELECT pg_temp.miscounted() AS after_cancel_queue;

-- due on either side of now(): more than one counting round on each side,
-- over three priorities (1,500 due and 2,500 not yet; then 1,500 and 10)
INSERT INTO gatekeeper.mail (queue, recipient, subject, body, priority, send_at)
SELECT 'lc_b', 'big' || i || '@example.com', 's', 'b', i % 3,
	   CASE WHEN i <= 1500 THEN now() - interval '1 hour' ELSE now() + interval '1 hour' END
  FROM generate_series(1, 4000) AS i;
SELECT scheduled, due FROM gatekeeper.queue_stats WHERE queue = 'lc_b';
SELECT pg_temp.miscounted() AS both_sides_large;
DELETE FROM gatekeeper.mail
 WHERE id IN (SELECT id FROM gatekeeper.mail_live
			   WHERE queue = 'lc_b' AND send_at > now() ORDER BY id OFFSET 10);
SELECT scheduled, due FROM gatekeeper.queue_stats WHERE queue = 'lc_b';
SELECT pg_temp.miscounted() AS few_not_due;

-- rotation moves live mail between segments: nothing to count (four
-- rotations: the last moves the live mail out of segment 0 into 3)
CREATE TEMP VIEW lc_live AS
SELECT l.segment FROM gatekeeper.mail_live l WHERE l.queue LIKE 'lc\_%'
UNION ALL
-- claimed mail: its record in its batch names its segment
SELECT r.segment FROM gatekeeper.mail_claim c CROSS JOIN LATERAL unnest(c.mails) r
 WHERE r.queue LIKE 'lc\_%' AND NOT r.id = ANY (c.gone);
SELECT array_agg(DISTINCT segment) AS live_segments FROM lc_live;
SELECT gatekeeper._rotate('0 seconds') >= 0 AS rotated;
SELECT gatekeeper._rotate('0 seconds') >= 0 AS rotated;
SELECT gatekeeper._rotate('0 seconds') >= 0 AS rotated;
SELECT gatekeeper._rotate('0 seconds') >= 0 AS rotated;
SELECT array_agg(DISTINCT segment) AS live_segments, count(*) AS live FROM lc_live;
DROP VIEW lc_live;
SELECT pg_temp.miscounted() AS after_rotation;

-- a queue dropped once empty, in the transaction that cancelled its mail,
-- counts nothing when made again
SELECT gatekeeper.ack(id, attempt) FROM gatekeeper.mail_status WHERE queue = 'lc_gated' AND state = 'claimed';
BEGIN;
SELECT gatekeeper.cancel_queue('lc_gated') AS cancelled;
SELECT gatekeeper.drop_queue('lc_gated');
COMMIT;
SELECT count(*) AS rows_of_the_dropped_queue FROM gatekeeper.mail_live_count
 WHERE queue = 'lc_gated';
SELECT gatekeeper.create_queue('lc_gated');
SELECT scheduled, due, claimed FROM gatekeeper.queue_stats WHERE queue = 'lc_gated';
SELECT pg_temp.miscounted() AS after_drop_queue;
-- a drop rolled back to a savepoint leaves the rows and what the
-- transaction noted
SELECT gatekeeper.create_queue('lc_kept');
SELECT gatekeeper.enqueue('kept1@example.com', 's', 'b', 'lc_kept') > 0 AS enqueued;
BEGIN;
SELECT gatekeeper.cancel_queue('lc_kept') AS cancelled;
SAVEPOINT d;
SELECT gatekeeper.drop_queue('lc_kept');
ROLLBACK TO SAVEPOINT d;
SELECT gatekeeper.enqueue('kept2@example.com', 's', 'b', 'lc_kept') > 0 AS enqueued;
COMMIT;
SELECT scheduled FROM gatekeeper.queue_stats WHERE queue = 'lc_kept';
SELECT pg_temp.miscounted() AS after_drop_rolled_back;

-- many statements in one transaction, and savepoints rolled back among
-- them: one write of the counts at the commit
BEGIN;
SELECT count(gatekeeper.enqueue('many' || i || '@example.com', 's', 'b', 'lc_gated')) FROM generate_series(1, 50) AS i;
SAVEPOINT a;
SELECT count(*) AS claimed FROM gatekeeper.claim('lc', 20, queues => '{lc_gated}');
SAVEPOINT b;
SELECT gatekeeper.cancel_queue('lc_gated') AS cancelled;
ROLLBACK TO SAVEPOINT b;
RELEASE SAVEPOINT a;
SAVEPOINT c;
SELECT count(gatekeeper.enqueue('undone' || i || '@example.com', 's', 'b', 'lc_gated')) FROM generate_series(1, 5) AS i;
ROLLBACK TO SAVEPOINT c;
COMMIT;
SELECT scheduled, claimed FROM gatekeeper.queue_stats WHERE queue = 'lc_gated';
SELECT pg_temp.miscounted() AS after_savepoints;

-- a transaction's changes are written once, at its commit, however many
-- statements made them (written per statement, the same row's versions,
-- none prunable before the commit, made each update slower than the last)
SELECT pg_stat_force_next_flush();
SELECT n_tup_ins + n_tup_upd AS writes_before FROM pg_stat_user_tables
 WHERE relid = 'gatekeeper.mail_live_count'::regclass \gset
BEGIN;
DO $$
BEGIN
	FOR i IN 1..20 LOOP
		PERFORM gatekeeper.enqueue('loop' || i || '@example.com', 's', 'b', 'lc_gated');
	END LOOP;
END
$$;
COMMIT;
SELECT pg_stat_force_next_flush();
SELECT n_tup_ins + n_tup_upd - :writes_before AS count_writes FROM pg_stat_user_tables
 WHERE relid = 'gatekeeper.mail_live_count'::regclass;
SELECT pg_temp.miscounted() AS after_loop;

-- a loop of subtransactions (an exception block per enqueue, every third
-- rolled back): each committed one's changes join its parent's
DO $$
BEGIN
	FOR i IN 1..30 LOOP
		BEGIN
			PERFORM gatekeeper.enqueue('sub' || i || '@example.com', 's', 'b',
									   CASE WHEN i % 2 = 0 THEN 'lc_a' ELSE 'lc_b' END);
			IF i % 3 = 0 THEN
				RAISE EXCEPTION 'rolled back';
			END IF;
		EXCEPTION WHEN raise_exception THEN
			NULL;
		END;
	END LOOP;
END
$$;
SELECT count(*) AS kept FROM gatekeeper.mail_status WHERE recipient LIKE 'sub%';
SELECT pg_temp.miscounted() AS after_subtransaction_loop;

-- a procedure that commits as it goes: each of its transactions writes
-- its own counts
CREATE PROCEDURE pg_temp.enqueue_and_commit() LANGUAGE plpgsql AS $$
BEGIN
	PERFORM gatekeeper.enqueue('proc1@example.com', 's', 'b', 'lc_gated');
	COMMIT;
	PERFORM gatekeeper.enqueue('proc2@example.com', 's', 'b', 'lc_gated');
	ROLLBACK;
	PERFORM gatekeeper.enqueue('proc3@example.com', 's', 'b', 'lc_gated');
	COMMIT;
END
$$;
CALL pg_temp.enqueue_and_commit();
SELECT string_agg(recipient, ',' ORDER BY recipient) AS kept FROM gatekeeper.mail_status
 WHERE recipient LIKE 'proc%';
SELECT pg_temp.miscounted() AS after_procedure;

-- TRUNCATE empties the counts with the table, and what the transaction
-- counted before it; a TRUNCATE rolled back to a savepoint leaves both
-- (claimed mail is in mail_claim: the live mail is both tables)
BEGIN;
SELECT count(*) AS claimed FROM gatekeeper.claim('lc', 5, queues => '{lc_gated}');
SAVEPOINT t;
TRUNCATE gatekeeper.mail_live, gatekeeper.mail_claim;
ROLLBACK TO SAVEPOINT t;
SELECT gatekeeper.enqueue('kept@example.com', 's', 'b', 'lc_gated') > 0 AS enqueued;
COMMIT;
SELECT pg_temp.miscounted() AS after_truncate_undone;
BEGIN;
SELECT count(*) AS claimed FROM gatekeeper.claim('lc', 5, queues => '{lc_gated}');
TRUNCATE gatekeeper.mail_live, gatekeeper.mail_claim;
SELECT count(*) AS counts_left FROM gatekeeper.mail_live_count;
SELECT gatekeeper.enqueue('after@example.com', 's', 'b', 'lc_gated') > 0 AS enqueued;
SAVEPOINT u;
SELECT gatekeeper.enqueue('after2@example.com', 's', 'b', 'lc_gated') > 0 AS enqueued;
ROLLBACK TO SAVEPOINT u;
COMMIT;
SELECT queue, scheduled, claimed FROM gatekeeper.queue_stats WHERE scheduled + claimed > 0 ORDER BY queue;
SELECT pg_temp.miscounted() AS after_truncate;

-- inside a transaction that changed live mail, queue_stats counts its
-- changes, not yet written, with the committed ones: the counts agree
-- with the mail_live that transaction sees, due too (lc_big: 1,001 due
-- committed, then 999 for tomorrow uncommitted, _live_due's side)
SELECT gatekeeper.create_queue('lc_big');
INSERT INTO gatekeeper.mail (queue, recipient, subject, body, send_at)
SELECT 'lc_big', 'big' || i || '@example.com', 's', 'b', now() - interval '1 minute'
  FROM generate_series(1, 1001) AS i;
BEGIN;
INSERT INTO gatekeeper.mail (queue, recipient, subject, body, send_at)
SELECT 'lc_big', 'later' || i || '@example.com', 's', 'b', now() + interval '1 day'
  FROM generate_series(1, 999) AS i;
SELECT count(gatekeeper.enqueue('inside' || i || '@example.com', 's', 'b', 'lc_a')) AS enqueued
  FROM generate_series(1, 3) AS i;
SELECT count(*) AS claimed FROM gatekeeper.claim('lc', 2, queues => '{lc_a}');
SELECT scheduled, due, claimed FROM gatekeeper.queue_stats WHERE queue = 'lc_big';
SELECT pg_temp.miscounted() AS inside_a_transaction;
ROLLBACK;
SELECT pg_temp.miscounted() AS after_rollback;

-- a write to mail_live with its triggers disabled (as a data-only
-- pg_restore --disable-triggers makes them) is not counted, and
-- recount_live() counts mail_live afresh: what its transaction noted
-- before it is in the new count, what it notes after is added at the
-- commit, and a savepoint rolled back brings the old counts back (the
-- queue dropped first leaves no rows: drop_queue deletes them)
SELECT gatekeeper.create_queue('lc_gone');
SELECT gatekeeper.enqueue('gone@example.com', 's', 'b', 'lc_gone') > 0 AS enqueued;
SELECT gatekeeper.cancel_queue('lc_gone');
SELECT gatekeeper.drop_queue('lc_gone');
SELECT count(*) AS rows_summing_to_nothing FROM (
	SELECT queue FROM gatekeeper.mail_live_count
	 GROUP BY queue HAVING sum(scheduled) = 0) z;
SELECT gatekeeper.enqueue('unseen' || i || '@example.com', 's', 'b', 'lc_gated') > 0 AS enqueued
  FROM generate_series(1, 3) i;
ALTER TABLE gatekeeper.mail_live DISABLE TRIGGER mail_live_count_delete;
DELETE FROM gatekeeper.mail_live l USING gatekeeper.mail m
 WHERE m.id = l.id AND m.recipient LIKE 'unseen%';
ALTER TABLE gatekeeper.mail_live ENABLE ALWAYS TRIGGER mail_live_count_delete;
SELECT pg_temp.miscounted() AS with_unseen_delete;
BEGIN;
SELECT gatekeeper.enqueue('before_recount@example.com', 's', 'b', 'lc_gated') > 0 AS enqueued;
SAVEPOINT r;
SELECT gatekeeper.recount_live() = (SELECT count(*) FROM gatekeeper.mail_status WHERE state = 'scheduled') AS recounted;
ROLLBACK TO SAVEPOINT r;
COMMIT;
SELECT pg_temp.miscounted() AS after_recount_rolled_back;
BEGIN;
SELECT gatekeeper.enqueue('before_recount2@example.com', 's', 'b', 'lc_gated') > 0 AS enqueued;
SELECT gatekeeper.recount_live() = (SELECT count(*) FROM gatekeeper.mail_status WHERE state = 'scheduled') AS recounted;
SELECT gatekeeper.enqueue('after_recount@example.com', 's', 'b', 'lc_gated') > 0 AS enqueued;
COMMIT;
SELECT pg_temp.miscounted() AS after_recount;
SELECT count(*) AS rows_summing_to_nothing FROM (
	SELECT queue FROM gatekeeper.mail_live_count
	 GROUP BY queue HAVING sum(scheduled) = 0) z;
-- a transaction snapshot older than the lock would miss what committed
-- while it waited: refused
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT pg_temp.error_of($$SELECT gatekeeper.recount_live()$$) AS repeatable_read;
ROLLBACK;

-- a commit adds its changes to the rows of its session that exist past
-- the executor; with a trigger of the user's on mail_live_count's
-- updates, by the statement, which fires it (once for the enqueues' commit,
-- once for the claim's): the same counts either way
CREATE TEMP TABLE count_updates (n int);
CREATE FUNCTION pg_temp.count_update() RETURNS trigger LANGUAGE plpgsql AS
$$BEGIN INSERT INTO count_updates VALUES (1); RETURN NULL; END$$;
SELECT gatekeeper.enqueue('direct' || i || '@example.com', 's', 'b', 'lc_gated') > 0 AS enqueued
  FROM generate_series(1, 2) i;
SELECT pg_temp.miscounted() AS counts_updated_directly;
CREATE TRIGGER count_noted AFTER UPDATE ON gatekeeper.mail_live_count
	FOR EACH STATEMENT EXECUTE FUNCTION pg_temp.count_update();
SELECT gatekeeper.enqueue('noted' || i || '@example.com', 's', 'b', 'lc_gated') > 0 AS enqueued
  FROM generate_series(1, 2) i;
SELECT count(*) AS claimed FROM gatekeeper.claim('lc', 1, queues => '{lc_gated}');
DROP TRIGGER count_noted ON gatekeeper.mail_live_count;
SELECT count(*) AS statements_fired FROM count_updates;
SELECT pg_temp.miscounted() AS counts_updated_by_the_statement;

-- the extension dropped and made again in the transaction that changed
-- its live mail: what was noted for the dropped tables is not counted in
-- the new ones, what was noted after is
BEGIN;
SELECT gatekeeper.enqueue('dropped@example.com', 's', 'b') > 0 AS enqueued;
DROP EXTENSION gatekeeper;
CREATE EXTENSION gatekeeper;
SELECT gatekeeper.enqueue('kept@example.com', 's', 'b') > 0 AS enqueued;
COMMIT;
SELECT queue, scheduled FROM gatekeeper.queue_stats WHERE scheduled > 0;
SELECT pg_temp.miscounted() AS after_extension_made_again;
