# Copyright: gatekeeper contributors
#
# A backend that claims and acks in rounds keeps the memory it frees
# (src/keep_freed.c; docs/internals.md, "A claimer's memory"): a round of
# claim(1000) + ack_batch of 1 kB mails, run by the documented worker role
# as an external worker does, takes its memory from the heap the rounds
# before it left mapped.  Before, glibc gave the freed top of the heap back
# to the kernel at the end of every statement, and the next round took a
# page fault for each 4 kB page again: some 775 a round here, against about
# 140 with the memory kept (what is left: shared buffers and WAL pages
# this backend touches for the first time).  Counted by the kernel, in the
# backend's /proc/PID/stat (minor faults, field 10), not timed.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

plan skip_all => 'needs Linux /proc/PID/stat' unless -r "/proc/$$/stat";

my $rounds = 10;
my $node = GatekeeperTest::new_node('keep_freed');
$node->start;
$node->safe_psql('postgres', qq{
CREATE EXTENSION gatekeeper;
SELECT gatekeeper.create_queue('outbox', background => false);
CREATE ROLE app_worker LOGIN;
SELECT gatekeeper.grant('app_worker', 'worker');
INSERT INTO gatekeeper.mail (recipient, subject, body, queue)
SELECT 'r' || g || '\@example.com', 'subject ' || g, repeat('x', 1000), 'outbox'
  FROM generate_series(1, ($rounds + 3) * 1000) AS g;
});

# one session of the worker role: three rounds to warm up, then $rounds
# rounds, the backend's minor faults read after each
my $script = qq{SELECT pg_backend_pid() AS pid \\gset
\\setenv GK_PID :pid
};
for my $r (1 .. $rounds + 3)
{
	$script .= q{SELECT coalesce(array_agg(id), '{}') AS ids, coalesce(array_agg(attempt), '{}') AS atts
  FROM gatekeeper.claim('ext', 1000) \gset
SELECT gatekeeper.ack_batch(:'ids'::bigint[], :'atts'::int[]) AS acked \gset
\echo acked :acked
\! awk '{ print "faults", $10 }' /proc/$GK_PID/stat
};
}
my ($ret, $out, $err) = $node->psql('postgres', $script,
	extra_params => [ '-U', 'app_worker', '-v', 'ON_ERROR_STOP=1' ]);
is($ret, 0, 'the worker role claims and acks in rounds') or diag($err);

my @acked = $out =~ /^acked (\d+)$/mg;
my @faults = $out =~ /^faults (\d+)$/mg;
is_deeply(\@acked, [ (1000) x ($rounds + 3) ], 'every round claimed and acked 1,000 mails');
is(scalar @faults, $rounds + 3, 'the backend\'s faults read after every round');
is($node->safe_psql('postgres', q{SELECT state, count(*) FROM gatekeeper.mail_status GROUP BY 1}),
	'sent|' . (($rounds + 3) * 1000), 'every mail is sent');

# after the warm-up: a round's memory is the last round's, still mapped
my $per_round = ($faults[-1] - $faults[2]) / $rounds;
note(sprintf 'minor faults a round after the warm-up: %.0f (after each round: %s)',
	$per_round, join(' ', @faults));
cmp_ok($per_round, '<', 400,
	'a round of claim(1000) + ack_batch takes fewer than 400 page faults: the memory freed by the last is kept');

$node->stop;
done_testing();
