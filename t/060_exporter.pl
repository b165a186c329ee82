# Copyright: gatekeeper contributors
#
# Monitoring with Prometheus: Debian's postgres_exporter, started on
# loopback with the repository's monitoring/queries.yaml and connected as
# the README's monitoring role (no superuser, no SELECT on the mail),
# serves gatekeeper's queue, gate-memory and worker figures as metrics
# with the values the database holds.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use GatekeeperTest;
use HTTP::Tiny;
use POSIX ();
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

plan skip_all => "$GatekeeperTest::EXPORTER is not installed" unless -x $GatekeeperTest::EXPORTER;

# no background worker at first (so nothing reaps the expired lease below);
# one for the worker series after a restart, with every queue here reserved
# for external senders (background => false) so it sends none of their mail
my $node = GatekeeperTest::new_node('exporter', conf => "gatekeeper.workers = 0\n");
$node->start;
$node->safe_psql('postgres', q{
CREATE EXTENSION gatekeeper;
SELECT gatekeeper.create_queue('promo', gates => '{smart_sending}', background => false);
SELECT gatekeeper.create_queue('later', background => false);
SELECT gatekeeper.pause('later');
SELECT gatekeeper.enqueue('r' || i || '@example.com', 's', 'b', queue => 'promo',
						  send_at => now() - interval '90 seconds')
  FROM generate_series(1, 5) AS i;
SELECT gatekeeper.enqueue('l' || i || '@example.com', 's', 'b', queue => 'later',
						  send_at => now() + interval '1 day')
  FROM generate_series(1, 3) AS i;
SELECT count(*) FROM gatekeeper.claim('w', 2, '5 minutes', '{promo}');
-- finished mail: 2 sent, 1 failed, 1 cancelled of 4 enqueued
SELECT gatekeeper.create_queue('done', background => false);
SELECT gatekeeper.enqueue('d' || i || '@example.com', 's', 'b', queue => 'done')
  FROM generate_series(1, 4) AS i;
SELECT gatekeeper.cancel(max(id)) FROM gatekeeper.mail_status WHERE queue = 'done';
CREATE TEMP TABLE c AS SELECT id, attempt FROM gatekeeper.claim('w', 10, '5 minutes', '{done}');
SELECT gatekeeper.ack(id, attempt) FROM c WHERE id < (SELECT max(id) FROM c);
SELECT gatekeeper.nack(id, attempt, '550 no such user', true) FROM c WHERE id = (SELECT max(id) FROM c);
-- a sender that died holding a mail: its lease runs out
SELECT gatekeeper.create_queue('stuck', background => false);
SELECT gatekeeper.enqueue('s1@example.com', 's', 'b', queue => 'stuck');
SELECT count(*) FROM gatekeeper.claim('dead', 1, '1 ms', '{stuck}');
SELECT count(*) FROM gatekeeper.gate_pass_batch('smart_sending',
	ARRAY['g1@example.com', 'g2@example.com', 'g3@example.com', 'g4@example.com']);

-- the README's monitoring role
CREATE ROLE monitor LOGIN;
SELECT gatekeeper.grant('monitor', 'monitor');
GRANT pg_monitor TO monitor;
});

my $queries = "$FindBin::RealBin/../monitoring/queries.yaml";
ok(-f $queries, 'monitoring/queries.yaml is in the repository');

my $exporter = GatekeeperTest::start_exporter($node);
my $log = $exporter->{log};
# Prometheus, when it runs, stopped when the test ends whatever happens
my @exporters;
END { kill 'TERM', @exporters if @exporters; }

# one scrape, once the exporter answers with a series matching $want (at
# most 20 s)
sub scrape { return GatekeeperTest::scrape($exporter, @_); }
my $body = scrape(qr/^gatekeeper_/m);
ok(defined $body, 'the exporter serves gatekeeper metrics')
  or diag(slurp_file($log));
$body //= '';

# the value of one series, by metric name and labels
sub metric { return GatekeeperTest::metric($body, @_); }

is(metric('gatekeeper_queue_scheduled', 'queue="promo"'), 3, 'scheduled: 3 of 5 promo mails left');
is(metric('gatekeeper_queue_claimed', 'queue="promo"'), 2, 'claimed: the 2 a worker holds');
is(metric('gatekeeper_queue_due', 'queue="promo"'), 3, 'due: the 3 scheduled promo mails');
is(metric('gatekeeper_queue_due', 'queue="later"'), 0, 'due: none of the mail scheduled tomorrow');
is(metric('gatekeeper_queue_scheduled', 'queue="later"'), 3, 'scheduled: the 3 mails for tomorrow');
is(metric('gatekeeper_queue_paused', 'queue="later"'), 1, 'paused: 1 for the paused queue');
is(metric('gatekeeper_queue_paused', 'queue="promo"'), 0, 'paused: 0 for the others');
my $age = metric('gatekeeper_queue_oldest_due_age_seconds', 'queue="promo"');
ok(defined $age && $age >= 90 && $age < 600, 'oldest due age: the promo mail has waited 90 s or more')
  or diag("oldest_due_age_seconds: " . ($age // 'missing'));
is(metric('gatekeeper_gate_memory_entries'), 6, 'gate memory entries: 4 passes by gate_pass, 2 by the claim');
is(metric('gatekeeper_gate_memory_used_bytes'), 6 * 64, 'gate memory used: 64 bytes an entry');
is(metric('gatekeeper_gate_memory_limit_bytes'),
	$node->safe_psql('postgres', 'SELECT bytes_total FROM gatekeeper.gate_memory'),
	'gate memory limit: the setting');
like($body, qr/^# TYPE gatekeeper_gate_memory_full_refusals_total counter$/m,
	'refusals are a counter');
# the totals are counters, one series per queue
is(metric('gatekeeper_queue_enqueued_total', 'queue="done"'), 4, 'enqueued_total: 4 in done');
is(metric('gatekeeper_queue_sent_total', 'queue="done"'), 2, 'sent_total: 2 acked');
is(metric('gatekeeper_queue_failed_total', 'queue="done"'), 1, 'failed_total: 1 nacked for good');
is(metric('gatekeeper_queue_cancelled_total', 'queue="done"'), 1, 'cancelled_total: 1 cancelled');
is(metric('gatekeeper_queue_suppressed_total', 'queue="done"'), 0, 'suppressed_total: none');
is(metric('gatekeeper_queue_enqueued_total', 'queue="promo"'), 5, 'enqueued_total: 5 in promo');
is(metric('gatekeeper_queue_sent_total', 'queue="promo"'), 0, 'sent_total: none of promo yet');
# a claim whose lease ran out, the stuck-sender alarm
is(metric('gatekeeper_queue_lease_expired', 'queue="stuck"'), 1, 'lease_expired: the dead sender\'s claim');
is(metric('gatekeeper_queue_lease_expired', 'queue="promo"'), 0, 'lease_expired: none of the leases still running');
foreach my $c (qw(enqueued sent failed suppressed expired cancelled unknown))
{
	like($body, qr/^# TYPE gatekeeper_queue_${c}_total counter$/m, "${c}_total is a counter");
}
foreach my $g (qw(scheduled due claimed oldest_due_age_seconds lease_expired))
{
	like($body, qr/^# TYPE gatekeeper_queue_$g gauge$/m, "$g is a gauge");
}
is(metric('gatekeeper_worker_up'), undef, 'no worker series while no worker runs');
unlike(slurp_file($log), qr/level=error/, 'the exporter logged no error');

# the worker's health: restart with one worker, and the exporter (it does
# not reconnect by itself to a restarted server)
$node->append_conf('postgresql.conf', "gatekeeper.workers = 1\n");
$node->restart;
GatekeeperTest::stop_exporter($exporter);
$exporter = GatekeeperTest::start_exporter($node);
$node->poll_query_until('postgres', 'SELECT count(*) = 1 FROM gatekeeper.worker_status')
  or die 'the background worker did not show in worker_status';
my $worker_pid = $node->safe_psql('postgres', 'SELECT pid FROM gatekeeper.worker_status');
$body = scrape(qr/^gatekeeper_worker_up\{[^}]*worker="1"[^}]*\} 1$/m);
ok(defined $body, 'after the restart the exporter serves the worker series')
  or diag(slurp_file($log));
$body //= '';
is(metric('gatekeeper_worker_up', qq{worker="1"}), 1, 'worker up, labelled by its number, not its pid');
unlike($body, qr/pid="/, 'no series is labelled by a pid, which changes at every restart');
is(metric('gatekeeper_worker_in_flight', qq{worker="1"}), 0, 'worker in flight: nothing (its queues are reserved)');
is(metric('gatekeeper_worker_relay_open', qq{worker="1"}), 0, 'worker relay breaker: not open');
like($body, qr/^gatekeeper_worker_last_success_timestamp_seconds\{[^}]*worker="1"[^}]*\} NaN$/m,
	'worker last success: never, which is NaN, not 0');
my $started = metric('gatekeeper_worker_started_timestamp_seconds', qq{worker="1"});
ok(defined $started && abs($started - time()) < 600, 'worker started: a time of this run')
  or diag('started_timestamp_seconds: ' . ($started // 'missing'));
like($body, qr/^# TYPE gatekeeper_worker_sent_total counter$/m, 'worker sent_total is a counter');
# the dashboard's Server selector lists the values of this label
like($body, qr/^gatekeeper_worker_up\{[^}]*\bserver="[^"]+"/m, 'series carry the server label the dashboard selects on');
like($body, qr/^# TYPE gatekeeper_worker_unsigned_total counter$/m, 'worker unsigned_total is a counter');
is(metric('gatekeeper_worker_unsigned_total', qq{worker="1"}), 0, 'worker unsigned_total: nothing built');

# ---------------------------------------------------------------- Prometheus
# Debian's Prometheus on loopback scrapes the exporter every second; every
# panel of monitoring/dashboard.json must be an expression it accepts that
# gives data here, and every rule of monitoring/alerts.yaml one it accepts.
my $prometheus = '/usr/bin/prometheus';
SKIP:
{
	skip "$prometheus is not installed", 1 unless -x $prometheus;

	my $pdir = "$PostgreSQL::Test::Utils::tmp_check/prometheus";
	mkdir $pdir;
	my $pport = PostgreSQL::Test::Cluster::get_free_port();
	PostgreSQL::Test::Utils::append_to_file("$pdir/prometheus.yml", <<"EOC");
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: gatekeeper
    static_configs:
      - targets: ['127.0.0.1:$exporter->{port}']
EOC
	my $ppid = fork();
	die "fork: $!" unless defined $ppid;
	if ($ppid == 0)
	{
		open(STDOUT, '>>', "$pdir/prometheus.log") or POSIX::_exit(126);
		open(STDERR, '>&', \*STDOUT) or POSIX::_exit(126);
		exec($prometheus, "--config.file=$pdir/prometheus.yml", "--storage.tsdb.path=$pdir/data",
			"--web.listen-address=127.0.0.1:$pport", '--web.enable-lifecycle')
		  or POSIX::_exit(127);
	}
	push @exporters, $ppid;

	require JSON::PP;
	my $json = JSON::PP->new;
	my $http = HTTP::Tiny->new(timeout => 10);
	# the result of one instant query, or undef when Prometheus refused it
	my $query = sub {
		my ($expr) = @_;
		my $r = $http->get("http://127.0.0.1:$pport/api/v1/query?"
			  . $http->www_form_urlencode({ query => $expr }));
		return undef unless $r->{content} && $r->{content} =~ /^\{/;
		return $json->decode($r->{content});
	};
	# three scrapes of the worker series at least, so rate() has samples
	my $ready;
	for (1 .. 300)
	{
		my $r = $query->('count_over_time(gatekeeper_worker_up[5m]) >= 3');
		if ($r && $r->{status} eq 'success' && @{ $r->{data}{result} })
		{
			$ready = 1;
			last;
		}
		usleep(100_000);
	}
	ok($ready, 'Prometheus scraped the exporter three times')
	  or diag(slurp_file("$pdir/prometheus.log"));

	my $dashboard = $json->decode(slurp_file("$FindBin::RealBin/../monitoring/dashboard.json"));
	my @exprs = map { map { $_->{expr} } @{ $_->{targets} } } @{ $dashboard->{panels} };
	ok(@exprs >= 10, 'the dashboard has panels with queries');
	# as Grafana sends them with "All" chosen in each selector
	foreach my $var (grep { $_->{type} eq 'query' } @{ $dashboard->{templating}{list} })
	{
		s/\$\Q$var->{name}\E\b/$var->{allValue}/g foreach @exprs;
	}
	foreach my $expr (@exprs)
	{
		my $r = $query->($expr);
		ok($r && $r->{status} eq 'success' && @{ $r->{data}{result} },
			"dashboard query gives data: $expr")
		  or diag($r ? $json->encode($r) : 'no answer');
	}
	my @rules = slurp_file("$FindBin::RealBin/../monitoring/alerts.yaml") =~ /^\s+expr: (?:>-\n)?(.*?)\n\s+(?:for|labels):/msg;
	ok(@rules >= 5, 'alerts.yaml has rule expressions');
	foreach my $expr (@rules)
	{
		$expr =~ s/\s+/ /g;
		my $r = $query->($expr);
		ok($r && $r->{status} eq 'success', "Prometheus evaluates the alert expression: $expr")
		  or diag($r ? $json->encode($r) : 'no answer');
	}
	kill 'TERM', $ppid;
	waitpid($ppid, 0);
}


done_testing();
