-- Reports for mail in any retention segment (issue 27, record_event at
-- 10,000/s): ingest_report() and record_event() find the sent mail in
-- whichever segment holds it (they read the segments' partitions by key,
-- not the partitioned tables), write its event into that segment, and
-- find nothing once rotation has removed the mail.
--   a mail of an older segment than the current one: found, its event in
--   its own segment, its hard bounce suppresses;
--   a mail of the current segment: the same;
--   a mail that finished failed, not sent: no event;
--   a mail rotated away: NULL, nothing written, the report counted ignored.
-- And the soft-bounce rule has no SQL twin: the nacks call report_bounce
-- (src/report.c) in C, as ingest_report and record_event do.
SET client_min_messages = warning;
\set VERBOSITY terse
CREATE EXTENSION IF NOT EXISTS gatekeeper;
\i sql/error_of.inc

CREATE TEMP TABLE rs_sent (tag text PRIMARY KEY, id bigint, recipient text, message_id text);
CREATE FUNCTION pg_temp.rs_send(tag text, rcpt text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
	c record;
BEGIN
	PERFORM gatekeeper.enqueue(rcpt, 'Your picks', 'Hello', queue => 'rs_news', sender => 'shop@shop.example');
	SELECT * INTO c FROM gatekeeper.claim('w', 1, queues => '{rs_news}');
	PERFORM gatekeeper.ack(c.id, c.attempt);
	INSERT INTO rs_sent VALUES (tag, c.id, rcpt, c.message_id);
END
$$;
-- one rotation: the next segment (its finished mail aged first) is
-- emptied and becomes the current one
CREATE FUNCTION pg_temp.rs_rotate() RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
	UPDATE gatekeeper.mail_done SET finished_at = now() - interval '30 days'
	 WHERE segment = (SELECT (current + 1) % 4 FROM gatekeeper.segment);
	UPDATE gatekeeper.segment SET rotated_at = now() - interval '30 days';
	RETURN gatekeeper._rotate(interval '1 day');
END
$$;

SELECT gatekeeper.create_queue('rs_news', return_path => 'bounces+{token}@bounce.shop.example');
SELECT pg_temp.rs_send('older', 'rs-older@isp.example');
SELECT pg_temp.rs_send('older_dsn', 'rs-older-dsn@isp.example');
SELECT current AS older_segment FROM gatekeeper.segment \gset
SELECT pg_temp.rs_rotate() >= 0 AS rotated;
SELECT current <> :older_segment AS moved_on FROM gatekeeper.segment;
SELECT pg_temp.rs_send('newer', 'rs-newer@isp.example');
SELECT s.tag, d.segment = :older_segment AS in_older_segment, d.state
  FROM rs_sent s JOIN gatekeeper.mail_done d ON d.id = s.id ORDER BY s.tag;

-- an ESP's events for both, found in their segments
SELECT s.tag, gatekeeper.record_event(s.message_id, 'bounced', '5.1.1', '550 5.1.1 no such user', s.recipient) = s.id AS found
  FROM rs_sent s WHERE s.tag IN ('older', 'newer') ORDER BY s.tag;
SELECT s.tag, e.event, e.source, e.status, e.segment = d.segment AS in_its_segment
  FROM rs_sent s JOIN gatekeeper.event_log e ON e.mail_id = s.id
  JOIN gatekeeper.mail_done d ON d.id = s.id WHERE s.tag IN ('older', 'newer') ORDER BY s.tag;
SELECT address, reason FROM gatekeeper.suppression WHERE address LIKE 'rs-%' ORDER BY 1;

-- a DSN for a mail of the older segment, by its VERP token
\set postfix `cat test/reports/postfix_user_unknown.eml`
SELECT replace(replace(replace(:'postfix', '{{TOKEN}}', gatekeeper._verp_token(s.id)), '{{MSGID}}', s.message_id),
			   '{{RCPT}}', s.recipient) AS dsn
  FROM rs_sent s WHERE s.tag = 'older_dsn' \gset
SELECT r.mail_id = s.id AS the_mail, r.recipient, r.event, r.status
  FROM gatekeeper.ingest_report(:'dsn') r, rs_sent s WHERE s.tag = 'older_dsn';
SELECT s.tag, e.event, e.source, e.segment = :older_segment AS in_its_segment
  FROM rs_sent s JOIN gatekeeper.event_log e ON e.mail_id = s.id WHERE s.tag = 'older_dsn';

-- a mail that failed: no mail gatekeeper sent, no event
SELECT gatekeeper.enqueue('rs-failed@isp.example', 'Your picks', 'Hello', queue => 'rs_news',
						  sender => 'shop@shop.example') AS failed_id \gset
SELECT gatekeeper.nack(c.id, c.attempt, '554 5.7.1 refused', permanent => true) AS nacked
  FROM gatekeeper.claim('w', 1, queues => '{rs_news}') c;
SELECT gatekeeper.record_event(d.message_id, 'complained') AS failed_mail
  FROM gatekeeper.mail_done d WHERE d.id = :failed_id;
SELECT count(*) AS failed_mail_complaints FROM gatekeeper.event_log WHERE mail_id = :failed_id AND event = 'complained';

-- three more rotations remove the older segment, and its mail with it
SELECT sum(pg_temp.rs_rotate()) >= 0 AS rotated FROM generate_series(1, 3);
SELECT current = :older_segment AS older_segment_emptied_and_current FROM gatekeeper.segment;
SELECT s.tag, count(d.id) AS mail_done_rows FROM rs_sent s LEFT JOIN gatekeeper.mail_done d ON d.id = s.id
 GROUP BY s.tag ORDER BY s.tag;
SELECT ignored AS ignored_before FROM gatekeeper.report_stats \gset
SELECT s.tag, gatekeeper.record_event(s.message_id, 'complained', NULL, 'rotated', s.recipient) AS record_event
  FROM rs_sent s WHERE s.tag = 'older';
SELECT count(*) AS older_complaints FROM gatekeeper.event_log e JOIN rs_sent s ON s.id = e.mail_id
 WHERE s.tag = 'older' AND e.event = 'complained';
SELECT ignored - :ignored_before AS ignored FROM gatekeeper.report_stats;
-- the newer mail's segment stays: a complaint still counts
SELECT gatekeeper.record_event(s.message_id, 'complained', NULL, 'still here', s.recipient) = s.id AS newer_found
  FROM rs_sent s WHERE s.tag = 'newer';

-- the partitions made again in this session (DROP and CREATE EXTENSION):
-- the report finds mail in the new ones, not by the OIDs it read before
DROP EXTENSION gatekeeper CASCADE;
CREATE EXTENSION gatekeeper;
SELECT gatekeeper.create_queue('rs_news');
SELECT pg_temp.rs_send('remade', 'rs-remade@isp.example');
SELECT gatekeeper.record_event(s.message_id, 'complained', NULL, 'remade', s.recipient) = s.id AS remade_found
  FROM rs_sent s WHERE s.tag = 'remade';

-- no SQL function of the rule is left (the nacks' _bounced() was one)
SELECT count(*) AS bounce_rule_in_sql FROM pg_proc
 WHERE pronamespace = 'gatekeeper'::regnamespace AND proname = '_bounced';
