-- The life of a mail: claim, ack, nack, extend, reap, cancel, pause.
SET client_min_messages = warning;
\set VERBOSITY terse

\i sql/error_of.inc

-- (retry_for => '0': these queues' mail fails once its attempts are spent,
-- however recently it was first deferred; retry_for is tried below)
SELECT gatekeeper.create_queue('c_main', max_attempts => 4, retry_for => '0');
SELECT gatekeeper.create_queue('c_other');
SELECT gatekeeper.create_queue('c_paused');
SELECT gatekeeper.create_queue('c_amo', delivery => 'at_most_once');
SELECT gatekeeper.create_queue('c_once', max_attempts => 1, retry_for => '0');

--
-- claim returns due mail only: not future mail, not paused queues, not
-- queues left out of the filter
--
SELECT gatekeeper.pause('c_paused');
SELECT gatekeeper.enqueue('due@example.com', 'Due', 'b', 'c_main', sender => 'news@shop.example',
                          html => '<p>h</p>', headers => '{"X-Campaign": "c"}') AS due \gset
SELECT gatekeeper.enqueue('future@example.com', 'Future', 'b', 'c_main', send_at => now() + interval '1 hour') AS future \gset
SELECT gatekeeper.enqueue('other@example.com', 'Other', 'b', 'c_other') AS other \gset
SELECT gatekeeper.enqueue('paused@example.com', 'Paused', 'b', 'c_paused') AS paused \gset

BEGIN;
SELECT id = :due AS is_due, attempt, queue, recipient, sender, subject, body, html, headers,
       message_id ~ ('^<' || :due || '\.[a-z2-7]{20}@shop\.example>$') AS message_id_shape
  FROM gatekeeper.claim('w1', 10, queues => ARRAY['c_main', 'c_paused']) ORDER BY id;
SELECT state, attempt, worker, lease_until = now() + interval '5 minutes' AS default_lease
  FROM gatekeeper.mail_status WHERE id = :due;
COMMIT;
SELECT id = :other AS is_other, queue FROM gatekeeper.claim('w1', 10, '1 minute', ARRAY['c_other']) ORDER BY id;
-- nothing else is due anywhere: an unfiltered claim takes nothing from the
-- future or the paused queue
SELECT count(*) AS unfiltered FROM gatekeeper.claim('w1');
SELECT id = :future AS is_future, state, attempt FROM gatekeeper.mail_status WHERE id IN (:future, :paused) ORDER BY id;
SELECT id = :paused AS is_paused, state, attempt FROM gatekeeper.mail_status WHERE id = :paused;

-- pause and resume
SELECT queue, paused, scheduled, due FROM gatekeeper.queue_stats WHERE queue = 'c_paused';
SELECT gatekeeper.resume('c_paused');
SELECT queue, paused, scheduled, due FROM gatekeeper.queue_stats WHERE queue = 'c_paused';
SELECT id = :paused AS is_paused FROM gatekeeper.claim('w1', 10) ORDER BY id;
SELECT gatekeeper.ack(:other, 1) AS ack_other, gatekeeper.ack(:paused, 1) AS ack_paused;
-- pausing twice, resuming twice: no error
SELECT gatekeeper.pause('c_paused'), gatekeeper.pause('c_paused');
SELECT gatekeeper.resume('c_paused'), gatekeeper.resume('c_paused');

--
-- ack: true once, then false; a stale attempt is false and changes nothing
--
SELECT gatekeeper.ack(:due, 2) AS ack_wrong_attempt;
SELECT state FROM gatekeeper.mail_status WHERE id = :due;
SELECT gatekeeper.ack(:due, 1) AS ack;
SELECT gatekeeper.ack(:due, 1) AS ack_again;
SELECT state, attempt, lease_until, finished_at IS NOT NULL AS finished FROM gatekeeper.mail_status WHERE id = :due;
SELECT gatekeeper.ack(:future, 0) AS ack_unclaimed;
SELECT gatekeeper.ack(-1, 1) AS ack_no_such_mail;

--
-- the attempt and the Message-ID: each claim increments the attempt; the
-- Message-ID stays the same across attempts
--
SELECT gatekeeper.enqueue('retry@example.com', 'Retry', 'b', 'c_main') AS r \gset
SELECT attempt, message_id AS mid1 FROM gatekeeper.claim('w1', 10, queues => ARRAY['c_main']) \gset
SELECT :attempt AS first_attempt;
SELECT gatekeeper.nack(:r, 1, '421 try later') AS nack;
SELECT state, attempt, last_error, lease_until, send_at > now() AS backed_off FROM gatekeeper.mail_status WHERE id = :r;
UPDATE gatekeeper.mail SET send_at = now() WHERE id = :r;
SELECT attempt, message_id = :'mid1' AS same_message_id FROM gatekeeper.claim('w1', 10, queues => ARRAY['c_main']);
-- the first attempt's worker is now stale
SELECT gatekeeper.ack(:r, 1) AS stale_ack;
SELECT gatekeeper.nack(:r, 1, 'stale') AS stale_nack;
SELECT gatekeeper.extend(:r, 1, '1 hour') AS stale_extend;
SELECT state, attempt, last_error FROM gatekeeper.mail_status WHERE id = :r;
SELECT gatekeeper.ack(:r, 2) AS ack_second_attempt;

--
-- batch ack
--
SELECT gatekeeper.enqueue(format('batch%s@example.com', i), 'Batch', 'b', 'c_main') IS NOT NULL AS enqueued
  FROM generate_series(1, 3) AS i;
CREATE TEMP TABLE claimed AS SELECT id, attempt FROM gatekeeper.claim('w1', 10, queues => ARRAY['c_main']);
SELECT count(*) AS claimed FROM claimed;
-- one stale attempt among them: only the others count
SELECT gatekeeper.ack_batch(array_agg(id ORDER BY id),
                      array_agg(CASE WHEN id = (SELECT max(id) FROM claimed) THEN attempt + 1 ELSE attempt END ORDER BY id)) AS acked
  FROM claimed;
SELECT gatekeeper.ack_batch(array_agg(id ORDER BY id), array_agg(attempt ORDER BY id)) AS acked_again FROM claimed;
SELECT gatekeeper.ack_batch('{}'::bigint[], '{}'::int[]) AS acked_none;
SELECT pg_temp.error_of($$SELECT gatekeeper.ack_batch('{1,2}'::bigint[], '{1}'::int[])$$) AS mismatched_lengths;
SELECT state, count(*) FROM gatekeeper.mail_status WHERE id IN (SELECT id FROM claimed) GROUP BY state ORDER BY state;
DROP TABLE claimed;

--
-- nack: exponential backoff with equal jitter, d/2 .. d with
-- d = 30 s * 2^(tries - 1), until max_attempts (4 in c_main); then failed
--
INSERT INTO gatekeeper.mail (recipient, subject, body, queue)
SELECT format('backoff%s@example.com', i), 'Backoff', 'b', 'c_main' FROM generate_series(1, 20) AS i;
CREATE TEMP TABLE backoff (try int, id bigint, state text, delay interval);
-- one round: claim all twenty, nack each, record the delay it got
CREATE FUNCTION pg_temp.backoff_round(try int) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
	UPDATE gatekeeper.mail_live l SET send_at = now() FROM gatekeeper.mail m
	 WHERE m.id = l.id AND l.queue = 'c_main' AND m.recipient LIKE 'backoff%' AND l.state = 'scheduled';
	INSERT INTO backoff
	SELECT try, c.id, gatekeeper.nack(c.id, c.attempt, format('450 busy (try %s)', try)), NULL
	  FROM gatekeeper.claim('w1', 100, queues => ARRAY['c_main']) AS c;
	UPDATE backoff b SET delay = m.send_at - now()
	  FROM gatekeeper.mail_status m WHERE m.id = b.id AND b.try = backoff_round.try;
END
$$;
SELECT pg_temp.backoff_round(1);
SELECT pg_temp.backoff_round(2);
SELECT pg_temp.backoff_round(3);
SELECT pg_temp.backoff_round(4);
SELECT try, state, count(*) AS mails,
       bool_and(delay BETWEEN interval '15 seconds' * 2 ^ (try - 1) AND interval '30 seconds' * 2 ^ (try - 1)) AS within_bounds,
       count(DISTINCT delay) > 1 AS jittered
  FROM backoff WHERE state = 'scheduled' GROUP BY try, state ORDER BY try;
SELECT try, state, count(*) AS mails FROM backoff WHERE state <> 'scheduled' GROUP BY try, state ORDER BY try;
-- a failed mail keeps its last error and its attempt count
SELECT state, attempt, last_error, lease_until, finished_at IS NOT NULL AS finished, count(*)
  FROM gatekeeper.mail_status WHERE recipient LIKE 'backoff%'
 GROUP BY 1, 2, 3, 4, 5 ORDER BY 1;
-- a failed mail is not claimed again, nor nacked again
UPDATE gatekeeper.mail SET send_at = now() WHERE recipient LIKE 'backoff%';
SELECT count(*) AS claimed_after_failed FROM gatekeeper.claim('w1', 100, queues => ARRAY['c_main']);
SELECT gatekeeper.nack(id, attempt, 'again') AS nack_failed FROM gatekeeper.mail_status
 WHERE recipient = 'backoff1@example.com';
DROP TABLE backoff;

-- claims handed back uncharged (unclaim) do not count as tries
SELECT gatekeeper.enqueue('cap@example.com', 'Cap', 'b', 'c_main') AS cap \gset
SELECT count(*) AS claimed FROM gatekeeper.claim('w1', 100, queues => ARRAY['c_main']);
-- a claimed mail's attempt and uncharged are in the record of its batch
CREATE FUNCTION pg_temp.set_claim(mail bigint, attempt int, uncharged int) RETURNS void
LANGUAGE sql AS $$
	UPDATE gatekeeper.mail_claim c
	   SET mails = ARRAY(SELECT CASE WHEN (r.m).id = mail
									 THEN ROW((r.m).id, (r.m).queue, (r.m).priority, (r.m).send_at,
											  (r.m).state, attempt, uncharged, (r.m).worker,
											  (r.m).message_id, (r.m).last_error,
											  (r.m).dedupe_key, (r.m).segment)::gatekeeper.mail_live
									 ELSE r.m END
						   FROM (SELECT c.mails[i] AS m, i FROM generate_subscripts(c.mails, 1) AS i) r
						  ORDER BY r.i)
	 WHERE c.lo <= mail AND c.hi >= mail AND NOT mail = ANY (c.gone)
$$;
SELECT pg_temp.set_claim(:cap, 20, 18);  -- tries = 2
BEGIN;
SELECT gatekeeper.nack(:cap, 20, 'busy') AS nack_uncharged;
SELECT send_at - now() BETWEEN interval '30 seconds' AND interval '60 seconds' AS second_try_delay
  FROM gatekeeper.mail_status WHERE id = :cap;
COMMIT;
-- the backoff is capped at 10 minutes (issue 45: a mail deferred for hours
-- goes within minutes of the trouble ending)
SELECT gatekeeper.alter_queue('c_main', max_attempts => 100);
SELECT max_attempts FROM gatekeeper.queue WHERE name = 'c_main';
UPDATE gatekeeper.mail SET send_at = now() WHERE id = :cap;
SELECT attempt FROM gatekeeper.claim('w1', 100, queues => ARRAY['c_main']);
SELECT pg_temp.set_claim(:cap, 40, 0);
BEGIN;
SELECT gatekeeper.nack(:cap, 40, 'busy') AS nack_40th;
SELECT send_at - now() BETWEEN interval '5 minutes' AND interval '10 minutes' AS capped
  FROM gatekeeper.mail_status WHERE id = :cap;
COMMIT;
SELECT gatekeeper.alter_queue('c_main', max_attempts => 4);
SELECT gatekeeper.cancel(:cap) AS cancelled;

-- permanent => true fails at once, on the first attempt
SELECT gatekeeper.enqueue('bounce@example.com', 'Bounce', 'b', 'c_main') AS bounce \gset
SELECT count(*) AS claimed FROM gatekeeper.claim('w1', 100, queues => ARRAY['c_main']);
SELECT gatekeeper.nack(:bounce, 1, '554 5.7.1 rejected', permanent => true) AS nack_permanent;
SELECT state, attempt, last_error, lease_until, finished_at IS NOT NULL AS finished
  FROM gatekeeper.mail_status WHERE id = :bounce;
SELECT gatekeeper.nack(:bounce, 1, '554 again', true) AS nack_again;
SELECT gatekeeper.ack(:bounce, 1) AS ack_after_failed;

--
-- extend: moves the lease of the current claim only
--
SELECT gatekeeper.enqueue('slow@example.com', 'Slow', 'b', 'c_main') AS slow \gset
SELECT count(*) AS claimed FROM gatekeeper.claim('w1', 100, '1 minute', ARRAY['c_main']);
BEGIN;
SELECT gatekeeper.extend(:slow, 1, '10 minutes') AS extended;
SELECT lease_until = now() + interval '10 minutes' AS lease_moved, state FROM gatekeeper.mail_status WHERE id = :slow;
COMMIT;
SELECT gatekeeper.extend(:slow, 0, '10 minutes') AS extend_wrong_attempt;
SELECT gatekeeper.extend(:slow, 2, '10 minutes') AS extend_future_attempt;
SELECT gatekeeper.ack(:slow, 1) AS acked;
SELECT gatekeeper.extend(:slow, 1, '10 minutes') AS extend_after_ack;
SELECT lease_until FROM gatekeeper.mail_status WHERE id = :slow;

--
-- reap: a lease that ran out
--
SELECT gatekeeper.reap() AS nothing_to_reap;
SELECT gatekeeper.enqueue('alo@example.com', 'ALO', 'b', 'c_main') AS alo \gset
SELECT gatekeeper.enqueue('amo@example.com', 'AMO', 'b', 'c_amo') AS amo \gset
SELECT gatekeeper.enqueue('once@example.com', 'Once', 'b', 'c_once') AS once \gset
SELECT gatekeeper.enqueue('live@example.com', 'Live lease', 'b', 'c_other') AS live \gset
SELECT queue, attempt FROM gatekeeper.claim('w1', 100, queues => ARRAY['c_main', 'c_amo', 'c_once', 'c_other'])
 ORDER BY queue;
SELECT message_id AS alo_mid FROM gatekeeper.mail_status WHERE id = :alo \gset
-- simulate the leases running out, except the last one's
UPDATE gatekeeper.mail_claim c SET lease_until = now() - interval '1 second'
 WHERE EXISTS (SELECT FROM unnest(c.mails) r WHERE r.id IN (:alo, :amo, :once));
SELECT gatekeeper.reap() AS reaped;
SELECT queue, state, attempt, last_error, lease_until IS NOT NULL AS leased, finished_at IS NOT NULL AS finished
  FROM gatekeeper.mail_status WHERE id IN (:alo, :amo, :once, :live) ORDER BY queue;
SELECT gatekeeper.reap() AS reaped_again;
-- the reaped at-least-once mail goes again, with its Message-ID; the old claim is stale
SELECT id = :alo AS is_alo, attempt, message_id = :'alo_mid' AS same_message_id
  FROM gatekeeper.claim('w1', 100, queues => ARRAY['c_main', 'c_amo', 'c_once']);
SELECT gatekeeper.ack(:alo, 1) AS stale_ack, gatekeeper.ack(:alo, 2) AS ack;
-- an unknown (at-most-once) mail is never sent again
SELECT gatekeeper.ack(:amo, 1) AS ack_unknown;
SELECT state FROM gatekeeper.mail_status WHERE id = :amo;
SELECT gatekeeper.ack(:live, 1) AS ack_live;

--
-- cancel: only scheduled mail
--
SELECT gatekeeper.enqueue('cancel1@example.com', 'C', 'b', 'c_other', send_at => now() + interval '1 day') AS c1 \gset
SELECT gatekeeper.enqueue('cancel2@example.com', 'C', 'b', 'c_other') AS c2 \gset
SELECT gatekeeper.cancel(:c1) AS cancel_scheduled;
SELECT state, finished_at IS NOT NULL AS finished FROM gatekeeper.mail_status WHERE id = :c1;
SELECT gatekeeper.cancel(:c1) AS cancel_twice;
SELECT count(*) AS claimed FROM gatekeeper.claim('w1', 100, queues => ARRAY['c_other']);
SELECT gatekeeper.cancel(:c2) AS cancel_claimed;
SELECT state FROM gatekeeper.mail_status WHERE id = :c2;
SELECT gatekeeper.ack(:c2, 1) AS ack;
SELECT gatekeeper.cancel(:c2) AS cancel_sent;
SELECT gatekeeper.cancel(-1) AS cancel_no_such_mail;
-- cancel_queue: counts the scheduled mail it cancelled, leaves claimed mail alone
INSERT INTO gatekeeper.mail (recipient, subject, body, queue, send_at)
SELECT format('cq%s@example.com', i), 'CQ', 'b', 'c_other',
       now() + CASE WHEN i <= 2 THEN interval '0' ELSE interval '1 day' END
  FROM generate_series(1, 7) AS i;
SELECT count(*) AS claimed FROM gatekeeper.claim('w1', 100, queues => ARRAY['c_other']);
SELECT gatekeeper.cancel_queue('c_other') AS cancelled;
SELECT gatekeeper.cancel_queue('c_other') AS cancelled_again;
SELECT state, count(*) FROM gatekeeper.mail_status WHERE recipient LIKE 'cq%' GROUP BY state ORDER BY state;
SELECT count(*) AS acked FROM gatekeeper.mail_status m
 WHERE recipient LIKE 'cq%' AND state = 'claimed' AND gatekeeper.ack(m.id, m.attempt);

--
-- send_by: mail that can no longer go in time expires at claim
--
SELECT gatekeeper.enqueue('late@example.com', 'Late', 'b', 'c_other',
                          send_at => now() - interval '2 hours', send_by => now() - interval '1 hour') AS late \gset
SELECT gatekeeper.enqueue('intime@example.com', 'In time', 'b', 'c_other',
                          send_at => now() - interval '2 hours', send_by => now() + interval '1 hour') AS intime \gset
SELECT id = :intime AS is_in_time, attempt FROM gatekeeper.claim('w1', 100, queues => ARRAY['c_other']);
SELECT recipient, state, attempt, last_error, finished_at IS NOT NULL AS finished, lease_until IS NOT NULL AS leased
  FROM gatekeeper.mail_status WHERE id IN (:late, :intime) ORDER BY recipient;
SELECT gatekeeper.ack(:intime, 1) AS acked;
-- a retried mail that missed its deadline expires too
SELECT gatekeeper.enqueue('retrylate@example.com', 'Retry late', 'b', 'c_other',
                          send_by => now() + interval '1 hour') AS rl \gset
SELECT count(*) AS claimed FROM gatekeeper.claim('w1', 100, queues => ARRAY['c_other']);
SELECT gatekeeper.nack(:rl, 1, '421 later') AS nack;
UPDATE gatekeeper.mail SET send_at = now() - interval '2 hours', send_by = now() - interval '1 hour' WHERE id = :rl;
SELECT count(*) AS claimed FROM gatekeeper.claim('w1', 100, queues => ARRAY['c_other']);
SELECT state, attempt, last_error FROM gatekeeper.mail_status WHERE id = :rl;

--
-- unclaim (the worker's "no relay reachable"): back to scheduled, not
-- counted against max_attempts
--
SELECT gatekeeper.enqueue('unreach@example.com', 'U', 'b', 'c_once') AS u \gset
SELECT count(*) AS claimed FROM gatekeeper.claim('w1', 100, queues => ARRAY['c_once']);
SELECT gatekeeper.unclaim(ARRAY[:u]::bigint[], ARRAY[1], 'connection refused') AS unclaimed;
SELECT state, attempt, uncharged, last_error, lease_until FROM gatekeeper.mail_status WHERE id = :u;
SELECT attempt FROM gatekeeper.claim('w1', 100, queues => ARRAY['c_once']);
-- c_once allows one attempt; the uncharged claim does not count, so this
-- nack is the first real try and exhausts it
SELECT gatekeeper.nack(:u, 2, '451 later') AS nack;
SELECT gatekeeper.unclaim(ARRAY[:u]::bigint[], ARRAY[2], 'late') AS unclaim_finished;

--
-- alter_queue: each argument given changes; NULL leaves it as it is
--
SELECT gatekeeper.create_queue('c_alter', gates => ARRAY['smart_sending'], rate_limit => 5,
                               dedupe_window => '1 hour');
CREATE FUNCTION pg_temp.show_queue() RETURNS TABLE (gates text[], on_gate_closed text, delivery text,
	max_attempts int, weight int, rate_limit int, dedupe_window interval, paused boolean)
LANGUAGE sql AS $$
	SELECT gates, on_gate_closed, delivery, max_attempts, weight, rate_limit, dedupe_window, paused
	  FROM gatekeeper.queue WHERE name = 'c_alter'
$$;
SELECT * FROM pg_temp.show_queue();
SELECT gatekeeper.alter_queue('c_alter', weight => 7);
SELECT * FROM pg_temp.show_queue();
SELECT gatekeeper.alter_queue('c_alter', on_gate_closed => 'defer', delivery => 'at_most_once', max_attempts => 2);
SELECT * FROM pg_temp.show_queue();
SELECT gatekeeper.alter_queue('c_alter', gates => '{}');
SELECT * FROM pg_temp.show_queue();
SELECT gatekeeper.alter_queue('c_alter', gates => ARRAY['smart_sending', 'smart_sending']);
SELECT * FROM pg_temp.show_queue();
SELECT gatekeeper.alter_queue('c_alter', rate_limit => 0, dedupe_window => '0');
SELECT * FROM pg_temp.show_queue();
SELECT gatekeeper.alter_queue('c_alter');
SELECT * FROM pg_temp.show_queue();
SELECT gatekeeper.drop_queue('c_alter');
SELECT count(*) AS c_alter_left FROM gatekeeper.queue WHERE name = 'c_alter';
-- an empty filter claims nothing
SELECT gatekeeper.enqueue('filter@example.com', 'F', 'b', 'c_other') AS f \gset
SELECT count(*) AS empty_filter FROM gatekeeper.claim('w1', 100, queues => '{}');
SELECT gatekeeper.cancel(:f) AS cancelled;

--
-- the counts
--
SELECT queue, paused, scheduled, due, claimed, sent, failed, suppressed, expired, cancelled, unknown,
       oldest_due_age IS NOT NULL AS has_due
  FROM gatekeeper.queue_stats WHERE queue LIKE 'c\_%' ORDER BY queue;

-- leave no live mail behind
SELECT gatekeeper.cancel_queue(name) FROM gatekeeper.queue WHERE name LIKE 'c\_%' ORDER BY name;
SELECT count(*) AS live FROM gatekeeper.mail_status WHERE state IN ('scheduled', 'claimed');
