# Copyright: gatekeeper contributors

# A relay's reply to RCPT TO is read once, where it arrives, and its
# event's status, reason and the suppression it causes come from what was
# read, not from the error text parsed again later (issue 46, item 2).
# RFC 2034: the enhanced status code of a reply is its first line's.
# t/relay.py with --rcpt-replies answers three recipients:
#
#  - hard:    "550 5.1.1 ... User unknown", one line: bounced, 5.1.1,
#             user_unknown, the address suppressed as a hard bounce;
#  - multi:   two lines, "550-5.1.1 ... is gone" and then "550 5.7.1 see
#             <url>": the reply's code is 5.1.1 (the first line's), so the
#             event says 5.1.1 and user_unknown and the address is
#             suppressed, whatever code the last line carries (a parse of
#             the last line, or of the error text kept for last_error, reads
#             5.7.1, policy_blocked, and suppresses nothing);
#  - mislead: one line "550 5.2.2 ... quota reached (not 5.1.1, ...)": the
#             code is the one after the reply code, not one the text quotes:
#             5.2.2, mailbox_full, not suppressed.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $relay = GatekeeperTest::start_relay(name => 'first_line', rcpt_replies => 1);

my $node = GatekeeperTest::new_node(
	'reply_first_line',
	smtp_url => $relay->{url},
	conf => "gatekeeper.retry_delay = '1h'\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gatekeeper');

my %ids;
foreach my $who (qw(hard1 multi1 mislead1 ok1))
{
	$ids{$who} = $node->safe_psql('postgres',
		"SELECT gatekeeper.enqueue('$who\@customer.example', 'Hello', 'Hello there')");
}
my $all = join(',', sort values %ids);

ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT count(*) FILTER (WHERE state IN ('sent', 'failed')) FROM gatekeeper.mail_status WHERE id IN ($all)",
		'4', 60),
	'every mail reached its outcome')
  or diag(GatekeeperTest::mail_states($node, "id IN ($all)"));

# per mail: its state, its events but 'sent' (event|status|reason), and
# the suppression of its address
sub outcome
{
	my ($who) = @_;
	return $node->safe_psql(
		'postgres', qq{
SELECT m.state || ';'
	   || coalesce((SELECT string_agg(e.event || '|' || coalesce(e.status, '') || '|' || coalesce(e.reason, ''), ',' ORDER BY e.id)
					  FROM gatekeeper.events e WHERE e.mail_id = m.id AND e.event <> 'sent'), '')
	   || ';' || coalesce((SELECT s.reason FROM gatekeeper.suppression s WHERE s.address = '$who\@customer.example'), '')
  FROM gatekeeper.mail_status m WHERE m.id = $ids{$who}});
}

is(outcome('hard1'), 'failed;bounced|5.1.1|user_unknown;hard_bounce',
	'a one-line 5.1.1: bounced, user_unknown, suppressed');
is(outcome('multi1'), 'failed;bounced|5.1.1|user_unknown;hard_bounce',
	"a two-line reply: the first line's code decides the event's status and reason, and the suppression");
is(outcome('mislead1'), 'failed;bounced|5.2.2|mailbox_full;',
	'a code quoted in the text is not the reply\'s: mailbox_full, not suppressed');
is(outcome('ok1'), 'sent;;', 'the accepted mail is sent, with no other event');
like(
	$node->safe_psql('postgres', "SELECT last_error FROM gatekeeper.mail_status WHERE id = $ids{multi1}"),
	qr/^550 5\.7\.1 see /,
	"last_error keeps the reply's text as before (its last line)");

$node->stop;
GatekeeperTest::stop_relay($relay);
done_testing();
