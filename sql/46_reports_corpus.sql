-- Reports as real MTAs and providers write them (issue 49): the corpus
-- in test/reports/corpus/, written from their documented formats and
-- published examples (Exim's and qmail's plain-text bounces, Yahoo's,
-- Gmail's, Office 365's and Outlook's, Amazon SES's DSNs, feedback reports,
-- a complaint forwarded by an abuse desk, an auto-reply, a person's reply).
-- Each names one mail sent through a queue with a VERP return_path and is
-- fed to ingest_report() as the bounce pipe feeds it, with the address it
-- was delivered to (the mail's VERP address; the abuse or feedback-loop
-- address for complaints).  Per report: recorded or not, its event, status
-- and reason, and the suppression it made, each against what the report
-- says (ok); then per format the share recorded, the reasons read and the
-- suppressions made.
SET client_min_messages = warning;
\set VERBOSITY terse

SELECT gatekeeper.create_queue('c_news', return_path => 'bounces+{token}@bounce.shop.example');
CREATE TEMP TABLE corpus (file text PRIMARY KEY, format text, delivered_to text,
						  expect_event text, expect_reason text, expect_suppression text,
						  message text);
\set m `cat test/reports/corpus/exim_text_user_unknown.eml`
INSERT INTO corpus VALUES ('exim_text_user_unknown', 'Exim, plain text', 'verp', 'bounced', 'user_unknown', 'hard_bounce', :'m');
\set m `cat test/reports/corpus/exim_text_unrouteable.eml`
INSERT INTO corpus VALUES ('exim_text_unrouteable', 'Exim, plain text', 'verp', 'bounced', 'user_unknown', 'hard_bounce', :'m');
\set m `cat test/reports/corpus/exim_text_full_5.1.1.eml`
INSERT INTO corpus VALUES ('exim_text_full_5.1.1', 'Exim, plain text', 'verp', 'bounced', 'mailbox_full', NULL, :'m');
\set m `cat test/reports/corpus/exim_text_retry_timeout.eml`
INSERT INTO corpus VALUES ('exim_text_retry_timeout', 'Exim, plain text', 'verp', 'bounced', 'expired', NULL, :'m');
-- Exim 4.96 as Debian ships it, its own failures (t/093's relay wrote
-- these): multipart/report, Status 5.0.0, no Diagnostic-Code
\set m `cat test/reports/corpus/exim_dsn_unrouteable.eml`
INSERT INTO corpus VALUES ('exim_dsn_unrouteable', 'Exim 4.96, its own failures', 'verp', 'bounced', 'user_unknown', 'hard_bounce', :'m');
\set m `cat test/reports/corpus/exim_dsn_mailbox_full.eml`
INSERT INTO corpus VALUES ('exim_dsn_mailbox_full', 'Exim 4.96, its own failures', 'verp', 'bounced', 'mailbox_full', NULL, :'m');
-- OpenSMTPD 6.8 as Debian ships it (t/097's relay wrote these): a
-- message/delivery-status in a multipart/mixed, Status 5.0.0 (5.3.0 from
-- its mda), its expiry as Action: delayed, 4.4.7; without a return_path
-- the bounce goes to the mail's From and only its returned Message-ID
-- names the mail
\set m `cat test/reports/corpus/opensmtpd_user_unknown.eml`
INSERT INTO corpus VALUES ('opensmtpd_user_unknown', 'OpenSMTPD 6.8', 'verp', 'bounced', 'user_unknown', 'hard_bounce', :'m');
\set m `cat test/reports/corpus/opensmtpd_mailbox_full.eml`
INSERT INTO corpus VALUES ('opensmtpd_mailbox_full', 'OpenSMTPD 6.8', 'verp', 'bounced', 'mailbox_full', NULL, :'m');
\set m `cat test/reports/corpus/opensmtpd_expired.eml`
INSERT INTO corpus VALUES ('opensmtpd_expired', 'OpenSMTPD 6.8', 'verp', 'bounced', 'expired', NULL, :'m');
\set m `cat test/reports/corpus/opensmtpd_no_verp_host_unknown.eml`
INSERT INTO corpus VALUES ('opensmtpd_no_verp_host_unknown', 'OpenSMTPD 6.8', 'from', 'bounced', 'host_unknown', 'hard_bounce', :'m');
-- Sendmail 8.17 as Debian ships it (t/098's relay wrote these): a
-- multipart/report; an MX's refusal quoted in Diagnostic-Code, its own
-- "Host unknown" as 5.1.2 without one, and a local mailer's EX_CANTCREAT
-- as Status 5.3.0, "Diagnostic-Code: X-Unix; 73", the mailer's words in
-- the transcript only
\set m `cat test/reports/corpus/sendmail_user_unknown.eml`
INSERT INTO corpus VALUES ('sendmail_user_unknown', 'Sendmail 8.17', 'verp', 'bounced', 'user_unknown', 'hard_bounce', :'m');
\set m `cat test/reports/corpus/sendmail_host_unknown.eml`
INSERT INTO corpus VALUES ('sendmail_host_unknown', 'Sendmail 8.17', 'verp', 'bounced', 'host_unknown', 'hard_bounce', :'m');
\set m `cat test/reports/corpus/sendmail_mailbox_full.eml`
INSERT INTO corpus VALUES ('sendmail_mailbox_full', 'Sendmail 8.17', 'verp', 'bounced', 'mailbox_full', NULL, :'m');
-- Courier 1.0.16 as Debian ships it (t/099's relay wrote these): a
-- multipart/report whose Status is 5.0.0 whatever the failure, the MX's
-- reply in Diagnostic-Code ("550 User <gone> unknown", "534 SIZE=Message
-- too big."), deliverquota's "Mail quota exceeded." as "unknown; ..."
\set m `cat test/reports/corpus/courier_run_user_unknown.eml`
INSERT INTO corpus VALUES ('courier_run_user_unknown', 'Courier 1.0.16', 'verp', 'bounced', 'user_unknown', 'hard_bounce', :'m');
\set m `cat test/reports/corpus/courier_run_mailbox_full.eml`
INSERT INTO corpus VALUES ('courier_run_mailbox_full', 'Courier 1.0.16', 'verp', 'bounced', 'mailbox_full', NULL, :'m');
\set m `cat test/reports/corpus/courier_run_size_limit.eml`
INSERT INTO corpus VALUES ('courier_run_size_limit', 'Courier 1.0.16', 'verp', 'bounced', 'message_too_large', NULL, :'m');
\set m `cat test/reports/corpus/qmail_no_mailbox.eml`
INSERT INTO corpus VALUES ('qmail_no_mailbox', 'qmail', 'verp', 'bounced', 'user_unknown', 'hard_bounce', :'m');
\set m `cat test/reports/corpus/qmail_remote_quota.eml`
INSERT INTO corpus VALUES ('qmail_remote_quota', 'qmail', 'verp', 'bounced', 'mailbox_full', NULL, :'m');
\set m `cat test/reports/corpus/yahoo_text_no_account.eml`
INSERT INTO corpus VALUES ('yahoo_text_no_account', 'Yahoo, plain text', 'verp', 'bounced', 'user_unknown', 'hard_bounce', :'m');
\set m `cat test/reports/corpus/gmail_no_such_user.eml`
INSERT INTO corpus VALUES ('gmail_no_such_user', 'Gmail', 'verp', 'bounced', 'user_unknown', 'hard_bounce', :'m');
\set m `cat test/reports/corpus/gmail_over_quota.eml`
INSERT INTO corpus VALUES ('gmail_over_quota', 'Gmail', 'verp', 'bounced', 'mailbox_full', NULL, :'m');
\set m `cat test/reports/corpus/gmail_unauthenticated.eml`
INSERT INTO corpus VALUES ('gmail_unauthenticated', 'Gmail', 'verp', 'bounced', 'auth_failure', NULL, :'m');
\set m `cat test/reports/corpus/office365_recipient_not_found.eml`
INSERT INTO corpus VALUES ('office365_recipient_not_found', 'Office 365', 'verp', 'bounced', 'user_unknown', 'hard_bounce', :'m');
\set m `cat test/reports/corpus/office365_host_unknown.eml`
INSERT INTO corpus VALUES ('office365_host_unknown', 'Office 365', 'verp', 'bounced', 'host_unknown', 'hard_bounce', :'m');
\set m `cat test/reports/corpus/office365_5.1.351.eml`
INSERT INTO corpus VALUES ('office365_5.1.351', 'Office 365', 'verp', 'bounced', 'user_unknown', 'hard_bounce', :'m');
\set m `cat test/reports/corpus/outlook_5.5.0_unavailable.eml`
INSERT INTO corpus VALUES ('outlook_5.5.0_unavailable', 'Office 365', 'verp', 'bounced', 'user_unknown', 'hard_bounce', :'m');
\set m `cat test/reports/corpus/ses_user_unknown.eml`
INSERT INTO corpus VALUES ('ses_user_unknown', 'Amazon SES', 'verp', 'bounced', 'user_unknown', 'hard_bounce', :'m');
\set m `cat test/reports/corpus/vacation_autoreply.eml`
INSERT INTO corpus VALUES ('vacation_autoreply', 'auto-reply (RFC 3834)', 'verp', NULL, NULL, NULL, :'m');
\set m `cat test/reports/corpus/human_reply.eml`
INSERT INTO corpus VALUES ('human_reply', 'reply by a person', 'verp', 'bounced', 'other', NULL, :'m');
\set m `cat test/reports/corpus/arf_opt_out.eml`
INSERT INTO corpus VALUES ('arf_opt_out', 'ARF', 'verp', 'unsubscribed', NULL, 'unsubscribe', :'m');
\set m `cat test/reports/corpus/arf_not_spam.eml`
INSERT INTO corpus VALUES ('arf_not_spam', 'ARF', 'fbl', 'feedback', NULL, NULL, :'m');
\set m `cat test/reports/corpus/arf_auth_failure.eml`
INSERT INTO corpus VALUES ('arf_auth_failure', 'ARF', 'fbl', 'feedback', NULL, NULL, :'m');
\set m `cat test/reports/corpus/arf_fraud.eml`
INSERT INTO corpus VALUES ('arf_fraud', 'ARF', 'fbl', 'complained', NULL, 'complaint', :'m');
\set m `cat test/reports/corpus/forwarded_complaint.eml`
INSERT INTO corpus VALUES ('forwarded_complaint', 'forwarded complaint', 'abuse', 'complained', NULL, 'complaint', :'m');
\set m `cat test/reports/corpus/forwarded_complaint_old_id.eml`
INSERT INTO corpus VALUES ('forwarded_complaint_old_id', 'forwarded complaint', 'abuse', NULL, NULL, NULL, :'m');

-- one mail per report, sent as an external worker sends it
CREATE TEMP TABLE sent (file text PRIMARY KEY, id bigint, recipient text, message_id text, token text);
DO $$
DECLARE
	r record;
	c record;
BEGIN
	FOR r IN SELECT file FROM corpus ORDER BY file LOOP
		PERFORM gatekeeper.enqueue(replace(r.file, '.', '-') || '@isp.example', 'Your weekly picks', 'Hello',
								   queue => 'c_news', sender => 'shop@shop.example');
		SELECT * INTO c FROM gatekeeper.claim('w', 1, queues => '{c_news}');
		PERFORM gatekeeper.ack(c.id, c.attempt);
		INSERT INTO sent VALUES (r.file, c.id, c.recipient, c.message_id, gatekeeper._verp_token(c.id));
	END LOOP;
END
$$;
SELECT count(*) AS sent, count(*) FILTER (WHERE message_id IS NOT NULL AND token IS NOT NULL) AS named
  FROM sent;

-- each report, delivered to its address
CREATE TEMP TABLE fed AS
SELECT c.file, (SELECT count(*) FROM gatekeeper.ingest_report(
		replace(replace(replace(replace(c.message, '{{TOKEN}}', s.token), '{{RCPT}}', s.recipient),
						'{{MSGID}}', s.message_id),
				'{{OLDMSGID}}', '<' || s.id || '.5f3a0c1d2e4b@shop.example>'),
		CASE c.delivered_to WHEN 'verp' THEN 'bounces+' || s.token || '@bounce.shop.example'
							WHEN 'abuse' THEN 'abuse@shop.example'
							WHEN 'from' THEN 'shop@shop.example'
							ELSE 'fbl-reports@shop.example' END)) AS rows
  FROM corpus c JOIN sent s USING (file);

-- per report
CREATE TEMP TABLE outcome AS
SELECT c.format, c.file, f.rows > 0 AS recorded, e.event, e.status, e.reason, u.reason AS suppression,
	   e.event IS NOT DISTINCT FROM c.expect_event AND e.reason IS NOT DISTINCT FROM c.expect_reason
	   AND u.reason IS NOT DISTINCT FROM c.expect_suppression AS ok
  FROM corpus c JOIN sent s USING (file) JOIN fed f USING (file)
  LEFT JOIN gatekeeper.events e ON e.mail_id = s.id AND e.event <> 'sent'
  LEFT JOIN gatekeeper.suppression u ON u.address = s.recipient;
SELECT format, file, recorded, event, status, reason, suppression, ok FROM outcome ORDER BY format, file;
SELECT count(*) FILTER (WHERE NOT ok) AS not_as_the_report_says FROM outcome;
-- what a report suppresses is its mail's own recipient, no one else
SELECT count(*) AS suppressed_not_the_mails FROM gatekeeper.suppression u JOIN sent s ON s.id = u.mail_id
 WHERE u.address <> s.recipient;

-- per format
SELECT format, count(*) AS reports,
	   round(100.0 * count(*) FILTER (WHERE recorded) / count(*)) AS recorded_pct,
	   string_agg(DISTINCT coalesce(reason, event), ', ') AS reasons,
	   count(suppression) AS suppressed,
	   string_agg(DISTINCT suppression, ', ') AS suppressions
  FROM outcome GROUP BY format ORDER BY format;
-- the bounces: recorded, hard ones suppressed, others not
SELECT count(*) FILTER (WHERE c.expect_event = 'bounced') AS bounces,
	   count(*) FILTER (WHERE c.expect_event = 'bounced' AND o.event = 'bounced') AS recorded,
	   count(*) FILTER (WHERE c.expect_suppression = 'hard_bounce') AS hard,
	   count(*) FILTER (WHERE c.expect_suppression = 'hard_bounce' AND o.suppression = 'hard_bounce') AS hard_suppressed,
	   count(*) FILTER (WHERE c.expect_event = 'bounced' AND c.expect_suppression IS NULL
						AND o.suppression IS NOT NULL) AS soft_suppressed
  FROM outcome o JOIN corpus c USING (file);
-- the opt-out unsubscribed its address from the mail's queue only
SELECT address, queue, reason FROM gatekeeper.suppression
 WHERE reason = 'unsubscribe' AND address IN (SELECT recipient FROM sent) ORDER BY 1;
