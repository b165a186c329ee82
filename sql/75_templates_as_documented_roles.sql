-- Templates as the roles docs/operations.md ("Security") sets up, not as
-- the superuser (issue 48): the enqueue-only role enqueues templated mail
-- by name (enqueue, INSERT ... SELECT, COPY) and the worker role claims it
-- rendered, exactly as render() shows it; neither, nor the monitoring role,
-- may make, change, drop, read or render() a template (42501, nothing
-- written), the owner and a role granted the template functions by hand
-- may (docs/reference.md, "Who may do what with templates").  Then an
-- adversary holding exactly the enqueue grant: its data cannot inject
-- template syntax or header lines, its own headers win over the
-- template's in any case, its errors and last_error name no template text
-- and no data, and its data cannot make a rendering unbounded (54000 at
-- enqueue, or the mail fails alone at its claim).
SET client_min_messages = warning;
\set VERBOSITY terse

\i sql/error_of.inc

CREATE ROLE regress_tr_enqueue NOLOGIN;
CREATE ROLE regress_tr_worker NOLOGIN;
CREATE ROLE regress_tr_monitor NOLOGIN;
CREATE ROLE regress_tr_editor NOLOGIN;
CREATE ROLE regress_tr_nobody NOLOGIN;
SELECT gatekeeper.grant('regress_tr_enqueue', 'enqueue');
SELECT gatekeeper.grant('regress_tr_worker', 'worker');
SELECT gatekeeper.grant('regress_tr_monitor', 'monitor');
-- the template functions are the owner's; a role that writes templates
-- is given them by hand (docs/reference.md)
GRANT USAGE ON SCHEMA gatekeeper TO regress_tr_editor;
GRANT EXECUTE ON FUNCTION gatekeeper.create_template(text, text, text, text, jsonb),
	gatekeeper.alter_template(text, text, text, text, jsonb),
	gatekeeper.drop_template(text),
	gatekeeper.render(text, jsonb, int) TO regress_tr_editor;

SELECT gatekeeper.create_queue('tr_q');
-- the owner's template: each part holds text no other role may read
SELECT gatekeeper.create_template('tr_offer',
	'Offer for {{first_name}} [subject-only-the-owner-reads]',
	E'Hello {{first_name}}{{#items}}, {{name}}{{/items}}\n[body-only-the-owner-reads]',
	'<p>{{first_name}}</p>{{{sig}}}',
	'{"X-Campaign": "spring-{{first_name}}"}');
SELECT gatekeeper.alter_template('tr_offer', subject => 'Offer v2 for {{first_name}} [subject-only-the-owner-reads]');

--
-- the enqueue-only role enqueues templated mail by name, as the docs'
-- recipe allows: enqueue, INSERT ... SELECT from its own table, COPY
--
SET ROLE regress_tr_enqueue;
SELECT gatekeeper.enqueue('ann@tr.example', NULL, NULL, 'tr_q', now() - interval '1 minute',
	template => 'tr_offer',
	data => '{"first_name": "Ann", "items": [{"name": "Tea"}, {"name": "Cups"}], "sig": "<b>A</b>"}')
	IS NOT NULL AS enqueued;
CREATE TEMP TABLE tr_customers (email text, first_name text);
INSERT INTO tr_customers VALUES ('bea@tr.example', 'Bea'), ('cy@tr.example', 'Cy & Co');
INSERT INTO gatekeeper.mail (recipient, queue, send_at, template, data)
SELECT c.email, 'tr_q', now() - interval '1 minute', 'tr_offer',
	   jsonb_build_object('first_name', c.first_name)
  FROM tr_customers c;
-- version 1 named, RETURNING id (the one column it may read)
INSERT INTO gatekeeper.mail (recipient, queue, send_at, template, template_version, data)
VALUES ('di@tr.example', 'tr_q', now() - interval '1 minute', 'tr_offer', 1, '{"first_name": "Di"}')
RETURNING id IS NOT NULL AS returned_id;
COPY gatekeeper.mail (recipient, queue, template, data) FROM STDIN (FORMAT csv);
ed@tr.example,tr_q,tr_offer,"{""first_name"": ""Ed""}"
\.

-- it may neither make, change nor drop a template
SELECT pg_temp.error_of($$SELECT gatekeeper.create_template('tr_mine', 's', 'b')$$) AS create_template;
SELECT pg_temp.error_of($$SELECT gatekeeper.alter_template('tr_offer', subject => 'Mine {{x}}')$$) AS alter_template;
SELECT pg_temp.error_of($$SELECT gatekeeper.drop_template('tr_offer')$$) AS drop_template;
-- nor read one: render(), the table, the view, the helpers
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.render('tr_offer', '{}')$$) AS render;
SELECT pg_temp.error_of($$SELECT subject FROM gatekeeper.template$$) AS select_template;
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.templates$$) AS select_templates;
SELECT pg_temp.error_of($$SELECT gatekeeper._template_version('tr_offer', now())$$) AS template_version;
SELECT pg_temp.error_of($$SELECT gatekeeper._template_check('tr_x', 's', 'b', NULL, NULL)$$) AS template_check;
SELECT pg_temp.error_of($$INSERT INTO gatekeeper.template (name, version, subject, body) VALUES ('tr_mine', 1, 's', 'b')$$) AS insert_template;
SELECT pg_temp.error_of($$UPDATE gatekeeper.template SET subject = 'x'$$) AS update_template;
-- nor read back the data or template of the mail it writes
SELECT pg_temp.error_of($$INSERT INTO gatekeeper.mail (recipient, queue, template, data) VALUES ('x@tr.example', 'tr_q', 'tr_offer', '{}') RETURNING data$$) AS returning_data;
SELECT pg_temp.error_of($$SELECT data FROM gatekeeper.mail$$) AS select_data;
-- what its errors tell: only that a name, or a version, does not exist
SELECT pg_temp.error_of($$SELECT gatekeeper.enqueue('x@tr.example', NULL, NULL, 'tr_q', template => 'tr_other_tenant')$$) AS no_template;
SELECT pg_temp.error_of($$INSERT INTO gatekeeper.mail (recipient, queue, template, template_version) VALUES ('x@tr.example', 'tr_q', 'tr_offer', 9)$$) AS no_version;
RESET ROLE;

-- the refused calls wrote nothing: the owner's two versions, as made
SELECT name, version, subject FROM gatekeeper.template WHERE name LIKE 'tr_%' ORDER BY name, version;

--
-- the worker role claims them rendered; it may not render() or read a
-- template either
--
SET ROLE regress_tr_worker;
CREATE TEMP TABLE tr_claimed AS
SELECT c.id, c.attempt, c.recipient, c.subject, c.body, c.html, c.headers
  FROM gatekeeper.claim('tr-w', 100, queues => ARRAY['tr_q']) c;
SELECT recipient, subject, to_json(body) AS body, html, headers FROM tr_claimed ORDER BY recipient;
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.render('tr_offer', '{}')$$) AS render;
SELECT pg_temp.error_of($$SELECT subject FROM gatekeeper.template$$) AS select_template;
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.templates$$) AS select_templates;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_template('tr_mine', 's', 'b')$$) AS create_template;
RESET ROLE;

-- what the worker role was handed is what render() shows the owner, for
-- the version each mail keeps
WITH c AS MATERIALIZED (
	SELECT c.*, m.template, m.data,
		   coalesce(m.template_version,
					gatekeeper._template_version(m.template, m.created_at)) AS version
	  FROM tr_claimed c JOIN gatekeeper.mail m ON m.id = c.id)
SELECT count(*) AS claimed,
	   count(*) FILTER (WHERE r.subject = c.subject AND r.body = c.body
						  AND r.html IS NOT DISTINCT FROM c.html AND r.headers = c.headers) AS as_render
  FROM c, gatekeeper.render(c.template, c.data, c.version) r;
SELECT gatekeeper.ack_batch(array_agg(id), array_agg(attempt)) AS acked FROM tr_claimed;

--
-- the monitoring role and a role granted nothing: no template at all
--
SET ROLE regress_tr_monitor;
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.render('tr_offer', '{}')$$) AS render;
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.templates$$) AS select_templates;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_template('tr_mine', 's', 'b')$$) AS create_template;
RESET ROLE;
SET ROLE regress_tr_nobody;
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.render('tr_offer', '{}')$$) AS render;
SELECT pg_temp.error_of($$SELECT gatekeeper.drop_template('tr_offer')$$) AS drop_template;
RESET ROLE;

--
-- a role given the template functions by hand manages templates, without
-- reading the table
--
SET ROLE regress_tr_editor;
SELECT gatekeeper.create_template('tr_edited', 'Hi {{n}}', 'b {{n}}') AS version;
SELECT gatekeeper.alter_template('tr_edited', subject => 'Hello {{n}}') AS version;
SELECT r.subject, r.body FROM gatekeeper.render('tr_edited', '{"n": "Jo"}') r;
SELECT gatekeeper.drop_template('tr_edited');
SELECT pg_temp.error_of($$SELECT subject FROM gatekeeper.template$$) AS select_template;
RESET ROLE;
SELECT count(*) AS tr_edited_versions FROM gatekeeper.template WHERE name = 'tr_edited';

--
-- an adversary holding exactly the enqueue grant
--
-- The owner's templates: one whose every part shows a variable, one with
-- a loop, and one with a loop nested in itself (nothing an enqueue role
-- can make).
SELECT gatekeeper.create_template('tr_echo', 'S {{v}}', 'B {{v}} {{{v}}}', '<p>{{v}}|{{{v}}}</p>',
	'{"X-Echo": "{{v}}{{h}}"}');
SELECT gatekeeper.create_template('tr_loop', 'loop', repeat('x', 100) || '{{#l}}' || repeat('y', 1000) || '{{/l}}');
SELECT gatekeeper.create_template('tr_nested', 'nested',
	'{{#l}}{{#l}}{{#l}}{{#l}}{{#l}}.{{/l}}{{/l}}{{/l}}{{/l}}{{/l}}');

SET ROLE regress_tr_enqueue;
-- template syntax in data comes out as it is: no tag of it is read,
-- whatever it names (another variable, a section, a partial, a delimiter
-- change, a comment), and the html part escapes only & < > " '
INSERT INTO gatekeeper.mail (recipient, queue, send_at, template, data, metadata)
SELECT format('inject%s@tr.example', n), 'tr_q', now() - interval '1 minute', 'tr_echo',
	   jsonb_build_object('v', v, 'secret', 'S3CRET'), jsonb_build_object('m', '{{v}}')
  FROM (VALUES (1, '{{secret}}'), (2, '{{{secret}}}'), (3, '{{#secret}}x{{/secret}}'),
			   (4, '{{> secret}}'), (5, '{{=<% %>=}}<%secret%>'), (6, '{{! c }}<i>&"''</i>')) AS d(n, v);
-- a line break in a subject or header value fails the mail alone, at its
-- claim: no header is injected
SELECT gatekeeper.enqueue('crlf1@tr.example', NULL, NULL, 'tr_q', now() - interval '1 minute',
	template => 'tr_offer', data => E'{"first_name": "x\\r\\nBcc: victim@tr.example"}') AS crlf_subject \gset
SELECT gatekeeper.enqueue('crlf2@tr.example', NULL, NULL, 'tr_q', now() - interval '1 minute',
	template => 'tr_echo', data => E'{"v": "fine", "h": "x\\nBcc: victim@tr.example"}') AS crlf_header \gset
-- its own headers win over the template's, in any case, and are not
-- rendered
SELECT gatekeeper.enqueue('own1@tr.example', NULL, NULL, 'tr_q', now() - interval '1 minute',
	template => 'tr_offer', data => '{"first_name": "Own"}',
	headers => '{"X-Campaign": "mine {{first_name}}"}') IS NOT NULL AS own_same_case;
SELECT gatekeeper.enqueue('own2@tr.example', NULL, NULL, 'tr_q', now() - interval '1 minute',
	template => 'tr_offer', data => '{"first_name": "Own"}',
	headers => '{"x-campaign": "mine too"}') IS NOT NULL AS own_other_case;
-- bounded: data over gatekeeper.max_message_size (10MB here) is refused
-- as it enters; a loop over its array that would write more fails the
-- mail at its claim, and so does a nested loop that would take too many
-- steps, alone, the rest of the claim going
SELECT pg_temp.error_of($$SELECT gatekeeper.enqueue('big@tr.example', NULL, NULL, 'tr_q', template => 'tr_loop', data => jsonb_build_object('l', repeat('x', 10 * 1024 * 1024)))$$) AS data_too_large;
SELECT gatekeeper.enqueue('loop@tr.example', NULL, NULL, 'tr_q', now() - interval '1 minute',
	template => 'tr_loop', data => jsonb_build_object('l', (SELECT jsonb_agg(i) FROM generate_series(1, 20000) i))) AS huge_loop \gset
SELECT gatekeeper.enqueue('nest@tr.example', NULL, NULL, 'tr_q', now() - interval '1 minute',
	template => 'tr_nested', data => jsonb_build_object('l', (SELECT jsonb_agg(i) FROM generate_series(1, 100) i))) AS nested_loop \gset
-- deeply nested data is only a value: written as JSON where named
SELECT gatekeeper.enqueue('deep@tr.example', NULL, NULL, 'tr_q', now() - interval '1 minute',
	template => 'tr_echo', data => ('{"v": ' || repeat('[', 2000) || repeat(']', 2000) || '}')::jsonb) IS NOT NULL AS deep_data;
RESET ROLE;

SET ROLE regress_tr_worker;
CREATE TEMP TABLE tr_adversary AS
SELECT c.id, c.attempt, c.recipient, c.subject, c.body, c.html, c.headers, c.metadata
  FROM gatekeeper.claim('tr-w', 100, queues => ARRAY['tr_q']) c;
SELECT recipient, subject, body, html, headers, metadata
  FROM tr_adversary WHERE recipient LIKE 'inject%' ORDER BY recipient;
SELECT recipient, headers FROM tr_adversary WHERE recipient LIKE 'own%' ORDER BY recipient;
SELECT recipient, length(subject) AS subject_length, length(body) AS body_length
  FROM tr_adversary WHERE recipient = 'deep@tr.example';
-- neither line-break mail nor the two loops was handed over
SELECT count(*) AS claimed, count(*) FILTER (WHERE recipient ~ '^(crlf|loop|nest)') AS unrenderable
  FROM tr_adversary;
SELECT gatekeeper.ack_batch(array_agg(id), array_agg(attempt)) AS acked FROM tr_adversary;
RESET ROLE;

-- what the adversary reads of its failed mail: the part and the limit,
-- never the template's text nor its data
SET ROLE regress_tr_enqueue;
SELECT s.state, s.attempt, s.last_error,
	   s.last_error ~ '(only-the-owner|Bcc|victim|spring-|B \{)' AS leaks
  FROM unnest(ARRAY[:crlf_subject, :crlf_header, :huge_loop, :nested_loop]::bigint[]) WITH ORDINALITY AS m(id, n),
	   gatekeeper.status(m.id) s
 ORDER BY m.n;
RESET ROLE;

-- clean up
SELECT gatekeeper.cancel_queue('tr_q') AS cancelled;
SELECT gatekeeper.drop_template(t) FROM unnest(ARRAY['tr_offer', 'tr_echo', 'tr_loop', 'tr_nested']) t;
DROP TABLE tr_claimed, tr_adversary;
DROP OWNED BY regress_tr_enqueue, regress_tr_worker, regress_tr_monitor, regress_tr_editor, regress_tr_nobody;
DROP ROLE regress_tr_enqueue, regress_tr_worker, regress_tr_monitor, regress_tr_editor, regress_tr_nobody;
DELETE FROM gatekeeper.role_grant;
