# Copyright: gatekeeper contributors

# Hostile reports (issue 27): a corpus of more than 200 malformed,
# truncated and foreign reports, written by test/reports/hostile.py
# (multiparts nested past the depth bound with a real mail's token at the
# bottom, missing and absurd boundaries, 10 MB lines, truncations at 100
# points, wrong charsets and broken encodings, 20000 recipient groups,
# 200000 header fields, reports for other senders, a real mail's token or
# Message-ID with another recipient), each fed to gatekeeper.ingest_report()
# the way the README's bounce pipe does it (psql, the message read from
# standard input, client encoding LATIN1 so that no octet is refused), all
# in one backend:
#
#  - no error escapes (psql stops at the first: ON_ERROR_STOP);
#  - nothing is written: no event, no suppression, the mail's outcome
#    untouched; each report is counted as ignored (report_stats);
#  - the backend's memory is bounded: its memory contexts hold no more at
#    the end than after the first reports, and its resident size grows by
#    less than 64 MB over the whole corpus (the messages are up to 10 MB).

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = GatekeeperTest::new_node('hostile', conf => "gatekeeper.workers = 0\n");
$node->start;
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION gatekeeper;
SELECT gatekeeper.create_queue('news', return_path => 'bounces+{token}@bounce.shop.example');
SELECT gatekeeper.enqueue('reader@isp.example', 'Picks', 'Hello', 'news', sender => 'shop@shop.example');
SELECT gatekeeper.ack(c.id, c.attempt) FROM gatekeeper.claim('w', 1) c;
});
my ($id, $token, $msgid) = split /\|/, $node->safe_psql('postgres',
	"SELECT id, gatekeeper._verp_token(id), message_id FROM gatekeeper.mail_status");
like($token, qr/^[a-z2-7]{29}$/, 'the sent mail has its token');

my $dir = PostgreSQL::Test::Utils::tempdir('hostile');
my $count = `$GatekeeperTest::PYTHON $FindBin::RealBin/../test/reports/hostile.py $dir/corpus $token reader\@isp.example '$msgid'`;
chomp $count;
cmp_ok($count, '>=', 200, "the corpus holds $count reports");

# one psql session: the README's pipe script, once per report
my @files = sort glob("$dir/corpus/*.eml");
is(scalar(@files), $count, 'every report is a file');
my $script = "$dir/feed.sql";
open(my $fh, '>', $script) or die $!;
print $fh "\\o $dir/out_a.txt\n";
my $n = 0;
# delivered to a bounce address whose token is forged (one letter off)
my $forged = $token;
substr($forged, 10, 1) = substr($token, 10, 1) eq 'a' ? 'b' : 'a';
foreach my $f (@files)
{
	print $fh "\\set message `cat $f`\n";
	print $fh "SELECT count(*) FROM gatekeeper.ingest_report(:'message', 'bounces+$forged\@bounce.shop.example');\n";
	$n++;
	if ($n == 20)
	{
		print $fh "\\o $dir/mem_start.txt\n";
		print $fh "SELECT sum(total_bytes) FROM pg_backend_memory_contexts;\n";
		print $fh "SELECT 'VmRSS: ' || substring(pg_read_file('/proc/self/status') FROM 'VmRSS:\\s*(\\d+)');\n";
		print $fh "\\o $dir/out_b.txt\n";
	}
}
print $fh "\\o $dir/mem_end.txt\n";
print $fh "SELECT sum(total_bytes) FROM pg_backend_memory_contexts;\n";
print $fh "SELECT 'VmRSS: ' || substring(pg_read_file('/proc/self/status') FROM 'VmRSS:\\s*(\\d+)');\n";
print $fh "SELECT 'VmHWM: ' || substring(pg_read_file('/proc/self/status') FROM 'VmHWM:\\s*(\\d+)');\n";
close($fh);

my $ignored_before = $node->safe_psql('postgres', 'SELECT ignored FROM gatekeeper.report_stats');
my ($stdout, $stderr) = ('', '');
my $ret;
{
	# the client encoding the README's pipe sets: every octet is a character
	local $ENV{PGCLIENTENCODING} = 'LATIN1';
	my $ok = IPC::Run::run(
		[ 'psql', '-X', '-q', '-t', '-A', '-v', 'ON_ERROR_STOP=1',
		  '-d', $node->connstr('postgres'), '-f', $script ],
		'<', \undef, '>', \$stdout, '2>', \$stderr,
		IPC::Run::timeout(900));
	$ret = $? >> 8;
}
is($ret, 0, 'no report made an error escape');
is($stderr, '', 'nothing on standard error');

my @rows = grep { /^\s*\d+\s*$/ } split /\n/,
  slurp_file("$dir/out_a.txt") . slurp_file("$dir/out_b.txt");
is(scalar(@rows), $count, 'every report answered');
is(scalar(grep { $_ != 0 } @rows), 0, 'no report gave a row');

is($node->safe_psql('postgres', "SELECT count(*) FROM gatekeeper.events WHERE event <> 'sent'"),
	'0', 'no event was written');
is($node->safe_psql('postgres', 'SELECT count(*) FROM gatekeeper.suppression'),
	'0', 'no address was suppressed');
is($node->safe_psql('postgres', 'SELECT state FROM gatekeeper.mail_status'),
	'sent', 'the mail is as it was');
is($node->safe_psql('postgres', 'SELECT ignored FROM gatekeeper.report_stats') - $ignored_before,
	$count, 'every report was counted as ignored');

my $mem_start = slurp_file("$dir/mem_start.txt");
my $mem_end = slurp_file("$dir/mem_end.txt");
my ($ctx_start) = $mem_start =~ /^\s*(\d+)\s*$/m;
my ($rss_start) = $mem_start =~ /VmRSS:\s*(\d+)/;
my ($ctx_end) = $mem_end =~ /^\s*(\d+)\s*$/m;
my ($rss_end) = $mem_end =~ /VmRSS:\s*(\d+)/;
my ($hwm) = $mem_end =~ /VmHWM:\s*(\d+)/;
note("memory contexts $ctx_start -> $ctx_end bytes, RSS $rss_start -> $rss_end kB, peak $hwm kB");
cmp_ok($ctx_end, '<=', $ctx_start + 1024 * 1024, 'the memory contexts did not grow');
cmp_ok($rss_end - $rss_start, '<', 64 * 1024, 'the resident size grew by less than 64 MB');

done_testing();
