# Copyright: gatekeeper contributors

# The suppression list, one-click unsubscribe and display names, end to end
# through the background worker and a real Postfix (a private smtpd on
# loopback, GatekeeperTest::start_postfix, whose access map answers RCPT TO
# for dead@customer.example with "550 5.1.1 ... User unknown"; every message
# it accepts is stored, one file each, by the smtp-sink behind it):
#
#  1. A hard bounce: the mail fails with the reply, and the address is
#     suppressed (global hard_bounce, the reply as detail, the mail's id).
#  2. The next mail to that address, in another queue, never reaches the
#     relay: the claim suppresses it.  Counted on the relay's side after
#     every session ended: Postfix's log holds one refusal of the address
#     and RCPT TO counts that add up to the mails the worker handed over,
#     and the message store holds no message for it.
#  3. A queue with an unsubscribe_url: its mail arrives with both RFC 8058
#     headers; the token from the delivered List-Unsubscribe, passed to
#     unsubscribe(), suppresses the reader for that queue only (the next
#     promotional mail never reaches the relay; news still does).
#  4. From and To with non-ASCII display names decode back intact with
#     Python's email package (policy strict); the envelope sender is the
#     bare address; the metadata is not in the message.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use File::Temp ();
use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $dead = 'dead@customer.example';
my $pf = GatekeeperTest::start_postfix(
	name => 'pf_suppression',
	reject => { $dead => '550 5.1.1 User unknown' });
my $node = GatekeeperTest::new_node(
	'suppression',
	smtp_url => $pf->{url},
	conf => "gatekeeper.helo_name = 'mta.example.com'\n");
$node->start;
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION gatekeeper;
SELECT gatekeeper.create_queue('news');
SELECT gatekeeper.create_queue('promo', unsubscribe_url => 'https://shop.example.com/u/{token}');
});

# Postfix's refusals of the address at RCPT TO, from its log
sub refusals
{
	my $log = -f $pf->{log} ? slurp_file($pf->{log}) : '';
	return scalar(() = $log =~ /NOQUEUE: reject: RCPT from .*: 550 5\.1\.1 <\Q$dead\E>: .*User unknown/gi);
}

# the messages Postfix accepted (stored by its smtp-sink), to a recipient
sub stored_for
{
	my ($rcpt) = @_;
	return GatekeeperTest::sink_messages_to($pf->{sink}, $rcpt);
}

#
# 1. A hard bounce suppresses the address
#
my $dead_id = $node->safe_psql('postgres',
	"SELECT gatekeeper.enqueue('$dead', 'News', 'Body', 'news')");
$node->safe_psql('postgres',
	"SELECT gatekeeper.enqueue('alive\@customer.example', 'News', 'Body', 'news')");
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT string_agg(recipient || ':' || state, ',' ORDER BY recipient) FROM gatekeeper.mail_status",
		'alive@customer.example:sent,dead@customer.example:failed', 30),
	'the refused mail fails, the other is sent');
like($node->safe_psql('postgres', "SELECT last_error FROM gatekeeper.mail_status WHERE id = $dead_id"),
	qr/^550 5\.1\.1 .*User unknown/, 'last_error starts with the relay reply');
is( $node->safe_psql(
		'postgres',
		"SELECT address || '|' || coalesce(queue, 'every queue') || '|' || reason || '|' "
		  . "|| (detail LIKE '550 5.1.1 %User unknown%') || '|' || (mail_id = $dead_id) "
		  . "FROM gatekeeper.suppression"),
	'dead@customer.example|every queue|hard_bounce|true|true',
	'the address is suppressed: global hard_bounce, the reply as detail, the mail id');
ok(GatekeeperTest::wait_for(sub { refusals() == 1 }, 10), 'Postfix logged its refusal');

#
# 2. The next mail to it, in another queue, never reaches the relay
#
$node->safe_psql('postgres',
	"SELECT gatekeeper.enqueue('Dead\@Customer.example', 'Promo', 'Body', 'promo')");
$node->safe_psql('postgres',
	"SELECT gatekeeper.enqueue('marker\@customer.example', 'Promo', 'Body', 'promo')");
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT state FROM gatekeeper.mail_status WHERE recipient = 'marker\@customer.example'", 'sent', 30),
	'a later mail in the same claim goes');
is( $node->safe_psql(
		'postgres',
		"SELECT state || '|' || last_error FROM gatekeeper.mail_status "
		  . "WHERE recipient = 'Dead\@Customer.example'"),
	'suppressed|suppressed: hard_bounce',
	'the mail to the bounced address (in any case) is suppressed by the claim');

#
# 3 and 4. One-click unsubscribe, display names, metadata
#
$node->safe_psql(
	'postgres', q{
SELECT gatekeeper.enqueue('reader@customer.example', 'Sale', 'Body', 'promo',
	sender => U&'Shop \00C9mile \65E5\672C <shop@example.com>',
	recipient_name => U&'R\00E9ader, \00C9.',
	metadata => '{"campaign": "meta-7f3a9"}')});
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT state FROM gatekeeper.mail_status WHERE recipient = 'reader\@customer.example'", 'sent', 30),
	'the promotional mail is sent');
ok(GatekeeperTest::wait_for(sub { stored_for('reader@customer.example') == 1 }, 10),
	'Postfix accepted it');
my ($message) = stored_for('reader@customer.example');
like($message->{mail_from}, qr/^<shop\@example\.com>(?: |$)/, 'the envelope sender is the bare address');

my $eml = File::Temp->new(DIR => $PostgreSQL::Test::Utils::tmp_check, SUFFIX => '.eml');
binmode($eml);
print $eml $message->{raw};
close($eml);
my $parsed = `$GatekeeperTest::PYTHON -c '
import sys, email, email.policy
m = email.message_from_binary_file(open(sys.argv[1], "rb"), policy=email.policy.strict)
f = m["From"].addresses[0]
t = m["To"].addresses[0]
print(ascii(f.display_name), f.addr_spec, ascii(t.display_name), t.addr_spec, sep="|")
print(m["List-Unsubscribe"])
print(m["List-Unsubscribe-Post"])
print("meta-7f3a9" in m.as_string())
' '$eml' 2>&1`;
my ($names, $list_unsubscribe, $post, $leak) = split /\n/, $parsed;
is($names,
	q{'Shop \xc9mile \u65e5\u672c'|shop@example.com|'R\xe9ader, \xc9.'|reader@customer.example},
	'From and To decode to the display names and addresses (email, policy strict)')
  or diag($parsed);
like($list_unsubscribe, qr{^<https://shop\.example\.com/u/[A-Za-z0-9_-]+>$},
	'List-Unsubscribe holds the queue URL with a token');
is($post, 'List-Unsubscribe=One-Click', 'List-Unsubscribe-Post is RFC 8058 one-click');
is($leak, 'False', 'the metadata is not in the message');

my ($token) = ($list_unsubscribe // '') =~ m{/u/([A-Za-z0-9_-]+)>};
is($node->safe_psql('postgres', "SELECT gatekeeper.unsubscribe('$token')"),
	't', 'unsubscribe() takes the token from the delivered header');
is( $node->safe_psql(
		'postgres',
		"SELECT address || '|' || queue || '|' || reason FROM gatekeeper.suppression "
		  . "WHERE address = 'reader\@customer.example'"),
	'reader@customer.example|promo|unsubscribe',
	'the reader is suppressed for that queue');
$node->safe_psql('postgres',
	"SELECT gatekeeper.enqueue('reader\@customer.example', 'Sale 2', 'Body', 'promo')");
$node->safe_psql('postgres',
	"SELECT gatekeeper.enqueue('reader\@customer.example', 'News 2', 'Body', 'news')");
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT string_agg(subject || ':' || state, ',' ORDER BY subject) FROM gatekeeper.mail_status "
		  . "WHERE recipient = 'reader\@customer.example' AND subject LIKE '% 2'",
		'News 2:sent,Sale 2:suppressed', 30),
	'the next promotional mail is suppressed; the news still goes');

#
# The relay's side, once every session has ended (the worker keeps its
# connections open until it stops)
#
my ($handed, $sent) = split /\|/,
  $node->safe_psql('postgres',
	"SELECT count(*) FILTER (WHERE state IN ('sent', 'failed')) || '|' || count(*) FILTER (WHERE state = 'sent') "
	  . "FROM gatekeeper.mail_status");
$node->stop;
ok( GatekeeperTest::wait_for(
		sub { GatekeeperTest::postfix_command_count($pf, 'mail') >= $handed }, 15),
	"Postfix logged the end of every session ($handed mails handed over)");
my $rcpt_tried = 0;
foreach my $s (GatekeeperTest::postfix_sessions($pf))
{
	$rcpt_tried += $1 if ($s->{rcpt} // '') =~ m{/(\d+)$};
	$rcpt_tried += $1 if ($s->{rcpt} // '') =~ m{^(\d+)$};
}
is($rcpt_tried, $handed, 'Postfix saw one RCPT TO per mail sent or failed, none for the suppressed');
is(refusals(), 1, 'Postfix refused the bounced address once: its later mail never reached it');
is(scalar(stored_for($dead)), 0, 'and holds no message for it');
my @reader = sort map { $_->{headers}{subject}[0] } stored_for('reader@customer.example');
is_deeply(\@reader, [ 'News 2', 'Sale' ],
	'the unsubscribed reader got the news, not the next promotional mail');
is(GatekeeperTest::sink_count($pf->{sink}), $sent,
	'Postfix accepted every mail gatekeeper marked sent');

GatekeeperTest::stop_postfix($pf);
done_testing();
