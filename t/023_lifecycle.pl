# Copyright: gatekeeper contributors
# gatekeeper-test: alone

# The background worker through the life of a server, against real SMTP
# relays (Postfix's smtp-sink on loopback):
#
#  - it shows in pg_stat_activity as a 'gatekeeper worker';
#  - before CREATE EXTENSION it waits quietly: no errors, no restarts;
#  - after CREATE EXTENSION it delivers;
#  - a reload that changes gatekeeper.smtp_url sends the next mail to the
#    new relay, without a restart; a URL holding a password is refused,
#    kept out of the log, and non-superusers cannot read the settings;
#  - DROP EXTENSION while it delivers a batch returns, the worker carries
#    on quietly, and delivers again after CREATE EXTENSION;
#  - DROP DATABASE ... WITH (FORCE) of its database returns promptly; the
#    worker then waits for the database without a crash loop, and delivers
#    again once the database and the extension are back.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $db = 'mail';
my $secret = 'S3cret-Pw-7f2a';

my $sink_a = GatekeeperTest::start_sink(name => 'a');
# -a: no AUTH offered, so libcurl sends no credentials (smtp-sink answers
# AUTH with 250, which is no SMTP AUTH success)
my $sink_b = GatekeeperTest::start_sink(name => 'b', args => ['-a']);

my $node = GatekeeperTest::new_node('lifecycle', sink => $sink_a, database => $db);
$node->start;
$node->safe_psql('postgres', "CREATE DATABASE $db");
# start again so that the worker finds its database at once
$node->restart;

my $log_offset = -s $node->logfile;

# mails to "$tag<n>@customer.example" that the relay $sink holds
sub at_sink
{
	my ($sink, $tag) = @_;
	return scalar(grep { ($_->{rcpt}[0] // '') =~ /^<\Q$tag\E\d+\@/ }
		  GatekeeperTest::sink_messages($sink));
}

# enqueue $n mails tagged $tag in one transaction
sub enqueue
{
	my ($tag, $n) = @_;
	$node->safe_psql($db, qq{
INSERT INTO gatekeeper.mail (recipient, subject, body)
SELECT '$tag' || i || '\@customer.example', 'Mail ' || i, 'Body ' || i
  FROM generate_series(1, $n) AS i});
	return;
}

sub all_sent_query
{
	my ($tag) = @_;
	return "SELECT count(*) FILTER (WHERE state <> 'sent') = 0 AND count(*) > 0 FROM gatekeeper.mail_status WHERE recipient LIKE '$tag%'";
}

sub log_since
{
	my ($offset) = @_;
	return slurp_file($node->logfile, $offset);
}

sub problems
{
	my ($log) = @_;
	return join("\n", grep { /\b(ERROR|WARNING|FATAL|PANIC):|terminated by signal|was terminated/ } split /\n/, $log);
}

#
# The worker in pg_stat_activity, waiting for the extension
#
ok( GatekeeperTest::poll_until(
		$node, $db,
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'gatekeeper worker' AND datname = '$db'",
		'1', 30),
	'pg_stat_activity shows one gatekeeper worker in its database');
my ($pid) = GatekeeperTest::worker_pids($node);
is( $node->safe_psql(
		$db,
		"SELECT application_name FROM pg_stat_activity WHERE pid = $pid"),
	'gatekeeper worker 1',
	'the worker is named');
ok( GatekeeperTest::poll_until(
		$node, $db,
		"SELECT query ~ 'CREATE EXTENSION' FROM pg_stat_activity WHERE pid = $pid",
		't', 30),
	'without the extension, the worker says it waits for CREATE EXTENSION');

# nothing is to happen: let a few naptimes pass
sleep(3);
is(problems(log_since($log_offset)), '', 'without the extension, the worker logs no errors');
is(join(',', GatekeeperTest::worker_pids($node)), $pid,
	'without the extension, the worker is not restarted');

#
# CREATE EXTENSION: the worker delivers
#
$node->safe_psql($db, 'CREATE EXTENSION gatekeeper');
enqueue('first', 3);
ok(GatekeeperTest::poll_until($node, $db, all_sent_query('first'), 't', 30),
	'after CREATE EXTENSION the mail is sent');
ok(GatekeeperTest::wait_for(sub { at_sink($sink_a, 'first') == 3 }, 10),
	'relay A received it');

#
# SIGHUP: a new relay
#
$log_offset = -s $node->logfile;
$node->safe_psql('postgres',
	"ALTER SYSTEM SET gatekeeper.smtp_url = '$sink_b->{url}'; SELECT pg_reload_conf()");
# the postmaster signals its children right after it logs the change
$node->wait_for_log(qr/parameter "gatekeeper\.smtp_url" changed/, $log_offset);
enqueue('second', 3);
ok(GatekeeperTest::poll_until($node, $db, all_sent_query('second'), 't', 30),
	'after the reload the mail is sent');
ok(GatekeeperTest::wait_for(sub { at_sink($sink_b, 'second') == 3 }, 10),
	'the mail went to relay B');
is(at_sink($sink_a, 'second'), 0, 'none went to relay A');
is(join(',', GatekeeperTest::worker_pids($node)), $pid, 'the reload did not restart the worker');

# a URL with credentials: refused (the password goes in a file), never
# in the log, and the relay in force stays
(my $url_with_password = $sink_b->{url}) =~ s{://}{://mailer:$secret\@};
$log_offset = -s $node->logfile;
my ($rc, $out, $err) = $node->psql('postgres',
	"ALTER SYSTEM SET gatekeeper.smtp_url = '$url_with_password'");
isnt($rc, 0, 'a URL with a password is refused');
unlike($out . $err, qr/\Q$secret\E/, 'the refusal does not repeat the password');
$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
enqueue('third', 2);
ok(GatekeeperTest::poll_until($node, $db, all_sent_query('third'), 't', 30),
	'the mail is still sent');
ok(GatekeeperTest::wait_for(sub { at_sink($sink_b, 'third') == 2 }, 10),
	'the mail went to relay B');
unlike(log_since($log_offset), qr/\Q$secret\E/, 'the password in the URL is not logged');

$node->safe_psql('postgres', 'CREATE ROLE app LOGIN');
($rc, $out, $err) = $node->psql('postgres', 'SHOW gatekeeper.smtp_url',
	extra_params => [ '-U', 'app' ]);
isnt($rc, 0, 'a non-superuser cannot SHOW gatekeeper.smtp_url');
is( $node->safe_psql(
		'postgres',
		"SET ROLE app; SELECT count(*) FROM pg_settings WHERE name ~ '^gatekeeper\\.smtp_(url|user|password_file)\$'"
	),
	'0',
	'pg_settings shows a non-superuser no relay setting');

#
# DROP EXTENSION while the worker delivers, then CREATE EXTENSION
#
$log_offset = -s $node->logfile;
enqueue('busy', 3000);
ok( GatekeeperTest::poll_until(
		$node, $db,
		"SELECT query ~ '^delivering' FROM pg_stat_activity WHERE backend_type = 'gatekeeper worker'",
		't', 30),
	'the worker is delivering');
my $t0 = time;
my $timed_out = 0;
($rc, $out, $err) = $node->psql($db, 'DROP EXTENSION gatekeeper',
	timeout => 30, timed_out => \$timed_out);
my $took = time - $t0;
ok(!$timed_out && $rc == 0, sprintf('DROP EXTENSION returns while the worker delivers (%.1f s)', $took))
  or diag("rc $rc: $err");
ok( eval {
		$node->wait_for_log(qr/extension gatekeeper was dropped/, $log_offset);
		1;
	},
	'the worker notices the extension is gone');
# nothing is to happen: let a few naptimes pass
sleep(2);
is(problems(log_since($log_offset)), '', 'after DROP EXTENSION the worker logs no errors');
my @pids = GatekeeperTest::worker_pids($node);
is(scalar(@pids), 1, 'after DROP EXTENSION a worker runs');
note("worker pid before $pid, after @pids");

$node->safe_psql($db, 'CREATE EXTENSION gatekeeper');
$t0 = time;
enqueue('fourth', 3);
ok(GatekeeperTest::poll_until($node, $db, all_sent_query('fourth'), 't', 30),
	'after CREATE EXTENSION again the mail is sent');
note(sprintf('sent %.1f s after the enqueue', time - $t0));
ok(GatekeeperTest::wait_for(sub { at_sink($sink_b, 'fourth') == 3 }, 10),
	'the relay received it');
is(problems(log_since($log_offset)), '', 'no errors after CREATE EXTENSION');

#
# DROP DATABASE ... WITH (FORCE)
#
$log_offset = -s $node->logfile;
$t0 = time;
($rc, $out, $err) = $node->psql('postgres', "DROP DATABASE $db WITH (FORCE)",
	timeout => 30, timed_out => \$timed_out);
$took = time - $t0;
ok(!$timed_out && $rc == 0, sprintf('DROP DATABASE ... WITH (FORCE) returns (%.1f s)', $took))
  or diag("rc $rc: $err");
cmp_ok($took, '<', 10, 'promptly');

# the worker is restarted, cannot connect, and then waits unconnected
ok( eval {
		$node->wait_for_log(qr/gatekeeper worker is waiting for database "$db"/, $log_offset);
		1;
	},
	'the worker waits for its database');
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'gatekeeper worker' AND datname IS NULL AND query ~ 'waiting for database'",
		'1', 30),
	'pg_stat_activity shows the worker waiting for its database');
my $log = log_since($log_offset);
my $fatals = () = $log =~ /FATAL:  database "$db" does not exist/g;
cmp_ok($fatals, '<=', 1, "the worker failed to connect at most once ($fatals)");
unlike($log, qr/terminated by signal|PANIC:|server process .* was terminated/,
	'no crash');

# the database comes back: so does delivery
$log_offset = -s $node->logfile;
my $created = time;
$node->safe_psql('postgres', "CREATE DATABASE $db");
# a worker waiting for its database connects within a second or two, not
# after a restart (bgw_restart_time is 10 s): the quick start's createdb
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'gatekeeper worker' AND datname = '$db'",
		'1', 30),
	'the worker connects to the new database');
my $found_after = time - $created;
cmp_ok($found_after, '<', 2.5, sprintf('the worker found its database %.2f s after CREATE DATABASE', $found_after));
$node->safe_psql($db, 'CREATE EXTENSION gatekeeper');
enqueue('fifth', 2);
ok(GatekeeperTest::poll_until($node, $db, all_sent_query('fifth'), 't', 60),
	'with the database back the mail is sent');
ok(GatekeeperTest::wait_for(sub { at_sink($sink_b, 'fifth') == 2 }, 10),
	'the relay received it');
is(problems(log_since($log_offset)), '', 'no errors once the database is back');

$node->stop;
GatekeeperTest::stop_sink($sink_a);
GatekeeperTest::stop_sink($sink_b);

done_testing();
