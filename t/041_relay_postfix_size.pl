# Copyright: gatekeeper contributors

# A message larger than the relay's advertised SIZE fails without being
# sent.  A private Postfix smtpd advertises SIZE 200000
# (message_size_limit); a mail whose body is 300,000 octets (well under
# gatekeeper.max_message_size) must end `failed` on its first attempt with
# last_error saying the relay's size limit, and Postfix must not see it at
# all: no MAIL FROM for it (not even one Postfix refuses with 552), no
# BDAT or DATA.  A small mail in the same run is sent, so the relay is
# reachable and the refusal is the client's own.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $pf = GatekeeperTest::start_postfix(name => 'pf_size', message_size_limit => 200000);
my $node = GatekeeperTest::new_node(
	'size',
	smtp_url => $pf->{url},
	conf => "gatekeeper.helo_name = 'mta.example.com'\n"
	  . "gatekeeper.smtp_connections = 2\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gatekeeper');

# 4000 lines of 74 octets + CRLF: 300,000 octets of plain 7-bit text
my $big_id = $node->safe_psql('postgres',
	q{SELECT gatekeeper.enqueue('big@customer.example', 'Too big for the relay', repeat(repeat('x', 74) || E'\n', 4000))}
);
my $small_id = $node->safe_psql('postgres',
	q{SELECT gatekeeper.enqueue('small@customer.example', 'Small', 'A small message')});

ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT count(*) FROM gatekeeper.mail_status WHERE id IN ($big_id, $small_id) AND state IN ('scheduled', 'claimed')",
		'0', 30),
	'the worker finished both mails');

my ($state, $attempt, $error) = split /\|/,
  $node->safe_psql('postgres',
	"SELECT state, attempt - uncharged, coalesce(last_error, '') FROM gatekeeper.mail_status WHERE id = $big_id");
is($state, 'failed', 'the mail over the relay\'s SIZE failed');
is($attempt, 1, 'on its first attempt, without retries');
like($error, qr/size/i, "last_error names the size limit: $error");
like($error, qr/200000/, 'last_error gives the relay\'s limit');

is($node->safe_psql('postgres', "SELECT state FROM gatekeeper.mail_status WHERE id = $small_id"),
	'sent', 'the small mail is sent');
ok( GatekeeperTest::wait_for(sub { GatekeeperTest::sink_count($pf->{sink}) >= 1 }, 10),
	'Postfix accepted the small mail');

my $log = slurp_file($pf->{log});
unlike($log, qr/Message size exceeds fixed limit/,
	'Postfix never refused a message for its size: it was not offered');
unlike($log, qr/from=<[^>]*> to=<big\@customer\.example>/,
	'Postfix saw no transaction for the big mail');
my @got = GatekeeperTest::sink_messages($pf->{sink});
is(scalar(@got), 1, 'one message behind Postfix');
is_deeply($got[0]{rcpt}, ['<small@customer.example>'], 'the small one');

# Postfix logs a session's commands when it ends: stop the node to end
# the worker's
$node->stop;
GatekeeperTest::wait_for(sub { GatekeeperTest::postfix_command_count($pf, 'mail') >= 1 },
	15, 'the worker\'s sessions in Postfix\'s log');
is(GatekeeperTest::postfix_command_count($pf, 'mail'), 1,
	'one MAIL FROM in all: the small mail\'s')
  or diag(slurp_file($pf->{log}));
GatekeeperTest::stop_postfix($pf);

done_testing();
