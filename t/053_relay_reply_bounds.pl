# Copyright: gatekeeper contributors

# No relay can grow the worker's memory (issue 25, item 3).
#
# RFC 5321 4.5.3.1.5: a reply line is at most 512 octets; gatekeeper also
# takes no reply (all its lines) over 64 kB.  t/hostile_relay.py sends, up
# to 200 MB each time:
#
#  - greeting:  "220 " and then octets without a line end;
#  - ehlo:      a reply to EHLO that goes on and on ("250-..." lines);
#  - mail-line: a reply to MAIL FROM that is one line of 200 MB.
#
# For each, one mail: the worker gives the session up (worker_status says
# why), the mail goes back uncharged (not sent by the hostile relay, not
# failed), the same worker keeps running with its peak resident memory
# (VmHWM) under 96 MB, and once gatekeeper.smtp_url names a sane relay
# (t/relay.py) the mail goes, charged one attempt.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $flood_bytes = 200 * 1024 * 1024;
my $bound_kb = 96 * 1024;
my $hostile_port = PostgreSQL::Test::Cluster::get_free_port();
my $sane = GatekeeperTest::start_relay(name => 'sane');

my $node = GatekeeperTest::new_node(
	'reply_bounds',
	smtp_url => "smtp://127.0.0.1:$hostile_port",
	conf => "gatekeeper.helo_name = 'mta.example.com'\n"
	  . "gatekeeper.smtp_connections = 2\n"
	  . "gatekeeper.retry_delay = '1h'\n"
	  . "shared_buffers = '16MB'\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gatekeeper');
my ($pid) = GatekeeperTest::worker_pids($node);
ok($pid, "the worker runs (pid $pid)") or die 'no worker';

sub set_relay
{
	my ($url) = @_;
	$node->safe_psql('postgres',
		"ALTER SYSTEM SET gatekeeper.smtp_url = '$url'; SELECT pg_reload_conf()");
	return;
}

foreach my $case (
	[ 'greeting', qr/reply line longer than 512 octets/ ],
	[ 'ehlo', qr/reply longer than 65536 octets/ ],
	[ 'mail-line', qr/reply line longer than 512 octets/ ])
{
	my ($mode, $why) = @$case;
	my $hostile = GatekeeperTest::start_hostile_relay(
		name => "flood_$mode",
		port => $hostile_port,
		flood => $mode,
		flood_bytes => $flood_bytes);
	set_relay("smtp://127.0.0.1:$hostile_port");

	my $id = $node->safe_psql('postgres',
		"SELECT gatekeeper.enqueue('flood-$mode\@customer.example', 'Flood $mode', 'Hello')");
	ok( GatekeeperTest::poll_until(
			$node, 'postgres',
			"SELECT uncharged >= 1 FROM gatekeeper.mail_status WHERE id = $id", 't', 60),
		"$mode: the mail was handed back, uncharged");
	is( $node->safe_psql('postgres',
			"SELECT state IN ('scheduled', 'claimed') FROM gatekeeper.mail_status WHERE id = $id"),
		't',
		"$mode: the mail is neither sent nor failed");
	like(
		$node->safe_psql('postgres', 'SELECT last_error FROM gatekeeper.worker_status'),
		$why, "$mode: worker_status says why");

	my ($now) = GatekeeperTest::worker_pids($node);
	is($now // '', $pid, "$mode: the same worker runs");
	my $mem = GatekeeperTest::process_memory_kb($pid);
	note("$mode: worker VmHWM " . ($mem->{VmHWM} // '?') . " kB, VmRSS " . ($mem->{VmRSS} // '?') . ' kB');
	cmp_ok($mem->{VmHWM} // 1e9, '<', $bound_kb,
		"$mode: the worker's peak resident memory stays under 96 MB");
	my @floods = grep { $_->{event} eq 'flood' } GatekeeperTest::relay_events($hostile);
	note("$mode: the relay sent " . join(', ', map { $_->{sent} } @floods) . ' octets');

	# a sane relay takes it
	set_relay($sane->{url});
	ok( GatekeeperTest::poll_until(
			$node, 'postgres',
			"SELECT state FROM gatekeeper.mail_status WHERE id = $id", 'sent', 60),
		"$mode: with a sane relay the mail is sent");
	is( $node->safe_psql('postgres',
			"SELECT attempt - uncharged FROM gatekeeper.mail_status WHERE id = $id"),
		'1', "$mode: one attempt charged, the one that went");
	my $mid = $node->safe_psql('postgres', "SELECT message_id FROM gatekeeper.mail_status WHERE id = $id");
	is(scalar(grep { ($_->{message_id} // '') eq $mid } GatekeeperTest::relay_messages($sane)),
		1, "$mode: the sane relay has it once");

	GatekeeperTest::stop_helper($hostile->{pid});
}

my $mem = GatekeeperTest::process_memory_kb($pid);
cmp_ok($mem->{VmHWM} // 1e9, '<', $bound_kb,
	"after every flood the worker's peak stays under 96 MB ($mem->{VmHWM} kB)");

$node->stop;
GatekeeperTest::stop_relay($sane);
done_testing();
