-- What the background worker calls between claims: next_due() for its
-- sleep, purge() for gatekeeper.retention (7 days by default).
SET client_min_messages = warning;
\set VERBOSITY terse

\i sql/gate_restamp.inc

SELECT gatekeeper.create_queue('m_q');
SELECT gatekeeper.create_queue('m_paused');

--
-- next_due: the earliest send_at of scheduled mail in unpaused queues
--
SELECT count(*) AS live_mail FROM gatekeeper.mail_status WHERE state IN ('scheduled', 'claimed');
SELECT gatekeeper.next_due() AS nothing_scheduled;
BEGIN;
SELECT gatekeeper.enqueue('n1@maint.example', 'N', 'b', 'm_q', send_at => now() + interval '2 hours') IS NOT NULL AS low;
SELECT gatekeeper.enqueue('n2@maint.example', 'N', 'b', 'm_q', send_at => now() + interval '3 hours', priority => 9) IS NOT NULL AS high;
SELECT gatekeeper.enqueue('n3@maint.example', 'N', 'b', 'm_paused', send_at => now() + interval '1 hour') IS NOT NULL AS paused;
SELECT gatekeeper.pause('m_paused');
SELECT gatekeeper.next_due() = now() + interval '2 hours' AS earliest_unpaused;
SELECT gatekeeper.enqueue('n4@maint.example', 'N', 'b', 'm_q', send_at => now() + interval '90 minutes', priority => -3) IS NOT NULL AS lowest_priority;
SELECT gatekeeper.next_due() = now() + interval '90 minutes' AS any_priority;
SELECT gatekeeper.resume('m_paused');
SELECT gatekeeper.next_due() = now() + interval '1 hour' AS resumed;
-- only the queues asked about (an external sender's, as claim's queues)
SELECT gatekeeper.next_due(ARRAY['m_q']) = now() + interval '90 minutes' AS only_m_q,
       gatekeeper.next_due(ARRAY['m_paused']) = now() + interval '1 hour' AS only_m_paused,
       gatekeeper.next_due('{}') IS NULL AS no_queues,
       gatekeeper.next_due(ARRAY['no_such_queue']) IS NULL AS unknown_queue,
       gatekeeper.next_due(NULL) = now() + interval '1 hour' AS null_is_every_queue;
COMMIT;
SELECT gatekeeper.cancel_queue('m_q') AS cancelled, gatekeeper.cancel_queue('m_paused') AS cancelled_paused;

--
-- purge: finished mail older than the retention goes by rotating the four
-- retention segments (whole partitions emptied by TRUNCATE); mail that is
-- still to go survives the rotation; expired gate passes go too
--
SELECT current_setting('gatekeeper.retention') AS retention;
SELECT current AS segment_at_start FROM gatekeeper.segment;
INSERT INTO gatekeeper.mail (recipient, subject, body, queue)
SELECT format('old%s@maint.example', i), 'Old', 'b', 'm_q' FROM generate_series(1, 4) AS i;
SELECT count(*) FILTER (WHERE gatekeeper.ack(c.id, c.attempt)) AS sent
  FROM gatekeeper.claim('w-maint', 10, queues => ARRAY['m_q']) AS c;
SELECT gatekeeper.enqueue('waiting@maint.example', 'W', 'b', 'm_q', send_at => now() + interval '30 days') AS waiting \gset
-- all mail finished so far finished 8 days ago, but old3 6 days ago
UPDATE gatekeeper.mail_done SET finished_at = now() - interval '8 days';
UPDATE gatekeeper.mail_done d SET finished_at = now() - interval '6 days' FROM gatekeeper.mail m
 WHERE m.id = d.id AND m.segment = d.segment AND m.recipient = 'old3@maint.example';
-- gate passes: one expired, one live
SELECT gatekeeper.gate_pass('smart_sending', 'expired@maint.example') AS p1,
       gatekeeper.gate_pass('smart_sending', 'live@maint.example') AS p2;
SELECT pg_temp._gate_restamp('smart_sending', 'expired@maint.example', ARRAY[now() - interval '1 minute']);
-- the current segment is younger than half the retention: no rotation
SELECT gatekeeper.purge() AS purged_young;
SELECT current AS segment FROM gatekeeper.segment;
SELECT r AS recipient, e.sends_in_period
  FROM unnest(ARRAY['expired@maint.example', 'live@maint.example']) AS r, gatekeeper.explain(r) AS e
 WHERE e.gate = 'smart_sending' ORDER BY r;
SELECT count(*) AS expired_log_rows FROM gatekeeper.gate_log WHERE expires < now();
-- segments 1, 2 and 3 are empty: each rotation comes once the current
-- segment is half the retention old
CREATE FUNCTION pg_temp.rotate(OUT purged bigint, OUT segment smallint)
LANGUAGE plpgsql AS $$
BEGIN
	UPDATE gatekeeper.segment SET rotated_at = now() - interval '4 days';
	purged := gatekeeper.purge();
	SELECT s.current INTO segment FROM gatekeeper.segment s;
END
$$;
SELECT * FROM pg_temp.rotate();
SELECT * FROM pg_temp.rotate();
SELECT * FROM pg_temp.rotate();
-- back to segment 0: old3 finished within the retention, so it stays
SELECT * FROM pg_temp.rotate();
SELECT s.recipient, s.state, m.segment FROM gatekeeper.mail_status s JOIN gatekeeper.mail m USING (id)
 WHERE s.recipient LIKE '%@maint.example' AND s.queue = 'm_q' ORDER BY s.recipient;
-- once old3 is past the retention too, segment 0 is emptied; the waiting
-- mail moves to segment 3 first, with its state and content
UPDATE gatekeeper.mail_done d SET finished_at = now() - interval '8 days' FROM gatekeeper.mail m
 WHERE m.id = d.id AND m.segment = d.segment AND m.recipient = 'old3@maint.example';
SELECT purged >= 4 AS purged, segment FROM pg_temp.rotate();
SELECT s.recipient, s.subject, s.state, m.segment, s.send_at > now() + interval '29 days' AS still_later
  FROM gatekeeper.mail_status s JOIN gatekeeper.mail m USING (id)
 WHERE s.recipient LIKE '%@maint.example' ORDER BY s.recipient;
SELECT count(*) AS rows_left_in_segment_0 FROM gatekeeper.mail_0;
SELECT gatekeeper.cancel(:waiting) AS cancelled;
