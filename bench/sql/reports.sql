-- bench/sql/reports.sql: what the reports scenario needs (issue 27).
-- Not part of gatekeeper.

-- A DSN as Postfix writes it for one recipient of a mail gatekeeper sent
-- with a VERP return path: the notification, the delivery status, and
-- the returned message (about 4 kB, RET=FULL as many relays return it).
CREATE OR REPLACE FUNCTION bench_dsn(token text, rcpt text, message_id text, code text, i bigint) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
	SELECT format(E'Return-Path: <>\r\nDelivered-To: bounces+%1$s@bounce.example.com\r\n'
		'Received: by mx.relay.example (Postfix) id 4Zk1mQ2hL9z9sWT; Tue, 25 Nov 2026 10:04:12 +0000 (UTC)\r\n'
		'Date: Tue, 25 Nov 2026 10:04:12 +0000 (UTC)\r\n'
		'From: MAILER-DAEMON@mx.relay.example (Mail Delivery System)\r\n'
		'Subject: Undelivered Mail Returned to Sender\r\nTo: bounces+%1$s@bounce.example.com\r\n'
		'Auto-Submitted: auto-replied\r\nMIME-Version: 1.0\r\n'
		'Content-Type: multipart/report; report-type=delivery-status;\r\n'
		'\tboundary="4Zk1mQ2hL9z9sWT.1764065052/mx.relay.example"\r\n'
		'Content-Transfer-Encoding: 8bit\r\nMessage-Id: <20261125100412.%5$s@mx.relay.example>\r\n\r\n'
		'This is a MIME-encapsulated message.\r\n\r\n'
		'--4Zk1mQ2hL9z9sWT.1764065052/mx.relay.example\r\nContent-Description: Notification\r\n'
		'Content-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: 8bit\r\n\r\n'
		'This is the mail system at host mx.relay.example.\r\n\r\n'
		'I''m sorry to have to inform you that your message could not\r\n'
		'be delivered to one or more recipients. It''s attached below.\r\n\r\n'
		'For further assistance, please send mail to postmaster.\r\n\r\n'
		'If you do so, please include this problem report. You can\r\n'
		'delete your own text from the attached returned message.\r\n\r\n'
		'                   The mail system\r\n\r\n'
		'<%2$s>: host mx.dead.example[192.0.2.25] said: 550 %4$s\r\n'
		'    <%2$s>: Recipient address rejected: User unknown (in reply to RCPT TO command)\r\n\r\n'
		'--4Zk1mQ2hL9z9sWT.1764065052/mx.relay.example\r\nContent-Description: Delivery report\r\n'
		'Content-Type: message/delivery-status\r\n\r\n'
		'Reporting-MTA: dns; mx.relay.example\r\nX-Postfix-Queue-ID: 4Zk1mQ2hL9z9sWT\r\n'
		'X-Postfix-Sender: rfc822; bounces+%1$s@bounce.example.com\r\n'
		'Arrival-Date: Tue, 25 Nov 2026 10:04:11 +0000 (UTC)\r\nOriginal-Envelope-Id: %1$s\r\n\r\n'
		'Final-Recipient: rfc822; %2$s\r\nOriginal-Recipient: rfc822;%2$s\r\nAction: failed\r\n'
		'Status: %4$s\r\nRemote-MTA: dns; mx.dead.example\r\n'
		'Diagnostic-Code: smtp; 550 %4$s <%2$s>: Recipient address rejected: User unknown\r\n\r\n'
		'--4Zk1mQ2hL9z9sWT.1764065052/mx.relay.example\r\nContent-Description: Undelivered Message\r\n'
		'Content-Type: message/rfc822\r\nContent-Transfer-Encoding: 8bit\r\n\r\n'
		'Return-Path: <bounces+%1$s@bounce.example.com>\r\n'
		'Received: from db1.example.com (db1.example.com [198.51.100.7])\r\n'
		'\tby mx.relay.example (Postfix) with ESMTPS id 4Zk1mQ2hL9z9sWT\r\n'
		'\tfor <%2$s>; Tue, 25 Nov 2026 10:04:11 +0000 (UTC)\r\n'
		'Date: Tue, 25 Nov 2026 10:04:10 +0000\r\nFrom: bench@example.com\r\nTo: %2$s\r\n'
		'Subject: Subject %5$s\r\nMessage-ID: %3$s\r\nMIME-Version: 1.0\r\n'
		'Content-Type: text/plain; charset=utf-8\r\n\r\n%6$s\r\n\r\n'
		'--4Zk1mQ2hL9z9sWT.1764065052/mx.relay.example--\r\n',
		token, rcpt, message_id, code, i, bench_body(i))
$$;
