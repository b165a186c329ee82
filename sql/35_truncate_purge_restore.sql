-- The upkeep of a mail's state rows in C (issue 26, item 1): the TRUNCATE
-- trigger of gatekeeper.mail, purge's passes over mail_key and mail_claim,
-- and the restore triggers are LANGUAGE c entry points (src/
-- mail_state_upkeep.c) with a pinned search_path, which PUBLIC may not
-- run; the SQL functions nothing calls any more are gone.  Then what the
-- other tests do not reach: a dedupe key's row loaded by the owner (as a
-- restore loads it) replaces the holder's row, and a TRUNCATE of
-- gatekeeper.mail whose mail is mostly finished empties mail_key and
-- mail_done too.
SET client_min_messages = warning;
\set VERBOSITY terse
\i sql/error_of.inc

SELECT p.oid::regprocedure AS function, l.lanname AS language, p.prosecdef AS definer,
	   p.proconfig AS settings, has_function_privilege('public', p.oid, 'EXECUTE') AS public_may_run
  FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
 WHERE p.pronamespace = 'gatekeeper'::regnamespace
   AND p.proname IN ('_mail_truncate', '_mail_key_prune', '_mail_claim_shrink',
					 '_mail_live_restore', '_mail_key_restore')
 ORDER BY 1::text;

-- called by no SQL since their callers became C (0.3.0)
SELECT f AS orphan, to_regproc('gatekeeper.' || f) IS NULL AS dropped
  FROM unnest(ARRAY['_retry_delay', '_take_claimed', '_release_mail', '_release_mails']) AS f
 ORDER BY 1;
-- their C symbols stay, so that an older version's script still loads the
-- library, but a function created over one refuses (0A000) whatever it is
-- given
CREATE FUNCTION pg_temp._retry_delay() RETURNS interval
LANGUAGE c AS '$libdir/gatekeeper', 'gatekeeper_retry_delay_interval';
CREATE FUNCTION pg_temp._take_claimed(ids bigint[], attempts int[])
RETURNS SETOF gatekeeper.mail_live
LANGUAGE c AS '$libdir/gatekeeper', 'gatekeeper_take_claimed';
CREATE FUNCTION pg_temp._release_mail(recipient text, holder bigint) RETURNS int
LANGUAGE c AS '$libdir/gatekeeper', 'gatekeeper_release_mail';
CREATE FUNCTION pg_temp._release_mails(recipients text[], holders bigint[]) RETURNS int
LANGUAGE c AS '$libdir/gatekeeper', 'gatekeeper_release_mails';
SELECT pg_temp.error_of($$SELECT pg_temp._retry_delay()$$) AS retry_delay;
SELECT pg_temp.error_of($$SELECT * FROM pg_temp._take_claimed('{}', '{}')$$) AS take_claimed;
SELECT pg_temp.error_of($$SELECT pg_temp._release_mail('gone@example.com', 1)$$) AS release_mail;
SELECT pg_temp.error_of($$SELECT pg_temp._release_mails('{gone@example.com}', '{1}')$$) AS release_mails;

--
-- mail_key_restore: a key's row inserted by the owner replaces the row of
-- a key that is there (its id is the loaded one), a new key's row is
-- inserted, and a row without a key fails as the table's constraint says
--
SELECT gatekeeper.create_queue('mu_q');
SELECT gatekeeper.enqueue('mu1@example.com', 's', 'b', 'mu_q', dedupe_key => 'k1') AS k1 \gset
INSERT INTO gatekeeper.mail_key (queue, dedupe_key, id) VALUES ('mu_q', 'k1', :k1 + 1000);
INSERT INTO gatekeeper.mail_key (queue, dedupe_key, id) VALUES ('mu_q', 'k2', :k1 + 2000);
SELECT dedupe_key, id - :k1 AS id FROM gatekeeper.mail_key WHERE queue = 'mu_q' ORDER BY 1;
SELECT pg_temp.error_of($$INSERT INTO gatekeeper.mail_key (queue, dedupe_key, id) VALUES ('mu_q', NULL, 1)$$)
	   AS no_key;
SELECT count(*) AS keys FROM gatekeeper.mail_key WHERE queue = 'mu_q';
-- the holder's row loaded again: enqueue() finds the holder by it
INSERT INTO gatekeeper.mail_key (queue, dedupe_key, id) VALUES ('mu_q', 'k1', :k1);
SELECT gatekeeper.enqueue('mu1@example.com', 's', 'b', 'mu_q', dedupe_key => 'k1') = :k1 AS same_mail;
SELECT dedupe_key, id - :k1 AS id FROM gatekeeper.mail_key WHERE queue = 'mu_q' ORDER BY 1;
DELETE FROM gatekeeper.mail_key WHERE queue = 'mu_q' AND dedupe_key = 'k2';

--
-- TRUNCATE of gatekeeper.mail: finished mail's outcomes and the keys
-- their window holds go too, and the live row and count of mail due
-- later; a TRUNCATE when nothing is left at all (in a transaction rolled
-- back, so the other tests' mail stays)
--
BEGIN;
TRUNCATE gatekeeper.mail;
SELECT gatekeeper.enqueue('mu' || i || '@example.com', 's', 'b', 'mu_q', dedupe_key => 'd' || i) > 0 AS enqueued
  FROM generate_series(1, 3) AS i;
SELECT gatekeeper.ack_batch(array_agg(c.id), array_agg(c.attempt)) AS acked
  FROM gatekeeper.claim('mu', 10, queues => '{mu_q}') AS c;
SELECT gatekeeper.enqueue('later@example.com', 's', 'b', 'mu_q', send_at => now() + interval '1 day') > 0 AS later;
SELECT (SELECT count(*) FROM gatekeeper.mail_live) AS live,
	   (SELECT count(*) FROM gatekeeper.mail_claim) AS batches,
	   (SELECT count(*) FROM gatekeeper.mail_key) AS keys,
	   (SELECT count(*) FROM gatekeeper.mail_done) AS outcomes;
SELECT scheduled FROM gatekeeper.queue_stats WHERE queue = 'mu_q';
TRUNCATE gatekeeper.mail;
SELECT (SELECT count(*) FROM gatekeeper.mail_live) AS live,
	   (SELECT count(*) FROM gatekeeper.mail_claim) AS batches,
	   (SELECT count(*) FROM gatekeeper.mail_key) AS keys,
	   (SELECT count(*) FROM gatekeeper.mail_done) AS outcomes;
SELECT scheduled FROM gatekeeper.queue_stats WHERE queue = 'mu_q';
TRUNCATE gatekeeper.mail;
SELECT count(*) AS mail FROM gatekeeper.mail;
-- a new mail takes a key a finished one held before the TRUNCATE
SELECT gatekeeper.enqueue('mu1@example.com', 's', 'b', 'mu_q', dedupe_key => 'd1') > 0 AS enqueued;
SELECT state, count(*) FROM gatekeeper.mail_status WHERE queue = 'mu_q' GROUP BY state ORDER BY 1;
ROLLBACK;

SELECT gatekeeper.cancel_queue('mu_q') AS cancelled;
DELETE FROM gatekeeper.mail WHERE queue = 'mu_q';
SELECT gatekeeper.drop_queue('mu_q');
