# Copyright: gatekeeper contributors

# mail_live is vacuumed after a burst, without waiting for autovacuum
# (src/maintenance.c): autovacuum is off here, so only the worker's own
# vacuum can clean it.
#
#  - while the live mail is more than a tenth of the dead rows, nothing is
#    vacuumed (a steady load is autovacuum's);
#  - once a burst has drained, the first worker has mail_live vacuumed: it
#    gives the emptied pages back (the file shrinks) and its dead rows are
#    gone;
#  - a vacuum held back by an older snapshot is not repeated at every
#    housekeeping pass, and once the snapshot is gone the rows go;
#  - the worker that does it does not claim the burst's queue (background
#    => false) and goes on delivering: mail enqueued afterwards is sent.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $burst = 30000;

my $sink = GatekeeperTest::start_sink(name => 'live_vacuum');
my $node = GatekeeperTest::new_node('live_vacuum',
	sink => $sink,
	conf => "gatekeeper.workers = 1\nautovacuum = off\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gatekeeper');
$node->safe_psql('postgres', "SELECT gatekeeper.create_queue('burst', background => false)");

my $vacuums_sql = q{
SELECT vacuum_count || '|' || autovacuum_count FROM pg_stat_user_tables
 WHERE relid = 'gatekeeper.mail_live'::regclass};

# a burst of live rows, in statements of 200 mails: a statement of 256 or
# more writes runs (mail_run) instead, and the rows this vacuum is for are
# mail_live's
sub burst
{
	my ($n, $prefix, $subject) = @_;
	$node->safe_psql(
		'postgres', qq{
DO \$\$
BEGIN
	FOR s IN 0 .. $n - 1 BY 200 LOOP
		INSERT INTO gatekeeper.mail (queue, recipient, subject, body)
		SELECT 'burst', '$prefix' || i || '\@example.com', '$subject', 'Body ' || i
		  FROM generate_series(s + 1, least(s + 200, $n)) AS i;
	END LOOP;
END
\$\$});
	return;
}
burst($burst, 'b', 'Burst');

# claim and ack up to $n mails, 10,000 (claim's most) at a time
sub drain
{
	my ($n) = @_;
	my $done = 0;
	while ($done < $n)
	{
		my $batch = $n - $done > 10000 ? 10000 : $n - $done;
		my $got = $node->safe_psql('postgres',
			"SELECT count(*) FILTER (WHERE gatekeeper.ack(c.id, c.attempt)) FROM gatekeeper.claim('ext', $batch, queues => '{burst}') AS c"
		);
		$done += $got;
		last if $got < $batch;
	}
	return $done;
}

# half of it: 30,000 dead rows against 15,000 live mails
is(drain($burst / 2), $burst / 2, 'half the burst claimed and acked by an external sender');

# two housekeeping passes (every 5 s) see it: no vacuum
sleep(11);
is($node->safe_psql('postgres', $vacuums_sql), '0|0',
	'no vacuum while the live mail is more than a tenth of the dead rows');

# mail_live's size now is its size once the rest is drained: a claim only
# deletes, and only a vacuum shrinks the file.  Read now, not after the
# drain: the worker may vacuum as soon as the last ack commits, before the
# test could read it (seen: 0 bytes read after the drain)
my $bloated = $node->safe_psql('postgres', "SELECT pg_relation_size('gatekeeper.mail_live')");
note("mail_live after the burst: $bloated bytes");
cmp_ok($bloated, '>', 8192 * 100, 'the burst left mail_live spread over its pages');
is(drain($burst), $burst / 2, 'the rest of the burst claimed and acked');

ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT vacuum_count >= 1 FROM pg_stat_user_tables WHERE relid = 'gatekeeper.mail_live'::regclass",
		't', 60),
	'the worker had mail_live vacuumed once the burst had drained');
is((split /\|/, $node->safe_psql('postgres', $vacuums_sql))[1], '0', 'not by autovacuum (it is off)');
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT pg_relation_size('gatekeeper.mail_live') < $bloated / 4", 't', 30),
	'the vacuum gave the emptied pages back');
is( $node->safe_psql(
		'postgres',
		"SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'gatekeeper.mail_live'::regclass"),
	'0',
	'no dead row left');
is($node->safe_psql('postgres', "SELECT count(*) FROM gatekeeper.mail_done WHERE state = 'sent'"),
	$burst, 'every mail of the burst recorded sent, once');

# a vacuum that cannot clean (a snapshot older than the dead rows) is not
# repeated at every pass (every 5 s): the next waits 10 s, then 20 s.
# First let the first burst's vacuums end: no vacuum running, and none
# started over a housekeeping pass
my $settle_deadline = time + 60;
while (time < $settle_deadline)
{
	my $count = $node->safe_psql('postgres', $vacuums_sql);
	sleep(6);
	last
	  if $node->safe_psql('postgres', $vacuums_sql) eq $count
	  && $node->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'gatekeeper vacuum'") eq '0';
}
my $holder = $node->background_psql('postgres');
$holder->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ');
$holder->query_safe('SELECT count(*) FROM gatekeeper.queue');
burst(20000, 'h', 'Held');
is(drain(20000), 20000, 'a second burst drained while an old snapshot is open');
my $before = (split /\|/, $node->safe_psql('postgres', $vacuums_sql))[0];
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT vacuum_count > $before FROM pg_stat_user_tables WHERE relid = 'gatekeeper.mail_live'::regclass",
		't', 30),
	'the worker had mail_live vacuumed again');
sleep(25);
my $held = (split /\|/, $node->safe_psql('postgres', $vacuums_sql))[0] - $before;
note("vacuums in the 25 s after the first while the snapshot was held: " . ($held - 1));
cmp_ok($held, '<=', 3, "no vacuum at every pass while the dead rows cannot go ($held in about 25 s)");
# each mail of the second burst left one dead live row: the claim deletes
# it (claimed mail is kept in mail_claim's batches)
cmp_ok($node->safe_psql('postgres',
		"SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'gatekeeper.mail_live'::regclass"),
	'>=', 20000, 'the dead rows are still there, held by the snapshot');
$holder->query_safe('COMMIT');
$holder->quit;
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT n_dead_tup = 0 FROM pg_stat_user_tables WHERE relid = 'gatekeeper.mail_live'::regclass",
		't', 120),
	'once the snapshot is gone, a later vacuum removes them');

# the worker goes on: a mail of its own queue is delivered
$node->safe_psql('postgres',
	"SELECT gatekeeper.enqueue('after\@example.com', 'After the burst', 'Still delivering')");
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT count(*) FROM gatekeeper.mail_status WHERE recipient = 'after\@example.com' AND state = 'sent'",
		'1', 60),
	'the worker still delivers after starting the vacuum');
is(GatekeeperTest::sink_count($sink), 1, 'the relay received that one mail, and none of the burst');

$node->stop;
GatekeeperTest::stop_sink($sink);
done_testing();
