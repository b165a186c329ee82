-- The restore triggers (pg_dump --load-via-partition-root): outcomes
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
