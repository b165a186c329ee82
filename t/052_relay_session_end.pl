# Copyright: gatekeeper contributors
# gatekeeper-test: alone

# A relay that ends its sessions after a few messages (issue 25, item 1).
#
# Relays limit the messages of one connection (a provider's "too many
# messages for this session"); the relay answers the last message it takes
# 250 and ends the session while the worker has already pipelined the next
# transaction.  t/hostile_relay.py ends every session after 3 messages, by
# a plain close, by "421" and a close, or by a reset (SO_LINGER 0); with
# PIPELINING and CHUNKING, with PIPELINING alone (DATA: the next
# transaction is written behind the last message's final "."), and once in
# lock-step without them.  For each,
# 300 mails, with gatekeeper.retry_delay at 1 hour:
#
#  - the relay receives every mail exactly once, counted by Message-ID, and
#    every mail it took is recorded sent (a 250 the worker read too late
#    left the mail to be sent again after the backoff);
#  - every mail is sent within 60 s, far below the retry backoff: the
#    transactions the relay never answered go out again at once on the
#    next connection;
#  - no mail is charged an attempt for it (attempt 1, uncharged 0) and
#    none carries an error.
#
# And a relay that ends every session at the first MAIL FROM, before it
# answers anything: sending again at once would go round for ever, so that
# is a refused session, the relay's fault: the breaker opens and backs off
# (the relay sees a bounded number of connections), the mail goes back
# uncharged, none is sent or failed; once the relay takes mail, all of it
# goes, charged one attempt each.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $n = 300;
my $port = PostgreSQL::Test::Cluster::get_free_port();

my $node = GatekeeperTest::new_node(
	'session_end',
	smtp_url => "smtp://127.0.0.1:$port",
	conf => "gatekeeper.helo_name = 'mta.example.com'\n"
	  . "gatekeeper.smtp_connections = 4\n"
	  . "gatekeeper.retry_delay = '1h'\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gatekeeper');

foreach my $variant (
	[ 'close', 'close', 'chunking' ],
	[ '421', '421', 'chunking' ],
	[ 'reset', 'reset', 'chunking' ],
	[ 'data_close', 'close', 'pipelining' ],
	[ 'data_421', '421', 'pipelining' ],
	[ 'lockstep_close', 'close', 'none' ])
{
	my ($name, $end, $extensions) = @$variant;
	my $relay = GatekeeperTest::start_hostile_relay(
		name => "session_$name",
		port => $port,
		session_limit => 3,
		end => $end,
		extensions => $extensions);

	my $t0 = time;
	my $first = $node->safe_psql(
		'postgres', qq{
WITH m AS (
	INSERT INTO gatekeeper.mail (recipient, subject, body)
	SELECT '$name' || i || '\@customer.example', '$name ' || i, 'Hello ' || i
	  FROM generate_series(1, $n) AS i
	RETURNING id)
SELECT min(id) FROM m});
	my $mine = "id >= $first AND id < $first + $n";

	ok( GatekeeperTest::poll_until(
			$node, 'postgres',
			"SELECT count(*) FROM gatekeeper.mail_status WHERE $mine AND state = 'sent'",
			$n, 60),
		"$name: every mail is sent");
	my $took = time - $t0;
	cmp_ok($took, '<', 60,
		sprintf('%s: %d mails sent in %.1f s, with retry_delay 1 h', $name, $n, $took));
	is(GatekeeperTest::mail_states($node, $mine), "sent:$n", "$name: all $n are sent, none failed");

	my %ids = map { $_ => 0 } split /\n/,
	  $node->safe_psql('postgres', "SELECT message_id FROM gatekeeper.mail_status WHERE $mine");
	my @events = GatekeeperTest::relay_events($relay);
	foreach my $e (grep { $_->{event} eq 'message' } @events)
	{
		$ids{ $e->{message_id} }++ if defined $e->{message_id} && exists $ids{ $e->{message_id} };
	}
	my $lost = grep { $ids{$_} == 0 } keys %ids;
	my $twice = grep { $ids{$_} > 1 } keys %ids;
	my $copies = 0;
	$copies += $ids{$_} - 1 foreach grep { $ids{$_} > 1 } keys %ids;
	is($lost, 0, "$name: the relay received every mail");
	my %state = map { split /\|/ } split /\n/,
	  $node->safe_psql('postgres', "SELECT message_id, state FROM gatekeeper.mail_status WHERE $mine");
	my $again = grep { $ids{$_} > 0 && $state{$_} ne 'sent' } keys %ids;
	is($again, 0, "$name: no mail the relay took is left to be sent again");
	is($twice, 0, "$name: the relay received no mail twice ($copies second copies)");

	my $ends = grep { $_->{event} eq 'end' } @events;
	# up to one session per connection (4) ends idle, short of 3
	cmp_ok($ends, '>=', $n / 3 - 4,
		"$name: the relay ended its sessions after 3 messages ($ends times)");

	is( $node->safe_psql(
			'postgres',
			"SELECT count(*) FROM gatekeeper.mail_status WHERE $mine AND (attempt <> 1 OR uncharged <> 0 OR last_error IS NOT NULL)"
		),
		'0',
		"$name: no mail was charged an attempt or carries an error");
	my $sample = $node->safe_psql('postgres',
		"SELECT attempt || ' ' || uncharged || ' ' || coalesce(last_error, '') FROM gatekeeper.mail_status WHERE $mine AND (attempt <> 1 OR uncharged <> 0 OR last_error IS NOT NULL) LIMIT 3");
	note("$name: e.g. $sample") if $sample ne '';

	GatekeeperTest::stop_helper($relay->{pid});
}

#
# A relay that takes nothing: every session ends at the first MAIL FROM
#
{
	my $m = 20;
	my $relay = GatekeeperTest::start_hostile_relay(
		name => 'session_none',
		port => $port,
		end_at_mail => 1,
		end => 'close');
	my $first = $node->safe_psql(
		'postgres', qq{
WITH m AS (
	INSERT INTO gatekeeper.mail (recipient, subject, body)
	SELECT 'none' || i || '\@customer.example', 'none ' || i, 'Hello ' || i
	  FROM generate_series(1, $m) AS i
	RETURNING id)
SELECT min(id) FROM m});
	my $mine = "id >= $first AND id < $first + $m";
	my $t0 = time;
	ok( GatekeeperTest::poll_until(
			$node, 'postgres',
			"SELECT count(*) FROM gatekeeper.mail_status WHERE $mine AND uncharged >= 2",
			$m, 60),
		'a relay that takes nothing: every mail was handed back, uncharged, twice');
	my $took = time - $t0;
	is( $node->safe_psql('postgres',
			"SELECT count(*) FILTER (WHERE state NOT IN ('scheduled', 'claimed')) || ',' || coalesce(max(attempt - uncharged) FILTER (WHERE state = 'scheduled'), 0) FROM gatekeeper.mail_status WHERE $mine"
		),
		'0,0',
		'a relay that takes nothing: no mail sent or failed, no attempt charged');
	my ($breaker, $error) = split /\|/, $node->safe_psql('postgres',
		"SELECT relay, last_error FROM gatekeeper.worker_status");
	like($breaker, qr/^(open|half-open)$/, "a relay that takes nothing: the breaker is open ($breaker)");
	like($error, qr/closed by the relay|Connection reset|Broken pipe/,
		'a relay that takes nothing: worker_status says the relay ended the session');
	my $connects = grep { $_->{event} eq 'connect' } GatekeeperTest::relay_events($relay);
	cmp_ok($connects, '<', 100,
		sprintf('a relay that takes nothing: %d connections in %.1f s, not a loop', $connects, $took));
	GatekeeperTest::stop_helper($relay->{pid});

	my $fixed = GatekeeperTest::start_hostile_relay(name => 'session_fixed', port => $port);
	ok( GatekeeperTest::poll_until(
			$node, 'postgres',
			"SELECT count(*) FROM gatekeeper.mail_status WHERE $mine AND state = 'sent'",
			$m, 90),
		'relay fixed: every mail is sent');
	is( $node->safe_psql('postgres',
			"SELECT min(attempt - uncharged) || ',' || max(attempt - uncharged) FROM gatekeeper.mail_status WHERE $mine"
		),
		'1,1',
		'relay fixed: one charged attempt each');
	GatekeeperTest::stop_helper($fixed->{pid});
}

$node->stop;
done_testing();
