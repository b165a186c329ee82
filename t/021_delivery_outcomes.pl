# Copyright: gatekeeper contributors
# gatekeeper-test: alone

# What the background worker does with each answer of a real SMTP relay
# (Postfix's smtp-sink on loopback, restarted with different behaviour on
# the same port between phases):
#
#  1. 4xx to RCPT TO: the mail is retried with backoff and, once the relay
#     accepts, sent on its second charged attempt; the relay holds it once.
#     In a queue allowing one attempt, a 4xx fails the mail and releases
#     its smart-sending pass.
#  2. 5xx to RCPT TO: the mail fails at once with the relay's reply in
#     last_error, and the smart-sending pass it took is released, so the
#     next mail to that recipient goes; a sent mail keeps its pass.
#  3. Relay down: due mail stays scheduled, handed back uncharged
#     (attempt - uncharged = 0), the worker backs off and says so once;
#     when the relay is back every mail is delivered exactly once.
#  4. Relay refusing the login: the same as down; delivered once the relay
#     takes the login again.
#  5. Relay too slow (no answer to DATA within gatekeeper.smtp_timeout):
#     retried like a 4xx, and sent once when the relay answers in time.
#
# The worker has relay credentials throughout (gatekeeper.smtp_user and
# the password in gatekeeper.smtp_password_file): no error recorded or
# logged may show the password.

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

# credentials; the sinks offer no AUTH (-a), so libcurl sends none,
# except in phase 4
my $secret = 'Pw-9c41e7';
my $url = "smtp://127.0.0.1:$port";
my $pwfile = "$PostgreSQL::Test::Utils::tmp_check/outcomes_password";
open(my $pwfh, '>', $pwfile) or die "$pwfile: $!";
print $pwfh "$secret\n";
close($pwfh);
chmod(0600, $pwfile) or die "chmod $pwfile: $!";

my $sink = GatekeeperTest::start_sink(
	port => $port,
	name => 'soft',
	args => [ '-a', '-r', 'RCPT' ]);
my $node = GatekeeperTest::new_node(
	'outcomes',
	smtp_url => $url,
	conf => "gatekeeper.retry_delay = '${retry_delay}s'\n"
	  . "gatekeeper.smtp_timeout = '2s'\n"
	  . "gatekeeper.smtp_user = 'mailer'\n"
	  . "gatekeeper.smtp_password_file = '$pwfile'\n");
$node->start;
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION gatekeeper;
SELECT gatekeeper.create_queue('promo', gates => '{smart_sending}');
SELECT gatekeeper.create_queue('promo_once', gates => '{smart_sending}', max_attempts => 1, retry_for => '0');
});

is($node->safe_psql('postgres', 'SHOW gatekeeper.retry_delay'),
	"${retry_delay}s", 'gatekeeper.retry_delay is set');

# state, attempt, uncharged, message_id and last_error of mail $id
sub mail_row
{
	my ($id) = @_;
	my $row = $node->safe_psql('postgres',
		"SELECT state, attempt, uncharged, message_id, coalesce(last_error, '') FROM gatekeeper.mail_status WHERE id = $id"
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
my $once_id = enqueue('once@customer.example', 'promo_once');
my $t0 = time;
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT state = 'scheduled' AND attempt = 1 AND last_error IS NOT NULL FROM gatekeeper.mail_status WHERE id = $soft_id",
		't', 30),
	'4xx: the mail is back to scheduled after its first attempt');
my $soft = mail_row($soft_id);
like($soft->{last_error}, qr/\b450\b/, "4xx: last_error has the relay's reply")
  or diag("last_error: $soft->{last_error}");
is($soft->{uncharged}, 0, '4xx: the attempt is charged');
# the backoff from the nack that deferred it (its deferred event), not
# from whenever this test gets to look
my $backoff = $node->safe_psql('postgres',
	"SELECT extract(epoch FROM m.send_at - e.at) FROM gatekeeper.mail_status m, gatekeeper.event_log e "
	  . "WHERE m.id = $soft_id AND e.mail_id = m.id AND e.event = 'deferred' ORDER BY e.at LIMIT 1");
cmp_ok($backoff, '>', $retry_delay / 2 - 0.5,
	"4xx: the retry waits about half gatekeeper.retry_delay or more ($backoff s)");
cmp_ok($backoff, '<=', $retry_delay,
	"4xx: the first backoff is at most gatekeeper.retry_delay");
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT state FROM gatekeeper.mail_status WHERE id = $once_id",
		'failed', 30),
	'4xx, attempts spent: the mail failed');
my $once = mail_row($once_id);
like($once->{last_error}, qr/\b450\b/, "4xx, attempts spent: last_error has the relay's reply");
is( $node->safe_psql('postgres',
		"SELECT gatekeeper.gate_open('smart_sending', 'once\@customer.example')"),
	't', '4xx, attempts spent: the smart-sending pass is released');
is(GatekeeperTest::sink_count($sink), 0, '4xx: the relay holds no message');

GatekeeperTest::stop_sink($sink);
my $ok_sink = GatekeeperTest::start_sink(port => $port, name => 'ok', args => ['-a']);

ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT state FROM gatekeeper.mail_status WHERE id = $soft_id",
		'sent', $retry_delay + 30),
	'4xx: the mail is sent once the relay accepts it');
$soft = mail_row($soft_id);
cmp_ok($soft->{attempt}, '>=', 2, "4xx: sent on a later attempt ($soft->{attempt})");
# each 4xx charged an attempt (one at least; more when the machine is slow
# to bring the accepting relay up), and the success one more
my $deferrals = $node->safe_psql('postgres',
	"SELECT count(*) FROM gatekeeper.event_log WHERE mail_id = $soft_id AND event = 'deferred'");
cmp_ok($deferrals, '>=', 1, "4xx: deferred ($deferrals times) before it went");
is($soft->{attempt} - $soft->{uncharged}, $deferrals + 1, '4xx: charged attempts: each 4xx and the success');
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
	args => [ '-a', '-f', 'RCPT' ]);

my $vip = 'vip@customer.example';
is($node->safe_psql('postgres', "SELECT gatekeeper.gate_open('smart_sending', '$vip')"),
	't', '5xx: the gate is open before the first mail');
my $hard_id = enqueue($vip, 'promo');
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT state FROM gatekeeper.mail_status WHERE id = $hard_id",
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
my $ok2_sink = GatekeeperTest::start_sink(port => $port, name => 'ok2', args => ['-a']);

my $again_id = enqueue($vip, 'promo');
my $control_id = enqueue('control@customer.example', 'promo');
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT string_agg(state::text, ',' ORDER BY id) FROM gatekeeper.mail_status WHERE id IN ($again_id, $control_id)",
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
		"SELECT state FROM gatekeeper.mail_status WHERE id = $held_id",
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
		"SELECT count(*) FROM gatekeeper.mail_status WHERE $down AND state = 'scheduled' AND uncharged >= 2",
		'50', 30),
	'relay down: every mail was tried and handed back, twice');
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FILTER (WHERE state NOT IN ('scheduled', 'claimed')) || ',' || max(attempt - uncharged) FROM gatekeeper.mail_status WHERE $down"
	),
	'0,0',
	'relay down: no mail failed and no attempt was charged');
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FROM gatekeeper.mail_status WHERE $down AND coalesce(last_error, '') = ''"),
	'0',
	'relay down: last_error says why');

my $log = slurp_file($node->logfile, $log_offset);
my $said = () = $log =~ /could not reach the SMTP relay/g;
is($said, 1, 'relay down: the worker says so once') or diag($log);
unlike($log, qr/\b(ERROR|FATAL|PANIC):/, 'relay down: no errors in the log');

my $back_sink = GatekeeperTest::start_sink(port => $port, name => 'back', args => ['-a']);
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT count(*) FROM gatekeeper.mail_status WHERE $down AND state = 'sent'",
		'50', 60),
	'relay back: every mail is sent');
ok(GatekeeperTest::wait_for(sub { GatekeeperTest::sink_count($back_sink) >= 50 }, 10),
	'relay back: the relay has 50 messages');

my %expected = map { $_ => 1 } split /\n/,
  $node->safe_psql('postgres', "SELECT message_id FROM gatekeeper.mail_status WHERE $down");
my @got = GatekeeperTest::sink_messages($back_sink);
my %got;
$got{ $_->{message_id} // '' }++ foreach @got;
is(scalar(@got), 50, 'relay back: 50 messages received');
is(scalar(keys %got), 50, 'relay back: 50 distinct Message-IDs');
is_deeply([ sort keys %got ], [ sort keys %expected ],
	'relay back: the Message-IDs are those of the 50 mails');
is( $node->safe_psql(
		'postgres',
		"SELECT max(attempt - uncharged) || ',' || min(attempt - uncharged) FROM gatekeeper.mail_status WHERE $down"
	),
	'1,1',
	'relay back: one charged attempt each');
like(slurp_file($node->logfile, $log_offset), qr/reaches the SMTP relay again/,
	'relay back: the worker says so');

#
# 4. The relay refuses the login
#
GatekeeperTest::stop_sink($back_sink);
# AUTH offered, and refused with 5xx
my $noauth_sink = GatekeeperTest::start_sink(
	port => $port,
	name => 'noauth',
	args => [ '-f', 'AUTH' ]);
$log_offset = -s $node->logfile;
$first_id = $node->safe_psql(
	'postgres', q{
WITH m AS (
	INSERT INTO gatekeeper.mail (recipient, subject, body)
	SELECT 'login' || i || '@customer.example', 'Mail ' || i, 'Body ' || i
	  FROM generate_series(1, 5) AS i
	RETURNING id)
SELECT min(id) FROM m});
my $login = "id >= $first_id";
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT count(*) FROM gatekeeper.mail_status WHERE $login AND state = 'scheduled' AND uncharged >= 1",
		'5', 30),
	'login refused: every mail was tried and handed back');
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FILTER (WHERE state NOT IN ('scheduled', 'claimed')) || ',' || max(attempt - uncharged) FROM gatekeeper.mail_status WHERE $login"
	),
	'0,0',
	'login refused: no mail failed and no attempt was charged');
is(GatekeeperTest::sink_count($noauth_sink), 0, 'login refused: the relay holds no message');
like(slurp_file($node->logfile, $log_offset), qr/could not reach the SMTP relay/,
	'login refused: the worker says so');

GatekeeperTest::stop_sink($noauth_sink);
my $auth_sink = GatekeeperTest::start_sink(port => $port, name => 'auth', args => ['-a']);
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT count(*) FROM gatekeeper.mail_status WHERE $login AND state = 'sent'",
		'5', 60),
	'login taken: every mail is sent');
ok(GatekeeperTest::wait_for(sub { GatekeeperTest::sink_count($auth_sink) >= 5 }, 10),
	'login taken: the relay received them');
is(GatekeeperTest::sink_count($auth_sink), 5, 'login taken: once each');

#
# 5. A relay slower than gatekeeper.smtp_timeout
#
GatekeeperTest::stop_sink($auth_sink);
# answers DATA after 5 s, when the worker has given up
my $slow_sink = GatekeeperTest::start_sink(
	port => $port,
	name => 'slow',
	args => [ '-a', '-w', '5' ]);
my $slow_id = enqueue('slow@customer.example');
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT state = 'scheduled' AND attempt = 1 AND last_error IS NOT NULL FROM gatekeeper.mail_status WHERE id = $slow_id",
		't', 30),
	'timeout: the mail is back to scheduled after its first attempt');
my $slow = mail_row($slow_id);
like($slow->{last_error}, qr/tim(e|ed) ?out/i, 'timeout: last_error says so')
  or diag("last_error: $slow->{last_error}");
is($slow->{uncharged}, 0, 'timeout: the attempt is charged');

GatekeeperTest::stop_sink($slow_sink);
my $fast_sink = GatekeeperTest::start_sink(port => $port, name => 'fast', args => ['-a']);
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT state FROM gatekeeper.mail_status WHERE id = $slow_id",
		'sent', $retry_delay + 30),
	'timeout: the mail is sent once the relay is fast again');
$slow = mail_row($slow_id);
is($slow->{attempt} - $slow->{uncharged}, 2, 'timeout: two charged attempts');
ok(GatekeeperTest::wait_for(sub { copies_at($fast_sink, $slow->{message_id}) >= 1 }, 10),
	'timeout: the relay received it');
is(copies_at($fast_sink, $slow->{message_id}) + GatekeeperTest::sink_count($slow_sink),
	1, 'timeout: exactly once');

#
# The password, in whatever was recorded or logged
#
my @errors = grep { $_ ne '' } split /\n/,
  $node->safe_psql('postgres', 'SELECT DISTINCT last_error FROM gatekeeper.mail_status WHERE last_error IS NOT NULL');
cmp_ok(scalar(@errors), '>=', 3, 'errors were recorded: ' . join(' / ', @errors));
is(scalar(grep { /\Q$secret\E/ } @errors), 0, 'no last_error shows the password');
unlike(slurp_file($node->logfile), qr/\Q$secret\E/, 'the log does not show the password');

$node->stop;
GatekeeperTest::stop_sink($fast_sink);

done_testing();
