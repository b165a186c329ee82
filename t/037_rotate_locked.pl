# Copyright: gatekeeper contributors
# gatekeeper-test: alone

# The rotation of the retention segments (_rotate, purge) never waits
# long for others and undoes what it began when it gives up:
#
#  - with a reader of mail_claim in progress, _rotate waits about a second
#    for the locks it needs, then gives up: it returns 0, the segment stays
#    current, the finished mail stays, and the finish time it had begun to
#    write into the dedupe key's row is undone;
#  - the caller's lock_timeout is its own again afterwards;
#  - once the reader is gone, the same rotation removes the finished mail
#    and keeps its dedupe key held, with its finish time (its queue's
#    dedupe_window is longer than retention).

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $node = GatekeeperTest::new_node('rotate_locked', conf => "gatekeeper.workers = 0\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gatekeeper');
$node->safe_psql('postgres',
	"SELECT gatekeeper.create_queue('r', dedupe_window => interval '1 day')");

# a mail with a dedupe key, sent, in segment 0
my $id = $node->safe_psql(
	'postgres', q{
INSERT INTO gatekeeper.mail (queue, recipient, subject, body, dedupe_key)
VALUES ('r', 'r@example.com', 'R', 'b', 'order-1') RETURNING id});
is( $node->safe_psql(
		'postgres',
		"SELECT gatekeeper.ack(c.id, c.attempt) FROM gatekeeper.claim('w', 1, queues => '{r}') AS c"),
	't',
	'the mail is claimed and acked');

# three rotations (retention 0: nothing finished is kept) make segment 3
# current; the next one is segment 0, which holds the sent mail
for my $i (1 .. 3)
{
	$node->safe_psql('postgres', "SELECT gatekeeper._rotate('0 seconds')");
}
is($node->safe_psql('postgres', 'SELECT current FROM gatekeeper.segment'),
	'3', 'three rotations: segment 3 is current');
my $state_sql = qq{
SELECT (SELECT current FROM gatekeeper.segment) || '|' ||
	   (SELECT count(*) FROM gatekeeper.mail_done WHERE id = $id) || '|' ||
	   (SELECT coalesce(finished_at IS NOT NULL, false) FROM gatekeeper.mail_key
		 WHERE queue = 'r' AND dedupe_key = 'order-1')};
is($node->safe_psql('postgres', $state_sql), '3|1|false',
	'the sent mail is in the next segment, its key row without a finish time');

# a reader of mail_claim holds its lock
my $reader = $node->background_psql('postgres');
$reader->query_safe('BEGIN; SELECT count(*) FROM gatekeeper.mail_claim');
my $t0 = time;
my $out = $node->safe_psql('postgres',
	"SET lock_timeout = '10s'; SELECT gatekeeper._rotate('0 seconds'); SHOW lock_timeout");
my $took = time - $t0;
is($out, "0\n10s", "_rotate gives up (0) and the caller's lock_timeout is its own again");
cmp_ok($took, '>=', 0.9, sprintf('it waited about a second for the locks (%.1f s)', $took));
cmp_ok($took, '<', 8, 'not the caller\'s lock_timeout (10 s)');
is($node->safe_psql('postgres', $state_sql), '3|1|false',
	'nothing changed: segment 3 current, the mail kept, the key row untouched');

# purge gives up alike, without an error (retention 1 s: the mail finished
# and the segment rotated more than that ago)
$node->append_conf('postgresql.conf', "gatekeeper.retention = '1s'\n");
$node->reload;
$t0 = time;
my ($ret, $stdout, $stderr) = $node->psql('postgres', 'SELECT gatekeeper.purge()');
$took = time - $t0;
is($ret, 0, 'purge() with the reader in progress does not fail') or diag($stderr);
is($stdout, '0', 'and removes nothing');
cmp_ok($took, '>=', 0.9, sprintf('after waiting about a second for the locks (%.1f s)', $took));
cmp_ok($took, '<', 8, 'not the session\'s lock_timeout (30 s)');
is($node->safe_psql('postgres', $state_sql), '3|1|false', 'nothing changed');

$reader->query_safe('COMMIT');
$reader->quit;

# alone, the rotation goes through
is($node->safe_psql('postgres', "SELECT gatekeeper._rotate('0 seconds')"),
	'1', 'once the reader is gone, _rotate removes the sent mail');
is($node->safe_psql('postgres', $state_sql), '0|0|true',
	'segment 0 is current, the mail gone, its key row holds its finish time');
is( $node->safe_psql(
		'postgres',
		"SELECT gatekeeper._mail_key_held(k.id, k.queue, k.dedupe_key) FROM gatekeeper.mail_key k WHERE k.queue = 'r'"
	),
	't',
	'and the key is still held (dedupe_window 1 day)');

$node->stop;
done_testing();
