-- Queue delivery options, sending windows and display names (issue 12).
--   create_queue/alter_queue: transactional, unsubscribe_url (https, with
--   {token} once, fits a header line), send_window ('HH:MM-HH:MM', may
--   wrap midnight, 00:00-24:00 all day), timezone (IANA names only).
--   _window_open (sql/window_open.inc): the claim's computation of a window's next
--   opening, at fixed times, across midnight and daylight saving changes.
--   gatekeeper._mailbox: senders with display names, and the From/To field
--   written for them (quoted-string, RFC 2047 encoded-words when not ASCII).
SET client_min_messages = warning;
\set VERBOSITY terse

\i sql/error_of_detail.inc
\i sql/window_open.inc

-- Queue options
SELECT gatekeeper.create_queue('o_promo', unsubscribe_url => 'https://shop.example.com/unsubscribe?t={token}&src=mail',
							   send_window => '09:00-20:00', timezone => 'Europe/Paris');
SELECT gatekeeper.create_queue('o_receipts', transactional => true);
SELECT gatekeeper.create_queue('o_night', send_window => '21:00-08:00', timezone => 'America/New_York');
SELECT gatekeeper.create_queue('o_always', send_window => '00:00-24:00');
SELECT name, transactional, unsubscribe_url, send_window, timezone
  FROM gatekeeper.queue WHERE name LIKE 'o\_%' OR name = 'default' ORDER BY name;

-- alter_queue: NULL leaves a setting, '' removes the URL and the window
SELECT gatekeeper.alter_queue('o_promo', send_window => '08:30-21:15');
SELECT gatekeeper.alter_queue('o_receipts', transactional => false, timezone => 'Asia/Tokyo');
SELECT gatekeeper.alter_queue('o_always', send_window => '', unsubscribe_url => 'https://x.example/{token}');
SELECT gatekeeper.alter_queue('o_always', unsubscribe_url => '');
SELECT name, transactional, unsubscribe_url, send_window, timezone
  FROM gatekeeper.queue WHERE name LIKE 'o\_%' ORDER BY name;

-- bad options are refused, and nothing is written
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('o_bad', unsubscribe_url => 'http://shop.example.com/u/{token}')$$) AS http_url;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('o_bad', unsubscribe_url => 'https://shop.example.com/u/')$$) AS no_token;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('o_bad', unsubscribe_url => 'https://shop.example.com/{token}/{token}')$$) AS two_tokens;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('o_bad', unsubscribe_url => 'https://{token}.example.com/')$$) AS token_in_host;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('o_bad', unsubscribe_url => 'https:///u/{token}')$$) AS no_host;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('o_bad', unsubscribe_url => 'https://shop.example.com/u /{token}')$$) AS space_in_url;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('o_bad', unsubscribe_url => E'https://shop.example.com/{token}\r\nBcc: x@example.com')$$) AS crlf_in_url;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('o_bad', unsubscribe_url => 'https://shop.example.com/désabonner/{token}')$$) AS non_ascii_url;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('o_bad', unsubscribe_url => 'https://shop.example.com/' || repeat('a', 500) || '/{token}')$$) AS too_long_url;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('o_bad', send_window => '9:00-17:00')$$) AS one_digit_hour;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('o_bad', send_window => '09:00-25:00')$$) AS hour_25;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('o_bad', send_window => '09:60-17:00')$$) AS minute_60;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('o_bad', send_window => '24:00-08:00')$$) AS opens_at_24;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('o_bad', send_window => '09:00-09:00')$$) AS empty_window;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('o_bad', send_window => '09:00 - 17:00')$$) AS spaces;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('o_bad', send_window => 'nine to five')$$) AS words;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('o_bad', timezone => 'Mars/Olympus_Mons')$$) AS unknown_zone;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('o_bad', timezone => 'UTC+3')$$) AS posix_spec;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('o_bad', timezone => '<+03>-3')$$) AS posix_angle;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('o_bad', timezone => '')$$) AS empty_zone;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('o_bad', timezone => NULL)$$) AS null_zone;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_queue('o_bad', transactional => NULL)$$) AS null_transactional;
SELECT pg_temp.error_of($$SELECT gatekeeper.alter_queue('o_promo', send_window => '20:00-20:00')$$) AS alter_empty_window;
SELECT pg_temp.error_of($$SELECT gatekeeper.alter_queue('o_promo', timezone => 'Nowhere')$$) AS alter_zone;
SELECT pg_temp.error_of($$SELECT gatekeeper.alter_queue('o_promo', unsubscribe_url => 'mailto:u@example.com')$$) AS alter_url;
SELECT count(*) AS bad_queues FROM gatekeeper.queue WHERE name = 'o_bad';
SELECT send_window, timezone, unsubscribe_url FROM gatekeeper.queue WHERE name = 'o_promo';
-- IANA names in any case, and zones with digits that are real zone files
SELECT pg_temp.error_of($$SELECT gatekeeper._check_window(NULL, 'europe/paris')$$) AS lower_case_zone,
	   pg_temp.error_of($$SELECT gatekeeper._check_window(NULL, 'Etc/GMT+5')$$) AS etc_zone,
	   pg_temp.error_of($$SELECT gatekeeper._check_window(NULL, 'EST5EDT')$$) AS legacy_zone;
-- Names PostgreSQL's time zone database has no file for are refused
-- however they are shaped (issue 25 item 13): a slash used to let a POSIX
-- offset through ('Etc/GMT+14' is no zone: the extremes are Etc/GMT-14
-- and Etc/GMT+12), for a queue's zone and a mail's alike
SELECT z, pg_temp.error_of(format('SELECT gatekeeper.create_queue(%L, timezone => %L)', 'o_zone ' || z, z)) AS queue_zone
  FROM unnest(ARRAY['Etc/GMT+14', 'Foo/Bar+5', 'A/B-3', 'Europe/Paris+1', 'Etc/GMT+13',
					'Etc/GMT-14', 'Etc/GMT+12', 'etc/gmt-3', 'UTC', 'cet']) z
 ORDER BY z;
SELECT name, timezone FROM gatekeeper.queue WHERE name LIKE 'o\_zone %' ORDER BY name;
SELECT count(gatekeeper.drop_queue(name)) AS dropped FROM gatekeeper.queue WHERE name LIKE 'o\_zone %';
SELECT pg_temp.error_of($$SELECT gatekeeper.alter_queue('o_promo', timezone => 'Etc/GMT+14')$$) AS alter_slash_zone;
SELECT pg_temp.error_of($$SELECT gatekeeper.enqueue('tz@example.com', 'Hi', 'Body', timezone => 'Foo/Bar+5')$$) AS mail_slash_zone;
SELECT pg_temp.error_of($$INSERT INTO gatekeeper.mail (recipient, subject, body, timezone)
						  VALUES ('tz@example.com', 'Hi', 'Body', 'Asia/Tokyo'), ('tz2@example.com', 'Hi', 'Body', 'A/B-3')$$) AS bulk_slash_zone;
SELECT count(*) AS mail_to_tz FROM gatekeeper.mail WHERE recipient LIKE 'tz%@example.com';

-- Sending windows at fixed times.  _window_open returns the time itself
-- when it is inside, else the window's next opening; shown in UTC.
SET TimeZone = 'UTC';
SELECT w, tz, at, pg_temp._window_open(w, tz, at) AS opens
  FROM (VALUES
	-- a day window: inside, before it, at its opening, at its closing, after it
	('09:00-20:00', 'UTC', timestamptz '2026-06-10 12:00Z'),
	('09:00-20:00', 'UTC', timestamptz '2026-06-10 03:00Z'),
	('09:00-20:00', 'UTC', timestamptz '2026-06-10 09:00Z'),
	('09:00-20:00', 'UTC', timestamptz '2026-06-10 20:00Z'),
	('09:00-20:00', 'UTC', timestamptz '2026-06-10 23:59:59Z'),
	-- in a zone: 09:00 in Tokyo is 00:00 UTC
	('09:00-20:00', 'Asia/Tokyo', timestamptz '2026-06-10 12:00Z'),
	-- a window that wraps midnight: late evening and early morning inside, midday not
	('21:00-08:00', 'UTC', timestamptz '2026-06-10 22:30Z'),
	('21:00-08:00', 'UTC', timestamptz '2026-06-10 07:59Z'),
	('21:00-08:00', 'UTC', timestamptz '2026-06-10 08:00Z'),
	('21:00-08:00', 'UTC', timestamptz '2026-06-10 13:00Z'),
	('22:00-24:00', 'UTC', timestamptz '2026-06-10 23:30Z'),
	('22:00-24:00', 'UTC', timestamptz '2026-06-11 00:00Z'),
	-- all day
	('00:00-24:00', 'UTC', timestamptz '2026-06-10 03:00Z'),
	('00:00-24:00', 'Pacific/Kiritimati', timestamptz '2026-06-10 03:00Z'),
	-- Paris springs forward on 2026-03-29 at 02:00 (UTC+1 to UTC+2): the
	-- 09:00 opening before is 08:00 UTC, the one after is 07:00 UTC
	('09:00-20:00', 'Europe/Paris', timestamptz '2026-03-27 21:00Z'),
	('09:00-20:00', 'Europe/Paris', timestamptz '2026-03-28 21:00Z'),
	-- and falls back on 2026-10-25 at 03:00: 09:00 is 08:00 UTC again
	('09:00-20:00', 'Europe/Paris', timestamptz '2026-10-24 21:00Z'),
	-- a window that lies in the spring-forward gap has no opening that day
	('02:15-02:45', 'Europe/Paris', timestamptz '2026-03-28 23:00Z'),
	-- a window that starts in the gap opens when the gap ends (03:00 CEST)
	('02:30-04:00', 'Europe/Paris', timestamptz '2026-03-28 23:00Z'),
	-- New York springs forward on 2026-03-08: 21:00 EDT is 01:00 UTC
	('21:00-08:00', 'America/New_York', timestamptz '2026-03-08 12:00Z'),
	('21:00-08:00', 'America/New_York', timestamptz '2026-03-07 12:00Z'),
	-- no window: always now
	(NULL, 'Europe/Paris', timestamptz '2026-06-10 03:00Z')
  ) AS v(w, tz, at)
 ORDER BY tz NULLS FIRST, w NULLS FIRST, at;
SELECT pg_temp.error_of($$SELECT pg_temp._window_open('09:00-20:00', 'Atlantis', now())$$) AS bad_zone,
	   pg_temp.error_of($$SELECT pg_temp._window_open('09-20', 'UTC', now())$$) AS bad_window;
RESET TimeZone;

-- Display names.  The address is what the envelope and Message-ID use.
SELECT m.address, m.display_name, m.field
  FROM (VALUES ('shop@example.com'), ('<shop@example.com>'), ('Shop <shop@example.com>'),
			   ('  Shop Name   <shop@example.com>  '), ('"Shop, Inc." <shop@example.com>'),
			   ('"Say \"Hi\" \\o/" <shop@example.com>'), ('Shop "Best" Name <shop@example.com>'),
			   ('"" <shop@example.com>'), ('Émile <emile@example.com>'),
			   ('Shop Émile <shop@example.com>')) AS v(s),
	   LATERAL gatekeeper._mailbox(v.s) AS m
 ORDER BY 3;
-- recipient_name: the To field
SELECT m.field FROM gatekeeper._mailbox('ann@example.com', 'Ann O''Neil') AS m;
SELECT m.field FROM gatekeeper._mailbox('ann@example.com', '安妮') AS m;
-- a long non-ASCII name: encoded-words of at most 75 characters, lines of at
-- most 78 (the first after "From: "), no character split, decoding to the name
SELECT n AS name, f.field
  FROM (VALUES (repeat('Zoë ', 12) || '日本語テキストの表示名')) AS v(n),
	   LATERAL gatekeeper._mailbox('long@example.com', v.n) AS f;
SELECT max(length(w)) <= 75 AS words_fit,
	   bool_and(octet_length(l) <= 78) AS lines_fit
  FROM (SELECT 'From: ' || (gatekeeper._mailbox('long@example.com', repeat('Zoë ', 12) || '日本語テキストの表示名')).field AS f) AS x,
	   LATERAL regexp_split_to_table(x.f, E'\r\n') AS l,
	   LATERAL regexp_matches(l, '=\?UTF-8\?B\?[A-Za-z0-9+/=]*\?=', 'g') AS mm(w0),
	   LATERAL (SELECT mm.w0[1]) AS ww(w);
SELECT string_agg(convert_from(decode(m[1], 'base64'), 'UTF8'), '' ORDER BY o) =
	   repeat('Zoë ', 12) || '日本語テキストの表示名' AS decodes_intact
  FROM regexp_matches((gatekeeper._mailbox('long@example.com', repeat('Zoë ', 12) || '日本語テキストの表示名')).field,
					  '=\?UTF-8\?B\?([A-Za-z0-9+/=]*)\?=', 'g') WITH ORDINALITY AS r(m, o);

-- bad names and mailboxes
SELECT pg_temp.error_of($$SELECT gatekeeper._mailbox(E'Shop\r\nBcc: x@example.com <shop@example.com>')$$) AS crlf_name;
SELECT pg_temp.error_of($$SELECT gatekeeper._mailbox(E'Shop\u0007 <shop@example.com>')$$) AS bell_in_name;
SELECT pg_temp.error_of($$SELECT gatekeeper._mailbox(E'Shop\u0085 <shop@example.com>')$$) AS c1_in_name;
SELECT pg_temp.error_of($$SELECT gatekeeper._mailbox(E'Shop\tName <shop@example.com>')$$) AS tab_in_name;
SELECT pg_temp.error_of($$SELECT gatekeeper._mailbox('Shop <shop@example.com')$$) AS unclosed;
SELECT pg_temp.error_of($$SELECT gatekeeper._mailbox('Shop shop@example.com>')$$) AS unopened;
SELECT pg_temp.error_of($$SELECT gatekeeper._mailbox('"Shop <shop@example.com>')$$) AS open_quote;
SELECT pg_temp.error_of($$SELECT gatekeeper._mailbox('"Sh"op" <shop@example.com>')$$) AS inner_quote;
SELECT pg_temp.error_of($$SELECT gatekeeper._mailbox('Shop <not-an-address>')$$) AS bad_address;
SELECT pg_temp.error_of($$SELECT gatekeeper._mailbox('Shop <>')$$) AS empty_address;
SELECT regexp_replace(pg_temp.error_of(format('SELECT gatekeeper._mailbox(%L)', repeat('n', 257) || ' <shop@example.com>')), 'n+ <', 'n...n <') AS long_name;
SELECT pg_temp.error_of($$SELECT gatekeeper._mailbox('ann@example.com', E'Ann\nBcc: x@example.com')$$) AS crlf_recipient_name;
SELECT pg_temp.error_of(format('SELECT gatekeeper._mailbox(%L)', repeat('n', 256) || ' <shop@example.com>')) AS longest_name;
