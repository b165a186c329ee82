-- gatekeeper.on_duplicate (issue 25, item 11): with 'skip', a bulk INSERT
-- or COPY leaves out the rows whose dedupe key is held (by a scheduled or
-- claimed mail, one finished within the queue's dedupe_window, or an
-- earlier row of the statement), counts them in one NOTICE, and enqueues
-- the rest; an application role with only the README's enqueue
-- privileges can use it.  'error' (the default) fails the statement with
-- 23505, as before.
SET client_min_messages = warning;
\set VERBOSITY terse

\i sql/error_of.inc

SELECT gatekeeper.create_queue('od');
-- the README's enqueue-only role
CREATE ROLE regress_od_app NOLOGIN;
GRANT USAGE ON SCHEMA gatekeeper TO regress_od_app;
GRANT EXECUTE ON FUNCTION gatekeeper.enqueue(text, text, text, text, timestamptz, text, text,
                                             jsonb, text, int, timestamptz, text, jsonb, text, text, jsonb) TO regress_od_app;
GRANT INSERT (recipient, subject, body, queue, send_at, html, sender, headers, dedupe_key,
              priority, send_by, recipient_name, metadata, timezone) ON gatekeeper.mail TO regress_od_app;
GRANT EXECUTE ON FUNCTION gatekeeper._segment() TO regress_od_app;

-- the setting: a user setting, 'error' unless set, 'error' or 'skip' only
SELECT name, setting, context, enumvals FROM pg_settings WHERE name = 'gatekeeper.on_duplicate';
SELECT pg_temp.error_of($$SET gatekeeper.on_duplicate = 'ignore'$$) AS bad_value;
SHOW gatekeeper.on_duplicate;

-- keys held before the load: 10 scheduled mails (keys 1-10), 5 sent
-- (keys 11-15, within the 24-hour window), 5 cancelled (keys 16-20: a
-- cancelled mail holds no key)
INSERT INTO gatekeeper.mail (recipient, subject, body, queue, dedupe_key, send_at)
SELECT 'held' || i || '@example.com', 'before', 'b', 'od', 'key-' || i, now() + interval '1 hour'
  FROM generate_series(1, 10) AS i;
INSERT INTO gatekeeper.mail (recipient, subject, body, queue, dedupe_key)
SELECT 'held' || i || '@example.com', 'before', 'b', 'od', 'key-' || i
  FROM generate_series(11, 20) AS i;
SELECT count(*) AS claimed FROM gatekeeper.claim('w-od', 100, queues => ARRAY['od']);
SELECT count(*) FILTER (WHERE CASE WHEN dedupe_key IN ('key-11', 'key-12', 'key-13', 'key-14', 'key-15')
									THEN gatekeeper.ack(id, attempt)
									ELSE gatekeeper.nack(id, attempt, 'undo', true) IS NOT NULL END) AS finished
  FROM gatekeeper.mail_status WHERE queue = 'od' AND state = 'claimed';
UPDATE gatekeeper.mail_done SET state = 'cancelled'
 WHERE queue = 'od' AND dedupe_key IN ('key-16', 'key-17', 'key-18', 'key-19', 'key-20');
SELECT state, count(*) FROM gatekeeper.mail_status WHERE queue = 'od' GROUP BY state ORDER BY state;
SELECT enqueued AS enqueued_before FROM gatekeeper.queue_stats WHERE queue = 'od' \gset

SET ROLE regress_od_app;
-- 'error': the load fails on the first held key, and writes nothing
INSERT INTO gatekeeper.mail (recipient, subject, body, queue, dedupe_key)
SELECT 'load' || i || '@example.com', 'load', 'b', 'od', 'key-' || i
  FROM generate_series(1, 40) AS i;

-- 'skip': keys 1-15 are held and left out, 16-40 enqueued; rows 41-45
-- repeat keys 36-40 of earlier rows of the statement and are left out too
SET gatekeeper.on_duplicate = skip;
SET client_min_messages = notice;
INSERT INTO gatekeeper.mail (recipient, subject, body, queue, dedupe_key)
SELECT 'load' || i || '@example.com', 'load', 'b', 'od', 'key-' || CASE WHEN i > 40 THEN i - 5 ELSE i END
  FROM generate_series(1, 45) AS i;
-- rows without a key are never skipped
INSERT INTO gatekeeper.mail (recipient, subject, body, queue)
SELECT 'nokey' || i || '@example.com', 'load', 'b', 'od' FROM generate_series(1, 3) AS i;
-- the same load run again: every keyed row is left out
INSERT INTO gatekeeper.mail (recipient, subject, body, queue, dedupe_key)
SELECT 'load' || i || '@example.com', 'load', 'b', 'od', 'key-' || CASE WHEN i > 40 THEN i - 5 ELSE i END
  FROM generate_series(1, 45) AS i;
-- COPY: held keys 1 and 20, a new key 50, and key 50 again
COPY gatekeeper.mail (recipient, subject, body, queue, dedupe_key) FROM STDIN (FORMAT csv);
copy1@example.com,copy,b,od,key-1
copy2@example.com,copy,b,od,key-50
copy3@example.com,copy,b,od,key-20
copy4@example.com,copy,b,od,key-50
copy5@example.com,copy,b,od,
\.
-- validation still fails the statement, skipped rows or not
COPY gatekeeper.mail (recipient, subject, body, queue, dedupe_key) FROM STDIN (FORMAT csv);
copy6@example.com,copy,b,od,key-1
not an address,copy,b,od,key-60
\.
SET client_min_messages = warning;
-- enqueue() returns the holder whatever the session's setting
SELECT gatekeeper.enqueue('again@example.com', 'again', 'b', queue => 'od', dedupe_key => 'key-11') IS NOT NULL AS enqueued;
RESET gatekeeper.on_duplicate;
RESET ROLE;

-- what the loads wrote: the first row of each free key, once; nothing of a held one
SELECT subject, count(*) AS mails, count(DISTINCT dedupe_key) AS keys,
	   min(substring(dedupe_key FROM 5)::int) AS first_key, max(substring(dedupe_key FROM 5)::int) AS last_key,
	   count(*) FILTER (WHERE dedupe_key IS NULL) AS without_key
  FROM gatekeeper.mail WHERE queue = 'od' GROUP BY subject ORDER BY subject;
SELECT recipient FROM gatekeeper.mail WHERE queue = 'od' AND subject = 'copy' ORDER BY recipient;
SELECT recipient FROM gatekeeper.mail WHERE queue = 'od' AND dedupe_key IN ('key-36', 'key-40') ORDER BY recipient;
-- each enqueued mail is live, with its key, and counted once
SELECT count(*) AS live FROM gatekeeper.mail_status WHERE queue = 'od' AND state = 'scheduled';
SELECT count(*) AS keys_held FROM gatekeeper.mail_key k
 WHERE k.queue = 'od' AND gatekeeper._mail_key_held(k.id, k.queue, k.dedupe_key);
SELECT enqueued - :enqueued_before AS enqueued_by_loads, scheduled FROM gatekeeper.queue_stats WHERE queue = 'od';

-- RETURNING under 'skip' (issue 44, item 6): it would hand out the ids of
-- skipped rows, which never become mail, so such an INSERT is refused
-- before it runs (at the top or in a WITH; prepared under either
-- setting) and writes nothing; without RETURNING the load goes on, and
-- enqueue() returns real ids under 'skip' as under 'error'
SELECT gatekeeper.create_queue('od_ret');
INSERT INTO gatekeeper.mail (recipient, subject, body, queue, dedupe_key)
VALUES ('ret1@example.com', 'held', 'b', 'od_ret', 'ret-1');
PREPARE od_insert_returning(text) AS
INSERT INTO gatekeeper.mail (recipient, subject, body, queue, dedupe_key)
VALUES ('prepared@example.com', 'prepared', 'b', 'od_ret', $1) RETURNING id;
SET gatekeeper.on_duplicate = skip;
SELECT pg_temp.error_of($$INSERT INTO gatekeeper.mail (recipient, subject, body, queue, dedupe_key)
	SELECT 'ret' || i || '@example.com', 'load', 'b', 'od_ret', 'ret-' || i
	  FROM generate_series(1, 3) AS i RETURNING id$$) AS returning_top;
SELECT pg_temp.error_of($$WITH n AS (INSERT INTO gatekeeper.mail (recipient, subject, body, queue, dedupe_key)
	SELECT 'ret' || i || '@example.com', 'load', 'b', 'od_ret', 'ret-' || i
	  FROM generate_series(1, 3) AS i RETURNING id) SELECT count(*) FROM n$$) AS returning_with;
SELECT pg_temp.error_of($$EXECUTE od_insert_returning('ret-1')$$) AS returning_prepared;
SELECT count(*) AS written_by_refused FROM gatekeeper.mail WHERE queue = 'od_ret' AND subject <> 'held';
INSERT INTO gatekeeper.mail (recipient, subject, body, queue, dedupe_key)
SELECT 'ret' || i || '@example.com', 'load', 'b', 'od_ret', 'ret-' || i FROM generate_series(1, 3) AS i;
SELECT gatekeeper.enqueue('ret8@example.com', 'enqueued', 'b', queue => 'od_ret') AS e1,
	   gatekeeper.enqueue('ret9@example.com', 'enqueued', 'b', queue => 'od_ret', dedupe_key => 'ret-9') AS e2,
	   gatekeeper.enqueue('ret1@example.com', 'enqueued', 'b', queue => 'od_ret', dedupe_key => 'ret-1') AS e3 \gset
SELECT count(*) AS statuses, count(*) FILTER (WHERE s.id = :e3 AND m.subject = 'held') AS holder
  FROM unnest(ARRAY[:e1, :e2, :e3]::bigint[]) AS e(id)
  JOIN LATERAL gatekeeper.status(e.id) AS s ON true
  JOIN gatekeeper.mail m ON m.id = s.id;
RESET gatekeeper.on_duplicate;
EXECUTE od_insert_returning('ret-5') \gset prepared_
SELECT count(*) AS prepared_is_mail FROM gatekeeper.status(:prepared_id);
DEALLOCATE od_insert_returning;
SELECT subject, count(*) AS mails, string_agg(dedupe_key, ',' ORDER BY dedupe_key) AS keys
  FROM gatekeeper.mail WHERE queue = 'od_ret' GROUP BY subject ORDER BY subject;
SELECT gatekeeper.cancel_queue('od_ret') > 0 AS cancelled;
SELECT gatekeeper.drop_queue('od_ret');

SELECT gatekeeper.cancel_queue('od') > 0 AS cancelled;
SELECT gatekeeper.drop_queue('od');
REVOKE ALL ON gatekeeper.mail FROM regress_od_app;
REVOKE ALL ON FUNCTION gatekeeper._segment() FROM regress_od_app;
REVOKE ALL ON FUNCTION gatekeeper.enqueue(text, text, text, text, timestamptz, text, text,
                                          jsonb, text, int, timestamptz, text, jsonb, text, text, jsonb) FROM regress_od_app;
REVOKE ALL ON SCHEMA gatekeeper FROM regress_od_app;
DROP ROLE regress_od_app;
