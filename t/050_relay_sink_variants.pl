# Copyright: gatekeeper contributors

# The client falls back cleanly when the relay offers less, and keeps
# today's outcomes for replies to the data.  smtp-sink on one port,
# restarted with a different behaviour for each phase:
#
#  1. -p: no PIPELINING offered: every mail is sent, once.
#  2. -e: no ESMTP (EHLO refused): the client greets with HELO; every
#     mail is sent, once.
#  3. -r .: 4xx to the end of the data: each mail goes back to scheduled
#     with its attempt charged, then is sent once the relay accepts.
#  4. -f .: 5xx to the end of the data: each mail fails on its first
#     attempt with the reply in last_error (a 5xx for the mail is the
#     mail's, even several in a row: only MAIL FROM refusals are the
#     relay's).
#
# Passes on 0.1.0's libcurl client too: it guards the new client's
# fallbacks.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $port = PostgreSQL::Test::Cluster::get_free_port();
my $sink = GatekeeperTest::start_sink(port => $port, name => 'nopipe', args => ['-p']);
my $node = GatekeeperTest::new_node(
	'sink_variants',
	smtp_url => "smtp://127.0.0.1:$port",
	conf => "gatekeeper.helo_name = 'mta.example.com'\n"
	  . "gatekeeper.retry_delay = '2s'\n"
	  . "gatekeeper.smtp_timeout = '10s'\n"
	  . "gatekeeper.smtp_connections = 2\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gatekeeper');

# four mails to PREFIX1..4; returns the SQL condition selecting them
sub enqueue_four
{
	my ($prefix) = @_;
	my $first = $node->safe_psql('postgres',
		"WITH m AS (SELECT gatekeeper.enqueue('$prefix' || i || '\@customer.example', 'Mail ' || i, E'.dot\\nBody ' || i) AS id FROM generate_series(1, 4) AS i) SELECT min(id) FROM m"
	);
	return "id >= $first AND recipient LIKE '$prefix%'";
}

sub sent_once
{
	my ($s, $where, $what) = @_;
	ok( GatekeeperTest::poll_until(
			$node, 'postgres',
			"SELECT count(*) FROM gatekeeper.mail_status WHERE $where AND state = 'sent'",
			'4', 30),
		"$what: every mail is sent")
	  or diag(GatekeeperTest::mail_states($node, $where));
	my %want = map { $_ => 1 } split /\n/,
	  $node->safe_psql('postgres', "SELECT message_id FROM gatekeeper.mail_status WHERE $where");
	ok(GatekeeperTest::wait_for(sub { GatekeeperTest::sink_count($s) >= 4 }, 10),
		"$what: the relay has them");
	my %got;
	$got{ $_->{message_id} // '' }++ foreach GatekeeperTest::sink_messages($s);
	is_deeply(\%got, { map { $_ => 1 } keys %want }, "$what: each once");
	return;
}

# 1. no PIPELINING
sent_once($sink, enqueue_four('nopipe'), 'no PIPELINING');
GatekeeperTest::stop_sink($sink);

# 2. no ESMTP
$sink = GatekeeperTest::start_sink(port => $port, name => 'noesmtp', args => ['-e']);
sent_once($sink, enqueue_four('noesmtp'), 'no ESMTP');
my ($msg) = GatekeeperTest::sink_messages($sink);
is(GatekeeperTest::normalize_text($msg->{body}) =~ /^\.dot\nBody \d$/ ? 1 : 0, 1,
	'no ESMTP: the body intact, the leading dot un-stuffed');
GatekeeperTest::stop_sink($sink);

# 3. 4xx to the end of the data, then accepted
$sink = GatekeeperTest::start_sink(port => $port, name => 'soft_eod', args => [ '-r', '.' ]);
my $soft = enqueue_four('softeod');
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT count(*) FROM gatekeeper.mail_status WHERE $soft AND attempt >= 1 AND state IN ('scheduled', 'claimed', 'sent')",
		'4', 30),
	'4xx to the data: every mail was tried');
is( $node->safe_psql('postgres',
		"SELECT count(*) FROM gatekeeper.mail_status WHERE $soft AND state NOT IN ('scheduled', 'claimed')"),
	'0', '4xx to the data: none sent, none failed');
like($node->safe_psql('postgres', "SELECT min(last_error) FROM gatekeeper.mail_status WHERE $soft"),
	qr/\b4\d\d\b/, '4xx to the data: last_error has the reply');
GatekeeperTest::stop_sink($sink);
$sink = GatekeeperTest::start_sink(port => $port, name => 'soft_eod_ok');
sent_once($sink, $soft, '4xx to the data, then accepted');
# a relay that answers every transaction with a 4xx defers everything: the
# relay's fault, not the mail's (issue 45, item 1), so those attempts are
# not charged
is($node->safe_psql('postgres', "SELECT max(attempt - uncharged) FROM gatekeeper.mail_status WHERE $soft"),
	'1', '4xx to every transaction: the 4xx attempts were not charged');
GatekeeperTest::stop_sink($sink);

# 4. 5xx to the end of the data
$sink = GatekeeperTest::start_sink(port => $port, name => 'hard_eod', args => [ '-f', '.' ]);
my $hard = enqueue_four('hardeod');
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT count(*) FROM gatekeeper.mail_status WHERE $hard AND state = 'failed'",
		'4', 30),
	'5xx to the data: every mail failed')
  or diag(GatekeeperTest::mail_states($node, $hard));
is($node->safe_psql('postgres', "SELECT max(attempt) FROM gatekeeper.mail_status WHERE $hard"),
	'1', '5xx to the data: on the first attempt');
like($node->safe_psql('postgres', "SELECT min(last_error) FROM gatekeeper.mail_status WHERE $hard"),
	qr/\b5\d\d\b/, '5xx to the data: last_error has the reply');

$node->stop;
GatekeeperTest::stop_sink($sink);

done_testing();
