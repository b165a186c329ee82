# Copyright: gatekeeper contributors
# gatekeeper-test: alone

# Progress (issue 47, item 4): a campaign of 600 due mails in a queue
# limited to 40 mails a second drains for about 15 s.  While it drains,
# queue_stats gives its rate (mails finished per second over the last
# minute: near the limit, never above what was finished) and eta (the due
# mail at that rate); the worker's log says once that the backlog is
# draining and once that it has drained; afterwards eta is 0 while the
# rate still counts the minute, and an idle queue has rate 0 and eta NULL.
# A second queue with 3 due mails (no backlog) says nothing.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $sink = GatekeeperTest::start_sink(name => 'progress_sink');
my $node = GatekeeperTest::new_node('progress', sink => $sink);
$node->start;
$node->safe_psql('postgres', q{
CREATE EXTENSION gatekeeper;
SELECT gatekeeper.create_queue('campaign', rate_limit => 40);
SELECT gatekeeper.create_queue('reset');
SELECT gatekeeper.create_queue('quiet');
});
my $log_start = -s $node->logfile;

$node->safe_psql('postgres', q{
SELECT count(gatekeeper.enqueue('c' || i || '@example.com', 'Sale', 'Body', 'campaign'))
  FROM generate_series(1, 600) AS i;
SELECT count(gatekeeper.enqueue('r' || i || '@example.com', 'Reset', 'Body', 'reset'))
  FROM generate_series(1, 3) AS i;
});

# while it drains: a rate near the limit and an eta for what is due
ok( GatekeeperTest::wait_for(
		sub {
			$node->safe_psql('postgres',
				"SELECT sent >= 100 AND due > 0 FROM gatekeeper.queue_stats WHERE queue = 'campaign'") eq 't';
		},
		60, '100 mails of the campaign sent'),
	'the campaign is half-way');
my ($rate, $eta_ok, $sent) = split /\|/, $node->safe_psql('postgres', q{
SELECT rate, eta = make_interval(secs => ceil(due / rate)), sent
  FROM gatekeeper.queue_stats WHERE queue = 'campaign'});
cmp_ok($rate, '>', 0, "while draining: rate $rate > 0");
cmp_ok($rate, '<=', 100, 'the rate is near the rate limit of 40 (a second\'s burst, over the seconds since the server started: at most 100)');
is($eta_ok, 't', 'eta is the due mail at that rate');

# while due mail waits for the queue's rate_limit, worker_status says the
# worker is throttled, never idle (issue 47, item 4: it read idle in 9 of 11
# samples): sampled while the campaign still has due mail
my %states;
foreach (1 .. 20)
{
	my ($due, $state) = split /\|/, $node->safe_psql('postgres',
		"SELECT q.due, w.state FROM gatekeeper.queue_stats q, gatekeeper.worker_status w WHERE q.queue = 'campaign'");
	$states{$state}++ if $due > 0;
	select(undef, undef, undef, 0.1);
}
note('worker_status states while due mail waited: ' . join(', ', map { "$_ ($states{$_})" } sort keys %states));
ok(!$states{idle}, 'while the rate_limit holds due mail the worker is never shown idle');
cmp_ok($states{"throttled: a queue's rate_limit holds its due mail"} // 0, '>', 0,
	'... it is shown throttled by the rate_limit');

ok( GatekeeperTest::wait_for(
		sub {
			$node->safe_psql('postgres',
				"SELECT sent = 600 FROM gatekeeper.queue_stats WHERE queue = 'campaign'") eq 't';
		},
		60, 'the campaign sent'),
	'the campaign drained');
is( $node->safe_psql('postgres',
		"SELECT rate > 0, eta FROM gatekeeper.queue_stats WHERE queue = 'campaign'"),
	't|00:00:00', 'drained: the rate counts the last minute, eta 0');
is( $node->safe_psql('postgres',
		"SELECT rate, eta IS NULL FROM gatekeeper.queue_stats WHERE queue = 'quiet'"),
	'0|t', 'an idle queue: rate 0, eta NULL');

# the log: once draining, once drained, nothing for the 3 mails of reset
my $lines;
ok( GatekeeperTest::wait_for(
		sub {
			$lines = slurp_file($node->logfile, $log_start);
			$lines =~ /queue "campaign" has drained/;
		},
		30, 'the drained line'),
	'the log says the campaign drained');
my @draining = $lines =~ /LOG:  gatekeeper queue "campaign" is draining a backlog: (\d+) mails due, ([\d.]+) mails\/s, done in about (\S+)/g;
is(scalar(@draining), 3, 'one line says the backlog is draining') or diag($lines);
cmp_ok($draining[0] // 0, '>=', 100, "it names the due mails ($draining[0])");
my @drained = $lines =~ /LOG:  gatekeeper queue "campaign" has drained its backlog: (\d+) mails finished in (\d+) s/g;
is(scalar(@drained), 2, 'one line says it has drained');
cmp_ok($drained[0] // 0, '>', 0, "it names the mails finished ($drained[0])");
unlike($lines, qr/queue "reset"/, 'three due mails are no backlog: no line');

done_testing();
