# Copyright: gatekeeper contributors

# The background worker cannot record that a mail went: the relay said
# 250, and the ack fails (here a trigger of the user's on mail_done; a
# deadlock with an application's transaction, or the disk, would do the
# same).  A worker that exited then would leave the mail claimed and
# unrecorded: its lease would run out and it would go again, a second
# copy at the recipient.
#
# The relay (t/relay.py) takes mail A at once.  A trigger on mail_done
# refuses A's outcome row while a row of public.refuse_done exists; the
# lease is 2 s, and the test reaps all the while, so a lease that ran out
# would be taken back at once.  After 4 s (two leases) the trigger lets
# the row in.
#
# What users rely on: A is sent on its first attempt and the relay holds
# it once; while recording fails the mail stays claimed (the worker keeps
# extending its lease), the worker goes on (the same process) and says
# why in the log and in worker_status; once the trigger lets it, the
# outcome is recorded.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $relay = GatekeeperTest::start_relay(name => 'record_failure');

my $node = GatekeeperTest::new_node(
	'record_failure',
	smtp_url => $relay->{url},
	naptime => '1s',
	conf => "gatekeeper.lease = '2s'\n");
$node->start;
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION gatekeeper;
CREATE TABLE public.refuse_done ();
INSERT INTO public.refuse_done DEFAULT VALUES;
-- counts the failed recordings: a sequence is not rolled back with them
CREATE SEQUENCE public.record_failures;
CREATE FUNCTION public.refuse_done() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog AS $$
BEGIN
	IF EXISTS (SELECT FROM public.refuse_done) THEN
		PERFORM nextval('public.record_failures');
		RAISE EXCEPTION 'mail_done refuses mail % for now', NEW.id
			USING HINT = 'The test lets it in later.';
	END IF;
	RETURN NEW;
END $$;
CREATE TRIGGER refuse_done BEFORE INSERT ON gatekeeper.mail_done
	FOR EACH ROW EXECUTE FUNCTION public.refuse_done();
});
my ($first_pid) = GatekeeperTest::worker_pids($node);
ok($first_pid, "the worker runs (pid $first_pid)");

my $reap = sub { $node->safe_psql('postgres', 'SELECT gatekeeper.reap()') };

my $a = $node->safe_psql('postgres',
	q{SELECT gatekeeper.enqueue('a@customer.example', 'Mail A', 'Hello')});

ok( GatekeeperTest::wait_for(
		sub {
			$reap->();
			$node->safe_psql('postgres', 'SELECT is_called FROM public.record_failures') eq 't';
		},
		30,
		'a recording failed'),
	'recording mail A\'s outcome failed');

# two leases long, the mail stays claimed on its first attempt
my $t0 = time;
my ($held, $state_seen) = (1, '');
while (time - $t0 < 4)
{
	$reap->();
	my $s = $node->safe_psql('postgres',
		"SELECT state || '/' || attempt FROM gatekeeper.mail_status WHERE id = $a");
	$held = 0 unless $s eq 'claimed/1';
	my $ws = $node->safe_psql('postgres', 'SELECT state FROM gatekeeper.worker_status LIMIT 1');
	$state_seen = $ws if $ws =~ /^recording outcomes failed/;
	select(undef, undef, undef, 0.2);
}
ok($held, 'the mail stayed claimed, on its first attempt, for two leases');
like(
	$state_seen,
	qr/^recording outcomes failed: mail_done refuses mail $a for now/,
	'worker_status said why');
like(
	slurp_file($node->logfile),
	qr/LOG:  gatekeeper worker could not record the outcomes of 1 mail: mail_done refuses mail $a for now\n.*DETAIL:  The worker holds them, and their claims, and records them again in \d+ ms; it claims no mail until then\.\n.*HINT:  The test lets it in later\./,
	'the log says why, and what the worker does');

$node->safe_psql('postgres', 'DELETE FROM public.refuse_done');
ok( GatekeeperTest::wait_for(
		sub {
			$reap->();
			$node->safe_psql('postgres',
				"SELECT state IN ('sent', 'failed') FROM gatekeeper.mail_status WHERE id = $a") eq 't';
		},
		90,
		'the outcome recorded'),
	'the outcome was recorded once the trigger let it in')
  or diag(GatekeeperTest::mail_states($node, "id = $a"));

GatekeeperTest::sent_once($node, $relay, $a, 'mail A');
is(scalar(GatekeeperTest::relay_messages($relay)), 1, 'the relay holds nothing else');
my ($pid) = GatekeeperTest::worker_pids($node);
is($pid // '', $first_pid, 'the worker went on: the same process');
is($node->safe_psql('postgres', 'SELECT state, sent_total FROM gatekeeper.worker_status LIMIT 1'),
	'idle|1', 'worker_status is idle again, and counted the mail sent once');

$node->stop;
GatekeeperTest::stop_relay($relay);
done_testing();
