# Copyright: gatekeeper contributors
# gatekeeper-test: alone
#
# A standby lost with gatekeeper.claim_standbys = 1 (issue 45, item 5).
# Delivery stops, by design (as synchronous_standby_names stops commits),
# and says so at once, however few mails wait (five here: far fewer than a
# claim's window, so no mail is due and no due-mail alert can fire):
# - the log says once that the worker waits, for how many standbys, how
#   many stream, and how to lower the setting on a promoted node; and once
#   when it stops waiting (the standby back, or the setting lowered);
# - worker_status shows the held mail and since when, and so do the
#   exporter's series (the real prometheus-postgres-exporter with
#   monitoring/queries.yaml);
# - a private Prometheus scraping that exporter with monitoring/alerts.yaml
#   loaded fires GatekeeperWaitingForStandbys within 5 minutes of the
#   standby going away (the time is noted: 2 min), and no other alert.
# A standby that streams but flushes nothing (its walreceiver stopped, as
# a host that stops answering) is said in the log after 30 s.  Each held
# mail goes once when the standby comes back, or when the setting is
# lowered as the log says.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use HTTP::Tiny;
use JSON::PP;
use POSIX ();
use Time::HiRes qw(time usleep);

my $waits_re = qr/LOG:  gatekeeper worker waits for 1 standby: 0 streaming\n(?:.*\n)*?.*DETAIL:  gatekeeper.claim_standbys is 1: no claimed mail goes on the wire before that many streaming standbys have flushed its claim; (\d+) mails? waits?\.\n.*HINT:  .*ALTER SYSTEM SET gatekeeper.claim_standbys = 0; SELECT pg_reload_conf\(\);/;
my $stops_re = qr/LOG:  gatekeeper worker no longer waits for standbys\n.*DETAIL:  (.*)/;

my $sink = GatekeeperTest::start_sink();
my $primary = GatekeeperTest::new_node(
	'lost_primary',
	sink => $sink,
	naptime => '100ms',
	conf => qq{
wal_level = replica
max_wal_senders = 4
wal_sender_timeout = '5min'
gatekeeper.claim_standbys = 1
});
$primary->start;
$primary->safe_psql('postgres', q{
CREATE EXTENSION gatekeeper;
CREATE ROLE monitor LOGIN;
SELECT gatekeeper.grant('monitor', 'monitor');
});
$primary->backup('lost_backup');
my $standby = PostgreSQL::Test::Cluster->new('lost_standby');
$standby->init_from_backup($primary, 'lost_backup', has_streaming => 1);
$standby->start;
$primary->wait_for_catchup('lost_standby', 'replay', $primary->lsn('insert'));

# with the standby streaming, mail goes, and the log says nothing of it
$primary->safe_psql('postgres',
	"SELECT gatekeeper.enqueue('a' || i || '\@example.com', 'Before', 'body') FROM generate_series(1, 3) i");
ok(GatekeeperTest::wait_for(sub { GatekeeperTest::sink_count($sink) == 3 }, 30, 'three mails'),
	'with the standby streaming, the mail goes');
unlike(slurp_file($primary->logfile), qr/waits for 1 standby/, '... and the log says no wait');

# the standby goes away; five mails come
my $offset = -s $primary->logfile;
$standby->stop;
my $lost_at = time;
ok(GatekeeperTest::poll_until($primary, 'postgres',
		"SELECT count(*) FROM pg_stat_replication", '0', 30),
	'the standby is gone');
$primary->safe_psql('postgres',
	"SELECT gatekeeper.enqueue('b' || i || '\@example.com', 'While lost', 'body') FROM generate_series(1, 5) i");

ok( GatekeeperTest::poll_until(
		$primary, 'postgres',
		q{SELECT state || '|' || held_for_standbys || '|' || (held_since BETWEEN now() - interval '1 minute' AND now())
		    FROM gatekeeper.worker_status},
		'waiting for 1 standby: 0 streaming|5|true', 30),
	'worker_status: the five mails are held for the standby, since a moment ago');
ok( GatekeeperTest::wait_for(sub { slurp_file($primary->logfile, $offset) =~ $waits_re }, 30,
		'the log to say the worker waits'),
	'the log says the worker waits for 1 standby, 0 streaming, and how to lower the setting');
my ($waiting) = slurp_file($primary->logfile, $offset) =~ $waits_re;
is($waiting, 5, '... with the five mails waiting');
is($primary->safe_psql('postgres', "SELECT due, claimed FROM gatekeeper.queue_stats WHERE queue = 'default'"),
	'0|5', 'no mail is due: the worker holds all five claimed');
is(GatekeeperTest::sink_count($sink), 3, 'none of them went');

# the exporter's series
my $exporter = GatekeeperTest::start_exporter($primary, name => 'lost');
my $body = GatekeeperTest::scrape($exporter, qr/^gatekeeper_worker_held_for_standbys\{[^}]*\} 5$/m);
ok(defined $body, 'the exporter serves gatekeeper_worker_held_for_standbys 5')
  or diag(slurp_file($exporter->{log}));
my $since = GatekeeperTest::metric($body, 'gatekeeper_worker_held_since_timestamp_seconds', 'worker="1"');
ok(defined $since && $since >= $lost_at - 1 && $since <= time,
	'... and gatekeeper_worker_held_since_timestamp_seconds, since the standby went away')
  or diag('held_since_timestamp_seconds: ' . ($since // 'missing') . ", lost at $lost_at");

# a private Prometheus scraping the exporter every second, with the shipped
# rules: the standby alert fires within 5 minutes of the standby going
# away (its rule: the oldest held mail waited over a minute, for a
# minute), and nothing else fires
my $prometheus = '/usr/bin/prometheus';
SKIP:
{
	skip "$prometheus is not installed", 2 unless -x $prometheus;
	# the alert takes two minutes to fire: with the slow tests only
	# (GK_SLOW_TESTS=1, README); promtool checks the rule in every run
	skip 'a real Prometheus waiting for the alert is slow: set GK_SLOW_TESTS=1', 2
	  unless $ENV{GK_SLOW_TESTS};

	my $pdir = "$PostgreSQL::Test::Utils::tmp_check/prometheus_lost";
	mkdir $pdir;
	my $pport = PostgreSQL::Test::Cluster::get_free_port();
	my $rules = "$FindBin::RealBin/../monitoring/alerts.yaml";
	PostgreSQL::Test::Utils::append_to_file("$pdir/prometheus.yml", <<"EOC");
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - $rules
scrape_configs:
  - job_name: gatekeeper
    static_configs:
      - targets: ['127.0.0.1:$exporter->{port}']
        labels:
          server: 'lost_primary'
EOC
	my $ppid = fork();
	die "fork: $!" unless defined $ppid;
	if ($ppid == 0)
	{
		open(STDOUT, '>>', "$pdir/prometheus.log") or POSIX::_exit(126);
		open(STDERR, '>&', \*STDOUT) or POSIX::_exit(126);
		exec($prometheus, "--config.file=$pdir/prometheus.yml", "--storage.tsdb.path=$pdir/data",
			"--web.listen-address=127.0.0.1:$pport")
		  or POSIX::_exit(127);
	}

	my $json = JSON::PP->new;
	my $http = HTTP::Tiny->new(timeout => 10);
	# the alerts Prometheus holds, by name: their state
	my $alerts = sub {
		my $r = $http->get("http://127.0.0.1:$pport/api/v1/alerts");
		return {} unless $r->{success};
		return { map { $_->{labels}{alertname} => $_->{state} } @{ $json->decode($r->{content})->{data}{alerts} } };
	};
	my ($fired_at, %seen);
	while (time < $lost_at + 330)
	{
		my $a = $alerts->();
		$seen{$_} = 1 foreach grep { $_ ne 'GatekeeperWaitingForStandbys' && $a->{$_} eq 'firing' } keys %$a;
		if (($a->{GatekeeperWaitingForStandbys} // '') eq 'firing')
		{
			$fired_at = time;
			last;
		}
		usleep(500_000);
	}
	ok(defined $fired_at && $fired_at - $lost_at < 300,
		'Prometheus fires GatekeeperWaitingForStandbys within 5 minutes of the standby going away')
	  or diag(slurp_file("$pdir/prometheus.log"));
	note(sprintf('GatekeeperWaitingForStandbys fired %.0f s after the standby went away',
			$fired_at - $lost_at)) if defined $fired_at;
	is(join(',', sort keys %seen), '', '... and no other alert fired');
	kill 'TERM', $ppid;
	waitpid($ppid, 0);
}
GatekeeperTest::stop_exporter($exporter);

# the worker said it once, though it looked at the standbys every 200 ms
my @waits = slurp_file($primary->logfile, $offset) =~ /(gatekeeper worker waits for)/g;
is(scalar(@waits), 1, 'the log said it once');

# the standby comes back: the five go, once each, and the log says so
$standby->start;
ok(GatekeeperTest::wait_for(sub { GatekeeperTest::sink_count($sink) == 8 }, 60, 'eight mails'),
	'the standby back, the five held mails go');
ok( GatekeeperTest::wait_for(sub { slurp_file($primary->logfile, $offset) =~ $stops_re }, 30,
		'the log to say the wait ended'),
	'the log says the worker no longer waits');
my ($why) = slurp_file($primary->logfile, $offset) =~ $stops_re;
like($why, qr/^1 standby streams and has flushed the claims: the held mail goes on the wire after waiting \d+ s\.$/,
	'... because the standby streams again');
ok( GatekeeperTest::poll_until(
		$primary, 'postgres',
		q{SELECT held_for_standbys || '|' || (held_since IS NULL) FROM gatekeeper.worker_status}, '0|true', 30),
	'worker_status: nothing held');

# a standby whose host stops answering: its walsender streams on (until
# wal_sender_timeout), but nothing is flushed; the worker says it waits
# once the oldest held mail has waited 30 s, and stops when the standby
# flushes again
my $receiver = $standby->safe_psql('postgres', 'SELECT pid FROM pg_stat_wal_receiver');
ok($receiver =~ /^\d+$/, 'the standby\'s walreceiver runs') or BAIL_OUT('no walreceiver');
$offset = -s $primary->logfile;
kill 'STOP', $receiver;
$primary->safe_psql('postgres',
	"SELECT gatekeeper.enqueue('h' || i || '\@example.com', 'Standby hangs', 'body') FROM generate_series(1, 1) i");
my $hung_at = time;
ok( GatekeeperTest::wait_for(
		sub {
			slurp_file($primary->logfile, $offset) =~
			  /LOG:  gatekeeper worker waits for 1 standby: 1 streaming, \d+ bytes behind\n.*DETAIL:  .*; 1 mail waits\./;
		},
		60,
		'the log to say the worker waits for a standby that flushes nothing'),
	'a standby that streams and flushes nothing: the log says the worker waits, 1 streaming, bytes behind');
my $logged_after = time - $hung_at;
ok($logged_after >= 25, sprintf('... once the mail has waited about 30 s (%.0f s)', $logged_after));
is(GatekeeperTest::sink_count($sink), 8, '... and the mail did not go');
kill 'CONT', $receiver;
ok(GatekeeperTest::wait_for(sub { GatekeeperTest::sink_count($sink) == 9 }, 60, 'nine mails'),
	'the standby answering again, the held mail goes');
ok( GatekeeperTest::wait_for(sub { slurp_file($primary->logfile, $offset) =~ $stops_re }, 30,
		'the log to say the wait ended'),
	'the log says the worker no longer waits');

# lost again: the operator lowers the setting as the log says, and the
# held mail goes
$offset = -s $primary->logfile;
$standby->stop;
ok(GatekeeperTest::poll_until($primary, 'postgres',
		"SELECT count(*) FROM pg_stat_replication", '0', 30),
	'the standby is gone again');
$primary->safe_psql('postgres',
	"SELECT gatekeeper.enqueue('c' || i || '\@example.com', 'Lost again', 'body') FROM generate_series(1, 2) i");
ok( GatekeeperTest::wait_for(sub { slurp_file($primary->logfile, $offset) =~ $waits_re }, 30,
		'the log to say the worker waits'),
	'the log says the worker waits again');
my ($hint) = slurp_file($primary->logfile, $offset) =~ /HINT:  .*: (ALTER SYSTEM SET .*)$/m;
$primary->safe_psql('postgres', $hint);
ok(GatekeeperTest::wait_for(sub { GatekeeperTest::sink_count($sink) == 11 }, 60, 'eleven mails'),
	'the hint\'s statements, run as written, let the held mail go');
ok( GatekeeperTest::wait_for(sub { slurp_file($primary->logfile, $offset) =~ $stops_re }, 30,
		'the log to say the wait ended'),
	'the log says the worker no longer waits');
($why) = slurp_file($primary->logfile, $offset) =~ $stops_re;
like($why, qr/^gatekeeper.claim_standbys is 0: the held mail goes on the wire after waiting \d+ s\.$/,
	'... because the setting is 0');

my %sent;
$sent{ $_->{rcpt}[0] // '' }++ foreach GatekeeperTest::sink_messages($sink);
is(scalar(grep { $_ != 1 } values %sent), 0, 'every mail went once');

$primary->stop;
GatekeeperTest::stop_sink($sink);
done_testing();
