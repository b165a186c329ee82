# Copyright: gatekeeper contributors

# A real relay takes the next transaction behind a message's final ".".
#
# The private Postfix smtpd here offers PIPELINING and ENHANCEDSTATUSCODES
# but not CHUNKING (smtpd_discard_ehlo_keywords), so the worker sends with
# DATA and writes each next transaction's MAIL FROM, RCPT TO and DATA
# behind the message before it (t/076 has the scripted relays).  Postfix
# disconnects clients that break RFC 2920's grouping rules
# (smtpd_forbid_unauth_pipelining = yes), so a command written where it
# may not go (behind a DATA before its 354, say) fails this test.  A
# proxy 2 ms each way (t/delay_proxy.py) between the worker and Postfix
# lets the replies lag the commands, one connection.  Every mail must be
# sent once, with DATA, with no improper pipelining in Postfix's log and
# no misorder in the worker's.  (That the next transaction does go behind
# the "." is t/076's: a proxy's chunk count depends on how the kernel and
# the proxy happen to split the writes.)

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $n = 30;
my $pf = GatekeeperTest::start_postfix(
	name => 'pf_behind_dot',
	conf => "smtpd_discard_ehlo_keywords = chunking, silent-discard\n"
	  . "smtpd_forbid_unauth_pipelining = yes\n");
my $proxy = GatekeeperTest::start_delay_proxy(
	name => 'behind_dot_proxy',
	target => $pf->{port},
	delay_ms => 2);
my $node = GatekeeperTest::new_node(
	'postfix_behind_dot',
	smtp_url => $proxy->{url},
	conf => "gatekeeper.helo_name = 'mta.example.com'\n"
	  . "gatekeeper.smtp_connections = 1\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gatekeeper');

$node->safe_psql('postgres',
	qq{SELECT gatekeeper.enqueue('behind' || i || '\@customer.example', 'Mail ' || i, E'.dot\\nBody ' || i) FROM generate_series(1, $n) AS i}
);
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT count(*) FROM gatekeeper.mail_status WHERE state = 'sent'",
		$n, 60),
	'every mail is sent')
  or diag(GatekeeperTest::mail_states($node, 'true') . ' '
	  . $node->safe_psql('postgres', "SELECT string_agg(DISTINCT last_error, ' / ') FROM gatekeeper.mail_status"));
is( $node->safe_psql('postgres',
		"SELECT count(*) FROM gatekeeper.mail_status WHERE attempt - uncharged <> 1 OR last_error IS NOT NULL"),
	'0', 'each in one attempt, none with an error');
ok(GatekeeperTest::wait_for(sub { GatekeeperTest::sink_count($pf->{sink}) >= $n }, 10),
	'Postfix passed them on');

my %ids = map { $_ => 1 } split /\n/, $node->safe_psql('postgres', 'SELECT message_id FROM gatekeeper.mail_status');

# the worker's connection closes with the cluster; Postfix logs the
# session's commands when it ends
$node->stop;
GatekeeperTest::wait_for(sub { GatekeeperTest::postfix_command_count($pf, 'data') >= $n },
	15, 'the worker\'s session in Postfix\'s log');
my %copies;
$copies{ $_->{message_id} // '' }++ foreach GatekeeperTest::sink_messages($pf->{sink});
is(scalar(grep { $ids{$_} && $copies{$_} == 1 } keys %copies), $n,
	"Postfix passed on each of the $n Message-IDs once");
is(scalar(grep { $copies{$_} != 1 } keys %copies), 0, 'and no message twice');
cmp_ok(GatekeeperTest::postfix_command_count($pf, 'data'), '>=', $n, 'DATA for every message');
is(GatekeeperTest::postfix_command_count($pf, 'bdat'), 0, 'no BDAT: CHUNKING was not offered');
unlike(slurp_file($pf->{log}), qr/improper command pipelining/,
	'Postfix saw no improper pipelining');
unlike(slurp_file($node->logfile), qr/out of order|behind a final/,
	'the worker saw Postfix answer in order');

GatekeeperTest::stop_helper($proxy->{pid});
GatekeeperTest::stop_postfix($pf);
done_testing();
