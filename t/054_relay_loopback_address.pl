# Copyright: gatekeeper contributors

# "Loopback" is an address, not a name (issue 25, item 4).
#
# Credentials go to a relay without STARTTLS only when the connection is
# on the loopback.  That used to be judged by the host name in
# gatekeeper.smtp_url ("localhost", anything that begins with "127.",
# "::1"), so a DNS name such as 127.mail.example.net, which may point
# anywhere, passed for loopback.  Now the address the connection reached
# decides (127.0.0.0/8, ::1, and 127.0.0.0/8 mapped into IPv6).
#
# A relay that offers AUTH and no STARTTLS (t/relay.py), reached as
# [::ffff:127.0.0.1]: no name rule knows that host, but its address is
# the loopback, so the mail goes with the login.  The other way round (a
# name beginning with "127." that resolves off the loopback) needs a
# resolver and a listener off the loopback, which a test on loopback
# cannot have; the code no longer looks at the name at all.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $pwfile = "$PostgreSQL::Test::Utils::tmp_check/loopback_password";
open(my $fh, '>', $pwfile) or die "$pwfile: $!";
print $fh "Loopback-Pw-31c7\n";
close($fh);
chmod(0600, $pwfile) or die "chmod $pwfile: $!";

my $relay = GatekeeperTest::start_relay(name => 'loopback_auth', auth => [ 'mailer', $pwfile ]);

my $node = GatekeeperTest::new_node(
	'loopback_address',
	smtp_url => "smtp://[::ffff:127.0.0.1]:$relay->{port}",
	conf => "gatekeeper.smtp_user = 'mailer'\n"
	  . "gatekeeper.smtp_password_file = '$pwfile'\n"
	  . "gatekeeper.helo_name = 'mta.example.com'\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gatekeeper');

my $id = $node->safe_psql('postgres',
	"SELECT gatekeeper.enqueue('mapped\@customer.example', 'Mapped', 'Hello')");
ok( GatekeeperTest::poll_until(
		$node, 'postgres', "SELECT state FROM gatekeeper.mail_status WHERE id = $id",
		'sent', 30),
	'a relay at [::ffff:127.0.0.1] is on the loopback: the mail is sent without STARTTLS')
  or diag($node->safe_psql('postgres',
	"SELECT last_error FROM gatekeeper.worker_status"));
my @msgs = GatekeeperTest::relay_messages($relay);
is(scalar(@msgs), 1, 'the relay has the message');
is($msgs[0]{user} // '', 'mailer', 'it came with the login');
is($msgs[0]{tls} ? 1 : 0, 0, 'and without TLS');

$node->stop;
GatekeeperTest::stop_relay($relay);
done_testing();
