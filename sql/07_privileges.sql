-- Privileges: nothing for PUBLIC; an enqueue-only application role, a
-- worker role and a monitoring role get exactly what they need, with the
-- README's recipes (gatekeeper.grant(); 23_grant tests grant() itself).
SET client_min_messages = warning;
\set VERBOSITY terse

\i sql/error_of.inc

SELECT gatekeeper.create_queue('p_app');

CREATE ROLE regress_app_enqueue NOLOGIN;
CREATE ROLE regress_app_worker NOLOGIN;
CREATE ROLE regress_nobody NOLOGIN;
CREATE ROLE regress_monitor NOLOGIN;

-- the README's recipes: one grant() each
SELECT gatekeeper.grant('regress_app_enqueue', 'enqueue');
SELECT gatekeeper.grant('regress_app_worker', 'worker');
SELECT gatekeeper.grant('regress_monitor', 'monitor');
GRANT pg_monitor TO regress_monitor;

--
-- the enqueue-only role
--
SET ROLE regress_app_enqueue;
SELECT gatekeeper.enqueue('p1@priv.example', 'Hello', 'b', 'p_app') IS NOT NULL AS enqueued;
SELECT gatekeeper.enqueue('p2@priv.example', 'Hello', 'b', 'p_app', dedupe_key => 'k') AS k1 \gset
SELECT gatekeeper.enqueue('p2@priv.example', 'Hello', 'b', 'p_app', dedupe_key => 'k') = :k1 AS deduped;
INSERT INTO gatekeeper.mail (recipient, subject, body, queue, send_at, priority)
SELECT format('bulk%s@priv.example', i), 'Bulk', 'b', 'p_app', now(), 1 FROM generate_series(1, 10) AS i;
COPY gatekeeper.mail (recipient, subject, body, queue) FROM stdin;
copy1@priv.example	Copied	b	p_app
copy2@priv.example	Copied	b	p_app
\.
-- validation holds for this role too
SELECT pg_temp.error_of($$INSERT INTO gatekeeper.mail (recipient, subject, body, queue) VALUES ('bad', 's', 'b', 'p_app')$$) AS invalid_address;
SELECT pg_temp.error_of($$INSERT INTO gatekeeper.mail (recipient, subject, body, queue) VALUES ('a@priv.example', 's', 'b', 'p_typo')$$) AS unknown_queue;
-- but not the columns that belong to gatekeeper, nor reading mail
SELECT pg_temp.error_of($$INSERT INTO gatekeeper.mail_live (id, queue, send_at, state) VALUES (1, 'p_app', now(), 'sent')$$) AS insert_state;
SELECT pg_temp.error_of($$INSERT INTO gatekeeper.mail (id, recipient, subject, body, queue) VALUES (1, 'a@priv.example', 's', 'b', 'p_app')$$) AS insert_id;
-- (RETURNING id is allowed: SELECT on the id column alone, issue 44 item 7)
SELECT pg_temp.error_of($$INSERT INTO gatekeeper.mail (recipient, subject, body, queue) VALUES ('a@priv.example', 's', 'b', 'p_app') RETURNING id$$) AS insert_returning;
SELECT pg_temp.error_of($$INSERT INTO gatekeeper.mail (recipient, subject, body, queue) VALUES ('a@priv.example', 's', 'b', 'p_app') RETURNING subject$$) AS returning_content;
SELECT pg_temp.error_of($$SELECT recipient FROM gatekeeper.mail$$) AS select_mail;
SELECT pg_temp.error_of($$UPDATE gatekeeper.mail SET subject = 'x'$$) AS update_mail;
SELECT pg_temp.error_of($$DELETE FROM gatekeeper.mail$$) AS delete_mail;
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.claim('w')$$) AS claim;
SELECT pg_temp.error_of($$SELECT gatekeeper.ack(1, 1)$$) AS ack;
SELECT pg_temp.error_of($$SELECT gatekeeper.ack_batch('{1}', '{1}')$$) AS ack_batch;
SELECT pg_temp.error_of($$SELECT gatekeeper.nack_batch('{1}', '{1}', '{e}')$$) AS nack_batch;
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.queue_stats$$) AS queue_stats;
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.queue$$) AS select_queue;
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.gate_log$$) AS select_gate_log;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('p_mine')$$) AS create_queue;
SELECT pg_temp.error_of($$SELECT gatekeeper.gate_pass('smart_sending', 'a@priv.example')$$) AS gate_pass;
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.explain('a@priv.example')$$) AS explain;
-- it looks up and cancels its own mail, by id or by its key, through
-- functions that do not need SELECT on gatekeeper.mail
SELECT gatekeeper.enqueue('p3@priv.example', 'Hello', 'b', 'p_app', dedupe_key => 'k3') AS k3 \gset
SELECT gatekeeper.find('p_app', 'k') = :k1 AS found;
SELECT queue, state, attempt FROM gatekeeper.status(:k1);
SELECT count(*) AS history FROM gatekeeper.history('p2@priv.example');
SELECT gatekeeper.cancel('p_app', 'k3') AS cancelled_by_key;
SELECT gatekeeper.cancel('p_app', 'k3') AS cancelled_again;
SELECT state FROM gatekeeper.status(:k3);
SELECT gatekeeper.enqueue('p4@priv.example', 'Hello', 'b', 'p_app') AS k4 \gset
SELECT gatekeeper.cancel(:k4) AS cancelled_by_id;
RESET ROLE;
SELECT state, count(*) FROM gatekeeper.mail_status WHERE queue = 'p_app' GROUP BY state ORDER BY state;

--
-- the worker role
--
SET ROLE regress_app_worker;
CREATE TEMP TABLE w AS SELECT id, attempt, recipient FROM gatekeeper.claim('w-priv', 100, queues => ARRAY['p_app']);
SELECT count(*) AS claimed FROM w;
SELECT gatekeeper.extend(min(id), 1, '10 minutes') AS extended FROM w;
SELECT gatekeeper.nack(min(id), 1, '421 later') AS nacked FROM w;
SELECT gatekeeper.ack(max(id), 1) AS acked FROM w;
SELECT gatekeeper.ack_batch(array_agg(id), array_agg(attempt)) AS acked_batch FROM w
 WHERE id NOT IN ((SELECT min(id) FROM w), (SELECT max(id) FROM w));
SELECT gatekeeper.nack_batch('{}', '{}', '{}') AS nacked_none;
SELECT gatekeeper.reap() AS reaped;
SELECT gatekeeper.unclaim('{}'::bigint[], '{}'::int[], 'none') AS unclaimed;
SELECT queue, scheduled, claimed, sent FROM gatekeeper.queue_stats WHERE queue = 'p_app';
SELECT pg_temp.error_of($$SELECT count(*) FROM gatekeeper.mail$$) AS select_mail;
SELECT pg_temp.error_of($$SELECT recipient FROM gatekeeper.mail$$) AS select_recipients;
SELECT pg_temp.error_of($$UPDATE gatekeeper.mail_live SET state = 'sent'$$) AS update_mail;
SELECT pg_temp.error_of($$SELECT gatekeeper.enqueue('a@priv.example', 's', 'b', 'p_app')$$) AS enqueue;
SELECT pg_temp.error_of($$SELECT gatekeeper.cancel_queue('p_app')$$) AS cancel_queue;
SELECT pg_temp.error_of($$SELECT gatekeeper.pause('p_app')$$) AS pause;
SELECT pg_temp.error_of($$SELECT gatekeeper.purge()$$) AS purge;
SELECT pg_temp.error_of($$SELECT gatekeeper.reset_stats()$$) AS reset_stats;
DROP TABLE w;
RESET ROLE;

--
-- the monitoring role reads the figures, and nothing else
--
SET ROLE regress_monitor;
SELECT queue, scheduled FROM gatekeeper.queue_stats WHERE queue = 'p_app';
SELECT bytes_total > 0 AS has_limit FROM gatekeeper.gate_memory;
SELECT count(*) >= 0 AS reads_worker_status FROM gatekeeper.worker_status;
SELECT pg_temp.error_of($$SELECT count(*) FROM gatekeeper.mail$$) AS select_mail;
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.claim('w')$$) AS claim;
SELECT pg_temp.error_of($$SELECT gatekeeper.enqueue('a@priv.example', 's', 'b')$$) AS enqueue;
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.status(1)$$) AS status;
SELECT pg_temp.error_of($$SELECT gatekeeper.cancel('p_app', 'k')$$) AS cancel_by_key;
-- reset_stats() only once granted (the README's optional GRANT); it zeroes the totals
SELECT pg_temp.error_of($$SELECT gatekeeper.reset_stats()$$) AS reset_stats;
RESET ROLE;
GRANT EXECUTE ON FUNCTION gatekeeper.reset_stats() TO regress_monitor;
SET ROLE regress_monitor;
SELECT enqueued > 0 AND sent > 0 AS has_totals FROM gatekeeper.queue_stats WHERE queue = 'p_app';
SELECT gatekeeper.reset_stats();
SELECT queue, scheduled, enqueued, sent, failed FROM gatekeeper.queue_stats WHERE queue = 'p_app';
RESET ROLE;

--
-- a role granted nothing can do nothing
--
SET ROLE regress_nobody;
SELECT pg_temp.error_of($$SELECT gatekeeper.enqueue('a@priv.example', 's', 'b')$$) AS enqueue;
SELECT pg_temp.error_of($$INSERT INTO gatekeeper.mail (recipient, subject, body) VALUES ('a@priv.example', 's', 'b')$$) AS insert;
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.claim('w')$$) AS claim;
SELECT pg_temp.error_of($$SELECT gatekeeper.gate_open('smart_sending', 'a@priv.example')$$) AS gate_open;
SELECT pg_temp.error_of($$SELECT count(*) FROM gatekeeper.worker_status$$) AS worker_status;
SELECT pg_temp.error_of($$SELECT gatekeeper.reset_stats()$$) AS reset_stats;
RESET ROLE;

-- the state after all this
SELECT state, count(*) FROM gatekeeper.mail_status WHERE queue = 'p_app' GROUP BY state ORDER BY state;

-- clean up
SELECT gatekeeper.cancel_queue('p_app') AS cancelled;
DROP OWNED BY regress_app_enqueue, regress_app_worker, regress_nobody, regress_monitor;
DROP ROLE regress_app_enqueue, regress_app_worker, regress_nobody, regress_monitor;
DELETE FROM gatekeeper.role_grant;
SELECT count(*) AS acl_entries_left
  FROM pg_class c, aclexplode(c.relacl) a
 WHERE c.relnamespace = 'gatekeeper'::regnamespace AND a.grantee <> c.relowner;
