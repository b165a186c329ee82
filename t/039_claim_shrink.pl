# Copyright: gatekeeper contributors
# gatekeeper-test: alone

# purge() gives a drained mail_claim's space back (_mail_claim_shrink):
# single acks leave dead versions of their batch's row and its TOASTed
# arrays, and autovacuum (off here) comes by only once a naptime.
#
#  - once no batch is left, purge() empties the table, its TOAST and its
#    indexes by TRUNCATE; claims and acks go on afterwards;
#  - it never waits for the lock: with a reader of mail_claim in
#    progress, purge() returns at once and leaves the table as it is;
#  - a batch still open is kept, with every record, and acked afterwards;
#  - under REPEATABLE READ it does nothing (its snapshot could miss a
#    batch committed since), nor when a cursor of its own transaction
#    reads the table (TRUNCATE would fail).

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $node = GatekeeperTest::new_node('claim_shrink',
	conf => "gatekeeper.workers = 0\nautovacuum = off\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gatekeeper');
$node->safe_psql('postgres', "SELECT gatekeeper.create_queue('s')");

# the heap, TOAST and indexes of mail_claim, and its batches
my $size_sql = "SELECT pg_total_relation_size('gatekeeper.mail_claim')";
my $batches_sql = 'SELECT count(*) FROM gatekeeper.mail_claim';

# n mails enqueued, claimed in one batch and acked one by one
sub drain
{
	my ($tag, $n) = @_;
	$node->safe_psql(
		'postgres', qq{
INSERT INTO gatekeeper.mail (queue, recipient, subject, body)
SELECT 's', '${tag}_' || i || '\@example.com', '$tag', repeat(md5(i::text), 8)
  FROM generate_series(1, $n) AS i});
	return $node->safe_psql('postgres',
		"SELECT count(*) FILTER (WHERE gatekeeper.ack(c.id, c.attempt)) FROM gatekeeper.claim('w', 10000, queues => '{s}') AS c"
	);
}

# 1. a drained table is emptied
is(drain('a', 1000), '1000', 'a thousand mails claimed and acked one by one');
is($node->safe_psql('postgres', $batches_sql), '0', 'no batch is left');
my $dead = $node->safe_psql('postgres', $size_sql);
cmp_ok($dead, '>', 512 * 1024, "but mail_claim takes $dead bytes");
$node->safe_psql('postgres', 'SELECT gatekeeper.purge()');
my $empty = $node->safe_psql('postgres',
	"SELECT pg_relation_size('gatekeeper.mail_claim') || '|' || pg_relation_size(reltoastrelid) FROM pg_class WHERE oid = 'gatekeeper.mail_claim'::regclass"
);
is($empty, '0|0', 'purge() empties its heap and its TOAST');
cmp_ok($node->safe_psql('postgres', $size_sql), '<', $dead / 10, 'and gives back the space');
is(drain('b', 500), '500', 'claims and acks go on afterwards');

# 2. a reader holds the table: purge() does not wait for it
my $reader = $node->background_psql('postgres');
$reader->query_safe('BEGIN; SELECT count(*) FROM gatekeeper.mail_claim');
my $held = $node->safe_psql('postgres', $size_sql);
my $t0 = time;
$node->safe_psql('postgres', "SET lock_timeout = '10s'; SELECT gatekeeper.purge()");
cmp_ok(time - $t0, '<', 5, 'purge() does not wait behind a reader of mail_claim');
is($node->safe_psql('postgres', $size_sql), $held, 'and leaves the table as it is');
$reader->query_safe('COMMIT');
$reader->quit;

# 3. an open batch is kept, whole
$node->safe_psql(
	'postgres', q{
INSERT INTO gatekeeper.mail (queue, recipient, subject, body)
SELECT 's', 'c_' || i || '@example.com', 'c', 'kept' FROM generate_series(1, 3) AS i});
my $claimed = $node->safe_psql('postgres',
	"SELECT string_agg(id || ':' || attempt, ',' ORDER BY id) FROM gatekeeper.claim('w', 10, queues => '{s}')");
$node->safe_psql('postgres', 'SELECT gatekeeper.purge()');
is($node->safe_psql('postgres', "SELECT string_agg(id || ':' || attempt, ',' ORDER BY id) FROM gatekeeper.mail_status WHERE state = 'claimed'"),
	$claimed, 'a batch still open is kept by purge(), every mail still claimed');
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FILTER (WHERE gatekeeper.ack(split_part(c, ':', 1)::bigint, split_part(c, ':', 2)::int)) FROM unnest(string_to_array('$claimed', ',')) AS c"
	),
	'3',
	'and its mails are acked afterwards');

# 4. REPEATABLE READ: nothing
is($node->safe_psql('postgres', $batches_sql), '0', 'no batch is left again');
my $before = $node->safe_psql('postgres', $size_sql);
cmp_ok($before, '>', 0, 'the acks left dead rows');
$node->safe_psql('postgres',
	'BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT gatekeeper.purge(); COMMIT');
is($node->safe_psql('postgres', $size_sql), $before, 'purge() under REPEATABLE READ leaves the table');
# a cursor of the caller's own transaction still reads the table
my ($ret, $stdout, $stderr) = $node->psql('postgres',
	'BEGIN; DECLARE c CURSOR FOR SELECT * FROM gatekeeper.mail_claim; FETCH c; SELECT gatekeeper.purge(); COMMIT');
is($ret, 0, 'purge() with a cursor of its own transaction on mail_claim does not fail')
  or diag($stderr);
is($node->safe_psql('postgres', $size_sql), $before, 'and leaves the table');
$node->safe_psql('postgres', 'SELECT gatekeeper.purge()');
is($node->safe_psql('postgres', "SELECT pg_relation_size('gatekeeper.mail_claim')"),
	'0', 'and under READ COMMITTED, alone, empties it');

$node->stop;
done_testing();
