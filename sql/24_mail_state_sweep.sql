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
