# Copyright: gatekeeper contributors
# gatekeeper-test: alone

# The background worker sleeps as long as gatekeeper.naptime (here an
# hour) unless there is work: the commit of due mail wakes it.
#
#  - CREATE EXTENSION wakes a worker waiting for it;
#  - one due mail committed while the worker sleeps goes within seconds;
#  - mail enqueued in an open transaction does not go before the commit,
#    and goes within seconds after it; mail rolled back never goes;
#  - mail due in 3 s goes about 3 s later: the worker sleeps until the
#    next due mail, not for the naptime, and never sends early;
#  - INSERT ... SELECT and COPY wake it like enqueue;
#  - resume() of a paused queue wakes it;
#  - CREATE EXTENSION after a DROP EXTENSION the worker noticed wakes it,
#    and mail enqueued right after goes at once.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

# a wake must deliver within this many seconds of the commit
my $prompt = 5;

my $sink = GatekeeperTest::start_sink(name => 'wake');
my $node = GatekeeperTest::new_node('wake', sink => $sink, naptime => '1h');
$node->start;

is($node->safe_psql('postgres', 'SHOW gatekeeper.naptime'), '1h', 'gatekeeper.naptime is an hour');

# mail to "$tag<n>@customer.example" at the relay
sub at_sink
{
	my ($tag) = @_;
	return scalar(grep { ($_->{rcpt}[0] // '') =~ /^<\Q$tag\E\d*\@/ }
		  GatekeeperTest::sink_messages($sink));
}

sub state_of
{
	my ($tag) = @_;
	return $node->safe_psql('postgres',
		"SELECT string_agg(DISTINCT state::text, ',') FROM gatekeeper.mail_status WHERE recipient LIKE '$tag%'"
	);
}

# Wait until the mail tagged $tag is all sent, at most 30 s; returns the
# seconds it took from $since (a time() value), or undef.
sub sent_within
{
	my ($tag, $since) = @_;
	return undef
	  unless GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT count(*) > 0 AND bool_and(state = 'sent') FROM gatekeeper.mail_status WHERE recipient LIKE '$tag%'",
		't', 30);
	return time - $since;
}

# Wait until the worker sleeps: idle in its latch wait.
sub worker_asleep
{
	return GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT state = 'idle' AND wait_event_type = 'Extension' FROM pg_stat_activity WHERE backend_type = 'gatekeeper worker'",
		't', 30);
}

# the worker has started and, finding no extension, sleeps
my $log_offset = -s $node->logfile;
ok(worker_asleep(), 'the worker sleeps, waiting for the extension');

#
# CREATE EXTENSION wakes it
#
my $t0 = time;
$node->safe_psql('postgres', 'CREATE EXTENSION gatekeeper');
ok(eval { $node->wait_for_log(qr/gatekeeper worker found extension gatekeeper/, $log_offset); 1 },
	'the worker finds the extension');
cmp_ok(time - $t0, '<', $prompt, 'at once, not after the naptime');

#
# One due mail, committed while the worker sleeps
#
ok(worker_asleep(), 'the worker sleeps');
sleep(2);    # well into its nap
$t0 = time;
$node->safe_psql('postgres',
	"SELECT gatekeeper.enqueue('one\@customer.example', 'Hello', 'Hello there')");
my $took = sent_within('one', $t0);
ok(defined $took, 'a due mail is sent');
cmp_ok($took // 99, '<', $prompt, sprintf('within %d s of its commit (%.2f s)', $prompt, $took // 99));
is( $node->safe_psql(
		'postgres',
		"SELECT extract(epoch FROM finished_at - created_at) < $prompt FROM gatekeeper.mail_status WHERE recipient = 'one\@customer.example'"
	),
	't',
	'the table agrees');
ok(GatekeeperTest::wait_for(sub { at_sink('one') == 1 }, 10), 'the relay received it');

#
# An open transaction: nothing before the commit; a rollback sends nothing
#
ok(worker_asleep(), 'the worker sleeps');
my $session = $node->background_psql('postgres');
$session->query_safe('BEGIN');
$session->query_safe("SELECT gatekeeper.enqueue('open\@customer.example', 'Hello', 'Hello there')");
sleep(2);    # a worker woken too early would have looked by now
is(state_of('open'), '', 'the uncommitted mail is not visible');
is(at_sink('open'), 0, 'nor sent');
$t0 = time;
$session->query_safe('COMMIT');
$took = sent_within('open', $t0);
ok(defined $took, 'the mail is sent after the commit');
cmp_ok($took // 99, '<', $prompt, sprintf('within %d s of the commit (%.2f s)', $prompt, $took // 99));

ok(worker_asleep(), 'the worker sleeps');
$session->query_safe('BEGIN');
$session->query_safe("SELECT gatekeeper.enqueue('rolledback\@customer.example', 'Hello', 'Hello there')");
$session->query_safe('ROLLBACK');
$session->quit;
# the next commit of due mail wakes the worker: by the time that mail is
# sent, a rolled-back mail would have gone too
$t0 = time;
$node->safe_psql('postgres',
	"SELECT gatekeeper.enqueue('after\@customer.example', 'Hello', 'Hello there')");
$took = sent_within('after', $t0);
cmp_ok($took // 99, '<', $prompt, sprintf('the next mail is sent within %d s (%.2f s)', $prompt, $took // 99));
ok(GatekeeperTest::wait_for(sub { at_sink('after') == 1 }, 10), 'the relay received it');
is(at_sink('rolledback'), 0, 'the rolled-back mail is never sent');
is(state_of('rolledback'), '', 'nor in the table');

#
# Mail due in 3 s: the worker sleeps until then, not for the naptime
#
ok(worker_asleep(), 'the worker sleeps');
$t0 = time;
$node->safe_psql('postgres',
	"SELECT gatekeeper.enqueue('later\@customer.example', 'Hello', 'Hello there', send_at => now() + interval '3 seconds')"
);
$took = sent_within('later', $t0);
ok(defined $took, 'mail due in 3 s is sent');
cmp_ok($took // 99, '<', 3 + $prompt, sprintf('soon after it is due (%.2f s after the commit)', $took // 99));
my ($early, $late) = split /\|/, $node->safe_psql(
	'postgres',
	"SELECT finished_at >= send_at, extract(epoch FROM finished_at - send_at) FROM gatekeeper.mail_status WHERE recipient = 'later\@customer.example'"
);
is($early, 't', 'not before it was due');
cmp_ok($late, '<', $prompt, "delivered $late s after it was due");

#
# Bulk writes wake it too
#
ok(worker_asleep(), 'the worker sleeps');
$t0 = time;
$node->safe_psql(
	'postgres', q{
INSERT INTO gatekeeper.mail (recipient, subject, body)
SELECT 'bulk' || i || '@customer.example', 'Mail ' || i, 'Body ' || i
  FROM generate_series(1, 100) AS i});
$took = sent_within('bulk', $t0);
cmp_ok($took // 99, '<', $prompt,
	sprintf('INSERT ... SELECT of 100 mails: sent within %d s (%.2f s)', $prompt, $took // 99));

ok(worker_asleep(), 'the worker sleeps');
my $copy = "COPY gatekeeper.mail (recipient, subject, body) FROM STDIN;\n"
  . join('', map { "copy$_\@customer.example\tMail $_\tBody $_\n" } 1 .. 100) . "\\.\n";
$t0 = time;
$node->safe_psql('postgres', $copy);
$took = sent_within('copy', $t0);
cmp_ok($took // 99, '<', $prompt,
	sprintf('COPY of 100 mails: sent within %d s (%.2f s)', $prompt, $took // 99));
ok(GatekeeperTest::wait_for(sub { at_sink('bulk') == 100 && at_sink('copy') == 100 }, 10),
	'the relay received all 200');

#
# resume() wakes it
#
ok(worker_asleep(), 'the worker sleeps');
$node->safe_psql(
	'postgres', q{
SELECT gatekeeper.create_queue('news');
SELECT gatekeeper.pause('news');
SELECT gatekeeper.enqueue('paused@customer.example', 'Hello', 'Hello there', queue => 'news');
});
sleep(2);    # the commit woke the worker; it must leave the paused mail
is(state_of('paused'), 'scheduled', 'mail in a paused queue waits');
ok(worker_asleep(), 'the worker sleeps');
$t0 = time;
$node->safe_psql('postgres', "SELECT gatekeeper.resume('news')");
$took = sent_within('paused', $t0);
cmp_ok($took // 99, '<', $prompt,
	sprintf('after resume() the mail is sent within %d s (%.2f s)', $prompt, $took // 99));

#
# CREATE EXTENSION after DROP EXTENSION
#
# The worker's housekeeping (reaping, purging, and looking for the
# extension when it is missing) runs at most every 5 s.  Let it come due,
# wake the worker so that it runs, and drop the extension right after.
ok(worker_asleep(), 'the worker sleeps');
sleep(6);
$t0 = time;
$node->safe_psql('postgres',
	"SELECT gatekeeper.enqueue('pre\@customer.example', 'Hello', 'Hello there')");
$took = sent_within('pre', $t0);
cmp_ok($took // 99, '<', $prompt, sprintf('a mail is sent within %d s (%.2f s)', $prompt, $took // 99));
my $drop_offset = -s $node->logfile;
$node->safe_psql('postgres', 'DROP EXTENSION gatekeeper');
# let the worker look, as it would after its naptime: a reload wakes it
$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
ok(eval { $node->wait_for_log(qr/extension gatekeeper was dropped/, $drop_offset); 1 },
	'the worker notices the extension is gone');
ok(worker_asleep(), 'the worker sleeps');
$node->safe_psql('postgres', 'CREATE EXTENSION gatekeeper');
$t0 = time;
$node->safe_psql('postgres',
	"SELECT gatekeeper.enqueue('recreated\@customer.example', 'Hello', 'Hello there')");
$took = sent_within('recreated', $t0);
ok(defined $took, 'mail enqueued after CREATE EXTENSION again is sent');
# a worker that looked for the extension at its next housekeeping only,
# not when woken, would take about 4 s more
cmp_ok($took // 99, '<', 2.5, sprintf('at once (%.2f s after the commit)', $took // 99));

#
# Reaping does not wait for the naptime: a claim an external worker
# abandoned (lease 1 s, never acked) is reaped by the sleeping worker's
# housekeeping within a round (5 s), not after the one-hour naptime.
#
# enqueue and claim in one transaction, so the worker never sees the mail
# unclaimed; then pause the queue so that it does not take it once reaped
$node->safe_psql('postgres', q{SELECT gatekeeper.create_queue('external')});
is($node->safe_psql('postgres', q{
	BEGIN;
	SELECT gatekeeper.enqueue('abandoned@customer.example', 'Hi', 'Hi', queue => 'external') \\g /dev/null
	SELECT count(*) FROM gatekeeper.claim('external-sender', 1, '1 second', ARRAY['external']);
	COMMIT;
}), '1', 'an external sender claims a mail with a one-second lease');
$node->safe_psql('postgres', q{SELECT gatekeeper.pause('external')});
ok(worker_asleep(), 'the worker sleeps');
$t0 = time;
ok(GatekeeperTest::poll_until($node, 'postgres',
	q{SELECT state || ':' || coalesce(last_error, '') FROM gatekeeper.mail_status
	   WHERE recipient = 'abandoned@customer.example'},
	'scheduled:lease expired', 20),
	'the abandoned claim is reaped back to scheduled');
cmp_ok(time - $t0, '<', 8,
	sprintf('within a housekeeping round, not the naptime (%.2f s)', time - $t0));

unlike(slurp_file($node->logfile, $log_offset), qr/\b(ERROR|WARNING|FATAL|PANIC):/,
	'no errors or warnings in the log');

$node->stop;
GatekeeperTest::stop_sink($sink);

done_testing();
