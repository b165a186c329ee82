-- Runs (gatekeeper.mail_run, src/live_writer.c): the mails of one INSERT
-- or COPY with consecutive ids, one queue, priority and send_at and no
-- dedupe key are one row of mail_run for up to 128 of them.  Each is
-- scheduled, claimed once, in (priority, send_at, id) order among the
-- live rows, and can be cancelled, updated and deleted like any mail;
-- queue_stats, mail_status and next_due count it.
SET client_min_messages = warning;
SELECT gatekeeper.create_queue('rn');

INSERT INTO gatekeeper.mail (queue, recipient, subject, body)
SELECT 'rn', 'r' || i || '@example.com', 's' || i, 'b' FROM generate_series(1, 300) i;
SELECT min(id) AS first_id FROM gatekeeper.mail WHERE queue = 'rn' \gset
SELECT count(*) AS runs, sum(last_id - id + 1) AS mails,
	   max(last_id - id + 1) AS longest
  FROM gatekeeper.mail_run WHERE queue = 'rn';
SELECT count(*) AS live_rows FROM gatekeeper.mail_live WHERE queue = 'rn';
SELECT scheduled, due, claimed FROM gatekeeper.queue_stats WHERE queue = 'rn';
SELECT state, count(*) FROM gatekeeper.mail_status WHERE queue = 'rn' GROUP BY state;
SELECT gatekeeper.next_due(ARRAY['rn']) = (SELECT min(send_at) FROM gatekeeper.mail WHERE queue = 'rn')
	AS next_due_is_the_runs;

-- one mail at a higher priority (a live row): claimed first; then the
-- runs' mails in id order, each once
INSERT INTO gatekeeper.mail (queue, recipient, subject, body, priority)
VALUES ('rn', 'urgent@example.com', 'urgent', 'b', 5);
CREATE TEMP TABLE took AS
SELECT n, c.id - :first_id AS rel, c.recipient, c.attempt
  FROM gatekeeper.claim('w', 10, queues => ARRAY['rn']) WITH ORDINALITY AS c(id, attempt, queue,
		recipient, recipient_name, sender, subject, body, html, headers, message_id, metadata, n);
SELECT n, rel, recipient, attempt FROM took ORDER BY n;
SELECT id - :first_id AS rel_id, last_id - :first_id AS rel_last
  FROM gatekeeper.mail_run WHERE queue = 'rn' ORDER BY id;
SELECT scheduled, due, claimed FROM gatekeeper.queue_stats WHERE queue = 'rn';

-- a mail inside a run: cancelled (its run's mails become live rows)
SELECT gatekeeper.cancel(:first_id + 150) AS cancelled;
SELECT gatekeeper.cancel(:first_id + 150) AS cancelled_again;
SELECT count(*) AS runs FROM gatekeeper.mail_run WHERE queue = 'rn';
SELECT state FROM gatekeeper.mail_status WHERE id = :first_id + 150;
-- updated (moved to tomorrow) and deleted, each from another run
UPDATE gatekeeper.mail SET send_at = now() + interval '1 day' WHERE id = :first_id + 20;
DELETE FROM gatekeeper.mail WHERE id = :first_id + 290;
SELECT count(*) AS runs FROM gatekeeper.mail_run WHERE queue = 'rn';
SELECT scheduled, due, claimed FROM gatekeeper.queue_stats WHERE queue = 'rn';
SELECT gatekeeper.recount_live() = (SELECT sum(scheduled) FROM gatekeeper.queue_stats) AS recounted;
SELECT scheduled, due FROM gatekeeper.queue_stats WHERE queue = 'rn';

-- the rest: every scheduled mail claimed once, the one moved to tomorrow not
INSERT INTO took
SELECT 100 + n, c.id - :first_id, c.recipient, c.attempt
  FROM gatekeeper.claim('w', 1000, queues => ARRAY['rn']) WITH ORDINALITY AS c(id, attempt, queue,
		recipient, recipient_name, sender, subject, body, html, headers, message_id, metadata, n);
SELECT count(*) AS claimed, count(DISTINCT rel) AS distinct_mails,
	   bool_or(rel = 20) AS took_tomorrows, bool_or(rel IN (150, 290)) AS took_gone
  FROM took;
SELECT scheduled, due, claimed FROM gatekeeper.queue_stats WHERE queue = 'rn';
SELECT count(*) AS runs_left FROM gatekeeper.mail_run WHERE queue = 'rn';

-- a statement of fewer than 256 mails writes live rows, not runs
INSERT INTO gatekeeper.mail (queue, recipient, subject, body)
SELECT 'rn', 'f' || i || '@example.com', 's', 'b' FROM generate_series(1, 255) i;
SELECT count(*) AS runs FROM gatekeeper.mail_run WHERE queue = 'rn';
SELECT gatekeeper.cancel_queue('rn') AS cancelled;

-- ids given by hand at or below one a scheduled mail holds go to
-- mail_live, never into a run: a duplicate still meets its primary key
INSERT INTO gatekeeper.mail (id, queue, recipient, subject, body)
SELECT 900000 + i, 'rn', 'h' || i || '@example.com', 's', 'b' FROM generate_series(1, 300) i;
SELECT count(*) AS runs FROM gatekeeper.mail_run WHERE queue = 'rn';
INSERT INTO gatekeeper.mail (id, queue, recipient, subject, body)
SELECT 800000 + i, 'rn', 'l' || i || '@example.com', 's', 'b' FROM generate_series(1, 300) i;
SELECT count(*) AS runs, count(*) FILTER (WHERE id > 850000) AS runs_of_the_first
  FROM gatekeeper.mail_run WHERE queue = 'rn';
SELECT count(*) AS live_rows_of_the_second
  FROM gatekeeper.mail_live WHERE queue = 'rn' AND id BETWEEN 800001 AND 800300;

-- a queue with mail in runs is not dropped
SELECT gatekeeper.cancel(:first_id + 20);
\set VERBOSITY terse
SELECT gatekeeper.drop_queue('rn');
\set VERBOSITY default
SELECT gatekeeper.cancel_queue('rn') AS cancelled;
SELECT count(*) AS runs_left FROM gatekeeper.mail_run WHERE queue = 'rn';
SELECT scheduled, due, claimed FROM gatekeeper.queue_stats WHERE queue = 'rn';
SELECT gatekeeper.ack_batch(array_agg(c.id + :first_id - :first_id), array_agg(c.attempt)) IS NOT NULL AS settled
  FROM (SELECT rel + :first_id AS id, attempt FROM took) c;
SELECT gatekeeper.drop_queue('rn');

-- outcomes loaded before their content (a restore's order), met in the
-- middle of a bulk statement: the rows above every finished id go into
-- runs; the statement's finished ids are looked up at its first row at or
-- below one, and those mails get no live row and no run
SELECT gatekeeper.create_queue('rn2');
INSERT INTO gatekeeper.mail_done (id, queue, state, attempt, send_at, finished_at, segment)
SELECT 700100 + i, 'rn2', 'sent', 1, now(), now(), gatekeeper._segment()
  FROM generate_series(1, 10) i;
INSERT INTO gatekeeper.mail (id, queue, recipient, subject, body)
SELECT 700000 + i, 'rn2', 'o' || i || '@example.com', 's', 'b'
  FROM generate_series(1, 300) i ORDER BY i <= 199, i;
SELECT state, count(*) FROM gatekeeper.mail_status WHERE queue = 'rn2' GROUP BY state ORDER BY state;
SELECT count(*) AS runs_over_finished FROM gatekeeper.mail_run
 WHERE queue = 'rn2' AND id <= 700110 AND last_id >= 700101;
SELECT count(*) AS live_rows_of_finished FROM gatekeeper.mail_live WHERE id BETWEEN 700101 AND 700110;
SELECT count(*) AS runs FROM gatekeeper.mail_run WHERE queue = 'rn2';
SELECT scheduled FROM gatekeeper.queue_stats WHERE queue = 'rn2';
SELECT gatekeeper.cancel_queue('rn2') AS cancelled;
RESET client_min_messages;
