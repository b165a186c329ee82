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

CREATE FUNCTION pg_temp.error_of(sql text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE sql;
	RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE || ': ' || SQLERRM;
END
$$;

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
