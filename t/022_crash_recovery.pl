# Copyright: gatekeeper contributors

# A crash in the middle of a campaign loses no mail.  5,000 due mails go
# to a real SMTP relay (Postfix's smtp-sink on loopback); while the
# background worker is delivering a batch it is killed with SIGKILL, the
# postmaster restarts the cluster (crash recovery) and the worker starts
# again.  Mail the dead worker had claimed comes back when its short lease
# runs out.  In the end every mail is sent and the relay holds every one;
# the only copies it holds twice are of mail that was in flight, which went
# again on a later attempt with the same Message-ID.  Then the same with a
# second campaign and the postmaster killed instead, and the node started
# again.  Then a campaign in an at_most_once queue, the worker killed: the
# mail in flight becomes unknown and nothing is ever sent twice.  Last, two
# workers drain a campaign together: every mail once, on its first attempt.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

# large enough that the worker is still delivering when the test looks:
# at about 20,000 mails/s into the sink, 5,000 left a window of about a
# quarter of a second between a tenth sent and all sent, which a poll
# every 0.1 s plus a psql call missed once under two parallel tests
my $mails = 10000;
my $batch_size = 100;

# a killed postmaster and its children, which must be gone before it
# starts again
my $postmaster;
my @orphans;

my $sink = GatekeeperTest::start_sink(name => 'crash');
my $node = GatekeeperTest::new_node(
	'crash',
	sink => $sink,
	conf => qq{
gatekeeper.lease = '5s'
gatekeeper.smtp_timeout = '2s'
gatekeeper.batch_size = $batch_size
gatekeeper.retry_delay = '1s'
restart_after_crash = on
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gatekeeper');

my ($first_pid) = GatekeeperTest::worker_pids($node);
ok($first_pid, "the worker runs (pid $first_pid)");

# Enqueue $mails mails to recipients "$prefix<n>@customer.example", wait
# until the worker delivers a batch with a tenth of them sent, and crash:
# kill the worker ($what 'worker') or the postmaster ($what 'postmaster').
# Returns the log offset before the crash.
sub enqueue_campaign
{
	my ($prefix, $queue) = @_;
	$queue //= 'default';
	$node->safe_psql(
		'postgres', qq{
INSERT INTO gatekeeper.mail (queue, recipient, subject, body)
SELECT '$queue', '$prefix' || i || '\@customer.example', 'Campaign mail ' || i,
	   'Dear customer ' || i || E',\\n\\nthis is mail ' || i || E' of $mails.\\n'
  FROM generate_series(1, $mails) AS i});
	return;
}

sub enqueue_and_crash
{
	my ($prefix, $what, $queue) = @_;

	my $log_offset = -s $node->logfile;
	my $start = time;
	enqueue_campaign($prefix, $queue);

	my ($killed, $sent_before);
	GatekeeperTest::wait_for(
		sub {
			my $row = $node->safe_psql(
				'postgres', qq{
SELECT a.pid || '|' || coalesce(a.query, '') || '|' ||
	   (SELECT count(*) FROM gatekeeper.mail_status WHERE state = 'sent' AND recipient LIKE '$prefix%')
  FROM pg_stat_activity a WHERE a.backend_type = 'gatekeeper worker'});
			my ($pid, $activity, $sent) = split /\|/, $row;
			return 0 unless defined $sent;
			# the worker runs a continuous pipeline: with a tenth of the
			# campaign sent and some left, it has mail in flight, whatever
			# step (claiming, delivering, recording) its activity names
			return 0 unless $sent >= $mails / 10 && $sent < $mails;
			if ($what eq 'worker')
			{
				kill('KILL', $pid) or die "could not kill $pid: $!";
			}
			else
			{
				# the postmaster and its children, to wait for
				$postmaster = postmaster_pid();
				@orphans = children_of($postmaster);
				$node->kill9;
			}
			$killed = $pid;
			$sent_before = $sent;
			return 1;
		},
		120,
		"the worker delivering, a tenth of campaign $prefix sent");
	ok($killed, "$prefix: killed the $what while the worker was delivering, "
		  . ($sent_before // 0) . " mails in");
	cmp_ok($sent_before // $mails, '<', $mails, "$prefix: the campaign was not finished");
	note(sprintf("$prefix: killed after %.1f s", time - $start));
	return ($log_offset, $killed);
}

# The postmaster's PID, from postmaster.pid.
sub postmaster_pid
{
	my $file = $node->data_dir . '/postmaster.pid';
	open(my $fh, '<', $file) or die "could not open $file: $!";
	my $pid = <$fh>;
	close($fh);
	chomp($pid);
	return $pid;
}

# The PIDs of the children of process $parent.
sub children_of
{
	my ($parent) = @_;
	my @children;
	opendir(my $dh, '/proc') or die "could not open /proc: $!";
	foreach my $pid (grep { /^\d+$/ } readdir($dh))
	{
		open(my $fh, '<', "/proc/$pid/stat") or next;
		my $stat = <$fh> // '';
		close($fh);
		push @children, $pid if $stat =~ /^\d+ \(.*\) \S+ (\d+) / && $1 == $parent;
	}
	closedir($dh);
	return @children;
}

# Whether process $pid runs (an exited process whose parent died may
# linger as a zombie until it is reaped).
sub process_alive
{
	my ($pid) = @_;
	return 0 unless kill(0, $pid);
	open(my $fh, '<', "/proc/$pid/stat") or return 1;
	my $stat = <$fh> // '';
	close($fh);
	return $stat !~ /^\d+ \(.*\) Z/;
}

# Wait until campaign $prefix is sent; check what the relay holds.
sub check_campaign
{
	my ($prefix) = @_;
	my $start = time;

	ok( GatekeeperTest::poll_until(
			$node, 'postgres',
			"SELECT count(*) FROM gatekeeper.mail_status WHERE state = 'sent' AND recipient LIKE '$prefix%'",
			$mails, 120),
		"$prefix: every mail is sent in the end");
	note(sprintf("$prefix: all sent %.1f s after the restart", time - $start));

	is( $node->safe_psql(
			'postgres',
			"SELECT coalesce(string_agg(state || ':' || n, ','), '') FROM (SELECT state, count(*) AS n FROM gatekeeper.mail_status WHERE state <> 'sent' AND recipient LIKE '$prefix%' GROUP BY state) s"
		),
		'',
		"$prefix: no mail is in any other state");

	# what the relay holds, by recipient: each mail has its own
	my %db;
	foreach my $row (
		split /\n/,
		$node->safe_psql(
			'postgres',
			"SELECT recipient, message_id, attempt FROM gatekeeper.mail_status WHERE recipient LIKE '$prefix%'"))
	{
		my ($rcpt, $mid, $attempt) = split /\|/, $row;
		$db{"<$rcpt>"} = { message_id => $mid, attempt => $attempt };
	}
	is(scalar(keys %db), $mails, "$prefix: $mails mails in the table");

	my %copies;
	GatekeeperTest::wait_for(
		sub {
			%copies = ();
			foreach my $msg (GatekeeperTest::sink_messages($sink))
			{
				my $rcpt = $msg->{rcpt}[0] // '';
				push @{ $copies{$rcpt} }, $msg->{message_id} // ''
				  if $rcpt =~ /^<\Q$prefix\E\d/;
			}
			return scalar(keys %copies) >= $mails;
		},
		30,
		"the relay to hold campaign $prefix");

	my @missing = grep { !$copies{$_} } sort keys %db;
	is(scalar(@missing), 0, "$prefix: the relay received every mail")
	  or diag('missing: ' . join(', ', @missing[ 0 .. ($#missing < 9 ? $#missing : 9) ]));
	my @strangers = grep { !$db{$_} } sort keys %copies;
	is(scalar(@strangers), 0, "$prefix: the relay received no mail that is not in the table");

	my (@wrong_id, @dup_first_attempt);
	my $duplicated = 0;
	foreach my $rcpt (sort keys %copies)
	{
		next unless $db{$rcpt};
		my @ids = @{ $copies{$rcpt} };
		push @wrong_id, $rcpt if grep { $_ ne $db{$rcpt}{message_id} } @ids;
		if (@ids > 1)
		{
			$duplicated++;
			push @dup_first_attempt, $rcpt if $db{$rcpt}{attempt} < 2;
		}
	}
	is(scalar(@wrong_id), 0,
		"$prefix: every copy carries the Message-ID of its mail, the same on every attempt")
	  or diag('wrong Message-ID for: ' . join(', ', @wrong_id));
	is(scalar(@dup_first_attempt), 0,
		"$prefix: a mail the relay holds twice was sent again on a later attempt")
	  or diag('duplicated on the first attempt: ' . join(', ', @dup_first_attempt));
	cmp_ok($duplicated, '<=', $batch_size,
		"$prefix: duplicates are at most the one batch in flight ($duplicated)");
	my $retried = $node->safe_psql('postgres',
		"SELECT count(*) FROM gatekeeper.mail_status WHERE attempt >= 2 AND recipient LIKE '$prefix%'");
	cmp_ok($retried, '<=', $batch_size,
		"$prefix: mails claimed again are at most the one batch in flight ($retried)");
	note("$prefix: $duplicated mails were delivered twice; $retried were claimed again");
	return;
}

#
# 1. The worker is killed
#
my ($offset, $killed) = enqueue_and_crash('a', 'worker');
ok(eval { $node->wait_for_log(qr/all server processes terminated; reinitializing/, $offset); 1 },
	'a: the postmaster restarts the cluster after the crash');
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'gatekeeper worker' AND pid <> $killed",
		'1', 60),
	'a: a new worker runs');
check_campaign('a');
unlike(slurp_file($node->logfile, $offset), qr/\b(ERROR|PANIC):/,
	'a: no errors in the log');

#
# 2. The postmaster is killed
#
($offset, $killed) = enqueue_and_crash('b', 'postmaster');
# its children see it die and exit; then the node starts again
ok(GatekeeperTest::wait_for(sub { !process_alive($killed) }, 30, 'the orphaned worker to exit'),
	'b: the worker exits when the postmaster dies');
# the lock file check of the next postmaster takes a zombie postmaster
# for a running one: wait until it is reaped
ok( GatekeeperTest::wait_for(
		sub { !kill(0, $postmaster) && !grep { process_alive($_) } @orphans },
		60, 'the postmaster and its children to be gone'),
	'b: every process of the killed postmaster is gone');
ok($node->start(fail_ok => 1), 'b: the node starts again');
check_campaign('b');

#
# 3. An at_most_once campaign, the worker killed
#
$node->safe_psql('postgres',
	"SELECT gatekeeper.create_queue('once', delivery => 'at_most_once')");
($offset, $killed) = enqueue_and_crash('c', 'worker', 'once');
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT count(*) FROM gatekeeper.mail_status WHERE recipient LIKE 'c%' AND state IN ('scheduled', 'claimed')",
		'0', 120),
	'c: no mail is left to send');
my ($sent, $unknown, $other, $max_attempt) = split /\|/, $node->safe_psql(
	'postgres', q{
SELECT count(*) FILTER (WHERE state = 'sent'), count(*) FILTER (WHERE state = 'unknown'),
	   count(*) FILTER (WHERE state NOT IN ('sent', 'unknown')), max(attempt)
  FROM gatekeeper.mail_status WHERE recipient LIKE 'c%'});
is($sent + $unknown, $mails, "c: every mail is sent ($sent) or unknown ($unknown)");
is($other, 0, 'c: none in any other state');
cmp_ok($unknown, '<=', $batch_size, 'c: unknown are at most the one batch in flight');
is($max_attempt, 1, 'c: no mail was claimed twice');
note("c: $unknown mails are unknown");

my %state = map { my ($r, $st) = split /\|/; ("<$r>" => $st) } split /\n/,
  $node->safe_psql('postgres',
	"SELECT recipient, state FROM gatekeeper.mail_status WHERE recipient LIKE 'c%'");
my %copies;
foreach my $msg (GatekeeperTest::sink_messages($sink))
{
	my $rcpt = $msg->{rcpt}[0] // '';
	$copies{$rcpt}++ if $rcpt =~ /^<c\d/;
}
is(scalar(grep { $copies{$_} > 1 } keys %copies), 0, 'c: the relay holds no mail twice');
is(scalar(grep { $state{$_} eq 'sent' && !$copies{$_} } keys %state), 0,
	'c: the relay holds every sent mail');

#
# 4. Two workers, no crash
#
$node->append_conf('postgresql.conf', "gatekeeper.workers = 2\n");
$node->restart;
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'gatekeeper worker'",
		'2', 30),
	'd: two workers run');
enqueue_campaign('d');
check_campaign('d');
is( $node->safe_psql('postgres',
		"SELECT max(attempt) || ',' || count(DISTINCT worker) FROM gatekeeper.mail_status WHERE recipient LIKE 'd%'"),
	'1,2',
	'd: every mail went on its first attempt, and both workers took part');

$node->stop;
GatekeeperTest::stop_sink($sink);

done_testing();
