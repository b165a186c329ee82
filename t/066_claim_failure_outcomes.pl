# Copyright: gatekeeper contributors

# The background worker records what became of the mail it sent in the
# transaction of its next claim: one commit, one WAL flush, where there
# were two.  A claim that fails there must not take those outcomes with
# it: their mail went, and undone they would go again.
#
# A relay (t/relay.py) answers each message's data after 2 s; the worker
# keeps one mail claimed at a time (gatekeeper.batch_size = 1), so it
# claims again only once that mail's outcome is in, and records it in
# that claim's transaction, with no other mail on the wire.  Two mails are
# due at once, a "poison" mail a second later.  A trigger of the user's on
# mail_live fails the claim of the poison mail, but only in a transaction
# that has already written a finished mail: the claim that records the
# first mail's outcome takes the second mail (it is due first) and
# passes; the claim that records the second's takes the poison mail and
# fails; the poison mail's next claim, a backoff later, has no outcomes
# with it and passes.
#
# What users rely on: the two mails are sent on their first attempt and
# the relay holds each once (the test reaps all the while: an outcome
# rolled back with the claim would leave its mail claimed, its lease
# would run out and it would go again); the poison mail is sent once too;
# the worker went on after the failed claim (t/067: with mail on the
# wire).

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $relay = GatekeeperTest::start_relay(name => 'claim_failure', data_delay => 2);

my $node = GatekeeperTest::new_node(
	'claim_failure',
	smtp_url => $relay->{url},
	naptime => '1s',
	conf => "gatekeeper.batch_size = 1\n"
	  . "gatekeeper.lease = '3s'\n"
	  . "gatekeeper.smtp_timeout = '20s'\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gatekeeper');

my ($first_pid) = GatekeeperTest::worker_pids($node);
ok($first_pid, "the worker runs (pid $first_pid)");

$node->safe_psql(
	'postgres', q{
CREATE TABLE public.poison (id bigint);
-- counts the failed claims: a sequence is not rolled back with them
CREATE SEQUENCE public.poison_failures;

-- a transaction that wrote a finished mail says so
CREATE FUNCTION public.note_finished() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog AS $$
BEGIN
	PERFORM set_config('test.finished', 'yes', true);
	RETURN NULL;
END $$;
CREATE TRIGGER note_finished AFTER INSERT ON gatekeeper.mail_done
	FOR EACH STATEMENT EXECUTE FUNCTION public.note_finished();

-- the poison mail cannot be claimed in such a transaction
CREATE FUNCTION public.poison_claim() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog AS $$
BEGIN
	IF OLD.id IN (SELECT id FROM public.poison)
	   AND current_setting('test.finished', true) = 'yes' THEN
		PERFORM nextval('public.poison_failures');
		RAISE EXCEPTION 'poison mail % claimed with outcomes', OLD.id;
	END IF;
	RETURN OLD;
END $$;
CREATE TRIGGER poison_claim BEFORE DELETE ON gatekeeper.mail_live
	FOR EACH ROW EXECUTE FUNCTION public.poison_claim();
});

my $ids = $node->safe_psql(
	'postgres', q{
WITH first AS (
	SELECT gatekeeper.enqueue('first' || i || '@customer.example', 'First ' || i, 'Hello') AS id
	  FROM generate_series(1, 2) AS i),
poison AS (
	INSERT INTO public.poison
	SELECT gatekeeper.enqueue('poison@customer.example', 'Poison', 'Hello',
							  send_at => now() + interval '1 second')
	RETURNING id)
SELECT string_agg(id::text, ',') FROM (SELECT id FROM first UNION ALL SELECT id FROM poison) s});
my $poison = $node->safe_psql('postgres', 'SELECT id FROM public.poison');

my $settled = GatekeeperTest::wait_for(
	sub {
		# a lease that ran out is taken back here, at once
		$node->safe_psql('postgres', 'SELECT gatekeeper.reap()');
		$node->safe_psql('postgres',
			"SELECT count(*) FILTER (WHERE state = 'sent') = 3 FROM gatekeeper.mail_status WHERE id IN ($ids)"
		) eq 't';
	},
	90,
	'all three mails sent');
ok($settled, 'all three mails were sent')
  or diag(GatekeeperTest::mail_states($node, "id IN ($ids)"));

is($node->safe_psql('postgres', 'SELECT is_called FROM public.poison_failures'),
	't', 'the claim that recorded the first outcomes failed');
my ($pid) = GatekeeperTest::worker_pids($node);
is($pid // '', $first_pid, 'the worker went on after the failed claim: the same process');

GatekeeperTest::sent_once($node, $relay, $_, $_ == $poison ? 'the poison mail' : "mail $_")
  foreach split /,/, $ids;
is(scalar(GatekeeperTest::relay_messages($relay)), 3, 'the relay holds three messages, no other');

$node->stop;
GatekeeperTest::stop_relay($relay);
done_testing();
