# Copyright: gatekeeper contributors
#
# Where a user looks, not only in the server's log: CREATE EXTENSION and
# the first enqueue of a session say with a WARNING why no background
# worker will send the mail, naming the cause and the fix, for each
# setting that keeps it from going: the library not in
# shared_preload_libraries; the extension in a database the worker does
# not serve (gatekeeper.database names another); gatekeeper.smtp_url
# empty, or a value in postgresql.conf the server could not use.  Where
# the mail can go, nothing is said.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# the standard error of one psql session running $sql
sub warnings_of
{
	my ($node, $db, $sql) = @_;
	my ($out, $err) = ('', '');
	$node->psql($db, $sql, stdout => \$out, stderr => \$err, on_error_stop => 1);
	return $err;
}

my $enqueue = q{SELECT gatekeeper.enqueue('alice@example.com', 'Hello', 'Body');};

# not preloaded: no worker at all
my $plain = PostgreSQL::Test::Cluster->new('plain');
$plain->init;
$plain->start;
my $err = warnings_of($plain, 'postgres', 'CREATE EXTENSION gatekeeper');
like($err, qr/WARNING:  gatekeeper is not in shared_preload_libraries: no background worker sends this database's mail/,
	'not preloaded: CREATE EXTENSION says so');
like($err, qr/HINT:  Add gatekeeper to shared_preload_libraries in postgresql.conf/, '... with the fix');
$err = warnings_of($plain, 'postgres', $enqueue x 3);
my $n = () = $err =~ /WARNING:  gatekeeper is not in shared_preload_libraries/g;
is($n, 1, 'not preloaded: the first enqueue of a session says so, once');
$plain->stop;

# preloaded, serving database "postgres"
my $node = GatekeeperTest::new_node('warn', smtp_url => 'smtp://127.0.0.1:9');
$node->start;
is(warnings_of($node, 'postgres', "CREATE EXTENSION gatekeeper; $enqueue"), '',
	'in the worker\'s database with a relay set, nothing is said');

$node->safe_psql('postgres', 'CREATE DATABASE other');
$err = warnings_of($node, 'other', 'CREATE EXTENSION gatekeeper');
like($err, qr/WARNING:  the gatekeeper worker serves database "postgres", not this database "other"/,
	'another database: CREATE EXTENSION names the database the worker serves');
like($err, qr/HINT:  Set gatekeeper.database = 'other' in postgresql.conf and restart the server/,
	'... with the fix');
$err = warnings_of($node, 'other', $enqueue x 2);
$n = () = $err =~ /WARNING:  the gatekeeper worker serves database "postgres"/g;
is($n, 1, 'another database: the first enqueue of a session says so, once');

# no relay
$node->append_conf('postgresql.conf', "gatekeeper.smtp_url = ''");
$node->reload;
GatekeeperTest::poll_until($node, 'postgres', 'SHOW gatekeeper.smtp_url', '', 30);
$err = warnings_of($node, 'postgres', $enqueue);
like($err, qr/WARNING:  gatekeeper.smtp_url is empty: the gatekeeper worker sends no mail/,
	'no smtp_url: the first enqueue says so');
like($err, qr/HINT:  Set gatekeeper.smtp_url to your relay and reload/, '... with the fix');

# a value the server could not use at start (the issue's http://)
$node->append_conf('postgresql.conf', "gatekeeper.smtp_url = 'http://relay.example.com'");
$node->restart;
like($node->safe_psql('postgres', 'SELECT count(*) FROM pg_file_settings WHERE name = \'gatekeeper.smtp_url\''),
	qr/^\d+$/, 'the server started with it');
$err = warnings_of($node, 'postgres', $enqueue);
like($err, qr/WARNING:  gatekeeper.smtp_url is empty: the gatekeeper worker sends no mail/,
	'an unusable smtp_url in postgresql.conf: the first enqueue says so');
like($err, qr/DETAIL:  A value the server could not use when it started is ignored/,
	'... and that the value was ignored');

$node->stop;
done_testing();
