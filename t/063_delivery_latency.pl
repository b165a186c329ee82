# Copyright: gatekeeper contributors
# gatekeeper-test: alone
#
# Delivery latency as a Prometheus histogram (issue 28): each background
# worker counts, for every mail the relay accepted, the time from when the
# mail was due to the relay's 250, in fixed buckets, shown by
# gatekeeper.delivery_latency and exported by monitoring/queries.yaml as
# gatekeeper_delivery_latency_seconds_{bucket,sum,count}.
# - four mails enqueued with a send_at an hour in the past count from their
#   enqueue (they were not due before they existed): all within 60 s;
# - three mails held 3 s in a paused queue count those 3 s: none within
#   2.5 s, and the sum is at least 9 s;
# - every one of the seven counts once, as the relay's log shows seven
#   distinct Message-IDs.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $sink = GatekeeperTest::start_sink();
my $node = GatekeeperTest::new_node('latency', sink => $sink);
$node->start;
$node->safe_psql('postgres', q{
CREATE EXTENSION gatekeeper;
SELECT gatekeeper.create_queue('held');
SELECT gatekeeper.pause('held');
});
$node->poll_query_until('postgres', 'SELECT count(*) = 1 FROM gatekeeper.worker_status')
  or die 'the background worker did not show in worker_status';
is($node->safe_psql('postgres', 'SELECT worker, count, buckets[14] FROM gatekeeper.delivery_latency'),
	'1|0|0', 'a worker that delivered nothing has an empty histogram');

# due an hour before they were enqueued: counted from the enqueue
$node->safe_psql('postgres', q{
SELECT gatekeeper.enqueue('past' || i || '@example.com', 'Past', 'Body',
						  send_at => now() - interval '1 hour')
  FROM generate_series(1, 4) AS i;
});
ok( GatekeeperTest::poll_until(
		$node, 'postgres', 'SELECT sent_total FROM gatekeeper.worker_status', '4', 60),
	'the four mails due in the past are sent');

# held 3 s in a paused queue after they came due
$node->safe_psql('postgres', q{
SELECT gatekeeper.enqueue('held' || i || '@example.com', 'Held', 'Body', queue => 'held')
  FROM generate_series(1, 3) AS i;
});
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		q{SELECT now() - max(send_at) >= interval '3 seconds' FROM gatekeeper.mail_status WHERE queue = 'held'},
		't', 30),
	'the held mails have been due 3 s');
$node->safe_psql('postgres', "SELECT gatekeeper.resume('held')");
ok( GatekeeperTest::poll_until(
		$node, 'postgres', 'SELECT sent_total FROM gatekeeper.worker_status', '7', 60),
	'the three held mails are sent once resumed');

my %ids = map { $_->{message_id} => 1 } GatekeeperTest::sink_messages($sink);
is(scalar(keys %ids), 7, 'the relay received seven distinct Message-IDs');

# the view: bounds in seconds, cumulative counts (le[7] = 2.5, le[11] = 60)
is($node->safe_psql('postgres', 'SELECT le[7], le[11], le[14], cardinality(le) FROM gatekeeper.delivery_latency'),
	'2.5|60|3600|14', 'the buckets\' upper bounds, in seconds');
my ($count, $within_2_5, $within_60, $within_3600, $sum) = split /\|/, $node->safe_psql('postgres',
	'SELECT count, buckets[7], buckets[11], buckets[14], sum_seconds FROM gatekeeper.delivery_latency WHERE worker = 1');
is($count, 7, 'count: the seven mails the relay accepted');
ok($within_2_5 <= 4, "within 2.5 s: none of the three held 3 s ($within_2_5)");
is($within_60, 7, 'within 60 s: all seven (the hour before the enqueue does not count)');
is($within_3600, 7, 'within an hour: all seven');
ok($sum >= 9 && $sum < 7 * 60, "sum: at least the 9 s the held mails waited, less than 7 minutes ($sum)");

# the exporter makes a Prometheus histogram of it
SKIP:
{
	skip "$GatekeeperTest::EXPORTER is not installed", 7 unless -x $GatekeeperTest::EXPORTER;
	$node->safe_psql('postgres', q{
CREATE ROLE monitor LOGIN;
SELECT gatekeeper.grant('monitor', 'monitor');
});
	my $exporter = GatekeeperTest::start_exporter($node, name => 'latency');
	my $body = GatekeeperTest::scrape($exporter, qr/^gatekeeper_delivery_latency_seconds_count/m);
	GatekeeperTest::stop_exporter($exporter);
	ok(defined $body, 'the exporter serves the latency series') or diag(slurp_file($exporter->{log}));
	$body //= '';
	note("the latency series:\n" . join("\n", grep { /gatekeeper_delivery_latency/ } split /\n/, $body));

	# one series by name and le, of worker 1
	my $series = sub {
		my ($name, $le) = @_;
		return GatekeeperTest::metric($body, $name, 'worker="1"', defined $le ? (qq{le="$le"}) : ());
	};
	like($body, qr/^# TYPE gatekeeper_delivery_latency_seconds histogram$/m, 'a histogram');
	is($series->('gatekeeper_delivery_latency_seconds_count'), 7, '_count: 7');
	is($series->('gatekeeper_delivery_latency_seconds_bucket', '+Inf'), 7, 'le="+Inf": 7');
	is($series->('gatekeeper_delivery_latency_seconds_bucket', '60'), 7, 'le="60": 7');
	my $b25 = $series->('gatekeeper_delivery_latency_seconds_bucket', '2.5');
	ok(defined $b25 && $b25 <= 4, 'le="2.5": none of the held mails (' . ($b25 // 'missing') . ')');
	my $s = $series->('gatekeeper_delivery_latency_seconds_sum');
	ok(defined $s && $s >= 9, '_sum: at least 9 s (' . ($s // 'missing') . ')');
}

$node->stop;
GatekeeperTest::stop_sink($sink);
done_testing();
