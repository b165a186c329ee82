# Copyright: gatekeeper contributors

# A bounce after the 250, end to end (issue 27), with the background
# worker and a real Postfix smtpd as the smarthost (GatekeeperTest's
# private instance on loopback, which accepts every recipient and stores
# what it accepts by its smtp-sink):
#
#  1. VERP and DSN on the wire: a queue with return_path sends each mail
#     with the envelope sender bounces+<the mail's token>@bounce.shop.example,
#     and, Postfix offering DSN, MAIL FROM carries RET=HDRS ENVID=<token>
#     and RCPT TO NOTIFY=FAILURE,DELAY ORCPT=rfc822;<recipient> (Postfix
#     accepts and passes them on: smtp-sink's X-Mail-Args, X-Rcpt-Args).
#  2. The DSN the smarthost sends later for the dead address (Postfix's
#     own shape: test/reports/postfix_user_unknown.eml, with the headers
#     of the message Postfix accepted as the returned headers), piped into
#     psql by the README's command (scripts/bounce-pipe.sql, the VERP
#     address as ${recipient}): one row, bounced 5.1.1.
#  3. The suppression (global hard_bounce by that mail), the events (sent
#     by the relay, bounced by the DSN) and the mail's history are found.
#  4. The next campaign never hands that address to Postfix: its mail is
#     suppressed by the claim, the other recipient's goes.
#
#  5. Both mails were enqueued in one transaction, as a campaign's
#     statement enqueues its mail: consecutive ids, one created_at.  The
#     Message-ID on the wire carries a MAC (issue 44): the other recipient,
#     writing the dead address's Message-ID from their own (its id for
#     theirs), names no mail, and their abuse report without
#     Original-Rcpt-To complains about no one; their report about their own
#     mail counts, once however often it comes.
#
# Postfix generating the DSN itself and delivering it through its pipe(8)
# transport takes Postfix's master(8), queue manager and bounce daemon,
# and pipe(8) must be started as root: t/059_reports_postfix_pipe.pl does
# that, as root.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $dead = 'gone@dead.example';
my $alive = 'reader@live.example';
my $pf = GatekeeperTest::start_postfix(name => 'pf_reports', reject => {});
my $node = GatekeeperTest::new_node(
	'reports',
	smtp_url => $pf->{url},
	conf => "gatekeeper.helo_name = 'mta.shop.example'\n");
$node->start;
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION gatekeeper;
SELECT gatekeeper.create_queue('news', gates => '{smart_sending}',
							   return_path => 'bounces+{token}@bounce.shop.example');
});

# the messages Postfix accepted for a recipient
sub stored_for
{
	my ($rcpt) = @_;
	return GatekeeperTest::sink_messages_to($pf->{sink}, $rcpt);
}

#
# 1. VERP and DSN on the wire
#
my ($dead_id, $alive_id) = split /\n/, $node->safe_psql(
	'postgres', "BEGIN;
SELECT gatekeeper.enqueue('$dead', 'Weekly picks', 'Hello', 'news', sender => 'Shop <shop\@shop.example>');
SELECT gatekeeper.enqueue('$alive', 'Weekly picks', 'Hello', 'news', sender => 'Shop <shop\@shop.example>');
COMMIT;");
is($alive_id, $dead_id + 1, 'one campaign: consecutive ids');
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT string_agg(state::text, ',') FROM gatekeeper.mail_status", 'sent,sent', 30),
	'both mails are sent');
ok(GatekeeperTest::wait_for(sub { stored_for($dead) == 1 && stored_for($alive) == 1 }, 15),
	'Postfix accepted both');
my $token = $node->safe_psql('postgres', "SELECT gatekeeper._verp_token($dead_id)");
my ($message) = stored_for($dead);
is($message->{mail_from}, "<bounces+$token\@bounce.shop.example>",
	'MAIL FROM: the VERP address with the mail\'s token');
like($message->{mail_params}, qr/^(?:SIZE=\d+ )?RET=HDRS ENVID=\Q$token\E$/,
	'MAIL FROM: RET=HDRS ENVID=<token> (after the SIZE Postfix passes on)');
is_deeply($message->{rcpt}, ["<$dead>"], 'RCPT TO: the recipient');
is_deeply($message->{rcpt_params}, ["NOTIFY=FAILURE,DELAY ORCPT=rfc822;$dead"],
	'RCPT TO: NOTIFY=FAILURE,DELAY ORCPT=rfc822;<recipient>');
like($message->{headers}{from}[0], qr/^"?Shop"? <shop\@shop\.example>$/, 'the From field is the sender');
my ($alive_msg) = stored_for($alive);
isnt($alive_msg->{mail_from}, $message->{mail_from}, 'each mail has its own return path');
like($message->{message_id}, qr/^<\Q$dead_id\E\.[a-z2-7]{20}\@shop\.example>$/,
	'the Message-ID on the wire: the id and a MAC');
is( $node->safe_psql('postgres', "SELECT message_id FROM gatekeeper.mail_status WHERE id = $dead_id"),
	$message->{message_id}, 'the Message-ID is the mail\'s');

#
# 2. The DSN, through the README's pipe
#
my ($head) = split /\n\n/, $message->{raw}, 2;
my $template = slurp_file("$FindBin::RealBin/../test/reports/postfix_user_unknown.eml");
my ($before, $after) = split /Content-Type: text\/rfc822-headers\nContent-Transfer-Encoding: 8bit\n\n.*?\n\n--/s,
  $template, 2;
my $dsn = $before . "Content-Type: text/rfc822-headers\nContent-Transfer-Encoding: 8bit\n\n" . $head . "\n\n--" . $after;
$dsn =~ s/\{\{TOKEN\}\}/$token/g;
$dsn =~ s/\{\{RCPT\}\}/$dead/g;
$dsn =~ s/\n/\r\n/g;
like($dsn, qr/^Message-ID: <\Q$dead_id\E\./mi, 'the DSN returns the headers Postfix accepted');

my ($out, $err) = ('', '');
{
	local $ENV{PGCLIENTENCODING} = 'LATIN1';
	IPC::Run::run(
		[ 'psql', '-X', '-q', '-A', '-t', '-d', $node->connstr('postgres'),
		  '-v', 'ON_ERROR_STOP=1', '-v', "recipient=bounces+$token\@bounce.shop.example",
		  '-f', "$FindBin::RealBin/../scripts/bounce-pipe.sql" ],
		'<', \$dsn, '>', \$out, '2>', \$err, IPC::Run::timeout(60));
}
is($? >> 8, 0, 'the pipe exits 0') or diag($err);
is($out, "$dead_id|$dead|bounced|5.1.1\n", 'ingest_report recorded the bounce of that mail');

#
# 3. The suppression, the events, the history
#
is( $node->safe_psql(
		'postgres',
		"SELECT address || '|' || coalesce(queue, 'every queue') || '|' || reason || '|' || (mail_id = $dead_id) "
		  . "FROM gatekeeper.suppression"),
	"$dead|every queue|hard_bounce|true",
	'the address is suppressed everywhere, by that mail');
is($node->safe_psql('postgres', GatekeeperTest::mail_events_sql($dead_id)),
	'sent:relay:,bounced:dsn:5.1.1',
	'the mail\'s events: sent by the relay, bounced by the DSN');
is( $node->safe_psql(
		'postgres', "SELECT id || '|' || state FROM gatekeeper.history('$dead')"),
	"$dead_id|sent",
	'history() shows the mail as the relay took it');
is( $node->safe_psql(
		'postgres', "SELECT bounced || '|' || complained FROM gatekeeper.queue_stats WHERE queue = 'news'"),
	'1|0', 'queue_stats counts the bounce');
is( $node->safe_psql('postgres', "SELECT gatekeeper.gate_open('smart_sending', '$dead')"),
	'f', 'the bounced mail keeps its gate pass');

#
# 4. The next campaign
#
ok(GatekeeperTest::next_campaign($node, "$dead:suppressed,$alive:sent", $dead, $alive),
	'the next mail to the bounced address is suppressed, the other is sent');
ok(GatekeeperTest::wait_for(sub { stored_for($alive) == 2 }, 15), 'Postfix accepted the other');
is(scalar(stored_for($dead)), 1, 'Postfix never saw the bounced address again');

#
# 5. The other recipient forges a complaint about the dead address's mail
#
my $arf = slurp_file("$FindBin::RealBin/../test/reports/microsoft_jmrp.eml");
(my $forged = $alive_msg->{message_id}) =~ s/^<\Q$alive_id\E\./<$dead_id./;
sub ingest
{
	my ($report) = @_;
	return $node->safe_psql('postgres',
		"SELECT count(*) FROM gatekeeper.ingest_report(\$report\$$report\$report\$)");
}
(my $forged_arf = $arf) =~ s/\{\{MSGID\}\}/$forged/g;
is(ingest($forged_arf), '0', 'a complaint naming the neighbour\'s id with one\'s own MAC names no mail');
(my $own_arf = $arf) =~ s/\{\{MSGID\}\}/$alive_msg->{message_id}/g;
is(ingest($own_arf), '1', 'the other recipient\'s complaint about their own mail counts');
(my $again = $own_arf) =~ s/User-Agent: Hotmail FBL/User-Agent: Hotmail FBL 2/;
is(ingest($again), '1', 'a second complaint about it is taken');
is($node->safe_psql('postgres', GatekeeperTest::mail_events_sql($dead_id)),
	'sent:relay:,bounced:dsn:5.1.1', 'the dead address\'s mail has no complaint');
is( $node->safe_psql(
		'postgres',
		"SELECT string_agg(address || ':' || reason, ',' ORDER BY address) FROM gatekeeper.suppression"),
	"$dead:hard_bounce,$alive:complaint", 'the complaining recipient is suppressed, by their own report');
is( $node->safe_psql('postgres', "SELECT complained FROM gatekeeper.queue_stats WHERE queue = 'news'"),
	'1', 'queue_stats counts one complaint for the two reports');

$node->stop;
GatekeeperTest::stop_postfix($pf);
done_testing();
