-- Templated mail (issue 48; SPEC "Enqueue" and "Templates"): a mail names
-- a template, its version and data instead of a subject and body, by
-- enqueue, INSERT or COPY, checked as it enters; claim hands it over
-- rendered (html escaped, header values checked), from the version it
-- was enqueued with; one that cannot be rendered fails alone with its
-- reason; drop_template is refused while unfinished mail uses the
-- template, and the templates view counts that mail per version.
SET client_min_messages = warning;
\set VERBOSITY terse

\i sql/error_of.inc

SELECT gatekeeper.create_queue('tm_q');
SELECT gatekeeper.create_template('tm_welcome', 'Hello {{name}}',
	'Dear {{name}},{{#items}} {{.}}{{/items}}', '<p>{{name}}</p>',
	'{"X-Campaign": "c-{{campaign}}"}');
SELECT gatekeeper.alter_template('tm_welcome', subject => 'Welcome {{name}}');

-- enqueue: subject and body NULL, the latest version recorded
SELECT gatekeeper.enqueue('a@example.com', NULL, NULL, 'tm_q', now() - interval '1 minute',
	template => 'tm_welcome', data => '{"name": "Ann & <Bo>", "items": ["x", "y"], "campaign": 7}',
	metadata => '{"name": "{{never}}"}') IS NOT NULL AS enqueued;
SELECT recipient, subject, body, template, template_version, data->>'name' AS name
  FROM gatekeeper.mail WHERE queue = 'tm_q' ORDER BY id;

-- INSERT naming version 1, and one naming none (it keeps the latest made
-- at or before its created_at: 2)
INSERT INTO gatekeeper.mail (recipient, queue, send_at, template, template_version, data)
VALUES ('b@example.com', 'tm_q', now() - interval '1 minute', 'tm_welcome', 1, '{"name": "Bea"}');
INSERT INTO gatekeeper.mail (recipient, queue, send_at, template, data)
VALUES ('c@example.com', 'tm_q', now() - interval '1 minute', 'tm_welcome', '{"name": "Cy"}');
-- COPY, which goes straight into the segment's partition
COPY gatekeeper.mail (recipient, queue, template, data) FROM STDIN (FORMAT csv);
d@example.com,tm_q,tm_welcome,"{""name"": ""Di""}"
\.
SELECT recipient, template, template_version FROM gatekeeper.mail WHERE queue = 'tm_q' ORDER BY id;

-- validation, as each enters
SELECT pg_temp.error_of($$SELECT gatekeeper.enqueue('e@example.com', NULL, NULL, 'tm_q', template => 'tm_nope')$$);
SELECT pg_temp.error_of($$INSERT INTO gatekeeper.mail (recipient, queue, template) VALUES ('e@example.com', 'tm_q', 'tm_nope')$$);
SELECT pg_temp.error_of($$COPY gatekeeper.mail (recipient, queue, template) FROM PROGRAM 'echo e@example.com,tm_q,tm_nope' (FORMAT csv)$$);
SELECT pg_temp.error_of($$INSERT INTO gatekeeper.mail (recipient, queue, template, template_version) VALUES ('e@example.com', 'tm_q', 'tm_welcome', 3)$$);
SELECT pg_temp.error_of($$SELECT gatekeeper.enqueue('e@example.com', NULL, NULL, 'tm_q', template => 'tm_welcome', data => '[1]')$$);
SELECT pg_temp.error_of($$SELECT gatekeeper.enqueue('e@example.com', NULL, NULL, 'tm_q', template => 'tm_welcome', data => '"x"')$$);
SELECT pg_temp.error_of($$SELECT gatekeeper.enqueue('e@example.com', 'own subject', NULL, 'tm_q', template => 'tm_welcome')$$);
-- data within gatekeeper.max_message_size (10MB here)
SELECT pg_temp.error_of($$SELECT gatekeeper.enqueue('e@example.com', NULL, NULL, 'tm_q', template => 'tm_welcome', data => jsonb_build_object('name', repeat('x', 10 * 1024 * 1024)))$$);
-- plain mail still needs its subject and body (23502)
SELECT pg_temp.error_of($$SELECT gatekeeper.enqueue('e@example.com', NULL, 'body', 'tm_q')$$);
SELECT pg_temp.error_of($$INSERT INTO gatekeeper.mail (recipient, queue, body) VALUES ('e@example.com', 'tm_q', 'b')$$);
SELECT pg_temp.error_of($$INSERT INTO gatekeeper.mail (recipient, queue, subject) VALUES ('e@example.com', 'tm_q', 's')$$);
SELECT count(*) AS mails FROM gatekeeper.mail WHERE queue = 'tm_q';

-- in use: four unfinished mails, one of version 1 and three of version 2
SELECT name, version, in_use FROM gatekeeper.templates WHERE name = 'tm_welcome' ORDER BY version;
SELECT pg_temp.error_of($$SELECT gatekeeper.drop_template('tm_welcome')$$);

-- history shows the template's name as the subject
SELECT subject FROM gatekeeper.history('a@example.com') WHERE queue = 'tm_q';

-- claim renders each: html escaped, the version each keeps, headers, and
-- metadata as it was
SELECT recipient, subject, body, html, headers, metadata
  FROM gatekeeper.claim('w', 10, queues => ARRAY['tm_q']) ORDER BY id;
SELECT name, version, in_use FROM gatekeeper.templates WHERE name = 'tm_welcome' ORDER BY version;

-- a mail that cannot be rendered (a subject with a line break; a body
-- past max_message_size: 1MB eleven times) fails alone, uncharged, with
-- its reason; the others of the claim go
SELECT gatekeeper.create_template('tm_bad', '{{{s}}}', 'body{{#n}}{{{b}}}{{/n}}');
INSERT INTO gatekeeper.mail (recipient, queue, send_at, template, data) VALUES
	('f@example.com', 'tm_q', now() - interval '1 minute', 'tm_bad', '{"s": "one\ntwo"}'),
	('g@example.com', 'tm_q', now() - interval '1 minute', 'tm_bad', '{"s": "fine"}');
INSERT INTO gatekeeper.mail (recipient, queue, send_at, template, data)
SELECT 'h@example.com', 'tm_q', now() - interval '1 minute', 'tm_bad',
	   jsonb_build_object('s', 'big', 'b', repeat('x', 1024 * 1024),
						  'n', (SELECT jsonb_agg(i) FROM generate_series(1, 11) i));
SELECT recipient, subject, body FROM gatekeeper.claim('w', 10, queues => ARRAY['tm_q']) ORDER BY id;
SELECT s.recipient, s.state, s.attempt, s.last_error
  FROM gatekeeper.mail_status s WHERE s.template = 'tm_bad' ORDER BY s.id;

-- finished (acked) mail no longer holds its template
SELECT count(*) AS acked FROM (
	SELECT gatekeeper.ack(s.id, s.attempt) FROM gatekeeper.mail_status s
	 WHERE s.queue = 'tm_q' AND s.state = 'claimed') a;
SELECT name, version, in_use FROM gatekeeper.templates WHERE name IN ('tm_welcome', 'tm_bad') ORDER BY name, version;
SELECT gatekeeper.drop_template('tm_welcome');
SELECT gatekeeper.drop_template('tm_bad');
SELECT count(*) AS templates FROM gatekeeper.templates WHERE name LIKE 'tm_%';
