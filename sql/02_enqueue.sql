-- Enqueueing: one at a time with enqueue(), by the million with INSERT and
-- COPY, and deduplication by key.
SET client_min_messages = warning;
\set VERBOSITY terse

\i sql/error_of.inc

-- enq holds a dedupe key only while its mail is unfinished ('0'; the
-- default window of 24 hours is tested in 21_dedupe_window)
SELECT gatekeeper.create_queue('enq', dedupe_window => '0');
SELECT gatekeeper.create_queue('enq_other');
SELECT gatekeeper.create_queue('enq_window', dedupe_window => '1 hour');

--
-- enqueue() returns the new mail's id; the defaults
--
SELECT gatekeeper.enqueue('alice@example.com', 'Hello', 'Body') AS first \gset
SELECT :first > 0 AS has_id;
SELECT id - :first AS rel_id, queue, recipient, sender, subject, body, html, headers,
       dedupe_key, priority, state, attempt, send_by, lease_until, worker, message_id,
       last_error, finished_at, send_at = created_at AS due_at_enqueue
  FROM gatekeeper.mail_status WHERE id = :first;

-- every argument is stored
SELECT gatekeeper.enqueue('bob@example.com', 'All fields', 'Plain body',
                          queue => 'enq', send_at => now() + interval '1 day',
                          html => '<p>HTML body</p>', sender => 'news@shop.example',
                          headers => '{"List-Unsubscribe": "<mailto:u@shop.example>", "X-Campaign": "spring"}',
                          priority => 7, send_by => now() + interval '2 days') AS full \gset
SELECT id - :first AS rel_id, queue, recipient, sender, subject, body, html, headers,
       priority, state, attempt,
       send_at - created_at AS send_at_from_now, send_by - created_at AS send_by_from_now
  FROM gatekeeper.mail_status WHERE id = :full;

-- successive ids differ and grow
SELECT gatekeeper.enqueue('carol@example.com', 'Second', 'b', queue => 'enq') AS a \gset
SELECT gatekeeper.enqueue('carol@example.com', 'Second', 'b', queue => 'enq') AS b \gset
SELECT :b > :a AS ids_grow;

-- mail due in the future is scheduled, not due
SELECT scheduled, due FROM gatekeeper.queue_stats WHERE queue = 'enq';

-- a mail exists only if the enqueueing transaction commits
BEGIN;
SELECT gatekeeper.enqueue('rolled@example.com', 'Gone', 'b', queue => 'enq') IS NOT NULL AS enqueued;
ROLLBACK;
SELECT count(*) AS rolled_back FROM gatekeeper.mail_status WHERE recipient = 'rolled@example.com';

--
-- dedupe_key: while a mail with the key is live in the queue, enqueue
-- returns its id and writes nothing
--
SELECT gatekeeper.enqueue('dave@example.com', 'Receipt #1', 'first',
                          queue => 'enq', dedupe_key => 'order-1') AS d1 \gset
SELECT gatekeeper.enqueue('dave@example.com', 'Receipt #1 again', 'second',
                          queue => 'enq', dedupe_key => 'order-1') = :d1 AS same_id;
SELECT count(*) AS rows_with_key, min(subject) AS subject, min(body) AS body
  FROM gatekeeper.mail_status WHERE queue = 'enq' AND dedupe_key = 'order-1';
-- the same key in another queue is another mail
SELECT gatekeeper.enqueue('dave@example.com', 'Receipt #1', 'other queue',
                          queue => 'enq_other', dedupe_key => 'order-1') <> :d1 AS other_queue_new_id;
-- while it is claimed the key still holds
SELECT count(*) AS claimed, count(*) FILTER (WHERE id = :d1 AND attempt = 1) AS claimed_d1
  FROM gatekeeper.claim('w-enq', 100, queues => ARRAY['enq']);
SELECT gatekeeper.enqueue('dave@example.com', 'Receipt #1', 'while claimed',
                          queue => 'enq', dedupe_key => 'order-1') = :d1 AS same_id_while_claimed;
-- once sent, and the queue's dedupe window is '0', the key makes a new mail
SELECT gatekeeper.ack(:d1, 1) AS acked;
SELECT gatekeeper.enqueue('dave@example.com', 'Receipt #1', 'after sent',
                          queue => 'enq', dedupe_key => 'order-1') AS d2 \gset
SELECT :d2 <> :d1 AS new_id_after_sent;
SELECT id - :d1 AS rel_id, state, body FROM gatekeeper.mail_status
 WHERE queue = 'enq' AND dedupe_key = 'order-1' ORDER BY id;
-- a cancelled mail does not hold its key
SELECT gatekeeper.cancel(:d2) AS cancelled;
SELECT gatekeeper.enqueue('dave@example.com', 'Receipt #1', 'after cancel',
                          queue => 'enq', dedupe_key => 'order-1') <> :d2 AS new_id_after_cancel;
SELECT gatekeeper.cancel_queue('enq') AS cancelled_in_enq;

-- with a dedupe window, a mail sent within it still holds the key
SELECT gatekeeper.enqueue('erin@example.com', 'Welcome', 'once',
                          queue => 'enq_window', dedupe_key => 'welcome') AS w1 \gset
SELECT count(*) AS claimed FROM gatekeeper.claim('w-enq', 100, queues => ARRAY['enq_window']);
SELECT gatekeeper.ack(:w1, 1) AS acked;
SELECT gatekeeper.enqueue('erin@example.com', 'Welcome', 'twice',
                          queue => 'enq_window', dedupe_key => 'welcome') = :w1 AS same_id_within_window;
SELECT count(*) AS rows_with_key FROM gatekeeper.mail_status
 WHERE queue = 'enq_window' AND dedupe_key = 'welcome';
-- sent longer ago than the window: a new mail
UPDATE gatekeeper.mail_done SET finished_at = now() - interval '61 minutes' WHERE id = :w1;
SELECT gatekeeper.enqueue('erin@example.com', 'Welcome', 'after the window',
                          queue => 'enq_window', dedupe_key => 'welcome') <> :w1 AS new_id_after_window;
SELECT state, body FROM gatekeeper.mail_status
 WHERE queue = 'enq_window' AND dedupe_key = 'welcome' ORDER BY id;
-- alter_queue(dedupe_window => '0'): a sent mail no longer holds its key
SELECT count(*) AS claimed FROM gatekeeper.claim('w-enq', 100, queues => ARRAY['enq_window']);
SELECT count(*) FILTER (WHERE gatekeeper.ack(id, attempt)) AS acked FROM gatekeeper.mail_status
 WHERE queue = 'enq_window' AND state = 'claimed';
SELECT gatekeeper.enqueue('erin@example.com', 'Welcome', 'window holds',
                          queue => 'enq_window', dedupe_key => 'welcome') AS w3 \gset
SELECT state FROM gatekeeper.mail_status WHERE id = :w3;
SELECT gatekeeper.alter_queue('enq_window', dedupe_window => '0');
SELECT dedupe_window FROM gatekeeper.queue WHERE name = 'enq_window';
SELECT gatekeeper.enqueue('erin@example.com', 'Welcome', 'no window',
                          queue => 'enq_window', dedupe_key => 'welcome') <> :w3 AS new_id_without_window;
SELECT gatekeeper.cancel_queue('enq_window') AS cancelled_in_enq_window;

--
-- bulk INSERT: the same validation, row by row; a bad row aborts the statement
--
INSERT INTO gatekeeper.mail (recipient, subject, body, queue, send_at, priority)
SELECT format('user%s@bulk.example', i), format('Bulk %s', i), 'bulk body', 'enq',
       now() + interval '1 hour', i % 3
  FROM generate_series(1, 1000) AS i;
SELECT count(*) AS bulk_rows, count(DISTINCT id) AS distinct_ids,
       bool_and(state = 'scheduled' AND attempt = 0) AS all_scheduled
  FROM gatekeeper.mail_status WHERE recipient LIKE '%@bulk.example';
SELECT pg_temp.error_of($$
	INSERT INTO gatekeeper.mail (recipient, subject, body, queue)
	SELECT CASE WHEN i = 500 THEN 'not an address' ELSE format('bad%s@bulk2.example', i) END,
	       'Bulk', 'b', 'enq'
	  FROM generate_series(1, 1000) AS i$$);
SELECT pg_temp.error_of($$
	INSERT INTO gatekeeper.mail (recipient, subject, body, queue)
	SELECT format('bad%s@bulk2.example', i), 'Bulk', 'b',
	       CASE WHEN i = 999 THEN 'no_such_queue' ELSE 'enq' END
	  FROM generate_series(1, 1000) AS i$$);
SELECT count(*) AS written_by_failed_inserts FROM gatekeeper.mail_status
 WHERE recipient LIKE '%@bulk2.example';
-- a plain INSERT of a live dedupe key conflicts
SELECT pg_temp.error_of($$
	INSERT INTO gatekeeper.mail (recipient, subject, body, queue, dedupe_key)
	VALUES ('x@bulk3.example', 's', 'b', 'enq', 'k'), ('y@bulk3.example', 's', 'b', 'enq', 'k')$$);
SELECT count(*) AS written_with_conflicting_keys FROM gatekeeper.mail_status
 WHERE recipient LIKE '%@bulk3.example';

--
-- COPY: the same validation; a bad row aborts the whole COPY
--
COPY gatekeeper.mail (recipient, subject, body, queue) FROM stdin;
copy1@copy.example	Copied 1	body 1	enq
copy2@copy.example	Copied 2	body 2	enq_other
copy3@copy.example	Copied 3	body 3	default
\.
SELECT recipient, subject, body, queue, state FROM gatekeeper.mail_status
 WHERE recipient LIKE '%@copy.example' ORDER BY recipient;
\set VERBOSITY sqlstate
-- an invalid address in the middle: 22023
COPY gatekeeper.mail (recipient, subject, body, queue) FROM stdin;
copy4@copy.example	Copied 4	body 4	enq
copy5 at copy.example	Copied 5	body 5	enq
copy6@copy.example	Copied 6	body 6	enq
\.
-- a queue that does not exist in the last row: 42704
COPY gatekeeper.mail (recipient, subject, body, queue) FROM stdin;
copy7@copy.example	Copied 7	body 7	enq
copy8@copy.example	Copied 8	body 8	enq
copy9@copy.example	Copied 9	body 9	enq_typo
\.
-- a header-injecting subject: 22023
COPY gatekeeper.mail (recipient, subject, body, queue) FROM stdin;
copy10@copy.example	Copied 10\r\nBcc: victim@example.com	body 10	enq
\.
-- a NULL body: 23502 (not_null_violation), as for any NOT NULL column
COPY gatekeeper.mail (recipient, subject, body, queue) FROM stdin;
copy11@copy.example	Copied 11	\N	enq
\.
\set VERBOSITY terse
SELECT count(*) AS copied_rows FROM gatekeeper.mail_status WHERE recipient LIKE '%@copy.example';

--
-- non-ASCII subjects and bodies are stored, and claimed, intact
--
SELECT gatekeeper.enqueue('jose@example.com',
                          'Grüße aus Köln — 今日は 🎉',
                          E'Hallo José,\nvielen Dank für Ihre Bestellung über 42 €.\n👍',
                          queue => 'enq_other',
                          html => '<p>Grüße — 今日は</p>',
                          headers => '{"X-Note": "naïve café"}') AS u \gset
SELECT subject = 'Grüße aus Köln — 今日は 🎉' AS subject_intact,
       body = E'Hallo José,\nvielen Dank für Ihre Bestellung über 42 €.\n👍' AS body_intact,
       html = '<p>Grüße — 今日は</p>' AS html_intact,
       headers ->> 'X-Note' = 'naïve café' AS header_intact,
       octet_length(subject) AS subject_bytes, octet_length(body) AS body_bytes
  FROM gatekeeper.mail_status WHERE id = :u;
SELECT id = :u AS is_it,
       subject = 'Grüße aus Köln — 今日は 🎉' AS subject_intact,
       body = E'Hallo José,\nvielen Dank für Ihre Bestellung über 42 €.\n👍' AS body_intact,
       html = '<p>Grüße — 今日は</p>' AS html_intact,
       headers = '{"X-Note": "naïve café"}' AS headers_intact
  FROM gatekeeper.claim('w-enq', 100, queues => ARRAY['enq_other'])
 WHERE recipient = 'jose@example.com' ORDER BY id;

-- leave no live mail behind for later tests
SELECT gatekeeper.cancel_queue(q) AS cancelled FROM unnest(ARRAY['default', 'enq', 'enq_other']) AS q ORDER BY q;
DO $$ BEGIN PERFORM gatekeeper.ack(id, attempt) FROM gatekeeper.mail_status
 WHERE state = 'claimed' AND queue LIKE 'enq%'; END $$;
SELECT queue, scheduled, claimed FROM gatekeeper.queue_stats ORDER BY queue;
