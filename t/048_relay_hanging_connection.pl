# Copyright: gatekeeper contributors
# gatekeeper-test: alone

# One relay connection that hangs does not stall the others.  The relay
# (t/relay.py, mode hang-first) greets its first connection and then
# never answers it; every later connection is served.  With 4
# connections and gatekeeper.smtp_timeout = 20s, 18 of 20 mails are sent
# (recorded `sent`) within 5 s, while the hanging connection is still
# waiting for its
# timeout (the relay has not seen it closed); whatever mail the hanging
# connection held is sent once the timeout gives it back.  Every mail
# reaches the relay exactly once.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $n = 20;
my $relay = GatekeeperTest::start_relay(name => 'hanging', mode => 'hang-first');
my $node = GatekeeperTest::new_node(
	'hanging',
	smtp_url => $relay->{url},
	conf => "gatekeeper.helo_name = 'mta.example.com'\n"
	  . "gatekeeper.smtp_timeout = '20s'\n"
	  . "gatekeeper.retry_delay = '2s'\n"
	  . "gatekeeper.smtp_connections = 4\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gatekeeper');

my $t0 = time;
$node->safe_psql('postgres',
	"SELECT gatekeeper.enqueue('hang' || i || '\@customer.example', 'Mail ' || i, 'Body ' || i) FROM generate_series(1, $n) AS i"
);

ok( GatekeeperTest::wait_for(
		sub { grep { $_->{event} eq 'hang' } GatekeeperTest::relay_events($relay) },
		15, 'the hanging connection'),
	'the worker opened the connection that hangs');

# all but what the hanging connection may hold (a pipelined transaction
# or two) are sent well before its timeout
my $most = $n - 2;
my $ok = GatekeeperTest::poll_until(
	$node, 'postgres',
	"SELECT count(*) >= $most FROM gatekeeper.mail_status WHERE state = 'sent'",
	't', 5);
my $took = time - $t0;
ok($ok, sprintf('at least %d of %d mails sent in %.1f s, with one connection hanging', $most, $n, $took))
  or diag(GatekeeperTest::mail_states($node, 'true'));
my ($hung) = grep { $_->{event} eq 'hang' } GatekeeperTest::relay_events($relay);
ok(!(grep { $_->{event} eq 'disconnect' && $_->{conn} == $hung->{conn} } GatekeeperTest::relay_events($relay)),
	'the hanging connection was still open meanwhile: nobody waited for its timeout');

ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT count(*) FROM gatekeeper.mail_status WHERE state = 'sent'",
		$n, 60),
	'every mail is sent in the end')
  or diag(GatekeeperTest::mail_states($node, 'true'));
my %seen;
$seen{ $_->{message_id} }++ foreach GatekeeperTest::relay_messages($relay);
is(scalar(keys %seen), $n, "the relay has $n messages");
is(scalar(grep { $_ > 1 } values %seen), 0, 'each once');

$node->stop;
GatekeeperTest::stop_relay($relay);

done_testing();
