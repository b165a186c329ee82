# Copyright: gatekeeper contributors

# Gate passes live in shared memory and survive crashes through their log.
# Passes are taken every way there is (gate_pass one at a time and in a
# batch, a claimed and sent mail, a pass given back, a pass rolled back,
# one inside a savepoint rolled back, one in a transaction still open when
# the crash comes); then a backend is killed with SIGKILL (the postmaster
# reinitializes shared memory), and later the whole server is stopped in
# immediate mode and started again.  After each crash every committed pass
# still closes its gate, and what was rolled back, given back or never
# committed leaves it open.
#
# Then the memory bound: a server with a small gatekeeper.gate_memory
# refuses a batch that does not fit with SQLSTATE 53200, writing nothing,
# and still serves passes that fit.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = GatekeeperTest::new_node(
	'gate_crash',
	conf => qq{
restart_after_crash = on
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gatekeeper');

$node->safe_psql(
	'postgres', q{
SELECT gatekeeper.create_gate('weekly', '7 days', 2);
SELECT gatekeeper.create_queue('promo', gates => ARRAY['smart_sending']);
-- committed, one at a time and in a batch
SELECT gatekeeper.gate_pass('smart_sending', 'kept@crash.example');
SELECT count(*) FROM gatekeeper.gate_pass_batch('smart_sending',
	ARRAY(SELECT 'batch' || i || '@crash.example' FROM generate_series(1, 500) AS i));
SELECT gatekeeper.gate_pass('weekly', 'cap@crash.example', 1), gatekeeper.gate_pass('weekly', 'cap@crash.example', 2);
-- given back
SELECT gatekeeper.gate_pass('smart_sending', 'released@crash.example', 7);
SELECT gatekeeper.gate_release('smart_sending', 'released@crash.example', 7);
-- a sent mail's pass
SELECT gatekeeper.enqueue('sent@crash.example', 'S', 'b', 'promo');
SELECT gatekeeper.ack(id, attempt) FROM gatekeeper.claim('w', 10, queues => ARRAY['promo']);
});
$node->safe_psql(
	'postgres', q{
BEGIN;
SELECT gatekeeper.gate_pass('smart_sending', 'rolledback@crash.example');
ROLLBACK;
BEGIN;
SAVEPOINT s;
SELECT gatekeeper.gate_pass('smart_sending', 'savepoint@crash.example');
ROLLBACK TO SAVEPOINT s;
SELECT gatekeeper.gate_pass('smart_sending', 'aftersavepoint@crash.example');
COMMIT;
});

# What a user would check: which gates are closed, by recipient.
sub gates
{
	return $node->safe_psql(
		'postgres', q{
SELECT string_agg(r || '=' || CASE WHEN gatekeeper.gate_open(g, r) THEN 'open' ELSE 'closed' END, ' ' ORDER BY r)
  FROM (VALUES ('smart_sending', 'kept@crash.example'), ('smart_sending', 'batch1@crash.example'),
			   ('smart_sending', 'batch500@crash.example'), ('weekly', 'cap@crash.example'),
			   ('smart_sending', 'released@crash.example'), ('smart_sending', 'sent@crash.example'),
			   ('smart_sending', 'rolledback@crash.example'), ('smart_sending', 'savepoint@crash.example'),
			   ('smart_sending', 'aftersavepoint@crash.example'), ('smart_sending', 'open@crash.example'))
	   AS t(g, r)});
}

my $expected =
	'aftersavepoint@crash.example=closed batch1@crash.example=closed batch500@crash.example=closed '
  . 'cap@crash.example=closed kept@crash.example=closed open@crash.example=open '
  . 'released@crash.example=open rolledback@crash.example=open savepoint@crash.example=open '
  . 'sent@crash.example=closed';
is(gates(), $expected, 'before any crash: committed passes close their gates');

# 1. A backend killed with SIGKILL while another holds an uncommitted pass.
my $open_xact = $node->background_psql('postgres');
$open_xact->query_safe(
	"BEGIN; SELECT gatekeeper.gate_pass('smart_sending', 'open\@crash.example')");
my $victim = $node->background_psql('postgres');
my $victim_pid = $victim->query_safe('SELECT pg_backend_pid()');
my $log_offset = -s $node->logfile;
kill('KILL', $victim_pid) or die "could not kill $victim_pid: $!";
ok( $node->wait_for_log(qr/all server processes terminated; reinitializing/, $log_offset),
	'the postmaster reinitializes after the backend is killed');
eval { $open_xact->quit; };
eval { $victim->quit; };
ok($node->poll_query_until('postgres', 'SELECT true'), 'the server accepts connections again');

is(gates(), $expected,
	'after a crash restart: committed passes still close their gates, the rest are open');
is( $node->safe_psql('postgres',
		"SELECT gatekeeper.gate_pass('smart_sending', 'kept\@crash.example')::text || ' '
			 || gatekeeper.gate_pass('smart_sending', 'sent\@crash.example')::text || ' '
			 || gatekeeper.gate_pass('weekly', 'cap\@crash.example', 3)::text || ' '
			 || gatekeeper.gate_pass('weekly', 'cap\@crash.example', 1)::text"),
	'false false false true',
	'after a crash restart: a closed gate refuses, a holder re-passes');

# 2. The server stopped in immediate mode and started again.
$node->stop('immediate');
$node->start;
is(gates(), $expected, 'after an immediate stop and start: the same');
is( $node->safe_psql('postgres',
		"SELECT gatekeeper.gate_pass('smart_sending', 'released\@crash.example')"),
	't', 'a pass given back before the crash is free to take');

# purge keeps live passes: after it and one more restart, still the same
$node->safe_psql('postgres', 'SELECT gatekeeper.purge()');
$node->stop('immediate');
$node->start;
is( $node->safe_psql('postgres',
		"SELECT gatekeeper.gate_open('smart_sending', 'kept\@crash.example')::text || ' '
			 || gatekeeper.gate_open('smart_sending', 'released\@crash.example')::text"),
	'false false', 'after purge and another restart: still closed');
$node->stop;

# 3. The memory bound.
my $small = GatekeeperTest::new_node(
	'gate_memory',
	conf => qq{
gatekeeper.gate_memory = '1MB'
});
$small->start;
$small->safe_psql('postgres', 'CREATE EXTENSION gatekeeper');
my ($ret, $stdout, $stderr) = $small->psql(
	'postgres', q{
\set VERBOSITY verbose
SELECT count(*) FROM gatekeeper.gate_pass_batch('smart_sending',
	ARRAY(SELECT 'many' || i || '@full.example' FROM generate_series(1, 20000) AS i));
});
isnt($ret, 0, 'a batch that does not fit fails');
like($stderr, qr/ERROR:  53200: gatekeeper gate memory is full/, 'with SQLSTATE 53200');
is( $small->safe_psql('postgres',
		"SELECT count(*) FROM gatekeeper.gate_log; SELECT gatekeeper.gate_open('smart_sending', 'many1\@full.example')"),
	"0\nt", 'and writes nothing');
is( $small->safe_psql('postgres',
		"SELECT count(*) FROM gatekeeper.gate_pass_batch('smart_sending',
			ARRAY(SELECT 'few' || i || '\@full.example' FROM generate_series(1, 1000) AS i))"),
	'1000', 'a batch that fits passes');
$small->stop;

done_testing();
