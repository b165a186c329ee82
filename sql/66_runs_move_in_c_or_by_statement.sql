-- A run's mails become live rows (src/mail/mail_runs.c) before a cancel,
-- an owner's UPDATE or DELETE of one of them, or cancel_queue: in C,
-- calling no SQL function, and, while a trigger of the user's sits on
-- mail_run's deletes or mail_live's inserts, by the statements, which fire
-- it.  Both paths leave the same states, live rows and live counts; so
-- do the live rows of new mail, written by the statement while such a
-- trigger is on mail_live.
SET client_min_messages = warning;
\set VERBOSITY terse
SELECT gatekeeper.create_queue('r66');
CREATE TEMP TABLE fired (tab text, op text);
CREATE FUNCTION pg_temp.noted() RETURNS trigger LANGUAGE plpgsql AS
$$BEGIN INSERT INTO fired VALUES (TG_TABLE_NAME, TG_OP); RETURN NULL; END$$;

-- the gatekeeper functions called in this transaction (track_functions =
-- all) but cancel, the triggers, and the restore triggers' question
-- (_own_statement, asked per row by a statement's inserts)
CREATE VIEW pg_temp.called AS
SELECT p.proname, pg_stat_get_xact_function_calls(p.oid) AS calls
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = 'gatekeeper' AND p.prorettype <> 'trigger'::regtype
   AND p.proname NOT IN ('cancel', 'cancel_queue', '_own_statement')
   AND pg_stat_get_xact_function_calls(p.oid) > 0;

-- 1. the direct path
BEGIN;
INSERT INTO gatekeeper.mail (queue, recipient, subject, body)
SELECT 'r66', 'a' || i || '@example.com', 's', 'b' FROM generate_series(1, 300) i;
SELECT min(id) AS a FROM gatekeeper.mail WHERE queue = 'r66' \gset
SELECT count(*) AS runs FROM gatekeeper.mail_run WHERE queue = 'r66';
SET LOCAL track_functions = 'all';
SELECT gatekeeper.cancel(:a + 10) AS cancelled;
UPDATE gatekeeper.mail SET send_at = now() + interval '1 day' WHERE id = :a + 140;
DELETE FROM gatekeeper.mail WHERE id = :a + 270;
SELECT proname, calls FROM pg_temp.called ORDER BY proname;
COMMIT;
SELECT count(*) AS runs, sum(last_id - id + 1) AS mails_in_runs
  FROM gatekeeper.mail_run WHERE queue = 'r66';
SELECT count(*) AS live_rows FROM gatekeeper.mail_live WHERE queue = 'r66';
SELECT s.id - :a AS rel, s.state, s.send_at > now() AS later
  FROM gatekeeper.mail_status s
 WHERE s.queue = 'r66' AND s.id - :a IN (9, 10, 11, 139, 140, 141, 269, 270, 271)
 ORDER BY 1;
SELECT scheduled, due FROM gatekeeper.queue_stats WHERE queue = 'r66';
-- cancel_queue moves a queue's runs: 300 more mails in runs first
INSERT INTO gatekeeper.mail (queue, recipient, subject, body)
SELECT 'r66', 'c' || i || '@example.com', 's', 'b' FROM generate_series(1, 300) i;
SELECT count(*) AS runs FROM gatekeeper.mail_run WHERE queue = 'r66';
SELECT gatekeeper.cancel_queue('r66') AS cancelled;
SELECT count(*) AS runs FROM gatekeeper.mail_run WHERE queue = 'r66';
SELECT scheduled, due FROM gatekeeper.queue_stats WHERE queue = 'r66';
SELECT state, count(*) FROM gatekeeper.mail_status WHERE queue = 'r66' GROUP BY state ORDER BY state;
SELECT gatekeeper.recount_live() = (SELECT sum(scheduled) FROM gatekeeper.queue_stats) AS counts_held;

-- 2. the statements: the runs written first, then a trigger of the
-- user's on mail_run's deletes and one on mail_live's inserts
DELETE FROM gatekeeper.mail WHERE queue = 'r66';
BEGIN;
INSERT INTO gatekeeper.mail (queue, recipient, subject, body)
SELECT 'r66', 'b' || i || '@example.com', 's', 'b' FROM generate_series(1, 300) i;
SELECT min(id) AS a FROM gatekeeper.mail WHERE queue = 'r66' \gset
SELECT count(*) AS runs FROM gatekeeper.mail_run WHERE queue = 'r66';
CREATE TRIGGER noted_run AFTER DELETE ON gatekeeper.mail_run
	FOR EACH STATEMENT EXECUTE FUNCTION pg_temp.noted();
CREATE TRIGGER noted_live AFTER INSERT ON gatekeeper.mail_live
	FOR EACH STATEMENT EXECUTE FUNCTION pg_temp.noted();
SET LOCAL track_functions = 'all';
SELECT gatekeeper.cancel(:a + 10) AS cancelled;
UPDATE gatekeeper.mail SET send_at = now() + interval '1 day' WHERE id = :a + 140;
DELETE FROM gatekeeper.mail WHERE id = :a + 270;
SELECT proname, calls FROM pg_temp.called ORDER BY proname;
COMMIT;
SELECT tab, op, count(*) FROM fired GROUP BY tab, op ORDER BY tab, op;
SELECT count(*) AS runs, sum(last_id - id + 1) AS mails_in_runs
  FROM gatekeeper.mail_run WHERE queue = 'r66';
SELECT count(*) AS live_rows FROM gatekeeper.mail_live WHERE queue = 'r66';
SELECT s.id - :a AS rel, s.state, s.send_at > now() AS later
  FROM gatekeeper.mail_status s
 WHERE s.queue = 'r66' AND s.id - :a IN (9, 10, 11, 139, 140, 141, 269, 270, 271)
 ORDER BY 1;
SELECT scheduled, due FROM gatekeeper.queue_stats WHERE queue = 'r66';
-- cancel_queue moves a queue's runs: 300 more mails in runs first (the
-- insert trigger, seeing the user's trigger on mail_live, writes live
-- rows: the runs are made with the triggers away)
ALTER TABLE gatekeeper.mail_live DISABLE TRIGGER noted_live;
INSERT INTO gatekeeper.mail (queue, recipient, subject, body)
SELECT 'r66', 'd' || i || '@example.com', 's', 'b' FROM generate_series(1, 300) i;
ALTER TABLE gatekeeper.mail_live ENABLE TRIGGER noted_live;
SELECT count(*) AS runs FROM gatekeeper.mail_run WHERE queue = 'r66';
TRUNCATE fired;
SELECT gatekeeper.cancel_queue('r66') AS cancelled;
SELECT tab, op, count(*) FROM fired GROUP BY tab, op ORDER BY tab, op;
SELECT count(*) AS runs FROM gatekeeper.mail_run WHERE queue = 'r66';
SELECT scheduled, due FROM gatekeeper.queue_stats WHERE queue = 'r66';
SELECT state, count(*) FROM gatekeeper.mail_status WHERE queue = 'r66' GROUP BY state ORDER BY state;
SELECT gatekeeper.recount_live() = (SELECT sum(scheduled) FROM gatekeeper.queue_stats) AS counts_held;

-- new mail while the user's trigger is on mail_live: its live rows by
-- the statement, which fires it, and no runs
TRUNCATE fired;
INSERT INTO gatekeeper.mail (queue, recipient, subject, body)
SELECT 'r66', 'e' || i || '@example.com', 's', 'b' FROM generate_series(1, 300) i;
SELECT tab, op, count(*) FROM fired GROUP BY tab, op ORDER BY tab, op;
SELECT count(*) AS runs FROM gatekeeper.mail_run WHERE queue = 'r66';
SELECT count(*) AS live_rows FROM gatekeeper.mail_live WHERE queue = 'r66';
SELECT scheduled FROM gatekeeper.queue_stats WHERE queue = 'r66';
SELECT gatekeeper.recount_live() = (SELECT sum(scheduled) FROM gatekeeper.queue_stats) AS counts_held;

DROP TRIGGER noted_run ON gatekeeper.mail_run;
DROP TRIGGER noted_live ON gatekeeper.mail_live;
DELETE FROM gatekeeper.mail WHERE queue = 'r66';
SELECT gatekeeper.drop_queue('r66');
