# Copyright: gatekeeper contributors

# The suppression list, one-click unsubscribe and display names, end to end
# through the background worker and a real SMTP relay (aiosmtpd on
# loopback, t/bounce_relay.py, which refuses one address as unknown):
#
#  1. A hard bounce: the relay answers RCPT TO with 550 5.1.1; the mail
#     fails, and the address is suppressed (global hard_bounce, the reply as
#     detail, the mail's id).
#  2. The next mail to that address, in another queue, never reaches the
#     relay: the claim suppresses it (counted in the relay's log).
#  3. A queue with an unsubscribe_url: its mail arrives with both RFC 8058
#     headers; the token from the delivered List-Unsubscribe, passed to
#     unsubscribe(), suppresses the reader for that queue only.
#  4. From and To with non-ASCII display names decode back intact with
#     Python's email package (policy strict); the envelope sender is the
#     bare address.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $python = '/usr/bin/python3';
plan skip_all => 'python3-aiosmtpd is not installed'
  unless system($python, '-c', 'import aiosmtpd') == 0;

my $port = PostgreSQL::Test::Cluster::get_free_port();
my $dir = "$PostgreSQL::Test::Utils::tmp_check/bounce_relay";
mkdir $dir or die "$dir: $!";

my $relay_pid = open(my $relay_out, '-|', $python, "$FindBin::RealBin/bounce_relay.py",
	$port, $dir, 'dead@customer.example')
  or die "could not start bounce_relay.py: $!";
my $ready = <$relay_out>;
die "bounce_relay.py did not start" unless defined $ready && $ready =~ /ready/;
# KILL: the test may run with SIGTERM ignored, which the relay inherits
END { kill 'KILL', $relay_pid if $relay_pid; }

sub relay_lines
{
	return () unless -e "$dir/log";
	return split /\n/, slurp_file("$dir/log");
}

my $node = GatekeeperTest::new_node('suppression', smtp_url => "smtp://127.0.0.1:$port");
$node->start;
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION gatekeeper;
SELECT gatekeeper.create_queue('news');
SELECT gatekeeper.create_queue('promo', unsubscribe_url => 'https://shop.example.com/u/{token}');
});

#
# 1. A hard bounce suppresses the address
#
my $dead_id = $node->safe_psql('postgres',
	"SELECT gatekeeper.enqueue('dead\@customer.example', 'News', 'Body', 'news')");
$node->safe_psql('postgres',
	"SELECT gatekeeper.enqueue('alive\@customer.example', 'News', 'Body', 'news')");
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT string_agg(recipient || ':' || state, ',' ORDER BY recipient) FROM gatekeeper.mail_status",
		'alive@customer.example:sent,dead@customer.example:failed'),
	'the refused mail fails, the other is sent');
like($node->safe_psql('postgres', "SELECT last_error FROM gatekeeper.mail_status WHERE id = $dead_id"),
	qr/^550 5\.1\.1 /, 'last_error starts with the relay reply');
is( $node->safe_psql(
		'postgres',
		"SELECT address || '|' || coalesce(queue, 'every queue') || '|' || reason || '|' "
		  . "|| (detail LIKE '550 5.1.1 %User unknown%') || '|' || (mail_id = $dead_id) "
		  . "FROM gatekeeper.suppression"),
	'dead@customer.example|every queue|hard_bounce|true|true',
	'the address is suppressed: global hard_bounce, the reply as detail, the mail id');

#
# 2. The next mail to it, in another queue, never reaches the relay
#
$node->safe_psql('postgres',
	"SELECT gatekeeper.enqueue('Dead\@Customer.example', 'Promo', 'Body', 'promo')");
$node->safe_psql('postgres',
	"SELECT gatekeeper.enqueue('marker\@customer.example', 'Promo', 'Body', 'promo')");
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT state FROM gatekeeper.mail_status WHERE recipient = 'marker\@customer.example'", 'sent'),
	'a later mail in the same claim goes');
is( $node->safe_psql(
		'postgres',
		"SELECT state || '|' || last_error FROM gatekeeper.mail_status "
		  . "WHERE recipient = 'Dead\@Customer.example'"),
	'suppressed|suppressed: hard_bounce',
	'the mail to the bounced address (in any case) is suppressed by the claim');
is(scalar(grep { /^rcpt \w+ dead\@customer\.example$/i } relay_lines()),
	1, 'the relay was asked for the bounced address once only');
is(scalar(grep { /^message \S+ .*dead\@customer\.example/i } relay_lines()),
	0, 'and never received a message for it');

#
# 3 and 4. One-click unsubscribe, display names
#
$node->safe_psql(
	'postgres', q{
SELECT gatekeeper.enqueue('reader@customer.example', 'Sale', 'Body', 'promo',
	sender => U&'Shop \00C9mile \65E5\672C <shop@example.com>',
	recipient_name => U&'R\00E9ader, \00C9.',
	metadata => '{"campaign": "sale"}')});
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT state FROM gatekeeper.mail_status WHERE recipient = 'reader\@customer.example'", 'sent'),
	'the promotional mail is sent');
my ($message) = grep { /^message \S+ reader\@customer\.example / } relay_lines();
like($message, qr/^message shop\@example\.com reader\@customer\.example /,
	'the envelope sender is the bare address');

my $file;
foreach my $f (glob("$dir/msg-*.eml"))
{
	$file = $f if slurp_file($f) =~ /^To:.*reader\@customer\.example/mi;
}
ok(defined $file, 'the relay holds the message');
my $parsed = `$python -c '
import sys, email, email.policy
m = email.message_from_binary_file(open(sys.argv[1], "rb"), policy=email.policy.strict)
f = m["From"].addresses[0]
t = m["To"].addresses[0]
print(ascii(f.display_name), f.addr_spec, ascii(t.display_name), t.addr_spec, sep="|")
print(m["List-Unsubscribe"])
print(m["List-Unsubscribe-Post"])
print(m.get("metadata"), "campaign" in m.as_string())
' '$file' 2>&1`;
my ($names, $list_unsubscribe, $post, $leak) = split /\n/, $parsed;
is($names,
	q{'Shop \xc9mile \u65e5\u672c'|shop@example.com|'R\xe9ader, \xc9.'|reader@customer.example},
	'From and To decode to the display names and addresses (email, policy strict)')
  or diag($parsed);
like($list_unsubscribe, qr{^<https://shop\.example\.com/u/[A-Za-z0-9_-]+>$},
	'List-Unsubscribe holds the queue URL with a token');
is($post, 'List-Unsubscribe=One-Click', 'List-Unsubscribe-Post is RFC 8058 one-click');
is($leak, 'None False', 'metadata is not in the message');

my ($token) = $list_unsubscribe =~ m{/u/([A-Za-z0-9_-]+)>};
is($node->safe_psql('postgres', "SELECT gatekeeper.unsubscribe('$token')"),
	't', 'unsubscribe() takes the delivered token');
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
		'News 2:sent,Sale 2:suppressed'),
	'the next promotional mail is suppressed; the news still goes');

$node->stop;
kill 'KILL', $relay_pid;
close($relay_out);
$relay_pid = undef;
done_testing();
