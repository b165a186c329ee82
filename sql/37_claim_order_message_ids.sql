-- A claim takes each queue's share by walking mail_due in C
-- (src/claim_take.c), not by its DELETE ... RETURNING statement.  What it
-- hands back must be what the statement's expressions gave: the generated
-- Message-ID (src/message_id.c's either way), the due mail in priority and
-- due order, expired mail finished as the statement marked it; and where
-- mail_live has a delete trigger of its own, the statement runs, the
-- trigger fires and the Message-IDs are the same.
SET client_min_messages = warning;
\set VERBOSITY terse
SELECT gatekeeper.create_queue('ct');
CREATE TEMP TABLE got (id bigint, attempt int, message_id text);

-- the Message-ID's domain: the sender's, with a display name, none
INSERT INTO gatekeeper.mail (queue, recipient, subject, body, sender) VALUES
	('ct', 'm1@example.com', 's', 'b', 'x@sender.example'),
	('ct', 'm2@example.com', 's', 'b', 'Named <y@named.example>'),
	('ct', 'm3@example.com', 's', 'b', NULL);
\set claim_into_got 'INSERT INTO got SELECT id, attempt, message_id FROM gatekeeper.claim(''w'', 10, queues => ARRAY[''ct''])'
:claim_into_got;
-- the default sender's, then gatekeeper.message_id_domain
ALTER SYSTEM SET gatekeeper.default_sender = 'Shop <shop@default.example>';
SELECT pg_reload_conf(), pg_sleep(0.2);
INSERT INTO gatekeeper.mail (queue, recipient, subject, body) VALUES ('ct', 'm4@example.com', 's', 'b');
:claim_into_got;
ALTER SYSTEM SET gatekeeper.message_id_domain = 'mid.example';
SELECT pg_reload_conf(), pg_sleep(0.2);
INSERT INTO gatekeeper.mail (queue, recipient, subject, body, sender) VALUES ('ct', 'm5@example.com', 's', 'b', 'x@sender.example');
:claim_into_got;
ALTER SYSTEM RESET gatekeeper.default_sender;
ALTER SYSTEM RESET gatekeeper.message_id_domain;
SELECT pg_reload_conf();

SELECT m.recipient, g.attempt,
       g.message_id = '<' || g.id || '.' ||
           substring(gatekeeper._message_id(g.id, NULL, 'x.example', '') FROM '\.([a-z2-7]{20})@') || '@' ||
           CASE m.recipient
               WHEN 'm1@example.com' THEN 'sender.example'
               WHEN 'm2@example.com' THEN 'named.example'
               WHEN 'm3@example.com' THEN 'gatekeeper.invalid'
               WHEN 'm4@example.com' THEN 'default.example'
               WHEN 'm5@example.com' THEN 'mid.example' END || '>' AS message_id_as_sql,
       c.message_id = g.message_id AS kept_in_claim
  FROM got g JOIN gatekeeper.mail m USING (id)
  JOIN LATERAL (SELECT (r).message_id FROM gatekeeper.mail_claim b, unnest(b.mails) r
                 WHERE (r).id = g.id) c ON true
 ORDER BY m.recipient;
SELECT gatekeeper.ack_batch(array_agg(id), array_agg(attempt)) AS acked FROM got;
TRUNCATE got;

-- three priority levels, each with due mail and mail due tomorrow: one
-- claim takes the due ones, highest priority first, then oldest first
INSERT INTO gatekeeper.mail (queue, recipient, subject, body, priority, send_at)
SELECT 'ct', 'p' || p || '_' || i || '@example.com', 's', 'b', p,
       now() - interval '1 hour' + i * interval '1 minute' + CASE WHEN i > 3 THEN interval '1 day' ELSE interval '0' END
  FROM generate_series(1, 5) i, unnest(ARRAY[-5, 0, 5]) p;
SELECT recipient, attempt, row_number() OVER () AS claim_order
  FROM gatekeeper.claim('w', 100, queues => ARRAY['ct']);
SELECT count(*) AS not_yet_due FROM gatekeeper.mail_status WHERE queue = 'ct' AND state = 'scheduled';
SELECT gatekeeper.cancel(id) FROM gatekeeper.mail_status WHERE queue = 'ct' AND state = 'scheduled';

-- mail past its send_by: finished as expired, its attempts not counted up
INSERT INTO gatekeeper.mail (queue, recipient, subject, body, send_at, send_by)
VALUES ('ct', 'late@example.com', 's', 'b', now() - interval '2 hours', now() - interval '1 hour')
RETURNING id AS late \gset
SELECT count(*) AS claimed FROM gatekeeper.claim('w', 10, queues => ARRAY['ct']);
SELECT state, attempt, last_error FROM gatekeeper.mail_done WHERE id = :late;

-- the content is looked up along its primary key from the last entry
-- read (fetch_content): mail due in rising id order with another queue's
-- mail between (one gap of more than 64 entries), then in falling id
-- order, and mail whose recipient changed after it was enqueued (a second
-- version of its content, a second entry under its id): each mail taken
-- once, its content as it reads now
SELECT gatekeeper.create_queue('ct_other');
CREATE TEMP TABLE seq AS
SELECT i, CASE WHEN i % 3 = 0 OR i BETWEEN 100 AND 200 THEN 'ct_other' ELSE 'ct' END AS queue
  FROM generate_series(1, 300) i;
INSERT INTO gatekeeper.mail (queue, recipient, subject, body, send_at)
SELECT queue, 'r' || i || '@example.com', 'r' || i, 'b', now() - interval '1 hour'
  FROM seq ORDER BY i;
INSERT INTO gatekeeper.mail (queue, recipient, subject, body, send_at)
SELECT queue, 'f' || i || '@example.com', 'f' || i, 'b', now() - interval '2 hours' + i * interval '1 second'
  FROM seq ORDER BY i DESC;
UPDATE gatekeeper.mail SET recipient = 'moved-' || recipient
 WHERE queue = 'ct' AND subject IN ('r4', 'r50', 'r250', 'f4', 'f50', 'f250');
CREATE TEMP TABLE took AS
SELECT c.*, row_number() OVER () AS n FROM gatekeeper.claim('w', 1000, queues => ARRAY['ct']) c;
SELECT count(*) AS claimed, count(DISTINCT id) AS distinct_mails,
       bool_and(recipient = CASE WHEN subject IN ('r4', 'r50', 'r250', 'f4', 'f50', 'f250')
                                 THEN 'moved-' ELSE '' END || subject || '@example.com') AS content_as_now,
       array_agg(subject ORDER BY n) =
           (SELECT array_agg('f' || i ORDER BY i) FROM seq WHERE queue = 'ct') ||
           (SELECT array_agg('r' || i ORDER BY i) FROM seq WHERE queue = 'ct') AS due_order,
       bool_and(id > lag_id) FILTER (WHERE subject LIKE 'r%') AS r_ids_rise,
       bool_and(id < lag_id) FILTER (WHERE subject LIKE 'f%') AS f_ids_fall
  FROM (SELECT *, lag(id) OVER (PARTITION BY left(subject, 1) ORDER BY n) AS lag_id FROM took) t;
SELECT gatekeeper.ack_batch(array_agg(id), array_agg(attempt)) AS acked FROM took;
SELECT count(gatekeeper.cancel(id)) AS cancelled FROM gatekeeper.mail_status WHERE queue = 'ct_other' AND state = 'scheduled';

-- a delete trigger of the user's own on mail_live: the statement runs,
-- and the trigger sees every row the claim takes
CREATE TABLE ct_deleted (id bigint);
CREATE FUNCTION ct_note_delete() RETURNS trigger LANGUAGE plpgsql AS
$$BEGIN INSERT INTO public.ct_deleted VALUES (OLD.id); RETURN OLD; END$$;
CREATE TRIGGER ct_note AFTER DELETE ON gatekeeper.mail_live
	FOR EACH ROW EXECUTE FUNCTION ct_note_delete();
INSERT INTO gatekeeper.mail (queue, recipient, subject, body)
SELECT 'ct', 't' || i || '@example.com', 's', 'b' FROM generate_series(1, 4) i;
SELECT count(*) AS claimed,
       bool_and(message_id = gatekeeper._message_id(id, NULL, '', '')) AS message_ids_as_walked
  FROM gatekeeper.claim('w', 10, queues => ARRAY['ct']);
SELECT count(*) AS trigger_saw FROM ct_deleted;
DROP TRIGGER ct_note ON gatekeeper.mail_live;
DROP FUNCTION ct_note_delete();
DROP TABLE ct_deleted;

-- a read-only transaction may not claim: the statement's error, 25006
BEGIN TRANSACTION READ ONLY;
\set VERBOSITY sqlstate
\set SHOW_CONTEXT never
SELECT count(*) FROM gatekeeper.claim('w', 10, queues => ARRAY['ct']);
\set VERBOSITY terse
ROLLBACK;
