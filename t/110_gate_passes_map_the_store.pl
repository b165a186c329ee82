# Copyright: gatekeeper contributors
#
# A backend that makes many gate passes maps the gate store ahead instead
# of faulting it in page by page (src/gate_store.c, "Mapping";
# docs/internals.md, Gates): the store holds 1.5 million entries, and a
# session makes 300 passes, then 2,000 more of new recipients, each of
# which touches a bucket and an entry at random among some 28,000 pages.
# With the store in dynamic shared memory, faulted in as touched, the
# 2,000 took 0.52 minor faults a pass; mapped ahead once the backend has
# looked up 256 entries, 0.10 (what is left: the pages the new entries
# go to, shared buffers and WAL).  (With huge pages set aside on the
# machine, which the test clusters' huge_pages = try then take: 0.43 and
# 0.004.)  Counted by the kernel, in the backend's /proc/PID/stat (minor
# faults, field 10), not timed.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use POSIX ();
use Test::More;

plan skip_all => 'needs Linux /proc/PID/stat' unless -r "/proc/$$/stat";
# MADV_POPULATE_READ came with Linux 5.14; before it the store faults in
my ($major, $minor) = (POSIX::uname())[2] =~ /^(\d+)\.(\d+)/;
plan skip_all => 'needs Linux 5.14 or later (MADV_POPULATE_READ)'
  unless $major > 5 || ($major == 5 && $minor >= 14);

my $node = GatekeeperTest::new_node('gate_map');
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gatekeeper');

# 1.5 million entries, 1,000 new recipients a call
$node->safe_psql('postgres', q{
DO $$
BEGIN
	FOR c IN 1 .. 1500 LOOP
		PERFORM gatekeeper.gate_pass_batch('smart_sending',
			ARRAY(SELECT 'fill' || c || '_' || g || '@example.com' FROM generate_series(1, 1000) AS g));
		COMMIT;
	END LOOP;
END $$;
});
is($node->safe_psql('postgres', 'SELECT entries FROM gatekeeper.gate_memory'),
	'1500000', 'the store holds 1.5 million entries');

# one session: 300 passes, then 2,000, the backend's minor faults read
# before and after the 2,000
my $script = q{SELECT pg_backend_pid() AS pid \gset
\setenv GK_PID :pid
SELECT count(*) FILTER (WHERE gatekeeper.gate_pass('smart_sending', 'warm' || g || '@example.com')) AS passed
  FROM generate_series(1, 300) AS g \gset
\echo passed :passed
\! awk '{ print "faults", $10 }' /proc/$GK_PID/stat
SELECT count(*) FILTER (WHERE gatekeeper.gate_pass('smart_sending', 'new' || g || '@example.com')) AS passed
  FROM generate_series(1, 2000) AS g \gset
\echo passed :passed
\! awk '{ print "faults", $10 }' /proc/$GK_PID/stat
};
my ($ret, $out, $err) = $node->psql('postgres', $script, extra_params => [ '-v', 'ON_ERROR_STOP=1' ]);
is($ret, 0, 'the session makes its passes') or diag($err);
my @passed = $out =~ /^passed (\d+)$/mg;
my @faults = $out =~ /^faults (\d+)$/mg;
is_deeply(\@passed, [ 300, 2000 ], 'every new recipient passed');
is(scalar @faults, 2, 'the backend\'s faults read before and after the 2,000');

my $per_pass = ($faults[1] - $faults[0]) / 2000;
note(sprintf 'minor faults a pass over the 2,000: %.3f (%s)', $per_pass, join(' -> ', @faults));
cmp_ok($per_pass, '<', 0.2, 'the 2,000 passes take fewer than 0.2 page faults a pass: the store was mapped ahead');

$node->stop;
done_testing();
