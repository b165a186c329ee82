# Copyright: gatekeeper contributors

# pg_dump and restore of a shard (issue 29).  pg_dump keeps the value of
# gatekeeper.mail_id_seq but not its increment, which CREATE EXTENSION
# makes 1 again: the restored shard_position row must give it back, or
# the restored shard would draw ids of every residue, the other shards'
# included.  Shard 1 of 4 is dumped in custom and in plain format and
# restored; in each copy the position is kept, the sequence's increment
# is 4 again, and new mail, by enqueue and by a bulk insert, gets ids that
# are 1 modulo 4 and above every id of the source.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = GatekeeperTest::new_node('shard_restore', conf => "gatekeeper.workers = 0\n");
$node->start;

$node->safe_psql('postgres', 'CREATE DATABASE src');
$node->safe_psql(
	'src', q{
CREATE EXTENSION gatekeeper;
SELECT gatekeeper.enqueue('early@example.com', 'Early', 'Body', send_at => now() + interval '1 day');
SELECT gatekeeper.shard(1, 4);
SELECT gatekeeper.enqueue('r' || i || '@example.com', 'S', 'Body', send_at => now() + interval '1 day')
  FROM generate_series(1, 5) AS i;
});
my $top = $node->safe_psql('src',
	"SELECT greatest((SELECT last_value FROM gatekeeper.mail_id_seq), (SELECT max(id) FROM gatekeeper.mail))");

foreach my $d ([ 'dst_custom', 'src.dump', ['-Fc'] ], [ 'dst_plain', 'src.sql', [] ])
{
	my ($db, $file, $options) = @$d;
	my $path = $node->basedir . "/$file";
	$node->command_ok([ 'pg_dump', @$options, '-f', $path, '-d', $node->connstr('src') ],
		"pg_dump @$options");
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->command_ok(
		@$options
		? [ 'pg_restore', '--exit-on-error', '-d', $node->connstr($db), $path ]
		: [ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr($db), '-f', $path ],
		"$db: restored without error");

	is($node->safe_psql($db, 'SELECT n, count FROM gatekeeper.shard_position'),
		'1|4', "$db: the shard position is kept");
	is( $node->safe_psql($db,
			"SELECT increment_by FROM pg_sequences WHERE schemaname = 'gatekeeper' AND sequencename = 'mail_id_seq'"
		),
		'4', "$db: mail_id_seq's increment is 4 again");
	$node->safe_psql(
		$db, q{
CREATE TABLE new_ids AS
SELECT gatekeeper.enqueue('n' || i || '@example.com', 'N', 'Body', send_at => now() + interval '1 day') AS id
  FROM generate_series(1, 5) AS i;
INSERT INTO gatekeeper.mail (recipient, subject, body, send_at)
SELECT 'bulk' || i || '@example.com', 'B', 'Body', now() + interval '1 day' FROM generate_series(1, 150) AS i;
INSERT INTO new_ids SELECT id FROM gatekeeper.mail WHERE recipient LIKE 'bulk%';
});
	is( $node->safe_psql($db,
			"SELECT count(*), count(*) FILTER (WHERE id % 4 = 1 AND id > $top) FROM new_ids"),
		'155|155', "$db: new ids are 1 modulo 4 and above the source's");
}

$node->stop;
done_testing();
