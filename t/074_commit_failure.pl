# Copyright: gatekeeper contributors

# The background worker's transaction fails at its commit, not in a
# statement: here deferred constraint triggers of the user's, which run
# when the transaction commits (the live counts written just before the
# commit, or a NOTIFY queue that is full, fail there too).  A
# subtransaction cannot catch that; a worker that exited would lose the
# reply of the mail on the wire, or the outcome of a mail that went, and
# the mail would go again once its lease ran out.
#
# A relay (t/relay.py) answers each message's data after 3 s; the lease is
# 2 s, and the test reaps all the while, so a lease that ran out would be
# taken back at once.
#
# 1. A claim that fails at its commit while mail A is on the wire: a
#    deferred trigger on mail_live refuses the claim of a "poison" mail P
#    while a row of public.poison_on exists.  The claim took P and handed
#    it to the worker before the commit failed: the worker must drop it
#    unsent, since no claim of P was kept.
# 2. A recording that fails at its commit: a deferred trigger on
#    mail_done refuses mail B's outcome while a row of public.refuse_done
#    exists.  The worker must keep B's outcome and B's claim.
#
# What users rely on: every mail is sent on its first attempt and the
# relay holds it once; P is not sent while its claim cannot commit; the
# worker goes on (the same process) and says why in the log and in
# worker_status.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $relay = GatekeeperTest::start_relay(name => 'commit_failure', data_delay => 3);

my $node = GatekeeperTest::new_node(
	'commit_failure',
	smtp_url => $relay->{url},
	naptime => '1s',
	conf => "gatekeeper.lease = '2s'\n" . "gatekeeper.smtp_timeout = '20s'\n");
$node->start;
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION gatekeeper;
CREATE TABLE public.poison (id bigint);
CREATE TABLE public.poison_on ();
INSERT INTO public.poison_on DEFAULT VALUES;
CREATE TABLE public.refuse_done ();
-- count the failed commits: a sequence is not rolled back with them
CREATE SEQUENCE public.poison_failures;
CREATE SEQUENCE public.record_failures;

CREATE FUNCTION public.poison_claim() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog AS $$
BEGIN
	IF OLD.id IN (SELECT id FROM public.poison)
	   AND EXISTS (SELECT FROM public.poison_on) THEN
		PERFORM nextval('public.poison_failures');
		RAISE EXCEPTION 'poison mail % may not be claimed yet', OLD.id
			USING HINT = 'The test lets it go later.';
	END IF;
	RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER poison_claim AFTER DELETE ON gatekeeper.mail_live
	DEFERRABLE INITIALLY DEFERRED
	FOR EACH ROW EXECUTE FUNCTION public.poison_claim();

CREATE FUNCTION public.refuse_done() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog AS $$
BEGIN
	IF EXISTS (SELECT FROM public.refuse_done) THEN
		PERFORM nextval('public.record_failures');
		RAISE EXCEPTION 'mail_done refuses mail % at commit for now', NEW.id;
	END IF;
	RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER refuse_done AFTER INSERT ON gatekeeper.mail_done
	DEFERRABLE INITIALLY DEFERRED
	FOR EACH ROW EXECUTE FUNCTION public.refuse_done();
});
my ($first_pid) = GatekeeperTest::worker_pids($node);
ok($first_pid, "the worker runs (pid $first_pid)");

my $reap = sub { $node->safe_psql('postgres', 'SELECT gatekeeper.reap()') };
my $worker_state = sub {
	$node->safe_psql('postgres', 'SELECT state FROM gatekeeper.worker_status LIMIT 1');
};

# 1. the claim of P fails at its commit while A is on the wire
my $a = $node->safe_psql('postgres',
	q{SELECT gatekeeper.enqueue('a@customer.example', 'Mail A', 'Hello')});
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

my $state_seen = '';
ok( GatekeeperTest::wait_for(
		sub {
			$reap->();
			my $s = $worker_state->();
			$state_seen = $s if $s =~ /^claim failed/;
			$node->safe_psql('postgres',
				"SELECT state = 'sent' FROM gatekeeper.mail_status WHERE id = $a") eq 't'
			  && $node->safe_psql('postgres', 'SELECT is_called FROM public.poison_failures') eq 't';
		},
		60,
		'mail A sent, and a claim of P failed at its commit'),
	'mail A was sent while the claim of the poison mail failed at its commit')
  or diag(GatekeeperTest::mail_states($node, "id IN ($a, $p)"));
like($state_seen, qr/^claim failed: poison mail $p may not be claimed yet/,
	'worker_status said why the worker could not claim');
like(
	slurp_file($node->logfile),
	qr/LOG:  gatekeeper worker could not claim mail: poison mail $p may not be claimed yet\n.*DETAIL:  The worker goes on delivering the \d+ mails? it holds and claims again in \d+ ms\.\n.*HINT:  The test lets it go later\./,
	'the log says why the claim failed, and what the worker does');
# several claims of P failed by now, each after the claim had taken it
ok( GatekeeperTest::wait_for(
		sub { $node->safe_psql('postgres', "SELECT last_value >= 2 FROM public.poison_failures") eq 't' },
		30, 'a second claim of P failed'),
	'the claim of P failed at its commit again');
is( scalar(
		grep { ($_->{event} // '') eq 'command' && ($_->{line} // '') =~ /^RCPT TO:<poison\@/i }
		  GatekeeperTest::relay_events($relay)),
	0,
	'the poison mail never went on the wire while no claim of it was kept');
is($node->safe_psql('postgres', "SELECT state || '/' || attempt FROM gatekeeper.mail_status WHERE id = $p"),
	'scheduled/0', 'the poison mail is still scheduled, never attempted');

# 2. the recording of B's outcome fails at its commit
$node->safe_psql('postgres', 'DELETE FROM public.poison_on; INSERT INTO public.refuse_done DEFAULT VALUES');
my $b = $node->safe_psql('postgres',
	q{SELECT gatekeeper.enqueue('b@customer.example', 'Mail B', 'Hello')});
ok( GatekeeperTest::wait_for(
		sub {
			$reap->();
			$node->safe_psql('postgres', 'SELECT is_called FROM public.record_failures') eq 't';
		},
		60,
		'a recording failed at its commit'),
	'recording an outcome failed at its commit');

# two leases long, B stays claimed on its first attempt
my $t0 = time;
my $held = 1;
$state_seen = '';
while (time - $t0 < 4)
{
	$reap->();
	$held = 0
	  unless $node->safe_psql('postgres',
		"SELECT state || '/' || attempt FROM gatekeeper.mail_status WHERE id = $b") eq 'claimed/1';
	my $s = $worker_state->();
	$state_seen = $s if $s =~ /^recording outcomes failed/;
	select(undef, undef, undef, 0.2);
}
ok($held, 'mail B stayed claimed, on its first attempt, for two leases');
like($state_seen, qr/^recording outcomes failed: mail_done refuses mail \d+ at commit/,
	'worker_status said why');
like(
	slurp_file($node->logfile),
	qr/LOG:  gatekeeper worker could not record the outcomes of \d+ mails?: mail_done refuses mail \d+ at commit for now\n.*DETAIL:  The worker holds them, and their claims, and records them again in \d+ ms; it claims no mail until then\./,
	'the log says why, and what the worker does');

$node->safe_psql('postgres', 'DELETE FROM public.refuse_done');
ok( GatekeeperTest::wait_for(
		sub {
			$reap->();
			$node->safe_psql('postgres',
				"SELECT count(*) FILTER (WHERE state = 'sent') = 3 FROM gatekeeper.mail_status WHERE id IN ($a, $p, $b)"
			) eq 't';
		},
		90,
		'every mail sent'),
	'every mail was sent once the triggers let them')
  or diag(GatekeeperTest::mail_states($node, "id IN ($a, $p, $b)"));

GatekeeperTest::sent_once($node, $relay, $a, 'mail A');
GatekeeperTest::sent_once($node, $relay, $p, 'the poison mail');
GatekeeperTest::sent_once($node, $relay, $b, 'mail B');
is(scalar(GatekeeperTest::relay_messages($relay)), 3, 'the relay holds three messages, no other');
is( scalar(
		grep { ($_->{event} // '') eq 'command' && ($_->{line} // '') =~ /^RCPT TO:<poison\@/i }
		  GatekeeperTest::relay_events($relay)),
	1,
	'the poison mail went on the wire once');
my ($pid) = GatekeeperTest::worker_pids($node);
is($pid // '', $first_pid, 'the worker went on: the same process');
is($worker_state->(), 'idle', 'worker_status is idle again');

$node->stop;
GatekeeperTest::stop_relay($relay);
done_testing();
