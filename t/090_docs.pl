# Copyright: gatekeeper contributors
#
# Docs that run as pasted: every ```sql block of README.md and of docs/*.md
# runs, in the order of its file, in one psql session (so \gset variables
# and COPY data flow as a reader pasting them would see), against a fresh
# database "app" of a cluster with the background worker and a real SMTP
# sink (smtp-sink), as the README's quick start sets one up.  A block may be
# excepted only explicitly, by a line
#   <!-- docs-test: skip (why) -->
# just before its fence; blocks of other languages (sh, text, output) are
# not SQL and are not run.  Each file gets a fresh database and the roles
# the previous file made are dropped, so files do not lean on each other.
# A file that creates the extension itself (the quick start) runs as is;
# the others run with the extension created.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $root = "$FindBin::RealBin/..";
my @files = ('README.md', map { "docs/" . (split m{/}, $_)[-1] } sort glob("$root/docs/*.md"));

my $sink = GatekeeperTest::start_sink();
my $node = GatekeeperTest::new_node('docs', sink => $sink, database => 'app');
$node->start;
my $roles_before = $node->safe_psql('postgres', 'SELECT string_agg(quote_literal(rolname), \',\') FROM pg_roles');

# the runnable blocks of a file: [line, text]
sub sql_blocks
{
	my ($file) = @_;
	my @lines = split /\n/, slurp_file("$root/$file");
	my (@blocks, $in, $start, @body, $skip);
	for my $i (0 .. $#lines)
	{
		my $l = $lines[$i];
		if (!$in && $l =~ /^```(\w*)\s*$/)
		{
			$in = $1 eq '' ? 'plain' : $1;
			$start = $i + 1;
			@body = ();
			my $prev = $i > 0 ? $lines[ $i - 1 ] : '';
			$skip = $prev =~ /^<!-- docs-test: skip/;
			next;
		}
		if ($in && $l =~ /^```\s*$/)
		{
			push @blocks, [ $start, join("\n", @body) . "\n" ] if $in eq 'sql' && !$skip;
			$in = undef;
			next;
		}
		push @body, $l if $in;
	}
	return @blocks;
}

my $total = 0;
foreach my $file (@files)
{
	my @blocks = sql_blocks($file);
	next unless @blocks;

	$node->safe_psql('postgres', 'DROP DATABASE IF EXISTS app WITH (FORCE)');
	$node->safe_psql('postgres', 'CREATE DATABASE app');
	foreach my $role (split /\n/, $node->safe_psql('postgres',
			"SELECT quote_ident(rolname) FROM pg_roles WHERE rolname NOT IN ($roles_before)"))
	{
		$node->safe_psql('postgres', "DROP ROLE $role");
	}
	my $script = '';
	foreach my $b (@blocks)
	{
		$script .= "\\echo '---- $file line $b->[0]'\n$b->[1]";
	}
	$node->safe_psql('app', 'CREATE EXTENSION gatekeeper')
	  unless $script =~ /^CREATE EXTENSION gatekeeper/m;

	my $path = "$PostgreSQL::Test::Utils::tmp_check/docs_" . ($file =~ s{\W}{_}gr) . '.sql';
	PostgreSQL::Test::Utils::append_to_file($path, $script);
	my ($out, $err) = ('', '');
	my $ok = IPC::Run::run(
		[
			'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-h', $node->host, '-p', $node->port,
			'-d', 'app', '-f', $path
		],
		'<', \undef, '>', \$out, '2>', \$err,
		IPC::Run::timeout(300));
	my ($where) = ($out =~ /.*^---- (.*)$/ms);
	ok($ok && $err !~ /ERROR/, "$file: its " . scalar(@blocks) . " SQL blocks run as pasted")
	  or diag("stopped in the block at " . ($where // 'the start') . ":\n$err");
	$total += @blocks;

	# the quick start does what it says: its first mail is sent, and of the
	# two promotions one reached the relay and the gate suppressed the other
	if ($file eq 'README.md')
	{
		ok( GatekeeperTest::poll_until(
				$node, 'app',
				q{SELECT string_agg(state::text, ',' ORDER BY id) FROM gatekeeper.mail_status},
				'sent,sent,suppressed', 60),
			'README.md: the quick start\'s mail is sent, and one promotion of two');
		ok(GatekeeperTest::wait_for(sub { GatekeeperTest::sink_count($sink) == 2 }, 30, 'two messages at the sink'),
			'README.md: the relay received two messages');
	}
}
ok($total >= 10, "$total SQL blocks ran");

$node->stop;
GatekeeperTest::stop_sink($sink);
done_testing();
