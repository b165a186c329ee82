# Copyright: gatekeeper contributors

# The background worker's session settings are its own, whatever ALTER
# DATABASE (or ALTER ROLE) gives every session of its database.  An
# application's database often carries a lock_timeout, a serializable
# default or an asynchronous commit that suit the application; in the
# worker each would break exactly-once:
#
#  - lock_timeout: the worker records a sent mail's outcome while a DBA's
#    lock (here a SHARE lock on mail_done, as CREATE INDEX takes) holds
#    the write back; a timeout would end the worker with the outcome not
#    recorded, and the mail would go again once its lease ran out;
#  - default_transaction_isolation = serializable: the claim would fail
#    with serialization errors under concurrent claimers;
#  - synchronous_commit = off: a claim committed but not yet flushed when
#    its mail went out would be lost in a crash, and the mail sent again.
#
# What users rely on: the mail is sent once, on its first attempt, and the
# worker went on (the same process) through the lock; the worker's claim
# ran in READ COMMITTED, with no lock or statement timeout, and committed
# at least with a local flush (a trigger of the user's on mail_live notes
# what the claim's transaction saw).

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $relay = GatekeeperTest::start_relay(name => 'session_settings');

my $node = GatekeeperTest::new_node(
	'session_settings',
	smtp_url => $relay->{url},
	naptime => '1s',
	conf => "gatekeeper.lease = '2s'\n");
$node->start;
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION gatekeeper;
CREATE TABLE public.claim_settings (isolation text, lock_timeout text,
	statement_timeout text, synchronous_commit text);
CREATE FUNCTION public.note_settings() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog AS $$
BEGIN
	INSERT INTO public.claim_settings
	VALUES (current_setting('transaction_isolation'), current_setting('lock_timeout'),
			current_setting('statement_timeout'), current_setting('synchronous_commit'));
	RETURN OLD;
END $$;
CREATE TRIGGER note_settings BEFORE DELETE ON gatekeeper.mail_live
	FOR EACH ROW EXECUTE FUNCTION public.note_settings();
ALTER DATABASE postgres SET lock_timeout = '50ms';
ALTER DATABASE postgres SET default_transaction_isolation = 'serializable';
ALTER DATABASE postgres SET synchronous_commit = off;
});
# the worker's session begins with the database's settings
$node->restart;
my ($first_pid) = GatekeeperTest::worker_pids($node);
ok($first_pid, "the worker runs (pid $first_pid)");

# a DBA's lock that holds back what the ack writes, for 3 s
my $dba = $node->background_psql('postgres');
$dba->query_safe('SET lock_timeout = 0; BEGIN; LOCK TABLE gatekeeper.mail_done IN SHARE MODE');

my $id = $node->safe_psql('postgres',
	q{SET lock_timeout = 0; SELECT gatekeeper.enqueue('a@customer.example', 'Mail A', 'Hello')});

ok( GatekeeperTest::wait_for(
		sub { scalar(GatekeeperTest::relay_messages($relay)) >= 1 }, 30,
		'the relay took the mail'),
	'the relay took the mail while mail_done was locked');
# the ack waits for the lock, well past the database's lock_timeout
sleep 3;
is( $node->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'gatekeeper worker' AND wait_event_type = 'Lock'"
	),
	'1',
	'the worker waits for the lock (the database\'s lock_timeout is 50 ms)');
$dba->query_safe('COMMIT');
$dba->quit;

ok( GatekeeperTest::wait_for(
		sub {
			$node->safe_psql('postgres', 'SET lock_timeout = 0; SELECT gatekeeper.reap()');
			$node->safe_psql('postgres',
				"SELECT state IN ('sent', 'failed') FROM gatekeeper.mail_status WHERE id = $id") eq 't';
		},
		30,
		'the mail finished'),
	'the mail finished once the lock was gone');

GatekeeperTest::sent_once($node, $relay, $id, 'the mail');
is(scalar(GatekeeperTest::relay_messages($relay)), 1, 'the relay holds nothing else');

my ($pid) = GatekeeperTest::worker_pids($node);
is($pid // '', $first_pid, 'the worker went on: the same process');

is( $node->safe_psql('postgres', 'SELECT * FROM public.claim_settings'),
	'read committed|0|0|local',
	'the claim ran in READ COMMITTED, without lock or statement timeout, committing with a local flush');

$node->stop;
GatekeeperTest::stop_relay($relay);
done_testing();
