# Copyright: gatekeeper contributors

# queue_stats' totals (enqueued, sent, failed, suppressed, expired,
# cancelled, unknown) are counters: they count committed work only, never
# go down when retention removes the finished mail, survive a clean
# restart, start at zero after a crash, after reset_stats() and for a new
# queue that reuses a dropped queue's name.  The live figures (scheduled,
# due, claimed) are the live mail's.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep);

my $node = GatekeeperTest::new_node('queue_stats',
	conf => "gatekeeper.workers = 0\ngatekeeper.retention = 2s\nrestart_after_crash = on\n");
$node->start;
$node->safe_psql('postgres', q{
CREATE EXTENSION gatekeeper;
SELECT gatekeeper.create_queue('st');
SELECT gatekeeper.create_queue('st_amo', delivery => 'at_most_once');
});

my $cols = 'enqueued, sent, failed, suppressed, expired, cancelled, unknown';

# the totals of a queue, as "enqueued|sent|failed|suppressed|expired|cancelled|unknown"
sub totals
{
	my ($queue) = @_;
	return $node->safe_psql('postgres',
		"SELECT $cols FROM gatekeeper.queue_stats WHERE queue = '$queue'");
}

# the live figures of a queue, as "scheduled|due|claimed"
sub live
{
	my ($queue) = @_;
	return $node->safe_psql('postgres',
		"SELECT scheduled, due, claimed FROM gatekeeper.queue_stats WHERE queue = '$queue'");
}

# 10 mails in st: 4 sent, 2 failed, 1 suppressed, 1 cancelled, 1 expired,
# 1 for tomorrow; 1 in st_amo whose lease runs out: unknown
$node->safe_psql('postgres', q{
SELECT gatekeeper.suppress('sup@example.com');
SELECT gatekeeper.enqueue('s' || i || '@example.com', 'Sent', 'b', 'st', now() - interval '1 minute')
  FROM generate_series(1, 4) AS i;
SELECT gatekeeper.enqueue('f' || i || '@example.com', 'Failed', 'b', 'st', now() - interval '1 minute')
  FROM generate_series(1, 2) AS i;
SELECT gatekeeper.enqueue('sup@example.com', 'Suppressed', 'b', 'st', now() - interval '1 minute');
SELECT gatekeeper.enqueue('exp@example.com', 'Expired', 'b', 'st', now() - interval '1 minute',
						  send_by => now() - interval '30 seconds');
SELECT gatekeeper.cancel(gatekeeper.enqueue('c@example.com', 'Cancelled', 'b', 'st',
											now() + interval '1 hour'));
SELECT gatekeeper.enqueue('later@example.com', 'Tomorrow', 'b', 'st', now() + interval '1 day');
SELECT gatekeeper.enqueue('amo@example.com', 'At most once', 'b', 'st_amo');
});
$node->safe_psql('postgres', q{
CREATE TABLE c AS SELECT id, attempt, recipient FROM gatekeeper.claim('w', 100, '5 minutes', '{st}');
SELECT gatekeeper.ack(id, attempt) FROM c WHERE recipient LIKE 's%';
SELECT gatekeeper.nack(id, attempt, '550 no', true) FROM c WHERE recipient LIKE 'f%';
DROP TABLE c;
SELECT count(*) FROM gatekeeper.claim('w', 1, '1 second', '{st_amo}');
});
sleep(1.2);
$node->safe_psql('postgres', 'SELECT gatekeeper.reap()');

my $st = '10|4|2|1|1|1|0';
my $amo = '1|0|0|0|0|0|1';
is(totals('st'), $st, 'totals of st: 10 enqueued, 4 sent, 2 failed, 1 suppressed, 1 expired, 1 cancelled');
is(totals('st_amo'), $amo, 'totals of st_amo: 1 enqueued, 1 unknown');
is(live('st'), '1|0|0', 'live: the mail for tomorrow is scheduled, not due');

# work that rolls back counts nothing; a savepoint rolled back drops its own
$node->safe_psql('postgres', q{
BEGIN;
SELECT gatekeeper.enqueue('rb' || i || '@example.com', 'Rolled back', 'b', 'st') FROM generate_series(1, 5) AS i;
SELECT gatekeeper.ack(c.id, c.attempt) FROM gatekeeper.claim('w', 100, '5 minutes', '{st}') AS c;
ROLLBACK;
});
is(totals('st'), $st, 'a rolled-back transaction counted nothing');
$node->safe_psql('postgres', q{
BEGIN;
SELECT gatekeeper.enqueue('kept@example.com', 'Kept', 'b', 'st');
SAVEPOINT a;
SELECT gatekeeper.enqueue('sp' || i || '@example.com', 'Rolled back', 'b', 'st') FROM generate_series(1, 3) AS i;
INSERT INTO gatekeeper.mail (recipient, subject, body, queue)
SELECT 'bulk' || i || '@example.com', 'Rolled back', 'b', 'st' FROM generate_series(1, 3) AS i;
ROLLBACK TO a;
SAVEPOINT b;
INSERT INTO gatekeeper.mail (recipient, subject, body, queue)
SELECT 'bulk' || i || '@example.com', 'Kept', 'b', 'st' FROM generate_series(1, 2) AS i;
RELEASE b;
COMMIT;
});
$st = '13|4|2|1|1|1|0';
is(totals('st'), $st, 'a committed transaction counts what its released savepoints did, not what it rolled back');
is(live('st'), '4|3|0', 'live: 3 due and 1 for tomorrow');

# retention removes every finished mail: the totals stay
my $done = $node->safe_psql('postgres', 'SELECT count(*) FROM gatekeeper.mail_done');
is($done, 10, 'ten finished mails are kept');
for (1 .. 30)
{
	last if $node->safe_psql('postgres', 'SELECT count(*) FROM gatekeeper.mail_done') == 0;
	sleep(1.1);
	$node->safe_psql('postgres', 'SELECT gatekeeper.purge()');
}
is($node->safe_psql('postgres', 'SELECT count(*) FROM gatekeeper.mail_done'),
	0, 'retention removed every finished mail');
is(totals('st'), $st, 'the totals of st did not go down');
is(totals('st_amo'), $amo, 'the totals of st_amo did not go down');
is(live('st'), '4|3|0', 'live figures unchanged by retention');

# a claim: claimed counts it, due no longer does
$node->safe_psql('postgres', "SELECT count(*) FROM gatekeeper.claim('w', 1, '5 minutes', '{st}')");
is(live('st'), '3|2|1', 'live: one claimed, two due, one for tomorrow');

# a clean restart keeps the totals
$node->restart;
is(totals('st'), $st, 'the totals of st survived a clean restart');
is(totals('st_amo'), $amo, 'the totals of st_amo survived a clean restart');

# a dropped queue's totals go with it: a new queue of that name starts at zero
$node->safe_psql('postgres', q{
SELECT gatekeeper.drop_queue('st_amo');
SELECT gatekeeper.create_queue('st_amo');
});
is(totals('st_amo'), '0|0|0|0|0|0|0', 'a new queue with a dropped queue\'s name starts at zero');

# a crash (a child killed: the postmaster reinitializes shared memory)
# starts the totals at zero, as PostgreSQL's own statistics
my $launcher = $node->safe_psql('postgres',
	"SELECT pid FROM pg_stat_activity WHERE backend_type = 'logical replication launcher'");
ok($launcher, 'found a child process to kill');
kill('KILL', $launcher);
$node->poll_query_until('postgres',
	"SELECT pid <> $launcher FROM pg_stat_activity WHERE backend_type = 'logical replication launcher'")
  or die 'the server did not restart after the crash';
is(totals('st'), '0|0|0|0|0|0|0', 'after a crash the totals start at zero');
is(live('st'), '3|2|1', 'the live figures come from the tables: unchanged by the crash');

# counting goes on after the crash; reset_stats() zeroes
$node->safe_psql('postgres', "SELECT gatekeeper.enqueue('again\@example.com', 'Again', 'b', 'st')");
is(totals('st'), '1|0|0|0|0|0|0', 'counting resumes after the crash');
$node->safe_psql('postgres', 'SELECT gatekeeper.reset_stats()');
is(totals('st'), '0|0|0|0|0|0|0', 'reset_stats() zeroes the totals');

$node->stop;
done_testing();
