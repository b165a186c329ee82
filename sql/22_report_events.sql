-- Reports taken twice, and unsubscribe clicks as events (issue 27).
--   unsubscribe(token): an 'unsubscribed' event (source token) for the
--   latest mail of the token's queue sent to its address, none when there
--   is none; a second click writes nothing.
--   The same report taken twice (a DSN redelivered, a webhook retried):
--   the same mail, event, source, status and detail is one event; it is
--   counted once in queue_stats and toward soft_bounce_limit, the second
--   ingest_report() returns no row (counted ignored), record_event() still
--   returns the mail's id.  A report that differs is a new event.
SET client_min_messages = warning;
\set VERBOSITY terse
CREATE EXTENSION IF NOT EXISTS gatekeeper;

CREATE TEMP TABLE ev_sent (tag text PRIMARY KEY, id bigint, recipient text, message_id text, headers jsonb);
CREATE FUNCTION pg_temp.ev_send(tag text, rcpt text, q text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
	c record;
BEGIN
	PERFORM gatekeeper.enqueue(rcpt, 'Your picks', 'Hello', queue => q, sender => 'shop@shop.example');
	SELECT * INTO c FROM gatekeeper.claim('w', 1, queues => ARRAY[q]);
	PERFORM gatekeeper.ack(c.id, c.attempt);
	INSERT INTO ev_sent VALUES (tag, c.id, rcpt, c.message_id, c.headers);
END
$$;

--
-- unsubscribe clicks
--
SELECT gatekeeper.create_queue('ue_promo', unsubscribe_url => 'https://shop.example.com/u/{token}');
SELECT gatekeeper.create_queue('ue_other', unsubscribe_url => 'https://shop.example.com/u/{token}');
SELECT pg_temp.ev_send('first', 'ue-reader@isp.example', 'ue_promo');
SELECT pg_temp.ev_send('latest', 'ue-reader@isp.example', 'ue_promo');
SELECT pg_temp.ev_send('elsewhere', 'ue-reader@isp.example', 'ue_other');
-- the token as the reader's click brings it, from the mail's List-Unsubscribe
SELECT substring(headers ->> 'List-Unsubscribe' FROM '/u/([^>]+)>$') AS token
  FROM ev_sent WHERE tag = 'latest' \gset
SELECT gatekeeper.unsubscribe(:'token') AS unsubscribed;
SELECT s.tag, e.recipient, e.event, e.source, e.detail FROM gatekeeper.events e JOIN ev_sent s ON s.id = e.mail_id
 WHERE e.event = 'unsubscribed' ORDER BY e.id;
SELECT address, queue, reason FROM gatekeeper.suppression WHERE address = 'ue-reader@isp.example';
-- a second click: no new entry, no second event
SELECT gatekeeper.unsubscribe(:'token') AS again;
SELECT count(*) AS unsubscribed_events FROM gatekeeper.events WHERE event = 'unsubscribed';
-- a token for an address the queue never mailed: suppressed, no event
SELECT gatekeeper.unsubscribe(gatekeeper._unsubscribe_token('ue-stranger@isp.example', 'ue_promo')) AS stranger;
SELECT count(*) AS unsubscribed_events FROM gatekeeper.events WHERE event = 'unsubscribed';

--
-- the same report twice
--
SELECT gatekeeper.create_queue('ud_news', return_path => 'bounces+{token}@bounce.shop.example');
SELECT pg_temp.ev_send('dsn', 'ud-gone@isp.example', 'ud_news');
SELECT pg_temp.ev_send('hook', 'ud-slow@isp.example', 'ud_news');
SELECT pg_temp.ev_send('soft', 'ud-full@isp.example', 'ud_news');
\set postfix `cat test/reports/postfix_user_unknown.eml`
SELECT replace(replace(replace(:'postfix', '{{TOKEN}}', gatekeeper._verp_token(s.id)), '{{MSGID}}', s.message_id),
			   '{{RCPT}}', s.recipient) AS dsn
  FROM ev_sent s WHERE s.tag = 'dsn' \gset
SELECT ignored AS ignored_before FROM gatekeeper.report_stats \gset
-- a DSN delivered twice: one row, then none
SELECT 'first' AS delivery, r.recipient, r.event, r.status FROM gatekeeper.ingest_report(:'dsn') r;
SELECT 'second' AS delivery, count(*) AS rows FROM gatekeeper.ingest_report(:'dsn') r;
SELECT ignored - :ignored_before AS ignored FROM gatekeeper.report_stats;
-- a webhook retried: the mail's id each time, one event
SELECT gatekeeper.record_event(s.message_id, 'deferred', '4.2.2', '452 4.2.2 mailbox full', s.recipient) = s.id AS first,
	   gatekeeper.record_event(s.message_id, 'deferred', '4.2.2', '452 4.2.2 mailbox full', s.recipient) = s.id AS retried
  FROM ev_sent s WHERE s.tag = 'hook';
-- a soft bounce retried five times: one event, not five mails toward
-- soft_bounce_limit (5)
SELECT count(*) FILTER (WHERE gatekeeper.record_event(s.message_id, 'bounced', '5.2.2', 'mailbox full') = s.id) AS calls
  FROM ev_sent s, generate_series(1, 5) WHERE s.tag = 'soft';
SELECT s.tag, e.event, e.status, e.source FROM gatekeeper.events e JOIN ev_sent s ON s.id = e.mail_id
 WHERE e.queue = 'ud_news' AND e.source <> 'relay' ORDER BY s.tag, e.id;
SELECT queue, sent, deferred, bounced FROM gatekeeper.queue_stats WHERE queue = 'ud_news';
SELECT address, reason FROM gatekeeper.suppression WHERE address LIKE 'ud-%' ORDER BY 1;
-- what differs is a new event: another status, another detail
SELECT gatekeeper.record_event(s.message_id, 'deferred', '4.2.2', '452 4.2.2 mailbox still full') = s.id AS other_detail,
	   gatekeeper.record_event(s.message_id, 'deferred', '4.4.1', '451 4.4.1 no answer') = s.id AS other_status
  FROM ev_sent s WHERE s.tag = 'hook';
SELECT e.event, e.status, e.detail FROM gatekeeper.events e JOIN ev_sent s ON s.id = e.mail_id
 WHERE s.tag = 'hook' AND e.source = 'webhook' ORDER BY e.id;
