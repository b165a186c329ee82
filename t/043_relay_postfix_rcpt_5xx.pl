# Copyright: gatekeeper contributors

# A per-recipient 550 5.1.1 fails just that mail.  A private Postfix
# smtpd rejects nobody-here@customer.example at RCPT TO with "550 5.1.1
# ... User unknown" (an access map) and accepts everyone else.  Of six
# mails sent together over the same connections, the one to that address
# ends `failed` on its first attempt with the reply, enhanced status code
# 5.1.1 included, in last_error; the five others are sent, once each; and
# the connection carries on (the next transaction after the refused one
# is accepted: RSET or not, the failure does not spill over).

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $pf = GatekeeperTest::start_postfix(name => 'pf_rcpt');
my $node = GatekeeperTest::new_node(
	'rcpt5xx',
	smtp_url => $pf->{url},
	conf => "gatekeeper.helo_name = 'mta.example.com'\n"
	  . "gatekeeper.smtp_connections = 1\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gatekeeper');

# one connection: the refused recipient sits between accepted ones
$node->safe_psql(
	'postgres', q{
BEGIN;
SELECT gatekeeper.enqueue('before' || i || '@customer.example', 'Before ' || i, 'Body') FROM generate_series(1, 3) AS i;
SELECT gatekeeper.enqueue('nobody-here@customer.example', 'To nobody', 'Body');
SELECT gatekeeper.enqueue('after' || i || '@customer.example', 'After ' || i, 'Body') FROM generate_series(1, 2) AS i;
COMMIT;
});

ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT count(*) FROM gatekeeper.mail_status WHERE state IN ('scheduled', 'claimed')",
		'0', 30),
	'the worker finished every mail');

my ($state, $attempt, $error) = split /\|/,
  $node->safe_psql('postgres',
	"SELECT state, attempt, coalesce(last_error, '') FROM gatekeeper.mail_status WHERE recipient = 'nobody-here\@customer.example'"
  );
is($state, 'failed', 'the mail to the unknown recipient failed');
is($attempt, 1, 'on its first attempt: a 5xx is not retried');
like($error, qr/\b550\b/, "last_error has the reply code: $error");
like($error, qr/\b5\.1\.1\b/, 'last_error keeps the enhanced status code 5.1.1');
like($error, qr/User unknown/, 'last_error keeps the relay\'s text');

is( $node->safe_psql('postgres',
		"SELECT string_agg(recipient || ': ' || state || coalesce(' (' || last_error || ')', ''), ', ' ORDER BY id) FROM gatekeeper.mail_status WHERE recipient <> 'nobody-here\@customer.example' AND state <> 'sent'"
	),
	'',
	'the five other mails are sent');
is( $node->safe_psql('postgres',
		"SELECT max(attempt) FROM gatekeeper.mail_status WHERE recipient <> 'nobody-here\@customer.example'"),
	'1', 'each on its first attempt');

ok( GatekeeperTest::wait_for(sub { GatekeeperTest::sink_count($pf->{sink}) >= 5 }, 10),
	'Postfix accepted five messages');
my @rcpts = sort map { @{ $_->{rcpt} } } GatekeeperTest::sink_messages($pf->{sink});
is_deeply(\@rcpts,
	[ map { "<$_\@customer.example>" } qw(after1 after2 before1 before2 before3) ],
	'one message for each of the five, none for nobody-here');

$node->stop;
GatekeeperTest::stop_postfix($pf);

done_testing();
