-- Bulk enqueue errors say where (issue 13, item 4): a bad row of a
-- multi-row INSERT or COPY is named by its position in the statement and
-- its recipient, and a dedupe conflict by its queue and key, to a role
-- that may insert but not read the mail.  Nothing is written.
SET client_min_messages = warning;
\set VERBOSITY default

SELECT gatekeeper.create_queue('bulk_q');
CREATE ROLE regress_bulk_app NOLOGIN;
GRANT USAGE ON SCHEMA gatekeeper TO regress_bulk_app;
GRANT INSERT (recipient, subject, body, queue, send_at, html, sender, headers, dedupe_key,
              priority, send_by, recipient_name, metadata, timezone) ON gatekeeper.mail TO regress_bulk_app;
GRANT EXECUTE ON FUNCTION gatekeeper._segment() TO regress_bulk_app;
SET ROLE regress_bulk_app;

-- INSERT ... SELECT: row 3701 of 5000 has a bad address
INSERT INTO gatekeeper.mail (recipient, subject, body, queue)
SELECT CASE WHEN i = 3701 THEN 'no-at-sign.example.com' ELSE 'bulk' || i || '@example.com' END,
       's', 'b', 'bulk_q'
  FROM generate_series(1, 5000) AS i;

-- multi-row VALUES: the second row tries header injection; the context
-- line shows the recipient with its control characters escaped
INSERT INTO gatekeeper.mail (recipient, subject, body, queue) VALUES
	('ok@example.com', 's', 'b', 'bulk_q'),
	(E'x@example.com\r\nBcc: victim@example.com', 's', 'b', 'bulk_q');

-- a NULL recipient (refused by the column itself, which shows the row),
-- and a queue that does not exist, at row 2
INSERT INTO gatekeeper.mail (recipient, subject, body, queue) VALUES
	('a@example.com', 's', 'b', 'bulk_q'), ('b@example.com', 's', 'b', 'bulk_q'),
	(NULL, 's', 'b', 'bulk_q');
INSERT INTO gatekeeper.mail (recipient, subject, body, queue) VALUES
	('a@example.com', 's', 'b', 'bulk_q'), ('b@example.com', 's', 'b', 'no_such_queue');

-- COPY: the third line
COPY gatekeeper.mail (recipient, subject, body, queue) FROM STDIN (FORMAT csv);
c1@example.com,s,b,bulk_q
c2@example.com,s,b,bulk_q
"Émile <c3@example.com",s,b,bulk_q
c4@example.com,s,b,bulk_q
\.

-- dedupe conflicts: with a live mail enqueued before, and within one
-- statement (row 1501 repeats row 1's key)
INSERT INTO gatekeeper.mail (recipient, subject, body, queue, dedupe_key)
VALUES ('first@example.com', 's', 'b', 'bulk_q', 'order-17');
INSERT INTO gatekeeper.mail (recipient, subject, body, queue, dedupe_key) VALUES
	('second@example.com', 's', 'b', 'bulk_q', 'order-18'),
	('third@example.com', 's', 'b', 'bulk_q', 'order-17');
INSERT INTO gatekeeper.mail (recipient, subject, body, queue, dedupe_key)
SELECT 'd' || i || '@example.com', 's', 'b', 'bulk_q', 'key-' || (i % 1500)
  FROM generate_series(1, 3000) AS i;
RESET ROLE;

-- only the one mail that was valid was written
SELECT count(*) AS mails, (SELECT count(*) FROM gatekeeper.mail_live l WHERE l.queue = 'bulk_q') AS live
  FROM gatekeeper.mail WHERE queue = 'bulk_q';

-- a COPY of good rows writes each mail's live row once
COPY gatekeeper.mail (recipient, subject, body, queue, dedupe_key) FROM STDIN (FORMAT csv);
g1@example.com,s,b,bulk_q,g-1
g2@example.com,s,b,bulk_q,
g3@example.com,s,b,bulk_q,g-3
\.
SELECT m.recipient, l.state, l.attempt, l.dedupe_key, l.segment = m.segment AS same_segment
  FROM gatekeeper.mail m JOIN gatekeeper.mail_live l ON l.id = m.id
 WHERE m.queue = 'bulk_q' ORDER BY m.recipient;

DELETE FROM gatekeeper.mail WHERE queue = 'bulk_q';
SELECT gatekeeper.drop_queue('bulk_q');
REVOKE ALL ON gatekeeper.mail FROM regress_bulk_app;
REVOKE ALL ON FUNCTION gatekeeper._segment() FROM regress_bulk_app;
REVOKE ALL ON SCHEMA gatekeeper FROM regress_bulk_app;
DROP ROLE regress_bulk_app;
