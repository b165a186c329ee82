-- A queue's retry budget in time (issue 45, item 1; SPEC "Claim and
-- report": nack retries until the queue's max_attempts and its retry_for
-- are both spent): a mail that only ever got 4xx replies or timeouts is
-- not failed before retry_for has passed since its first deferral,
-- however many attempts that takes; a permanent nack fails at once;
-- retry_for => '0' is the attempts alone.  The backoff between attempts
-- stays within 10 minutes, so a relay that recovers after an hour sees
-- the mail within minutes.
SET client_min_messages = warning;
\set VERBOSITY terse

\i sql/error_of.inc

-- the setting: default 1 day, 0 .. 10 years, NULL refused by create_queue
SELECT gatekeeper.create_queue('rf_day', max_attempts => 2);
SELECT gatekeeper.create_queue('rf_hour', max_attempts => 2, retry_for => '1 hour');
SELECT gatekeeper.create_queue('rf_zero', max_attempts => 2, retry_for => '0');
SELECT name, retry_for FROM gatekeeper.queue WHERE name LIKE 'rf\_%' ORDER BY name;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('rf_bad', retry_for => '-1 second')$$) AS negative;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('rf_bad', retry_for => '11 years')$$) AS too_long;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('rf_bad', retry_for => NULL)$$) AS null_retry_for;
SELECT pg_temp.error_of($$SELECT gatekeeper.alter_queue('rf_hour', retry_for => '-1 day')$$) AS alter_negative;
SELECT count(*) AS bad_queues_written FROM gatekeeper.queue WHERE name = 'rf_bad';
SELECT gatekeeper.alter_queue('rf_hour', retry_for => '2 hours');
SELECT gatekeeper.alter_queue('rf_hour', max_attempts => 2);  -- NULL: unchanged
SELECT retry_for FROM gatekeeper.queue WHERE name = 'rf_hour';
SELECT gatekeeper.alter_queue('rf_hour', retry_for => '1 hour');

-- claim and nack (a 4xx) a queue's mail until its attempts are spent
CREATE FUNCTION pg_temp.defer_all(q text, error text) RETURNS SETOF text
LANGUAGE sql AS $$
	UPDATE gatekeeper.mail_live SET send_at = now() WHERE queue = q AND state = 'scheduled';
	SELECT gatekeeper.nack(c.id, c.attempt, error) FROM gatekeeper.claim('rf-w', 100, queues => ARRAY[q]) c;
$$;
SELECT count(gatekeeper.enqueue('day' || i || '@example.com', 's', 'b', 'rf_day')) AS enqueued FROM generate_series(1, 3) AS i;
SELECT count(gatekeeper.enqueue('hour' || i || '@example.com', 's', 'b', 'rf_hour')) AS enqueued FROM generate_series(1, 3) AS i;
SELECT count(gatekeeper.enqueue('zero' || i || '@example.com', 's', 'b', 'rf_zero')) AS enqueued FROM generate_series(1, 3) AS i;

-- attempts 1, 2, 3: rf_zero's mail fails with its attempts; the others
-- go on being retried (their first deferral was just now)
SELECT q, a.try, a.state, count(*)
  FROM unnest(ARRAY['rf_day', 'rf_hour', 'rf_zero']) AS q,
	   generate_series(1, 3) AS t(try),
	   LATERAL (SELECT t.try, s AS state FROM pg_temp.defer_all(q, '451 4.3.0 try ' || t.try) AS s) a
 GROUP BY 1, 2, 3 ORDER BY 1, 2, 3;
SELECT queue, state, attempt - uncharged AS charged, last_error, count(*)
  FROM gatekeeper.mail_status WHERE queue LIKE 'rf\_%' GROUP BY 1, 2, 3, 4 ORDER BY 1, 2;
-- the backoff of the third retry: within [d/2, d], d = 30 s * 2^2
SELECT bool_and(send_at - now() BETWEEN interval '60 seconds' AND interval '120 seconds') AS backoff_in_bounds
  FROM gatekeeper.mail_status WHERE queue IN ('rf_day', 'rf_hour') AND state = 'scheduled';

-- an hour after the first deferral, rf_hour's mail fails at its next
-- deferral, rf_day's goes on; a permanent nack fails at once
UPDATE gatekeeper.event_log SET at = at - interval '61 minutes'
 WHERE event = 'deferred' AND queue IN ('rf_day', 'rf_hour');
SELECT q, s AS state, count(*)
  FROM unnest(ARRAY['rf_day', 'rf_hour']) AS q, LATERAL pg_temp.defer_all(q, '421 4.7.0 try 4') AS s
 GROUP BY 1, 2 ORDER BY 1, 2;
UPDATE gatekeeper.mail_live SET send_at = now() WHERE queue = 'rf_day';
SELECT c.id = m.first AS permanent_nack,
	   gatekeeper.nack(c.id, c.attempt, CASE WHEN c.id = m.first THEN '550 5.1.1 no such user' ELSE '451 4.3.0 try 5' END,
					   c.id = m.first) AS state
  FROM gatekeeper.claim('rf-w', 100, queues => '{rf_day}') c,
	   (SELECT min(id) AS first FROM gatekeeper.mail_status WHERE queue = 'rf_day') m
 ORDER BY 1, 2;
-- a day after, rf_day's mail fails too
UPDATE gatekeeper.event_log SET at = at - interval '1 day'
 WHERE event = 'deferred' AND queue = 'rf_day';
UPDATE gatekeeper.mail_live SET send_at = now() WHERE queue = 'rf_day';
SELECT s AS state, count(*) FROM pg_temp.defer_all('rf_day', '451 4.3.0 try 6') AS s GROUP BY 1;
SELECT queue, state, attempt - uncharged AS charged, count(*)
  FROM gatekeeper.mail_status WHERE queue LIKE 'rf\_%' GROUP BY 1, 2, 3 ORDER BY 1, 2, 3;

SELECT gatekeeper.drop_queue(q) FROM unnest(ARRAY['rf_day', 'rf_hour', 'rf_zero']) AS q;
