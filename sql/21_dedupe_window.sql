-- The dedupe window (issue 25, item 10): a dedupe key is held while a mail
-- with it is scheduled or claimed, and after it finished for its queue's
-- dedupe_window (24 hours unless the queue says otherwise; '0' holds it
-- only while the mail is unfinished).  Every finished state holds the key
-- but cancelled.  enqueue() returns the holder's id and writes nothing; a
-- bulk INSERT or COPY of a held key fails with 23505.  The hold outlives
-- the mail's removal by retention while the window lasts.
SET client_min_messages = warning;
\set VERBOSITY terse

\i sql/error_of.inc

-- new queues, and the default queue, hold keys 24 hours
SELECT gatekeeper.create_queue('dw');
SELECT gatekeeper.create_queue('dw_zero', dedupe_window => '0');
SELECT gatekeeper.create_queue('dw_hour', dedupe_window => '1 hour');
SELECT name, dedupe_window FROM gatekeeper.queue WHERE name IN ('default', 'dw', 'dw_zero', 'dw_hour') ORDER BY name;
-- '0' may be set and kept by alter_queue; NULL leaves the window as it is
SELECT gatekeeper.alter_queue('dw_hour', dedupe_window => '0');
SELECT dedupe_window FROM gatekeeper.queue WHERE name = 'dw_hour';
SELECT gatekeeper.alter_queue('dw_hour', max_attempts => 3);
SELECT dedupe_window FROM gatekeeper.queue WHERE name = 'dw_hour';
SELECT gatekeeper.alter_queue('dw_hour', dedupe_window => '1 hour');
SELECT dedupe_window FROM gatekeeper.queue WHERE name = 'dw_hour';
-- out of bounds: 22023, nothing written
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('dw_bad', dedupe_window => '-1 hour')$$) AS negative;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('dw_bad', dedupe_window => '0.5 seconds')$$) AS below_a_second;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('dw_bad', dedupe_window => '11 years')$$) AS too_long;
SELECT pg_temp.error_of($$SELECT gatekeeper.alter_queue('dw_hour', dedupe_window => '-1 second')$$) AS alter_negative;
SELECT count(*) AS bad_queues FROM gatekeeper.queue WHERE name = 'dw_bad';
SELECT dedupe_window FROM gatekeeper.queue WHERE name = 'dw_hour';

-- A retried job after its receipt went out gets the first mail's id back
SELECT gatekeeper.enqueue('ann@example.com', 'Receipt', 'first', queue => 'dw', dedupe_key => 'order-1') AS r1 \gset
SELECT count(*) AS claimed FROM gatekeeper.claim('w-dw', 10, queues => ARRAY['dw']);
SELECT gatekeeper.ack(:r1, 1) AS acked;
SELECT gatekeeper.enqueue('ann@example.com', 'Receipt', 'retried', queue => 'dw', dedupe_key => 'order-1') = :r1 AS same_id_after_sent;
SELECT count(*) AS mails_with_key FROM gatekeeper.mail WHERE queue = 'dw' AND dedupe_key = 'order-1';
-- a bulk load of the key fails with 23505, naming the row, queue and key
\set VERBOSITY default
INSERT INTO gatekeeper.mail (recipient, subject, body, queue, dedupe_key) VALUES
	('ann@example.com', 'Receipt', 'bulk', 'dw', 'order-2'),
	('ann@example.com', 'Receipt', 'bulk', 'dw', 'order-1');
COPY gatekeeper.mail (recipient, subject, body, queue, dedupe_key) FROM STDIN (FORMAT csv);
ann@example.com,Receipt,copy,dw,order-1
\.
\set VERBOSITY terse
SELECT count(*) AS mails_with_keys FROM gatekeeper.mail WHERE queue = 'dw' AND dedupe_key IN ('order-1', 'order-2');
-- the same key in another queue is another mail
SELECT gatekeeper.enqueue('ann@example.com', 'Receipt', 'other queue', queue => 'dw_hour', dedupe_key => 'order-1') <> :r1 AS other_queue;
-- once the window has passed, the key makes a new mail
UPDATE gatekeeper.mail_done SET finished_at = now() - interval '25 hours' WHERE id = :r1;
SELECT gatekeeper.enqueue('ann@example.com', 'Receipt', 'a day later', queue => 'dw', dedupe_key => 'order-1') <> :r1 AS new_id_after_window;
SELECT body, state FROM gatekeeper.mail_status WHERE queue = 'dw' AND dedupe_key = 'order-1' ORDER BY id;
SELECT gatekeeper.cancel_queue('dw') AS cancelled;

-- Which finished states hold the key: every one but cancelled
SELECT gatekeeper.enqueue('s-sent@example.com', 's', 'b', queue => 'dw', dedupe_key => 'sent') AS k_sent,
	   gatekeeper.enqueue('s-failed@example.com', 's', 'b', queue => 'dw', dedupe_key => 'failed') AS k_failed,
	   gatekeeper.enqueue('s-expired@example.com', 's', 'b', queue => 'dw', dedupe_key => 'expired',
						  send_at => now() - interval '2 hours', send_by => now() - interval '1 hour') AS k_expired,
	   gatekeeper.enqueue('s-suppressed@example.com', 's', 'b', queue => 'dw', dedupe_key => 'suppressed') AS k_suppressed,
	   gatekeeper.enqueue('s-cancelled@example.com', 's', 'b', queue => 'dw', dedupe_key => 'cancelled',
						  send_at => now() + interval '1 day') AS k_cancelled \gset
SELECT gatekeeper.suppress('s-suppressed@example.com') AS suppressed;
SELECT gatekeeper.cancel(:k_cancelled) AS cancelled;
SELECT count(*) AS claimed FROM gatekeeper.claim('w-dw', 10, queues => ARRAY['dw']);
SELECT gatekeeper.ack(:k_sent, 1) AS acked, gatekeeper.nack(:k_failed, 1, '550 no', true) AS nacked;
SELECT dedupe_key, state,
	   gatekeeper.enqueue(recipient, 's', 'again', queue => 'dw', dedupe_key => dedupe_key) = id AS key_held
  FROM gatekeeper.mail_status
 WHERE queue = 'dw' AND dedupe_key IN ('sent', 'failed', 'expired', 'suppressed', 'cancelled') AND body = 'b'
 ORDER BY dedupe_key;
SELECT gatekeeper.unsuppress('s-suppressed@example.com') AS unsuppressed;
SELECT gatekeeper.cancel_queue('dw') AS cancelled;

-- An UPDATE of a scheduled mail's key: once the mail finished it holds
-- the new key, the old one is free; an UPDATE to a key a finished mail
-- holds is refused (23505)
SELECT gatekeeper.enqueue('dora@example.com', 'Hi', 'b', queue => 'dw', dedupe_key => 'u-old') AS u1 \gset
UPDATE gatekeeper.mail SET dedupe_key = 'u-new' WHERE id = :u1;
SELECT count(*) AS claimed FROM gatekeeper.claim('w-dw', 10, queues => ARRAY['dw']);
SELECT gatekeeper.ack(:u1, 1) AS acked;
SELECT gatekeeper.enqueue('dora@example.com', 'Hi', 'new key', queue => 'dw', dedupe_key => 'u-new') = :u1 AS new_key_held;
SELECT gatekeeper.enqueue('dora@example.com', 'Hi', 'old key', queue => 'dw', dedupe_key => 'u-old') AS u2 \gset
SELECT :u2 <> :u1 AS old_key_free;
SELECT pg_temp.error_of(format('UPDATE gatekeeper.mail SET dedupe_key = %L WHERE id = %s', 'u-new', :u2)) AS update_to_held_key;
SELECT dedupe_key, state FROM gatekeeper.mail_status WHERE id IN (:u1, :u2) ORDER BY id;
SELECT gatekeeper.cancel_queue('dw') AS cancelled;

-- dedupe_window '0': the key is held only while the mail is unfinished
SELECT gatekeeper.enqueue('bob@example.com', 'Hi', 'first', queue => 'dw_zero', dedupe_key => 'z') AS z1 \gset
SELECT gatekeeper.enqueue('bob@example.com', 'Hi', 'scheduled', queue => 'dw_zero', dedupe_key => 'z') = :z1 AS held_while_scheduled;
SELECT count(*) AS claimed FROM gatekeeper.claim('w-dw', 10, queues => ARRAY['dw_zero']);
SELECT gatekeeper.enqueue('bob@example.com', 'Hi', 'claimed', queue => 'dw_zero', dedupe_key => 'z') = :z1 AS held_while_claimed;
SELECT gatekeeper.ack(:z1, 1) AS acked;
SELECT gatekeeper.enqueue('bob@example.com', 'Hi', 'after', queue => 'dw_zero', dedupe_key => 'z') AS z2 \gset
SELECT :z2 <> :z1 AS new_id_after_sent;
-- a window given later holds the keys of mail that finished within it,
-- whose rows purge() had already removed
SELECT gatekeeper.cancel(:z2) AS cancelled;
SELECT gatekeeper.purge() >= 0 AS purged;
SELECT count(*) AS stale_keys_left FROM gatekeeper.mail_key WHERE queue = 'dw_zero';
SELECT gatekeeper.alter_queue('dw_zero', dedupe_window => '1 hour');
SELECT gatekeeper.enqueue('bob@example.com', 'Hi', 'window given', queue => 'dw_zero', dedupe_key => 'z') = :z1 AS held_again;
SELECT gatekeeper.alter_queue('dw_zero', dedupe_window => '0');

-- Retention: a finished mail removed by rotation (a window longer than
-- retention) still holds its key until the window ends
SELECT gatekeeper.create_queue('dw_month', dedupe_window => '30 days');
SELECT gatekeeper.enqueue('carl@example.com', 'Hi', 'b', queue => 'dw_month', dedupe_key => 'm') AS m1 \gset
SELECT count(*) AS claimed FROM gatekeeper.claim('w-dw', 10, queues => ARRAY['dw_month']);
SELECT gatekeeper.ack(:m1, 1) AS acked;
UPDATE gatekeeper.mail_done SET finished_at = now() - interval '10 days';
-- four rotations under a retention of one day empty every segment
UPDATE gatekeeper.segment SET rotated_at = now() - interval '2 days';
SELECT gatekeeper._rotate('1 day') >= 0 AS rotated;
UPDATE gatekeeper.segment SET rotated_at = now() - interval '2 days';
SELECT gatekeeper._rotate('1 day') >= 0 AS rotated;
UPDATE gatekeeper.segment SET rotated_at = now() - interval '2 days';
SELECT gatekeeper._rotate('1 day') >= 0 AS rotated;
UPDATE gatekeeper.segment SET rotated_at = now() - interval '2 days';
SELECT gatekeeper._rotate('1 day') >= 0 AS rotated;
SELECT count(*) AS finished_left FROM gatekeeper.mail_done;
SELECT gatekeeper.enqueue('carl@example.com', 'Hi', 'again', queue => 'dw_month', dedupe_key => 'm') = :m1 AS held_after_retention;
SELECT gatekeeper.purge() >= 0 AS purged;
SELECT gatekeeper.enqueue('carl@example.com', 'Hi', 'again', queue => 'dw_month', dedupe_key => 'm') = :m1 AS held_after_purge;
SELECT count(*) AS mails_with_key FROM gatekeeper.mail WHERE queue = 'dw_month';
-- a shorter window frees it
SELECT gatekeeper.alter_queue('dw_month', dedupe_window => '5 days');
SELECT gatekeeper.enqueue('carl@example.com', 'Hi', 'after', queue => 'dw_month', dedupe_key => 'm') <> :m1 AS new_id_after_window;
SELECT gatekeeper.cancel_queue('dw_month') AS cancelled;

-- a dropped queue takes its keys along: a new queue of that name starts free
SELECT gatekeeper.drop_queue('dw_month');
SELECT count(*) AS keys_of_dropped_queue FROM gatekeeper.mail_key WHERE queue = 'dw_month';

SELECT gatekeeper.cancel_queue(q) AS cancelled FROM unnest(ARRAY['dw', 'dw_zero', 'dw_hour']) AS q ORDER BY q;
SELECT gatekeeper.drop_queue(q) FROM unnest(ARRAY['dw', 'dw_zero', 'dw_hour']) AS q ORDER BY q;
