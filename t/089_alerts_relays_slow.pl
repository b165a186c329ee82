# Copyright: gatekeeper contributors
# gatekeeper-test: alone

# The shipped alerts for "nothing is being delivered" against a real
# Prometheus (issue 45, item 3): two servers that delivered for a minute,
# then one relay goes down (nothing listens) and the other defers
# everything ("451 4.3.0"), mail still being enqueued on both.  A private
# Prometheus scraping both exporters every second, with
# monitoring/alerts.yaml, must fire GatekeeperRelayRefusing for the first
# and GatekeeperRelayDeferring for the second within 5 minutes of the
# trouble starting, whatever was delivered before.  The firing times are
# printed.
#
# Slow (about 6 minutes): run only with GK_SLOW_TESTS=1, e.g.
#   GK_SLOW_TESTS=1 make installcheck REGRESS= ISOLATION= PROVE_TESTS=t/089_alerts_relays_slow.pl

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use HTTP::Tiny;
use JSON::PP;
use POSIX ();
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

plan skip_all => 'slow: set GK_SLOW_TESTS=1 to run it' unless $ENV{GK_SLOW_TESTS};
my $prometheus = '/usr/bin/prometheus';
plan skip_all => "$prometheus is not installed" unless -x $prometheus;
plan skip_all => "$GatekeeperTest::EXPORTER is not installed" unless -x $GatekeeperTest::EXPORTER;

my $sink = GatekeeperTest::start_sink(name => 'down_relay');
my $defer_file = "$PostgreSQL::Test::Utils::tmp_check/defer_everything";
my $deferring = GatekeeperTest::start_hostile_relay(
	name => 'deferring',
	defer => '451 4.3.0 Temporary local problem: out of disk',
	defer_file => $defer_file);

my %nodes;
foreach my $case ([ 'relay_down', $sink->{url} ], [ 'relay_deferring', $deferring->{url} ])
{
	my ($name, $url) = @$case;
	my $node = GatekeeperTest::new_node($name, smtp_url => $url,
		conf => "gatekeeper.retry_delay = '5s'\n");
	$node->start;
	$node->safe_psql('postgres', q{
CREATE EXTENSION gatekeeper;
CREATE ROLE monitor LOGIN;
SELECT gatekeeper.grant('monitor', 'monitor');
GRANT pg_monitor TO monitor;
});
	$nodes{$name} = { node => $node, exporter => GatekeeperTest::start_exporter($node, name => $name) };
}

my $pdir = "$PostgreSQL::Test::Utils::tmp_check/prometheus_relays";
mkdir $pdir;
my $pport = PostgreSQL::Test::Cluster::get_free_port();
my $rules = "$FindBin::RealBin/../monitoring/alerts.yaml";
my $targets = join('', map { <<"EOT" } sort keys %nodes);
      - targets: ['127.0.0.1:$nodes{$_}{exporter}{port}']
        labels:
          server: '$_'
EOT
PostgreSQL::Test::Utils::append_to_file("$pdir/prometheus.yml", <<"EOC");
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - $rules
scrape_configs:
  - job_name: gatekeeper
    static_configs:
$targets
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

# firing alerts, as "server alertname"
sub firing
{
	my $r = $http->get("http://127.0.0.1:$pport/api/v1/alerts");
	return () unless $r->{success};
	return map { "$_->{labels}{server} $_->{labels}{alertname}" }
	  grep { $_->{state} eq 'firing' } @{ $json->decode($r->{content})->{data}{alerts} };
}

my $n = 0;
sub enqueue_one
{
	$n++;
	$_->{node}->safe_psql('postgres',
		"SELECT gatekeeper.enqueue('r$n\@customer.example', 'Hello $n', 'Body')") foreach values %nodes;
}

# a minute of delivery on both
my $until = time + 60;
while (time < $until)
{
	enqueue_one();
	usleep(2_000_000);
}
foreach my $name (sort keys %nodes)
{
	cmp_ok($nodes{$name}{node}->safe_psql('postgres', "SELECT count(*) FROM gatekeeper.mail_status WHERE state = 'sent'"),
		'>=', 20, "$name: delivered before the trouble");
}
is(join(',', firing()), '', 'nothing fires while mail is delivered');

# the trouble
GatekeeperTest::stop_sink($sink);
PostgreSQL::Test::Utils::append_to_file($defer_file, "on\n");
my $t0 = time;
my %fired;
my %want = ('relay_down GatekeeperRelayRefusing' => 1, 'relay_deferring GatekeeperRelayDeferring' => 1);
while (time < $t0 + 330 && grep { !$fired{$_} } keys %want)
{
	enqueue_one();
	foreach my $f (firing())
	{
		$fired{$f} //= time - $t0;
	}
	usleep(2_000_000);
}
foreach my $w (sort keys %want)
{
	ok(defined $fired{$w} && $fired{$w} < 300, "$w fires within 5 minutes of the trouble")
	  or diag(slurp_file("$pdir/prometheus.log"));
}
note(sprintf('%s fired %.0f s after the trouble began', $_, $fired{$_})) foreach sort keys %fired;

kill 'TERM', $ppid;
waitpid($ppid, 0);
foreach my $name (sort keys %nodes)
{
	GatekeeperTest::stop_exporter($nodes{$name}{exporter});
	$nodes{$name}{node}->stop;
}
GatekeeperTest::stop_helper($deferring->{pid});
done_testing();
