# Copyright: gatekeeper contributors

# The background worker cannot extend the lease of mail it has on the wire:
# a trigger of the user's on mail_claim refuses (a deadlock or the disk
# would do the same), first as a plain trigger, whose error a
# subtransaction catches, then as a deferred constraint trigger, which
# fails the transaction's commit.  A worker that exited then would lose
# the relay's reply, and the mail would go again once its lease ran out;
# a worker that took a lease as extended when the commit failed would let
# it run out.
#
# Each mail goes to a relay (t/relay.py) that answers its data after 14 s;
# the lease is 9 s, so the worker extends it after 6 s and tries again
# within 0.75 s when that fails.  The trigger refuses every change of a
# lease while a row of public.refuse_extend exists; the test removes that
# row as soon as the first extension failed, well before the lease runs
# out, and reaps all the while.
#
# What users rely on: each mail is sent on its first attempt and the relay
# holds it once; the worker went on (the same process), said in the log
# and in worker_status why it could not extend, and extended the lease
# before it ran out.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $relay = GatekeeperTest::start_relay(name => 'extend_failure', data_delay => 14);

my $node = GatekeeperTest::new_node(
	'extend_failure',
	smtp_url => $relay->{url},
	naptime => '1s',
	conf => "gatekeeper.lease = '9s'\n" . "gatekeeper.smtp_timeout = '30s'\n");
$node->start;
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION gatekeeper;
CREATE TABLE public.refuse_extend ();
-- counts the failed extensions: a sequence is not rolled back with them
CREATE SEQUENCE public.extend_failures;
CREATE FUNCTION public.refuse_extend() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog AS $$
BEGIN
	IF NEW.lease_until IS DISTINCT FROM OLD.lease_until
	   AND EXISTS (SELECT FROM public.refuse_extend) THEN
		PERFORM nextval('public.extend_failures');
		RAISE EXCEPTION 'mail_claim refuses a longer lease %', TG_ARGV[0];
	END IF;
	RETURN NEW;
END $$;
});
my ($first_pid) = GatekeeperTest::worker_pids($node);
ok($first_pid, "the worker runs (pid $first_pid)");

my $reap = sub { $node->safe_psql('postgres', 'SELECT gatekeeper.reap()') };
my $worker_state = sub {
	$node->safe_psql('postgres', 'SELECT state FROM gatekeeper.worker_status LIMIT 1');
};

my %trigger = (
	'in a statement' => q{
CREATE TRIGGER refuse_extend BEFORE UPDATE ON gatekeeper.mail_claim
	FOR EACH ROW EXECUTE FUNCTION public.refuse_extend('for now')},
	'at commit' => q{
CREATE CONSTRAINT TRIGGER refuse_extend AFTER UPDATE ON gatekeeper.mail_claim
	DEFERRABLE INITIALLY DEFERRED
	FOR EACH ROW EXECUTE FUNCTION public.refuse_extend('at commit')});

my $sent = 0;
foreach my $when ('in a statement', 'at commit')
{
	$node->safe_psql(
		'postgres', qq{
DROP TRIGGER IF EXISTS refuse_extend ON gatekeeper.mail_claim;
$trigger{$when};
INSERT INTO public.refuse_extend DEFAULT VALUES;
SELECT setval('public.extend_failures', 1, false);
});
	my $a = $node->safe_psql('postgres',
		q{SELECT gatekeeper.enqueue('a@customer.example', 'Mail A', 'Hello')});

	ok( GatekeeperTest::wait_for(
			sub {
				$reap->();
				$node->safe_psql('postgres', 'SELECT is_called FROM public.extend_failures') eq 't';
			},
			30,
			"an extension failed $when"),
		"extending mail $a\'s lease failed $when");
	ok( GatekeeperTest::wait_for(
			sub {
				$reap->();
				$worker_state->() =~ /^extending leases failed: mail_claim refuses a longer lease/;
			},
			10,
			'worker_status naming the failed extension'),
		"worker_status says why ($when)");
	$node->safe_psql('postgres', 'DELETE FROM public.refuse_extend');

	ok( GatekeeperTest::wait_for(
			sub {
				$reap->();
				$node->safe_psql('postgres',
					"SELECT state IN ('sent', 'failed') FROM gatekeeper.mail_status WHERE id = $a") eq 't';
			},
			60,
			"mail $a finished"),
		"mail $a finished")
	  or diag(GatekeeperTest::mail_states($node, "id = $a"));
	$sent++;

	GatekeeperTest::sent_once($node, $relay, $a, "mail $a");
	is(scalar(GatekeeperTest::relay_messages($relay)), $sent, 'the relay holds nothing else');
	my ($pid) = GatekeeperTest::worker_pids($node);
	is($pid // '', $first_pid, 'the worker went on: the same process');
	my $log = slurp_file($node->logfile);
	my $said = $when eq 'at commit' ? 'at commit' : 'for now';
	like(
		$log,
		qr/LOG:  gatekeeper worker could not extend the leases of 1 mail: mail_claim refuses a longer lease $said\n.*DETAIL:  The worker tries again in \d+ ms;/,
		"the log says why, and what the worker does ($when)");
	unlike($log, qr/no longer holds mail $a/, "the lease of mail $a never ran out");
	unlike($worker_state->(), qr/failed/, 'worker_status no longer says an extension failed');
}

$node->stop;
GatekeeperTest::stop_relay($relay);
done_testing();
