-- gatekeeper's bounce pipe (README, "Bounces, complaints and events"):
-- one report, read from standard input, into gatekeeper.ingest_report().
--
--   psql -X -q -v ON_ERROR_STOP=1 -v recipient=ENVELOPE_RECIPIENT -f bounce-pipe.sql < message
--
-- Run with PGCLIENTENCODING=LATIN1, so that any octet of the message is a
-- character and none is refused.  Prints one line per recipient recorded.
\set message `cat`
SELECT r.mail_id, r.recipient, r.event, r.status
  FROM gatekeeper.ingest_report(:'message', nullif(:'recipient', '')) r;
