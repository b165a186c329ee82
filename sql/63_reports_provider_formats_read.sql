-- Bounces in the formats providers and MTAs write them (issue 49, item 4):
-- the reports of test/reports/corpus/ named here, written from the
-- providers' documentation and published examples (Gmail's plain-text
-- "Delivery Status Notification (Failure)" with and without a DSN part,
-- Google Groups, Yahoo's "554:" text, Office 365's and Exchange 2003's
-- NDRs, Amazon SES's and WorkMail's own bounces, qmail, mail.ru,
-- OpenSMTPD's text and its multipart/mixed DSN, Courier's DSN and text,
-- RFC 3464 in awkward layouts), addresses anonymised.  Each names one mail
-- sent through a queue with a VERP return_path and is fed to
-- ingest_report() as the bounce pipe feeds it, with the mail's VERP
-- address.  Per report: recorded or not, its event, status and reason,
-- the suppression it made, each against what the report says (ok); then
-- per format the share recorded, the reasons read and the suppressions
-- made, and the issue's targets: an event for >= 90% of bounces, >= 85%
-- of hard bounces suppressed, <= 2% of other bounces suppressed.
SET client_min_messages = warning;
\set VERBOSITY terse
CREATE EXTENSION IF NOT EXISTS gatekeeper;

SELECT gatekeeper.create_queue('p_news', return_path => 'bounces+{token}@bounce.shop.example');
CREATE TEMP TABLE corpus (file text PRIMARY KEY, format text, expect_event text, expect_reason text,
						  expect_suppression text, message text);
\set m `cat test/reports/corpus/gmail_text_no_such_user.eml`
INSERT INTO corpus VALUES ('gmail_text_no_such_user', 'Gmail', 'bounced', 'user_unknown', 'hard_bounce', :'m');
\set m `cat test/reports/corpus/gmail_text_over_quota_452-4.2.2.eml`
INSERT INTO corpus VALUES ('gmail_text_over_quota_452-4.2.2', 'Gmail', 'bounced', 'mailbox_full', NULL, :'m');
\set m `cat test/reports/corpus/gmail_text_over_quota_552-5.2.2.eml`
INSERT INTO corpus VALUES ('gmail_text_over_quota_552-5.2.2', 'Gmail', 'bounced', 'mailbox_full', NULL, :'m');
\set m `cat test/reports/corpus/gmail_text_blocked_spam_550-5.7.1.eml`
INSERT INTO corpus VALUES ('gmail_text_blocked_spam_550-5.7.1', 'Gmail', 'bounced', 'spam_filtered', NULL, :'m');
\set m `cat test/reports/corpus/gmail_text_unauthenticated_5.7.26.eml`
INSERT INTO corpus VALUES ('gmail_text_unauthenticated_5.7.26', 'Gmail', 'bounced', 'auth_failure', NULL, :'m');
\set m `cat test/reports/corpus/gmail_text_ip_not_authorized_5.7.1.eml`
INSERT INTO corpus VALUES ('gmail_text_ip_not_authorized_5.7.1', 'Gmail', 'bounced', 'policy_blocked', NULL, :'m');
\set m `cat test/reports/corpus/googlegroups_no_permission.eml`
INSERT INTO corpus VALUES ('googlegroups_no_permission', 'Google Groups', 'bounced', 'policy_blocked', NULL, :'m');
\set m `cat test/reports/corpus/yahoo_text_mailbox_disabled.eml`
INSERT INTO corpus VALUES ('yahoo_text_mailbox_disabled', 'Yahoo, plain text', 'bounced', 'user_unknown', 'hard_bounce', :'m');
\set m `cat test/reports/corpus/yahoo_text_deferred_tss04.eml`
INSERT INTO corpus VALUES ('yahoo_text_deferred_tss04', 'Yahoo, plain text', 'bounced', 'rate_limited', NULL, :'m');
\set m `cat test/reports/corpus/yahoo_text_policy_5.7.9.eml`
INSERT INTO corpus VALUES ('yahoo_text_policy_5.7.9', 'Yahoo, plain text', 'bounced', 'policy_blocked', NULL, :'m');
\set m `cat test/reports/corpus/office365_text_5.1.10.eml`
INSERT INTO corpus VALUES ('office365_text_5.1.10', 'Office 365', 'bounced', 'user_unknown', 'hard_bounce', :'m');
\set m `cat test/reports/corpus/office365_text_5.1.351.eml`
INSERT INTO corpus VALUES ('office365_text_5.1.351', 'Office 365', 'bounced', 'user_unknown', 'hard_bounce', :'m');
\set m `cat test/reports/corpus/office365_text_5.4.1_access_denied.eml`
INSERT INTO corpus VALUES ('office365_text_5.4.1_access_denied', 'Office 365', 'bounced', 'user_unknown', 'hard_bounce', :'m');
\set m `cat test/reports/corpus/office365_text_5.2.2_mailbox_full.eml`
INSERT INTO corpus VALUES ('office365_text_5.2.2_mailbox_full', 'Office 365', 'bounced', 'mailbox_full', NULL, :'m');
\set m `cat test/reports/corpus/office365_text_5.7.708.eml`
INSERT INTO corpus VALUES ('office365_text_5.7.708', 'Office 365', 'bounced', 'policy_blocked', NULL, :'m');
\set m `cat test/reports/corpus/office365_text_5.7.750.eml`
INSERT INTO corpus VALUES ('office365_text_5.7.750', 'Office 365', 'bounced', 'policy_blocked', NULL, :'m');
\set m `cat test/reports/corpus/exchange2003_5.1.1_no_account.eml`
INSERT INTO corpus VALUES ('exchange2003_5.1.1_no_account', 'Exchange 2003', 'bounced', 'user_unknown', 'hard_bounce', :'m');
\set m `cat test/reports/corpus/exchange2003_ims_unknown_recipient.eml`
INSERT INTO corpus VALUES ('exchange2003_ims_unknown_recipient', 'Exchange 2003', 'bounced', 'user_unknown', 'hard_bounce', :'m');
\set m `cat test/reports/corpus/exchange2003_5.2.2_mailbox_full.eml`
INSERT INTO corpus VALUES ('exchange2003_5.2.2_mailbox_full', 'Exchange 2003', 'bounced', 'mailbox_full', NULL, :'m');
\set m `cat test/reports/corpus/ses_suppressed_address.eml`
INSERT INTO corpus VALUES ('ses_suppressed_address', 'Amazon SES', 'bounced', 'user_unknown', 'hard_bounce', :'m');
\set m `cat test/reports/corpus/ses_mailbox_full.eml`
INSERT INTO corpus VALUES ('ses_mailbox_full', 'Amazon SES', 'bounced', 'mailbox_full', NULL, :'m');
\set m `cat test/reports/corpus/ses_content_rejected.eml`
INSERT INTO corpus VALUES ('ses_content_rejected', 'Amazon SES', 'bounced', 'spam_filtered', NULL, :'m');
\set m `cat test/reports/corpus/workmail_user_unknown.eml`
INSERT INTO corpus VALUES ('workmail_user_unknown', 'Amazon WorkMail', 'bounced', 'user_unknown', 'hard_bounce', :'m');
\set m `cat test/reports/corpus/workmail_expired.eml`
INSERT INTO corpus VALUES ('workmail_expired', 'Amazon WorkMail', 'bounced', 'expired', NULL, :'m');
\set m `cat test/reports/corpus/qmail_remote_user_unknown.eml`
INSERT INTO corpus VALUES ('qmail_remote_user_unknown', 'qmail', 'bounced', 'user_unknown', 'hard_bounce', :'m');
\set m `cat test/reports/corpus/qmail_no_host.eml`
INSERT INTO corpus VALUES ('qmail_no_host', 'qmail', 'bounced', 'host_unknown', 'hard_bounce', :'m');
\set m `cat test/reports/corpus/qmail_local_quota.eml`
INSERT INTO corpus VALUES ('qmail_local_quota', 'qmail', 'bounced', 'mailbox_full', NULL, :'m');
\set m `cat test/reports/corpus/qmail_queue_too_long.eml`
INSERT INTO corpus VALUES ('qmail_queue_too_long', 'qmail', 'bounced', 'expired', NULL, :'m');
\set m `cat test/reports/corpus/mailru_user_not_found.eml`
INSERT INTO corpus VALUES ('mailru_user_not_found', 'mail.ru', 'bounced', 'user_unknown', 'hard_bounce', :'m');
\set m `cat test/reports/corpus/mailru_mailbox_full.eml`
INSERT INTO corpus VALUES ('mailru_mailbox_full', 'mail.ru', 'bounced', 'mailbox_full', NULL, :'m');
\set m `cat test/reports/corpus/mailru_spam_rejected.eml`
INSERT INTO corpus VALUES ('mailru_spam_rejected', 'mail.ru', 'bounced', 'spam_filtered', NULL, :'m');
\set m `cat test/reports/corpus/opensmtpd_text_user_unknown.eml`
INSERT INTO corpus VALUES ('opensmtpd_text_user_unknown', 'OpenSMTPD', 'bounced', 'user_unknown', 'hard_bounce', :'m');
\set m `cat test/reports/corpus/opensmtpd_mixed_dsn_full.eml`
INSERT INTO corpus VALUES ('opensmtpd_mixed_dsn_full', 'OpenSMTPD', 'bounced', 'mailbox_full', NULL, :'m');
\set m `cat test/reports/corpus/opensmtpd_mixed_dsn_expired.eml`
INSERT INTO corpus VALUES ('opensmtpd_mixed_dsn_expired', 'OpenSMTPD', 'bounced', 'expired', NULL, :'m');
\set m `cat test/reports/corpus/opensmtpd_delay_warning.eml`
INSERT INTO corpus VALUES ('opensmtpd_delay_warning', 'OpenSMTPD', 'deferred', 'system_error', NULL, :'m');
\set m `cat test/reports/corpus/courier_remote_user_unknown.eml`
INSERT INTO corpus VALUES ('courier_remote_user_unknown', 'Courier', 'bounced', 'user_unknown', 'hard_bounce', :'m');
\set m `cat test/reports/corpus/courier_no_such_domain.eml`
INSERT INTO corpus VALUES ('courier_no_such_domain', 'Courier', 'bounced', 'host_unknown', 'hard_bounce', :'m');
\set m `cat test/reports/corpus/courier_remote_size_limit.eml`
INSERT INTO corpus VALUES ('courier_remote_size_limit', 'Courier', 'bounced', 'message_too_large', NULL, :'m');
\set m `cat test/reports/corpus/courier_delayed_greylisted.eml`
INSERT INTO corpus VALUES ('courier_delayed_greylisted', 'Courier', 'deferred', 'policy_blocked', NULL, :'m');
\set m `cat test/reports/corpus/courier_text_user_unknown.eml`
INSERT INTO corpus VALUES ('courier_text_user_unknown', 'Courier', 'bounced', 'user_unknown', 'hard_bounce', :'m');
\set m `cat test/reports/corpus/courier_text_delayed.eml`
INSERT INTO corpus VALUES ('courier_text_delayed', 'Courier', 'deferred', 'system_error', NULL, :'m');
\set m `cat test/reports/corpus/rfc3464_status_after_blank_lines.eml`
INSERT INTO corpus VALUES ('rfc3464_status_after_blank_lines', 'RFC 3464, awkward layouts', 'bounced', 'user_unknown', 'hard_bounce', :'m');
\set m `cat test/reports/corpus/rfc3464_status_in_text_plain_part.eml`
INSERT INTO corpus VALUES ('rfc3464_status_in_text_plain_part', 'RFC 3464, awkward layouts', 'bounced', 'user_unknown', 'hard_bounce', :'m');
\set m `cat test/reports/corpus/rfc3464_postfix_soft_bounce_4.1.1.eml`
INSERT INTO corpus VALUES ('rfc3464_postfix_soft_bounce_4.1.1', 'RFC 3464, awkward layouts', 'bounced', 'user_unknown', 'hard_bounce', :'m');
\set m `cat test/reports/corpus/rfc3464_mixed_ours_hard_other_delayed.eml`
INSERT INTO corpus VALUES ('rfc3464_mixed_ours_hard_other_delayed', 'RFC 3464, awkward layouts', 'bounced', 'user_unknown', 'hard_bounce', :'m');
\set m `cat test/reports/corpus/rfc3464_mixed_other_hard_ours_delayed.eml`
INSERT INTO corpus VALUES ('rfc3464_mixed_other_hard_ours_delayed', 'RFC 3464, awkward layouts', 'deferred', 'mailbox_full', NULL, :'m');

-- one mail per report, sent as an external worker sends it
CREATE TEMP TABLE sent (file text PRIMARY KEY, id bigint, recipient text, message_id text, token text);
DO $$
DECLARE
	r record;
	c record;
BEGIN
	FOR r IN SELECT file FROM corpus ORDER BY file LOOP
		PERFORM gatekeeper.enqueue('p-' || replace(r.file, '.', '-') || '@isp.example', 'Your weekly picks', 'Hello',
								   queue => 'p_news', sender => 'shop@shop.example');
		SELECT * INTO c FROM gatekeeper.claim('w', 1, queues => '{p_news}');
		PERFORM gatekeeper.ack(c.id, c.attempt);
		INSERT INTO sent VALUES (r.file, c.id, c.recipient, c.message_id, gatekeeper._verp_token(c.id));
	END LOOP;
END
$$;
SELECT count(*) AS sent, count(*) FILTER (WHERE message_id IS NOT NULL AND token IS NOT NULL) AS named
  FROM sent;

-- each report, delivered to the mail's VERP address
CREATE TEMP TABLE fed AS
SELECT c.file, (SELECT count(*) FROM gatekeeper.ingest_report(
		replace(replace(replace(c.message, '{{TOKEN}}', s.token), '{{RCPT}}', s.recipient),
				'{{MSGID}}', s.message_id),
		'bounces+' || s.token || '@bounce.shop.example')) AS rows
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
SELECT count(*) AS reports, count(*) FILTER (WHERE NOT ok) AS not_as_the_report_says FROM outcome;
-- one event per report, and what a report suppresses is its mail's own recipient
SELECT count(*) AS events FROM gatekeeper.events e JOIN sent s ON s.id = e.mail_id WHERE e.event <> 'sent';
SELECT count(*) AS suppressed_not_the_mails FROM gatekeeper.suppression u JOIN sent s ON s.id = u.mail_id
 WHERE u.address <> s.recipient;
SELECT count(*) AS suppressed_never_mailed FROM gatekeeper.suppression
 WHERE address = 'someone-else@isp.example' OR address = 'alias-member@isp.example';

-- per format
SELECT format, count(*) AS reports,
	   round(100.0 * count(*) FILTER (WHERE recorded) / count(*)) AS recorded_pct,
	   string_agg(DISTINCT reason, ', ') AS reasons,
	   count(suppression) AS suppressed
  FROM outcome GROUP BY format ORDER BY format;
-- the targets: bounces recorded, hard ones suppressed, others not
SELECT count(*) FILTER (WHERE c.expect_event = 'bounced') AS bounces,
	   round(100.0 * count(*) FILTER (WHERE c.expect_event = 'bounced' AND o.event = 'bounced')
			 / count(*) FILTER (WHERE c.expect_event = 'bounced')) AS recorded_pct,
	   count(*) FILTER (WHERE c.expect_suppression = 'hard_bounce') AS hard,
	   round(100.0 * count(*) FILTER (WHERE c.expect_suppression = 'hard_bounce' AND o.suppression = 'hard_bounce')
			 / count(*) FILTER (WHERE c.expect_suppression = 'hard_bounce')) AS hard_suppressed_pct,
	   count(*) FILTER (WHERE c.expect_suppression IS NULL) AS not_hard,
	   round(100.0 * count(*) FILTER (WHERE c.expect_suppression IS NULL AND o.suppression IS NOT NULL)
			 / count(*) FILTER (WHERE c.expect_suppression IS NULL)) AS not_hard_suppressed_pct,
	   count(*) FILTER (WHERE c.expect_event = 'deferred') AS delay_notices,
	   count(*) FILTER (WHERE c.expect_event = 'deferred' AND o.event = 'deferred') AS read_as_deferred
  FROM outcome o JOIN corpus c USING (file);
