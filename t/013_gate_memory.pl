# Copyright: gatekeeper contributors
#
# The gates' shared memory as a resource others share, on a server with a
# small gatekeeper.gate_memory (4MB, 65536 entries of 64 bytes):
#
# 1. Memory a cancelled call reserved comes back: a big gate_pass batch
#    cut off by statement_timeout (deterministically, while it waits for an
#    entry another transaction holds), a batch rolled back to a savepoint,
#    and new passes still fit.
# 2. A full gate memory never fails a claim: one database fills it with
#    gate_pass until 53200; in another, a claim over a gated and an
#    ungated queue returns the ungated mail, leaves the gated mail
#    scheduled and deferred a short while, with a WARNING and a count in
#    gatekeeper.gate_memory; gate_pass itself still fails with 53200.
# 3. What an entry costs: 64 bytes charged each.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use GatekeeperTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = GatekeeperTest::new_node(
	'gate_memory',
	conf => qq{
gatekeeper.gate_memory = '4MB'
gatekeeper.workers = 0
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gatekeeper');

# 1. A batch cut off while it waits: it reserved room for what it was
# about to pass and never made those passes.
# (the first use since the start, which replays the log, comes first: a
# batch would otherwise wait for the holder's replay, before reserving)
$node->safe_psql('postgres', "SELECT gatekeeper.gate_open('smart_sending', 'first\@use.example')");
my $holder = $node->background_psql('postgres');
$holder->query_safe(
	"BEGIN; SELECT gatekeeper.gate_pass('smart_sending', 'aaa\@block.example')");
my ($ret, $stdout, $stderr) = $node->psql(
	'postgres', q{
SET statement_timeout = '1s';
SELECT count(*) FROM gatekeeper.gate_pass_batch('smart_sending',
	ARRAY['aaa@block.example'] || ARRAY(SELECT 'cut' || i || '@leak.example' FROM generate_series(1, 30000) AS i));
});
isnt($ret, 0, 'a batch waiting for an entry is cut off by statement_timeout');
like($stderr, qr/canceling statement due to statement timeout/, 'by the timeout');
$holder->query_safe('ROLLBACK');
$holder->quit;

($ret, $stdout, $stderr) = $node->psql('postgres', q{
SELECT count(*) FROM gatekeeper.gate_pass_batch('smart_sending',
	ARRAY(SELECT 'after' || i || '@leak.example' FROM generate_series(1, 20000) AS i))});
is($stdout, '20000', 'after the cancelled batch, 20000 new passes still fit');

# a savepoint rolled back gives back its passes' room too
is( ($node->psql('postgres', q{
BEGIN;
SAVEPOINT s;
SELECT count(*) FROM gatekeeper.gate_pass_batch('smart_sending',
	ARRAY(SELECT 'sp' || i || '@leak.example' FROM generate_series(1, 15000) AS i));
ROLLBACK TO SAVEPOINT s;
SELECT count(*) FROM gatekeeper.gate_pass_batch('smart_sending',
	ARRAY(SELECT 'sp2_' || i || '@leak.example' FROM generate_series(1, 15000) AS i));
COMMIT;
}))[1], "15000\n15000", 'a batch rolled back to a savepoint leaves room for another as big');

# 3. What an entry costs: every live pass above is one entry, once purge()
# has swept out the entries the rolled back passes left (a full memory
# sweeps them itself, as above)
$node->psql('postgres', 'SELECT gatekeeper.purge()');
my ($used, $entries) = split /\|/, ($node->psql('postgres',
	'SELECT bytes_used, entries FROM gatekeeper.gate_memory'))[1] // '';
note("gate_memory: $used bytes charged for $entries entries");
is($entries, 35000, 'one entry per live pass');
ok(($used // 1e9) <= 64 * ($entries // 0) + 64 * 64, 'at most 64 bytes charged an entry (and one reserve)');
is(($node->psql('postgres', 'SELECT bytes_total FROM gatekeeper.gate_memory'))[1],
	4 * 1024 * 1024, 'bytes_total is gatekeeper.gate_memory');

# 2. Fill the rest from another database.
$node->safe_psql('postgres', 'CREATE DATABASE hog');
$node->safe_psql('hog', 'CREATE EXTENSION gatekeeper');
my $filled = 0;
my $full_stderr = '';
for my $round (1 .. 60)
{
	($ret, $stdout, $full_stderr) = $node->psql('hog', qq{
\\set VERBOSITY verbose
SELECT count(*) FROM gatekeeper.gate_pass_batch('smart_sending',
	ARRAY(SELECT 'hog$round-' || i || '\@fill.example' FROM generate_series(1, 1000) AS i));
});
	if ($ret != 0) { $filled = 1; last; }
}
ok($filled, 'one database fills gate memory');
like($full_stderr, qr/53200: gatekeeper gate memory is full/, 'gate_pass fails with 53200 once it is full');
# and to the last entry, one recipient at a time
$node->safe_psql('hog', q{
DO $$
DECLARE
	i int := 0;
BEGIN
	LOOP
		i := i + 1;
		BEGIN
			PERFORM gatekeeper.gate_pass('smart_sending', 'one' || i || '@fill.example');
		EXCEPTION WHEN out_of_memory THEN
			EXIT;
		END;
	END LOOP;
END
$$;
});

$node->safe_psql('postgres', q{
SELECT gatekeeper.create_queue('promo', gates => '{smart_sending}', on_gate_closed => 'suppress');
SELECT gatekeeper.enqueue('receipt' || i || '@shop.example', 'Receipt', 'Thanks') FROM generate_series(1, 3) AS i;
SELECT gatekeeper.enqueue('promo' || i || '@shop.example', 'Sale', 'Buy', queue => 'promo') FROM generate_series(1, 3) AS i;
});
($ret, $stdout, $stderr) = $node->psql('postgres', q{
SELECT queue, count(*) FROM gatekeeper.claim('w', 100) GROUP BY queue ORDER BY queue;
});
is($ret, 0, 'a claim over a gated queue does not fail when gate memory is full');
is($stdout, 'default|3', 'it returns the ungated mail, and no gated mail');
like($stderr, qr/WARNING:  gatekeeper gate memory is full: 3 gated mails deferred/, 'with a warning');
is( $node->safe_psql('postgres', q{
SELECT state || ' ' || (send_at > now() + interval '5 seconds') || ' ' || last_error || ' ' || attempt
  FROM gatekeeper.mail_status WHERE queue = 'promo' GROUP BY 1 ORDER BY 1}),
	'scheduled true deferred: gate memory is full 0',
	'the gated mail stays scheduled, deferred a while, not suppressed nor charged an attempt');
is($node->safe_psql('postgres', 'SELECT full_refusals FROM gatekeeper.gate_memory'),
	'3', 'gatekeeper.gate_memory counts the deferred mails');

ok($node->safe_psql('postgres', 'SELECT 1') eq '1', 'the server is up');

done_testing();
