# Copyright: gatekeeper contributors

# Several relays (issue 29, item 4; SPEC "Settings", gatekeeper.smtp_url):
#
#  1. gatekeeper.smtp_url takes a comma-separated list, set by ALTER
#     SYSTEM; a list with one unusable element is refused as a whole, the
#     error naming that element.
#  2. Two relays, the first refusing every session (nothing listens on its
#     port): every mail goes through the second, none fails, none is
#     charged more than the one attempt that delivered it, each arrives
#     once (counted by Message-ID); worker_status shows a row per relay,
#     the first one's breaker open.
#  3. The first relay comes back: both carry mail again (each sink gets
#     some of the next batch), still no Message-ID twice across both, and
#     both breakers are closed.
#  4. The first relay ends every session with 421 at its first MAIL FROM,
#     after the client pipelined the whole transaction: the mail goes to
#     the second relay, once, uncharged by the first.
#  5. Both relays down: the mail is handed back uncharged, the worker backs
#     off; the second relay back: every mail goes, once.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $port_a = PostgreSQL::Test::Cluster::get_free_port();
my $port_b = PostgreSQL::Test::Cluster::get_free_port();
my $url_a = "smtp://127.0.0.1:$port_a";
my $url_b = "smtp://127.0.0.1:$port_b";

# one connection per relay, so that one relay's room runs out and the
# next relay in the list takes the rest
my $node = GatekeeperTest::new_node(
	'two_relays',
	smtp_url => '',
	conf => "gatekeeper.smtp_connections = 1\n"
	  . "gatekeeper.retry_delay = '1s'\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gatekeeper');

#
# 1. The check hook
#
my ($ret, $stdout, $stderr) = $node->psql('postgres',
	"ALTER SYSTEM SET gatekeeper.smtp_url = 'smtp://127.0.0.1:2525,http://x'");
isnt($ret, 0, 'a list with an unusable element is refused');
like($stderr, qr/"http:\/\/x"/, 'the error names the unusable element');
like($stderr, qr/must begin with smtp:\/\/ or smtps:\/\//, 'the error says what is wrong with it');
($ret, $stdout, $stderr) = $node->psql('postgres',
	"ALTER SYSTEM SET gatekeeper.smtp_url = 'smtp://127.0.0.1:2525,,smtp://127.0.0.1:2526'");
isnt($ret, 0, 'a list with an empty element is refused');

($ret, $stdout, $stderr) = $node->psql('postgres',
	"ALTER SYSTEM SET gatekeeper.smtp_url = '$url_a, $url_b'");
is($ret, 0, 'a list of two usable relays is accepted') or diag($stderr);
$node->reload;

my $sink_b = GatekeeperTest::start_sink(port => $port_b, name => 'relay_b');
my $sink_a;

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

# Message-ID => how many times, over the sinks given
sub received
{
	my %seen;
	foreach my $sink (grep { defined } @_)
	{
		$seen{ $_->{message_id} // '' }++ foreach GatekeeperTest::sink_messages($sink);
	}
	return \%seen;
}

# Wait until every mail selected by $range is sent
sub all_sent
{
	my ($range, $n, $what) = @_;
	ok( GatekeeperTest::poll_until(
			$node, 'postgres',
			"SELECT count(*) FROM gatekeeper.mail_status WHERE $range AND state = 'sent'",
			$n, 90),
		"$what: every mail is sent");
	return;
}

# "<mails not sent>,<most attempts charged>" of the mail selected by $range
sub tally
{
	my ($range) = @_;
	return $node->safe_psql('postgres',
		"SELECT count(*) FILTER (WHERE state <> 'sent') || ',' || max(attempt - uncharged) FROM gatekeeper.mail_status WHERE $range"
	);
}

# the Message-IDs of the mail selected by $range
sub message_ids
{
	my ($range) = @_;
	return split /\n/, $node->safe_psql('postgres',
		"SELECT message_id FROM gatekeeper.mail_status WHERE $range ORDER BY id");
}

#
# 2. The first relay refuses every session
#
my $n1 = 40;
my $range1 = enqueue('first', $n1);
all_sent($range1, $n1, 'first relay down');
is(tally($range1), '0,1', 'first relay down: none failed, each charged only the attempt that delivered it');
{
	my $seen = received($sink_b);
	my @ids = message_ids($range1);
	is(scalar(grep { ($seen->{$_} // 0) == 1 } @ids), $n1,
		'first relay down: the second relay has every mail, once');
	is(scalar(grep { $_ > 1 } values %$seen), 0, 'first relay down: no Message-ID twice');
}
is( $node->safe_psql('postgres',
		"SELECT string_agg(relay_url || ' ' || CASE WHEN relay_url = '$url_a' THEN (relay <> 'closed')::text ELSE relay END, ';' ORDER BY relay_url = '$url_b') FROM gatekeeper.worker_status"
	),
	"$url_a true;$url_b closed",
	'worker_status: a row per relay, the first one\'s breaker not closed, the second\'s closed');
like( $node->safe_psql('postgres',
		"SELECT last_error FROM gatekeeper.worker_status WHERE relay_url = '$url_a'"),
	qr/relay 127\.0\.0\.1:$port_a: could not connect/,
	'worker_status: the first relay\'s row says why');
is( $node->safe_psql('postgres',
		"SELECT sent_total FROM gatekeeper.worker_status WHERE relay_url = '$url_b'"),
	$n1, 'worker_status: the second relay sent them');

#
# 3. The first relay comes back
#
$sink_a = GatekeeperTest::start_sink(port => $port_a, name => 'relay_a');
# its retry interval over, the first relay is tried with the next mail
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT relay FROM gatekeeper.worker_status WHERE relay_url = '$url_a'", 'half-open', 60),
	'worker_status: the first relay\'s retry interval ends (half-open)');
my $n2 = 120;
my $range2 = enqueue('second', $n2);
all_sent($range2, $n2, 'both relays up');
{
	my $at_a = received($sink_a);
	my $at_b = received($sink_b);
	my @ids = message_ids($range2);
	my $a = grep { $at_a->{$_} } @ids;
	my $b = grep { $at_b->{$_} } @ids;
	note("second batch: $a at the first relay, $b at the second");
	cmp_ok($a, '>', 0, "both relays up: the first relay carries mail again ($a)");
	cmp_ok($b, '>', 0, "both relays up: the second relay carries mail too ($b)");
	is($a + $b, $n2, 'both relays up: every mail at one of them');
	my $seen = received($sink_a, $sink_b);
	is(scalar(grep { $_ > 1 } values %$seen), 0, 'both relays up: no Message-ID twice across both relays');
}
is(tally($range2), '0,1', 'both relays up: none failed, one attempt each');
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT string_agg(relay, ',') FROM gatekeeper.worker_status", 'closed,closed', 30),
	'worker_status: both breakers closed');

#
# 4. The first relay ends every session with 421 at its first MAIL FROM
#
GatekeeperTest::stop_sink($sink_a);
my $hostile = GatekeeperTest::start_hostile_relay(
	name => 'relay_a_421', port => $port_a, end_at_mail => 1, end => '421');
my $n3 = 30;
my $range3 = enqueue('third', $n3);
all_sent($range3, $n3, 'first relay says 421');
is(tally($range3), '0,1', 'first relay says 421: none failed, one attempt each');
{
	my @events = GatekeeperTest::relay_events($hostile);
	my $ended = grep { $_->{event} eq 'end' } @events;
	my $taken = grep { $_->{event} eq 'message' } @events;
	cmp_ok($ended, '>', 0, "first relay says 421: it was tried ($ended sessions ended)");
	is($taken, 0, 'first relay says 421: it took no message');
	my $seen = received($sink_a, $sink_b);
	my @ids = message_ids($range3);
	is(scalar(grep { ($seen->{$_} // 0) == 1 } @ids), $n3,
		'first relay says 421: the second relay has every mail, once');
	is(scalar(grep { $_ > 1 } values %$seen), 0, 'first relay says 421: no Message-ID twice over the test');
}

#
# 5. Both relays down, then the second one back
#
GatekeeperTest::stop_sink($sink_b);
my $n4 = 20;
my $range4 = enqueue('fourth', $n4);
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT count(*) FROM gatekeeper.mail_status WHERE $range4 AND state = 'scheduled' AND uncharged >= 1",
		$n4, 60),
	'both relays down: every mail was handed back');
is( $node->safe_psql('postgres',
		"SELECT count(*) FILTER (WHERE state NOT IN ('scheduled', 'claimed')) || ',' || max(attempt - uncharged) FROM gatekeeper.mail_status WHERE $range4"
	),
	'0,0', 'both relays down: no mail failed, no attempt was charged');
my $sink_b2 = GatekeeperTest::start_sink(port => $port_b, name => 'relay_b_again');
all_sent($range4, $n4, 'second relay back');
{
	my $seen = received($sink_a, $sink_b, $sink_b2);
	my @ids = message_ids($range4);
	is(scalar(grep { ($seen->{$_} // 0) == 1 } @ids), $n4,
		'second relay back: every mail arrived once');
	is(scalar(grep { $_ > 1 } values %$seen), 0, 'no Message-ID twice over the test');
}

GatekeeperTest::stop_sink($sink_b2);
$node->stop;
done_testing();
