-- A/B by template (issue 48): gatekeeper.events names each mail's
-- template, so a queue whose mail uses several templates can have its
-- outcomes (sent, bounced, deferred, and the reports' events) grouped
-- by template; a mail with its own subject and body has none (NULL).
SET client_min_messages = warning;
\set VERBOSITY terse

SELECT gatekeeper.create_queue('ab_q');
SELECT gatekeeper.create_template('ab_a', 'A: hello {{name}}', 'Variant A for {{name}}');
SELECT gatekeeper.create_template('ab_b', 'B: {{name}}, look', 'Variant B for {{name}}');

-- five of A, three of B, one plain, all due
INSERT INTO gatekeeper.mail (recipient, queue, send_at, template, data)
SELECT 'a' || i || '@example.com', 'ab_q', now() - interval '1 minute', 'ab_a',
	   jsonb_build_object('name', 'A' || i)
  FROM generate_series(1, 5) i;
INSERT INTO gatekeeper.mail (recipient, queue, send_at, template, data)
SELECT 'b' || i || '@example.com', 'ab_q', now() - interval '1 minute', 'ab_b',
	   jsonb_build_object('name', 'B' || i)
  FROM generate_series(1, 3) i;
SELECT gatekeeper.enqueue('p@example.com', 'plain', 'plain body', 'ab_q',
						  now() - interval '1 minute') IS NOT NULL AS enqueued;

-- claim all; a1, a2 bounce (5xx), b1 is deferred (4xx), the rest are sent
CREATE TEMP TABLE ab_claimed AS
SELECT id, attempt, recipient, subject FROM gatekeeper.claim('w', 20, queues => ARRAY['ab_q']);
SELECT recipient, subject FROM ab_claimed ORDER BY recipient;
SELECT count(*) AS nacked FROM (
	SELECT gatekeeper.nack(c.id, c.attempt, '550 5.1.1 user unknown', true)
	  FROM ab_claimed c WHERE c.recipient IN ('a1@example.com', 'a2@example.com')
	UNION ALL
	SELECT gatekeeper.nack(c.id, c.attempt, '451 4.3.0 try later')
	  FROM ab_claimed c WHERE c.recipient = 'b1@example.com') n;
SELECT gatekeeper.ack_batch(array_agg(c.id), array_agg(c.attempt)) AS acked
  FROM ab_claimed c
 WHERE c.recipient NOT IN ('a1@example.com', 'a2@example.com', 'b1@example.com');

-- each event names its mail's template
SELECT recipient, event, template FROM gatekeeper.events
 WHERE queue = 'ab_q' ORDER BY recipient, event;

-- the A/B comparison: outcomes per template
SELECT template,
	   count(*) FILTER (WHERE event = 'sent') AS sent,
	   count(*) FILTER (WHERE event = 'bounced') AS bounced,
	   count(*) FILTER (WHERE event = 'deferred') AS deferred
  FROM gatekeeper.events
 WHERE queue = 'ab_q'
 GROUP BY template ORDER BY template NULLS LAST;

-- and the mail of each template, by state (mail_status)
SELECT template, state, count(*) AS mails
  FROM gatekeeper.mail_status
 WHERE queue = 'ab_q'
 GROUP BY template, state ORDER BY template NULLS LAST, state;
