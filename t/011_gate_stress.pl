# Copyright: gatekeeper contributors

# Smart sending under load.  Five promotional campaigns (five queues gated
# by smart_sending) go to the same 20,000 recipients, 100,000 mails, next
# to 20,000 receipts (an ungated queue), all due at once, in an order that
# mixes campaigns and recipients.  Eight concurrent claimers drain them.
# Each recipient gets exactly one promotional mail; the other 80,000 are
# suppressed; every receipt goes; no claimer deadlocks.
#
# One campaign spells its recipients in mixed case: a recipient's window is
# keyed case-insensitively, so User1@Example.com and user1@example.com
# share one.
#
# Each pgbench transaction claims a batch, records what it was handed in
# claims_log and acks it, in one transaction (as in
# 010_concurrent_claims.pl).  The extension lives in a database the
# background worker does not serve, so only the eight claimers claim.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $recipients = 20_000;
my $campaigns = 5;
my $promos = $recipients * $campaigns;
my $receipts = $recipients;
my $batch = 100;
my $clients = 8;

# 1,200 full batches drain the queues; pgbench runs a bounded number of
# transactions, 2.7 times that, so short batches near the end still fit.
my $transactions = 400;

my $node = PostgreSQL::Test::Cluster->new('gates');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'gatekeeper'
gatekeeper.database = 'postgres'
gatekeeper.smtp_url = ''
max_connections = 40
# no statement may hang the test
statement_timeout = '60s'
lock_timeout = '30s'
log_lock_waits = on
deadlock_timeout = '100ms'
});
$node->start;

# The worker runs, in a database without the extension: it claims nothing.
ok( $node->poll_query_until(
		'postgres',
		"SELECT count(*) > 0 FROM pg_stat_activity WHERE backend_type = 'gatekeeper worker'"),
	'the background worker is running');

$node->safe_psql('postgres', 'CREATE DATABASE stress');
$node->safe_psql(
	'stress', qq{
CREATE EXTENSION gatekeeper;
SELECT gatekeeper.create_queue('promo' || c, gates => ARRAY['smart_sending'])
  FROM generate_series(1, $campaigns) AS c;
SELECT gatekeeper.create_queue('receipts');
SELECT setseed(0.11);
-- due times spread over the last hour at random, so every batch mixes
-- campaigns and recipients
INSERT INTO gatekeeper.mail (queue, recipient, subject, body, send_at)
SELECT 'promo' || c,
	   CASE WHEN c = 3 THEN 'User' || r || '\@Example.COM' ELSE 'user' || r || '\@example.com' END,
	   'campaign ' || c, 'body', now() - random() * interval '1 hour'
  FROM generate_series(1, $campaigns) AS c, generate_series(1, $recipients) AS r;
INSERT INTO gatekeeper.mail (queue, recipient, subject, body, send_at)
SELECT 'receipts', 'user' || r || '\@example.com', 'receipt', 'body',
	   now() - random() * interval '1 hour'
  FROM generate_series(1, $receipts) AS r;
ANALYZE gatekeeper.mail, gatekeeper.mail_live;
CREATE TABLE claims_log (xid xid8 NOT NULL, worker text NOT NULL, id bigint NOT NULL,
						 attempt int NOT NULL, queue text NOT NULL, recipient text NOT NULL);
CREATE INDEX ON claims_log (xid);
CREATE TABLE acks_log (xid xid8 PRIMARY KEY, claimed int NOT NULL, acked int NOT NULL);
});

is( $node->safe_psql(
		'stress',
		"SELECT count(*) FROM gatekeeper.mail_status WHERE state = 'scheduled' AND send_at <= now()"),
	$promos + $receipts,
	'all mail is due');

my ($ok, $out, $err, $elapsed) = GatekeeperTest::run_pgbench(
	$node, 'stress', '011_claim_ack', $clients, $transactions, qq{
BEGIN;
INSERT INTO claims_log (xid, worker, id, attempt, queue, recipient)
SELECT pg_current_xact_id(), 'bench-' || :client_id, c.id, c.attempt, c.queue, c.recipient
  FROM gatekeeper.claim('bench-' || :client_id, $batch) AS c;
INSERT INTO acks_log (xid, claimed, acked)
SELECT pg_current_xact_id(), count(*),
	   gatekeeper.ack_batch(coalesce(array_agg(l.id), '{}'), coalesce(array_agg(l.attempt), '{}'))
  FROM claims_log l WHERE l.xid = pg_current_xact_id();
COMMIT;
});
ok($ok, 'eight concurrent claimers ran to the end');
like(
	$out,
	qr{processed: @{[ $clients * $transactions ]}/@{[ $clients * $transactions ]}},
	'every claimer transaction committed');
is($err, '', 'no claimer saw an error');
$node->safe_psql('stress', 'ANALYZE gatekeeper.mail, gatekeeper.mail_live, gatekeeper.mail_done, claims_log, acks_log');
note(sprintf("drained %d mails with %d claimers in %.1f s",
	$promos + $receipts, $clients, $elapsed));

is( $node->safe_psql(
		'stress', qq{
SELECT CASE WHEN queue = 'receipts' THEN 'receipt' ELSE 'promo' END AS kind, state, count(*)
  FROM gatekeeper.mail_status GROUP BY 1, 2 ORDER BY 1, 2}),
	"promo|sent|$recipients\npromo|suppressed|@{[ $promos - $recipients ]}\nreceipt|sent|$receipts",
	'one promotional mail per recipient went, the rest were suppressed, every receipt went');

is( $node->safe_psql(
		'stress', qq{
SELECT count(*), count(DISTINCT lower(recipient)) FROM claims_log WHERE queue <> 'receipts'}),
	"$recipients|$recipients",
	'exactly one promotional mail was claimed for each recipient');

is( $node->safe_psql(
		'stress', qq{
SELECT count(*), count(DISTINCT id), count(*) FILTER (WHERE attempt <> 1)
  FROM claims_log WHERE queue = 'receipts'}),
	"$receipts|$receipts|0",
	'every receipt was claimed once, on its first attempt');

is( $node->safe_psql(
		'stress', qq{
SELECT count(*), count(DISTINCT id), count(*) FILTER (WHERE attempt <> 1) FROM claims_log}),
	"@{[ $recipients + $receipts ]}|@{[ $recipients + $receipts ]}|0",
	'no mail was claimed twice');

is( $node->safe_psql(
		'stress', qq{
SELECT count(*) FROM gatekeeper.mail_status
 WHERE state = 'suppressed'
   AND (attempt <> 0 OR worker IS NOT NULL
		OR last_error IS DISTINCT FROM 'suppressed: gate "smart_sending" was closed')}),
	'0',
	'suppressed mail was never handed out and says why');

is( $node->safe_psql(
		'stress', qq{
SELECT count(*) FROM gatekeeper.mail_status m
  LEFT JOIN claims_log l ON l.id = m.id AND l.attempt = m.attempt AND l.worker = m.worker
 WHERE m.state = 'sent' AND l.id IS NULL}),
	'0',
	'every mail sent is held by the claimer that logged it');

is( $node->safe_psql(
		'stress', qq{
SELECT sum(acked), count(*) FILTER (WHERE acked <> claimed) FROM acks_log}),
	"@{[ $recipients + $receipts ]}|0",
	'every claim was acked by the transaction that made it');

# Each recipient's window holds one pass, held by the one promotional mail
# that went to them: in the shared state, and in the gate log it is
# rebuilt from.
is( $node->safe_psql(
		'stress', qq{
SELECT count(*) FILTER (WHERE e.sends_in_period = 1 AND NOT e.open)
  FROM generate_series(1, $recipients) AS r,
	   gatekeeper.explain('user' || r || '\@example.com') AS e
 WHERE e.gate = 'smart_sending'}),
	$recipients,
	'each recipient holds one pass');
is( $node->safe_psql(
		'stress', qq{
SELECT count(*), count(*) FILTER (WHERE l.id IS NOT NULL)
  FROM gatekeeper.gate_log gl
  JOIN gatekeeper.gate g ON g.id = gl.gate AND g.name = 'smart_sending',
	   unnest(gl.recipients, gl.holders) AS p(recipient, holder)
  LEFT JOIN claims_log l
	ON l.id = p.holder AND lower(l.recipient) = p.recipient AND l.queue <> 'receipts'
 WHERE NOT gl.released}),
	"$recipients|$recipients",
	'the log holds one pass per recipient, of the mail that went');

is( $node->safe_psql('stress', "SELECT count(DISTINCT worker) FROM claims_log"),
	$clients, 'all claimers took part');

my $batches = $node->safe_psql(
	'stress', qq{
SELECT count(*) FILTER (WHERE claimed > 0), max(claimed) FROM acks_log});
note("batches that claimed mail|largest: $batches");

my $log = slurp_file($node->logfile);
my $waits = () = $log =~ /still waiting for/g;
note("lock waits logged (over deadlock_timeout): $waits");
unlike($log, qr/deadlock detected/, 'no deadlock');
unlike($log, qr/\b(ERROR|FATAL|PANIC)\b/, 'no errors in the server log');

$node->stop;
done_testing();
