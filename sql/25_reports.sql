-- After the relay said 250 (issue 27): bounces, complaints, events.
--   return_path: validated (22023, 54000 when too long for SMTP).
--   ingest_report: real-shaped DSNs (Postfix, Exim, Exchange, Gmail, Yahoo)
--   and ARF reports (Yahoo, Microsoft) from test/reports/, each found by
--   VERP token, ENVID or returned Message-ID; the event and the
--   suppression it calls for (hard bounce, complaint, soft bounces at
--   soft_bounce_limit); a complaint spares transactional queues; a
--   bounced mail keeps its gate passes.
--   Security: a forged token, a Message-ID never sent, one of mail not
--   sent, a Final-Recipient that is not the mail's recipient, a report
--   for another sender: no row, nothing written, counted as ignored.
--   record_event: SES and SendGrid webhook payloads mapped by the
--   README's SQL; its SQLSTATEs.
SET client_min_messages = warning;
\set VERBOSITY terse

\i sql/error_of.inc

-- return_path is validated like an address, {token} a word of its local part
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('r_bad', return_path => 'no-at-sign')$$) AS no_at;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('r_bad', return_path => 'b+{token}.{token}@bounce.example')$$) AS twice;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('r_bad', return_path => 'b{token}@bounce.example')$$) AS glued;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('r_bad', return_path => 'bounces@{token}.example')$$) AS in_domain;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('r_bad', return_path => 'Shop <bounces@bounce.example>')$$) AS not_bare;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('r_bad', return_path => repeat('b', 40) || '+{token}@bounce.example')$$) AS too_long;
SELECT pg_temp.error_of($$SELECT gatekeeper.alter_queue('default', return_path => 'b+{token}+{token}@x.example')$$) AS alter_twice;
SELECT count(*) AS no_bad_queue FROM gatekeeper.queue WHERE name = 'r_bad';

SELECT gatekeeper.create_queue('r_news', gates => '{smart_sending}',
							   return_path => 'bounces+{token}@bounce.shop.example');
SELECT gatekeeper.create_queue('r_tx', transactional => true);
SELECT gatekeeper.create_queue('r_other', return_path => 'bounces-{token}@bounce.shop.example');
SELECT gatekeeper.alter_queue('r_other', return_path => '');
SELECT gatekeeper.alter_queue('r_tx', return_path => 'rp@bounce.shop.example');
SELECT name, return_path FROM gatekeeper.queue WHERE name LIKE 'r\_%' ORDER BY 1;

-- the VERP token: 29 lower-case base32 characters, one per mail
SELECT length(gatekeeper._verp_token(1)) AS token_length,
	   gatekeeper._verp_token(1) ~ '^[a-z2-7]{29}$' AS base32,
	   gatekeeper._verp_token(1) = gatekeeper._verp_token(1) AS stable,
	   gatekeeper._verp_token(1) <> gatekeeper._verp_token(2) AS per_mail;

-- mail sent as an external worker would send it: claimed, acked
CREATE TEMP TABLE sent (tag text PRIMARY KEY, id bigint, recipient text, queue text,
						message_id text, token text);
CREATE FUNCTION pg_temp.send(tag text, rcpt text, q text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
	c record;
BEGIN
	PERFORM gatekeeper.enqueue(rcpt, 'Your weekly picks', 'Hello', queue => q, sender => 'shop@shop.example');
	SELECT * INTO c FROM gatekeeper.claim('w', 1, queues => ARRAY[q]);
	PERFORM gatekeeper.ack(c.id, c.attempt);
	INSERT INTO sent VALUES (tag, c.id, rcpt, q, c.message_id, gatekeeper._verp_token(c.id));
END
$$;
-- a report from test/reports/ with the placeholders of one sent mail filled in
CREATE FUNCTION pg_temp.report(template text, tag text) RETURNS text
LANGUAGE sql AS $$
	SELECT replace(replace(replace(template, '{{TOKEN}}', s.token), '{{MSGID}}', s.message_id),
				   '{{RCPT}}', s.recipient)
	  FROM sent s WHERE s.tag = report.tag
$$;
SELECT pg_temp.send('postfix', 'gone@dead.example', 'r_news');
SELECT pg_temp.send('exim', 'Nobody@ISP.example', 'r_news');
SELECT pg_temp.send('exchange', 'left@contoso.example', 'r_news');
SELECT pg_temp.send('gmail', 'typo@gmail.example', 'r_news');
SELECT pg_temp.send('yahoo', 'full@yahoo.example', 'r_news');
SELECT pg_temp.send('yahoo_arf', 'angry@yahoo.example', 'r_news');
SELECT pg_temp.send('jmrp', 'grumpy@hotmail.example', 'r_news');
SELECT pg_temp.send('tx', 'angry@yahoo.example', 'r_tx');

-- every sent mail has its 'sent' event from the relay
SELECT count(*) AS sent_events FROM gatekeeper.events e JOIN sent s ON s.id = e.mail_id
 WHERE e.event = 'sent' AND e.source = 'relay' AND e.recipient = s.recipient AND e.queue = s.queue;
-- read from the mail's outcome (issue 26): the acks wrote no event row,
-- and a sent event has no id, but its mail's finish
SELECT count(*) AS event_rows_written FROM gatekeeper.event_log e JOIN sent s ON s.id = e.mail_id;
SELECT count(*) FILTER (WHERE e.id IS NULL AND e.at = d.finished_at) AS sent_from_outcome
  FROM gatekeeper.events e JOIN sent s ON s.id = e.mail_id JOIN gatekeeper.mail_done d ON d.id = e.mail_id
 WHERE e.event = 'sent';

\set postfix `cat test/reports/postfix_user_unknown.eml`
\set exim `cat test/reports/exim_failed.eml`
\set exchange `cat test/reports/exchange_ndr.eml`
\set gmail `cat test/reports/gmail_failure.eml`
\set yahoo `cat test/reports/yahoo_delayed.eml`
\set yahoo_arf `cat test/reports/yahoo_arf.eml`
\set jmrp `cat test/reports/microsoft_jmrp.eml`

-- the gate pass of the bounced mail is held before and after
SELECT gatekeeper.gate_open('smart_sending', 'gone@dead.example') AS gate_open_before;

-- Postfix, delivered to the VERP address (as its pipe passes ${recipient}),
-- lines ending in CRLF as the mail arrived
SELECT r.mail_id = s.id AS the_mail, r.recipient, r.event, r.status, r.detail
  FROM gatekeeper.ingest_report(replace(pg_temp.report(:'postfix', 'postfix'), E'\n', E'\r\n'),
								'bounces+' || (SELECT token FROM sent WHERE tag = 'postfix') || '@bounce.shop.example') r,
	   sent s WHERE s.tag = 'postfix';
-- Exim: no token anywhere; found by the returned Message-ID
SELECT r.mail_id = s.id AS the_mail, r.recipient, r.event, r.status, r.detail
  FROM gatekeeper.ingest_report(pg_temp.report(:'exim', 'exim')) r, sent s WHERE s.tag = 'exim';
-- Exchange: quoted-printable delivery status, found by Message-ID
SELECT r.mail_id = s.id AS the_mail, r.recipient, r.event, r.status, r.detail
  FROM gatekeeper.ingest_report(pg_temp.report(:'exchange', 'exchange')) r, sent s WHERE s.tag = 'exchange';
-- Gmail: nested multiparts, token in Delivered-To (no envelope_to given)
SELECT r.mail_id = s.id AS the_mail, r.recipient, r.event, r.status, left(r.detail, 40) AS detail
  FROM gatekeeper.ingest_report(pg_temp.report(:'gmail', 'gmail')) r, sent s WHERE s.tag = 'gmail';
-- Yahoo: delayed (by ENVID): deferred, no suppression
SELECT r.mail_id = s.id AS the_mail, r.recipient, r.event, r.status, r.detail
  FROM gatekeeper.ingest_report(pg_temp.report(:'yahoo', 'yahoo')) r, sent s WHERE s.tag = 'yahoo';
-- Yahoo's feedback loop: by the token in Original-Mail-From
SELECT r.mail_id = s.id AS the_mail, r.recipient, r.event, r.status, r.detail
  FROM gatekeeper.ingest_report(pg_temp.report(:'yahoo_arf', 'yahoo_arf')) r, sent s WHERE s.tag = 'yahoo_arf';
-- Microsoft JMRP: recipient redacted, by the returned Message-ID
SELECT r.mail_id = s.id AS the_mail, r.recipient, r.event, r.status, r.detail
  FROM gatekeeper.ingest_report(pg_temp.report(:'jmrp', 'jmrp')) r, sent s WHERE s.tag = 'jmrp';
-- a second DSN (another status: the same one is one event, see
-- 29_report_events) delivered with its local part upper-cased by an MTA
SELECT count(*) AS upper_cased_token
  FROM gatekeeper.ingest_report(replace(pg_temp.report(:'postfix', 'postfix'), 'Status: 5.1.1', 'Status: 5.1.2'),
								upper('bounces+' || (SELECT token FROM sent WHERE tag = 'postfix') || '@bounce.shop.example'));

SELECT gatekeeper.gate_open('smart_sending', 'gone@dead.example') AS gate_open_after;

-- what the reports suppressed: hard bounces and complaints, everywhere
SELECT address, queue, reason, mail_id = (SELECT id FROM sent WHERE recipient = address AND queue = 'r_news') AS by_the_mail
  FROM gatekeeper.suppression WHERE address IN (SELECT lower(recipient) FROM sent) ORDER BY address;
-- a complaint spares the transactional queue; a hard bounce stops it
SELECT s.recipient, s.queue, s.reason
  FROM gatekeeper._suppressed(ARRAY['angry@yahoo.example', 'angry@yahoo.example', 'gone@dead.example', 'full@yahoo.example'],
							  ARRAY['r_tx', 'r_news', 'r_tx', 'r_news']) s ORDER BY 1, 2;
SELECT e.queue, e.recipient, e.event, e.status, e.source, e.reason
  FROM gatekeeper.events e WHERE e.event <> 'sent' AND e.queue LIKE 'r\_%' ORDER BY e.recipient, e.event;

-- nothing for what names no mail gatekeeper sent to that recipient
SELECT ignored AS ignored_before FROM gatekeeper.report_stats \gset
SELECT count(*) AS suppressions_before FROM gatekeeper.suppression \gset
SELECT count(*) AS events_before FROM gatekeeper.events \gset
SELECT pg_temp.send('victim', 'victim@isp.example', 'r_news');
-- a forged token (one letter changed), and no Message-ID to fall back on
SELECT count(*) AS forged_token
  FROM gatekeeper.ingest_report(
		replace(replace(pg_temp.report(:'yahoo', 'victim'),
						(SELECT token FROM sent WHERE tag = 'victim'),
						overlay((SELECT token FROM sent WHERE tag = 'victim') PLACING
								CASE WHEN substr((SELECT token FROM sent WHERE tag = 'victim'), 5, 1) = 'a' THEN 'b' ELSE 'a' END
								FROM 5 FOR 1)),
				'Message-ID: <', 'X-Old-Message-ID: <'));
-- a Message-ID gatekeeper never wrote, and one of the right form for no mail
SELECT count(*) AS never_sent
  FROM gatekeeper.ingest_report(replace(pg_temp.report(:'exim', 'victim'),
										(SELECT message_id FROM sent WHERE tag = 'victim'),
										'<CAB7d8f9@mail.example>'));
SELECT count(*) AS unknown_id
  FROM gatekeeper.ingest_report(replace(pg_temp.report(:'exim', 'victim'),
										(SELECT message_id FROM sent WHERE tag = 'victim'),
										'<987654321.5f3a@shop.example>'));
-- the right id with another time stamp: not the Message-ID sent
SELECT count(*) AS wrong_stamp
  FROM gatekeeper.ingest_report(replace(pg_temp.report(:'exim', 'victim'),
										(SELECT message_id FROM sent WHERE tag = 'victim'),
										'<' || (SELECT id FROM sent WHERE tag = 'victim') || '.0@shop.example>'));
-- a valid token, but the DSN is about another address (forged to suppress it)
SELECT count(*) AS other_recipient
  FROM gatekeeper.ingest_report(replace(pg_temp.report(:'postfix', 'victim'), 'victim@isp.example', 'ceo@isp.example'),
								'bounces+' || (SELECT token FROM sent WHERE tag = 'victim') || '@bounce.shop.example');
-- an ARF report naming another recipient than the mail's
SELECT count(*) AS arf_other_recipient
  FROM gatekeeper.ingest_report(replace(pg_temp.report(:'yahoo_arf', 'victim'), 'Original-Rcpt-To: victim@isp.example',
										'Original-Rcpt-To: ceo@isp.example'));
-- a DSN for mail another sender sent (its own Message-ID, no token)
SELECT count(*) AS other_sender
  FROM gatekeeper.ingest_report(replace(replace(:'exim', '{{MSGID}}', '<20261125.abc123@other-sender.example>'),
										'{{RCPT}}', 'victim@isp.example'));
-- mail that is not sent (scheduled): its Message-ID is not known yet, its token names no sent mail
SELECT gatekeeper.enqueue('later@isp.example', 'Later', 'Hello', queue => 'r_news', send_at => now() + interval '1 day') AS later_id \gset
SELECT count(*) AS not_sent
  FROM gatekeeper.ingest_report(replace(replace(replace(:'postfix', '{{TOKEN}}', gatekeeper._verp_token(:later_id)),
												'{{RCPT}}', 'later@isp.example'), '{{MSGID}}', '<x@y>'),
								'bounces+' || gatekeeper._verp_token(:later_id) || '@bounce.shop.example');
-- not a report at all, naming no mail (issue 49: a message delivered to a
-- mail's VERP address is a bounce of that mail whatever its format); an
-- auto-reply (RFC 3834) to the VERP address is no bounce; an empty message
SELECT count(*) AS plain_mail
  FROM gatekeeper.ingest_report(E'From: a@b.example\nTo: shop@shop.example\nSubject: hi\n\nFinal-Recipient: rfc822; victim@isp.example\nAction: failed\nStatus: 5.1.1\n');
SELECT count(*) AS vacation
  FROM gatekeeper.ingest_report(E'From: Victim <victim@isp.example>\nTo: bounces+' || (SELECT token FROM sent WHERE tag = 'victim')
								|| E'@bounce.shop.example\nAuto-Submitted: auto-replied\nSubject: Out of office: Your weekly picks\n\nI am away until Monday and will read your message then.\n');
SELECT count(*) AS empty FROM gatekeeper.ingest_report('');
SELECT count(*) - :suppressions_before AS new_suppressions FROM gatekeeper.suppression;
-- one: the 'sent' event of the victim's mail
SELECT count(*) - :events_before AS new_events FROM gatekeeper.events;
SELECT ignored - :ignored_before AS ignored FROM gatekeeper.report_stats;

-- soft bounces: the fifth mail to one address bouncing (5.2.2, its words
-- saying the mailbox is full: not hard) within 30 days suppresses it
-- (soft_bounce_limit, default 5)
SELECT current_setting('gatekeeper.soft_bounce_limit') AS soft_bounce_limit;
DO $$
BEGIN
	FOR i IN 1 .. 5 LOOP
		PERFORM pg_temp.send('soft' || i, 'mailbox-full@isp.example', 'r_other');
	END LOOP;
END
$$;
-- four mails bounced, one of them reported three times (three DSNs, each
-- its own diagnostic: three events): not yet
SELECT count(*) AS rows
  FROM unnest(ARRAY['soft1', 'soft2', 'soft3', 'soft4', 'soft4', 'soft4']) WITH ORDINALITY t(tag, n)
	   JOIN sent s ON s.tag = t.tag,
	   LATERAL gatekeeper.ingest_report(replace(replace(replace(replace(replace(replace(:'postfix', 'User unknown', 'Mailbox is full'), '{{TOKEN}}', s.token),
			'{{MSGID}}', s.message_id), '{{RCPT}}', s.recipient), 'Status: 5.1.1', 'Status: 5.2.2'),
			'550 5.1.1', '552 5.2.2 attempt ' || t.n)) r;
SELECT count(*) AS suppressed_after_four FROM gatekeeper.suppression WHERE address = 'mailbox-full@isp.example';
-- the fifth mail
SELECT r.event, r.status
  FROM sent s, LATERAL gatekeeper.ingest_report(replace(replace(replace(replace(replace(replace(:'postfix', 'User unknown', 'Mailbox is full'), '{{TOKEN}}', s.token),
			'{{MSGID}}', s.message_id), '{{RCPT}}', s.recipient), 'Status: 5.1.1', 'Status: 5.2.2'), '550 5.1.1', '552 5.2.2')) r
 WHERE s.tag = 'soft5';
SELECT reason, detail FROM gatekeeper.suppression WHERE address = 'mailbox-full@isp.example';
SELECT count(*) AS soft_bounce_events FROM gatekeeper.events
 WHERE recipient = 'mailbox-full@isp.example' AND event = 'bounced';

-- a delivery status part in base64
SELECT pg_temp.send('b64', 'b64@isp.example', 'r_news');
SELECT r.recipient, r.event, r.status
  FROM gatekeeper.ingest_report(
		E'From: MAILER-DAEMON@mx.example\nMIME-Version: 1.0\nContent-Type: multipart/report; report-type=delivery-status; boundary=b\n\n--b\nContent-Type: text/plain\n\nfailed\n--b\nContent-Type: message/delivery-status\nContent-Transfer-Encoding: base64\n\n'
		|| encode(convert_to(E'Reporting-MTA: dns; mx.example\nOriginal-Envelope-Id: '
							 || (SELECT token FROM sent WHERE tag = 'b64')
							 || E'\n\nFinal-Recipient: rfc822; b64@isp.example\nAction: failed\nStatus: 5.1.2\n', 'UTF8'), 'base64')
		|| E'\n--b--\n') r;

-- queue_stats' totals: deferrals, bounces, complaints (a mail counts one
-- bounce: the postfix mail's second DSN and soft4's second and third are
-- kept as events, not counted again; see 29_report_events)
SELECT queue, sent, deferred, bounced, complained FROM gatekeeper.queue_stats
 WHERE queue LIKE 'r\_%' ORDER BY queue;

-- record_event: bad arguments
SELECT pg_temp.error_of($$SELECT gatekeeper.record_event(NULL, 'bounced')$$) AS null_message_id;
SELECT pg_temp.error_of($$SELECT gatekeeper.record_event('<1.2@x>', NULL)$$) AS null_event;
SELECT pg_temp.error_of($$SELECT gatekeeper.record_event('<1.2@x>', 'sent')$$) AS sent_is_the_relays;
SELECT pg_temp.error_of($$SELECT gatekeeper.record_event('<1.2@x>', 'opened')$$) AS unknown_event;
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.ingest_report(NULL)$$) AS null_message;
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.ingest_report(repeat('x', 64 * 1024 * 1024 + 1))$$) AS oversized;
-- unknown, forged, other recipient: NULL, nothing written
SELECT gatekeeper.record_event('<424242.abc@shop.example>', 'complained') AS unknown,
	   gatekeeper.record_event((SELECT message_id FROM sent WHERE tag = 'victim'), 'complained',
							   recipient => 'ceo@isp.example') AS other_recipient,
	   gatekeeper.record_event('not a message id', 'bounced') AS junk;
SELECT count(*) AS victim_untouched FROM gatekeeper.suppression WHERE address IN ('victim@isp.example', 'ceo@isp.example');

-- Amazon SES through SNS: the README's mapping, as the endpoint runs it
SELECT pg_temp.send('ses_bounce', 'ses-gone@isp.example', 'r_news');
SELECT pg_temp.send('ses_complaint', 'ses-angry@isp.example', 'r_news');
SELECT (SELECT message_id FROM sent WHERE tag = 'ses_bounce') AS ses_bounce_mid,
	   (SELECT message_id FROM sent WHERE tag = 'ses_complaint') AS ses_complaint_mid \gset
PREPARE ses(jsonb) AS
SELECT gatekeeper.record_event(
		 n.msg #>> '{mail,commonHeaders,messageId}',
		 CASE n.msg ->> 'notificationType' WHEN 'Bounce' THEN 'bounced' ELSE 'complained' END,
		 coalesce(r ->> 'status', CASE WHEN n.msg #>> '{bounce,bounceType}' = 'Permanent' THEN '5.1.1' END),
		 coalesce(r ->> 'diagnosticCode', n.msg #>> '{complaint,complaintFeedbackType}'),
		 r ->> 'emailAddress')
  FROM (SELECT ($1 ->> 'Message')::jsonb AS msg) n,
	   jsonb_array_elements(coalesce(n.msg #> '{bounce,bouncedRecipients}',
									 n.msg #> '{complaint,complainedRecipients}')) r
 WHERE n.msg ->> 'notificationType' IN ('Bounce', 'Complaint');
CREATE TEMP TABLE ses_bounce AS EXECUTE ses(jsonb_build_object(
	'Type', 'Notification',
	'MessageId', '22b80b92-fdea-4c2c-8f9d-bdfb0c7bf324',
	'TopicArn', 'arn:aws:sns:us-east-1:123456789012:ses-bounces',
	'Message', jsonb_build_object(
		'notificationType', 'Bounce',
		'bounce', jsonb_build_object(
			'bounceType', 'Permanent', 'bounceSubType', 'General',
			'bouncedRecipients', jsonb_build_array(jsonb_build_object(
				'emailAddress', 'ses-gone@isp.example', 'action', 'failed', 'status', '5.1.1',
				'diagnosticCode', 'smtp; 550 5.1.1 user unknown')),
			'timestamp', '2026-11-25T17:30:00.000Z',
			'feedbackId', '0100018c2b3d4e5f-1a2b3c4d-000000'),
		'mail', jsonb_build_object(
			'timestamp', '2026-11-25T17:29:59.000Z', 'source', 'shop@shop.example',
			'messageId', '0100018c2b3d4e5f-aaaa-bbbb-000000',
			'destination', jsonb_build_array('ses-gone@isp.example'),
			'commonHeaders', jsonb_build_object(
				'from', jsonb_build_array('shop@shop.example'),
				'to', jsonb_build_array('ses-gone@isp.example'),
				'messageId', :'ses_bounce_mid',
				'subject', 'Your weekly picks')))::text,
	'Timestamp', '2026-11-25T17:30:01.000Z',
	'SignatureVersion', '1'));
CREATE TEMP TABLE ses_complaint AS EXECUTE ses(jsonb_build_object(
	'Type', 'Notification',
	'MessageId', '3c4d5e6f-0a1b-4c2d-9e8f-7a6b5c4d3e2f',
	'Message', jsonb_build_object(
		'notificationType', 'Complaint',
		'complaint', jsonb_build_object(
			'complainedRecipients', jsonb_build_array(jsonb_build_object('emailAddress', 'ses-angry@isp.example')),
			'timestamp', '2026-11-25T18:00:00.000Z', 'feedbackId', '0100018c-cccc-000000',
			'complaintFeedbackType', 'abuse', 'userAgent', 'Yahoo!-Mail-Feedback/2.0'),
		'mail', jsonb_build_object(
			'source', 'shop@shop.example', 'messageId', '0100018c2b3d4e5f-cccc-dddd-000000',
			'commonHeaders', jsonb_build_object(
				'messageId', :'ses_complaint_mid')))::text));
SELECT s.tag, r.record_event = s.id AS the_mail
  FROM (SELECT * FROM ses_bounce UNION ALL SELECT * FROM ses_complaint) r
  LEFT JOIN sent s ON s.id = r.record_event ORDER BY s.tag;
SELECT address, reason, detail FROM gatekeeper.suppression WHERE address LIKE 'ses-%' ORDER BY 1;

-- SendGrid's event webhook: the README's mapping
SELECT pg_temp.send('sg_bounce', 'sg-gone@isp.example', 'r_news');
SELECT pg_temp.send('sg_spam', 'sg-angry@isp.example', 'r_news');
SELECT pg_temp.send('sg_deferred', 'sg-slow@isp.example', 'r_news');
SELECT pg_temp.send('sg_delivered', 'sg-fine@isp.example', 'r_news');
SELECT (SELECT message_id FROM sent WHERE tag = 'sg_bounce') AS sg_bounce_mid,
	   (SELECT message_id FROM sent WHERE tag = 'sg_spam') AS sg_spam_mid,
	   (SELECT message_id FROM sent WHERE tag = 'sg_deferred') AS sg_deferred_mid,
	   (SELECT message_id FROM sent WHERE tag = 'sg_delivered') AS sg_delivered_mid \gset
PREPARE sendgrid(jsonb) AS
SELECT gatekeeper.record_event(
		 e ->> 'smtp-id',
		 CASE e ->> 'event' WHEN 'bounce' THEN 'bounced' WHEN 'dropped' THEN 'bounced'
			  WHEN 'deferred' THEN 'deferred' WHEN 'spamreport' THEN 'complained' ELSE 'delivered' END,
		 e ->> 'status', coalesce(e ->> 'reason', e ->> 'response'), e ->> 'email')
  FROM jsonb_array_elements($1) e
 WHERE e ->> 'event' IN ('bounce', 'dropped', 'deferred', 'spamreport', 'delivered');
CREATE TEMP TABLE sg_result AS EXECUTE sendgrid(jsonb_build_array(
	jsonb_build_object('email', 'sg-gone@isp.example', 'timestamp', 1764090000, 'event', 'bounce',
					   'smtp-id', :'sg_bounce_mid',
					   'sg_event_id', 'ZGVsaXZlcmVkLTAtMjQ', 'sg_message_id', '14c5d75ce93.dfd.64b469.filter0001',
					   'reason', '550 5.1.1 The email account that you tried to reach does not exist.',
					   'status', '5.1.1', 'type', 'bounce'),
	jsonb_build_object('email', 'sg-angry@isp.example', 'timestamp', 1764090001, 'event', 'spamreport',
					   'smtp-id', :'sg_spam_mid'),
	jsonb_build_object('email', 'sg-slow@isp.example', 'timestamp', 1764090002, 'event', 'deferred',
					   'smtp-id', :'sg_deferred_mid',
					   'response', '452 4.2.2 mailbox full', 'attempt', '1'),
	jsonb_build_object('email', 'sg-fine@isp.example', 'timestamp', 1764090003, 'event', 'delivered',
					   'smtp-id', :'sg_delivered_mid',
					   'response', '250 2.0.0 OK'),
	jsonb_build_object('email', 'sg-fine@isp.example', 'timestamp', 1764090004, 'event', 'open',
					   'smtp-id', :'sg_delivered_mid'),
	jsonb_build_object('email', 'stranger@isp.example', 'timestamp', 1764090005, 'event', 'bounce',
					   'smtp-id', '<14c5d75ce93.dfd.64b469@ismtpd-555>', 'status', '5.1.1')));
SELECT s.tag, r.record_event = s.id AS the_mail
  FROM sg_result r LEFT JOIN sent s ON s.id = r.record_event ORDER BY s.tag NULLS LAST;
SELECT e.recipient, e.event, e.status, e.source FROM gatekeeper.events e
 WHERE e.source = 'webhook' AND e.queue LIKE 'r\_%' ORDER BY e.recipient, e.event;
SELECT address, reason FROM gatekeeper.suppression WHERE address LIKE 'sg-%' OR address = 'stranger@isp.example' ORDER BY 1;

-- the next campaign: no mail to a suppressed address reaches a claimer
SELECT count(gatekeeper.enqueue(a, 'Next week', 'Hello', queue => 'r_news', sender => 'shop@shop.example')) AS enqueued
  FROM unnest(ARRAY['gone@dead.example', 'typo@gmail.example', 'angry@yahoo.example', 'fresh@isp.example']) a;
SELECT recipient FROM gatekeeper.claim('w', 100, queues => '{r_news}') ORDER BY 1;

-- retention: events live in their mail's segment and go with it, by the
-- rotation's TRUNCATE; the events of mail still live move with it
-- (this ages every finished mail of the database and rotates all four
-- segments: keep it last)
SELECT gatekeeper.enqueue('retry@isp.example', 'Retry', 'Hello', queue => 'r_other', sender => 'shop@shop.example') AS retry_id \gset
SELECT gatekeeper.nack(c.id, c.attempt, '451 4.3.0 try again later') AS nacked
  FROM gatekeeper.claim('w', 10, queues => '{r_other}') c;
SELECT event, status, source FROM gatekeeper.events WHERE mail_id = :retry_id;
SELECT count(*) > 0 AS events_before_rotation FROM gatekeeper.event_log WHERE mail_id IN (SELECT id FROM sent);
UPDATE gatekeeper.mail_done SET finished_at = now() - interval '30 days';
DO $$
BEGIN
	FOR i IN 1 .. 4 LOOP
		UPDATE gatekeeper.segment SET rotated_at = now() - interval '30 days';
		PERFORM gatekeeper._rotate(interval '1 day');
	END LOOP;
END
$$;
SELECT count(*) AS finished_mail_left FROM gatekeeper.mail_done WHERE id IN (SELECT id FROM sent);
SELECT count(*) AS other_events_left FROM gatekeeper.event_log WHERE mail_id IN (SELECT id FROM sent);
SELECT e.recipient, e.event, e.status, e.segment = (SELECT segment FROM gatekeeper.mail_live WHERE id = :retry_id) AS with_its_mail
  FROM gatekeeper.event_log e WHERE e.mail_id = :retry_id;
SELECT recipient, event FROM gatekeeper.events WHERE mail_id = :retry_id;
