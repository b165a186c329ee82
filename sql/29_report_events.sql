-- Reports taken twice, and unsubscribe clicks as events (issue 27).
--   unsubscribe(token): an 'unsubscribed' event (source token) for the
--   latest mail of the token's queue sent to its address, none when there
--   is none; a second click writes nothing.
--   The same report taken twice (a DSN redelivered, a webhook retried):
--   the same mail, event, source, status and detail is one event; it is
--   counted once in queue_stats and toward soft_bounce_limit, the second
--   ingest_report() returns no row (counted ignored), record_event() still
--   returns the mail's id.  A report that differs is a new event.
--   Issue 44: a recipient cannot report another's mail (Message-IDs carry
--   a MAC; the earlier form, without one, counts only with the mail's
--   recipient), and a mail counts one complaint and one bounce however
--   many reports name it (the later ones kept as repeats).
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

--
-- a recipient cannot report another's mail (issue 44)
--
-- Every recipient knows their own Message-ID, and the mail of one
-- statement has consecutive ids and one created_at.  A Message-ID carries
-- a MAC: the adversary's own with its id changed to the neighbour's (the
-- Message-ID of 0.2.0, <id.created_micros_hex@domain>, was the
-- neighbour's) names no mail, so an ARF without Original-Rcpt-To or a DSN
-- naming the neighbour suppresses no one.  Mail sent with the earlier form
-- (no MAC) counts only when the report names its recipient.
\set jmrp `cat test/reports/microsoft_jmrp.eml`
\set exim `cat test/reports/exim_failed.eml`
CREATE TEMP TABLE uf_template AS SELECT :'jmrp' AS arf, :'exim' AS dsn;
-- an abuse report (Microsoft's, recipient redacted) returning message_id,
-- with Original-Rcpt-To when rcpt is given, and user_agent
CREATE FUNCTION pg_temp.uf_arf(message_id text, rcpt text DEFAULT NULL,
							   user_agent text DEFAULT 'Hotmail FBL') RETURNS text
LANGUAGE sql AS $$
	SELECT replace(replace(replace(t.arf, '{{MSGID}}', message_id),
						   'Feedback-Type: abuse', 'Feedback-Type: abuse' ||
						   coalesce(E'\nOriginal-Rcpt-To: ' || rcpt, '')),
				   'User-Agent: Hotmail FBL', 'User-Agent: ' || user_agent)
	  FROM uf_template t
$$;
-- Exim's DSN (no token) for rcpt, returning message_id, with a diagnostic
CREATE FUNCTION pg_temp.uf_dsn(message_id text, rcpt text,
							   diagnostic text DEFAULT '550 5.1.1 No such user here') RETURNS text
LANGUAGE sql AS $$
	SELECT replace(replace(replace(t.dsn, '{{MSGID}}', message_id), '{{RCPT}}', rcpt),
				   'Diagnostic-Code: smtp; 550 5.1.1 No such user here', 'Diagnostic-Code: smtp; ' || diagnostic)
	  FROM uf_template t
$$;
SELECT gatekeeper.create_queue('uf_news');
SELECT gatekeeper.create_queue('uf_tx', transactional => true);
-- one campaign statement
INSERT INTO gatekeeper.mail (queue, recipient, subject, body, sender)
SELECT 'uf_news', 'uf-' || r || '@isp.example', 'Picks', 'Hello', 'shop@shop.example'
  FROM unnest(ARRAY['adversary', 'neighbour', 'third', 'legacy1', 'legacy2', 'legacy3', 'legacy4',
					'own1', 'own2', 'own3', 'noisy', 'bouncy', 'hard']) WITH ORDINALITY AS t(r, n)
 ORDER BY n;
CREATE TEMP TABLE uf_sent AS
SELECT substring(c.recipient FROM '^uf-([a-z0-9]+)@') AS tag, c.id, c.attempt, c.recipient, c.message_id
  FROM gatekeeper.claim('w', 100, queues => '{uf_news}') c;
SELECT gatekeeper.ack_batch(array_agg(id), array_agg(attempt)) AS sent FROM uf_sent;
SELECT max(id) - min(id) + 1 = count(*) AS consecutive_ids,
	   count(DISTINCT m.created_at) AS created_ats
  FROM uf_sent JOIN gatekeeper.mail m USING (id);
-- <id.mac@domain>: 20 base32 characters of MAC, the same for the same
-- mail (what _message_id() computes), another for every mail
SELECT bool_and(message_id ~ ('^<' || id || '\.[a-z2-7]{20}@shop\.example>$')) AS keyed,
	   bool_and(message_id = gatekeeper._message_id(id, 'shop@shop.example', '', '')) AS stable,
	   count(DISTINCT substring(message_id FROM '\.([a-z2-7]+)@')) = count(*) AS per_mail
  FROM uf_sent;
-- what the adversary writes from their own: the neighbour's id, the rest as is
SELECT regexp_replace(a.message_id, '^<[0-9]+\.', '<' || n.id || '.') AS forged
  FROM uf_sent a, uf_sent n WHERE a.tag = 'adversary' AND n.tag = 'neighbour' \gset
SELECT :'forged' = message_id AS forged_is_the_neighbours FROM uf_sent WHERE tag = 'neighbour';
SELECT ignored AS uf_ignored_before FROM gatekeeper.report_stats \gset
-- an ARF without Original-Rcpt-To, a DSN with Final-Recipient the
-- neighbour and Status 5.1.1, a webhook: all name no mail
SELECT count(*) AS forged_arf FROM gatekeeper.ingest_report(pg_temp.uf_arf(:'forged'));
SELECT count(*) AS forged_dsn FROM gatekeeper.ingest_report(pg_temp.uf_dsn(:'forged', 'uf-neighbour@isp.example'));
SELECT gatekeeper.record_event(:'forged', 'complained') AS forged_webhook,
	   gatekeeper.record_event(:'forged', 'bounced', '5.1.1', 'user unknown', 'uf-neighbour@isp.example') AS forged_webhook_rcpt;
-- a MAC of the right form for the neighbour's id, but wrong
SELECT count(*) AS wrong_mac
  FROM uf_sent s, gatekeeper.ingest_report(pg_temp.uf_arf('<' || s.id || '.aaaaaaaaaaaaaaaaaaaa@shop.example>')) r
 WHERE s.tag = 'neighbour';
-- the adversary's own, genuine Message-ID, naming the neighbour as the
-- recipient: the report's recipient is not the mail's
SELECT count(*) AS own_id_other_arf
  FROM uf_sent s, gatekeeper.ingest_report(pg_temp.uf_arf(s.message_id, 'uf-neighbour@isp.example')) r
 WHERE s.tag = 'adversary';
SELECT count(*) AS own_id_other_dsn
  FROM uf_sent s, gatekeeper.ingest_report(pg_temp.uf_dsn(s.message_id, 'uf-neighbour@isp.example')) r
 WHERE s.tag = 'adversary';
SELECT ignored - :uf_ignored_before AS ignored FROM gatekeeper.report_stats;
SELECT count(*) AS neighbour_events FROM gatekeeper.events e JOIN uf_sent s ON s.id = e.mail_id
 WHERE s.tag = 'neighbour' AND e.event <> 'sent';
SELECT count(*) AS suppressed FROM gatekeeper.suppression WHERE address LIKE 'uf-%';
-- the neighbour's password reset goes
SELECT gatekeeper.enqueue('uf-neighbour@isp.example', 'Reset your password', 'Hello', queue => 'uf_tx') > 0 AS enqueued;
SELECT recipient AS password_reset_to FROM gatekeeper.claim('w', 10, queues => '{uf_tx}');
-- a genuine Message-ID proves its reporter had the mail: an ARF without
-- Original-Rcpt-To (as Microsoft and Yahoo send them), or with the mail's
-- recipient, counts for that recipient
SELECT r.mail_id = s.id AS the_mail, r.recipient, r.event
  FROM uf_sent s, gatekeeper.ingest_report(pg_temp.uf_arf(s.message_id)) r WHERE s.tag = 'own1';
SELECT r.mail_id = s.id AS the_mail, r.recipient, r.event
  FROM uf_sent s, gatekeeper.ingest_report(pg_temp.uf_arf(s.message_id, s.recipient)) r WHERE s.tag = 'own2';
SELECT gatekeeper.record_event(s.message_id, 'complained') = s.id AS own_webhook
  FROM uf_sent s WHERE s.tag = 'own3';
-- mail sent before the update carries the earlier Message-ID, with no MAC
UPDATE gatekeeper.mail_done d
   SET message_id = '<' || d.id || '.' || to_hex((extract(epoch FROM m.created_at) * 1000000)::bigint) || '@shop.example>'
  FROM gatekeeper.mail m WHERE m.id = d.id AND d.id IN (SELECT id FROM uf_sent WHERE tag LIKE 'legacy%');
UPDATE uf_sent s SET message_id = d.message_id FROM gatekeeper.mail_done d WHERE d.id = s.id AND s.tag LIKE 'legacy%';
-- without a recipient it counts nothing; with the mail's it counts
SELECT count(*) AS legacy_arf_no_rcpt
  FROM uf_sent s, gatekeeper.ingest_report(pg_temp.uf_arf(s.message_id)) r
 WHERE s.tag = 'legacy1';
SELECT gatekeeper.record_event(s.message_id, 'complained') AS legacy_webhook_no_rcpt
  FROM uf_sent s WHERE s.tag = 'legacy1';
SELECT count(*) AS legacy_arf_other_rcpt
  FROM uf_sent s, gatekeeper.ingest_report(pg_temp.uf_arf(s.message_id, 'uf-legacy2@isp.example')) r
 WHERE s.tag = 'legacy1';
SELECT r.mail_id = s.id AS the_mail, r.recipient, r.event
  FROM uf_sent s, gatekeeper.ingest_report(pg_temp.uf_arf(s.message_id, s.recipient)) r
 WHERE s.tag = 'legacy2';
SELECT r.mail_id = s.id AS the_mail, r.recipient, r.event, r.status
  FROM uf_sent s, gatekeeper.ingest_report(pg_temp.uf_dsn(s.message_id, s.recipient)) r
 WHERE s.tag = 'legacy3';
SELECT gatekeeper.record_event(s.message_id, 'complained', recipient => s.recipient) = s.id AS legacy_webhook_rcpt
  FROM uf_sent s WHERE s.tag = 'legacy4';
SELECT address, reason FROM gatekeeper.suppression WHERE address LIKE 'uf-%' ORDER BY 1;

--
-- one mail, many reports (issue 44): a mail counts one complaint and one
-- bounce however many reports name it; the later ones are kept as events
--
SELECT complained AS complained_before, bounced AS bounced_before
  FROM gatekeeper.queue_stats WHERE queue = 'uf_news' \gset
-- five ARFs about one mail that differ only in User-Agent
SELECT count(*) AS arf_rows
  FROM uf_sent s, generate_series(1, 5) n,
	   gatekeeper.ingest_report(pg_temp.uf_arf(s.message_id, user_agent => 'Hotmail FBL ' || n)) r
 WHERE s.tag = 'noisy';
-- five soft bounces of one mail, and two hard ones, each with its own
-- Diagnostic-Code
SELECT count(*) AS dsn_rows
  FROM uf_sent s, generate_series(1, 5) n,
	   gatekeeper.ingest_report(replace(pg_temp.uf_dsn(s.message_id, s.recipient, '552 5.2.2 mailbox full, try ' || n),
										'Status: 5.0.0', 'Status: 5.2.2')) r
 WHERE s.tag = 'bouncy';
SELECT count(*) AS hard_rows
  FROM uf_sent s, generate_series(1, 2) n,
	   gatekeeper.ingest_report(pg_temp.uf_dsn(s.message_id, s.recipient, '550 5.1.1 no such user ' || n)) r
 WHERE s.tag = 'hard';
-- and webhooks about them
SELECT count(*) FILTER (WHERE gatekeeper.record_event(s.message_id, e, '5.2.2', 'webhook ' || e) = s.id) AS webhook_calls
  FROM uf_sent s, unnest(ARRAY['complained', 'bounced']) e WHERE s.tag = 'noisy';
-- every report is an event; all but the first of a mail's complaints and
-- bounces are repeats
SELECT s.tag, e.event, count(*) AS events, count(*) FILTER (WHERE e.repeated) AS repeats
  FROM gatekeeper.event_log e JOIN uf_sent s ON s.id = e.mail_id
 WHERE s.tag IN ('noisy', 'bouncy', 'hard')
 GROUP BY 1, 2 ORDER BY 1, 2;
-- counted once each: one complaint (noisy), three bounces (noisy's by
-- the webhook, bouncy, hard)
SELECT complained - :complained_before AS complained, bounced - :bounced_before AS bounced
  FROM gatekeeper.queue_stats WHERE queue = 'uf_news';
SELECT address, reason FROM gatekeeper.suppression
 WHERE address IN ('uf-noisy@isp.example', 'uf-bouncy@isp.example', 'uf-hard@isp.example') ORDER BY 1;
