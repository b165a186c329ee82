# Copyright: gatekeeper contributors

# A claim does not walk again the runs claimed before it, even while an old
# snapshot keeps them from being dead to every transaction (the run floor,
# src/due_floor.c; issue 46, item 4).
#
# A session holds a REPEATABLE READ snapshot taken before any mail, as a
# long report, a slow pg_dump or a lagging logical slot does: no entry of
# mail_run_due deleted after it can be vacuumed or marked dead, so a walk
# from the queue's first entry visits every run claimed since.  Here 50
# runs of 128 mails are claimed whole and acked, then new mail is claimed:
#
#  - the second claim after them reads a handful of mail_run_due entries,
#    not the 50 dead ones again (on a walk from the queue's start: 100 or
#    more, the level probe and the walk each reading them);
#  - a run enqueued afterwards with an earlier due time, below where the
#    floor stands, is claimed (its writer lowered the floor);
#  - every mail is claimed once and ends sent.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = GatekeeperTest::new_node('run_floor',
	conf => "gatekeeper.workers = 0\nautovacuum = off\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gatekeeper');
$node->safe_psql('postgres', "SELECT gatekeeper.create_queue('rf')");
$node->safe_psql('postgres',
	'CREATE TABLE got (id bigint NOT NULL, attempt int NOT NULL, acked bool NOT NULL DEFAULT false)');

my $holder = $node->background_psql('postgres');
$holder->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ');
$holder->query_safe('SELECT count(*) FROM gatekeeper.mail');
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_xmin IS NOT NULL AND pid <> pg_backend_pid()"),
	'1',
	'a session holds an old snapshot');

# n mails of queue rf in one statement (runs of 128), due "due" ago
sub enqueue
{
	my ($n, $prefix, $due) = @_;
	$node->safe_psql(
		'postgres', qq{
INSERT INTO gatekeeper.mail (queue, recipient, subject, body, send_at)
SELECT 'rf', '$prefix' || i || '\@example.com', 's', 'b', now() - interval '$due'
  FROM generate_series(1, $n) i});
}

# one claim of up to n mails and its ack, each in its own transaction; how
# many it claimed
sub claim_ack
{
	my ($n) = @_;
	return $node->safe_psql(
		'postgres', qq{
CREATE TEMP TABLE c AS SELECT id, attempt FROM gatekeeper.claim('w', $n, queues => '{rf}');
INSERT INTO got SELECT id, attempt, true FROM c;
SELECT gatekeeper.ack_batch(coalesce(array_agg(id), '{}'), coalesce(array_agg(attempt), '{}')) FROM c \\g /dev/null
SELECT count(*) FROM c;
});
}

enqueue(6400, 'old', '1 minute');
is($node->safe_psql('postgres', 'SELECT count(*) FROM gatekeeper.mail_run'),
	'50', '6,400 mails enqueued in one statement are 50 runs');
my $claimed = 0;
for my $i (1 .. 50)
{
	$claimed += claim_ack(128);
}
is($claimed, 6400, 'the 50 runs were claimed, one a claim');
is($node->safe_psql('postgres', 'SELECT count(*) FROM gatekeeper.mail_run'),
	'0', 'no run is left');

enqueue(512, 'new', '1 second');
claim_ack(10);

# pending statistics are counted per backend until flushed: this session's
# own count of the claim below is what is read
my $read = $node->safe_psql(
	'postgres', q{
SELECT pg_stat_force_next_flush();
BEGIN;
INSERT INTO got SELECT id, attempt FROM gatekeeper.claim('w', 10, queues => '{rf}');
SELECT pg_stat_get_xact_tuples_returned('gatekeeper.mail_run_due'::regclass);
COMMIT;
});
($read) = grep { /^\d+$/ } split /\n/, $read;
note("mail_run_due entries read by the counted claim: $read");
cmp_ok($read, '<', 10,
	"a claim does not walk the 50 claimed runs again under the old snapshot ($read entries read)");

# a run due before the floor's position: its writer lowered the floor
enqueue(300, 'early', '1 hour');
my $early = $node->safe_psql(
	'postgres', q{
WITH c AS (INSERT INTO got SELECT id, attempt FROM gatekeeper.claim('w', 300, queues => '{rf}')
		   RETURNING id)
SELECT count(*) FROM c JOIN gatekeeper.mail m USING (id) WHERE m.recipient LIKE 'early%'});
is($early, '300', 'a run enqueued below the floor is claimed first');

# the rest, then every mail once and sent
$node->safe_psql('postgres', q{
SELECT gatekeeper.ack_batch(array_agg(id), array_agg(attempt)) FROM got WHERE NOT acked;
UPDATE got SET acked = true});
for my $i (1 .. 20)
{
	last if claim_ack(128) == 0;
}
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) || ' ' || count(DISTINCT id) FROM got"),
	'7212 7212',
	'every mail was claimed, none twice');
is( $node->safe_psql(
		'postgres',
		"SELECT state || ' ' || count(*) FROM gatekeeper.mail_status GROUP BY state"),
	'sent 7212',
	'every mail ends sent');

$holder->query_safe('COMMIT');
$holder->quit;
$node->stop;
done_testing();
