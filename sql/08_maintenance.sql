-- What the background worker calls between claims: next_due() for its
-- sleep, purge() for gatekeeper.retention (7 days by default).
SET client_min_messages = warning;
\set VERBOSITY terse

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
COMMIT;
SELECT gatekeeper.cancel_queue('m_q') AS cancelled, gatekeeper.cancel_queue('m_paused') AS cancelled_paused;

--
-- purge: finished mail older than the retention, and expired gate passes
--
SELECT current_setting('gatekeeper.retention') AS retention;
INSERT INTO gatekeeper.mail (recipient, subject, body, queue)
SELECT format('old%s@maint.example', i), 'Old', 'b', 'm_q' FROM generate_series(1, 4) AS i;
SELECT count(*) FILTER (WHERE gatekeeper.ack(c.id, c.attempt)) AS sent
  FROM gatekeeper.claim('w-maint', 10, queues => ARRAY['m_q']) AS c;
-- two finished 8 days ago, one 6 days ago, one now; a scheduled mail created long ago stays
UPDATE gatekeeper.mail_done d SET finished_at = now() - interval '8 days' FROM gatekeeper.mail m
 WHERE m.id = d.id AND m.recipient IN ('old1@maint.example', 'old2@maint.example');
UPDATE gatekeeper.mail_done d SET finished_at = now() - interval '6 days' FROM gatekeeper.mail m
 WHERE m.id = d.id AND m.recipient = 'old3@maint.example';
SELECT gatekeeper.enqueue('waiting@maint.example', 'W', 'b', 'm_q', send_at => now() + interval '30 days') AS waiting \gset
UPDATE gatekeeper.mail SET created_at = now() - interval '30 days' WHERE id = :waiting;
-- gate passes: one expired, one live
SELECT gatekeeper.gate_pass('smart_sending', 'expired@maint.example') AS p1,
       gatekeeper.gate_pass('smart_sending', 'live@maint.example') AS p2;
SELECT gatekeeper._gate_restamp('smart_sending', 'expired@maint.example', ARRAY[now() - interval '1 minute']);
SELECT gatekeeper.purge() >= 3 AS purged;
SELECT recipient, state FROM gatekeeper.mail_status WHERE recipient LIKE '%@maint.example' AND queue = 'm_q'
 ORDER BY recipient;
SELECT r AS recipient, e.sends_in_period
  FROM unnest(ARRAY['expired@maint.example', 'live@maint.example']) AS r, gatekeeper.explain(r) AS e
 WHERE e.gate = 'smart_sending' ORDER BY r;
SELECT count(*) AS expired_log_rows FROM gatekeeper.gate_log WHERE expires < now();
-- purge works in batches
UPDATE gatekeeper.mail_done d SET finished_at = now() - interval '8 days' FROM gatekeeper.mail m
 WHERE m.id = d.id AND m.recipient IN ('old3@maint.example', 'old4@maint.example');
SELECT gatekeeper.purge(1) AS purged_one;
SELECT count(*) AS old_left FROM gatekeeper.mail_status WHERE recipient IN ('old3@maint.example', 'old4@maint.example');
SELECT gatekeeper.purge(1) AS purged_another;
SELECT count(*) AS old_left FROM gatekeeper.mail_status WHERE recipient IN ('old3@maint.example', 'old4@maint.example');
SELECT gatekeeper.cancel(:waiting) AS cancelled;
