-- The restore triggers (rows loaded through the partitioned tables): outcomes
-- inserted into gatekeeper.mail_done remove the live rows of their mail,
-- all of a statement's rows at once (a statement-level trigger), and a
-- live row inserted into mail_live replaces the fresh one.
SET client_min_messages = warning;
\set VERBOSITY terse

SELECT gatekeeper.create_queue('rr_q');
SELECT count(gatekeeper.enqueue('rr' || i || '@example.com', 's', 'b', 'rr_q')) AS enqueued
  FROM generate_series(1, 3) AS i;
SELECT min(id) AS first, max(id) AS last FROM gatekeeper.mail WHERE queue = 'rr_q' \gset
SELECT count(*) AS live_before FROM gatekeeper.mail_live WHERE queue = 'rr_q';

-- two outcomes in one statement, as a restore loads them
INSERT INTO gatekeeper.mail_done (id, queue, state, attempt, send_at, finished_at, segment)
SELECT m.id, m.queue, 'sent', 1, m.send_at, now(), m.segment
  FROM gatekeeper.mail m WHERE m.queue = 'rr_q' AND m.id < :last;
SELECT l.id - :first AS live_left, l.state FROM gatekeeper.mail_live l WHERE l.queue = 'rr_q';

-- a restored live row replaces the fresh one
INSERT INTO gatekeeper.mail_live (id, queue, priority, send_at, state, attempt, segment)
SELECT m.id, m.queue, 0, m.send_at, 'scheduled', 2, m.segment
  FROM gatekeeper.mail m WHERE m.id = :last;
SELECT l.id - :first AS live, l.state, l.attempt FROM gatekeeper.mail_live l WHERE l.queue = 'rr_q';

SELECT m.id - :first AS id, s.state FROM gatekeeper.mail m, gatekeeper.status(m.id) s
 WHERE m.queue = 'rr_q' ORDER BY m.id;

SELECT gatekeeper.cancel_queue('rr_q') AS cancelled;

-- The outcome restore trigger stays out of gatekeeper's own statements
-- (claim, ack_batch), which move the live rows themselves: its function
-- is called for an outcome inserted by a statement of the owner, not for
-- an ack.
SET track_functions = 'all';
SELECT count(gatekeeper.enqueue('rr' || i || '@example.com', 's', 'b', 'rr_q')) AS enqueued
  FROM generate_series(4, 5) AS i;
SELECT pg_stat_force_next_flush();
SELECT coalesce((SELECT calls FROM pg_stat_user_functions
				  WHERE funcid = 'gatekeeper._mail_live_restore'::regproc), 0) AS calls_before \gset
SELECT gatekeeper.ack_batch(array_agg(c.id), array_agg(c.attempt)) AS acked
  FROM gatekeeper.claim('rr_worker', 1, queues => ARRAY['rr_q']) c;
SELECT pg_stat_force_next_flush();
SELECT coalesce((SELECT calls FROM pg_stat_user_functions
				  WHERE funcid = 'gatekeeper._mail_live_restore'::regproc), 0) - :calls_before
	   AS calls_after_ack;
INSERT INTO gatekeeper.mail_done (id, queue, state, attempt, send_at, finished_at, segment)
SELECT l.id, l.queue, 'sent', 1, l.send_at, now(), l.segment
  FROM gatekeeper.mail_live l WHERE l.queue = 'rr_q';
SELECT pg_stat_force_next_flush();
SELECT coalesce((SELECT calls FROM pg_stat_user_functions
				  WHERE funcid = 'gatekeeper._mail_live_restore'::regproc), 0) - :calls_before
	   AS calls_after_insert,
	   (SELECT count(*) FROM gatekeeper.mail_live WHERE queue = 'rr_q') AS live_left;
RESET track_functions;

-- Loading a dump through gatekeeper.mail (pg_dump --load-via-partition-root:
-- check_function_bodies off, by a role that may write mail_live): the rows
-- load as they were, with no live row (the dump brings its own).  A role
-- that may only enqueue gets its rows checked whatever it sets.
CREATE ROLE rr_app;
GRANT USAGE ON SCHEMA gatekeeper TO rr_app;
GRANT INSERT ON gatekeeper.mail TO rr_app;
GRANT EXECUTE ON FUNCTION gatekeeper._segment() TO rr_app;
SET ROLE rr_app;
SET check_function_bodies = off;
INSERT INTO gatekeeper.mail (recipient, subject, body, queue)
VALUES ('rr-app@example.com', 's', 'b', 'rr_no_such_queue');
RESET check_function_bodies;
RESET ROLE;
SET check_function_bodies = off;
INSERT INTO gatekeeper.mail (recipient, subject, body, queue)
VALUES ('rr-dump@example.com', 's', 'b', 'rr_no_such_queue');
-- not a statement of the dump: enqueue() in the same session, as usual
SELECT gatekeeper.enqueue('rr-enqueued@example.com', 's', 'b', 'rr_q') > 0 AS enqueued;
SELECT gatekeeper.enqueue('rr-enqueued@example.com', 's', 'b', 'rr_no_such_queue');
RESET check_function_bodies;
SELECT m.recipient, m.queue,
	   (SELECT count(*) FROM gatekeeper.mail_live l WHERE l.id = m.id) AS live
  FROM gatekeeper.mail m WHERE m.recipient LIKE 'rr-%' ORDER BY 1;
DELETE FROM gatekeeper.mail WHERE recipient LIKE 'rr-%';
REVOKE ALL ON gatekeeper.mail FROM rr_app;
REVOKE ALL ON FUNCTION gatekeeper._segment() FROM rr_app;
REVOKE ALL ON SCHEMA gatekeeper FROM rr_app;
DROP ROLE rr_app;

-- The segment new mail goes to: mail.segment's default reads the
-- read-only setting gatekeeper.current_segment (falling back to
-- _segment()), which follows gatekeeper.segment as a rotation changes it.
SELECT current_setting('gatekeeper.current_segment')::smallint = s.current AS setting_is_current,
       gatekeeper._segment() = s.current AS function_is_current
  FROM gatekeeper.segment s;
SET gatekeeper.current_segment = 3;
BEGIN;
UPDATE gatekeeper.segment SET current = (current + 1) % 4;
INSERT INTO gatekeeper.mail (recipient, subject, body, queue) VALUES ('seg@example.com', 's', 'b', 'rr_q');
COPY gatekeeper.mail (recipient, subject, body, queue) FROM STDIN (FORMAT csv);
seg2@example.com,s,b,rr_q
\.
SELECT m.recipient, m.segment = s.current AS in_current, l.segment = s.current AS live_in_current
  FROM gatekeeper.mail m JOIN gatekeeper.mail_live l ON l.id = m.id, gatekeeper.segment s
 WHERE m.recipient LIKE 'seg%' ORDER BY 1;
ROLLBACK;
SELECT gatekeeper.drop_queue('rr_q');
