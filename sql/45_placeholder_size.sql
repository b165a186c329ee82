-- A header value's {message_id} becomes the mail's Message-ID at the claim
-- (up to 295 octets with a 252-octet sender domain): enqueue counts each
-- placeholder at 384 octets (docs/reference.md, "The size rule") against
-- gatekeeper.max_message_size (10MB here), so an application cannot
-- enqueue a mail that grows twentyfold on its way to the worker (issue 44,
-- item 3).  enqueue(), INSERT ... SELECT and COPY share the check.  A
-- header name may not hold a brace: placeholders are values' only.
--   54000 program_limit_exceeded   22023 invalid_parameter_value
SET client_min_messages = warning;
\set VERBOSITY terse
\i sql/error_of_detail.inc

SELECT gatekeeper.create_queue('ph');

-- three placeholders; the check counts the headers as stored (jsonb)
SELECT '{"X-Ref": "{message_id} {message_id} {message_id}"}' AS ph \gset
SELECT pg_column_size(:'ph'::jsonb) - 4 AS ph_size,
	   current_setting('gatekeeper.max_message_size') AS max_message_size \gset
SELECT :'max_message_size' AS max_message_size;
-- each placeholder counts 384 octets, 372 more than its 12
SELECT 10 * 1024 * 1024 - 1 - :ph_size AS at_limit_as_text,
	   10 * 1024 * 1024 - 1 - :ph_size - 3 * 372 AS at_limit_expanded \gset

-- subject, body and headers exactly at the limit as text: over it once
-- the placeholders count at their expanded size
SELECT pg_temp.error_of(format($$SELECT gatekeeper.enqueue('a@example.com', 's', repeat('x', %s), 'ph', headers => %L)$$,
							   :at_limit_as_text, :'ph')) AS enqueue_over;
SELECT pg_temp.error_of(format($$INSERT INTO gatekeeper.mail (recipient, subject, body, queue, headers)
	SELECT 'a' || i || '@example.com', 's', repeat('x', %s), 'ph', %L FROM generate_series(1, 1) i$$,
							   :at_limit_as_text, :'ph')) AS insert_select_over;
SELECT pg_temp.error_of(format($$COPY gatekeeper.mail (recipient, subject, body, queue, headers) FROM PROGRAM %L$$,
							   format($p$perl -e 'print q{c@example.com}, "\ts\t", "x" x %s, "\tph\t", q{%s}, "\n"'$p$,
									  :at_limit_as_text, :'ph'))) AS copy_over;
-- at the limit with the placeholders expanded: accepted, and one more
-- octet is not
BEGIN;
SELECT pg_temp.error_of(format($$SELECT gatekeeper.enqueue('a@example.com', 's', repeat('x', %s), 'ph', headers => %L)$$,
							   :at_limit_expanded, :'ph')) AS enqueue_at_limit;
SELECT pg_temp.error_of(format($$COPY gatekeeper.mail (recipient, subject, body, queue, headers) FROM PROGRAM %L$$,
							   format($p$perl -e 'print q{c@example.com}, "\ts\t", "x" x %s, "\tph\t", q{%s}, "\n"'$p$,
									  :at_limit_expanded, :'ph'))) AS copy_at_limit;
ROLLBACK;
SELECT pg_temp.error_of(format($$SELECT gatekeeper.enqueue('a@example.com', 's', repeat('x', %s), 'ph', headers => %L)$$,
							   :at_limit_expanded + 1, :'ph')) AS enqueue_one_over;
SELECT pg_temp.error_of(format($$INSERT INTO gatekeeper.mail (recipient, subject, body, queue, headers)
	SELECT 'a' || i || '@example.com', 's', repeat('x', %s), 'ph', %L FROM generate_series(1, 1) i$$,
							   :at_limit_expanded + 1, :'ph')) AS insert_select_one_over;
-- the text "message_id" without braces is no placeholder
BEGIN;
SELECT pg_temp.error_of(format($$SELECT gatekeeper.enqueue('a@example.com', 's', repeat('x', %s), 'ph', headers => %L)$$,
							   :at_limit_as_text, replace(:'ph', '{message_id}', '(message_id)'))) AS no_placeholder;
ROLLBACK;
-- an UPDATE of a scheduled mail is checked the same way
SELECT gatekeeper.enqueue('u@example.com', 's', 'b', 'ph', send_at => now() + interval '1 day') AS upd \gset
SELECT pg_temp.error_of(format($$UPDATE gatekeeper.mail SET body = repeat('x', %s), headers = %L WHERE id = %s$$,
							   :at_limit_as_text, :'ph', :upd)) AS update_over;
SELECT gatekeeper.cancel(:upd) AS cancelled;

-- a placeholder, or any brace, in a header name is refused
SELECT pg_temp.error_of($$SELECT gatekeeper.enqueue('a@example.com', 's', 'b', 'ph', headers => '{"X-{message_id}": "v"}')$$) AS enqueue_name;
SELECT pg_temp.error_of($$INSERT INTO gatekeeper.mail (recipient, subject, body, queue, headers)
	VALUES ('a@example.com', 's', 'b', 'ph', '{"X-Ref}": "v"}')$$) AS insert_name;
SELECT pg_temp.error_of($cmd$COPY gatekeeper.mail (recipient, subject, body, queue, headers) FROM PROGRAM $$printf 'a@example.com\ts\tb\tph\t{"{message_id}": "v"}\n'$$$cmd$) AS copy_name;

-- nothing of it was written
SELECT count(*) AS mails FROM gatekeeper.mail_status WHERE queue = 'ph' AND state <> 'cancelled';

-- the claim fills the placeholder in the value, wherever it stands in it,
-- and leaves other values, and other braces, as they are
SELECT gatekeeper.create_queue('ph_claim');
SELECT gatekeeper.enqueue('v@example.com', 's', 'b', 'ph_claim', sender => 'shop@shop.example',
	headers => '{"X-A": "id={message_id};again={message_id}", "X-B": "{message_id_x} {x}", "X-C": "\"{message_id}\""}') AS v \gset
SELECT c.headers ->> 'X-A' = format('id=%s;again=%s', c.message_id, c.message_id) AS a_filled_twice,
	   c.headers ->> 'X-B' AS b_as_given,
	   c.headers ->> 'X-C' = format('"%s"', c.message_id) AS c_filled_in_quotes,
	   m.headers ->> 'X-A' AS mail_keeps_the_placeholder
  FROM gatekeeper.claim('w', 1, queues => '{ph_claim}') c, gatekeeper.mail m WHERE m.id = c.id;

-- the 384 octets hold the longest Message-ID the claim may make: this
-- one's, <id.mac@domain>, with the id at 20 characters, its MAC (20
-- characters of base32, issue 44 item 1) and the domain at 255 octets
-- (gatekeeper.message_id_domain's most; a sender's domain, 252 here, is
-- at most that)
SELECT gatekeeper.enqueue('long@example.com', 's', 'b', 'ph_claim',
	sender => 's@' || repeat('a', 63) || '.' || repeat('b', 63) || '.' || repeat('c', 63) || '.' || repeat('d', 52) || '.example') AS long_id \gset
SELECT octet_length(substring(c.message_id from '@(.*)>$')) AS domain_octets,
	   octet_length(substring(c.message_id from '^<[0-9]+\.([a-z2-7]+)@')) AS mac_octets,
	   octet_length(c.message_id) + (20 - octet_length(c.id::text))
	   + (255 - octet_length(substring(c.message_id from '@(.*)>$'))) AS longest,
	   octet_length(c.message_id) + (20 - octet_length(c.id::text))
	   + (255 - octet_length(substring(c.message_id from '@(.*)>$'))) <= 384 AS fits
  FROM gatekeeper.claim('w', 1, queues => '{ph_claim}') c WHERE c.id = :long_id;
