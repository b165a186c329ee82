-- Storage: a mail's content is written once and never rewritten by a
-- claim or an ack, finished mail leaves the live table at once, and
-- status(), find() and history() find a mail by index, for a role that
-- cannot read gatekeeper.mail too.
SET client_min_messages = warning;
\set VERBOSITY terse

\i sql/error_of.inc

-- the scans of a statement's plan that read a whole table of 1,000 rows or
-- more (a segment holding a row or two is read whole, rightly)
CREATE FUNCTION pg_temp.seq_scans(sql text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
	line text;
	found text := '';
	rel text;
BEGIN
	FOR line IN EXECUTE 'EXPLAIN (COSTS OFF) ' || sql LOOP
		rel := substring(line FROM 'Seq Scan on (\w+)');
		IF rel IS NOT NULL AND EXISTS (SELECT FROM pg_class c
										WHERE c.relname = rel AND c.reltuples >= 1000) THEN
			found := found || btrim(line) || '; ';
		END IF;
	END LOOP;
	RETURN coalesce(nullif(found, ''), 'none');
END
$$;

SELECT gatekeeper.create_queue('st_q', dedupe_window => '1 hour');
-- the content includes issue 12's columns: status() returns the metadata
SELECT gatekeeper.enqueue('st1@storage.example', 'One', 'Body', queue => 'st_q', dedupe_key => 'k1',
                          metadata => '{"campaign": "st"}') AS m1 \gset
SELECT gatekeeper.enqueue('st2@storage.example', 'Two', 'Body', queue => 'st_q', dedupe_key => 'k2') AS m2 \gset
SELECT gatekeeper.enqueue('st1@storage.example', 'Later', 'Body', queue => 'st_q',
                          send_at => now() + interval '1 day') AS m3 \gset
SELECT xmin::text AS content_xmin FROM gatekeeper.mail WHERE id = :m1 \gset

SELECT id = :m1 AS is_m1, queue, state, attempt, last_error, message_id IS NULL AS no_message_id,
       finished_at IS NULL AS unfinished, metadata
  FROM gatekeeper.status(:m1);

CREATE TEMP TABLE c AS SELECT * FROM gatekeeper.claim('w-st', 10, queues => ARRAY['st_q']);
SELECT count(*) AS claimed FROM c;
SELECT state, attempt FROM gatekeeper.status(:m1);
SELECT gatekeeper.ack(id, attempt) AS acked FROM c WHERE id = :m1;
SELECT gatekeeper.nack(id, attempt, '554 5.7.1 rejected', true) AS nacked FROM c WHERE id = :m2;

-- the content was written once: neither the claim nor the ack rewrote it
SELECT xmin::text = :'content_xmin' AS content_untouched FROM gatekeeper.mail WHERE id = :m1;
-- finished mail left the live table at once
SELECT count(*) AS live_left FROM gatekeeper.mail_live WHERE id IN (:m1, :m2);

SELECT state, attempt, last_error, message_id = (SELECT message_id FROM c WHERE id = :m1) AS same_message_id,
       finished_at IS NOT NULL AS finished, metadata
  FROM gatekeeper.status(:m1);
SELECT state, last_error FROM gatekeeper.status(:m2);
SELECT count(*) AS no_such_mail FROM gatekeeper.status(-1);

-- find: the live mail with the key, else the latest finished one
SELECT gatekeeper.find('st_q', 'k1') = :m1 AS finds_sent,
       gatekeeper.find('st_q', 'k2') = :m2 AS finds_failed,
       gatekeeper.find('st_q', 'nope') IS NULL AS finds_none;
-- a failed mail holds its key within the window too (issue 25): past it,
-- the key makes a new mail
UPDATE gatekeeper.mail_done SET finished_at = now() - interval '2 hours' WHERE id = :m2;
SELECT gatekeeper.enqueue('st2@storage.example', 'Two again', 'Body', queue => 'st_q', dedupe_key => 'k2') AS m4 \gset
SELECT gatekeeper.find('st_q', 'k2') = :m4 AS finds_live;
-- the dedupe window holds for mail already moved to mail_done
SELECT gatekeeper.enqueue('st1@storage.example', 'One again', 'Body', queue => 'st_q',
                          dedupe_key => 'k1') = :m1 AS deduped_within_window;

SELECT subject, state, last_error FROM gatekeeper.history('st1@storage.example') ORDER BY subject;
SELECT count(*) AS none_since_tomorrow FROM gatekeeper.history('st1@storage.example', now() + interval '1 day');

SELECT queue, scheduled, claimed, sent, failed, cancelled FROM gatekeeper.queue_stats WHERE queue = 'st_q';
SELECT gatekeeper.cancel(:m3) AS cancelled;
SELECT state, finished_at IS NOT NULL AS finished FROM gatekeeper.status(:m3);
SELECT queue, scheduled, claimed, sent, failed, cancelled FROM gatekeeper.queue_stats WHERE queue = 'st_q';

-- every lookup is by index, with finished mail retained
INSERT INTO gatekeeper.mail (recipient, subject, body, queue, dedupe_key)
SELECT format('bulk%s@storage.example', i), 'Bulk', 'b', 'st_q', 'bulk' || i FROM generate_series(1, 3000) AS i;
SELECT count(*) FILTER (WHERE gatekeeper.ack(id, attempt)) AS bulk_sent
  FROM gatekeeper.claim('w-st', 10000, queues => ARRAY['st_q']);
ANALYZE gatekeeper.mail, gatekeeper.mail_live, gatekeeper.mail_done;
SELECT pg_temp.seq_scans(format($$SELECT * FROM gatekeeper.mail_status WHERE id = %s$$, :m1)) AS status_scans;
SELECT pg_temp.seq_scans($$SELECT * FROM gatekeeper.mail_status
                            WHERE recipient = 'bulk7@storage.example' AND created_at >= now() - interval '30 days'$$) AS history_scans;
SELECT pg_temp.seq_scans($$SELECT id FROM gatekeeper.mail_live WHERE queue = 'st_q' AND dedupe_key = 'bulk7'$$) AS find_live_scans;
SELECT pg_temp.seq_scans($$SELECT id FROM gatekeeper.mail_done WHERE queue = 'st_q' AND dedupe_key = 'bulk7'
                            ORDER BY finished_at DESC, id DESC LIMIT 1$$) AS find_done_scans;

-- an application role that cannot read gatekeeper.mail looks its mail up
CREATE ROLE regress_st_app NOLOGIN;
CREATE ROLE regress_st_nobody NOLOGIN;
GRANT USAGE ON SCHEMA gatekeeper TO regress_st_app, regress_st_nobody;
GRANT EXECUTE ON FUNCTION gatekeeper.status(bigint), gatekeeper.find(text, text),
                          gatekeeper.history(text, timestamptz)
   TO regress_st_app;
SET ROLE regress_st_app;
SELECT state FROM gatekeeper.status(:m1);
SELECT gatekeeper.find('st_q', 'k1') = :m1 AS finds;
SELECT count(*) AS history_rows FROM gatekeeper.history('st1@storage.example');
SELECT pg_temp.error_of($$SELECT count(*) FROM gatekeeper.mail$$) AS select_mail;
SELECT pg_temp.error_of($$SELECT count(*) FROM gatekeeper.mail_status$$) AS select_status;
SELECT pg_temp.error_of($$SELECT count(*) FROM gatekeeper.mail_done$$) AS select_done;
RESET ROLE;
SET ROLE regress_st_nobody;
SELECT pg_temp.error_of(format($$SELECT * FROM gatekeeper.status(%s)$$, :m1)) AS status;
SELECT pg_temp.error_of($$SELECT gatekeeper.find('st_q', 'k1')$$) AS find;
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.history('st1@storage.example')$$) AS history;
RESET ROLE;

-- leave no live mail behind
SELECT gatekeeper.cancel_queue('st_q') AS cancelled;
REVOKE ALL ON SCHEMA gatekeeper FROM regress_st_app, regress_st_nobody;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA gatekeeper FROM regress_st_app;
DROP ROLE regress_st_app;
DROP ROLE regress_st_nobody;
