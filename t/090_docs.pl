# Copyright: gatekeeper contributors
#
# Docs that run as pasted, and show what they return.  Every ```sql block
# of README.md and of docs/*.md runs, in the order of its file, in one psql
# session per file (so \gset variables and COPY data flow as a reader
# pasting them would see), all in one database "app" of a cluster with the
# background worker and a real SMTP sink (smtp-sink), as the README's quick
# start sets one up: first the README, then each doc in turn, as a user
# who followed the quick start and then reads on.  So the walkthroughs must
# not collide (each its own queues, gates and recipients) and must not lean
# on each other.  A block may be excepted only explicitly, by a line
#   <!-- docs-test: skip (why) -->
# just before its fence; blocks of other languages (sh, text, output) are
# not SQL and are not run.
#
# Every result a block shows is compared: a run of comment lines after a
# statement that looks like psql's output (a header line, then a line of
# dashes, then the rows) is that statement's result, compared cell by cell
# after masking what differs from run to run: Message-IDs, times, and the
# columns named id or *_id.  A cell the docs abbreviate with "..." matches
# any text there.

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
# as the quick start: the database, then a restart
$node->safe_psql('postgres', 'CREATE DATABASE app');
$node->restart;

# the runnable blocks of a file: [line, [lines]]
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
			push @blocks, [ $start, [@body] ] if $in eq 'sql' && !$skip;
			$in = undef;
			next;
		}
		push @body, $l if $in;
	}
	return @blocks;
}

# A block as psql runs it, with each shown result's statement between two
# markers; returns the script and the shown tables: {where, rows}.
sub instrument
{
	my ($file, $block, $shown) = @_;
	my ($line0, $lines) = @$block;
	my @out = ("\\echo '---- $file line $line0'");
	my $i = 0;
	while ($i <= $#$lines)
	{
		# a shown table: a comment line, then a comment line of dashes
		if (   $lines->[$i] =~ /^--  /
			&& $i < $#$lines
			&& $lines->[ $i + 1 ] =~ /^--\s+-+(\+-+)*\s*$/)
		{
			my $t = $i;
			my @rows;
			while ($i <= $#$lines && $lines->[$i] =~ /^--  |^-- -+(\+-+)*\s*$/)
			{
				push @rows, $lines->[$i] =~ s/^-- ?//r;
				$i++;
			}
			my $n = scalar @$shown;
			# the statement: back from the table to a blank or comment
			# line, or to the end of the statement before
			my $s = $#out;
			$s-- while $s > 0 && $out[ $s - 1 ] !~ /^\s*$|^\s*--|^\\|;\s*(--.*)?$|\\gset\s*(--.*)?$/;
			splice @out, $s, 0, "\\echo '==== shown $n'";
			push @out, "\\echo '==== end $n'";
			push @$shown, { where => "$file line " . ($line0 + $t + 1), rows => \@rows };
			next;
		}
		push @out, $lines->[$i];
		$i++;
	}
	return join("\n", @out) . "\n";
}

# masks what differs from run to run; cells of a row, header first
sub cells
{
	my ($header, $line) = @_;
	my @c = map { s/^\s+|\s+$//gr } split /\|/, $line, -1;
	for my $k (0 .. $#c)
	{
		$c[$k] =~ s/<\d+\.[^\s@<>]*@[^\s<>]+>/<MESSAGE-ID>/g;
		$c[$k] =~ s/\d{4}-\d\d-\d\d[ T]\d\d:\d\d(:\d\d(\.\d+)?)?([+-]\d\d(:\d\d)?)?/<TIME>/g;
		$c[$k] = '<ID>'
		  if $header && defined $header->[$k] && $header->[$k] =~ /^(id|\w+_id)$/
		  && $header->[$k] ne 'message_id' && $c[$k] =~ /^\d+$/;
	}
	return \@c;
}

sub table
{
	my @rows = grep { !/^\s*$/ && !/^\s*-+(\+-+)*\s*$/ && !/^\(\d+ rows?\)$/ } @_;
	return [] unless @rows;
	my $header = cells(undef, $rows[0]);
	return [ $header, map { cells($header, $_) } @rows[ 1 .. $#rows ] ];
}

# the shown table matches the result; "..." in a shown cell matches any text
sub same_table
{
	my ($shown, $got) = @_;
	return 0 unless @$shown == @$got;
	for my $r (0 .. $#$shown)
	{
		return 0 unless @{ $shown->[$r] } == @{ $got->[$r] };
		for my $k (0 .. $#{ $shown->[$r] })
		{
			my $re = join '.*', map { quotemeta } split /\.\.\./, $shown->[$r][$k], -1;
			return 0 unless $got->[$r][$k] =~ /^$re$/s;
		}
	}
	return 1;
}

my ($total, $compared) = (0, 0);
foreach my $file (@files)
{
	my @blocks = sql_blocks($file);
	next unless @blocks;

	my (@shown, $script);
	$script .= instrument($file, $_, \@shown) foreach @blocks;

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

	for my $n (0 .. $#shown)
	{
		my ($got) = ($out =~ /^==== shown $n\n(.*?)^==== end $n$/ms);
		my $want = table(@{ $shown[$n]{rows} });
		my $have = table(split /\n/, $got // '');
		ok(same_table($want, $have), "$file: the result shown at $shown[$n]{where}")
		  or diag("shown:\n" . join("\n", @{ $shown[$n]{rows} }) . "\nreturned:\n" . ($got // "(nothing)\n"));
		$compared++;
	}

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
ok($compared >= 10, "$compared shown results compared");

$node->stop;
GatekeeperTest::stop_sink($sink);
done_testing();
