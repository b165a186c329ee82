# Copyright: gatekeeper contributors

# queue_stats' totals live in a shared-memory table of at most 5,000
# entries (src/stats.c).  Issue 25, item 12: databases created with
# thousands of queues and dropped again must leave nothing behind: their
# entries are freed when DROP DATABASE (or DROP EXTENSION) commits, never
# written to pg_stat/gatekeeper.stat at shutdown, and the table never
# takes the server's spare shared memory, which the lock table and others
# need (it had fallen from 537,984 to 3,456 bytes, and CREATE TABLE failed
# with "out of shared memory" in an unrelated database).  At the bound,
# new queues get no totals (logged once) and nothing else fails.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = GatekeeperTest::new_node('totals_debris', conf => "gatekeeper.workers = 0\n");
$node->start;

# the server's spare shared memory: what no allocation holds yet
sub spare
{
	return $node->safe_psql('postgres', 'SELECT size FROM pg_shmem_allocations WHERE name IS NULL');
}

# a database with the extension, n queues and one mail in each; returns
# how many of its queues queue_stats shows with a total
sub fill
{
	my ($db, $n, $prefix) = @_;
	$node->safe_psql('postgres', "CREATE DATABASE $db") unless $prefix;
	$prefix //= 'q';
	$node->safe_psql($db, qq{
CREATE EXTENSION IF NOT EXISTS gatekeeper;
SELECT count(gatekeeper.create_queue('$prefix' || i)) FROM generate_series(1, $n) AS i;
INSERT INTO gatekeeper.mail (recipient, subject, body, queue, send_at)
SELECT 'r' || i || '\@example.com', 's', 'b', '$prefix' || i, now() + interval '1 day'
  FROM generate_series(1, $n) AS i;
});
	return $node->safe_psql($db,
		"SELECT count(*) FILTER (WHERE enqueued = 1) FROM gatekeeper.queue_stats WHERE queue LIKE '$prefix%'");
}

# a database that stays, with 10 queues
is(fill('live', 10), '10', 'the live database\'s 10 queues have totals');
my $spare_before = spare();
note("spare shared memory at the start: $spare_before bytes");

# three databases of 2,500 queues each, dropped: 7,500 entries over time,
# more than the table's 5,000
foreach my $i (1 .. 3)
{
	is(fill("gone$i", 2500), '2500', "gone$i: its 2,500 queues have totals");
	$node->safe_psql('postgres', "DROP DATABASE gone$i");
}
my $spare_after = spare();
note("spare shared memory after three databases were dropped: $spare_after bytes");
cmp_ok($spare_before - $spare_after, '<', 16384,
	'the dropped databases\' totals took no spare shared memory');

# a new queue in the live database still gets totals, and the old ones kept theirs
is(fill('live', 1, 'after'), '1', 'a new queue after the drops gets totals');
is($node->safe_psql('live', "SELECT count(*) FILTER (WHERE enqueued = 1) FROM gatekeeper.queue_stats WHERE queue LIKE 'q%'"),
	'10', 'the live database\'s totals are kept');

# a clean restart writes only the live entries (the file's header counts
# them) and brings no dead entry back
$node->stop;
my $file = $node->data_dir . '/pg_stat/gatekeeper.stat';
open(my $fh, '<:raw', $file) or die "$file: $!";
read($fh, my $header, 8) == 8 or die "$file: short header";
close $fh;
my (undef, $saved) = unpack('LL', $header);
is($saved, 11, 'the totals file holds the live database\'s 11 queues only');
$node->start;
cmp_ok($spare_before - spare(), '<', 16384, 'after a restart the dropped databases take no spare shared memory');
is($node->safe_psql('live', "SELECT count(*) FILTER (WHERE enqueued = 1) FROM gatekeeper.queue_stats"),
	'11', 'the live database\'s totals survive the restart');

# DROP EXTENSION frees its database's entries too
is(fill('ext', 2500), '2500', 'ext: its 2,500 queues have totals');
$node->safe_psql('ext', 'DROP EXTENSION gatekeeper');
is(fill('ext', 2500, 'r'), '2500', 'ext: after DROP EXTENSION and CREATE EXTENSION, 2,500 new queues have totals');
$node->safe_psql('ext', 'DROP EXTENSION gatekeeper');

# the bound: 5,100 queues in one database; 4,989 entries are free (the
# live database holds 11), so 111 queues get none, the rest theirs, and
# the spare shared memory is untouched; work elsewhere goes on
my $log_offset = -s $node->logfile;
is(fill('big', 5100), '4989', 'at the bound, the queues beyond it get no totals');
cmp_ok($spare_before - spare(), '<', 16384, 'a full table takes no spare shared memory');
ok($node->log_contains('keeps the totals of 5000 queues at most', $log_offset),
	'a full table is logged');
$node->safe_psql('live', 'CREATE TABLE unrelated (id int); DROP TABLE unrelated');
is($node->safe_psql('live', "SELECT gatekeeper.enqueue('x\@example.com', 's', 'b', 'after1') > 0"),
	't', 'enqueue in another database works at the bound');
$node->safe_psql('postgres', 'DROP DATABASE big');
is(fill('live', 1, 'later'), '1', 'once the full database is dropped, new queues get totals again');

# a totals file with entries of a database that no longer exists (as a
# server that did not free them wrote it): loaded up to the bound, they
# fill the table, and the first backend with counts to add frees them
$node->stop;
open($fh, '<:raw', $file) or die "$file: $!";
my $saved_file = do { local $/; <$fh> };
close $fh;
my ($magic, $live_entries) = unpack('LL', substr($saved_file, 0, 8));
my $dead = '';
# StatsEntry: database, extension, queue hash, then the int64 counts, as
# many as the entries of the saved file have (more kinds came with the
# events of issue 27)
die 'the saved totals file has no entries' unless $live_entries > 0;
my $ncounts = ((length($saved_file) - 8) / $live_entries - 16) / 8;
die "the saved totals file's entries are not whole ($ncounts counts)" unless $ncounts == int($ncounts) && $ncounts >= 1;
$dead .= pack("LLQq$ncounts", 4000000000, 4000000001, $_, 1, (0) x ($ncounts - 1)) foreach (1 .. 5000);
open($fh, '>:raw', $file) or die "$file: $!";
print $fh pack('LL', $magic, $live_entries + 5000), substr($saved_file, 8), $dead;
close $fh;
$log_offset = -s $node->logfile;
$node->start;
is(fill('live', 1, 'swept'), '1', 'a new queue gets totals once the dead entries of the file are freed');
is($node->safe_psql('live', "SELECT count(*) FILTER (WHERE enqueued > 0) FROM gatekeeper.queue_stats"),
	$live_entries + 1, 'the live entries of the file are kept');
ok($node->log_contains('freed the totals of ' . (5000 - $live_entries) . ' queues', $log_offset),
	'the freed dead entries are logged');

$node->stop;
done_testing();
