# Copyright: gatekeeper contributors

# Certificate and host name verification are always on.  The relay
# (t/relay.py) requires STARTTLS and AUTH; the worker has credentials.
#
#  1. No gatekeeper.smtp_ca_file: the system store does not know the
#     test CA, so the session is refused: the mail stays scheduled, its
#     attempts uncharged, and the relay saw no AUTH, no MAIL, no message.
#  2. smtp_ca_file set (reload), but the relay's certificate names
#     another host (other.example, not 127.0.0.1): refused the same way.
#  3. The right certificate: the same mail is sent, on an uncharged
#     history (one charged attempt).

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $user = 'mailer';
my $password = 'Verify-Pw-51d0';
my $dir = PostgreSQL::Test::Utils::tempdir('tls_verify');
my $ca = GatekeeperTest::make_test_ca("$dir/ca");
my $wrong = GatekeeperTest::make_server_cert($ca, 'wrong', 'DNS:other.example', 'other.example');
my $relay_pw = "$dir/relay-password";
PostgreSQL::Test::Utils::append_to_file($relay_pw, "$password\n");
my $pw_file = "$dir/smtp-password";
PostgreSQL::Test::Utils::append_to_file($pw_file, "$password\n");
chmod(0600, $pw_file) or die "chmod: $!";

my $port = PostgreSQL::Test::Cluster::get_free_port();
my %relay_opts = (port => $port, require_tls => 1, auth => [ $user, $relay_pw ]);

my $node = GatekeeperTest::new_node(
	'tls_verify',
	smtp_url => "smtp://127.0.0.1:$port",
	conf => "gatekeeper.helo_name = 'mta.example.com'\n"
	  . "gatekeeper.smtp_user = '$user'\n"
	  . "gatekeeper.smtp_password_file = '$pw_file'\n"
	  . "gatekeeper.retry_delay = '2s'\n"
	  . "gatekeeper.smtp_connections = 2\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gatekeeper');

# Whether the relay saw the worker try STARTTLS and nothing past it.
sub refused_phase
{
	my ($relay, $what, $id) = @_;
	ok( GatekeeperTest::wait_for(
			sub {
				grep { $_->{event} eq 'command' && $_->{line} eq 'STARTTLS' }
				  GatekeeperTest::relay_events($relay);
			},
			30,
			"$what: STARTTLS"),
		"$what: the worker tried STARTTLS");
	ok( GatekeeperTest::poll_until(
			$node, 'postgres',
			"SELECT state = 'scheduled' AND attempt >= 1 AND attempt = uncharged FROM gatekeeper.mail_status WHERE id = $id",
			't', 30),
		"$what: the mail is back to scheduled, its attempts uncharged")
	  or diag($node->safe_psql('postgres', "SELECT state, attempt, uncharged, last_error FROM gatekeeper.mail_status WHERE id = $id"));
	my @events = GatekeeperTest::relay_events($relay);
	is(scalar(grep { $_->{event} =~ /^(tls|auth|mail|message)$/ } @events), 0,
		"$what: no TLS session, no AUTH, no MAIL, no message at the relay")
	  or diag(join("\n", map { JSON::PP::encode_json($_) } @events));
	isnt($node->safe_psql('postgres', "SELECT coalesce(last_error, '') FROM gatekeeper.mail_status WHERE id = $id"),
		'', "$what: last_error says why");
	return;
}

#
# 1. No CA file: the system store does not know the test CA
#
my $relay = GatekeeperTest::start_relay(name => 'verify_noca', tls => $ca, %relay_opts);
my $id = $node->safe_psql('postgres',
	q{SELECT gatekeeper.enqueue('verify@customer.example', 'Verified', 'Body')});
refused_phase($relay, 'no CA file', $id);
GatekeeperTest::stop_relay($relay);

#
# 2. The CA, but a certificate for another host
#
$node->append_conf('postgresql.conf', "gatekeeper.smtp_ca_file = '$ca->{ca_file}'\n");
$node->reload;
$relay = GatekeeperTest::start_relay(name => 'verify_wronghost', tls => $wrong, %relay_opts);
refused_phase($relay, 'wrong host', $id);
GatekeeperTest::stop_relay($relay);

#
# 3. The right certificate
#
$relay = GatekeeperTest::start_relay(name => 'verify_ok', tls => $ca, %relay_opts);
ok( GatekeeperTest::poll_until(
		$node, 'postgres', "SELECT state FROM gatekeeper.mail_status WHERE id = $id", 'sent', 40),
	'the right certificate: the mail is sent')
  or diag($node->safe_psql('postgres', "SELECT state, attempt, uncharged, last_error FROM gatekeeper.mail_status WHERE id = $id"));
is($node->safe_psql('postgres', "SELECT attempt - uncharged FROM gatekeeper.mail_status WHERE id = $id"),
	'1', 'one charged attempt: the refusals were not the mail\'s');
my @msgs = GatekeeperTest::relay_messages($relay);
is(scalar(@msgs), 1, 'the relay received it once');
ok($msgs[0] && $msgs[0]{tls}, 'over TLS');

$node->stop;
GatekeeperTest::stop_relay($relay);

done_testing();
