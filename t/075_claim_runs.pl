# Copyright: gatekeeper contributors

# Eight concurrent claimers drain 100,000 due mails from four queues, each
# queue's enqueued by one bulk INSERT, so in runs (gatekeeper.mail_run, up
# to 128 mails a row), and 100 more at a higher priority in live rows:
# every mail is claimed exactly once, on its first attempt, and acked; no
# run is left.  (010 drains live rows.)
#
# Each pgbench transaction claims a batch, records every (id, attempt) it
# was handed in claims_log under its own transaction id, and acks exactly
# the claims it recorded, all in one transaction: a claim that rolled back
# would leave no record and no ack.  The extension lives in a database the
# background worker does not serve, so only the eight claimers claim.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use Time::HiRes qw(time);

my $mails = 100_000;
my $batch = 100;
my $clients = 8;

# 1,000 full batches drain the queues; pgbench runs a bounded number of
# transactions, 3.2 times that, so short batches near the end still fit.
my $transactions = 400;

my $node = PostgreSQL::Test::Cluster->new('claim_runs');
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
SELECT gatekeeper.create_queue('q' || i) FROM generate_series(1, 4) AS i;
DO \$\$
BEGIN
	FOR q IN 1 .. 4 LOOP
		INSERT INTO gatekeeper.mail (queue, recipient, subject, body, send_at)
		SELECT 'q' || q, 'user' || i || '\@example.com', 'mail ' || i, 'body', now() - interval '1 hour'
		  FROM generate_series((q - 1) * ($mails - 100) / 4 + 1, q * ($mails - 100) / 4) AS i;
		INSERT INTO gatekeeper.mail (queue, recipient, subject, body, send_at, priority)
		SELECT 'q' || q, 'first' || i || '\@example.com', 'first ' || i, 'body', now(), 1
		  FROM generate_series(1, 25) AS i;
	END LOOP;
END
\$\$;
ANALYZE gatekeeper.mail, gatekeeper.mail_live, gatekeeper.mail_run;
CREATE TABLE claims_log (xid xid8 NOT NULL, worker text NOT NULL, id bigint NOT NULL,
						 attempt int NOT NULL, queue text NOT NULL);
CREATE INDEX ON claims_log (xid);
CREATE TABLE acks_log (xid xid8 PRIMARY KEY, claimed int NOT NULL, acked int NOT NULL);
});

is( $node->safe_psql(
		'stress',
		"SELECT count(*) FROM gatekeeper.mail_status WHERE state = 'scheduled' AND send_at <= now()"),
	$mails,
	"$mails mails are due");

is( $node->safe_psql(
		'stress', qq{
SELECT count(*) >= 4 * 195, sum(last_id - id + 1), count(DISTINCT queue)
  FROM gatekeeper.mail_run}),
	't|' . ($mails - 100) . '|4',
	'the bulk mail is in runs');
is( $node->safe_psql('stress', "SELECT count(*) FROM gatekeeper.mail_live"),
	'100', 'the higher priority mail is in live rows');

my ($ok, $out, $err, $elapsed) = GatekeeperTest::run_pgbench(
	$node, 'stress', '075_claim_ack', $clients, $transactions, qq{
BEGIN;
INSERT INTO claims_log (xid, worker, id, attempt, queue)
SELECT pg_current_xact_id(), 'bench-' || :client_id, c.id, c.attempt, c.queue
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
note(sprintf("drained %d mails with %d claimers in %.1f s", $mails, $clients, $elapsed));

is( $node->safe_psql(
		'stress', "SELECT state, count(*) FROM gatekeeper.mail_status GROUP BY state ORDER BY state"),
	"sent|$mails",
	'every mail was sent');

is( $node->safe_psql(
		'stress', qq{
SELECT count(*), count(DISTINCT id), count(*) FILTER (WHERE attempt <> 1)
  FROM claims_log}),
	"$mails|$mails|0",
	'every mail was claimed exactly once, on its first attempt');

is( $node->safe_psql(
		'stress', qq{
SELECT count(*) FROM gatekeeper.mail_status m
  LEFT JOIN claims_log l ON l.id = m.id AND l.attempt = m.attempt AND l.worker = m.worker
 WHERE l.id IS NULL OR m.attempt <> 1}),
	'0',
	'every mail is held by the claimer that logged it');

is( $node->safe_psql(
		'stress', qq{
SELECT sum(acked), count(*) FILTER (WHERE acked <> claimed) FROM acks_log}),
	"$mails|0",
	'every claim was acked by the transaction that made it');

is( $node->safe_psql('stress', "SELECT count(DISTINCT worker) FROM claims_log"),
	$clients, 'all claimers took part');

is( $node->safe_psql(
		'stress', qq{
SELECT string_agg(queue || ':' || n, ',' ORDER BY queue)
  FROM (SELECT queue, count(*) AS n FROM claims_log GROUP BY queue) s}),
	'q1:25000,q2:25000,q3:25000,q4:25000',
	'every queue was drained');

is( $node->safe_psql('stress', "SELECT count(*) FROM gatekeeper.mail_run"),
	'0', 'no run is left');
is( $node->safe_psql('stress', "SELECT sum(scheduled), sum(claimed) FROM gatekeeper.queue_stats"),
	'0|0', 'queue_stats counts nothing scheduled or claimed');

my $short = $node->safe_psql(
	'stress', qq{
SELECT count(*) FILTER (WHERE claimed = $batch), count(*) FILTER (WHERE claimed BETWEEN 1 AND $batch - 1)
  FROM acks_log});
note("full batches|short batches: $short");

my $log = slurp_file($node->logfile);
unlike($log, qr/deadlock detected/, 'no deadlock');
unlike($log, qr/\b(ERROR|FATAL|PANIC)\b/, 'no errors in the server log');

$node->stop;
done_testing();
