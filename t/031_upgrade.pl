# Copyright: gatekeeper contributors

# The updates from the released versions (0.1.0 and 0.2.0) to the current
# one.
#
# Database "updated": CREATE EXTENSION gatekeeper VERSION '0.1.0', data in
# it (gates, queues with options, the built-in rows changed, mail in
# several states, gate passes by gate_pass and by claims), then ALTER
# EXTENSION gatekeeper UPDATE.  Database "fresh": CREATE EXTENSION
# gatekeeper.  Both must have the same catalog objects: the extension's
# members; functions with their signatures, defaults, result types,
# properties (kind, volatility, strictness, parallel safety, SECURITY
# DEFINER, settings such as search_path), bodies and ACLs; tables with
# their columns in order (types, defaults, NOT NULL, identity, generated,
# compression), options and ACLs; constraints; indexes; views; triggers
# (enabled or not); sequences; types and enum labels; the extension's
# config tables and their dump conditions; comments.  A mismatch prints
# what is only in one of them, object by object.
#
# The updated database keeps its data: every row of every table (in the
# columns 0.1.0 had), the sequences, and what explain() says of the
# recipients' passes, are as before the update; and it works after.
#
# Claimed mail (issue 11): 0.1.0's claims (leases running and lapsed,
# first and later attempts, handed back before, keyed, a claim of 130)
# are, after the update, each open in exactly one mail_claim batch row
# (rows of up to 128 consecutive ids per queue, worker and lease, as a
# claim makes them) with its attempt, worker and lease, and no row of
# mail_live; mail_key holds the keys of scheduled and claimed mail, and
# (0.3.0, issue 25) of mail that finished within its queue's dedupe
# window.  Then reap() and acks (one at a time and in one call) with the
# (id, attempt) the workers hold (and stale and later attempts) do what
# 0.1.0's own reap() and acks did to the same claims (run before the
# update in a transaction rolled back); a claimed mail's key refuses
# another mail (23505) and enqueue() finds the claimed mail; once the mail
# finished the key is still held within the queue's dedupe window (24
# hours, the update's default for queues that had none), and free once
# the window is '0'.
#
# Database "from020": CREATE EXTENSION gatekeeper VERSION '0.2.0', mail
# in every state and claims held, and roles given 0.2.0's README recipes
# (and one only part of one), then ALTER EXTENSION gatekeeper UPDATE: the
# same objects as "fresh020", a fresh install whose roles got the same uses
# by gatekeeper.grant() (ACLs included: the update remembers the whole
# recipes' roles and gives them what the new version adds), and its data
# intact.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = GatekeeperTest::new_node('upgrade', conf => "gatekeeper.workers = 0\n");
$node->start;

my $current = $node->safe_psql('postgres',
	"SELECT default_version FROM pg_available_extensions WHERE name = 'gatekeeper'");
isnt($current, '0.1.0', "the current version ($current) is not 0.1.0");

$node->safe_psql('postgres', 'CREATE DATABASE updated');
$node->safe_psql('postgres', 'CREATE DATABASE fresh');
$node->safe_psql('postgres', 'CREATE DATABASE from020');
$node->safe_psql('postgres', 'CREATE DATABASE fresh020');

$node->safe_psql('updated', "CREATE EXTENSION gatekeeper VERSION '0.1.0'");
$node->safe_psql('fresh', 'CREATE EXTENSION gatekeeper');
is($node->safe_psql('updated', "SELECT extversion FROM pg_extension WHERE extname = 'gatekeeper'"),
	'0.1.0', 'updated: 0.1.0 installed');

# EXECUTE grants carry over to the functions that replace 0.1.0's array
# overloads (issue 13): granted on the old ones in "updated" and on their
# replacements in "fresh", so that the ACLs compared below must match
$node->safe_psql('postgres', 'CREATE ROLE upgrade_worker; CREATE ROLE upgrade_gates; CREATE ROLE upgrade_app');
$node->safe_psql('updated', q{
GRANT EXECUTE ON FUNCTION gatekeeper.ack(bigint[], int[]), gatekeeper.nack(bigint, int, text, boolean)
   TO upgrade_worker;
GRANT EXECUTE ON FUNCTION gatekeeper.gate_pass(text, text[]) TO upgrade_gates;
GRANT EXECUTE ON FUNCTION gatekeeper.cancel(bigint) TO upgrade_app;
GRANT EXECUTE ON FUNCTION gatekeeper.create_queue(text, text[], text, text, int, int, int, interval),
                          gatekeeper.alter_queue(text, text[], text, text, int, int, int, interval) TO upgrade_app;
});
$node->safe_psql('fresh', q{
GRANT EXECUTE ON FUNCTION gatekeeper.ack_batch(bigint[], int[]), gatekeeper.nack(bigint, int, text, boolean),
                          gatekeeper.nack_batch(bigint[], int[], text[], boolean) TO upgrade_worker;
GRANT EXECUTE ON FUNCTION gatekeeper.gate_pass_batch(text, text[]) TO upgrade_gates;
GRANT EXECUTE ON FUNCTION gatekeeper.cancel(bigint), gatekeeper.cancel(text, text) TO upgrade_app;
GRANT EXECUTE ON FUNCTION gatekeeper.create_queue(text, text[], text, text, int, int, int, interval, boolean,
                                                  text, text, text, boolean, boolean, text, text, interval),
                          gatekeeper.alter_queue(text, text[], text, text, int, int, int, interval, boolean,
                                                 text, text, text, boolean, boolean, text, text, interval),
                          gatekeeper._worker_status() TO upgrade_app;
GRANT SELECT ON gatekeeper.worker_status TO upgrade_app;
});

# 0.2.0 in use: mail in every state, a claim held, passes, a suppression
$node->safe_psql('from020', "CREATE EXTENSION gatekeeper VERSION '0.2.0'");
is($node->safe_psql('from020', "SELECT extversion FROM pg_extension WHERE extname = 'gatekeeper'"),
	'0.2.0', 'from020: 0.2.0 installed');
$node->safe_psql('from020', q{
GRANT EXECUTE ON FUNCTION gatekeeper.ack_batch(bigint[], int[]), gatekeeper.nack(bigint, int, text, boolean),
                          gatekeeper.nack_batch(bigint[], int[], text[], boolean) TO upgrade_worker;
GRANT EXECUTE ON FUNCTION gatekeeper.gate_pass_batch(text, text[]) TO upgrade_gates;
GRANT EXECUTE ON FUNCTION gatekeeper.cancel(bigint), gatekeeper.cancel(text, text) TO upgrade_app;
-- 0.3.0 makes these again (issue 27: feedback_id, unsigned_total): the grants carry over
GRANT EXECUTE ON FUNCTION gatekeeper.create_queue(text, text[], text, text, int, int, int, interval, boolean,
                                                  text, text, text, boolean, boolean),
                          gatekeeper.alter_queue(text, text[], text, text, int, int, int, interval, boolean,
                                                 text, text, text, boolean, boolean),
                          gatekeeper._worker_status() TO upgrade_app;
GRANT SELECT ON gatekeeper.worker_status TO upgrade_app;
});
# 0.2.0's README recipes, whole, and a role given only enqueue()
$node->safe_psql('postgres', 'CREATE ROLE u_enqueue; CREATE ROLE u_worker; CREATE ROLE u_monitor; CREATE ROLE u_partial; CREATE ROLE u_dashboard');
$node->safe_psql('from020', q{
GRANT USAGE ON SCHEMA gatekeeper TO u_enqueue;
GRANT EXECUTE ON FUNCTION gatekeeper.enqueue(text, text, text, text, timestamptz, text, text,
                                             jsonb, text, int, timestamptz, text, jsonb, text) TO u_enqueue;
GRANT INSERT (recipient, subject, body, queue, send_at, html, sender, headers, dedupe_key,
              priority, send_by, recipient_name, metadata, timezone) ON gatekeeper.mail TO u_enqueue;
GRANT EXECUTE ON FUNCTION gatekeeper._segment() TO u_enqueue;
GRANT EXECUTE ON FUNCTION gatekeeper.status(bigint), gatekeeper.find(text, text),
                          gatekeeper.history(text, timestamptz),
                          gatekeeper.cancel(bigint), gatekeeper.cancel(text, text) TO u_enqueue;
GRANT USAGE ON SCHEMA gatekeeper TO u_worker;
GRANT EXECUTE ON FUNCTION gatekeeper.claim(text, int, interval, text[]),
                          gatekeeper.ack(bigint, int), gatekeeper.ack_batch(bigint[], int[]),
                          gatekeeper.nack(bigint, int, text, boolean),
                          gatekeeper.nack_batch(bigint[], int[], text[], boolean),
                          gatekeeper.extend(bigint, int, interval), gatekeeper.reap(),
                          gatekeeper.unclaim(bigint[], int[], text, interval),
                          gatekeeper.next_due(text[]) TO u_worker;
GRANT SELECT ON gatekeeper.queue_stats TO u_worker;
GRANT EXECUTE ON FUNCTION gatekeeper._queue_totals(), gatekeeper._live_stats() TO u_worker;
GRANT USAGE ON SCHEMA gatekeeper TO u_monitor;
GRANT SELECT ON gatekeeper.queue_stats, gatekeeper.gate_memory TO u_monitor;
GRANT EXECUTE ON FUNCTION gatekeeper._queue_totals(), gatekeeper._live_stats(),
                          gatekeeper._gate_memory() TO u_monitor;
GRANT SELECT ON gatekeeper.worker_status TO u_monitor;
GRANT EXECUTE ON FUNCTION gatekeeper._worker_status() TO u_monitor;
GRANT USAGE ON SCHEMA gatekeeper TO u_partial;
GRANT EXECUTE ON FUNCTION gatekeeper.enqueue(text, text, text, text, timestamptz, text, text,
                                             jsonb, text, int, timestamptz, text, jsonb, text) TO u_partial;
-- a dashboard's role, given queue_stats by hand (not by grant()): the
-- view and both of its helpers
GRANT USAGE ON SCHEMA gatekeeper TO u_dashboard;
GRANT SELECT ON gatekeeper.queue_stats TO u_dashboard;
GRANT EXECUTE ON FUNCTION gatekeeper._queue_totals(), gatekeeper._live_stats() TO u_dashboard;
});
# the fresh install they are compared with: the same grants, the recipes by grant()
$node->safe_psql('fresh020', q{
CREATE EXTENSION gatekeeper;
GRANT EXECUTE ON FUNCTION gatekeeper.ack_batch(bigint[], int[]), gatekeeper.nack(bigint, int, text, boolean),
                          gatekeeper.nack_batch(bigint[], int[], text[], boolean) TO upgrade_worker;
GRANT EXECUTE ON FUNCTION gatekeeper.gate_pass_batch(text, text[]) TO upgrade_gates;
GRANT EXECUTE ON FUNCTION gatekeeper.cancel(bigint), gatekeeper.cancel(text, text) TO upgrade_app;
GRANT EXECUTE ON FUNCTION gatekeeper.create_queue(text, text[], text, text, int, int, int, interval, boolean,
                                                  text, text, text, boolean, boolean, text, text, interval),
                          gatekeeper.alter_queue(text, text[], text, text, int, int, int, interval, boolean,
                                                 text, text, text, boolean, boolean, text, text, interval),
                          gatekeeper._worker_status() TO upgrade_app;
GRANT SELECT ON gatekeeper.worker_status TO upgrade_app;
SELECT gatekeeper.grant('u_enqueue', 'enqueue');
SELECT gatekeeper.grant('u_worker', 'worker');
SELECT gatekeeper.grant('u_monitor', 'monitor');
GRANT USAGE ON SCHEMA gatekeeper TO u_partial;
GRANT EXECUTE ON FUNCTION gatekeeper.enqueue(text, text, text, text, timestamptz, text, text,
                                             jsonb, text, int, timestamptz, text, jsonb, text,
                                             text, jsonb) TO u_partial;
GRANT USAGE ON SCHEMA gatekeeper TO u_dashboard;
GRANT SELECT ON gatekeeper.queue_stats TO u_dashboard;
GRANT EXECUTE ON FUNCTION gatekeeper._queue_totals(), gatekeeper._live_stats(),
                          gatekeeper._queue_rates() TO u_dashboard;
});
# The mail, claims and passes 0.2.0's library made, written as it wrote
# them: its functions that call into the library (enqueue through the
# insert trigger, claim, ack, nack, gate_pass, reap) cannot run with this
# one, which serves the current schema only (SPEC "Versions").  The
# queues, gates and the suppression are 0.2.0's own SQL functions'.
$node->safe_psql(
	'from020', q{
SELECT gatekeeper.create_gate('weekly', '7 days', 3);
SELECT gatekeeper.create_queue('promo', gates => '{smart_sending,weekly}', on_gate_closed => 'defer',
	max_attempts => 3, weight => 2, rate_limit => 1000, dedupe_window => '1 day');
SELECT gatekeeper.create_queue('strict', gates => '{smart_sending}');
SELECT gatekeeper.create_queue('once', delivery => 'at_most_once');
SELECT gatekeeper.alter_queue('default', weight => 5);
SELECT gatekeeper.alter_gate('smart_sending', period => '20 hours');
SELECT gatekeeper.suppress('news@example.com', 'manual');
});
$node->safe_psql(
	'from020', q{
BEGIN;
SET LOCAL session_replication_role = replica;
-- (the live count's triggers fire ALWAYS: the count is written below)
ALTER TABLE gatekeeper.mail_live DISABLE TRIGGER mail_live_count_insert;
-- the content, in the order 0.2.0 enqueued it
INSERT INTO gatekeeper.mail (queue, recipient, subject, body, dedupe_key, send_at, send_by, segment)
VALUES ('promo', 'sent@example.com', 'Sent', 'Body', 'sent-1', now(), NULL, 0),
	   ('promo', 'failed@example.com', 'Failed', 'Body', 'failed-1', now(), NULL, 0),
	   ('promo', 'held@example.com', 'Held', 'Body', 'held-1', now(), NULL, 0),
	   ('strict', 'passed@example.com', 'Suppressed', 'Body', NULL, now(), NULL, 0),
	   ('strict', 'late@example.com', 'Expired', 'Body', NULL, now() - interval '2 hours',
		now() - interval '1 hour', 0),
	   ('once', 'lost@example.com', 'Unknown', 'Body', NULL, now(), NULL, 0),
	   ('default', 'later@example.com', 'Later', 'Body', 'later-1', now() + interval '2 days', NULL, 0),
	   ('default', 'gone@example.com', 'Gone', 'Body', NULL, now() + interval '1 day', NULL, 0);
-- w1's claim of three in promo: sent@ acked, failed@ nacked for good,
-- held@ still held (a batch of one open claim); the others' outcomes
INSERT INTO gatekeeper.mail_done (id, queue, state, attempt, uncharged, send_at, worker, message_id,
								  last_error, dedupe_key, finished_at, segment)
SELECT m.id, m.queue, o.state::gatekeeper.state, o.attempt, 0, m.send_at, o.worker,
	   CASE WHEN o.attempt > 0 THEN format('<%s.%s@example.com>', m.id, to_hex(m.id * 7919)) END,
	   o.error, m.dedupe_key, now(), m.segment
  FROM gatekeeper.mail m
  JOIN (VALUES ('sent@example.com', 'sent', 1, 'w1', NULL),
			   ('failed@example.com', 'failed', 1, 'w1', 'mailbox unavailable'),
			   ('passed@example.com', 'suppressed', 0, NULL, 'gate "smart_sending" closed'),
			   ('late@example.com', 'expired', 0, NULL, 'not sent before send_by'),
			   ('lost@example.com', 'unknown', 1, 'w3', 'lease expired'),
			   ('gone@example.com', 'cancelled', 0, NULL, NULL))
	   AS o(recipient, state, attempt, worker, error) ON o.recipient = m.recipient;
INSERT INTO gatekeeper.mail_claim (queue, worker, lease_until, lo, hi, open, mails)
SELECT m.queue, 'w1', now() + interval '1 hour', m.id, m.id, 1,
	   ARRAY[ROW(m.id, m.queue, m.priority, m.send_at, 'claimed', 1, 0, NULL, 'w1',
				 format('<%s.%s@example.com>', m.id, to_hex(m.id * 7919)), NULL, m.dedupe_key,
				 m.segment)::gatekeeper.mail_live]
  FROM gatekeeper.mail m WHERE m.recipient = 'held@example.com';
INSERT INTO gatekeeper.mail_live (id, queue, priority, send_at, dedupe_key, segment)
SELECT m.id, m.queue, m.priority, m.send_at, m.dedupe_key, m.segment
  FROM gatekeeper.mail m WHERE m.recipient = 'later@example.com';
INSERT INTO gatekeeper.mail_live_count (queue, slot, scheduled) VALUES ('default', 0, 1);
INSERT INTO gatekeeper.mail_key (queue, dedupe_key, id)
SELECT m.queue, m.dedupe_key, m.id FROM gatekeeper.mail m
 WHERE m.recipient IN ('held@example.com', 'later@example.com');
-- the passes: the claim's (held by the mails), failed@'s given back,
-- gate_pass('smart_sending', 'passed@example.com') and three of capped@
-- at weekly
INSERT INTO gatekeeper.gate_log (gate, released, expires, recipients, holders)
SELECT g.id, false, now() + g.period, p.recipients, p.holders
  FROM gatekeeper.gate g,
	   LATERAL (SELECT array_agg(m.recipient ORDER BY m.id) AS recipients, array_agg(m.id ORDER BY m.id) AS holders
				  FROM gatekeeper.mail m WHERE m.queue = 'promo') p
 WHERE g.name IN ('smart_sending', 'weekly');
INSERT INTO gatekeeper.gate_log (gate, released, expires, recipients, holders)
SELECT g.id, true, now() + g.period, ARRAY[m.recipient], ARRAY[m.id]
  FROM gatekeeper.gate g, gatekeeper.mail m
 WHERE g.name IN ('smart_sending', 'weekly') AND m.recipient = 'failed@example.com';
INSERT INTO gatekeeper.gate_log (gate, released, expires, recipients, holders)
SELECT g.id, false, now() + g.period, ARRAY['passed@example.com'], NULL
  FROM gatekeeper.gate g WHERE g.name = 'smart_sending';
INSERT INTO gatekeeper.gate_log (gate, released, expires, recipients, holders)
SELECT g.id, false, now() + g.period, ARRAY['capped@example.com', 'capped@example.com', 'capped@example.com'],
	   ARRAY[1, 2, 3]::bigint[]
  FROM gatekeeper.gate g WHERE g.name = 'weekly';
ALTER TABLE gatekeeper.mail_live ENABLE ALWAYS TRIGGER mail_live_count_insert;
COMMIT;
});

# 0.1.0 in use.  The mail, claims and passes 0.1.0's library made are
# written as it wrote them (state in gatekeeper.mail itself): its
# functions that call into the library (enqueue through the insert
# trigger, claim, the array ack, gate_pass, nack's and reap's releases)
# cannot run with this one, which serves the current schema only (SPEC
# "Versions").  The queues and gates are 0.1.0's own SQL functions'.
$node->safe_psql(
	'updated', q{
SELECT gatekeeper.create_gate('weekly', '7 days', 3);
SELECT gatekeeper.create_queue('promo', gates => '{smart_sending,weekly}', on_gate_closed => 'defer',
	max_attempts => 3, weight => 2, rate_limit => 1000, dedupe_window => '1 day');
SELECT gatekeeper.create_queue('news', delivery => 'at_most_once');
SELECT gatekeeper.pause('news');
SELECT gatekeeper.alter_queue('default', weight => 5);
SELECT gatekeeper.alter_gate('smart_sending', period => '20 hours');
SELECT gatekeeper.create_queue('strict', gates => '{smart_sending}');
SELECT gatekeeper.create_queue('once', delivery => 'at_most_once');
SELECT gatekeeper.create_queue('single', max_attempts => 1);
SELECT gatekeeper.create_queue('blind', delivery => 'at_most_once');
SELECT gatekeeper.create_queue('wide');
});

# The mail, in the order 0.1.0 enqueued it: w1's claim of three in promo
# (sent@ acked, failed@ nacked for good, held@ held), mail scheduled (two
# more in promo, one due in two days, one in the paused queue, a retry due
# later), the terminal states (cancelled, suppressed at a closed gate,
# expired past send_by, unknown: an at-most-once lease ran out), and the
# claims 0.1.0 holds, which the update moves into mail_claim batches:
# held@ (promo, gated, keyed); 130 in one claim of w7 (more than one batch
# row's worth); two at their second attempt (one after a retry, one after
# a hand-back: uncharged) in one claim of w5; three in one claim of w4; and
# three of w6 whose lease ran out without a reap, in three queues (at
# least once with attempts left, attempts spent, at most once).  Keyed
# where a key can be.
$node->safe_psql(
	'updated', q{
BEGIN;
SET LOCAL session_replication_role = replica;
INSERT INTO gatekeeper.mail (queue, recipient, subject, body, dedupe_key, priority, send_at, send_by,
							 html, headers, state, attempt, uncharged, lease_until, worker, last_error,
							 finished_at)
SELECT queue, recipient, subject, 'Body', key, priority, send_at, send_by, html, headers::jsonb,
	   state::gatekeeper.state, attempt, uncharged, lease_until, worker, error, finished_at
  FROM (VALUES
	(1, 'promo', 'sent@example.com', 'Sent', 'sent-1', 0, now(), NULL::timestamptz, NULL, NULL,
	 'sent', 1, 0, NULL::timestamptz, 'w1', NULL, now()),
	(2, 'promo', 'failed@example.com', 'Failed', 'failed-1', 0, now(), NULL, NULL, NULL,
	 'failed', 1, 0, NULL, 'w1', 'mailbox unavailable', now()),
	(3, 'promo', 'held@example.com', 'Held', 'held-1', 0, now(), NULL, NULL, NULL,
	 'claimed', 1, 0, now() + interval '1 hour', 'w1', NULL, NULL),
	(4, 'promo', 'passed@example.com', 'Passed', 'passed-1', 0, now(), NULL, NULL, NULL,
	 'scheduled', 0, 0, NULL, NULL, NULL, NULL),
	(5, 'promo', 'fresh@example.com', 'Fresh', 'fresh-1', 3, now(), NULL, '<p>Fresh</p>',
	 '{"X-Campaign": "spring"}', 'scheduled', 0, 0, NULL, NULL, NULL, NULL),
	(6, 'default', 'later@example.com', 'Later', NULL, 0, now() + interval '2 days', NULL, NULL, NULL,
	 'scheduled', 0, 0, NULL, NULL, NULL, NULL),
	(7, 'news', 'news@example.com', 'News', NULL, 0, now(), NULL, NULL, NULL,
	 'scheduled', 0, 0, NULL, NULL, NULL, NULL),
	(8, 'default', 'gone@example.com', 'Gone', NULL, 0, now() + interval '1 day', NULL, NULL, NULL,
	 'cancelled', 0, 0, NULL, NULL, NULL, now()),
	(9, 'strict', 'passed@example.com', 'Suppressed', NULL, 0, now(), NULL, NULL, NULL,
	 'suppressed', 0, 0, NULL, NULL, 'gate "smart_sending" closed', now()),
	(10, 'strict', 'late@example.com', 'Expired', NULL, 0, now() - interval '2 hours',
	 now() - interval '1 hour', NULL, NULL, 'expired', 0, 0, NULL, NULL, 'not sent before send_by', now()),
	(11, 'once', 'lost@example.com', 'Unknown', NULL, 0, now(), NULL, NULL, NULL,
	 'unknown', 1, 0, NULL, NULL, 'lease expired', now()),
	(12, 'once', 'retry@example.com', 'Retry', NULL, 0, now() + interval '30 seconds', NULL, NULL, NULL,
	 'scheduled', 1, 0, NULL, NULL, '451 try later', NULL)) AS m(n, queue, recipient, subject, key,
	 priority, send_at, send_by, html, headers, state, attempt, uncharged, lease_until, worker, error,
	 finished_at)
 ORDER BY n;
INSERT INTO gatekeeper.mail (queue, recipient, subject, body, state, attempt, lease_until, worker)
SELECT 'wide', 'wide' || i || '@example.com', 'Wide', 'Body', 'claimed', 1, now() + interval '1 hour', 'w7'
  FROM generate_series(1, 130) AS i ORDER BY i;
INSERT INTO gatekeeper.mail (queue, recipient, subject, body, dedupe_key, state, attempt, uncharged,
							 lease_until, worker, last_error)
SELECT queue, recipient, initcap(split_part(recipient, '@', 1)), 'Body', key, 'claimed', attempt, uncharged,
	   lease_until, worker, error
  FROM (VALUES
	(1, 'default', 'again@example.com', 'again-1', 2, 0, now() + interval '1 hour', 'w5', '451 busy'),
	(2, 'default', 'handed@example.com', 'handed-1', 2, 1, now() + interval '1 hour', 'w5', 'no relay'),
	(3, 'default', 'kept1@example.com', 'kept-1', 1, 0, now() + interval '50 minutes', 'w4', NULL),
	(4, 'default', 'kept2@example.com', 'kept-2', 1, 0, now() + interval '50 minutes', 'w4', NULL),
	(5, 'default', 'kept3@example.com', 'kept-3', 1, 0, now() + interval '50 minutes', 'w4', NULL),
	(6, 'default', 'back@example.com', 'back-1', 1, 0, now() - interval '1 second', 'w6', NULL),
	(7, 'single', 'spent@example.com', 'spent-1', 1, 0, now() - interval '1 second', 'w6', NULL),
	(8, 'blind', 'lapsed@example.com', 'lapsed-1', 1, 0, now() - interval '1 second', 'w6', NULL))
	AS c(n, queue, recipient, key, attempt, uncharged, lease_until, worker, error)
 ORDER BY n;
-- each claim's Message-ID, as 0.1.0's claim made it
UPDATE gatekeeper.mail SET message_id = format('<%s.%s@example.com>', id, to_hex(id * 7919))
 WHERE attempt > 0;
-- the passes: w1's claim's (held by the mails), failed@'s given back,
-- gate_pass('smart_sending', 'passed@example.com'), three of capped@ at
-- weekly, and gate_pass('weekly', ARRAY['b1@example.com', 'b2@example.com'])
INSERT INTO gatekeeper.gate_log (gate, released, expires, recipients, holders)
SELECT g.id, false, now() + g.period, p.recipients, p.holders
  FROM gatekeeper.gate g,
	   LATERAL (SELECT array_agg(m.recipient ORDER BY m.id) AS recipients, array_agg(m.id ORDER BY m.id) AS holders
				  FROM gatekeeper.mail m WHERE m.queue = 'promo' AND m.attempt > 0) p
 WHERE g.name IN ('smart_sending', 'weekly');
INSERT INTO gatekeeper.gate_log (gate, released, expires, recipients, holders)
SELECT g.id, true, now() + g.period, ARRAY[m.recipient], ARRAY[m.id]
  FROM gatekeeper.gate g, gatekeeper.mail m
 WHERE g.name IN ('smart_sending', 'weekly') AND m.recipient = 'failed@example.com';
INSERT INTO gatekeeper.gate_log (gate, released, expires, recipients, holders)
SELECT g.id, false, now() + g.period, ARRAY['passed@example.com'], NULL
  FROM gatekeeper.gate g WHERE g.name = 'smart_sending';
INSERT INTO gatekeeper.gate_log (gate, released, expires, recipients, holders)
SELECT g.id, false, now() + g.period, ARRAY['capped@example.com', 'capped@example.com', 'capped@example.com'],
	   ARRAY[1, 2, 3]::bigint[]
  FROM gatekeeper.gate g WHERE g.name = 'weekly';
INSERT INTO gatekeeper.gate_log (gate, released, expires, recipients, holders)
SELECT g.id, false, now() + g.period, ARRAY['b1@example.com', 'b2@example.com'], NULL
  FROM gatekeeper.gate g WHERE g.name = 'weekly';
COMMIT;
});

# the claims 0.1.0 holds: each claimed mail with its claim state
my $claims_010 = q{
SELECT string_agg(format('%s %s %s attempt %s uncharged %s worker %s lease %s message %s key %s error %s',
						 id, queue, state, attempt, uncharged, worker, lease_until, message_id,
						 dedupe_key, last_error), E'\n' ORDER BY id)
  FROM gatekeeper.mail WHERE state = 'claimed'};
my $claims_before = $node->safe_psql('updated', $claims_010);
my $claimed = $node->safe_psql('updated',
	"SELECT array_agg(id ORDER BY id) FROM gatekeeper.mail WHERE state = 'claimed'");
is( $node->safe_psql(
		'updated', q{
SELECT string_agg(format('%s:%s:%s:%s', recipient, attempt, uncharged,
						 CASE WHEN lease_until < now() THEN 'lapsed' ELSE 'leased' END), ',' ORDER BY id)
  FROM gatekeeper.mail WHERE state = 'claimed' AND queue <> 'wide'}),
	'held@example.com:1:0:leased,again@example.com:2:0:leased,handed@example.com:2:1:leased,'
	  . 'kept1@example.com:1:0:leased,kept2@example.com:1:0:leased,kept3@example.com:1:0:leased,'
	  . 'back@example.com:1:0:lapsed,spent@example.com:1:0:lapsed,lapsed@example.com:1:0:lapsed',
	'updated: 0.1.0 holds claims at first and later attempts, leases running and lapsed');
is($node->safe_psql('updated', "SELECT count(*) FROM gatekeeper.mail WHERE state = 'claimed' AND worker = 'w7'"),
	'130', 'updated: ... and a claim of 130');
# the batch rows a claim of these would make: per queue, worker and lease
# (one claim statement of 0.1.0), one per CLAIM_BATCH_MAILS mails, read
# from src/claim.c so that the update's batching is held to the claim's
open(my $claim_c, '<', 'src/mail/claim.c') or die "src/mail/claim.c: $!";
my ($batch_mails) = join('', <$claim_c>) =~ /^#define\s+CLAIM_BATCH_MAILS\s+(\d+)/m
  or die 'no CLAIM_BATCH_MAILS in src/mail/claim.c';
close $claim_c;
my $claim_rows = $node->safe_psql(
	'updated', qq{
SELECT sum((n + $batch_mails - 1) / $batch_mails)
  FROM (SELECT count(*) AS n FROM gatekeeper.mail WHERE state = 'claimed'
		 GROUP BY queue, worker, lease_until) g});
# the claims as their workers hold them: (id, attempt); w4's claim of
# three is acked in one call (ack_batch, 0.1.0's array ack)
my $claimed_attempts = $node->safe_psql('updated',
	"SELECT array_agg(attempt ORDER BY id) FROM gatekeeper.mail WHERE state = 'claimed'");
my ($w4_ids, $w4_attempts) = split /\|/, $node->safe_psql('updated',
	"SELECT array_agg(id ORDER BY id), array_agg(attempt ORDER BY id) FROM gatekeeper.mail WHERE worker = 'w4' AND state = 'claimed'");
# the keys of unfinished mail, scheduled and claimed, and (0.3.0) those of
# mail finished, but not cancelled, within its queue's dedupe window (24
# hours where it had none): the mail that holds each
my $keys_010 = $node->safe_psql(
	'updated', q{
SELECT string_agg(format('%s %s %s', queue, dedupe_key, id), E'\n' ORDER BY queue, dedupe_key)
  FROM (SELECT DISTINCT ON (m.queue, m.dedupe_key) m.queue, m.dedupe_key, m.id
		  FROM gatekeeper.mail m JOIN gatekeeper.queue q ON q.name = m.queue
		 WHERE m.dedupe_key IS NOT NULL
		   AND (m.state IN ('scheduled', 'claimed')
				OR (m.state <> 'cancelled'
					AND m.finished_at > now() - coalesce(q.dedupe_window, interval '24 hours')))
		 ORDER BY m.queue, m.dedupe_key, m.state IN ('scheduled', 'claimed') DESC,
				  m.finished_at DESC) k});

# After the update: reap() (the lapsed ones), then the acks of w4's claims
# in one call with later attempts, their own (twice), and an ack of each
# claim (as its worker holds it: id and attempt) with a stale attempt, a
# later one, its own (twice); the claims' state after each.  They must do
# to the same mails what 0.1.0 did (below; RELATION: mail_status;
# ACK_BATCH: ack_batch, for 0.1.0's ack(bigint[], int[]),
# or ack_batch).
my $reap_and_ack = q{
SELECT 'reap ' || gatekeeper.reap();
SELECT '-- after reap';
SELECT format('%s %s attempt %s uncharged %s send_at %s worker %s lease %s message %s error %s finished %s',
			  id, state, attempt, uncharged, send_at, worker, lease_until, message_id,
			  last_error, finished_at IS NOT NULL)
  FROM gatekeeper.RELATION WHERE id = ANY ('CLAIMED') ORDER BY id;
SELECT '-- acks';
SELECT format('batch %s %s %s',
			  ACK_BATCH('W4IDS'::bigint[], array(SELECT a + 1 FROM unnest('W4ATTEMPTS'::int[]) a)),
			  ACK_BATCH('W4IDS'::bigint[], 'W4ATTEMPTS'::int[]),
			  ACK_BATCH('W4IDS'::bigint[], 'W4ATTEMPTS'::int[]));
SELECT format('%s %s %s %s %s', s.id, gatekeeper.ack(s.id, s.attempt - 1),
			  gatekeeper.ack(s.id, s.attempt + 1), gatekeeper.ack(s.id, s.attempt),
			  gatekeeper.ack(s.id, s.attempt))
  FROM (SELECT * FROM unnest('CLAIMED'::bigint[], 'ATTEMPTS'::int[]) AS c(id, attempt) ORDER BY id) s;
SELECT '-- after acks';
SELECT format('%s %s attempt %s uncharged %s send_at %s worker %s lease %s message %s error %s finished %s',
			  id, state, attempt, uncharged, send_at, worker, lease_until, message_id,
			  last_error, finished_at IS NOT NULL)
  FROM gatekeeper.RELATION WHERE id = ANY ('CLAIMED') ORDER BY id;
};
$reap_and_ack =~ s/W4IDS/$w4_ids/g;
$reap_and_ack =~ s/W4ATTEMPTS/$w4_attempts/g;
$reap_and_ack =~ s/CLAIMED/$claimed/g;
$reap_and_ack =~ s/ATTEMPTS/$claimed_attempts/g;

# the output of $reap_and_ack, in its parts
sub reap_and_ack_parts
{
	my ($out) = @_;
	my %parts;
	my $part = 'reap';
	foreach my $line (split /\n/, $out)
	{
		if ($line =~ /^-- (.*)$/) { $part = $1; next; }
		$parts{$part} .= "$line\n";
	}
	return \%parts;
}

# What 0.1.0 did with these claims, as its reap() and acks were written
# (they call the library, and cannot run with this one): reap() takes each
# claim whose lease ran out back (scheduled again while attempts are left,
# failed once they are spent, unknown in an at-most-once queue; worker and
# lease cleared, error 'lease expired', finished unless scheduled again)
# and leaves the others as they are; of w4's claims acked in one call with
# later attempts none counts, with their own all three, again none; each
# claim then acked with a stale attempt, a later one, its own, its own
# again: false, false, true (unless reaped, or acked in w4's call), false;
# an acked claim is sent, its lease cleared, finished.
my $old_ways;
{
	my $sql = q{
CREATE TEMP TABLE claim_010 AS
SELECT r.*, CASE WHEN NOT r.lapsed THEN 'claimed'
				 WHEN r.delivery = 'at_most_once' THEN 'unknown'
				 WHEN r.attempt - r.uncharged >= r.max_attempts THEN 'failed'
				 ELSE 'scheduled' END AS reaped,
	   NOT r.lapsed AND r.worker IS DISTINCT FROM 'w4' AS acked_alone
  FROM (SELECT m.*, q.delivery, q.max_attempts, m.lease_until < now() AS lapsed
		  FROM gatekeeper.mail m JOIN gatekeeper.queue q ON q.name = m.queue
		 WHERE m.id = ANY ('CLAIMED')) r;
SELECT 'reap ' || count(*) FILTER (WHERE lapsed) FROM claim_010;
SELECT '-- after reap';
SELECT format('%s %s attempt %s uncharged %s send_at %s worker %s lease %s message %s error %s finished %s',
			  id, reaped, attempt, uncharged, send_at, CASE WHEN NOT lapsed THEN worker END,
			  CASE WHEN NOT lapsed THEN lease_until END, message_id,
			  CASE WHEN lapsed THEN 'lease expired' ELSE last_error END,
			  reaped NOT IN ('claimed', 'scheduled'))
  FROM claim_010 ORDER BY id;
SELECT '-- acks';
SELECT format('batch 0 %s 0', count(*)) FROM claim_010 WHERE worker = 'w4' AND NOT lapsed;
SELECT format('%s f f %s f', id, acked_alone) FROM claim_010 ORDER BY id;
SELECT '-- after acks';
SELECT format('%s %s attempt %s uncharged %s send_at %s worker %s lease %s message %s error %s finished %s',
			  id, CASE WHEN lapsed THEN reaped ELSE 'sent' END, attempt, uncharged, send_at,
			  CASE WHEN NOT lapsed THEN worker END, NULL, message_id,
			  CASE WHEN lapsed THEN 'lease expired' ELSE last_error END,
			  reaped <> 'scheduled')
  FROM claim_010 ORDER BY id;
};
	$sql =~ s/CLAIMED/$claimed/g;
	my $out = $node->safe_psql('updated', $sql);
	$old_ways = reap_and_ack_parts($out);
	note("what 0.1.0's reap and acks did:\n$out");
}
is($node->safe_psql('updated', $claims_010), $claims_before, 'updated: ... and holds them as before');

# ---------------------------------------------------------------- data

my @recipients = map { "$_\@example.com" }
  qw(sent failed held passed fresh capped b1 b2 news new);
my %table_key = (queue => 'name', gate => 'name', mail => 'id', gate_log => 'id');

# the tables' columns in the updated database now (0.1.0's); durations are
# compared by length, since the update stores each as its exact length
# ('7 days' becomes '168:00:00', the same interval); a queue without a
# dedupe window gets the default of 24 hours from the 0.3.0 update (issue
# 25: keys are held for the window after their mail finished), which is
# what it is compared as
my %old_columns;
foreach my $table (sort keys %table_key)
{
	$old_columns{$table} = $node->safe_psql(
		'updated', qq{
SELECT string_agg(CASE WHEN attname = 'dedupe_window'
					   THEN format('extract(epoch FROM coalesce(%I, interval ''24 hours''))', attname)
					   WHEN atttypid = 'interval'::regtype
					   THEN format('extract(epoch FROM %I)', attname)
					   ELSE quote_ident(attname) END, ', ' ORDER BY attnum) FROM pg_attribute
 WHERE attrelid = 'gatekeeper.$table'::regclass AND attnum > 0 AND NOT attisdropped});
}

sub data_snapshot
{
	my ($db) = @_;
	my %s;
	foreach my $table (sort keys %table_key)
	{
		# 0.2.0 keeps the mail's state apart from its content:
		# gatekeeper.mail_status has every column 0.1.0's mail had
		my $from = $table;
		$from = 'mail_status'
		  if $table eq 'mail'
		  && $node->safe_psql($db, "SELECT to_regclass('gatekeeper.mail_status') IS NOT NULL") eq 't';
		$s{$table} = $node->safe_psql($db,
			"SELECT $old_columns{$table} FROM gatekeeper.$from ORDER BY $table_key{$table}");
	}
	foreach my $seq (qw(mail gate gate_log))
	{
		$s{"${seq}_id_seq"} = $node->safe_psql($db,
			"SELECT last_value, is_called FROM gatekeeper.${seq}_id_seq");
	}
	# the recipients' passes: what explain() says of them once updated;
	# before, what the log holds (explain() calls the library, which
	# serves the current version only): the unexpired passes at each gate
	# less those given back
	my $list = join(',', map { "'$_'" } @recipients);
	my $version = $node->safe_psql($db, "SELECT extversion FROM pg_extension WHERE extname = 'gatekeeper'");
	$s{passes} = $node->safe_psql(
		$db, $version eq $current ? qq{
SELECT r, e.gate, e.open, e.sends_in_period, e.max_sends
  FROM unnest(ARRAY[$list]) AS r, gatekeeper.explain(r) AS e
 ORDER BY r, e.gate} : qq{
SELECT r, g.name, c.n < g.max_sends, c.n, g.max_sends
  FROM unnest(ARRAY[$list]) AS r
 CROSS JOIN gatekeeper.gate g
 CROSS JOIN LATERAL (
	SELECT (count(*) FILTER (WHERE NOT l.released) - count(*) FILTER (WHERE l.released))::int AS n
	  FROM gatekeeper.gate_log l, unnest(l.recipients, l.holders) AS u(recipient, holder)
	 WHERE l.gate = g.id AND u.recipient = lower(r) AND l.expires > now()) c
 ORDER BY r, g.name});
	return \%s;
}

my $before = data_snapshot('updated');
foreach my $state (qw(scheduled claimed sent failed suppressed expired cancelled unknown))
{
	like($before->{mail}, qr/\|$state\|/, "updated: mail $state before the update");
}

$node->safe_psql('updated', 'ALTER EXTENSION gatekeeper UPDATE');
# 0.1.0 has no worker_status: granted as "fresh" has it (from020 checks
# that the update keeps these grants)
$node->safe_psql('updated',
	'GRANT EXECUTE ON FUNCTION gatekeeper._worker_status() TO upgrade_app; '
	  . 'GRANT SELECT ON gatekeeper.worker_status TO upgrade_app');
is($node->safe_psql('updated', "SELECT extversion FROM pg_extension WHERE extname = 'gatekeeper'"),
	$current, "updated: ALTER EXTENSION gatekeeper UPDATE reaches $current");

my $after = data_snapshot('updated');
foreach my $what (sort keys %$before)
{
	is($after->{$what}, $before->{$what}, "updated: $what intact");
}

my $before020 = data_snapshot('from020');
foreach my $state (qw(scheduled claimed sent failed suppressed expired cancelled unknown))
{
	like($before020->{mail}, qr/\|$state\|/, "from020: mail $state before the update");
}
$node->safe_psql('from020', 'ALTER EXTENSION gatekeeper UPDATE');
is($node->safe_psql('from020', "SELECT extversion FROM pg_extension WHERE extname = 'gatekeeper'"),
	$current, "from020: ALTER EXTENSION gatekeeper UPDATE reaches $current");
my $after020 = data_snapshot('from020');
foreach my $what (sort keys %$before020)
{
	is($after020->{$what}, $before020->{$what}, "from020: $what intact");
}
is($node->safe_psql('from020', "SELECT string_agg(role || ' ' || what, ', ' ORDER BY role::text) FROM gatekeeper.role_grant"),
	'u_enqueue enqueue, u_monitor monitor, u_worker worker',
	'from020: the roles that held a 0.2.0 recipe whole are remembered with its use, the partial one not');

# what is granted by hand on a view or function the update makes again
# carries over: the dashboard's role still reads queue_stats (42501 if
# the view's grant, or a helper's, was lost)
{
	my ($ret, $out, $err) = $node->psql('from020',
		"SET ROLE u_dashboard; SELECT count(*) > 0 FROM gatekeeper.queue_stats");
	is($ret, 0, 'from020: a role given queue_stats by hand on 0.2.0 still reads it after the update')
	  or diag($err);
	is($out, 't', 'from020: ... and sees its queues');
}

# queue_stats' live counts (scheduled kept in mail_live_count from the
# update on, claimed from the batches of mail_claim) against a count of
# the live mail's states (claimed mail is in no row of mail_live: its
# state is read through mail_status)
# (and, issue 28, retrying: scheduled mail claimed before, counted by the
# update)
my $kept_counts = q{
SELECT string_agg(format('%s %s/%s/%s/%s', queue, scheduled, claimed, due, retrying), ', ' ORDER BY queue)
  FROM gatekeeper.queue_stats WHERE scheduled + claimed > 0};
my $live_counts = q{
SELECT string_agg(format('%s %s/%s/%s/%s', queue, s, c, d, r), ', ' ORDER BY queue)
  FROM (SELECT queue, count(*) FILTER (WHERE state = 'scheduled') AS s,
			   count(*) FILTER (WHERE state = 'claimed') AS c,
			   count(*) FILTER (WHERE state = 'scheduled' AND send_at <= now()) AS d,
			   count(*) FILTER (WHERE state = 'scheduled' AND attempt > 0) AS r
		  FROM gatekeeper.mail_status WHERE state IN ('scheduled', 'claimed') GROUP BY queue) l};
my $counted = $node->safe_psql('updated', $live_counts);
like($counted, qr{ [1-9][0-9]*/[1-9]}, 'updated: live mail both scheduled and claimed in one queue');
like($counted, qr{/[1-9][0-9]*(,|$)}, 'updated: live mail retrying after a failed attempt');
is($node->safe_psql('updated', $kept_counts), $counted,
	'updated: queue_stats counts the live mail the update moved');

# 0.1.0's claims are claimed mail of the new layout: each open in exactly
# one batch row of mail_claim, with its claim state in the row's record and
# its worker and lease the row's; no longer in mail_live
is( $node->safe_psql(
		'updated', q{
SELECT string_agg(format('%s %s %s attempt %s uncharged %s worker %s lease %s message %s key %s error %s',
						 r.id, c.queue, r.state, r.attempt, r.uncharged, c.worker, c.lease_until,
						 r.message_id, r.dedupe_key, r.last_error), E'\n' ORDER BY r.id)
  FROM gatekeeper.mail_claim c, unnest(c.mails) r
 WHERE NOT r.id = ANY (c.gone)}),
	$claims_before, 'updated: each claim open in one batch, with its attempt, worker and lease');
# as a claim makes them: a queue's mails of one claim in rows of up to
# CLAIM_BATCH_MAILS of consecutive ids (rows of one claim do not overlap);
# a row's open count, id range, queue and worker those of its records
is( $node->safe_psql(
		'updated', qq{
SELECT count(*),
	   count(*) FILTER (WHERE o.n = c.open AND o.lo = c.lo AND o.hi = c.hi AND o.same AND o.n <= $batch_mails
						  AND NOT EXISTS (
							SELECT FROM gatekeeper.mail_claim d
							 WHERE d.batch <> c.batch AND d.queue = c.queue
							   AND d.worker IS NOT DISTINCT FROM c.worker AND d.lease_until = c.lease_until
							   AND int8range(d.lo, d.hi, '[]') && int8range(c.lo, c.hi, '[]')))
  FROM gatekeeper.mail_claim c,
	   LATERAL (SELECT count(*) AS n, min(r.id) AS lo, max(r.id) AS hi,
					   bool_and(r.queue = c.queue AND r.worker IS NOT DISTINCT FROM c.worker) AS same
				  FROM unnest(c.mails) r WHERE NOT r.id = ANY (c.gone)) o}),
	"$claim_rows|$claim_rows",
	"updated: claims in batch rows of up to $batch_mails consecutive ids per queue, worker and lease, as a claim makes them");
is( $node->safe_psql(
		'updated',
		"SELECT count(*) FROM gatekeeper.mail_live WHERE state <> 'scheduled' OR id = ANY ('$claimed')"),
	'0', 'updated: mail_live holds scheduled mail only');
# the dedupe keys of unfinished mail, in mail_key
is( $node->safe_psql(
		'updated', q{
SELECT string_agg(format('%s %s %s', queue, dedupe_key, id), E'\n' ORDER BY queue, dedupe_key)
  FROM gatekeeper.mail_key}),
	$keys_010, 'updated: mail_key holds the keys of scheduled and claimed mail, and of mail finished within its window');

# ---------------------------------------------------------------- catalog

# Each query returns one line per object, in a form that does not depend
# on OIDs or on the order objects were made in.  ACLs are compared as
# effective privileges (NULL as the default it stands for), sorted.
my $ext = "(SELECT oid FROM pg_extension WHERE extname = 'gatekeeper')";
my $nsp = "'gatekeeper'::regnamespace";
my $rels = "(SELECT oid FROM pg_class WHERE relnamespace = $nsp)";

sub acl
{
	my ($column, $kind, $owner) = @_;
	return
	  "(SELECT array_agg(a::text ORDER BY a::text) FROM unnest(coalesce($column, acldefault($kind, $owner))) AS a)";
}

my %catalog_queries = (
	members => qq{
SELECT pg_describe_object(classid, objid, objsubid) FROM pg_depend
 WHERE refclassid = 'pg_extension'::regclass AND refobjid = $ext AND deptype = 'e'},

	schema => qq{
SELECT nspname, @{[ acl('nspacl', "'n'", 'nspowner') ]} FROM pg_namespace WHERE oid = $nsp},

	functions => qq{
SELECT concat_ws(' | ', p.oid::regprocedure::text, 'args: ' || pg_get_function_arguments(p.oid),
	   'returns: ' || pg_get_function_result(p.oid), 'kind ' || p.prokind::text, 'lang ' || l.lanname,
	   'volatility ' || p.provolatile::text, 'strict ' || p.proisstrict, 'security definer ' || p.prosecdef,
	   'leakproof ' || p.proleakproof, 'parallel ' || p.proparallel::text, 'cost ' || p.procost,
	   'rows ' || p.prorows, 'config ' || coalesce(p.proconfig::text, '-'),
	   'acl ' || @{[ acl('p.proacl', "'f'", 'p.proowner') ]}::text)
  FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
 WHERE p.pronamespace = $nsp},

	# bodies, with runs of white space as one space
	function_bodies => qq{
SELECT p.oid::regprocedure::text || ' body ' ||
	   md5(btrim(regexp_replace(p.prosrc, '\\s+', ' ', 'g')) || coalesce(' ' || p.probin, ''))
  FROM pg_proc p WHERE p.pronamespace = $nsp},

	relations => qq{
SELECT concat_ws(' | ', c.relname, 'kind ' || c.relkind::text, 'persistence ' || c.relpersistence::text,
	   'options ' || coalesce(c.reloptions::text, '-'), 'rls ' || c.relrowsecurity,
	   'acl ' || @{[ acl('c.relacl', q{(CASE WHEN c.relkind = 'S' THEN 's' ELSE 'r' END)::"char"}, 'c.relowner') ]}::text)
  FROM pg_class c WHERE c.relnamespace = $nsp AND c.relkind <> 'i'},

	columns => qq{
SELECT concat_ws(' | ', c.relname || '.' || a.attname,
	   'position ' || row_number() OVER (PARTITION BY c.oid ORDER BY a.attnum),
	   format_type(a.atttypid, a.atttypmod), 'not null ' || a.attnotnull,
	   'default ' || coalesce(pg_get_expr(d.adbin, d.adrelid), '-'),
	   'identity ' || a.attidentity::text, 'generated ' || a.attgenerated::text,
	   'compression ' || a.attcompression::text, 'collation ' || coalesce(co.collname, '-'),
	   'acl ' || coalesce(a.attacl::text, '-'))
  FROM pg_class c
  JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
  LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
  LEFT JOIN pg_collation co ON co.oid = a.attcollation AND a.attcollation <> 0
 WHERE c.relnamespace = $nsp AND c.relkind IN ('r', 'p', 'v', 'm', 'c', 'f')},

	constraints => qq{
SELECT concat_ws(' | ', coalesce(c.relname, t.typname) || ': ' || k.conname, 'type ' || k.contype::text,
	   pg_get_constraintdef(k.oid), 'validated ' || k.convalidated,
	   'deferrable ' || k.condeferrable || '/' || k.condeferred)
  FROM pg_constraint k
  LEFT JOIN pg_class c ON c.oid = k.conrelid
  LEFT JOIN pg_type t ON t.oid = k.contypid
 WHERE k.connamespace = $nsp},

	indexes => qq{
SELECT pg_get_indexdef(i.indexrelid) || coalesce(' options ' || ic.reloptions::text, '')
  FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid
 WHERE i.indrelid IN $rels},

	views => qq{
SELECT c.relname || ': ' || regexp_replace(pg_get_viewdef(c.oid, true), '\\s+', ' ', 'g')
  FROM pg_class c WHERE c.relnamespace = $nsp AND c.relkind IN ('v', 'm')},

	# internal (foreign key) triggers are named by their constraint
	triggers => qq{
SELECT concat_ws(' | ', c.relname,
	   CASE WHEN t.tgisinternal
			THEN 'internal for ' || k.conname || ' ' || t.tgfoid::regproc::text || ' type ' || t.tgtype
			ELSE pg_get_triggerdef(t.oid, true) END,
	   'enabled ' || t.tgenabled::text)
  FROM pg_trigger t
  JOIN pg_class c ON c.oid = t.tgrelid
  LEFT JOIN pg_constraint k ON k.oid = t.tgconstraint
 WHERE t.tgrelid IN $rels},

	sequences => qq{
SELECT concat_ws(' | ', c.relname, format_type(s.seqtypid, NULL), 'start ' || s.seqstart,
	   'increment ' || s.seqincrement, 'min ' || s.seqmin, 'max ' || s.seqmax,
	   'cache ' || s.seqcache, 'cycle ' || s.seqcycle,
	   'owned by ' || coalesce((SELECT d.deptype::text || ' ' || tc.relname || '.' || a.attname
								  FROM pg_depend d
								  JOIN pg_class tc ON tc.oid = d.refobjid
								  JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
								 WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
								   AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')), '-'))
  FROM pg_sequence s JOIN pg_class c ON c.oid = s.seqrelid
 WHERE c.relnamespace = $nsp},

	types => qq{
SELECT concat_ws(' | ', t.typname, 'type ' || t.typtype::text,
	   CASE WHEN t.typtype = 'e'
			THEN 'labels ' || (SELECT string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder)
								 FROM pg_enum e WHERE e.enumtypid = t.oid) END,
	   CASE WHEN t.typtype = 'd' THEN 'base ' || format_type(t.typbasetype, t.typtypmod) END,
	   'acl ' || @{[ acl('t.typacl', "'T'", 't.typowner') ]}::text)
  FROM pg_type t
 WHERE t.typnamespace = $nsp
   AND NOT (t.typtype = 'c' AND t.typrelid IN (SELECT oid FROM pg_class WHERE relkind <> 'c'))
   AND t.typelem = 0},

	config => qq{
SELECT u.c::regclass::text || ' ' || coalesce(quote_literal(u.cond), 'NULL')
  FROM pg_extension x, unnest(x.extconfig, x.extcondition) AS u(c, cond)
 WHERE x.extname = 'gatekeeper'},

	comments => qq{
SELECT pg_describe_object(d.classoid, d.objoid, d.objsubid) || ': ' || d.description
  FROM pg_description d
 WHERE (d.classoid = 'pg_extension'::regclass AND d.objoid = $ext)
	OR (d.classoid, d.objoid) IN (SELECT classid, objid FROM pg_depend
								   WHERE refclassid = 'pg_extension'::regclass AND refobjid = $ext
									 AND deptype = 'e')
	OR (d.classoid = 'pg_class'::regclass AND d.objoid IN $rels)
	OR (d.classoid = 'pg_constraint'::regclass AND d.objoid IN (SELECT oid FROM pg_constraint WHERE connamespace = $nsp))
	OR (d.classoid = 'pg_trigger'::regclass AND d.objoid IN (SELECT oid FROM pg_trigger WHERE tgrelid IN $rels))});

sub catalog
{
	my ($db, $what) = @_;
	my $out = $node->safe_psql($db,
		"SELECT line FROM ($catalog_queries{$what}) AS q(line) ORDER BY 1");
	return [ split /\n/, $out ];
}

foreach my $what (sort keys %catalog_queries)
{
	my $fresh = catalog('fresh', $what);
	my %in_fresh = map { $_ => 1 } @$fresh;
	ok(@$fresh > 0 || $what eq 'comments', "fresh: some $what to compare");
	foreach my $from ([ 'updated', '0.1.0', $fresh ], [ 'from020', '0.2.0', catalog('fresh020', $what) ])
	{
		my ($db, $version, $fresh) = @$from;
		my %in_fresh = map { $_ => 1 } @$fresh;
		my $updated = catalog($db, $what);
		my %in_updated = map { $_ => 1 } @$updated;
		my @only_fresh = grep { !$in_updated{$_} } @$fresh;
		my @only_updated = grep { !$in_fresh{$_} } @$updated;
		ok(!@only_fresh && !@only_updated,
			"$what: the same after the update from $version as in a fresh install")
		  or diag(join("\n",
			"$what differ:",
			(map { "  only in fresh $current:   $_" } @only_fresh),
			(map { "  only in updated $version:  $_" } @only_updated)));
	}
}

# ---------------------------------------------------------------- works after

is( $node->safe_psql(
		'updated', q{
SELECT gatekeeper.gate_pass('smart_sending', 'passed@example.com'),
	   gatekeeper.gate_pass('smart_sending', 'failed@example.com'),
	   gatekeeper.gate_pass('smart_sending', 'new@example.com')}),
	'f|t|t', 'updated: passes made before the update hold, others are open');
is( $node->safe_psql(
		'updated', "SELECT string_agg(recipient, ',') FROM gatekeeper.claim('w2', 10, queues => '{promo}')"),
	'fresh@example.com', 'updated: claim after the update passes the open recipient only');
is( $node->safe_psql(
		'updated', q{
SELECT gatekeeper.enqueue('sent@example.com', 'Again', 'Body', queue => 'promo', dedupe_key => 'sent-1')
	   = (SELECT id FROM gatekeeper.mail WHERE dedupe_key = 'sent-1'),
	   gatekeeper.enqueue('one@example.com', 'New', 'Body') > 0}),
	't|t', 'updated: enqueue after the update');
is($node->safe_psql('updated', $kept_counts), $node->safe_psql('updated', $live_counts),
	'updated: queue_stats keeps counting after claims and enqueues');
$node->safe_psql('updated', "SELECT gatekeeper.create_gate('brand_new', '1 hour')");
$node->safe_psql('updated', "SELECT gatekeeper.create_queue('brand_new', gates => '{brand_new}')");

# ---------------------------------------------------------------- claims after

# the key of a claimed mail holds: an INSERT of another mail with it fails
# (23505, nothing written), enqueue() finds the claimed mail
my $insert_keyed = q{
CREATE FUNCTION pg_temp.insert_keyed(q text, k text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO gatekeeper.mail (recipient, subject, body, queue, dedupe_key)
	VALUES ('other@example.com', 'Other', 'Body', q, k);
	RETURN 'inserted';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE;
END
$$;};
# each keyed claimed mail's key, offered to another mail: 'inserted' or the SQLSTATE
my $try_keys = qq{$insert_keyed
SELECT string_agg(dedupe_key || ':' || pg_temp.insert_keyed(queue, dedupe_key), ',' ORDER BY id)
  FROM gatekeeper.mail_status WHERE id = ANY ('$claimed') AND dedupe_key IS NOT NULL};
my $mail_count = $node->safe_psql('updated', 'SELECT count(*) FROM gatekeeper.mail');
is( $node->safe_psql(
		'updated', $try_keys),
	'held-1:23505,again-1:23505,handed-1:23505,kept-1:23505,kept-2:23505,kept-3:23505,'
	  . 'back-1:23505,spent-1:23505,lapsed-1:23505',
	'updated: the key of each claimed mail refuses another mail (23505)');
is( $node->safe_psql(
		'updated', qq{
SELECT count(*) FILTER (WHERE gatekeeper.enqueue('other\@example.com', 'Other', 'Body', queue => queue,
												 dedupe_key => dedupe_key) = id)
  FROM gatekeeper.mail_status WHERE id = ANY ('$claimed') AND dedupe_key IS NOT NULL}),
	'9', 'updated: enqueue() with the key of a claimed mail finds it');
is($node->safe_psql('updated', 'SELECT count(*) FROM gatekeeper.mail'),
	$mail_count, 'updated: ... and no mail was written');

# reap() and the acks do as 0.1.0 did
my $new_ways;
{
	(my $sql = $reap_and_ack) =~ s/RELATION/mail_status/g;
	$sql =~ s/ACK_BATCH/gatekeeper.ack_batch/g;
	my ($ret, $out, $err) = $node->psql('updated', $sql, on_error_stop => 1);
	is($ret, 0, 'updated: reap and ack the claims 0.1.0 made') or diag($err);
	$new_ways = reap_and_ack_parts($out);
}
is($new_ways->{reap}, $old_ways->{reap}, 'updated: reap() takes as many as 0.1.0 would');
like($new_ways->{reap}, qr/^reap [1-9]/, 'updated: ... some');
is($new_ways->{'after reap'}, $old_ways->{'after reap'},
	'updated: reap() of the lapsed claims leaves them as 0.1.0 would (scheduled, failed, unknown)');
is($new_ways->{acks}, $old_ways->{acks},
	'updated: acks of the claims with their old (id, attempt) as 0.1.0: stale and later attempts false, the first ack true');
like($new_ways->{acks}, qr/^batch 0 3 0$/m, 'updated: ... w4\'s claims acked in one call, once');
is(scalar(() = $new_ways->{acks} =~ /^\d+ f f t f$/mg), 133, 'updated: ... each other claim not reaped acked once');
is($new_ways->{'after acks'}, $old_ways->{'after acks'}, 'updated: the acked mail as 0.1.0 would leave it');

# once a claimed mail finished (sent, failed, unknown), its key is still
# held within the queue's dedupe window (0.3.0, issue 25: 24 hours, the
# update's default; 0.2.0's contract freed it at once), and so is the one
# reap() scheduled again; with a window of '0' (held only while
# unfinished) the keys of finished mail are free again, the rescheduled
# one's not
is( $node->safe_psql(
		'updated', $try_keys),
	'held-1:23505,again-1:23505,handed-1:23505,kept-1:23505,kept-2:23505,'
	  . 'kept-3:23505,back-1:23505,spent-1:23505,lapsed-1:23505',
	'updated: the keys of finished mail are held within the dedupe window, the rescheduled one\'s too');
$node->safe_psql('updated', qq{
SELECT gatekeeper.alter_queue(name, dedupe_window => '0') FROM gatekeeper.queue
 WHERE name IN (SELECT queue FROM gatekeeper.mail_status WHERE id = ANY ('$claimed'))});
is( $node->safe_psql(
		'updated', $try_keys),
	'held-1:inserted,again-1:inserted,handed-1:inserted,kept-1:inserted,kept-2:inserted,'
	  . 'kept-3:inserted,back-1:23505,spent-1:inserted,lapsed-1:inserted',
	'updated: with a dedupe window of 0, the keys of finished mail are free again, the rescheduled one\'s not');
is( $node->safe_psql(
		'updated', qq{
SELECT string_agg(k.dedupe_key || ':' || k.n, ',' ORDER BY k.dedupe_key)
  FROM (SELECT s.dedupe_key, count(*) AS n FROM gatekeeper.mail_status s
		 WHERE s.dedupe_key IN (SELECT dedupe_key FROM gatekeeper.mail_status WHERE id = ANY ('$claimed'))
		   AND s.state IN ('scheduled', 'claimed')
		 GROUP BY 1) k}),
	'again-1:1,back-1:1,handed-1:1,held-1:1,kept-1:1,kept-2:1,kept-3:1,lapsed-1:1,spent-1:1',
	'updated: one unfinished mail per key');
is($node->safe_psql('updated', $kept_counts), $node->safe_psql('updated', $live_counts),
	'updated: queue_stats counts after the claims were reaped and acked');

$node->stop;
done_testing();
