-- Header validation at enqueue (issue 9, defect 9): what would go on the
-- wire malformed is refused with its SQLSTATE, and nothing is written.
--   22023 invalid_parameter_value   54000 program_limit_exceeded
SET client_min_messages = warning;
\set VERBOSITY terse

CREATE FUNCTION pg_temp.try_headers(headers jsonb, subject text DEFAULT 'Subject')
RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
	PERFORM gatekeeper.enqueue('ok@example.com', subject, 'Body', 'hdr', headers => headers);
	RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE || ': ' || SQLERRM;
END
$$;

SELECT gatekeeper.create_queue('hdr');

-- the same header twice, in different case
SELECT pg_temp.try_headers('{"Reply-To": "a@shop.example", "reply-to": "b@shop.example"}') AS reply_to_twice;
SELECT pg_temp.try_headers('{"X-Tag": "1", "x-tag": "2", "X-TAG": "3"}') AS x_tag_thrice;
SELECT pg_temp.try_headers('{"X-Tag": "1", "X-Tags": "2"}') AS similar_names;

-- every Content-* header is gatekeeper's
SELECT v AS name, pg_temp.try_headers(jsonb_build_object(v, 'x')) AS result
  FROM unnest(ARRAY['Content-ID', 'Content-Language', 'Content-Description',
					'content-location', 'CONTENT-TYPE', 'Content-', 'Contentious']) AS v
 ORDER BY v;

-- control characters, in angle brackets or not, in a header value or the subject
SELECT d AS value, pg_temp.try_headers(jsonb_build_object('List-Unsubscribe', v)) AS result
  FROM (VALUES ('<https://shop.example/u?x=\x01>', E'<https://shop.example/u?x=\x01>'),
			   ('<https://shop.example/u?x=\x7f>', E'<https://shop.example/u?x=\x7f>'),
			   ('plain \x02 text', E'plain \x02 text'),
			   ('C1 U+0085 in text', E'a \u0085 b'),
			   ('tab', E'<mailto:u@shop.example>,\t<https://shop.example/u>')) AS t(d, v)
 ORDER BY d;
SELECT pg_temp.try_headers(NULL, E'Hello \x1b[31m') AS escape_in_subject;
SELECT pg_temp.try_headers(NULL, E'Hello \x7f') AS del_in_subject;

-- non-ASCII: encoded in text, refused in angle brackets (no encoding is valid there)
SELECT pg_temp.try_headers('{"List-Unsubscribe": "<https://shop.example/désabonner>"}') AS utf8_in_brackets;
SELECT pg_temp.try_headers('{"X-Note": "déjà vu <ok@shop.example>"}') AS utf8_in_text;

-- lines over 998 octets: a run that cannot be folded is refused
SELECT pg_temp.try_headers(jsonb_build_object('List-Unsubscribe',
	'<https://shop.example/u/' || repeat('x', 3000) || '>')) AS one_url_3000;
SELECT pg_temp.try_headers(jsonb_build_object('List-Unsubscribe',
	'<https://shop.example/u/' || repeat('x', 875) || '>')) AS one_url_900;
SELECT pg_temp.try_headers(jsonb_build_object('List-Unsubscribe',
	'<https://shop.example/u/' || repeat('x', 876) || '>')) AS one_url_901;
SELECT pg_temp.try_headers(jsonb_build_object('List-Unsubscribe',
	array_to_string(array_fill('<https://shop.example/u/0123456789abcdef>'::text, ARRAY[70]), ', '))) AS many_urls_3000;
SELECT pg_temp.try_headers(NULL, 'a' || repeat(' ', 1500) || 'b') AS spaces_1500;
SELECT pg_temp.try_headers(jsonb_build_object('X-Pad', 'a' || repeat(E'\t', 79) || 'b')) AS tabs_79;
SELECT pg_temp.try_headers(NULL, 'a' || repeat(' ', 78) || 'b') AS spaces_78;
SELECT pg_temp.try_headers(NULL, repeat('word ', 600)) AS long_subject_of_words;
SELECT pg_temp.try_headers(NULL, repeat('x', 3000)) AS long_word_is_encoded;

-- nothing refused above was written
SELECT count(*) AS written, count(*) FILTER (WHERE headers ? 'reply-to' OR headers ? 'Content-ID') AS bad_written
  FROM gatekeeper.mail WHERE queue = 'hdr';

-- gatekeeper.default_sender is an address, or a display name and an address
ALTER SYSTEM SET gatekeeper.default_sender = 'Shop <shop@example.com>';
ALTER SYSTEM SET gatekeeper.default_sender = '"Shop, Émile" <shop@example.com>';
ALTER SYSTEM SET gatekeeper.default_sender = 'Shop <shop@@example.com>';
ALTER SYSTEM SET gatekeeper.default_sender = E'Shop\x01 <shop@example.com>';
ALTER SYSTEM SET gatekeeper.default_sender = 'shop@@example.com';
ALTER SYSTEM SET gatekeeper.default_sender = 'shop@example.com';
ALTER SYSTEM RESET gatekeeper.default_sender;

-- gatekeeper.smtp_url carries no credentials: the password is in a file
ALTER SYSTEM SET gatekeeper.smtp_url = 'smtp://mailer:Secret-1@127.0.0.1:2525';
ALTER SYSTEM SET gatekeeper.smtp_url = 'smtps://mailer@relay.example:465';
ALTER SYSTEM SET gatekeeper.smtp_url = 'smtp://127.0.0.1:2525';
-- nor anything else the worker could not use: refused when set, not found
-- out by the worker alone
ALTER SYSTEM SET gatekeeper.smtp_url = 'http://127.0.0.1:27601';
ALTER SYSTEM SET gatekeeper.smtp_url = 'relay.example:25';
ALTER SYSTEM SET gatekeeper.smtp_url = 'smtp://a.example:25,smtp://b.example:25';
-- a list of relays (0.3.0) is refused as a whole when one of them is unusable
ALTER SYSTEM SET gatekeeper.smtp_url = 'smtp://a.example:25, http://b.example:25';
ALTER SYSTEM SET gatekeeper.smtp_url = 'smtp://a.example:25,,smtp://b.example:25';
ALTER SYSTEM SET gatekeeper.smtp_url = 'smtp://a.example:25,smtp://mailer:Secret-1@b.example:25';
ALTER SYSTEM SET gatekeeper.smtp_url = 'smtp://relay.example:0';
ALTER SYSTEM SET gatekeeper.smtp_url = 'smtp://relay.example:99999';
ALTER SYSTEM SET gatekeeper.smtp_url = 'smtp://relay.example:';
ALTER SYSTEM SET gatekeeper.smtp_url = 'smtp://:25';
ALTER SYSTEM SET gatekeeper.smtp_url = 'smtp://relay example:25';
ALTER SYSTEM SET gatekeeper.smtp_url = 'smtp://relay.example:587/submit';
ALTER SYSTEM SET gatekeeper.smtp_url = 'smtp://[::1:25';
ALTER SYSTEM SET gatekeeper.smtp_url = 'smtps://relay.example';
ALTER SYSTEM SET gatekeeper.smtp_url = 'smtp://[::1]:2525/';
ALTER SYSTEM RESET gatekeeper.smtp_url;
-- the password setting is gone
ALTER SYSTEM SET gatekeeper.smtp_password = 'Secret-2';
SELECT current_setting('gatekeeper.smtp_password', true) IS NULL AS no_password_setting;
