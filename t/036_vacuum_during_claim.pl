# Copyright: gatekeeper contributors

# A claim in progress never holds up a VACUUM of mail_live (claim.c,
# claim_from_queue).  VACUUM must take every leaf page of mail_due with no
# other backend's pin on it, and a claim statement walks the head of the
# queue's range in that index: had it kept its pin there until it ended
# (as an index-only scan does), a few claimers at work would have starved
# the vacuum for as long as they claimed, and the dead entries it was to
# remove would have slowed every claim in the meantime.
#
# Here one claim statement is held in the middle of its update (a row
# trigger sleeps on its first mail) while VACUUM runs with a short
# statement_timeout: the vacuum finishes and removes the dead rows of the
# mail claimed and acked before, and the held claim then completes with
# exactly its mails.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $node = GatekeeperTest::new_node('vacuum_claim',
	conf => "gatekeeper.workers = 0\nautovacuum = off\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gatekeeper');
$node->safe_psql(
	'postgres', q{
SELECT gatekeeper.create_queue('q');
-- live rows: statements of 200 (one of 256 mails or more writes runs)
DO $$
BEGIN
	FOR s IN 0 .. 2999 BY 200 LOOP
		INSERT INTO gatekeeper.mail (queue, recipient, subject, body, send_at)
		SELECT 'q', 'user' || i || '@example.com', 'mail ' || i, 'body', now() - interval '1 hour'
		  FROM generate_series(s + 1, s + 200) AS i;
	END LOOP;
END
$$;
});

# dead rows to vacuum: 1,000 mails claimed and acked (each leaves its
# scheduled and its claimed version behind, and their index entries)
is( $node->safe_psql(
		'postgres', q{
SELECT gatekeeper.ack_batch(array_agg(id), array_agg(attempt))
  FROM gatekeeper.claim('first', 1000, queues => '{q}')}),
	'1000',
	'1000 mails claimed and acked');

# the next claim stops on its first mail, in the middle of its delete
my $first = $node->safe_psql('postgres',
	"SELECT min(id) FROM gatekeeper.mail_live WHERE state = 'scheduled'");
$node->safe_psql(
	'postgres', qq{
CREATE FUNCTION public.hold_claim() RETURNS trigger LANGUAGE plpgsql AS
\$\$BEGIN PERFORM pg_sleep(15); RETURN OLD; END\$\$;
CREATE TRIGGER hold_claim BEFORE DELETE ON gatekeeper.mail_live
	FOR EACH ROW WHEN (OLD.id = $first) EXECUTE FUNCTION public.hold_claim();
});

my ($claim_out, $claim_err) = ('', '');
my $claim = IPC::Run::start(
	[
		'psql', '-X', '-A', '-t', '-v', 'ON_ERROR_STOP=1',
		'-d', $node->connstr('postgres'),
		'-c', "SELECT count(*) FROM gatekeeper.claim('held', 500, queues => '{q}')"
	],
	'>', \$claim_out, '2>', \$claim_err,
	IPC::Run::timeout(60));
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT count(*) = 1 FROM pg_stat_activity WHERE wait_event = 'PgSleep'"),
	'a claim is held in the middle of its delete');

# (not truncating: giving the emptied tail back needs a lock that the held
# claim's conflicts with, and a vacuum gives that up only after 5 s)
my $start = time;
my ($ret, $out, $err) = $node->psql(
	'postgres', q{
SET statement_timeout = '5s';
VACUUM (TRUNCATE false) gatekeeper.mail_live;
});
my $took = time - $start;
note("VACUUM took $took s" . ($err ne '' ? ": $err" : ''));
is($ret, 0, 'VACUUM of mail_live finishes while the claim is held');
unlike($err, qr/statement timeout/, 'it was not cut off waiting');
is( $node->safe_psql(
		'postgres', q{
SELECT vacuum_count || '|' || n_dead_tup FROM pg_stat_user_tables
 WHERE relid = 'gatekeeper.mail_live'::regclass}),
	'1|0',
	'it ran once and removed every dead row');
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'"),
	'1',
	'and the claim was still held meanwhile');

ok($claim->finish, 'the held claim completes') or diag($claim_err);
is($claim_out, "500\n", 'with its 500 mails');
is( $node->safe_psql(
		'postgres',
		"SELECT string_agg(state || ':' || n, ',' ORDER BY state)
		   FROM (SELECT state, count(*) AS n FROM gatekeeper.mail_status GROUP BY state) s"),
	'scheduled:1500,claimed:500,sent:1000',
	'every mail accounted for, none claimed twice');

$node->stop;
done_testing();
