# Copyright: gatekeeper contributors
#
# A frequency cap beyond what an entry's counters were sized for: a gate
# whose row says max_sends 100000 (SPEC bounds it to 10000, create_gate
# and a CHECK constraint refuse more; a superuser who drops the constraint
# can still write the row), passed
# 35000 and then 5000 times for one recipient.  0.1.0 kept the counts in
# uint16s that wrapped, wrote past the entry in shared memory and crashed
# the server.  Now the server stays up, the gate lets through the 10000
# passes the bound allows, and the count is the same after a restart.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use GatekeeperTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = GatekeeperTest::new_node(
	'gate_cap',
	conf => qq{
gatekeeper.gate_memory = '4MB'
gatekeeper.workers = 0
});
$node->start;
$node->safe_psql('postgres', q{
CREATE EXTENSION gatekeeper;
SELECT gatekeeper.create_gate('huge_cap', '1 day', max_sends => 10);
ALTER TABLE gatekeeper.gate DROP CONSTRAINT gate_max_sends_check;
UPDATE gatekeeper.gate SET max_sends = 100000 WHERE name = 'huge_cap';
});
my $started = $node->safe_psql('postgres', 'SELECT pg_postmaster_start_time()');

my ($ret, $first, $stderr) = $node->psql('postgres', q{
SELECT count(*) FROM gatekeeper.gate_pass_batch('huge_cap', array_fill('victim@example.com'::text, ARRAY[35000]));
});
is($ret, 0, 'a batch of 35000 passes for one recipient does not fail');
is($first, '10000', 'the gate lets 10000 through, the bound on max_sends');
($ret, my $second, $stderr) = $node->psql('postgres', q{
SELECT count(*) FROM gatekeeper.gate_pass_batch('huge_cap', array_fill('victim@example.com'::text, ARRAY[5000]));
});
is($ret, 0, 'another 5000 do not fail');
is($second, '0', 'and none passes: the gate is closed');
is($node->safe_psql('postgres', 'SELECT pg_postmaster_start_time()'), $started,
	'the server did not restart');
is( $node->safe_psql('postgres', q{
SELECT sends_in_period || ' ' || open FROM gatekeeper.explain('victim@example.com') WHERE gate = 'huge_cap'}),
	'10000 false', 'explain counts 10000 passes, closed');

$node->stop('immediate');
$node->start;
is( $node->safe_psql('postgres', q{
SELECT sends_in_period || ' ' || open FROM gatekeeper.explain('victim@example.com') WHERE gate = 'huge_cap'}),
	'10000 false', 'after a crash restart the log replays the same 10000 passes');
is( $node->safe_psql('postgres', q{
SELECT gatekeeper.gate_pass('huge_cap', 'victim@example.com')}),
	'f', 'and the gate stays closed');

done_testing();
