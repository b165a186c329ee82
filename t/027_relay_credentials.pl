# Copyright: gatekeeper contributors

# The relay password (issue 9, defect 2).  It lives in the file named by
# gatekeeper.smtp_password_file, which only the server's OS user may read,
# and in no setting:
#
#  - a member of pg_monitor (so of pg_read_all_settings) finds it through
#    no SHOW, current_setting or pg_settings, nor does a superuser: it is
#    not a setting's value; nor the login (gatekeeper.smtp_user), which
#    only a superuser sees;
#  - gatekeeper.smtp_url refuses a URL with a password in it, at reload
#    and at ALTER SYSTEM, and the log does not show the password;
#  - a password file that the group or others may read is refused, with
#    a clear log message, and no mail is sent;
#  - with a good file, mail goes to a relay that requires AUTH (aiosmtpd
#    on loopback), which sees the right login; a new password in the file
#    is read at reload.
# The password appears in no log line, error or recorded last_error.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $python = '/usr/bin/python3';
plan skip_all => 'python3-aiosmtpd is not installed'
  unless system($python, '-c', 'import aiosmtpd') == 0;

my $secret = 'Relay-Pw-5f3a9c';
my $secret2 = 'Relay-Pw-2-77d1e0';
my $port = PostgreSQL::Test::Cluster::get_free_port();
my $relay_log = "$PostgreSQL::Test::Utils::tmp_check/auth_relay.log";

# start the relay that accepts mailer/$password; returns once it listens
sub start_relay
{
	my ($password) = @_;
	my $pid = open(my $out, '-|', $python, "$FindBin::RealBin/auth_relay.py", $port, 'mailer',
		$password, $relay_log)
	  or die "could not start auth_relay.py: $!";
	my $ready = <$out>;
	die "auth_relay.py did not start" unless defined $ready && $ready =~ /ready/;
	return { pid => $pid, out => $out };
}

sub stop_relay
{
	my ($r) = @_;
	kill 'TERM', $r->{pid};
	close($r->{out});
}

my $relay = start_relay($secret);
END { kill 'TERM', $relay->{pid} if $relay; }

# whether the node's log, from $offset on, matches $re (within 30 s)
sub log_shows
{
	my ($node, $re, $offset) = @_;
	return GatekeeperTest::wait_for(
		sub { slurp_file($node->logfile, $offset // 0) =~ $re }, 30, "$re in the log");
}

my $pwfile = "$PostgreSQL::Test::Utils::tmp_check/relay_password";
sub write_password
{
	my ($password, $mode) = @_;
	open(my $fh, '>', $pwfile) or die "$pwfile: $!";
	print $fh "$password\n";
	close($fh);
	chmod($mode, $pwfile) or die "chmod $pwfile: $!";
}
write_password($secret, 0640);

my $node = GatekeeperTest::new_node(
	'credentials',
	smtp_url => "smtp://127.0.0.1:$port",
	conf => "gatekeeper.smtp_user = 'mailer'\n"
	  . "gatekeeper.smtp_password_file = '$pwfile'\n"
	  . "gatekeeper.smtp_timeout = '5s'\n");
$node->start;
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION gatekeeper;
CREATE ROLE watcher LOGIN IN ROLE pg_monitor;
});

sub relay_lines
{
	return () unless -e $relay_log;
	return split /\n/, slurp_file($relay_log);
}

#
# 1. A file the group may read: refused, nothing is sent
#
ok(log_shows($node, qr/password file .*relay_password.* has group or world access/),
	'a group-readable password file is refused, and the log says why');
$node->safe_psql('postgres',
	"SELECT gatekeeper.enqueue('first\@customer.example', 'First', 'Body')");
sleep(2);
is($node->safe_psql('postgres', "SELECT state FROM gatekeeper.mail_status"),
	'scheduled', 'no mail goes while the password file is refused');
is(scalar(grep { /^message/ } relay_lines()), 0, 'the relay has no message');

#
# 2. Mode 0600: read at reload, and the relay sees the right login
#
chmod(0600, $pwfile);
$node->reload;
ok( GatekeeperTest::poll_until(
		$node, 'postgres', "SELECT state FROM gatekeeper.mail_status", 'sent', 30),
	'with the file readable by the server only, the mail is sent');
is_deeply([ grep { /^auth/ } relay_lines() ], [ 'auth ok PLAIN mailer' ],
	'the relay saw one login, as mailer with the password from the file');
is(scalar(grep { /^message shop\@example.com first\@customer.example / } relay_lines()),
	1, 'the relay received the mail');

#
# 3. A new password: read from the file at reload
#
stop_relay($relay);
$relay = undef;
unlink($relay_log);
$relay = start_relay($secret2);
write_password($secret2, 0600);
$node->reload;
$node->safe_psql('postgres',
	"SELECT gatekeeper.enqueue('second\@customer.example', 'Second', 'Body')");
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT state FROM gatekeeper.mail_status WHERE recipient = 'second\@customer.example'",
		'sent', 30),
	'after a reload the new password from the file is used');
is_deeply([ grep { /^auth/ } relay_lines() ], [ 'auth ok PLAIN mailer' ],
	'the relay saw the login with the new password');

#
# 4. No role reads the password: it is in no setting
#
foreach my $role ('watcher', 'postgres')
{
	my $seen = $node->safe_psql(
		'postgres',
		"SELECT string_agg(name || '=' || setting, ' ') FROM pg_settings WHERE name LIKE 'gatekeeper.smtp%'",
		extra_params => [ '-U', $role ]);
	unlike($seen, qr/\Q$secret2\E/, "$role: pg_settings shows no password");
	my ($rc, $out, $err) = $node->psql(
		'postgres',
		"SHOW gatekeeper.smtp_password; SELECT current_setting('gatekeeper.smtp_password', true)",
		extra_params => [ '-U', $role ]);
	unlike("$out $err", qr/\Q$secret2\E/, "$role: SHOW and current_setting show no password");
	like($err, qr/unrecognized configuration parameter "gatekeeper.smtp_password"/,
		"$role: gatekeeper.smtp_password is not a setting");
}

# the login, the other half of the credentials: a superuser's only, though
# pg_monitor (pg_read_all_settings) reads superuser-only settings
# (pg_settings does not list it, for anyone: it is GUC_NO_SHOW_ALL)
my $user_sql = q{SHOW gatekeeper.smtp_user;
SELECT current_setting('gatekeeper.smtp_user');
SELECT count(*) FROM pg_settings WHERE setting LIKE '%mailer%'};
is($node->safe_psql('postgres', $user_sql, extra_params => [ '-U', 'watcher' ]),
	"(hidden)\n(hidden)\n0",
	'pg_monitor: SHOW, current_setting and pg_settings hide the relay login');
is($node->safe_psql('postgres', $user_sql),
	"mailer\nmailer\n0", 'a superuser sees it');

#
# 5. A password in gatekeeper.smtp_url is refused, and not logged
#
my $log_offset = -s $node->logfile;
$node->append_conf('postgresql.conf',
	"gatekeeper.smtp_url = 'smtp://mailer:$secret2\@127.0.0.1:$port'\n");
$node->reload;
ok(log_shows($node, qr/gatekeeper\.smtp_url must not contain a password/, $log_offset),
	'reload: a URL with a password is refused');
is($node->safe_psql('postgres', 'SHOW gatekeeper.smtp_url'),
	"smtp://127.0.0.1:$port", 'reload: the URL in force is unchanged');
my ($rc, $out, $err) = $node->psql('postgres',
	"ALTER SYSTEM SET gatekeeper.smtp_url = 'smtp://mailer:$secret2\@127.0.0.1:$port'");
isnt($rc, 0, 'ALTER SYSTEM: a URL with a password is refused');
like($err, qr/smtp_password_file/, 'ALTER SYSTEM: the error points to gatekeeper.smtp_password_file');

#
# The password, in whatever was logged or recorded
#
unlike(slurp_file($node->logfile), qr/\Q$secret\E|\Q$secret2\E/, 'the log shows no password');
is($node->safe_psql('postgres',
	"SELECT count(*) FROM gatekeeper.mail_status WHERE last_error ~ 'Relay-Pw'"), '0',
	'no last_error shows a password');

$node->stop;
stop_relay($relay);
$relay = undef;
done_testing();
