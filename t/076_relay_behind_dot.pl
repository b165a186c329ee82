# Copyright: gatekeeper contributors

# The next transaction behind a message's final "." (issue 26, delivery
# across 20 ms).
#
# A relay that offers PIPELINING and ENHANCEDSTATUSCODES but not CHUNKING
# gets each message's content, its final "." and the next transaction's
# MAIL FROM, RCPT TO and DATA in one write (RFC 2920: a message's content
# may begin a group): one round trip a mail, not two.  The reply to the
# "." decides the mail sent, so the client must never take another reply
# for it.  t/hostile_relay.py offering PIPELINING alone, one connection:
#
#  1. in order, each "." answered 0.2 s late: the next transaction's
#     commands have arrived when the relay answers the "." (they did not
#     before: the client waited for the reply); every mail arrives once;
#  2. out of order (the "."'s reply after those of the commands behind
#     it, as smtp-sink -W does), the first message refused at its ".":
#     the client sees the misorder, finds the "."'s reply among those
#     still due, and records that mail failed, with the relay's 554, not
#     sent; the next goes again, uncharged; nothing goes behind a "." to
#     that relay again; every other mail arrives once;
#  3. a relay that never answers a DATA behind a ".": after
#     gatekeeper.smtp_timeout the client stops writing behind one to it;
#     every mail arrives once;
#  4. in order, but each "." answered "250 2.1.5" (an address status, as
#     the reply to RCPT TO would be): the replies behind it show they came
#     in order, so that one was the "."'s: the mail is sent, and sent
#     once, not sent again for want of a reply.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $port = PostgreSQL::Test::Cluster::get_free_port();

my $node = GatekeeperTest::new_node(
	'behind_dot',
	smtp_url => "smtp://127.0.0.1:$port",
	conf => "gatekeeper.helo_name = 'mta.example.com'\n"
	  . "gatekeeper.smtp_connections = 1\n"
	  . "gatekeeper.smtp_timeout = '3s'\n"
	  . "gatekeeper.retry_delay = '1s'\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gatekeeper');

# enqueue(TAG, RECIPIENTS...): one INSERT, in this order; the ids' range
sub enqueue
{
	my ($tag, @rcpts) = @_;
	my $values = join ', ',
	  map { "('$rcpts[$_]\@customer.example', '$tag ' || $_, 'Hello $_')" } 0 .. $#rcpts;
	my $first = $node->safe_psql(
		'postgres', qq{
WITH m AS (
	INSERT INTO gatekeeper.mail (recipient, subject, body) VALUES $values
	RETURNING id)
SELECT min(id) FROM m});
	return "id >= $first AND id < $first + " . scalar(@rcpts);
}

# received(RELAY, MINE): Message-ID => copies the relay took, for MINE
sub received
{
	my ($relay, $mine) = @_;
	my %ids = map { $_ => 0 } split /\n/,
	  $node->safe_psql('postgres', "SELECT message_id FROM gatekeeper.mail_status WHERE $mine AND state = 'sent'");
	foreach my $e (grep { $_->{event} eq 'message' } GatekeeperTest::relay_events($relay))
	{
		$ids{ $e->{message_id} }++ if defined $e->{message_id} && exists $ids{ $e->{message_id} };
	}
	return \%ids;
}

sub once
{
	my ($ids, $n, $what) = @_;
	is(scalar(keys %$ids), $n, "$what: $n mails recorded sent");
	is(scalar(grep { $ids->{$_} != 1 } keys %$ids), 0, "$what: the relay took each of them once");
	return;
}

#
# 1. In order: the next transaction goes behind the "."
#
{
	my $n = 10;
	my $relay = GatekeeperTest::start_hostile_relay(
		name => 'in_order',
		port => $port,
		extensions => 'pipelining',
		dot_delay => 0.2);
	my $mine = enqueue('in_order', map { "inorder$_" } 1 .. $n);
	ok( GatekeeperTest::poll_until(
			$node, 'postgres',
			"SELECT count(*) FROM gatekeeper.mail_status WHERE $mine AND state = 'sent'",
			$n, 60),
		'in order: every mail is sent');
	once(received($relay, $mine), $n, 'in order');
	my @dots = grep { $_->{event} eq 'dot' } GatekeeperTest::relay_events($relay);
	my $behind = grep { $_->{ahead} > 0 } @dots;
	is(scalar(@dots), $n, "in order: the relay answered $n final dots");
	cmp_ok($behind, '>=', $n - 2,
		"in order: the next transaction had arrived before the relay answered the \".\" ($behind of $n)");
	GatekeeperTest::stop_helper($relay->{pid});
}

#
# 2. Out of order, the first message refused at its "."
#
{
	my @rcpts = ('refuse1', map { "ok$_" } 2 .. 8);
	my $log_at = -s $node->logfile;
	my $relay = GatekeeperTest::start_hostile_relay(
		name => 'reorder',
		port => $port,
		extensions => 'pipelining',
		reorder => 1,
		refuse_prefix => 'refuse');
	my $mine = enqueue('reorder', @rcpts);
	ok( GatekeeperTest::poll_until(
			$node, 'postgres',
			"SELECT count(*) FROM gatekeeper.mail_status WHERE $mine AND state IN ('sent', 'failed')",
			scalar(@rcpts), 60),
		'out of order: every mail has its outcome');
	is( $node->safe_psql(
			'postgres',
			"SELECT state || ' ' || attempt || ' ' || (last_error LIKE '%554 5.6.0 message refused%') FROM gatekeeper.mail_status WHERE $mine AND recipient LIKE 'refuse%'"
		),
		'failed 1 true',
		'out of order: the message the relay refused is failed, with its 554, not sent');
	once(received($relay, $mine), @rcpts - 1, 'out of order');
	is( $node->safe_psql('postgres',
			"SELECT count(*) FROM gatekeeper.mail_status WHERE $mine AND recipient LIKE 'ok%' AND (state <> 'sent' OR attempt - uncharged <> 1)"),
		'0',
		'out of order: every other mail is sent, charged one attempt');
	my $log = substr(slurp_file($node->logfile), $log_at);
	like($log, qr/relay 127\.0\.0\.1:$port answered out of order behind a final "\."/,
		'out of order: the worker says the relay answers out of order');
	my $connects = grep { $_->{event} eq 'connect' } GatekeeperTest::relay_events($relay);
	is($connects, 2, 'out of order: one connection given up, one more made');
	GatekeeperTest::stop_helper($relay->{pid});
}

# the relay's misorder is remembered for the worker's life
$node->restart;

#
# 3. A DATA behind a "." never answered
#
{
	my $n = 6;
	my $log_at = -s $node->logfile;
	my $relay = GatekeeperTest::start_hostile_relay(
		name => 'held',
		port => $port,
		extensions => 'pipelining',
		hold_data_behind => 1);
	my $mine = enqueue('held', map { "held$_" } 1 .. $n);
	ok( GatekeeperTest::poll_until(
			$node, 'postgres',
			"SELECT count(*) FROM gatekeeper.mail_status WHERE $mine AND state = 'sent'",
			$n, 60),
		'DATA unanswered: every mail is sent');
	once(received($relay, $mine), $n, 'DATA unanswered');
	my $held = grep { $_->{event} eq 'held' } GatekeeperTest::relay_events($relay);
	is($held, 1, 'DATA unanswered: the client wrote behind a "." once, and not again');
	my $log = substr(slurp_file($node->logfile), $log_at);
	like($log, qr/relay 127\.0\.0\.1:$port did not answer commands pipelined behind a final "\."/,
		'DATA unanswered: the worker says so');
	GatekeeperTest::stop_helper($relay->{pid});
}

$node->restart;

#
# 4. In order, the "." answered with an address status
#
{
	my $n = 6;
	my $log_at = -s $node->logfile;
	my $relay = GatekeeperTest::start_hostile_relay(
		name => 'odd_status',
		port => $port,
		extensions => 'pipelining',
		dot_status => '2.1.5');
	my $mine = enqueue('odd', map { "odd$_" } 1 .. $n);
	ok( GatekeeperTest::poll_until(
			$node, 'postgres',
			"SELECT count(*) FROM gatekeeper.mail_status WHERE $mine AND state = 'sent'",
			$n, 60),
		'"." answered 2.1.5: every mail is sent');
	once(received($relay, $mine), $n, '"." answered 2.1.5');
	my $messages = grep { $_->{event} eq 'message' } GatekeeperTest::relay_events($relay);
	is($messages, $n, '"." answered 2.1.5: the relay took no mail twice');
	is( $node->safe_psql('postgres',
			"SELECT count(*) FROM gatekeeper.mail_status WHERE $mine AND attempt - uncharged <> 1"),
		'0', '"." answered 2.1.5: one charged attempt each');
	my $log = substr(slurp_file($node->logfile), $log_at);
	like($log, qr/relay 127\.0\.0\.1:$port answered a final "\." as if it were MAIL FROM or RCPT TO/,
		'"." answered 2.1.5: the worker says so');
	GatekeeperTest::stop_helper($relay->{pid});
}

$node->stop;
done_testing();
