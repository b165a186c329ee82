# Copyright: gatekeeper contributors

# STARTTLS and AUTH against a real server that supports both (t/relay.py,
# on Debian's python3-aiosmtpd): a test CA and a server certificate for
# 127.0.0.1 made with openssl at test time; the relay requires STARTTLS
# before MAIL and AUTH (PLAIN or LOGIN, only over TLS) before MAIL.
# gatekeeper.smtp_ca_file names the test CA, gatekeeper.smtp_user the
# login, gatekeeper.smtp_password_file a 0600 file of the server's OS user
# holding the password.  Mail arrives over TLS as the right user, intact;
# the password is in no setting any role can read, in no log (the node's
# or the relay's), in no last_error, in neither of its base64 forms.  The
# relay offers no PIPELINING (aiosmtpd does not), so the client sends no
# command before the reply to the previous one.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use MIME::Base64 qw(encode_base64);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $user = 'mailer';
my $password = 'Tls-Pw-7f3a9c21';
my $dir = PostgreSQL::Test::Utils::tempdir('tls_auth');
my $ca = GatekeeperTest::make_test_ca("$dir/ca");

# the relay's own copy of the password
my $relay_pw = "$dir/relay-password";
PostgreSQL::Test::Utils::append_to_file($relay_pw, "$password\n");
# gatekeeper's: readable by the server's OS user only (the tests run as
# that user, so this file is theirs)
my $pw_file = "$dir/smtp-password";
PostgreSQL::Test::Utils::append_to_file($pw_file, "$password\n");
chmod(0600, $pw_file) or die "chmod: $!";

my $relay = GatekeeperTest::start_relay(
	name => 'tls_auth',
	tls => $ca,
	require_tls => 1,
	auth => [ $user, $relay_pw ]);

my $node = GatekeeperTest::new_node(
	'tls_auth',
	smtp_url => $relay->{url},
	conf => "gatekeeper.helo_name = 'mta.example.com'\n"
	  . "gatekeeper.smtp_user = '$user'\n"
	  . "gatekeeper.smtp_password_file = '$pw_file'\n"
	  . "gatekeeper.smtp_ca_file = '$ca->{ca_file}'\n"
	  . "gatekeeper.smtp_connections = 2\n"
	  . "log_min_messages = 'debug1'\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gatekeeper');

$node->safe_psql(
	'postgres', q{
SELECT gatekeeper.enqueue('tls' || i || '@customer.example', 'Over TLS ' || i, E'.leading dot\nBody ' || i || E'\n') FROM generate_series(1, 3) AS i;
});
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT count(*) FROM gatekeeper.mail_status WHERE state = 'sent'",
		'3', 30),
	'every mail is sent over STARTTLS with AUTH')
  or diag($node->safe_psql('postgres', 'SELECT state, attempt, last_error FROM gatekeeper.mail_status'));

my @events = GatekeeperTest::relay_events($relay);
my @msgs = GatekeeperTest::relay_messages($relay);
is(scalar(@msgs), 3, 'the relay received three messages');
is(scalar(grep { $_->{tls} } @msgs), 3, 'all over TLS');
is(scalar(grep { ($_->{user} // '') eq $user } @msgs), 3, "all from the authenticated user $user");
my @auth = grep { $_->{event} eq 'auth' } @events;
ok(@auth >= 1, 'the worker logged in');
is(scalar(grep { !$_->{ok} } @auth), 0, 'with the right password every time');
like(join(',', map { $_->{mechanism} } @auth), qr/^(PLAIN|LOGIN)(,(PLAIN|LOGIN))*$/,
	'with AUTH PLAIN or LOGIN');

# aiosmtpd offers no PIPELINING: the client must wait for each reply
my @ahead = grep { $_->{event} eq 'command' && ($_->{ahead} // 0) > 0 } @events;
is(scalar(@ahead), 0, 'no command sent ahead of a reply: PIPELINING was not offered')
  or diag(join("\n", map { "$_->{line} ($_->{ahead} octets ahead)" } @ahead));

my %mid = map { split /\|/ } split /\n/,
  $node->safe_psql('postgres', 'SELECT recipient, message_id FROM gatekeeper.mail_status');
foreach my $m (@msgs)
{
	my $rcpt = $m->{rcpt}[0];
	is($m->{message_id}, $mid{$rcpt}, "$rcpt: its Message-ID");
	like(GatekeeperTest::normalize_text($m->{body}), qr/^\.leading dot\nBody \d$/,
		"$rcpt: the body intact (a leading dot un-stuffed)");
}

# the password, wherever something was written
my @forms = (
	$password,
	encode_base64("\0$user\0$password", ''),
	encode_base64($password, ''));
my $node_log = slurp_file($node->logfile);
my $relay_log = slurp_file($relay->{events}) . (-f $relay->{log} ? slurp_file($relay->{log}) : '');
my $errors = $node->safe_psql('postgres',
	"SELECT coalesce(string_agg(last_error, ' '), '') FROM gatekeeper.mail_status");
foreach my $f (@forms)
{
	unlike($node_log, qr/\Q$f\E/, 'the server log does not show the password (' . length($f) . ' chars form)');
	unlike($relay_log, qr/\Q$f\E/, 'the relay log does not show it');
	unlike($errors, qr/\Q$f\E/, 'no last_error shows it');
}
is( $node->safe_psql('postgres',
		"SELECT count(*) FROM pg_settings WHERE setting LIKE '%' || " . GatekeeperTest::sql_literal($password) . " || '%'"),
	'0', 'no setting holds the password');

$node->stop;
GatekeeperTest::stop_relay($relay);

done_testing();
