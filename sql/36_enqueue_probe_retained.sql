-- Every enqueueing statement asks whether finished mail holds ids at or
-- above its new ones (a restore loads finished mail first, src/mail.c).
-- That question must cost one probe of mail_done's primary key however
-- much finished mail is retained and whatever the planner's statistics
-- say; it used to be an EXISTS over an id range that the planner, with
-- finished mail out of id order and not yet vacuumed, answered with a
-- scan of all of mail_done, on every INSERT (409 ms a statement with 1.5
-- million retained, in the storage benchmark).
SET client_min_messages = warning;
\set VERBOSITY terse
SELECT gatekeeper.create_queue('ret');

-- 12,000 mails at scattered priorities, claimed highest first 300 at a
-- time and acked: mail_done holds them far out of id order, and no
-- vacuum has marked its pages all-visible
CREATE FUNCTION pg_temp.done_parts(change text) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
	p regclass;
BEGIN
	FOR p IN SELECT relid FROM pg_partition_tree('gatekeeper.mail_done') WHERE isleaf LOOP
		EXECUTE format('ALTER TABLE %s %s', p, change);
	END LOOP;
END $$;
SELECT pg_temp.done_parts('SET (autovacuum_enabled = false)');
INSERT INTO gatekeeper.mail (queue, recipient, subject, body, priority)
SELECT 'ret', 'ret' || i || '@example.com', 's', 'b', (i * 7919) % 1000
  FROM generate_series(1, 12000) i;
DO $$
DECLARE
	ids bigint[];
	atts int[];
BEGIN
	LOOP
		SELECT array_agg(id), array_agg(attempt) INTO ids, atts
		  FROM gatekeeper.claim('w', 300, queues => ARRAY['ret']);
		EXIT WHEN ids IS NULL;
		PERFORM gatekeeper.ack_batch(ids, atts);
	END LOOP;
END $$;
ANALYZE gatekeeper.mail_done;
SELECT count(*) AS finished FROM gatekeeper.mail_done WHERE queue = 'ret';

-- one more mail, and one more statement of a thousand: mail_done is read
-- by index, a handful of rows at most (the backend's statistics are
-- pending until flushed, so each is flushed before the statement counted)
SELECT pg_stat_force_next_flush();
BEGIN;
INSERT INTO gatekeeper.mail (queue, recipient, subject, body)
VALUES ('ret', 'one@example.com', 's', 'b');
SELECT sum(pg_stat_get_xact_numscans(relid)) AS done_scans,
       sum(pg_stat_get_xact_tuples_returned(relid) + pg_stat_get_xact_tuples_fetched(relid)) < 10 AS few_done_rows_read
  FROM pg_partition_tree('gatekeeper.mail_done') WHERE isleaf;
COMMIT;
SELECT pg_stat_force_next_flush();
BEGIN;
INSERT INTO gatekeeper.mail (queue, recipient, subject, body)
SELECT 'ret', 'more' || i || '@example.com', 's', 'b' FROM generate_series(1, 1000) i;
SELECT sum(pg_stat_get_xact_numscans(relid)) AS done_scans,
       sum(pg_stat_get_xact_tuples_returned(relid) + pg_stat_get_xact_tuples_fetched(relid)) < 10 AS few_done_rows_read
  FROM pg_partition_tree('gatekeeper.mail_done') WHERE isleaf;
COMMIT;
SELECT count(*) AS live FROM gatekeeper.mail_status WHERE queue = 'ret' AND state = 'scheduled';

SELECT pg_temp.done_parts('RESET (autovacuum_enabled)');
