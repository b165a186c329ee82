-- The queue option feedback_id (issue 27, item 6): create_queue and
-- alter_queue take it (alter_queue: NULL leaves it, '' removes it); one to
-- four ':'-separated fields of printable ASCII without spaces, at most 200
-- octets, else 22023 and nothing written.  The claim adds the queue's
-- Feedback-ID to the headers it returns, unless the mail brings its own.
SET client_min_messages = warning;
\set VERBOSITY terse

\i sql/error_of.inc

SELECT gatekeeper.create_queue('f_news', feedback_id => 'campaign42:customer7:newsletter:shop');
SELECT gatekeeper.create_queue('f_one', feedback_id => 'shop');
SELECT gatekeeper.create_queue('f_none');
SELECT name, feedback_id FROM gatekeeper.queue WHERE name LIKE 'f\_%' ORDER BY name;

SELECT gatekeeper.alter_queue('f_none', feedback_id => 'a.b-c_d=e!:x~y');
SELECT gatekeeper.alter_queue('f_one', weight => 2);
SELECT gatekeeper.alter_queue('f_news', feedback_id => '');
SELECT name, feedback_id, weight FROM gatekeeper.queue WHERE name LIKE 'f\_%' ORDER BY name;

-- bad values are refused, and nothing is written
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('f_bad', feedback_id => 'a:b:c:d:e')$$) AS five_fields;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('f_bad', feedback_id => 'a::c')$$) AS empty_field;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('f_bad', feedback_id => ':a')$$) AS leading_colon;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('f_bad', feedback_id => 'a:')$$) AS trailing_colon;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('f_bad', feedback_id => '')$$) AS empty;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('f_bad', feedback_id => 'news letter')$$) AS space;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('f_bad', feedback_id => E'a\tb')$$) AS tab;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('f_bad', feedback_id => E'a\r\nBcc: x@example.com')$$) AS crlf;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('f_bad', feedback_id => 'café')$$) AS non_ascii;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('f_bad', feedback_id => repeat('a', 201))$$) AS too_long;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('f_long', feedback_id => repeat('a', 200))$$) AS longest;
SELECT pg_temp.error_of($$SELECT gatekeeper.alter_queue('f_one', feedback_id => 'a b')$$) AS alter_space;
SELECT name, left(feedback_id, 20) AS feedback_id, octet_length(feedback_id) AS octets
  FROM gatekeeper.queue WHERE name LIKE 'f\_%' ORDER BY name;

-- the claim adds Feedback-ID; a mail's own wins
SELECT gatekeeper.enqueue('fa@example.com', 'Hello', 'Body', queue => 'f_none') > 0 AS queued;
SELECT gatekeeper.enqueue('fb@example.com', 'Hello', 'Body', queue => 'f_none',
						  headers => '{"Feedback-ID": "own:id", "X-Tag": "t"}') > 0 AS queued;
SELECT gatekeeper.enqueue('fc@example.com', 'Hello', 'Body', queue => 'f_news') > 0 AS queued;
SELECT recipient, headers FROM gatekeeper.claim('f_worker', 10, queues => '{f_none,f_news}') ORDER BY recipient;
