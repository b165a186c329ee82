# Copyright: gatekeeper contributors
# gatekeeper-test: alone

# A relay that takes a second to answer each end-of-data (smtp-sink
# -W .:1, as relays that scan or spool before replying do) must not turn
# smtp_connections into one: with 16 connections, 64 mails take about 4 s
# (64 / 16 x 1 s), not 64 s as when every end-of-data blocks the whole
# worker (libcurl's SMTP does: its smtp_done waits for the reply).  The
# bound, 10 s from the commit to the last `sent`, is generous on purpose:
# it separates the two designs (a factor of 6 or more), not tunings.
# Each mail is at the relay exactly once.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $n = 64;
my $sink = GatekeeperTest::start_sink(name => 'slow_eod', args => [ '-W', '.:1' ]);
my $node = GatekeeperTest::new_node(
	'slow_eod',
	sink => $sink,
	conf => "gatekeeper.smtp_connections = 16\n"
	  . "gatekeeper.smtp_timeout = '30s'\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gatekeeper');

# connections warm: one mail first, so the timing below is about sending
my $warm = $node->safe_psql('postgres',
	q{SELECT gatekeeper.enqueue('warm@customer.example', 'Warm', 'Body')});
ok( GatekeeperTest::poll_until(
		$node, 'postgres', "SELECT state FROM gatekeeper.mail_status WHERE id = $warm", 'sent', 30),
	'a first mail is sent');

my $t0 = time;
my $first = $node->safe_psql('postgres',
	"WITH m AS (SELECT gatekeeper.enqueue('slow' || i || '\@customer.example', 'Mail ' || i, 'Body ' || i) AS id FROM generate_series(1, $n) AS i) SELECT min(id) FROM m"
);
my $all_sent = GatekeeperTest::poll_until(
	$node, 'postgres',
	"SELECT count(*) FROM gatekeeper.mail_status WHERE id >= $first AND state = 'sent'",
	$n, 20);
my $took = time - $t0;
ok($all_sent, "$n mails sent");
cmp_ok($took, '<', 10,
	sprintf('%d mails through 16 connections to a relay answering end-of-data after 1 s: %.1f s (one connection at a time: %d s)',
		$n, $took, $n));

ok( GatekeeperTest::wait_for(sub { GatekeeperTest::sink_count($sink) >= $n + 1 }, 10),
	'the relay has them all');
my %seen;
$seen{ $_->{message_id} // '' }++ foreach GatekeeperTest::sink_messages($sink);
is(scalar(grep { $_ > 1 } values %seen), 0, 'none twice');
is(scalar(keys %seen), $n + 1, 'each Message-ID once');

$node->stop;
GatekeeperTest::stop_sink($sink);

done_testing();
