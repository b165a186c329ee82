# Copyright: gatekeeper contributors

# The background worker claims its mail and records what became of it
# through the modules in C (src/claim.c, src/mail_state.c), not through
# the SQL functions they offer external workers: with track_functions =
# all, none of gatekeeper.claim, ack, ack_batch, nack, nack_batch, extend
# or unclaim is ever called, while the outcomes are what users rely on:
#
#  1. A relay (t/relay.py) that accepts some recipients, refuses some with
#     a 5xx (550 5.1.1) and defers others with a 4xx, and answers each
#     message's data only after 3 s, with a lease of 2 s: the accepted mail
#     is sent exactly once (its lease extended while it is on the wire; the
#     test reaps all the while, so a lease that ran out would be taken back
#     and the mail claimed and sent again), the refused mail failed with
#     its address suppressed as a hard bounce, the deferred mail scheduled
#     again with a 'deferred' event.
#  2. The relay down: the mail is handed back uncharged, and sent once the
#     relay is back.
#  3. The worker's function statistics, flushed after the last outcome
#     was recorded (its count of gatekeeper.purge calls, which only its
#     housekeeping makes, moved on), show no call of the seven SQL
#     functions.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $port = PostgreSQL::Test::Cluster::get_free_port();
my %relay_opts = (
	name => 'outcomes',
	port => $port,
	rcpt_replies => 1,
	data_delay => 3);
my $relay = GatekeeperTest::start_relay(%relay_opts);

my $node = GatekeeperTest::new_node(
	'state_calls',
	smtp_url => $relay->{url},
	naptime => '1s',
	conf => "track_functions = 'all'\n"
	  . "gatekeeper.lease = '2s'\n"
	  . "gatekeeper.retry_delay = '1h'\n"
	  . "gatekeeper.smtp_timeout = '20s'\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gatekeeper');

# the worker's calls of a gatekeeper function, as the statistics have them
sub calls
{
	my ($name) = @_;
	return $node->safe_psql('postgres',
		"SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions WHERE schemaname = 'gatekeeper' AND funcname = '$name'"
	);
}

my %ids;
foreach my $who (qw(ok1 ok2 ok3 ok4 ok5 ok6 hard1 hard2 hard3 soft1 soft2 soft3))
{
	$ids{$who} = $node->safe_psql('postgres',
		"SELECT gatekeeper.enqueue('$who\@customer.example', 'Hello', 'Hello there')");
}
my @ok = grep { /^ok/ } sort keys %ids;
my @hard = grep { /^hard/ } sort keys %ids;
my @soft = grep { /^soft/ } sort keys %ids;
my $all = join(',', values %ids);

#
# 1. accepted, refused, deferred; a slow relay and a short lease
#
my $settled = GatekeeperTest::wait_for(
	sub {
		# a lease that ran out is taken back here, at once
		$node->safe_psql('postgres', 'SELECT gatekeeper.reap()');
		$node->safe_psql('postgres',
			"SELECT count(*) FILTER (WHERE state = 'sent') = 6 AND count(*) FILTER (WHERE state = 'failed') = 3 AND count(*) FILTER (WHERE state = 'scheduled' AND attempt = 1) = 3 FROM gatekeeper.mail_status WHERE id IN ($all)"
		) eq 't';
	},
	90,
	'every mail settled');
ok($settled, 'every mail reached its outcome')
  or diag(GatekeeperTest::mail_states($node, "id IN ($all)"));

my %copies;
$copies{ $_->{message_id} // '' }++ foreach GatekeeperTest::relay_messages($relay);
foreach my $who (@ok)
{
	my ($state, $attempt, $mid) = split /\|/,
	  $node->safe_psql('postgres',
		"SELECT state, attempt, message_id FROM gatekeeper.mail_status WHERE id = $ids{$who}");
	is("$state/$attempt", 'sent/1', "$who: sent on its first claim, its lease extended");
	is($copies{$mid} // 0, 1, "$who: the relay holds its Message-ID once");
}
foreach my $who (@hard)
{
	my ($state, $error, $mid) = split /\|/,
	  $node->safe_psql('postgres',
		"SELECT state, last_error, message_id FROM gatekeeper.mail_status WHERE id = $ids{$who}");
	is($state, 'failed', "$who: a 5xx fails the mail");
	like($error, qr/^550 5\.1\.1/, "$who: last_error is the relay's reply");
	is($copies{$mid} // 0, 0, "$who: the relay holds no message of it");
	is( $node->safe_psql('postgres',
			"SELECT reason FROM gatekeeper.suppression_list WHERE address = '$who\@customer.example'"),
		'hard_bounce',
		"$who: its address is suppressed as a hard bounce");
	is( $node->safe_psql('postgres',
			"SELECT string_agg(event || ':' || status, ',') FROM gatekeeper.event_log WHERE mail_id = $ids{$who}"),
		'bounced:5.1.1',
		"$who: one bounced event with the reply's status");
}
foreach my $who (@soft)
{
	my ($state, $error, $uncharged, $later) = split /\|/,
	  $node->safe_psql('postgres',
		"SELECT state, last_error, uncharged, send_at > now() + interval '20 minutes' FROM gatekeeper.mail_status WHERE id = $ids{$who}"
	  );
	is("$state/$uncharged", 'scheduled/0', "$who: a 4xx retries the mail, charged");
	like($error, qr/^451 4\.3\.0/, "$who: last_error is the relay's reply");
	is($later, 't', "$who: retried after the backoff");
	is( $node->safe_psql('postgres',
			"SELECT string_agg(event || ':' || status, ',') FROM gatekeeper.event_log WHERE mail_id = $ids{$who}"),
		'deferred:4.3.0',
		"$who: one deferred event with the reply's status");
}
is( $node->safe_psql('postgres',
		"SELECT count(*) FROM gatekeeper.suppression_list WHERE address LIKE 'soft%' OR address LIKE 'ok%'"),
	'0',
	'neither sent nor deferred mail suppresses its address');

#
# 2. the relay down: handed back uncharged, then sent once
#
GatekeeperTest::stop_relay($relay);
my $later = $node->safe_psql('postgres',
	"SELECT gatekeeper.enqueue('later\@customer.example', 'Hello', 'Hello there')");
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT state = 'scheduled' AND uncharged >= 1 AND attempt = uncharged FROM gatekeeper.mail_status WHERE id = $later",
		't', 60),
	'relay down: the mail is handed back uncharged');
$relay = GatekeeperTest::start_relay(%relay_opts, data_delay => 0);
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT state FROM gatekeeper.mail_status WHERE id = $later",
		'sent', 60),
	'relay back: the mail is sent');
my $later_mid = $node->safe_psql('postgres',
	"SELECT message_id FROM gatekeeper.mail_status WHERE id = $later");
is(scalar(grep { ($_->{message_id} // '') eq $later_mid } GatekeeperTest::relay_messages($relay)),
	1, 'relay back: the relay holds it once');

#
# 3. the worker called none of the SQL functions for its outcomes
#
# Every outcome is recorded by now (the states above are committed).  The
# worker's statistics are flushed together: once the inserts into
# mail_done counted for its tables reach the rows there (nothing here
# deletes them), its function calls up to its last outcome are counted.
my $flushed = "SELECT (SELECT coalesce(sum(n_tup_ins), 0) FROM pg_stat_user_tables "
  . "WHERE schemaname = 'gatekeeper' AND relname LIKE 'mail\\_done\\_%') "
  . ">= (SELECT count(*) FROM gatekeeper.mail_done)";
ok( GatekeeperTest::poll_until($node, 'postgres', $flushed, 't', 60),
	"the worker's statistics were flushed after its last outcome");
cmp_ok(calls('reap'), '>', 0, "the statistics count calls made in SQL (this test's reap())");
foreach my $f (qw(claim ack ack_batch nack nack_batch extend unclaim))
{
	is(calls($f), '0', "the worker never called gatekeeper.$f() through SQL");
}

GatekeeperTest::stop_relay($relay);
$node->stop;
done_testing();
