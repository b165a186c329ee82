# Copyright: gatekeeper contributors

# gatekeeper.helo_name is the name the worker gives in EHLO.  A private
# Postfix smtpd with smtpd_helo_required and reject_non_fqdn_helo_hostname
# refuses every mail of a client that greets with a bare host name (504
# 5.5.2 at RCPT TO), as real relays do; with helo_name =
# 'mta.example.com' every mail is accepted and Postfix logged that name
# for every session of the worker.  The setting is reloadable (sighup).

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $pf = GatekeeperTest::start_postfix(name => 'pf_helo');
my $node = GatekeeperTest::new_node(
	'helo',
	smtp_url => $pf->{url},
	conf => "gatekeeper.helo_name = 'mta.example.com'\n"
	  . "gatekeeper.smtp_connections = 2\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gatekeeper');

my ($ret, $out, $err) = $node->psql('postgres', 'SHOW gatekeeper.helo_name');
is($out, 'mta.example.com', 'gatekeeper.helo_name is a setting') or diag($err);

$node->safe_psql('postgres',
	q{SELECT gatekeeper.enqueue('helo' || i || '@customer.example', 'Hello ' || i, 'Body ' || i) FROM generate_series(1, 3) AS i}
);
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT count(*) FROM gatekeeper.mail_status WHERE state IN ('scheduled', 'claimed')",
		'0', 30),
	'the worker finished every mail');
is( $node->safe_psql('postgres',
		"SELECT string_agg(state || coalesce(' (' || last_error || ')', ''), ', ') FROM gatekeeper.mail_status WHERE state <> 'sent'"
	),
	'',
	'Postfix accepted every mail');
unlike(slurp_file($pf->{log}), qr/Helo command rejected/, 'Postfix refused no HELO');

# a new name after a reload
$node->append_conf('postgresql.conf', "gatekeeper.helo_name = 'out.example.org'\n");
$node->reload;
ok( GatekeeperTest::poll_until(
		$node, 'postgres', 'SHOW gatekeeper.helo_name', 'out.example.org', 10),
	'the new name is loaded');
# connections opened before the reload may stay open with the old name;
# what matters is that the worker keeps sending
my $id = $node->safe_psql('postgres',
	q{SELECT gatekeeper.enqueue('after-reload@customer.example', 'After', 'Body')});
ok( GatekeeperTest::poll_until(
		$node, 'postgres', "SELECT state FROM gatekeeper.mail_status WHERE id = $id", 'sent', 30),
	'the mail after the reload is sent');

# Postfix logs a session (and the HELO name it gave) when it ends: stop
# the node to end the worker's
$node->stop;
GatekeeperTest::wait_for(sub { GatekeeperTest::postfix_command_count($pf, 'mail') >= 4 },
	15, 'the worker\'s sessions in Postfix\'s log');
my @helos = map { $_->{helo} // '(none)' }
  grep { ($_->{mail} // '') ne '' } GatekeeperTest::postfix_sessions($pf);
ok(scalar(@helos) >= 1, 'Postfix logged the worker\'s sessions');
my %names = map { $_ => 1 } @helos;
ok($names{'mta.example.com'}, 'the worker greeted with EHLO mta.example.com');
is_deeply([ sort grep { $_ ne 'out.example.org' } keys %names ], ['mta.example.com'],
	'and with no other name but the one set after the reload');
GatekeeperTest::stop_postfix($pf);

done_testing();
