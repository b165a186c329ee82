-- gatekeeper.grant(role, use): one line gives a role what the README's
-- recipes give it, and is remembered, so that _grant_apply() (the end of
-- every update script) gives it new or replaced functions again.
SET client_min_messages = warning;
\set VERBOSITY terse

\i sql/error_of.inc

SELECT gatekeeper.create_queue('g_app');
CREATE ROLE regress_g_enqueue NOLOGIN;
CREATE ROLE regress_g_worker NOLOGIN;
CREATE ROLE regress_g_monitor NOLOGIN;
CREATE ROLE regress_g_gone NOLOGIN;

-- bad input: nothing is written
SELECT pg_temp.error_of($$SELECT gatekeeper.grant('regress_g_enqueue', 'admin')$$) AS unknown_use;
SELECT pg_temp.error_of($$SELECT gatekeeper.grant('regress_g_enqueue', NULL)$$) AS null_use;
SELECT pg_temp.error_of($$SELECT gatekeeper.grant(NULL, 'enqueue')$$) AS null_role;
SELECT pg_temp.error_of($$SELECT gatekeeper.grant('regress_no_such_role', 'enqueue')$$) AS no_role;
SELECT count(*) AS remembered FROM gatekeeper.role_grant;

SELECT gatekeeper.grant('regress_g_enqueue', 'enqueue');
SELECT gatekeeper.grant('regress_g_worker', 'worker');
SELECT gatekeeper.grant('regress_g_monitor', 'monitor');
SELECT gatekeeper.grant('regress_g_monitor', 'monitor');  -- again: nothing changes
SELECT gatekeeper.grant('regress_g_gone', 'worker');
SELECT role, what FROM gatekeeper.role_grant ORDER BY role::text, what;

-- what each role may now do, by the catalog: the functions of its use and
-- nothing else of the API's writers
SELECT r AS role, f AS function, has_function_privilege(r, f, 'EXECUTE') AS may
  FROM unnest(ARRAY['regress_g_enqueue', 'regress_g_worker', 'regress_g_monitor']) AS r,
	   unnest(ARRAY['gatekeeper.enqueue(text, text, text, text, timestamptz, text, text, jsonb, text, int, timestamptz, text, jsonb, text, text, jsonb)',
					'gatekeeper.status(bigint)', 'gatekeeper.cancel(text, text)',
					'gatekeeper.claim(text, int, interval, text[])', 'gatekeeper.ack_batch(bigint[], int[])',
					'gatekeeper.next_due(text[])', 'gatekeeper._worker_status()',
					'gatekeeper.pause(text)', 'gatekeeper.unsubscribe(text)',
					'gatekeeper.suppress(text, text, text, text)', 'gatekeeper.unsuppress(text, text)',
					'gatekeeper.grant(regrole, text)', 'gatekeeper.reset_stats()', 'gatekeeper.cancel_queue(text)']) AS f
 ORDER BY 1, 2;

-- and by doing it (templated mail too, issue 48)
SELECT gatekeeper.create_template('g_tpl', 'Hi {{n}}', 'b');
SET ROLE regress_g_enqueue;
SELECT gatekeeper.enqueue('g1@grant.example', 'Hello', 'b', 'g_app') AS g1 \gset
INSERT INTO gatekeeper.mail (recipient, subject, body, queue) VALUES ('g2@grant.example', 'Hi', 'b', 'g_app');
INSERT INTO gatekeeper.mail (recipient, queue, template, template_version, data)
VALUES ('g5@grant.example', 'g_app', 'g_tpl', 1, '{"n": "G5"}');
SELECT gatekeeper.enqueue('g6@grant.example', NULL, NULL, 'g_app', template => 'g_tpl',
						  data => '{"n": "G6"}') IS NOT NULL AS templated;
SELECT state FROM gatekeeper.status(:g1);
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.mail$$) AS select_mail;
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.claim('w')$$) AS claim;
SELECT pg_temp.error_of($$SELECT gatekeeper.grant('regress_g_enqueue', 'worker')$$) AS grant_itself;
RESET ROLE;
-- what an application's endpoints need (issue 44, item 7): INSERT ...
-- RETURNING id (SELECT on the id column only: no content), the one-click
-- unsubscribe of a token, and suppress(), which only ever stops mail;
-- lifting a suppression stays the owner's
SELECT gatekeeper._unsubscribe_token('u1@grant.example', 'g_app') AS g_token \gset
SET ROLE regress_g_enqueue;
INSERT INTO gatekeeper.mail (recipient, subject, body, queue)
VALUES ('g3@grant.example', 'Returned', 'b', 'g_app') RETURNING id AS g3 \gset
SELECT state FROM gatekeeper.status(:g3);
SELECT pg_temp.error_of($$SELECT subject FROM gatekeeper.mail$$) AS select_subject;
SELECT gatekeeper.unsubscribe(:'g_token') AS unsubscribed;
SELECT gatekeeper.suppress('g4@grant.example', 'manual', detail => 'account closed') AS suppressed;
SELECT pg_temp.error_of($$SELECT gatekeeper.unsuppress('g4@grant.example')$$) AS unsuppress;
RESET ROLE;
SELECT address, reason, queue FROM gatekeeper.suppression
 WHERE address IN ('u1@grant.example', 'g4@grant.example') ORDER BY address;
SET ROLE regress_g_worker;
CREATE TEMP TABLE gw AS SELECT id, attempt, recipient, subject FROM gatekeeper.claim('w-grant', 10, queues => '{g_app}');
SELECT count(*) AS claimed FROM gw;
SELECT recipient, subject FROM gw WHERE recipient IN ('g5@grant.example', 'g6@grant.example') ORDER BY 1;
SELECT queue, claimed FROM gatekeeper.queue_stats WHERE queue = 'g_app';
SELECT gatekeeper.ack_batch(array_agg(id), array_agg(attempt)) AS acked FROM gw;
DROP TABLE gw;
SELECT pg_temp.error_of($$SELECT gatekeeper.enqueue('a@grant.example', 's', 'b')$$) AS enqueue;
RESET ROLE;
SET ROLE regress_g_monitor;
SELECT queue, scheduled, claimed FROM gatekeeper.queue_stats WHERE queue = 'g_app';
SELECT bytes_total > 0 AS has_limit FROM gatekeeper.gate_memory;
SELECT count(*) >= 0 AS reads_worker_status FROM gatekeeper.worker_status;
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.claim('w')$$) AS claim;
RESET ROLE;

-- a function the role lost (as one an update replaces or adds would be)
-- is given again by _grant_apply(), which every update script ends with
REVOKE EXECUTE ON FUNCTION gatekeeper.status(bigint) FROM regress_g_enqueue;
SELECT has_function_privilege('regress_g_enqueue', 'gatekeeper.status(bigint)', 'EXECUTE') AS before_apply;
SELECT gatekeeper._grant_apply();
SELECT has_function_privilege('regress_g_enqueue', 'gatekeeper.status(bigint)', 'EXECUTE') AS after_apply;

-- a dropped role is forgotten
DROP OWNED BY regress_g_gone;
DROP ROLE regress_g_gone;
SELECT gatekeeper._grant_apply();
SELECT role, what FROM gatekeeper.role_grant ORDER BY role::text, what;

-- neither grant() nor role_grant is for PUBLIC
SELECT has_function_privilege('public', 'gatekeeper.grant(regrole, text)', 'EXECUTE') AS public_grant,
	   has_table_privilege('public', 'gatekeeper.role_grant', 'SELECT') AS public_read;

-- clean up
DROP OWNED BY regress_g_enqueue, regress_g_worker, regress_g_monitor;
DROP ROLE regress_g_enqueue, regress_g_worker, regress_g_monitor;
DELETE FROM gatekeeper.role_grant;
