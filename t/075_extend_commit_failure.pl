# Copyright: gatekeeper contributors

# The background worker's extension of the lease of mail it has on the
# wire fails at its commit: a deferred constraint trigger of the user's on
# mail_claim refuses it when the transaction commits, where a
# subtransaction cannot catch it.  A worker that exited then would lose
# the relay's reply, and the mail would go again once its lease ran out;
# a worker that took the lease as extended would let it run out.
#
# Mail A goes to a relay (t/relay.py) that answers its data after 14 s;
# the lease is 9 s, so the worker extends it after 6 s and tries again
# within 0.75 s when that fails.  The trigger
# refuses, at commit, every change of a lease while a row of
# public.refuse_extend exists; the test removes that row as soon as the first extension
# failed, well before the lease runs out, and reaps all the while.
#
# What users rely on: A is sent on its first attempt and the relay holds
# it once; the worker went on (the same process), said in the log and in
# worker_status why it could not extend, and extended the lease before it
# ran out.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $relay = GatekeeperTest::start_relay(name => 'extend_commit_failure', data_delay => 14);

my $node = GatekeeperTest::new_node(
	'extend_commit_failure',
	smtp_url => $relay->{url},
	naptime => '1s',
	conf => "gatekeeper.lease = '9s'\n" . "gatekeeper.smtp_timeout = '30s'\n");
$node->start;
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION gatekeeper;
CREATE TABLE public.refuse_extend ();
INSERT INTO public.refuse_extend DEFAULT VALUES;
-- counts the failed extensions: a sequence is not rolled back with them
CREATE SEQUENCE public.extend_failures;
CREATE FUNCTION public.refuse_extend() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog AS $$
BEGIN
	IF NEW.lease_until IS DISTINCT FROM OLD.lease_until
	   AND EXISTS (SELECT FROM public.refuse_extend) THEN
		PERFORM nextval('public.extend_failures');
		RAISE EXCEPTION 'mail_claim refuses a longer lease at commit';
	END IF;
	RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER refuse_extend AFTER UPDATE ON gatekeeper.mail_claim
	DEFERRABLE INITIALLY DEFERRED
	FOR EACH ROW EXECUTE FUNCTION public.refuse_extend();
});
my ($first_pid) = GatekeeperTest::worker_pids($node);
ok($first_pid, "the worker runs (pid $first_pid)");

my $reap = sub { $node->safe_psql('postgres', 'SELECT gatekeeper.reap()') };

my $a = $node->safe_psql('postgres',
	q{SELECT gatekeeper.enqueue('a@customer.example', 'Mail A', 'Hello')});

ok( GatekeeperTest::wait_for(
		sub {
			$reap->();
			$node->safe_psql('postgres', 'SELECT is_called FROM public.extend_failures') eq 't';
		},
		30,
		'an extension failed'),
	'extending mail A\'s lease failed');
ok( GatekeeperTest::wait_for(
		sub {
			$reap->();
			$node->safe_psql('postgres', 'SELECT state FROM gatekeeper.worker_status LIMIT 1') =~
			  /^extending leases failed: mail_claim refuses a longer lease/;
		},
		10,
		'worker_status naming the failed extension'),
	'worker_status says why');
$node->safe_psql('postgres', 'DELETE FROM public.refuse_extend');

ok( GatekeeperTest::wait_for(
		sub {
			$reap->();
			$node->safe_psql('postgres',
				"SELECT state IN ('sent', 'failed') FROM gatekeeper.mail_status WHERE id = $a") eq 't';
		},
		60,
		'mail A finished'),
	'mail A finished')
  or diag(GatekeeperTest::mail_states($node, "id = $a"));

GatekeeperTest::sent_once($node, $relay, $a, 'mail A');
is(scalar(GatekeeperTest::relay_messages($relay)), 1, 'the relay holds nothing else');
my ($pid) = GatekeeperTest::worker_pids($node);
is($pid // '', $first_pid, 'the worker went on: the same process');
my $log = slurp_file($node->logfile);
like(
	$log,
	qr/LOG:  gatekeeper worker could not extend the leases of 1 mail: mail_claim refuses a longer lease at commit\n.*DETAIL:  The worker tries again in \d+ ms;/,
	'the log says why, and what the worker does');
unlike($log, qr/no longer holds mail $a/, 'the lease never ran out');
unlike($node->safe_psql('postgres', 'SELECT state FROM gatekeeper.worker_status LIMIT 1'),
	qr/failed/, 'worker_status no longer says an extension failed');

$node->stop;
GatekeeperTest::stop_relay($relay);
done_testing();
