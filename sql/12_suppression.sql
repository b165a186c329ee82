-- The suppression list and one-click unsubscribe (issue 12).
--   suppress/unsuppress: idempotent, addresses compared as the gates
--   compare them (ASCII letters in any case), one queue or every queue.
--   The claim's lookup (gatekeeper._suppressed, the same C function the
--   claim calls): a queue's own entry stops that queue; a global
--   hard_bounce or manual stops every queue; a global unsubscribe or
--   complaint stops every queue but a transactional one.
--   unsubscribe(token): a token signed for (recipient, queue) suppresses the
--   recipient for that queue; forged, altered, truncated tokens are 22023.
SET client_min_messages = warning;
\set VERBOSITY terse

\i sql/error_of.inc
\i sql/window_open.inc

SELECT gatekeeper.create_queue('s_promo');
SELECT gatekeeper.create_queue('s_news');
SELECT gatekeeper.create_queue('s_receipts', transactional => true);

-- new entries are true, repeats false, whatever the case of the address
SELECT gatekeeper.suppress('Bounce@Example.com', 'hard_bounce', detail => '550 5.1.1 no such user') AS new_bounce;
SELECT gatekeeper.suppress('bounce@example.COM', 'hard_bounce') AS repeat_bounce;
SELECT gatekeeper.suppress('unsub@example.com', 'unsubscribe') AS new_global_unsub;
SELECT gatekeeper.suppress('unsub@example.com', 'unsubscribe') AS repeat_global_unsub;
SELECT gatekeeper.suppress('complainer@example.com', 'complaint') AS new_complaint;
SELECT gatekeeper.suppress('blocked@example.com') AS new_manual_default_reason;
SELECT gatekeeper.suppress('promo-only@example.com', 'unsubscribe', 's_promo') AS new_queue_unsub;
SELECT gatekeeper.suppress('promo-only@example.com', 'unsubscribe', 's_promo') AS repeat_queue_unsub;
-- a queue's entry and a global entry are two scopes
SELECT gatekeeper.suppress('both@example.com', 'unsubscribe', 's_news') AS queue_scope,
	   gatekeeper.suppress('both@example.com', 'complaint') AS global_scope;
-- a stronger reason replaces a weaker one in the same scope (not new)
SELECT gatekeeper.suppress('upgrade@example.com', 'unsubscribe') AS first,
	   gatekeeper.suppress('upgrade@example.com', 'hard_bounce', detail => 'later bounce') AS upgraded,
	   gatekeeper.suppress('upgrade@example.com', 'unsubscribe') AS not_downgraded;

SELECT address, queue, reason, detail, mail_id IS NULL AS no_mail, created_at IS NOT NULL AS dated
  FROM gatekeeper.suppression ORDER BY address, queue NULLS FIRST;

-- what the claim does with each (recipient, queue): only suppressed rows come back
SELECT s.recipient, s.queue, s.reason
  FROM gatekeeper._suppressed(
		ARRAY['BOUNCE@example.com', 'bounce@example.com', 'unsub@example.com', 'unsub@example.com',
			  'complainer@example.com', 'complainer@example.com', 'blocked@example.com',
			  'promo-only@example.com', 'promo-only@example.com', 'promo-only@example.com',
			  'both@example.com', 'both@example.com', 'both@example.com',
			  'clean@example.com', 'upgrade@example.com'],
		ARRAY['s_promo', 's_receipts', 's_promo', 's_receipts',
			  's_news', 's_receipts', 's_receipts',
			  's_promo', 's_news', 's_receipts',
			  's_news', 's_promo', 's_receipts',
			  's_promo', 's_receipts']) AS s
 ORDER BY 1, 2;

-- unsuppress names the scope it removes; a second time finds nothing
SELECT gatekeeper.unsuppress('PROMO-ONLY@example.com', 's_promo') AS removed,
	   gatekeeper.unsuppress('promo-only@example.com', 's_promo') AS again,
	   gatekeeper.unsuppress('both@example.com') AS removed_global;
SELECT address, queue, reason FROM gatekeeper.suppression
 WHERE address IN ('promo-only@example.com', 'both@example.com') ORDER BY 1, 2;
SELECT count(*) AS still_suppressed
  FROM gatekeeper._suppressed('{promo-only@example.com,both@example.com,both@example.com}',
							  '{s_promo,s_promo,s_news}');

-- bad input: nothing written
SELECT pg_temp.error_of($$SELECT gatekeeper.suppress('not-an-address', 'manual')$$) AS bad_address;
SELECT pg_temp.error_of($$SELECT gatekeeper.suppress(E'a@example.com\r\nX: y', 'manual')$$) AS crlf_address;
SELECT pg_temp.error_of($$SELECT gatekeeper.suppress('a@example.com', 'bored')$$) AS bad_reason;
SELECT pg_temp.error_of($$SELECT gatekeeper.suppress('a@example.com', 'manual', 'no_such_queue')$$) AS bad_queue;
SELECT pg_temp.error_of($$SELECT gatekeeper.suppress(NULL, 'manual')$$) AS null_address;
SELECT pg_temp.error_of($$SELECT gatekeeper.unsuppress('nope')$$) AS unsuppress_bad_address;
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper._suppressed('{a@example.com}', '{no_such_queue}')$$) AS lookup_bad_queue;
SELECT pg_temp.error_of($$INSERT INTO gatekeeper.suppression_list (address, reason) VALUES ('x@example.com', 'bored')$$) AS table_reason;
SELECT count(*) AS entries FROM gatekeeper.suppression WHERE address LIKE 'a@%' OR address LIKE 'x@%';

-- One-click unsubscribe.  A token is URL-safe and names recipient and queue.
SELECT gatekeeper._unsubscribe_token('Reader@Example.com', 's_promo') AS token \gset
SELECT :'token' ~ '^[A-Za-z0-9_-]+$' AS url_safe,
	   :'token' = gatekeeper._unsubscribe_token('reader@example.com', 's_promo') AS same_for_any_case,
	   :'token' <> gatekeeper._unsubscribe_token('reader@example.com', 's_news') AS differs_by_queue;
SELECT gatekeeper.unsubscribe(:'token') AS unsubscribed, gatekeeper.unsubscribe(:'token') AS again;
SELECT address, queue, reason, detail FROM gatekeeper.suppression WHERE address = 'reader@example.com';
SELECT s.queue, s.reason
  FROM gatekeeper._suppressed('{reader@example.com,reader@example.com}', '{s_promo,s_news}') AS s;

-- forged, altered and truncated tokens are refused, and write nothing
SELECT gatekeeper._unsubscribe_token('victim@example.com', 's_promo') AS victim \gset
SELECT pg_temp.error_of(format('SELECT gatekeeper.unsubscribe(%L)', left(:'victim', -1))) AS truncated_1;
SELECT pg_temp.error_of(format('SELECT gatekeeper.unsubscribe(%L)', left(:'victim', -10))) AS truncated_10;
SELECT pg_temp.error_of(format('SELECT gatekeeper.unsubscribe(%L)', left(:'victim', 20))) AS prefix_only;
SELECT pg_temp.error_of(format('SELECT gatekeeper.unsubscribe(%L)',
		left(:'victim', 10) || translate(substr(:'victim', 11, 1), 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_',
										 'BCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_A') || substr(:'victim', 12))) AS altered_payload;
SELECT pg_temp.error_of(format('SELECT gatekeeper.unsubscribe(%L)',
		left(:'victim', -2) || CASE WHEN right(:'victim', 2) = 'AA' THEN 'BA' ELSE 'AA' END)) AS altered_mac;
SELECT pg_temp.error_of($$SELECT gatekeeper.unsubscribe('')$$) AS empty;
SELECT pg_temp.error_of($$SELECT gatekeeper.unsubscribe('not a token!')$$) AS not_base64;
SELECT pg_temp.error_of($$SELECT gatekeeper.unsubscribe(repeat('A', 10000))$$) AS long_garbage;
-- a token for another recipient with the victim's MAC: the MAC covers the payload
SELECT pg_temp.error_of(format('SELECT gatekeeper.unsubscribe(%L)',
		left(gatekeeper._unsubscribe_token('victin@example.com', 's_promo'), -43) || right(:'victim', 43))) AS swapped_mac;
SELECT count(*) AS victim_entries FROM gatekeeper.suppression WHERE address = 'victim@example.com';
-- a new secret (another database's, say): old tokens no longer verify
BEGIN;
INSERT INTO gatekeeper.unsubscribe_secret (secret) VALUES (gatekeeper._new_secret());
SELECT count(*) AS secrets FROM gatekeeper.unsubscribe_secret;
SELECT pg_temp.error_of(format('SELECT gatekeeper.unsubscribe(%L)', :'victim')) AS other_secret;
ROLLBACK;
SELECT gatekeeper.unsubscribe(:'victim') AS genuine;

-- the secret is the owner's alone
SELECT has_table_privilege('public', 'gatekeeper.unsubscribe_secret', 'SELECT') AS public_reads_secret,
	   has_function_privilege('public', 'gatekeeper.unsubscribe(text)', 'EXECUTE') AS public_unsubscribes;

-- The claim consults the list, in the same transaction as the gates: a
-- suppressed mail becomes suppressed with the reason in last_error, is not
-- returned, and takes no gate pass.
SELECT gatekeeper.create_queue('c_promo', gates => '{smart_sending}',
							   unsubscribe_url => 'https://shop.example.com/u/{token}');
SELECT gatekeeper.create_queue('c_receipts', transactional => true);
SELECT gatekeeper.suppress('c-bounced@example.com', 'hard_bounce');
SELECT gatekeeper.suppress('c-unsub@example.com', 'unsubscribe');
SELECT gatekeeper.suppress('c-promo-only@example.com', 'unsubscribe', 'c_promo');
SELECT count(gatekeeper.enqueue(r || '@example.com', 'Hi', 'Body', queue => q, recipient_name => n,
								metadata => jsonb_build_object('campaign', q, 'who', r),
								headers => h)) AS enqueued
  FROM (VALUES ('C-Bounced', 'c_promo', NULL, NULL::jsonb), ('c-bounced', 'c_receipts', NULL, NULL),
			   ('c-unsub', 'c_promo', NULL, NULL), ('c-unsub', 'c_receipts', 'Ünsub Ëd', NULL),
			   ('c-promo-only', 'c_promo', NULL, NULL), ('c-promo-only', 'c_receipts', NULL, NULL),
			   ('c-fine', 'c_promo', 'Fine "Reader"', '{"X-Campaign": "7"}'),
			   ('c-own', 'c_promo', NULL, '{"list-unsubscribe": "<https://other.example/u>"}')) AS v(r, q, n, h);
CREATE TEMP TABLE claimed AS
SELECT * FROM gatekeeper.claim('w', 100, queues => '{c_promo,c_receipts}');
SELECT c.queue, c.recipient, c.recipient_name, c.metadata,
	   c.headers - 'List-Unsubscribe' AS other_headers,
	   c.headers ->> 'List-Unsubscribe' ~ '^<https://shop\.example\.com/u/[A-Za-z0-9_-]+>$' AS list_unsubscribe
  FROM claimed AS c
 ORDER BY 1, 2;
SELECT queue, recipient, state, attempt, last_error FROM gatekeeper.mail_status
 WHERE queue IN ('c_promo', 'c_receipts') AND state = 'suppressed' ORDER BY 1, 2;
-- suppressed mail is finished: it left mail_live for mail_done
SELECT count(*) FILTER (WHERE l.id IS NOT NULL) AS still_live, count(*) FILTER (WHERE d.id IS NOT NULL) AS done
  FROM gatekeeper.mail_status s
  LEFT JOIN gatekeeper.mail_live l ON l.id = s.id
  LEFT JOIN gatekeeper.mail_done d ON d.id = s.id
 WHERE s.queue IN ('c_promo', 'c_receipts') AND s.state = 'suppressed';
-- suppressed mail took no pass of smart_sending: the gate is still open
SELECT r, gatekeeper.gate_open('smart_sending', r) AS open
  FROM unnest(ARRAY['c-bounced@example.com', 'c-unsub@example.com', 'c-promo-only@example.com',
					'c-fine@example.com']) AS r ORDER BY r;

-- the token in the claimed List-Unsubscribe unsubscribes that reader from that queue
SELECT substring(c.headers ->> 'List-Unsubscribe' FROM '/u/([A-Za-z0-9_-]+)>$') AS claimed_token
  FROM claimed c WHERE c.recipient = 'c-fine@example.com' \gset
SELECT gatekeeper.unsubscribe(:'claimed_token') AS unsubscribed;
SELECT address, queue, reason FROM gatekeeper.suppression WHERE address = 'c-fine@example.com';

-- Hard bounces.  nack(..., permanent => true) with the relay's reply adds a
-- global hard_bounce entry when the reply says the address does not exist
-- (user_unknown, host_unknown), read by the one classifier the reports use
-- too (src/smtp_trouble.c, gatekeeper._bounce_reason, issue 49): from the
-- RFC 3463 code and the words together, so that a mailbox full, a block or
-- spam is never hard whatever code the server put on it; 550, 551 and 553
-- without an enhanced code are; a refusal of the MAIL FROM never is.
SELECT e, gatekeeper._bounce_reason(e, e) AS reason,
	   gatekeeper._bounce_reason(e, e) IN ('user_unknown', 'host_unknown') AS hard_bounce
  FROM unnest(ARRAY['550 5.1.1 <x@example.com>: Recipient address rejected: User unknown',
					'550-5.1.1 The email account that you tried to reach does not exist',
					'550 5.1.2 bad destination system', '553 5.1.3 bad address syntax',
					'550 5.1.6 mailbox moved', '550 5.1.10 null MX',
					'550 5.1.100 unknown', '550 5.7.1 spam', '554 5.7.1 relay access denied',
					'550 5.2.2 mailbox full', '552 5.2.2 over quota', '550 no such user', '551 user not local',
					'553 mailbox name not allowed', '554 transaction failed', '450 4.1.1 try later',
					'5.1.1 no code first', 'mailbox unknown 550 5.1.1',
					-- the code says one thing, the words another
					'550 5.1.1 <x@example.com>: mailbox full',
					'550 5.1.1 message blocked as spam',
					'550 5.1.1 Mailbox quota exceeded',
					'550 5.1.351 Remote server returned an error',
					'550 5.4.4 SMTPSEND.DNS.NonExistentDomain; host unknown',
					'550 5.5.0 Requested action not taken: mailbox unavailable',
					'550 5.0.0 <x@example.com>... User unknown',
					'550 5.0.0 Host unknown',
					-- other reasons
					'552 5.3.4 Message size exceeds fixed limit',
					'421 4.7.28 Our system has detected an unusual rate of unsolicited mail',
					'550 5.7.26 This message does not pass authentication checks (SPF and DKIM)',
					'550 5.7.1 Service unavailable; client host blocked using Spamhaus',
					'451 4.3.0 Temporary local problem',
					'554 5.4.7 delivery time expired',
					-- as src/smtp_txn.c writes a refusal: the relay's name is no word of it
					'550 5.1.1 <x@example.com>: User unknown (relay spam.example:25, reply to RCPT TO)',
					'relay mx.example:25 refused MAIL FROM: 553 5.1.8 <s@shop.example>: Sender address rejected: Domain not found',
					'relay mx.example:25 refused the message: 550 5.1.1 user unknown']) AS e;
SELECT gatekeeper.create_queue('b_news');
SELECT gatekeeper.create_queue('b_other');
SELECT count(gatekeeper.enqueue(r || '@bounce.example', 'Hi', 'Body', queue => 'b_news')) AS enqueued
  FROM unnest(ARRAY['dead', 'policy', 'retry', 'plain', 'full']) AS r;
SELECT count(*) AS claimed FROM gatekeeper.claim('w', 100, queues => '{b_news}');
SELECT m.recipient,
	   gatekeeper.nack(m.id, m.attempt,
					   CASE m.recipient
						   WHEN 'dead@bounce.example' THEN '550 5.1.1 <dead@bounce.example>: User unknown'
						   WHEN 'policy@bounce.example' THEN '550 5.7.1 message refused as spam'
						   WHEN 'retry@bounce.example' THEN '550 5.1.1 user unknown'
						   WHEN 'full@bounce.example' THEN '550 5.1.1 <full@bounce.example>: mailbox full'
						   ELSE '550 no such user here' END,
					   permanent => m.recipient <> 'retry@bounce.example') AS nack
  FROM gatekeeper.mail_status m WHERE m.queue = 'b_news' ORDER BY m.recipient;
-- each failure's event says why: the full mailbox is no hard bounce
SELECT e.recipient, e.event, e.status, e.reason FROM gatekeeper.events e
 WHERE e.queue = 'b_news' AND e.event <> 'sent' ORDER BY 1;
SELECT s.address, s.queue, s.reason, s.detail, s.mail_id = m.id AS bounced_mail
  FROM gatekeeper.suppression s JOIN gatekeeper.mail m ON m.recipient = s.address AND m.queue = 'b_news'
 ORDER BY 1;
-- the next mail to a bounced address, in another queue, never goes
SELECT count(gatekeeper.enqueue(r || '@bounce.example', 'Again', 'Body', queue => 'b_other')) AS enqueued
  FROM unnest(ARRAY['dead', 'policy', 'plain']) AS r;
SELECT recipient FROM gatekeeper.claim('w', 100, queues => '{b_other}') ORDER BY 1;
SELECT recipient, state, last_error FROM gatekeeper.mail_status WHERE queue = 'b_other' ORDER BY 1;

-- Sending windows in the claim: due mail outside its window is deferred to
-- the next opening in its zone (the mail's, else the queue's), uncharged;
-- one whose opening comes after its send_by expires.  The window is made
-- to exclude now(): it opens in an hour, in UTC.
SELECT to_char(now() AT TIME ZONE 'UTC' + interval '1 hour', 'HH24:MI') || '-' ||
	   to_char(now() AT TIME ZONE 'UTC' + interval '2 hours', 'HH24:MI') AS later_window \gset
SELECT gatekeeper.create_queue('w_later', send_window => :'later_window', timezone => 'UTC');
SELECT gatekeeper.create_queue('w_open', send_window => '00:00-24:00', timezone => 'Asia/Tokyo');
SELECT gatekeeper.enqueue('w-wait@example.com', 'Hi', 'Body', queue => 'w_later') > 0 AS enqueued;
SELECT gatekeeper.enqueue('w-zone@example.com', 'Hi', 'Body', queue => 'w_later', timezone => 'Asia/Kolkata') > 0 AS enqueued;
SELECT gatekeeper.enqueue('w-late@example.com', 'Hi', 'Body', queue => 'w_later', send_by => now() + interval '30 minutes') > 0 AS enqueued;
SELECT gatekeeper.enqueue('w-go@example.com', 'Hi', 'Body', queue => 'w_open') > 0 AS enqueued;
SELECT recipient FROM gatekeeper.claim('w', 100, queues => '{w_later,w_open}') ORDER BY 1;
SELECT m.recipient, m.state, m.attempt,
	   m.send_at = pg_temp._window_open(:'later_window', coalesce(m.timezone, 'UTC'), now()) AS at_opening,
	   m.send_at > now() AS later,
	   regexp_replace(m.last_error, '\d\d:\d\d-\d\d:\d\d', 'HH:MM-HH:MM') AS last_error
  FROM gatekeeper.mail_status m WHERE m.queue IN ('w_later', 'w_open') ORDER BY 1;

-- gatekeeper.max_message_size (10MB here) counts the RFC 8058 header lines
-- the claim adds to the mail of a queue with an unsubscribe_url: a mail at
-- the limit elsewhere is over it there, and fits with those octets fewer;
-- a mail that brings its own List-Unsubscribe is charged its own headers
-- only.  The same trigger checks enqueue, INSERT and COPY.
SELECT gatekeeper.create_queue('m_plain');
SELECT gatekeeper.create_queue('m_unsub', unsubscribe_url => 'https://shop.example.com/u/{token}?list=m');
SELECT octet_length('List-Unsubscribe: <' ||
					replace('https://shop.example.com/u/{token}?list=m', '{token}',
							gatekeeper._unsubscribe_token('Max@Example.com', 'm_unsub')) || E'>\r\n' ||
					E'List-Unsubscribe-Post: List-Unsubscribe=One-Click\r\n') AS added \gset
SELECT :added > 150 AS added_over_150;
BEGIN;
SELECT gatekeeper.enqueue('Max@Example.com', 's', repeat('x', 10 * 1024 * 1024 - 1), 'm_plain') > 0 AS plain_at_the_limit;
SELECT pg_temp.error_of($$SELECT gatekeeper.enqueue('Max@Example.com', 's', repeat('x', 10 * 1024 * 1024 - 1), 'm_unsub')$$) AS unsub_over;
SELECT gatekeeper.enqueue('Max@Example.com', 's', repeat('x', 10 * 1024 * 1024 - 1 - :added), 'm_unsub') > 0 AS unsub_at_the_limit;
SELECT pg_temp.error_of(format($$SELECT gatekeeper.enqueue('Max@Example.com', 's', repeat('x', %s), 'm_unsub')$$,
							   10 * 1024 * 1024 - :added)) AS unsub_one_over;
SELECT pg_temp.error_of(format($$INSERT INTO gatekeeper.mail (recipient, subject, body, queue)
	VALUES ('Max@Example.com', 's', repeat('x', %s), 'm_unsub')$$, 10 * 1024 * 1024 - :added)) AS insert_one_over;
SELECT gatekeeper.enqueue('Max@Example.com', 's', repeat('x', 10 * 1024 * 1024 - 1 - 150), 'm_unsub',
						  headers => '{"List-Unsubscribe": "<https://own.example/u>"}') > 0 AS own_header_fits;
ROLLBACK;
