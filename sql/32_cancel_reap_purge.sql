-- Issue 26, item 1: every change of a mail's state is made in C
-- (src/mail_state_sweep.c for these): reap, the three cancels, the
-- _mail_sync trigger, _rotate and purge are LANGUAGE c entry points, each
-- with its pinned search_path and none executable by PUBLIC.
SET client_min_messages = warning;
\set VERBOSITY terse
SELECT p.oid::regprocedure AS function, l.lanname AS language,
	   p.proconfig AS config,
	   pg_catalog.has_function_privilege('public', p.oid, 'EXECUTE') AS public_may_run
  FROM pg_catalog.pg_proc p
  JOIN pg_catalog.pg_language l ON l.oid = p.prolang
 WHERE p.pronamespace = 'gatekeeper'::regnamespace
   AND p.proname IN ('reap', 'cancel', 'cancel_queue', '_mail_sync', '_rotate', 'purge')
 ORDER BY p.oid::regprocedure::text;

-- their bad input, as before: SQLSTATE and message, nothing written
\i sql/error_of.inc
SELECT pg_temp.error_of($$SELECT gatekeeper.cancel(NULL::bigint)$$) AS cancel_null_id;
SELECT pg_temp.error_of($$SELECT gatekeeper.cancel(NULL::text, NULL::text)$$) AS cancel_null_key;
SELECT pg_temp.error_of($$SELECT gatekeeper.cancel_queue(NULL)$$) AS cancel_queue_null;
SELECT pg_temp.error_of($$SELECT gatekeeper.cancel_queue('no_such_queue')$$) AS cancel_queue_unknown;
SELECT pg_temp.error_of($$SELECT gatekeeper.cancel('no_such_queue', 'k')$$) AS cancel_key_unknown;
SELECT pg_temp.error_of($$SELECT gatekeeper.purge(NULL)$$) AS purge_null;
SELECT pg_temp.error_of($$SELECT gatekeeper.purge(0)$$) AS purge_zero;

-- cancel: scheduled mail only, once; by key; a queue's scheduled mail
SELECT gatekeeper.create_queue('sw');
INSERT INTO gatekeeper.mail (queue, recipient, subject, body, dedupe_key, send_at)
SELECT 'sw', 'sw' || i || '@example.com', 'S' || i, 'b', 'k' || i, now() - interval '1 minute'
  FROM generate_series(1, 5) i;
SELECT gatekeeper.cancel(id) AS first, gatekeeper.cancel(id) AS again
  FROM gatekeeper.mail WHERE recipient = 'sw1@example.com';
SELECT gatekeeper.cancel('sw', 'k2') AS by_key, gatekeeper.cancel('sw', 'k2') AS by_key_again,
	   gatekeeper.cancel('sw', 'no-such-key') AS no_such_key;
-- one claimed: cancel_queue leaves it, and cancel of it is false
SELECT count(*) AS claimed FROM gatekeeper.claim('w', 1, queues => ARRAY['sw']);
SELECT gatekeeper.cancel('sw', m.dedupe_key) AS cancel_claimed
  FROM gatekeeper.mail_status m WHERE m.queue = 'sw' AND m.state = 'claimed';
SELECT gatekeeper.cancel_queue('sw') AS cancelled_queue;
SELECT state, count(*) FROM gatekeeper.mail_status WHERE queue = 'sw' GROUP BY state ORDER BY state;
-- the claim's lease ran out: reap schedules it again, once, with its why
UPDATE gatekeeper.mail_claim SET lease_until = now() - interval '1 second' WHERE queue = 'sw';
SELECT gatekeeper.reap() AS reaped, gatekeeper.reap() AS reaped_again;
SELECT state, attempt, last_error FROM gatekeeper.mail_status
 WHERE queue = 'sw' AND state <> 'cancelled' ORDER BY id;

-- _mail_sync: an owner's UPDATE that gives a mail a key another holds is
-- refused with 23505, naming the constraint, with a detail saying who
-- holds it; nothing is written
CREATE FUNCTION pg_temp.violation_of(sql text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
	c text;
	d text;
BEGIN
	EXECUTE sql;
	RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS c = CONSTRAINT_NAME, d = PG_EXCEPTION_DETAIL;
	RETURN SQLSTATE || ' ' || c || ': ' || d;
END
$$;
SELECT gatekeeper.create_queue('sy');
SELECT gatekeeper.create_queue('sy2');
INSERT INTO gatekeeper.mail (queue, recipient, subject, body, dedupe_key, send_at)
VALUES ('sy', 'sy1@example.com', 'S1', 'b', 'held', now() - interval '2 minutes'),
	   ('sy', 'sy2@example.com', 'S2', 'b', 'k2', now() - interval '1 minute'),
	   ('sy', 'sy3@example.com', 'S3', 'b', 'waits', now() + interval '1 hour');
SELECT count(*) AS claimed FROM gatekeeper.claim('w', 2, queues => ARRAY['sy']);
SELECT pg_temp.violation_of($$UPDATE gatekeeper.mail SET dedupe_key = 'held'
							   WHERE recipient = 'sy3@example.com'$$) AS scheduled_takes_claimed_key;
SELECT pg_temp.violation_of($$UPDATE gatekeeper.mail SET dedupe_key = 'waits'
							   WHERE recipient = 'sy2@example.com'$$) AS claimed_takes_scheduled_key;
SELECT pg_temp.violation_of($$UPDATE gatekeeper.mail SET dedupe_key = 'held'
							   WHERE recipient = 'sy2@example.com'$$) AS claimed_takes_claimed_key;
-- a claimed mail moved to another queue with its key keeps holding it there
UPDATE gatekeeper.mail SET queue = 'sy2' WHERE recipient = 'sy1@example.com';
SELECT k.queue, k.dedupe_key, m.recipient
  FROM gatekeeper.mail_key k JOIN gatekeeper.mail m ON m.id = k.id
 WHERE k.queue LIKE 'sy%' ORDER BY k.queue, k.dedupe_key;
SELECT c.queue AS batch_queue, r.queue, r.dedupe_key, m.recipient
  FROM gatekeeper.mail_claim c, unnest(c.mails) r, gatekeeper.mail m
 WHERE m.id = r.id AND NOT r.id = ANY (c.gone) AND c.queue LIKE 'sy%'
 ORDER BY m.recipient;
-- sy2 acked (an outcome), sy1 still claimed, sy3 scheduled: a DELETE takes
-- them all along (batch, live row, outcome), and sy1's claimer's ack of it
-- is false
SELECT gatekeeper.ack(m.id, 1) AS acked FROM gatekeeper.mail m WHERE m.recipient = 'sy2@example.com';
SELECT id AS sy1 FROM gatekeeper.mail WHERE recipient = 'sy1@example.com' \gset
DELETE FROM gatekeeper.mail WHERE queue IN ('sy', 'sy2');
SELECT (SELECT count(*) FROM gatekeeper.mail_claim WHERE queue LIKE 'sy%') AS batches,
	   (SELECT count(*) FROM gatekeeper.mail_live WHERE queue LIKE 'sy%') AS live,
	   (SELECT count(*) FROM gatekeeper.mail_done WHERE queue LIKE 'sy%') AS done,
	   (SELECT count(*) FROM gatekeeper.mail_key k WHERE k.queue LIKE 'sy%'
		   AND gatekeeper._mail_key_held(k.id, k.queue, k.dedupe_key)) AS keys_held;
SELECT gatekeeper.ack(:sy1, 1) AS deleted_claim_acked;
