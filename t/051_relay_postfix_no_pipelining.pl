# Copyright: gatekeeper contributors

# A client that uses BDAT only when CHUNKING is offered, and pipelines
# only when PIPELINING is.  The private Postfix smtpd here offers neither
# (smtpd_discard_ehlo_keywords) and disconnects clients that break RFC
# 2920's grouping rules (smtpd_forbid_unauth_pipelining = yes, Postfix
# 3.7.10+: e.g. anything sent after EHLO or DATA before their reply; it
# does not catch MAIL, RCPT, DATA sent together, which t/045 checks
# against a relay that logs every octet sent ahead): every mail must still
# be sent, with DATA, and Postfix must have logged no improper
# pipelining.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $pf = GatekeeperTest::start_postfix(
	name => 'pf_nopipe',
	conf => "smtpd_discard_ehlo_keywords = pipelining, chunking, silent-discard\n"
	  . "smtpd_forbid_unauth_pipelining = yes\n");
my $node = GatekeeperTest::new_node(
	'no_pipelining',
	smtp_url => $pf->{url},
	conf => "gatekeeper.helo_name = 'mta.example.com'\n"
	  . "gatekeeper.smtp_connections = 2\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gatekeeper');

$node->safe_psql('postgres',
	q{SELECT gatekeeper.enqueue('nopipe' || i || '@customer.example', 'Mail ' || i, E'.dot\nBody ' || i) FROM generate_series(1, 6) AS i}
);
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT count(*) FROM gatekeeper.mail_status WHERE state = 'sent'",
		'6', 30),
	'every mail is sent')
  or diag(GatekeeperTest::mail_states($node, 'true') . ' '
	  . $node->safe_psql('postgres', "SELECT string_agg(DISTINCT last_error, ' / ') FROM gatekeeper.mail_status"));
ok(GatekeeperTest::wait_for(sub { GatekeeperTest::sink_count($pf->{sink}) >= 6 }, 10),
	'Postfix accepted them');

# Postfix logs a session's commands when it ends
$node->stop;
GatekeeperTest::wait_for(sub { GatekeeperTest::postfix_command_count($pf, 'data') + GatekeeperTest::postfix_command_count($pf, 'bdat') >= 6 },
	15, 'the worker\'s sessions in Postfix\'s log');
my $bdat = GatekeeperTest::postfix_command_count($pf, 'bdat');
my $data = GatekeeperTest::postfix_command_count($pf, 'data');
is($bdat, 0, 'no BDAT: CHUNKING was not offered');
cmp_ok($data, '>=', 6, "DATA for every message ($data)");
unlike(slurp_file($pf->{log}), qr/improper command pipelining/,
	'no command was sent ahead of its reply');
GatekeeperTest::stop_postfix($pf);

done_testing();
