# Copyright: gatekeeper contributors

# Retention without bloat: waves of mail with 1 kB bodies, each drained to
# completion by claim + ack, with gatekeeper.retention = 2s and purge()
# after each wave (what the worker's housekeeping calls).
#
#  - the mail's tables stop growing once retention rotates: after twice
#    the waves they are no bigger than after the first ones, and they hold
#    only the last few waves (mail_live, which holds only live mail, is
#    vacuumed after each wave, as autovacuum does);
#  - retention empties whole partitions (TRUNCATE): not one row of the
#    mail or of its outcomes is deleted row by row;
#  - a mail scheduled a day ahead survives every rotation, with its
#    content and state, and is still claimed when due.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep);

my $waves = 8;
my $per_wave = 2000;

my $node = GatekeeperTest::new_node('retention',
	conf => "gatekeeper.workers = 0\ngatekeeper.retention = 2s\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gatekeeper');
$node->safe_psql('postgres', "SELECT gatekeeper.create_queue('r')");

# a mail scheduled a day ahead, every column of its content set
my $far = $node->safe_psql(
	'postgres', q{
INSERT INTO gatekeeper.mail (queue, recipient, recipient_name, sender, subject, body, html,
							 headers, dedupe_key, priority, send_at, send_by, metadata, timezone)
VALUES ('r', 'far@example.com', 'Far Away', 'shop@example.com', 'Far ahead', 'Kept for tomorrow',
		'<p>Kept for tomorrow</p>', '{"X-Campaign": "autumn"}', 'far-1', 3,
		now() + interval '1 day', now() + interval '2 days', '{"campaign": 7}', 'Europe/Paris')
RETURNING id});
my $content_sql = "SELECT to_jsonb(m) - 'segment' FROM gatekeeper.mail m WHERE id = $far";
my $far_content = $node->safe_psql('postgres', $content_sql);

# the mail's tables, heap, TOAST and indexes, every partition
my $size_sql = q{
SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c
 WHERE c.relnamespace = 'gatekeeper'::regnamespace AND c.relkind = 'r' AND c.relname ~ '^mail'};

my (@size, @rows, %segments);
for my $w (1 .. $waves)
{
	$node->safe_psql(
		'postgres', qq{
INSERT INTO gatekeeper.mail (queue, recipient, subject, body)
SELECT 'r', 'w${w}_' || i || '\@example.com', 'Wave $w', repeat(md5(i::text), 32)
  FROM generate_series(1, $per_wave) AS i});
	my $sent = $node->safe_psql('postgres',
		"SELECT count(*) FILTER (WHERE gatekeeper.ack(c.id, c.attempt)) FROM gatekeeper.claim('w', 10000, queues => '{r}') AS c"
	);
	is($sent, $per_wave, "wave $w: every mail claimed and acked");
	# rotation needs the current segment half the retention old
	sleep(1.1);
	$node->safe_psql('postgres', 'SELECT gatekeeper.purge()');
	# mail_live holds only live mail; its dead rows are autovacuum's (after
	# 1% of it, unthrottled), which runs far less often than every second
	$node->safe_psql('postgres', 'VACUUM gatekeeper.mail_live');
	push @size, $node->safe_psql('postgres', $size_sql);
	push @rows, $node->safe_psql('postgres', 'SELECT count(*) FROM gatekeeper.mail');
	$segments{ $node->safe_psql('postgres', 'SELECT current FROM gatekeeper.segment') } = 1
	  if $node->safe_psql('postgres', "SELECT to_regclass('gatekeeper.segment') IS NOT NULL") eq 't';
	note("wave $w: $rows[-1] mails kept, $size[-1] bytes");
}

ok(keys %segments >= 3, 'retention rotated through the segments (' . join(',', sort keys %segments) . ')');
my $half = int($waves / 2);
my $peak = (sort { $b <=> $a } @size[0 .. $half - 1])[0];
cmp_ok($size[-1], '<=', $peak,
	"size after $waves waves ($size[-1] bytes) no more than the largest after $half waves ($peak bytes)");
cmp_ok($rows[-1], '<=', 5 * $per_wave + 1,
	"only the last waves are kept ($rows[-1] mails of " . ($waves * $per_wave + 1) . ')');

# whole partitions went, no row did: TRUNCATE, not DELETE
$node->safe_psql('postgres', 'SELECT pg_stat_force_next_flush()');
my ($tables, $deleted) = split /\|/, $node->safe_psql(
	'postgres', q{
SELECT count(*), coalesce(sum(n_tup_del), 0) FROM pg_stat_user_tables
 WHERE schemaname = 'gatekeeper' AND relname ~ '^mail(_done)?(_[0-3])?$'});
cmp_ok($tables, '>=', 2, "the statistics of the mail's $tables tables");
is($deleted, '0', 'no mail and no outcome was deleted row by row');

# the mail scheduled a day ahead is still there, whole, and still to go
is( $node->safe_psql(
		'postgres', "SELECT state, attempt, subject, body FROM gatekeeper.mail_status WHERE id = $far"),
	'scheduled|0|Far ahead|Kept for tomorrow',
	'the mail scheduled a day ahead survived every rotation');
is($node->safe_psql('postgres', $content_sql),
	$far_content, 'with every column of its content as enqueued');
$node->safe_psql('postgres', "UPDATE gatekeeper.mail SET send_at = now() WHERE id = $far");
is( $node->safe_psql(
		'postgres',
		"SELECT id || ':' || body || ':' || recipient_name || ':' || metadata FROM gatekeeper.claim('w', 10, queues => '{r}')"),
	"$far:Kept for tomorrow:Far Away:{\"campaign\": 7}", 'and it is claimed, content intact, once due');

$node->stop;
done_testing();
