# Copyright: gatekeeper contributors

# The background worker's housekeeping (reap the claims whose lease ran
# out, purge, have mail_live vacuumed) fails while mail the worker claimed
# is on the wire.  A worker that exited then would lose the relay's reply
# to that mail, and the mail would go again once its lease ran out.
#
# An external sender claims mail X (queue "ext", which the worker does not
# serve) with a 1 s lease and is never heard of again; a trigger of the
# user's on mail_live refuses X's way back while public.refuse_live holds
# its id, so every reap fails.  Meanwhile the worker
# sends mail B to a relay (t/relay.py) that answers its data after 12 s,
# well past the worker's housekeeping interval (5 s) and X's lease.
#
# What users rely on: B is sent on its first attempt and the relay holds
# it once; the worker went on (the same process) and said in the log why
# its housekeeping failed; once the trigger lets it, X is reaped and
# scheduled again.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $relay = GatekeeperTest::start_relay(name => 'housekeeping_failure', data_delay => 12);

my $node = GatekeeperTest::new_node(
	'housekeeping_failure',
	smtp_url => $relay->{url},
	naptime => '1s',
	conf => "gatekeeper.lease = '3s'\n" . "gatekeeper.smtp_timeout = '30s'\n");
$node->start;
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION gatekeeper;
SELECT gatekeeper.create_queue('ext', background => false);
CREATE TABLE public.refuse_live (id bigint);
-- counts the failed housekeeping passes: a sequence is not rolled back with them
CREATE SEQUENCE public.housekeeping_failures;
CREATE FUNCTION public.refuse_live() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog AS $$
BEGIN
	IF NEW.id IN (SELECT id FROM public.refuse_live) THEN
		PERFORM nextval('public.housekeeping_failures');
		RAISE EXCEPTION 'mail_live refuses mail % for now', NEW.id;
	END IF;
	RETURN NEW;
END $$;
CREATE TRIGGER refuse_live BEFORE INSERT ON gatekeeper.mail_live
	FOR EACH ROW EXECUTE FUNCTION public.refuse_live();
});
my ($first_pid) = GatekeeperTest::worker_pids($node);
ok($first_pid, "the worker runs (pid $first_pid)");

# X: claimed by an external sender that is never heard of again
my $x = $node->safe_psql(
	'postgres', q{
SELECT gatekeeper.enqueue('x@customer.example', 'Mail X', 'Hello', queue => 'ext')});
is( $node->safe_psql(
		'postgres',
		q{SELECT count(*) FROM gatekeeper.claim('external', 1, lease => '1 second', queues => '{ext}')}),
	'1',
	'mail X is claimed by an external sender, for 1 s');
$node->safe_psql('postgres', "INSERT INTO public.refuse_live VALUES ($x)");

my $b = $node->safe_psql('postgres',
	q{SELECT gatekeeper.enqueue('b@customer.example', 'Mail B', 'Hello')});

ok( GatekeeperTest::wait_for(
		sub {
			$node->safe_psql('postgres', 'SELECT is_called FROM public.housekeeping_failures') eq 't';
		},
		30,
		'a housekeeping pass failed'),
	'the worker\'s housekeeping failed');
ok( GatekeeperTest::wait_for(
		sub {
			$node->safe_psql('postgres', 'SELECT state FROM gatekeeper.worker_status LIMIT 1') =~
			  /^housekeeping failed: mail_live refuses mail $x for now/;
		},
		10,
		'worker_status naming the failed housekeeping'),
	'worker_status says why');
is( $node->safe_psql('postgres',
		"SELECT state || '/' || attempt FROM gatekeeper.mail_status WHERE id = $b"),
	'claimed/1',
	'while mail B was on the wire');

ok( GatekeeperTest::wait_for(
		sub {
			$node->safe_psql('postgres',
				"SELECT state IN ('sent', 'failed') FROM gatekeeper.mail_status WHERE id = $b") eq 't';
		},
		60,
		'mail B finished'),
	'mail B finished')
  or diag(GatekeeperTest::mail_states($node, "id IN ($b, $x)"));

GatekeeperTest::sent_once($node, $relay, $b, 'mail B');
is(scalar(GatekeeperTest::relay_messages($relay)), 1, 'the relay holds nothing else');
my ($pid) = GatekeeperTest::worker_pids($node);
is($pid // '', $first_pid, 'the worker went on: the same process');
like(
	slurp_file($node->logfile),
	qr/LOG:  gatekeeper worker's housekeeping failed: mail_live refuses mail $x for now\n.*DETAIL:  The worker goes on delivering, and tries again in \d+ ms\./,
	'the log says why, and what the worker does');

$node->safe_psql('postgres', 'DELETE FROM public.refuse_live');
ok( GatekeeperTest::wait_for(
		sub {
			$node->safe_psql('postgres',
				"SELECT state = 'scheduled' FROM gatekeeper.mail_status WHERE id = $x") eq 't';
		},
		90,
		'mail X reaped'),
	'mail X was reaped by the worker once the trigger let it')
  or diag(GatekeeperTest::mail_states($node, "id = $x"));
ok( GatekeeperTest::wait_for(
		sub {
			$node->safe_psql('postgres', 'SELECT state FROM gatekeeper.worker_status LIMIT 1') !~
			  /failed/;
		},
		10,
		'worker_status without the failure'),
	'worker_status no longer says housekeeping failed');

$node->stop;
GatekeeperTest::stop_relay($relay);
done_testing();
