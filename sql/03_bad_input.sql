-- Bad input: every malformed input gets an error with its SQLSTATE, and
-- nothing is written.
--   22023 invalid_parameter_value   22004 null_value_not_allowed
--   42704 undefined_object          42710 duplicate_object
--   42939 reserved_name             55006 object_in_use
--   54000 program_limit_exceeded
SET client_min_messages = warning;
\set VERBOSITY terse

\i sql/error_of.inc

-- enqueue a mail with one field replaced; the rest valid
CREATE FUNCTION pg_temp.try_enqueue(recipient text DEFAULT 'ok@example.com',
	subject text DEFAULT 'Subject', body text DEFAULT 'Body',
	queue text DEFAULT 'bad', send_at timestamptz DEFAULT now(),
	html text DEFAULT NULL, sender text DEFAULT NULL, headers jsonb DEFAULT NULL,
	send_by timestamptz DEFAULT NULL, priority int DEFAULT 0)
RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
	PERFORM gatekeeper.enqueue(recipient, subject, body, queue, send_at, html, sender,
							   headers, NULL, priority, send_by);
	RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE || ': ' || SQLERRM;
END
$$;

SELECT gatekeeper.create_queue('bad');
SELECT gatekeeper.create_gate('bad_gate', '1 hour');
SELECT count(*) AS mail_before FROM gatekeeper.mail_status \gset
SELECT count(*) AS passes_before FROM gatekeeper.gate_log \gset

--
-- recipient addresses
--
SELECT n, label, left(r, 5) AS sqlstate,
       CASE WHEN v ~ '^[ -~]{0,50}$' THEN substr(r, 8) ELSE '(long or non-ASCII input)' END AS message
  FROM (VALUES
	(1, 'empty', ''),
	(2, 'no @', 'plainaddress'),
	(3, 'empty local part', '@example.com'),
	(4, 'empty domain', 'alice@'),
	(5, 'two @', 'alice@@example.com'),
	(6, '@ in local part', 'alice@example@example.com'),
	(7, 'leading dot', '.alice@example.com'),
	(8, 'trailing dot', 'alice.@example.com'),
	(9, 'doubled dot', 'alice..bob@example.com'),
	(10, 'space', 'alice bob@example.com'),
	(11, 'display name', 'Alice <alice@example.com>'),
	(12, 'quoted local part', '"alice"@example.com'),
	(13, 'comment', 'alice(comment)@example.com'),
	(14, 'two addresses', 'alice@example.com,bob@example.com'),
	(15, 'space in domain', 'alice@exa mple.com'),
	(16, 'underscore in domain', 'alice@exa_mple.com'),
	(17, 'label starts with hyphen', 'alice@-example.com'),
	(18, 'label ends with hyphen', 'alice@example-.com'),
	(19, 'empty label', 'alice@example..com'),
	(20, 'leading dot in domain', 'alice@.example.com'),
	(21, 'trailing dot in domain', 'alice@example.com.'),
	(22, 'domain literal', 'alice@[192.0.2.1]'),
	(23, 'non-ASCII local part', 'zoë@example.com'),
	(24, 'non-ASCII domain', 'alice@exämple.com'),
	(25, '65-character local part', repeat('l', 65) || '@example.com'),
	(26, '64-character label', 'alice@' || repeat('d', 64) || '.com'),
	(27, '259 characters', 'alice@' || repeat(repeat('d', 49) || '.', 5) || 'com'),
	(28, 'tab', E'alice\t@example.com')
  ) AS t(n, label, v),
  LATERAL pg_temp.try_enqueue(recipient => v) AS r
 ORDER BY n;

-- line breaks anywhere in an address (header or SMTP command injection)
SELECT pg_temp.try_enqueue(recipient => E'alice@example.com\r\nBcc: victim@example.com') AS crlf_recipient;
SELECT pg_temp.try_enqueue(recipient => E'alice@example.com\n') AS lf_recipient;
SELECT pg_temp.try_enqueue(recipient => E'alice@example.com\r') AS cr_recipient;

-- valid shapes are accepted (rolled back)
BEGIN;
SELECT a AS valid_recipient, pg_temp.try_enqueue(recipient => a) AS result
  FROM unnest(ARRAY[
	'alice@example.com',
	'Alice.Smith@Example.COM',
	'o''brien+tag@mail.example.co.uk',
	'a!#$%&''*+-/=?^_`{|}~z@example.com',
	'user@localhost',
	'x@1-2.example',
	repeat('l', 64) || '@example.com',
	'alice@' || repeat('d', 63) || '.com'
  ]) WITH ORDINALITY AS t(a, n)
 ORDER BY n;
ROLLBACK;

--
-- sender addresses: the same rules (a display name is allowed: sql/13_delivery_options.sql)
--
SELECT n, label, left(r, 5) AS sqlstate,
       CASE WHEN v ~ '^[ -~]{0,50}$' THEN substr(r, 8) ELSE '(long or non-ASCII input)' END AS message
  FROM (VALUES
	(1, 'empty', ''),
	(2, 'no @', 'news'),
	(3, 'name, unclosed <', 'News <news@shop.example'),
	(4, 'empty label', 'news@shop..example'),
	(5, 'CRLF', E'news@shop.example\r\nBcc: victim@example.com'),
	(6, 'LF', E'news@shop.example\nX-Injected: 1')
  ) AS t(n, label, v),
  LATERAL pg_temp.try_enqueue(sender => v) AS r
 ORDER BY n;

--
-- subject and header values: no CR or LF
--
SELECT pg_temp.try_enqueue(subject => E'Hello\r\nBcc: victim@example.com') AS crlf_subject;
SELECT pg_temp.try_enqueue(subject => E'Hello\nthere') AS lf_subject;
SELECT pg_temp.try_enqueue(subject => E'Hello\rthere') AS cr_subject;
SELECT pg_temp.try_enqueue(headers => jsonb_build_object('X-Campaign', E'spring\r\nBcc: victim@example.com')) AS crlf_header_value;
SELECT pg_temp.try_enqueue(headers => jsonb_build_object('X-Campaign', E'spring\n')) AS lf_header_value;
-- bodies may hold line breaks, of course (rolled back)
BEGIN;
SELECT pg_temp.try_enqueue(body => E'line 1\r\nline 2\nline 3') AS multiline_body;
ROLLBACK;

--
-- header names: RFC 5322 field names, not one gatekeeper writes itself
--
SELECT n, label, left(r, 5) AS sqlstate,
       CASE WHEN v ~ '^[ -~]{0,50}$' THEN substr(r, 8) ELSE '(long or non-ASCII input)' END AS message
  FROM (VALUES
	(1, 'empty', ''),
	(2, 'space', 'X Bad'),
	(3, 'colon', 'X:Bad'),
	(4, 'LF', E'X-Bad\n'),
	(5, 'CRLF and a header', E'X-Bad: 1\r\nBcc'),
	(6, 'non-ASCII', 'X-Ümlaut'),
	(7, '77 characters', repeat('X', 77)),
	(8, 'owned', 'From'), (9, 'owned', 'from'), (10, 'owned', 'FROM'),
	(11, 'owned', 'To'), (12, 'owned', 'tO'),
	(13, 'owned', 'Message-ID'), (14, 'owned', 'message-id'),
	(15, 'owned', 'Date'), (16, 'owned', 'DATE'),
	(17, 'owned', 'Subject'), (18, 'owned', 'subject'),
	(19, 'owned', 'MIME-Version'), (20, 'owned', 'mime-version'),
	(21, 'owned', 'Content-Type'), (22, 'owned', 'content-TYPE'),
	(23, 'owned', 'Content-Transfer-Encoding'),
	(24, 'owned', 'Cc'), (25, 'owned', 'Bcc'), (26, 'owned', 'Sender'),
	(27, 'owned', 'Return-Path')
  ) AS t(n, label, v),
  LATERAL pg_temp.try_enqueue(headers => jsonb_build_object(v, 'value')) AS r
 ORDER BY n;
-- a good header next to an owned one is still refused
SELECT pg_temp.try_enqueue(headers => '{"X-Campaign": "spring", "Reply-To": "a@b.example", "To": "x@y.example"}') AS mixed_headers;
-- acceptable names (rolled back)
BEGIN;
SELECT pg_temp.try_enqueue(headers => '{"X-Campaign": "spring", "Reply-To": "help@shop.example", "List-Unsubscribe": "<mailto:u@shop.example>", "X-Empty": ""}') AS good_headers;
SELECT pg_temp.try_enqueue(headers => jsonb_build_object(repeat('X', 76), 'v')) AS longest_name;
SELECT pg_temp.try_enqueue(headers => '{}') AS empty_object;
ROLLBACK;

--
-- headers must be an object of strings
--
SELECT j AS headers, pg_temp.try_enqueue(headers => j::jsonb) AS result
  FROM unnest(ARRAY[
	'[]',
	'["X-A", "b"]',
	'"X-A: b"',
	'42',
	'true',
	'null',
	'{"X-A": 1}',
	'{"X-A": true}',
	'{"X-A": null}',
	'{"X-A": ["b"]}',
	'{"X-A": {"b": "c"}}'
  ]) WITH ORDINALITY AS t(j, n)
 ORDER BY n;

--
-- NULLs
--
SELECT pg_temp.try_enqueue(recipient => NULL) AS null_recipient;
SELECT pg_temp.try_enqueue(subject => NULL) AS null_subject;
SELECT pg_temp.try_enqueue(body => NULL) AS null_body;
SELECT pg_temp.try_enqueue(queue => NULL) AS null_queue;
SELECT pg_temp.try_enqueue(send_at => NULL) AS null_send_at;
SELECT pg_temp.try_enqueue(priority => NULL) AS null_priority;
SELECT pg_temp.error_of($$INSERT INTO gatekeeper.mail (recipient, subject, body, queue) VALUES (NULL, 's', 'b', 'bad')$$) AS insert_null_recipient;
SELECT pg_temp.error_of($$INSERT INTO gatekeeper.mail (recipient, subject, body, queue) VALUES ('a@example.com', NULL, 'b', 'bad')$$) AS insert_null_subject;
SELECT pg_temp.error_of($$INSERT INTO gatekeeper.mail (recipient, subject, body, queue) VALUES ('a@example.com', 's', NULL, 'bad')$$) AS insert_null_body;
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.claim(NULL)$$) AS claim_null_worker;
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.claim('w', NULL)$$) AS claim_null_batch;
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.claim('w', 1, NULL)$$) AS claim_null_lease;
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.claim('w', 1, queues => ARRAY['bad', NULL])$$) AS claim_null_queue_name;
SELECT pg_temp.error_of($$SELECT gatekeeper.ack(NULL::bigint, 1)$$) AS ack_null_id;
SELECT pg_temp.error_of($$SELECT gatekeeper.ack_batch(NULL::bigint[], '{1}')$$) AS ack_null_ids;
SELECT pg_temp.error_of($$SELECT gatekeeper.nack(1, NULL, 'e')$$) AS nack_null_attempt;
SELECT pg_temp.error_of($$SELECT gatekeeper.extend(1, 1, NULL)$$) AS extend_null_lease;
SELECT pg_temp.error_of($$SELECT gatekeeper.cancel(NULL)$$) AS cancel_null;
SELECT pg_temp.error_of($$SELECT gatekeeper.gate_pass('bad_gate', NULL::text)$$) AS gate_pass_null_recipient;
SELECT pg_temp.error_of($$SELECT gatekeeper.gate_pass_batch('bad_gate', ARRAY['a@example.com', NULL])$$) AS gate_pass_null_in_batch;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_gate('g_null', NULL)$$) AS create_gate_null_period;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('q_null', gates => NULL)$$) AS create_queue_null_gates;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('q_null', ARRAY['bad_gate', NULL])$$) AS create_queue_null_gate_name;

-- empty recipients and names
SELECT pg_temp.error_of($$SELECT gatekeeper.gate_pass('bad_gate', '')$$) AS gate_pass_empty_recipient;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('')$$) AS create_queue_empty_name;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_gate('', '1 hour')$$) AS create_gate_empty_name;

--
-- a queue that does not exist: 42704 everywhere, never a silent creation
--
SELECT pg_temp.try_enqueue(queue => 'no_such_queue') AS enqueue;
SELECT pg_temp.try_enqueue(queue => 'Bad') AS enqueue_wrong_case;
SELECT pg_temp.error_of($$SELECT gatekeeper.enqueue('a@example.com', 's', 'b', 'no_such_queue', dedupe_key => 'k')$$) AS enqueue_with_dedupe_key;
SELECT pg_temp.error_of($$INSERT INTO gatekeeper.mail (recipient, subject, body, queue) VALUES ('a@example.com', 's', 'b', 'no_such_queue')$$) AS insert;
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.claim('w', 10, queues => ARRAY['bad', 'no_such_queue'])$$) AS claim_filter;
SELECT pg_temp.error_of($$SELECT gatekeeper.pause('no_such_queue')$$) AS pause;
SELECT pg_temp.error_of($$SELECT gatekeeper.resume('no_such_queue')$$) AS resume;
SELECT pg_temp.error_of($$SELECT gatekeeper.cancel_queue('no_such_queue')$$) AS cancel_queue;
SELECT pg_temp.error_of($$SELECT gatekeeper.alter_queue('no_such_queue', weight => 2)$$) AS alter_queue;
SELECT pg_temp.error_of($$SELECT gatekeeper.drop_queue('no_such_queue')$$) AS drop_queue;
SELECT name FROM gatekeeper.queue WHERE name = 'no_such_queue';
-- as an application sees them, context included (issue 28): the queue
-- named, the hint, and no line of gatekeeper's own SQL or PL/pgSQL; the
-- same for every error of enqueue
\set VERBOSITY default
SELECT gatekeeper.enqueue('a@example.com', 's', 'b', 'no_such_queue');
SELECT gatekeeper.enqueue('a@example.com', 's', 'b', 'no_such_queue', dedupe_key => 'k');
SELECT gatekeeper.enqueue('a@example.com', NULL, 'b');
SELECT gatekeeper.enqueue('no address', 's', 'b');
-- from the application's own function: its context, none of gatekeeper's
DO $$ BEGIN PERFORM gatekeeper.enqueue('a@example.com', 's', 'b', 'no_such_queue'); END $$;
\set VERBOSITY terse

--
-- a gate that does not exist: 42704
--
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('q_nogate', gates => ARRAY['bad_gate', 'no_such_gate'])$$) AS create_queue;
SELECT pg_temp.error_of($$SELECT gatekeeper.alter_queue('bad', gates => ARRAY['no_such_gate'])$$) AS alter_queue;
SELECT pg_temp.error_of($$SELECT gatekeeper.gate_pass('no_such_gate', 'a@example.com')$$) AS gate_pass;
SELECT pg_temp.error_of($$SELECT gatekeeper.gate_pass('no_such_gate', 'a@example.com', 1)$$) AS gate_pass_holder;
SELECT pg_temp.error_of($$SELECT gatekeeper.gate_pass_batch('no_such_gate', ARRAY['a@example.com'])$$) AS gate_pass_batch;
SELECT pg_temp.error_of($$SELECT gatekeeper.gate_open('no_such_gate', 'a@example.com')$$) AS gate_open;
SELECT pg_temp.error_of($$SELECT gatekeeper.gate_next_open('no_such_gate', 'a@example.com')$$) AS gate_next_open;
SELECT pg_temp.error_of($$SELECT gatekeeper.gate_release('no_such_gate', 'a@example.com', 1)$$) AS gate_release;
SELECT pg_temp.error_of($$SELECT gatekeeper.alter_gate('no_such_gate', period => '1 hour')$$) AS alter_gate;
SELECT pg_temp.error_of($$SELECT gatekeeper.drop_gate('no_such_gate')$$) AS drop_gate;
SELECT gates FROM gatekeeper.queue WHERE name = 'bad';

--
-- claim's batch and lease; extend's lease
--
SELECT b AS batch, pg_temp.error_of(format($$SELECT * FROM gatekeeper.claim('w', %s, queues => ARRAY['bad'])$$, b)) AS result
  FROM unnest(ARRAY[-1, 0, 10001, 2147483647]) AS b ORDER BY b;
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.claim('w', 10000, queues => ARRAY['bad'])$$) AS batch_10000;
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.claim('w', 1, queues => ARRAY['bad'])$$) AS batch_1;
SELECT l AS lease, pg_temp.error_of(format($$SELECT * FROM gatekeeper.claim('w', 10, %L, ARRAY['bad'])$$, l)) AS result
  FROM unnest(ARRAY['0', '-1 minute', '0 seconds', '30 days']) WITH ORDINALITY AS t(l, n) ORDER BY n;
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.claim('w', 10, queues => ARRAY[['bad'], ['bad']])$$) AS two_dim_queues;
SELECT l AS extend_lease, pg_temp.error_of(format($$SELECT gatekeeper.extend(1, 1, %L)$$, l)) AS result
  FROM unnest(ARRAY['0', '-1 minute', '30 days']) WITH ORDINALITY AS t(l, n) ORDER BY n;

--
-- gate periods and max_sends
--
SELECT p AS period, pg_temp.error_of(format($$SELECT gatekeeper.create_gate('g_bad', %L)$$, p)) AS create_gate
  FROM unnest(ARRAY['0', '-1 hour', '0 days']) WITH ORDINALITY AS t(p, n) ORDER BY n;
SELECT p AS period, pg_temp.error_of(format($$SELECT gatekeeper.alter_gate('bad_gate', %L)$$, p)) AS alter_gate
  FROM unnest(ARRAY['0', '-1 hour']) WITH ORDINALITY AS t(p, n) ORDER BY n;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_gate('g_bad', '1 hour', 0)$$) AS create_gate_max_sends_0;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_gate('g_bad', '1 hour', -1)$$) AS create_gate_max_sends_neg;
SELECT pg_temp.error_of($$SELECT gatekeeper.alter_gate('bad_gate', max_sends => 0)$$) AS alter_gate_max_sends_0;
SELECT name, period, max_sends FROM gatekeeper.gate ORDER BY name;

--
-- queue policy
--
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('q_bad', on_gate_closed => 'drop')$$) AS on_gate_closed_word;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('q_bad', on_gate_closed => 'SUPPRESS')$$) AS on_gate_closed_case;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('q_bad', delivery => 'exactly_once')$$) AS delivery_word;
SELECT pg_temp.error_of($$SELECT gatekeeper.alter_queue('bad', on_gate_closed => 'skip')$$) AS alter_on_gate_closed_word;
SELECT pg_temp.error_of($$SELECT gatekeeper.alter_queue('bad', delivery => 'at-least-once')$$) AS alter_delivery_word;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('q_bad', max_attempts => 0)$$) AS max_attempts_0;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('q_bad', weight => 0)$$) AS weight_0;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('q_bad', weight => -3)$$) AS weight_neg;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('q_bad', rate_limit => 0)$$) AS rate_limit_0;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('q_bad', rate_limit => -5)$$) AS rate_limit_neg;
-- '0' is a window since 0.3.0 (keys held only while their mail is
-- unfinished, issue 25): accepted, and the queue dropped again
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('q_bad', dedupe_window => '0')$$) AS dedupe_window_0;
SELECT gatekeeper.drop_queue('q_bad');
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('q_bad', dedupe_window => '-1 hour')$$) AS dedupe_window_neg;
SELECT pg_temp.error_of($$SELECT gatekeeper.alter_queue('bad', max_attempts => 0)$$) AS alter_max_attempts_0;
SELECT pg_temp.error_of($$SELECT gatekeeper.alter_queue('bad', weight => 0)$$) AS alter_weight_0;
SELECT pg_temp.error_of($$SELECT gatekeeper.alter_queue('bad', rate_limit => -1)$$) AS alter_rate_limit_neg;
SELECT pg_temp.error_of($$SELECT gatekeeper.alter_queue('bad', dedupe_window => '-1 hour')$$) AS alter_dedupe_window_neg;
SELECT name, gates, on_gate_closed, delivery, max_attempts, weight, rate_limit, dedupe_window
  FROM gatekeeper.queue WHERE name IN ('bad', 'q_bad') ORDER BY name;

--
-- duplicates, the default queue, objects in use
--
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('bad')$$) AS duplicate_queue;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('default')$$) AS duplicate_default_queue;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_gate('bad_gate', '2 hours')$$) AS duplicate_gate;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_gate('smart_sending', '1 hour')$$) AS duplicate_smart_sending;
SELECT pg_temp.error_of($$SELECT gatekeeper.drop_queue('default')$$) AS drop_default_queue;
SELECT gatekeeper.create_queue('bad_live', gates => ARRAY['bad_gate']);
SELECT gatekeeper.enqueue('live@example.com', 's', 'b', 'bad_live', send_at => now() + interval '1 day') AS live \gset
SELECT pg_temp.error_of($$SELECT gatekeeper.drop_queue('bad_live')$$) AS drop_queue_with_live_mail;
SELECT pg_temp.error_of($$SELECT gatekeeper.drop_gate('bad_gate')$$) AS drop_gate_in_use;
-- once the mail is cancelled, and the gate is no longer used, both drop
SELECT gatekeeper.cancel(:live) AS cancelled;
SELECT gatekeeper.drop_queue('bad_live');
SELECT gatekeeper.drop_gate('bad_gate');
SELECT gatekeeper.create_gate('bad_gate', '1 hour');

--
-- send_by before send_at
--
SELECT pg_temp.try_enqueue(send_at => now() + interval '1 hour', send_by => now()) AS send_by_before_send_at;
SELECT pg_temp.try_enqueue(send_by => now() - interval '1 second') AS send_by_in_the_past;
SELECT pg_temp.error_of($$INSERT INTO gatekeeper.mail (recipient, subject, body, queue, send_at, send_by)
	VALUES ('a@example.com', 's', 'b', 'bad', now() + interval '2 hours', now() + interval '1 hour')$$) AS insert_send_by_before_send_at;
BEGIN;
SELECT pg_temp.try_enqueue(send_at => now() + interval '1 hour', send_by => now() + interval '1 hour') AS send_by_equal_send_at;
ROLLBACK;

--
-- gatekeeper.max_message_size (default 10MB): subject, body, html and headers together
--
SELECT current_setting('gatekeeper.max_message_size') AS max_message_size;
-- a sighup setting: a session cannot raise (or lower) it
SELECT pg_temp.error_of($$SET gatekeeper.max_message_size = '1kB'$$) AS set_in_session;
-- gatekeeper.lease, the workers' claims' lease: no longer than claim()
-- takes (7 days), or every claim of the workers would be refused
ALTER SYSTEM SET gatekeeper.lease = '8d';
ALTER SYSTEM SET gatekeeper.lease = '30d';
ALTER SYSTEM SET gatekeeper.lease = '100000d';
ALTER SYSTEM SET gatekeeper.lease = '7d';
ALTER SYSTEM RESET gatekeeper.lease;
BEGIN;
SELECT pg_temp.try_enqueue(subject => 's', body => repeat('x', 10 * 1024 * 1024 - 1)) AS exactly_the_limit;
ROLLBACK;
SELECT pg_temp.try_enqueue(subject => 's', body => repeat('x', 10 * 1024 * 1024)) AS one_byte_over;
SELECT pg_temp.try_enqueue(body => 'b', html => repeat('<p>x</p>', 1400000)) AS html_over;
SELECT pg_temp.try_enqueue(body => repeat('x', 6 * 1024 * 1024), html => repeat('y', 6 * 1024 * 1024)) AS body_and_html_over;
SELECT pg_temp.error_of($$INSERT INTO gatekeeper.mail (recipient, subject, body, queue)
	VALUES ('a@example.com', 's', repeat('x', 11 * 1024 * 1024), 'bad')$$) AS insert_over;

--
-- an UPDATE of a mail's content is validated too (no injection after enqueue)
--
SELECT gatekeeper.enqueue('upd@example.com', 'Fine', 'b', 'bad', send_at => now() + interval '1 day') AS upd \gset
SELECT pg_temp.error_of(format($$UPDATE gatekeeper.mail SET subject = E'Fine\r\nBcc: victim@example.com' WHERE id = %s$$, :upd)) AS update_subject;
SELECT pg_temp.error_of(format($$UPDATE gatekeeper.mail SET recipient = 'nobody' WHERE id = %s$$, :upd)) AS update_recipient;
SELECT pg_temp.error_of(format($$UPDATE gatekeeper.mail SET headers = '{"From": "ceo@example.com"}' WHERE id = %s$$, :upd)) AS update_headers;
SELECT pg_temp.error_of(format($$UPDATE gatekeeper.mail SET queue = 'no_such_queue' WHERE id = %s$$, :upd)) AS update_queue;
SELECT subject, recipient, headers, queue FROM gatekeeper.mail_status WHERE id = :upd;
SELECT gatekeeper.cancel(:upd) AS cancelled;

--
-- nothing was written by any of the failures above
--
SELECT count(*) - :mail_before AS mail_written,
       count(*) FILTER (WHERE id NOT IN (:live, :upd) AND queue LIKE 'bad%') AS unexpected_mail,
       count(*) FILTER (WHERE state IN ('scheduled', 'claimed') AND queue LIKE 'bad%') AS live_mail_left
  FROM gatekeeper.mail_status;
SELECT count(*) - :passes_before AS passes_written FROM gatekeeper.gate_log;
SELECT name FROM gatekeeper.queue ORDER BY name;
SELECT name FROM gatekeeper.gate ORDER BY name;
