-- Postmark's webhooks (issue 27): their payloads carry Postmark's own
-- MessageID, not the Message-ID gatekeeper wrote, and return the mail's
-- X-PM-Metadata-* headers as Metadata.  A header value holding
-- {message_id} gets the mail's Message-ID at the claim, so
-- 'X-PM-Metadata-gk-message-id: {message_id}' names the mail in every
-- Bounce, SpamComplaint and Delivery webhook, and the docs' statement maps
-- them to record_event() (run here on Postmark's documented payloads).
SET client_min_messages = warning;
\set VERBOSITY terse
CREATE EXTENSION IF NOT EXISTS gatekeeper;

SELECT gatekeeper.create_queue('pm_news');
CREATE TEMP TABLE pm_sent (tag text PRIMARY KEY, id bigint, recipient text, message_id text, header text);
CREATE FUNCTION pg_temp.pm_send(tag text, rcpt text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
	c record;
BEGIN
	PERFORM gatekeeper.enqueue(rcpt, 'Your receipt', 'Hello', queue => 'pm_news', sender => 'shop@shop.example',
							   headers => '{"X-PM-Metadata-gk-message-id": "{message_id}", "X-PM-Tag": "receipt"}');
	SELECT * INTO c FROM gatekeeper.claim('w', 1, queues => '{pm_news}');
	PERFORM gatekeeper.ack(c.id, c.attempt);
	INSERT INTO pm_sent VALUES (tag, c.id, rcpt, c.message_id, c.headers ->> 'X-PM-Metadata-gk-message-id');
END
$$;
SELECT pg_temp.pm_send('hard', 'pm-gone@isp.example');
SELECT pg_temp.pm_send('soft', 'pm-full@isp.example');
SELECT pg_temp.pm_send('spam', 'pm-angry@isp.example');
SELECT pg_temp.pm_send('delivered', 'pm-fine@isp.example');
-- the claim filled the placeholder in; the other header is as given
SELECT tag, header = message_id AS header_is_message_id, message_id ~ '^<[0-9]+\.[a-z2-7]{20}@shop\.example>$' AS shape
  FROM pm_sent ORDER BY tag;
SELECT headers FROM gatekeeper.mail WHERE id = (SELECT id FROM pm_sent WHERE tag = 'hard') AND headers ->> 'X-PM-Tag' = 'receipt'
   AND headers ->> 'X-PM-Metadata-gk-message-id' = '{message_id}';

SELECT (SELECT message_id FROM pm_sent WHERE tag = 'hard') AS pm_hard,
	   (SELECT message_id FROM pm_sent WHERE tag = 'soft') AS pm_soft,
	   (SELECT message_id FROM pm_sent WHERE tag = 'spam') AS pm_spam,
	   (SELECT message_id FROM pm_sent WHERE tag = 'delivered') AS pm_delivered \gset

-- the docs' statement
PREPARE postmark(jsonb) AS
SELECT gatekeeper.record_event(
		 $1 #>> '{Metadata,gk-message-id}',
		 CASE WHEN $1 ->> 'RecordType' = 'SpamComplaint' THEN 'complained'
			  WHEN $1 ->> 'RecordType' = 'Delivery' THEN 'delivered'
			  WHEN $1 ->> 'Type' = 'Transient' THEN 'deferred'
			  ELSE 'bounced' END,
		 CASE $1 ->> 'Type' WHEN 'HardBounce' THEN '5.1.1' WHEN 'BadEmailAddress' THEN '5.1.3' END,
		 coalesce($1 ->> 'Details', $1 ->> 'Description'),
		 coalesce($1 ->> 'Email', $1 ->> 'Recipient'))
 WHERE $1 #>> '{Metadata,gk-message-id}' IS NOT NULL
   AND ($1 ->> 'RecordType' IN ('SpamComplaint', 'Delivery')
		OR ($1 ->> 'RecordType' = 'Bounce'
			AND $1 ->> 'Type' IN ('HardBounce', 'BadEmailAddress', 'SoftBounce', 'DnsError', 'Transient')));

-- Postmark's documented payloads, with our mails' metadata: Bounce and
-- SpamComplaint webhooks share one shape
CREATE FUNCTION pg_temp.pm_bounce(record_type text, id bigint, type text, type_code int, name text,
								  message_id text, gk_message_id text, description text, details text,
								  email text, bounced_at text, dump_available bool, inactive bool,
								  can_activate bool) RETURNS jsonb
LANGUAGE sql AS $$
SELECT jsonb_build_object(
	'RecordType', record_type, 'MessageStream', 'outbound', 'ID', id,
	'Type', type, 'TypeCode', type_code, 'Name', name, 'Tag', 'receipt',
	'MessageID', message_id,
	'Metadata', jsonb_build_object('gk-message-id', gk_message_id),
	'ServerID', 23,
	'Description', description,
	'Details', details,
	'Email', email, 'From', 'shop@shop.example',
	'BouncedAt', bounced_at, 'DumpAvailable', dump_available, 'Inactive', inactive,
	'CanActivate', can_activate, 'Subject', 'Your receipt')
$$;
CREATE TEMP TABLE pm_hard AS EXECUTE postmark(pg_temp.pm_bounce(
	'Bounce', 4323372036854775807, 'HardBounce', 1, 'Hard bounce',
	'883953f4-6105-42a2-a16a-77a8eac79483', :'pm_hard',
	'The server was unable to deliver your message (ex: unknown user, mailbox not found).',
	'smtp;550 5.1.1 The email account that you tried to reach does not exist.',
	'pm-gone@isp.example', '2026-11-25T16:33:54.9070259Z', true, true, true));
CREATE TEMP TABLE pm_soft AS EXECUTE postmark(pg_temp.pm_bounce(
	'Bounce', 4323372036854775808, 'SoftBounce', 4096, 'Soft bounce',
	'9a4c6c1e-33b0-4f2e-8d8e-2f1f1bd4a001', :'pm_soft',
	'Unable to temporarily deliver this email.',
	'smtp;552 5.2.2 Mailbox full',
	'pm-full@isp.example', '2026-11-25T16:40:00Z', false, false, true));
CREATE TEMP TABLE pm_spam AS EXECUTE postmark(pg_temp.pm_bounce(
	'SpamComplaint', 4323372036854775809, 'SpamComplaint', 512, 'Spam complaint',
	'00000000-0000-0000-0000-000000000000', :'pm_spam',
	'', 'Test spam complaint details',
	'pm-angry@isp.example', '2026-11-25T17:00:00Z', true, true, false));
CREATE TEMP TABLE pm_delivered AS EXECUTE postmark(jsonb_build_object(
	'RecordType', 'Delivery', 'ServerID', 23, 'MessageStream', 'outbound',
	'MessageID', '883953f4-6105-42a2-a16a-77a8eac79483',
	'Recipient', 'pm-fine@isp.example', 'Tag', 'receipt',
	'DeliveredAt', '2026-11-25T16:33:54.9070259Z', 'Details', 'Test delivery webhook details',
	'Metadata', jsonb_build_object('gk-message-id', :'pm_delivered')));
-- an auto-responder, a payload without our metadata, a stranger: no call, or NULL
CREATE TEMP TABLE pm_other AS EXECUTE postmark(jsonb_build_object(
	'RecordType', 'Bounce', 'Type', 'AutoResponder', 'TypeCode', 64, 'Email', 'pm-fine@isp.example',
	'Metadata', jsonb_build_object('gk-message-id', :'pm_delivered')));
CREATE TEMP TABLE pm_nometa AS EXECUTE postmark(jsonb_build_object(
	'RecordType', 'Bounce', 'Type', 'HardBounce', 'TypeCode', 1, 'Email', 'pm-fine@isp.example',
	'MessageID', '883953f4-6105-42a2-a16a-77a8eac79483'));
CREATE TEMP TABLE pm_stranger AS EXECUTE postmark(jsonb_build_object(
	'RecordType', 'Bounce', 'Type', 'HardBounce', 'TypeCode', 1, 'Email', 'ceo@isp.example',
	'Metadata', jsonb_build_object('gk-message-id', :'pm_delivered')));
SELECT t.tag, t.n AS calls, t.mail_id = s.id AS the_mail
  FROM (SELECT 'hard' AS tag, count(*) AS n, max(record_event) AS mail_id FROM pm_hard
		UNION ALL SELECT 'soft', count(*), max(record_event) FROM pm_soft
		UNION ALL SELECT 'spam', count(*), max(record_event) FROM pm_spam
		UNION ALL SELECT 'delivered', count(*), max(record_event) FROM pm_delivered
		UNION ALL SELECT 'other', count(*), max(record_event) FROM pm_other
		UNION ALL SELECT 'nometa', count(*), max(record_event) FROM pm_nometa
		UNION ALL SELECT 'stranger', count(*), max(record_event) FROM pm_stranger) t
  LEFT JOIN pm_sent s ON s.tag = t.tag ORDER BY t.tag;
SELECT e.recipient, e.event, e.status, e.source, e.detail FROM gatekeeper.events e
 WHERE e.queue = 'pm_news' AND e.source = 'webhook' ORDER BY e.recipient, e.event;
SELECT address, queue, reason FROM gatekeeper.suppression
 WHERE address LIKE 'pm-%' OR address = 'ceo@isp.example' ORDER BY 1;
