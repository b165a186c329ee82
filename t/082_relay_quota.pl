# Copyright: gatekeeper contributors
# gatekeeper-test: alone

# A relay's own quota (issue 45, item 2; SPEC "Settings",
# gatekeeper.smtp_url: an entry may end in ?connections=N&rate=N, that
# relay's connections and messages per second across all workers):
#
#  1. ALTER SYSTEM takes ?connections=N&rate=N and refuses anything else
#     after the port, saying what.
#  2. One relay with rate=50, two workers: every mail goes, once, none
#     charged more than one attempt, and the relay never sees more than 50
#     transactions begin in any second (its own clock, a sliding window
#     over every MAIL FROM); the workers together never hold more than the
#     relay's connections=2.
#  3. Two relays, the first with rate=20: the first never exceeds 20 in
#     any second, the remainder goes to the second at once, and every
#     mail goes once.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = GatekeeperTest::new_node(
	'relay_quota',
	smtp_url => '',
	conf => "gatekeeper.workers = 2\n"
	  . "gatekeeper.smtp_connections = 4\n"
	  . "gatekeeper.retry_delay = '1s'\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gatekeeper');

#
# 1. The setting
#
foreach my $case (
	[ '?connections=0', qr/option "connections" must be a number from 1 to 1000/ ],
	[ '?rate=abc', qr/option "rate" must be a number from 1 to 100000/ ],
	[ '?rate=10&rate=20', qr/option "rate" given twice/ ],
	[ '?speed=10', qr/unknown option "speed" \(a relay takes connections=N and rate=N\)/ ],
	[ '?rate', qr/option "rate" without a value/ ],
	[ '/extra', qr/with nothing after the port but \?connections=N&rate=N/ ])
{
	my ($suffix, $want) = @$case;
	my ($ret, $out, $err) = $node->psql('postgres',
		"ALTER SYSTEM SET gatekeeper.smtp_url = 'smtp://127.0.0.1:2525$suffix'");
	isnt($ret, 0, "smtp_url ...$suffix is refused");
	like($err, $want, "smtp_url ...$suffix: the error says why") or diag($err);
}

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

# the most events at one relay within any second (a sliding window)
sub busiest_second
{
	my @t = sort { $a <=> $b } @_;
	my ($most, $lo) = (0, 0);
	for my $hi (0 .. $#t)
	{
		$lo++ while $t[$hi] - $t[$lo] >= 1.0;
		$most = $hi - $lo + 1 if $hi - $lo + 1 > $most;
	}
	return $most;
}

sub mails_at
{
	my ($relay) = @_;
	return map { $_->{t} } grep { $_->{event} eq 'mail' } GatekeeperTest::relay_events($relay);
}

sub ids_at
{
	my ($relay) = @_;
	my %seen;
	$seen{ $_->{message_id} // '' }++
	  foreach grep { $_->{event} eq 'message' } GatekeeperTest::relay_events($relay);
	return \%seen;
}

sub message_ids
{
	my ($range) = @_;
	return split /\n/, $node->safe_psql('postgres',
		"SELECT message_id FROM gatekeeper.mail_status WHERE $range ORDER BY id");
}

#
# 2. One relay, rate=50, connections=2, two workers
#
my $quota = GatekeeperTest::start_hostile_relay(name => 'quota', extensions => 'pipelining');
my ($ret, $out, $err) = $node->psql('postgres',
	"ALTER SYSTEM SET gatekeeper.smtp_url = '$quota->{url}?connections=2&rate=50'");
is($ret, 0, 'smtp_url with ?connections=2&rate=50 is accepted') or diag($err);
$node->reload;
GatekeeperTest::wait_for(
	sub {
		$node->safe_psql('postgres', "SELECT count(*) FROM gatekeeper.worker_status WHERE relay_url LIKE '%rate=50'")
		  eq '2';
	},
	30);

my $n1 = 300;
my $started = time;
my $range1 = enqueue('quota', $n1);
my $most_connections = 0;
my $deadline = time + 60;
while (time < $deadline)
{
	my ($sent, $connections) = split /\|/, $node->safe_psql('postgres',
		"SELECT (SELECT count(*) FROM gatekeeper.mail_status WHERE $range1 AND state = 'sent'), "
		  . "(SELECT sum(connections) FROM gatekeeper.worker_status)");
	$most_connections = $connections if $connections > $most_connections;
	last if $sent == $n1;
	select(undef, undef, undef, 0.1);
}
is($node->safe_psql('postgres',
		"SELECT count(*) FILTER (WHERE state = 'sent') || ',' || max(attempt - uncharged) FROM gatekeeper.mail_status WHERE $range1"),
	"$n1,1", 'rate=50: every mail sent, each on one attempt');
my @t1 = mails_at($quota);
my $busiest = busiest_second(@t1);
note(sprintf('rate=50: %d transactions in %.1f s, at most %d in any second, at most %d connections',
	scalar(@t1), $t1[-1] - $t1[0], $busiest, $most_connections));
cmp_ok($busiest, '<=', 50, "rate=50: never more than 50 transactions in any second ($busiest)");
cmp_ok($busiest, '>=', 40, "rate=50: and the quota is used ($busiest in the busiest second)");
cmp_ok($t1[-1] - $t1[0], '>=', ($n1 - 50) / 50 - 0.5, 'rate=50: 300 mails took about 6 s');
cmp_ok($most_connections, '<=', 2, "connections=2: the two workers never held more than 2 ($most_connections)");
{
	my $seen = ids_at($quota);
	is(scalar(grep { ($seen->{$_} // 0) == 1 } message_ids($range1)), $n1, 'rate=50: the relay has every mail, once');
}

#
# 3. Two relays, the first with rate=20: the remainder goes to the second
#
my $second = GatekeeperTest::start_sink(name => 'second');
$node->safe_psql('postgres',
	"ALTER SYSTEM SET gatekeeper.smtp_url = '$quota->{url}?rate=20, $second->{url}'");
$node->reload;
GatekeeperTest::wait_for(
	sub {
		$node->safe_psql('postgres', "SELECT count(*) FROM gatekeeper.worker_status WHERE relay_url LIKE '%rate=20'")
		  eq '2';
	},
	30);
my $before = scalar(mails_at($quota));
my $n2 = 400;
my $range2 = enqueue('spill', $n2);
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT count(*) FROM gatekeeper.mail_status WHERE $range2 AND state = 'sent'", $n2, 60),
	'two relays: every mail sent');
is($node->safe_psql('postgres', "SELECT max(attempt - uncharged) FROM gatekeeper.mail_status WHERE $range2"),
	'1', 'two relays: each on one attempt');
{
	my @t2 = (mails_at($quota))[ $before .. scalar(mails_at($quota)) - 1 ];
	my $busiest2 = busiest_second(@t2);
	my $at_first = ids_at($quota);
	my %at_second;
	$at_second{ $_->{message_id} // '' }++ foreach GatekeeperTest::sink_messages($second);
	my @ids = message_ids($range2);
	my $first = grep { $at_first->{$_} } @ids;
	my $other = grep { $at_second{$_} } @ids;
	note("rate=20 first relay: $first mails, at most $busiest2 in any second; second relay: $other");
	cmp_ok($busiest2, '<=', 20, "rate=20: the first relay never more than 20 in any second ($busiest2)");
	cmp_ok($first, '>', 0, 'rate=20: the first relay took its share');
	cmp_ok($other, '>', $first, 'rate=20: the remainder went to the second relay');
	is(scalar(grep { ($at_first->{$_} // 0) + ($at_second{$_} // 0) == 1 } @ids), $n2,
		'two relays: every mail at one of them, once');
}

GatekeeperTest::stop_helper($quota->{pid});
GatekeeperTest::stop_sink($second);
$node->stop;
done_testing();
