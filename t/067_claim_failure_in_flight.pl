# Copyright: gatekeeper contributors

# A claim of the background worker's that fails while mail it claimed
# before is on the wire.  The claim can fail for reasons that are not the
# worker's (here a trigger of the user's on mail_live; a lock or the disk
# would do the same), and a worker that exited then would lose the relay's
# reply to the mail on the wire: that mail's lease would run out and it
# would go again, a second copy at the recipient.
#
# A relay (t/relay.py) answers each message's data after 3 s.  Mail A is
# due at once; while its data waits for the reply, a "poison" mail P comes
# due, whose claim a trigger fails for as long as a row of public.poison_on
# exists.  The test reaps all the while, so that a lease that ran out is
# taken back at once.
#
# What users rely on: A is sent on its first attempt and the relay holds
# it once; the worker goes on (the same process) and says in the log and
# in worker_status why it could not claim; once the trigger lets it, P is
# claimed and sent once.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $relay = GatekeeperTest::start_relay(name => 'claim_in_flight', data_delay => 3);

my $node = GatekeeperTest::new_node(
	'claim_in_flight',
	smtp_url => $relay->{url},
	naptime => '1s',
	conf => "gatekeeper.lease = '2s'\n" . "gatekeeper.smtp_timeout = '20s'\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gatekeeper');

my ($first_pid) = GatekeeperTest::worker_pids($node);
ok($first_pid, "the worker runs (pid $first_pid)");

$node->safe_psql(
	'postgres', q{
CREATE TABLE public.poison (id bigint);
CREATE TABLE public.poison_on ();
INSERT INTO public.poison_on DEFAULT VALUES;
-- counts the failed claims: a sequence is not rolled back with them
CREATE SEQUENCE public.poison_failures;

CREATE FUNCTION public.poison_claim() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog AS $$
BEGIN
	IF OLD.id IN (SELECT id FROM public.poison)
	   AND EXISTS (SELECT FROM public.poison_on) THEN
		PERFORM nextval('public.poison_failures');
		RAISE EXCEPTION 'poison mail % may not be claimed yet', OLD.id
			USING ERRCODE = 'P0001', HINT = 'The test lets it go later.';
	END IF;
	RETURN OLD;
END $$;
CREATE TRIGGER poison_claim BEFORE DELETE ON gatekeeper.mail_live
	FOR EACH ROW EXECUTE FUNCTION public.poison_claim();
});

my $reap = sub { $node->safe_psql('postgres', 'SELECT gatekeeper.reap()') };

my $a = $node->safe_psql('postgres',
	q{SELECT gatekeeper.enqueue('a@customer.example', 'Mail A', 'Hello')});

# A's transaction is on the wire (its data follows the 354 at once), its
# reply 3 s away
ok( GatekeeperTest::wait_for(
		sub {
			grep { ($_->{event} // '') eq 'mail' } GatekeeperTest::relay_events($relay);
		},
		30,
		'mail A on the wire'),
	'mail A is on the wire');
select(undef, undef, undef, 0.5);

my $p = $node->safe_psql(
	'postgres', q{
INSERT INTO public.poison
SELECT gatekeeper.enqueue('poison@customer.example', 'Poison', 'Hello')
RETURNING id});

ok( GatekeeperTest::wait_for(
		sub {
			$reap->();
			$node->safe_psql('postgres', 'SELECT is_called FROM public.poison_failures') eq 't';
		},
		30,
		'a claim failed'),
	'the claim of the poison mail failed while mail A was on the wire');

my $state_seen = '';
ok( GatekeeperTest::wait_for(
		sub {
			$reap->();
			my $state = $node->safe_psql('postgres',
				'SELECT state FROM gatekeeper.worker_status LIMIT 1');
			$state_seen = $state if $state =~ /^claim failed/;
			$node->safe_psql('postgres',
				"SELECT state = 'sent' FROM gatekeeper.mail_status WHERE id = $a") eq 't';
		},
		60,
		'mail A sent'),
	'mail A was sent')
  or diag(GatekeeperTest::mail_states($node, "id IN ($a, $p)"));
like($state_seen, qr/^claim failed: poison mail $p may not be claimed yet/,
	'worker_status said why the worker could not claim');

my ($pid) = GatekeeperTest::worker_pids($node);
is($pid // '', $first_pid, 'the worker went on: the same process');
like(
	slurp_file($node->logfile),
	qr/LOG:  gatekeeper worker could not claim mail: poison mail $p may not be claimed yet\n.*DETAIL:  The worker goes on delivering the 1 mail it holds and claims again in \d+ ms\.\n.*HINT:  The test lets it go later\./,
	'the log says why the claim failed, what the worker does, and the error\'s hint');

# the trigger lets the poison mail go
$node->safe_psql('postgres', 'DELETE FROM public.poison_on');
ok( GatekeeperTest::wait_for(
		sub {
			$reap->();
			$node->safe_psql('postgres',
				"SELECT count(*) FILTER (WHERE state = 'sent') = 2 FROM gatekeeper.mail_status WHERE id IN ($a, $p)"
			) eq 't';
		},
		90,
		'both mails sent'),
	'the poison mail was claimed and sent once the trigger let it')
  or diag(GatekeeperTest::mail_states($node, "id IN ($a, $p)"));

GatekeeperTest::sent_once($node, $relay, $a, 'mail A');
GatekeeperTest::sent_once($node, $relay, $p, 'the poison mail');
is(scalar(GatekeeperTest::relay_messages($relay)), 2, 'the relay holds two messages, no other');
is($node->safe_psql('postgres', 'SELECT state FROM gatekeeper.worker_status LIMIT 1'),
	'idle', 'worker_status is idle again after a claim that passed');

$node->stop;
GatekeeperTest::stop_relay($relay);
done_testing();
