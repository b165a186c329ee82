# Copyright: gatekeeper contributors

# What the background worker does with each answer of a real SMTP relay
# (Postfix's smtp-sink on loopback, restarted with different behaviour on
# the same port between phases):
#
#  1. 4xx to RCPT TO: the mail is retried with backoff and, once the relay
#     accepts, sent on its second charged attempt; the relay holds it once.
#  2. 5xx to RCPT TO: the mail fails at once with the relay's reply in
#     last_error, and the smart-sending pass it took is released, so the
#     next mail to that recipient goes; a sent mail keeps its pass.
#  3. Relay down: due mail stays scheduled, handed back uncharged
#     (attempt - uncharged = 0), the worker backs off and says so once;
#     when the relay is back every mail is delivered exactly once.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $port = PostgreSQL::Test::Cluster::get_free_port();

# the retry backoff base: the first retry waits between half of it and
# all of it, long enough for the test to swap relays in between
my $retry_delay = 3;

my $sink = GatekeeperTest::start_sink(
	port => $port,
	name => 'soft',
	args => [ '-r', 'RCPT' ]);
my $node = GatekeeperTest::new_node(
	'outcomes',
	sink => $sink,
	conf => "gatekeeper.retry_delay = '${retry_delay}s'\n");
$node->start;
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION gatekeeper;
SELECT gatekeeper.create_queue('promo', gates => '{smart_sending}');
});

is($node->safe_psql('postgres', 'SHOW gatekeeper.retry_delay'),
	"${retry_delay}s", 'gatekeeper.retry_delay is set');

# state, attempt, uncharged, message_id and last_error of mail $id
sub mail_row
{
	my ($id) = @_;
	my $row = $node->safe_psql('postgres',
		"SELECT state, attempt, uncharged, message_id, coalesce(last_error, '') FROM gatekeeper.mail WHERE id = $id"
	);
	my %r;
	@r{qw(state attempt uncharged message_id last_error)} = split /\|/, $row, 5;
	return \%r;
}

sub enqueue
{
	my ($recipient, $queue) = @_;
	$queue //= 'default';
	return $node->safe_psql('postgres',
		"SELECT gatekeeper.enqueue('$recipient', 'Hello', 'Hello there', queue => '$queue')");
}

sub copies_at
{
	my ($s, $message_id) = @_;
	return scalar(grep { ($_->{message_id} // '') eq $message_id }
		  GatekeeperTest::sink_messages($s));
}

#
# 1. 4xx, then success
#
my $soft_id = enqueue('soft@customer.example');
my $t0 = time;
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT state = 'scheduled' AND attempt = 1 AND last_error IS NOT NULL FROM gatekeeper.mail WHERE id = $soft_id",
		't', 30),
	'4xx: the mail is back to scheduled after its first attempt');
my $soft = mail_row($soft_id);
like($soft->{last_error}, qr/\b450\b/, "4xx: last_error has the relay's reply")
  or diag("last_error: $soft->{last_error}");
is($soft->{uncharged}, 0, '4xx: the attempt is charged');
my $backoff = $node->safe_psql('postgres',
	"SELECT extract(epoch FROM send_at - now()) FROM gatekeeper.mail WHERE id = $soft_id");
cmp_ok($backoff, '>', $retry_delay / 2 - 0.5,
	"4xx: the retry waits about half gatekeeper.retry_delay or more ($backoff s)");
cmp_ok($backoff, '<=', $retry_delay,
	"4xx: the first backoff is at most gatekeeper.retry_delay");
is(GatekeeperTest::sink_count($sink), 0, '4xx: the relay holds no message');

GatekeeperTest::stop_sink($sink);
my $ok_sink = GatekeeperTest::start_sink(port => $port, name => 'ok');

ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT state FROM gatekeeper.mail WHERE id = $soft_id",
		'sent', $retry_delay + 30),
	'4xx: the mail is sent once the relay accepts it');
$soft = mail_row($soft_id);
cmp_ok($soft->{attempt}, '>=', 2, "4xx: sent on a later attempt ($soft->{attempt})");
is($soft->{attempt} - $soft->{uncharged}, 2, '4xx: two charged attempts: the 4xx and the success');
ok( GatekeeperTest::wait_for(sub { copies_at($ok_sink, $soft->{message_id}) >= 1 }, 10),
	'4xx: the relay received it');
is(copies_at($ok_sink, $soft->{message_id}), 1, '4xx: the relay received it exactly once');

#
# 2. 5xx: failed, and the gate pass released
#
GatekeeperTest::stop_sink($ok_sink);
my $hard_sink = GatekeeperTest::start_sink(
	port => $port,
	name => 'hard',
	args => [ '-f', 'RCPT' ]);

my $vip = 'vip@customer.example';
is($node->safe_psql('postgres', "SELECT gatekeeper.gate_open('smart_sending', '$vip')"),
	't', '5xx: the gate is open before the first mail');
my $hard_id = enqueue($vip, 'promo');
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT state FROM gatekeeper.mail WHERE id = $hard_id",
		'failed', 30),
	'5xx: the mail failed');
my $hard = mail_row($hard_id);
like($hard->{last_error}, qr/\b500\b.*Error: command failed/,
	"5xx: last_error has the relay's reply")
  or diag("last_error: $hard->{last_error}");
is($hard->{attempt}, 1, '5xx: no retry');
is($node->safe_psql('postgres', "SELECT gatekeeper.gate_open('smart_sending', '$vip')"),
	't', '5xx: the failed mail released its smart-sending pass');
is(GatekeeperTest::sink_count($hard_sink), 0, '5xx: the relay holds no message');

GatekeeperTest::stop_sink($hard_sink);
my $ok2_sink = GatekeeperTest::start_sink(port => $port, name => 'ok2');

my $again_id = enqueue($vip, 'promo');
my $control_id = enqueue('control@customer.example', 'promo');
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT string_agg(state::text, ',' ORDER BY id) FROM gatekeeper.mail WHERE id IN ($again_id, $control_id)",
		'sent,sent', 30),
	'5xx: the next mail to the recipient is sent');
my $again = mail_row($again_id);
ok(GatekeeperTest::wait_for(sub { copies_at($ok2_sink, $again->{message_id}) >= 1 }, 10),
	'5xx: the relay received the next mail');
is(copies_at($ok2_sink, $again->{message_id}), 1, '5xx: exactly once');

# control: a sent mail keeps its pass, so the gate holds the next one
is( $node->safe_psql('postgres',
		"SELECT gatekeeper.gate_open('smart_sending', 'control\@customer.example')"),
	'f', 'control: a sent mail keeps its pass');
my $held_id = enqueue('control@customer.example', 'promo');
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT state FROM gatekeeper.mail WHERE id = $held_id",
		'suppressed', 30),
	'control: the next mail to that recipient is suppressed');

#
# 3. Relay down, then up
#
GatekeeperTest::stop_sink($ok2_sink);
ok(!GatekeeperTest::sink_accepts($port), 'relay down: nothing listens');

my $log_offset = -s $node->logfile;
my $first_id = $node->safe_psql(
	'postgres', q{
WITH m AS (
	INSERT INTO gatekeeper.mail (recipient, subject, body)
	SELECT 'down' || i || '@customer.example', 'Mail ' || i, 'Body ' || i
	  FROM generate_series(1, 50) AS i
	RETURNING id)
SELECT min(id) FROM m});
my $down = "id >= $first_id";

ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT count(*) FROM gatekeeper.mail WHERE $down AND state = 'scheduled' AND uncharged >= 2",
		'50', 30),
	'relay down: every mail was tried and handed back, twice');
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FILTER (WHERE state NOT IN ('scheduled', 'claimed')) || ',' || max(attempt - uncharged) FROM gatekeeper.mail WHERE $down"
	),
	'0,0',
	'relay down: no mail failed and no attempt was charged');
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FROM gatekeeper.mail WHERE $down AND coalesce(last_error, '') = ''"),
	'0',
	'relay down: last_error says why');

my $log = slurp_file($node->logfile, $log_offset);
my $said = () = $log =~ /could not reach the SMTP relay/g;
is($said, 1, 'relay down: the worker says so once') or diag($log);
unlike($log, qr/\b(ERROR|FATAL|PANIC):/, 'relay down: no errors in the log');

my $back_sink = GatekeeperTest::start_sink(port => $port, name => 'back');
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT count(*) FROM gatekeeper.mail WHERE $down AND state = 'sent'",
		'50', 60),
	'relay back: every mail is sent');
ok(GatekeeperTest::wait_for(sub { GatekeeperTest::sink_count($back_sink) >= 50 }, 10),
	'relay back: the relay has 50 messages');

my %expected = map { $_ => 1 } split /\n/,
  $node->safe_psql('postgres', "SELECT message_id FROM gatekeeper.mail WHERE $down");
my @got = GatekeeperTest::sink_messages($back_sink);
my %got;
$got{ $_->{message_id} // '' }++ foreach @got;
is(scalar(@got), 50, 'relay back: 50 messages received');
is(scalar(keys %got), 50, 'relay back: 50 distinct Message-IDs');
is_deeply([ sort keys %got ], [ sort keys %expected ],
	'relay back: the Message-IDs are those of the 50 mails');
is( $node->safe_psql(
		'postgres',
		"SELECT max(attempt - uncharged) || ',' || min(attempt - uncharged) FROM gatekeeper.mail WHERE $down"
	),
	'1,1',
	'relay back: one charged attempt each');
like(slurp_file($node->logfile, $log_offset), qr/reaches the SMTP relay again/,
	'relay back: the worker says so');

$node->stop;
GatekeeperTest::stop_sink($back_sink);

done_testing();
