# Copyright: gatekeeper contributors
#
# The README's quick start, followed literally as a new user types it, on
# a fresh cluster: its shell steps run as written (the relay it starts,
# Postfix's smtp-sink, and createdb), its postgresql.conf lines are
# appended as written, the server restarted, and its SQL block pasted
# into psql.  What psql prints must be what the README shows (Message-IDs
# masked), and the first mail must arrive at the sink.  Only three things
# are changed, and each is named below: the port and directory of the sink
# (a free port and a temporary directory, so that tests can run side by
# side), su (the test already runs as the server's OS user), and the
# install steps (apt-get, make: the test runs against the installed
# build).  A step the test does not know fails it, so the README cannot
# grow a step this test skips.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use POSIX ();

my $readme = slurp_file("$FindBin::RealBin/../README.md");
my ($section) = $readme =~ /^## Quick start\n(.*?)^## /ms;
ok(defined $section, 'the README has a quick start');

# its fenced blocks, in order: [language, text]
my @blocks;
while ($section =~ /^```(\w*)\n(.*?)^```\s*$/msg)
{
	push @blocks, [ $1, $2 ];
}
my @sh = grep { $_->[0] eq 'sh' } @blocks;
my @conf = grep { $_->[0] eq '' } @blocks;
my @sql = grep { $_->[0] eq 'sql' } @blocks;
is(scalar(@conf), 1, 'one block of postgresql.conf lines');
is(scalar(@sql), 1, 'one SQL block');

my $port = PostgreSQL::Test::Cluster::get_free_port();
my $dir = PostgreSQL::Test::Utils::tempdir('quick_sink');

# the README's sink port and directory, here a free port and a temporary one
sub local_paths
{
	my ($text) = @_;
	$text =~ s{/tmp/gatekeeper-sink}{$dir}g;
	$text =~ s{127\.0\.0\.1:2525}{127.0.0.1:$port}g;
	return $text;
}

my $started = time;
my $node = PostgreSQL::Test::Cluster->new('quick');
$node->init(extra => [ '--encoding=UTF8', '--no-locale' ]);
$node->start;
my %env = (PGHOST => $node->host, PGPORT => $node->port);

my $sink_pid;
my @sink_cmd;
foreach my $block (@sh)
{
	foreach my $line (split /\n/, $block->[1])
	{
		next if $line =~ /^\s*(#.*)?$/;
		if ($line =~ /^(apt-get install|make )/)
		{
			note("install step, done by the test's build: $line");
			next;
		}
		$line = local_paths($line);
		# the test runs as the server's OS user already
		$line =~ s{^su postgres -c '(.*)'$}{$1};
		if ($line =~ m{^(/usr/sbin/smtp-sink .*?)\s*&$})
		{
			my $cmd = $1;
			# -u is what smtp-sink needs when started by root
			$cmd =~ s/ -u postgres// if $> != 0;
			@sink_cmd = split ' ', $cmd;
			$sink_pid = fork();
			die "fork: $!" unless defined $sink_pid;
			if ($sink_pid == 0)
			{
				open(STDOUT, '>>', "$PostgreSQL::Test::Utils::tmp_check/quick_sink.log");
				open(STDERR, '>&', \*STDOUT);
				exec(@sink_cmd) or POSIX::_exit(127);
			}
			ok(GatekeeperTest::wait_for(sub { GatekeeperTest::sink_accepts($port) }, 10, 'the sink'),
				"the README's smtp-sink accepts connections");
			next;
		}
		if ($line =~ /^(mkdir|createdb) /)
		{
			my ($out, $err) = ('', '');
			local $ENV{PGHOST} = $env{PGHOST};
			local $ENV{PGPORT} = $env{PGPORT};
			my $ok = IPC::Run::run([ 'bash', '-c', $line ], '>', \$out, '2>', \$err);
			ok($ok, "the README's step runs: $line") or diag($err);
			next;
		}
		fail("a step of the quick start this test does not know: $line");
	}
}
ok(defined $sink_pid, 'the quick start starts a relay to send to');

# the four lines, as written, then the restart it asks for
$node->append_conf('postgresql.conf', local_paths($conf[0][1]));
$node->restart;

# the SQL block, pasted into psql
my $script = "$PostgreSQL::Test::Utils::tmp_check/quick_start.sql";
PostgreSQL::Test::Utils::append_to_file($script, $sql[0][1]);
my ($out, $err) = ('', '');
IPC::Run::run(
	[ 'psql', '-X', '-h', $node->host, '-p', $node->port, '-d', 'app', '-f', $script ],
	'<', \undef, '>', \$out, '2>', \$err,
	IPC::Run::timeout(120));
is($err, '', 'the quick start\'s SQL runs without an error or a warning');

# the tables a text shows: each a list of rows of trimmed cells, the
# header first; Message-IDs masked
sub tables
{
	my ($text) = @_;
	my @lines = split /\n/, $text;
	my @found;
	for my $i (1 .. $#lines)
	{
		next unless $lines[$i] =~ /^-+(\+-+)*$/ && $lines[ $i - 1 ] =~ /\|/;
		my @table;
		for my $j ($i - 1, $i + 1 .. $#lines)
		{
			last unless $lines[$j] =~ /\|/;
			my $row = $lines[$j] =~ s/<[^>]*>/<message-id>/gr;
			push @table, join(' | ', map { s/^\s+|\s+$//gr } split /\|/, $row, -1);
		}
		push @found, join("\n", @table);
	}
	return @found;
}
my @shown = tables(join("\n", map { s/^-- ?//r } grep { /^--/ } split /\n/, $sql[0][1]));
my @printed = tables($out);
ok(scalar(@shown) >= 2, scalar(@shown) . ' results shown in the quick start');
my $k = 0;
foreach my $table (@shown)
{
	$k++ while $k < @printed && $printed[$k] ne $table;
	ok($k < @printed, "psql printed what the README shows:\n$table")
	  or diag("psql printed:\n$out");
	$k++;
}

# the first mail arrives at the sink
my $first;
ok( GatekeeperTest::wait_for(
		sub {
			opendir(my $dh, $dir) or return 0;
			my @files = grep { -f "$dir/$_" && -s "$dir/$_" } readdir($dh);
			closedir($dh);
			$first //= time if @files;
			return @files >= 2;
		},
		30,
		'two messages at the sink'),
	'the sink received the first mail and one promotion');
note(sprintf('from initdb to the first mail at the sink: %.1f s', $first - $started))
  if defined $first;
diag(sprintf('quick start: %.1f s from a fresh cluster to the first mail', $first - $started))
  if defined $first;

$node->stop;
if ($sink_pid)
{
	kill('TERM', $sink_pid);
	waitpid($sink_pid, 0);
}
done_testing();
