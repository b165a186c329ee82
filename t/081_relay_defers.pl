# Copyright: gatekeeper contributors
# gatekeeper-test: alone

# A relay that defers everything (issue 45, items 1, 3 and 4; SPEC
# "Delivery by the background worker": 4xx replies to every transaction of
# a relay for several transactions in a row are the relay's fault):
#
#  1. Two relays, the first answering every MAIL FROM "451 4.3.0" (a
#     smarthost out of disk): its breaker opens as "throttled", every mail
#     goes through the second relay at once, once (counted by Message-ID),
#     none fails and none is charged more than the attempt that delivered
#     it; worker_status has the first relay's last reply, and the log one
#     line when it was given up.
#  2. One relay, throttling ("454 4.7.0 Throttling failure", SES's words)
#     for longer than the old attempt budget (5 attempts from a 500 ms
#     retry_delay: at most 7.5 s): no mail fails or is charged, the worker
#     says "throttled"; the relay recovers and every mail goes, once, with
#     a log line that the relay takes mail again.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = GatekeeperTest::new_node(
	'relay_defers',
	smtp_url => '',
	conf => "gatekeeper.smtp_connections = 2\n"
	  . "gatekeeper.retry_delay = '500ms'\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gatekeeper');

# Enqueue n mails; returns the condition that selects them
sub enqueue
{
	my ($tag, $n) = @_;
	my $first = $node->safe_psql(
		'postgres', qq{
WITH m AS (
	INSERT INTO gatekeeper.mail (recipient, subject, body)
	SELECT '$tag' || i || '\@customer.example', '$tag ' || i, 'Body ' || i
	  FROM generate_series(1, $n) AS i
	RETURNING id)
SELECT min(id) FROM m});
	return "id >= $first AND id < $first + $n";
}

# "<sent>,<failed>,<most attempts charged>" of the mail selected by $range
sub tally
{
	my ($range) = @_;
	return $node->safe_psql('postgres',
		"SELECT count(*) FILTER (WHERE state = 'sent') || ',' || count(*) FILTER (WHERE state = 'failed') || ','"
		  . " || coalesce(max(attempt - uncharged), 0) FROM gatekeeper.mail_status WHERE $range");
}

sub message_ids
{
	my ($range) = @_;
	return split /\n/, $node->safe_psql('postgres',
		"SELECT message_id FROM gatekeeper.mail_status WHERE $range ORDER BY id");
}

#
# 1. Two relays, the first deferring everything
#
my $deferring = GatekeeperTest::start_hostile_relay(
	name => 'deferring',
	defer => '451 4.3.0 Temporary local problem: out of disk');
my $sink = GatekeeperTest::start_sink(name => 'second');
my $log_at = -s $node->logfile;
$node->safe_psql('postgres',
	"ALTER SYSTEM SET gatekeeper.smtp_url = '$deferring->{url}, $sink->{url}'");
$node->reload;

my $n1 = 200;
my $range1 = enqueue('two', $n1);
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT count(*) FROM gatekeeper.mail_status WHERE $range1 AND state IN ('sent', 'failed')",
		$n1, 120),
	'two relays: every mail is finished');
is(tally($range1), "$n1,0,1",
	'two relays: all sent, none failed, none charged more than the attempt that delivered it');
{
	my %seen;
	$seen{ $_->{message_id} // '' }++ foreach GatekeeperTest::sink_messages($sink);
	my @ids = message_ids($range1);
	is(scalar(grep { ($seen{$_} // 0) == 1 } @ids), $n1, 'two relays: the second relay has every mail, once');
	is(scalar(grep { $_->{event} eq 'message' } GatekeeperTest::relay_events($deferring)),
		0, 'two relays: the deferring relay took nothing');
	cmp_ok(scalar(grep { $_->{event} eq 'deferred' } GatekeeperTest::relay_events($deferring)),
		'>=', 3, 'two relays: the deferring relay was tried');
}
like( $node->safe_psql('postgres',
		"SELECT last_reply FROM gatekeeper.worker_status WHERE relay_url = '$deferring->{url}'"),
	qr/^relay 127\.0\.0\.1:\d+ refused MAIL FROM: 451 4\.3\.0 Temporary local problem: out of disk$/,
	'worker_status: the deferring relay\'s last reply');
is( $node->safe_psql('postgres',
		"SELECT last_reply_at IS NOT NULL AND last_reply_at > now() - interval '5 minutes' FROM gatekeeper.worker_status WHERE relay_url = '$deferring->{url}'"),
	't', 'worker_status: and when');
is( $node->safe_psql('postgres',
		"SELECT last_reply IS NULL FROM gatekeeper.worker_status WHERE relay_url = '$sink->{url}'"),
	't', 'worker_status: the second relay has no 4xx or 5xx');
{
	my $log = slurp_file($node->logfile, $log_at);
	my @lines = $log =~ /(gatekeeper worker stops sending: the SMTP relay defers every transaction: [^\n]*)/g;
	cmp_ok(scalar(@lines), '>=', 1, 'log: the relay that defers everything is given up, saying why')
	  and like($lines[0], qr/451 4\.3\.0 Temporary local problem: out of disk \(3 transactions in a row\)/,
		'log: with its reply');
}

GatekeeperTest::stop_helper($deferring->{pid});
GatekeeperTest::stop_sink($sink);

#
# 2. One relay, throttling for longer than the old attempt budget
#
my $defer_file = "$PostgreSQL::Test::Utils::tmp_check/throttling";
PostgreSQL::Test::Utils::append_to_file($defer_file, "on\n");
my $throttled = GatekeeperTest::start_hostile_relay(
	name => 'throttled',
	defer => '454 4.7.0 Throttling failure: Maximum sending rate exceeded.',
	defer_file => $defer_file);
$node->safe_psql('postgres', "ALTER SYSTEM SET gatekeeper.smtp_url = '$throttled->{url}'");
$node->reload;

my $n2 = 50;
my $range2 = enqueue('throttled', $n2);
ok( GatekeeperTest::poll_until(
		$node, 'postgres', 'SELECT DISTINCT state FROM gatekeeper.worker_status', 'throttled', 60),
	'one relay: the worker says it is throttled');
# longer than five attempts from a 500 ms retry_delay would take (at most
# 0.5 + 1 + 2 + 4 s of backoff)
sleep 12;
is($node->safe_psql('postgres',
		"SELECT count(*) FILTER (WHERE state = 'failed') || ',' || coalesce(max(attempt - uncharged), 0) FROM gatekeeper.mail_status WHERE $range2"),
	'0,0', 'one relay throttling for 12 s: no mail failed, none charged an attempt');
cmp_ok(scalar(grep { $_->{event} eq 'deferred' } GatekeeperTest::relay_events($throttled)),
	'>=', 6, 'one relay: the worker kept trying the relay');
like( $node->safe_psql('postgres', 'SELECT relay || \' \' || last_reply FROM gatekeeper.worker_status'),
	qr/^(throttled|half-open) relay 127\.0\.0\.1:\d+ refused MAIL FROM: 454 4\.7\.0 Throttling failure/,
	'worker_status: the relay\'s breaker and last reply');

$log_at = -s $node->logfile;
unlink $defer_file or die "unlink $defer_file: $!";
my $recovered_at = time;
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT count(*) FROM gatekeeper.mail_status WHERE $range2 AND state = 'sent'", $n2, 90),
	'one relay recovers: every mail is sent');
note(sprintf('one relay: every mail sent %d s after the relay recovered', time - $recovered_at));
is(tally($range2), "$n2,0,1", 'one relay recovers: none failed, one attempt charged each');
{
	my %seen;
	$seen{ $_->{message_id} // '' }++
	  foreach grep { $_->{event} eq 'message' } GatekeeperTest::relay_events($throttled);
	my @ids = message_ids($range2);
	is(scalar(grep { ($seen{$_} // 0) == 1 } @ids), $n2, 'one relay recovers: the relay has every mail, once');
}
like(slurp_file($node->logfile, $log_at), qr/gatekeeper worker sends again: the SMTP relay takes mail again/,
	'log: the relay taking mail again is said once');
ok( GatekeeperTest::poll_until(
		$node, 'postgres', 'SELECT relay FROM gatekeeper.worker_status', 'closed', 30),
	'worker_status: the breaker is closed again');

GatekeeperTest::stop_helper($throttled->{pid});
$node->stop;
done_testing();
