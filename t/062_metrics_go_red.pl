# Copyright: gatekeeper contributors
#
# Metrics that go red when nothing is delivered (issue 28), and an idle
# worker that says so in pg_stat_activity:
# - a relay that answers 4xx to every recipient (smtp-sink -r RCPT): the
#   worker's deferred_total rises while sent_total stays 0, in
#   gatekeeper.worker_status and in the exporter's first scrape, long
#   before any mail runs out of attempts, and queue_stats.retrying (the
#   exported gatekeeper_queue_retrying) counts the mail waiting to retry;
# - an smtp_url the worker cannot use is refused when it is set: ALTER
#   SYSTEM fails, and a reload of a postgresql.conf that has one keeps the
#   value in force and says why in the log.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $sink = GatekeeperTest::start_sink(args => [ '-r', 'RCPT' ]);
my $node = GatekeeperTest::new_node('red', sink => $sink,
	conf => "gatekeeper.retry_delay = '1h'\n");
$node->start;
$node->safe_psql('postgres', q{
CREATE EXTENSION gatekeeper;
SELECT gatekeeper.enqueue('r' || i || '@example.com', 'Hello', 'Body') FROM generate_series(1, 5) AS i;
});

ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		'SELECT deferred_total >= 5 AND sent_total = 0 AND failed_total = 0 FROM gatekeeper.worker_status', 't', 60),
	'worker_status: the relay deferred every mail, none was sent or failed');
is($node->safe_psql('postgres', "SELECT count(*) FROM gatekeeper.mail_status WHERE state = 'scheduled' AND attempt = 1"),
	'5', 'the mail waits for its retry, one attempt charged');
is($node->safe_psql('postgres', "SELECT scheduled, retrying FROM gatekeeper.queue_stats WHERE queue = 'default'"),
	'5|5', 'queue_stats: the five scheduled mails are retrying');
is($node->safe_psql('postgres', 'SELECT relay, worker FROM gatekeeper.worker_status'),
	'closed|1', 'the breaker stays closed (the session was fine): only the counters say it');
# nothing in flight: pg_stat_activity says what the worker waits in, not the
# last thing it did ("claiming")
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		q{SELECT a.state || ': ' || a.query FROM pg_stat_activity a, gatekeeper.worker_status w WHERE a.pid = w.pid},
		'idle: idle', 30),
	'pg_stat_activity shows the idle worker as idle, not as claiming');

# the exporter's first scrape shows it
SKIP:
{
	skip "$GatekeeperTest::EXPORTER is not installed", 4 unless -x $GatekeeperTest::EXPORTER;
	$node->safe_psql('postgres', q{
CREATE ROLE monitor LOGIN;
SELECT gatekeeper.grant('monitor', 'monitor');
});
	my $exporter = GatekeeperTest::start_exporter($node, name => 'red');
	my $body = GatekeeperTest::scrape($exporter, qr/^gatekeeper_worker_deferred_total/m);
	GatekeeperTest::stop_exporter($exporter);
	ok(defined $body, 'the exporter serves the worker series') or diag(slurp_file($exporter->{log}));
	$body //= '';
	note("the scrape while the relay answers 4xx to every recipient:\n"
		  . join("\n", grep { /^gatekeeper_(worker|queue)_(deferred|sent|failed|due|relay_open|oldest|retrying)/ } split /\n/, $body));
	my $deferred = GatekeeperTest::metric($body, 'gatekeeper_worker_deferred_total', 'worker="1"');
	my $sent = GatekeeperTest::metric($body, 'gatekeeper_worker_sent_total', 'worker="1"');
	ok(defined $deferred && $deferred >= 5, 'one scrape: deferred_total ' . ($deferred // 'missing'))
	  or diag($body);
	is($sent, '0', 'one scrape: sent_total 0');
	is(GatekeeperTest::metric($body, 'gatekeeper_queue_retrying', 'queue="default"'), '5', 'one scrape: the queue\'s retrying gauge 5');
}

# an smtp_url the worker cannot use is refused when it is set
my ($ret, $out, $err) = $node->psql('postgres',
	"ALTER SYSTEM SET gatekeeper.smtp_url = 'http://127.0.0.1:27601'");
like($err, qr/gatekeeper.smtp_url must begin with smtp:\/\/ or smtps:\/\//, 'ALTER SYSTEM refuses an http:// URL');
my $before = $node->safe_psql('postgres', 'SHOW gatekeeper.smtp_url');
my $offset = -s $node->logfile;
$node->append_conf('postgresql.conf', "gatekeeper.smtp_url = 'http://127.0.0.1:27601'\n");
$node->reload;
ok( GatekeeperTest::wait_for(
		sub {
			my $l = slurp_file($node->logfile, $offset);
			$l =~ /LOG:  gatekeeper.smtp_url must begin with smtp:\/\/ or smtps:\/\//
			  && $l =~ /contains errors; unaffected changes were applied/;
		},
		30,
		'the reload to log the refused URL'),
	'a reload with an http:// URL in postgresql.conf says why in the log');
is($node->safe_psql('postgres', 'SHOW gatekeeper.smtp_url'), $before, '... and keeps the URL in force');

$node->stop;
GatekeeperTest::stop_sink($sink);
done_testing();
