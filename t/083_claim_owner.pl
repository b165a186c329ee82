# Copyright: gatekeeper contributors

# A role with the worker grant cannot make the background worker send a
# mail twice (issue 44, item 4).  The attack: the role names a mail the
# background worker has on the wire ((id, attempt) is easy to guess; here
# it reads them) and shortens its lease with extend(id, attempt,
# '1 second'), then reap()s it once that ran out: the mail is scheduled
# again, claimed again, and the relay gets it twice.  Or it hands the mail
# back with unclaim(array[id], array[attempt], 'x', '0'), to the same end.
#
# A relay (t/relay.py) answers each message's data after 10 s, so both
# mails are on the wire while a role made as the README says
# (gatekeeper.grant(role, 'worker')) tries both, and a superuser tries
# them too; reap() runs all the while.  What users rely on: each attempt
# is refused with 42501 (no SQL caller changes a background worker's
# claim), reap() settles nothing (the leases have not run out), and each
# mail is sent on its first attempt, the relay holding its Message-ID
# once.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $relay = GatekeeperTest::start_relay(name => 'claim_owner', data_delay => 10);

my $node = GatekeeperTest::new_node(
	'claim_owner',
	smtp_url => $relay->{url},
	naptime => '1s',
	conf => "gatekeeper.smtp_timeout = '30s'\n");
$node->start;
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION gatekeeper;
CREATE ROLE sender LOGIN;
SELECT gatekeeper.grant('sender', 'worker');
});

# sql as role (a superuser when undef): its output, or its error's SQLSTATE
sub run_as
{
	my ($role, $sql) = @_;
	my ($ret, $out, $err) = $node->psql(
		'postgres', "\\set VERBOSITY verbose\n$sql",
		extra_params => [ defined $role ? ('-U', $role) : () ]);
	return $out if $ret == 0;
	return $err =~ /ERROR:  ([0-9A-Z]{5}):/ ? "error $1" : "error: $err";
}

my $mail_a = $node->safe_psql('postgres',
	q{SELECT gatekeeper.enqueue('a@customer.example', 'Mail A', 'Hello')});
my $mail_b = $node->safe_psql('postgres',
	q{SELECT gatekeeper.enqueue('b@customer.example', 'Mail B', 'Hello')});

# both on the wire: claimed, their MAIL FROM at the relay, no reply yet
ok( GatekeeperTest::wait_for(
		sub {
			(grep { $_->{event} eq 'mail' } GatekeeperTest::relay_events($relay)) >= 2;
		},
		30,
		'both mails at the relay'),
	'the relay holds both mails, not yet answered');
my ($a_attempt, $a_worker) = split /\|/,
  $node->safe_psql('postgres',
	"SELECT attempt, worker FROM gatekeeper.mail_status WHERE id = $mail_a AND state = 'claimed'");
my ($b_attempt) =
  $node->safe_psql('postgres',
	"SELECT attempt FROM gatekeeper.mail_status WHERE id = $mail_b AND state = 'claimed'");
is($a_attempt . '/' . $b_attempt, '1/1', 'both mails are claimed, at attempt 1');
like($a_worker, qr/^bgworker:/, 'by the background worker');
is( run_as(
		undef,
		"SELECT string_agg(DISTINCT owner::text, ',') FROM gatekeeper.mail_claim WHERE $mail_a BETWEEN lo AND hi OR $mail_b BETWEEN lo AND hi"
	),
	'0',
	'its claims are the background worker\'s (owner 0)');

# the attack: shorten the lease of A, let it run out, reap
is(run_as('sender', "SELECT gatekeeper.extend($mail_a, $a_attempt, '1 second')"),
	'error 42501', 'the worker role\'s extend of the background worker\'s claim: 42501');
is(run_as(undef, "SELECT gatekeeper.extend($mail_a, $a_attempt, '1 second')"),
	'error 42501', 'a superuser\'s: 42501 too');
sleep(2);
is(run_as('sender', 'SELECT gatekeeper.reap()'), '0', 'reap() settles nothing');

# and hand B back
is( run_as('sender',
		"SELECT gatekeeper.unclaim(ARRAY[$mail_b]::bigint[], ARRAY[$b_attempt], 'x', '0')"),
	'error 42501',
	'the worker role\'s unclaim of the background worker\'s claim: 42501');
is( run_as(undef, "SELECT gatekeeper.unclaim(ARRAY[$mail_b]::bigint[], ARRAY[$b_attempt], 'x', '0')"),
	'error 42501',
	'a superuser\'s: 42501 too');
is( run_as('sender', "SELECT gatekeeper.ack($mail_b, $b_attempt)"),
	'error 42501',
	'nor may the worker role ack it');
is( $node->safe_psql('postgres',
		"SELECT string_agg(state || '/' || attempt, ',' ORDER BY id) FROM gatekeeper.mail_status WHERE id IN ($mail_a, $mail_b)"
	),
	'claimed/1,claimed/1',
	'both mails are still the background worker\'s claims');

ok( GatekeeperTest::wait_for(
		sub {
			run_as('sender', 'SELECT gatekeeper.reap()');
			$node->safe_psql('postgres',
				"SELECT count(*) FROM gatekeeper.mail_status WHERE id IN ($mail_a, $mail_b) AND state IN ('sent', 'failed')"
			) eq '2';
		},
		60,
		'both mails finished'),
	'both mails finished')
  or diag(GatekeeperTest::mail_states($node, "id IN ($mail_a, $mail_b)"));

GatekeeperTest::sent_once($node, $relay, $mail_a, "mail A ($mail_a)");
GatekeeperTest::sent_once($node, $relay, $mail_b, "mail B ($mail_b)");
is(scalar(GatekeeperTest::relay_messages($relay)), 2, 'the relay holds nothing else');

$node->stop;
GatekeeperTest::stop_relay($relay);
done_testing();
