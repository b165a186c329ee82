# Copyright: gatekeeper contributors

# What the worker holds in memory is bounded by gatekeeper.max_in_flight,
# not by the batch: 200 mails of 5 MB each (1 GB in all) go to a relay
# with max_in_flight = 32MB, and the worker's peak resident memory
# (VmHWM in /proc/<pid>/status) stays under 32 MB + 100 MB + the 16 MB of
# shared_buffers it may touch, and its private memory (RssAnon, sampled
# while it sends) under 32 MB + 100 MB.  A worker that builds a whole
# claimed batch at once holds hundreds of MB (batch_size is 50 here to
# keep such a worker from taking gigabytes).  Every mail is sent.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $n = 200;
my $mb = 5;
# max_in_flight plus 100 MB for everything else the worker holds; its
# resident size also counts the shared buffers it touched (16 MB here)
my $anon_bound_kb = (32 + 100) * 1024;
my $bound_kb = $anon_bound_kb + 16 * 1024;

# no dump of the messages: 1 GB of files helps nobody
my $port = PostgreSQL::Test::Cluster::get_free_port();
my $sink_log = "$PostgreSQL::Test::Utils::tmp_check/memory_sink.log";
my @sink = ($GatekeeperTest::SMTP_SINK, '-c', '-t', '30', "127.0.0.1:$port", '128');
my $sink_pid = GatekeeperTest::start_helper('smtp-sink (no dump)', \@sink, $sink_log);
GatekeeperTest::wait_for_greeting('smtp-sink', $sink_pid, $port, $sink_log);

my $node = GatekeeperTest::new_node(
	'memory',
	smtp_url => "smtp://127.0.0.1:$port",
	conf => "gatekeeper.max_in_flight = '32MB'\n"
	  . "gatekeeper.batch_size = 50\n"
	  . "gatekeeper.smtp_connections = 8\n"
	  . "gatekeeper.helo_name = 'mta.example.com'\n"
	  . "shared_buffers = '16MB'\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gatekeeper');
my ($ret, $out) = $node->psql('postgres', 'SHOW gatekeeper.max_in_flight');
is($out, '32MB', 'gatekeeper.max_in_flight is a setting');

my ($pid) = GatekeeperTest::worker_pids($node);
ok($pid, "the worker runs (pid $pid)") or die 'no worker';

# 5 MB of plain 7-bit text in lines of 76 octets; the mails are created
# in one transaction so the worker sees them all at once
my $lines = int($mb * 1024 * 1024 / 77);
my $t0 = time;
$node->safe_psql('postgres',
	"SELECT count(gatekeeper.enqueue('big' || i || '\@customer.example', 'Big ' || i, repeat(lpad(i::text, 8, '0') || repeat('y', 67) || E'\\n', $lines))) FROM generate_series(1, $n) AS i"
);
note(sprintf('enqueued %d mails of %d MB in %.1f s', $n, $mb, time - $t0));

# sample the worker while it sends
my ($max_rss, $max_anon) = (0, 0);
my $deadline = time + 120;
my $done = 0;
while (time < $deadline)
{
	open(my $fh, '<', "/proc/$pid/status") or last;
	while (my $line = <$fh>)
	{
		$max_rss = $1 if $line =~ /^VmRSS:\s+(\d+)/ && $1 > $max_rss;
		$max_anon = $1 if $line =~ /^RssAnon:\s+(\d+)/ && $1 > $max_anon;
	}
	close($fh);
	my $left = $node->safe_psql('postgres',
		"SELECT count(*) FROM gatekeeper.mail_status WHERE state IN ('scheduled', 'claimed')");
	if ($left eq '0')
	{
		$done = 1;
		last;
	}
	usleep(100_000);
}
my $mem = GatekeeperTest::process_memory_kb($pid);
ok($done, "the worker finished all $n mails");
is(GatekeeperTest::mail_states($node, 'true'), "sent:$n", 'every mail is sent');
note("worker memory: VmHWM $mem->{VmHWM} kB, max VmRSS seen $max_rss kB, max RssAnon seen $max_anon kB");
ok(defined $mem->{VmHWM}, 'the same worker ran throughout');
cmp_ok($mem->{VmHWM} // 0, '<', $bound_kb,
	"the worker's peak resident memory stays near max_in_flight: $mem->{VmHWM} kB < $bound_kb kB");
cmp_ok($max_anon, '<', $anon_bound_kb,
	"its private memory (RssAnon, sampled every 100 ms) stays under 32 MB + 100 MB: $max_anon kB");

$node->stop;
GatekeeperTest::stop_helper($sink_pid);

done_testing();
