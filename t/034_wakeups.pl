# Copyright: gatekeeper contributors
# gatekeeper-test: alone

# Wake-ups for external senders (issue 13): queues with notify announce
# their due mail with NOTIFY gatekeeper, '<queue>', and queues with
# background = false are left to external claimers.  A psql session
# LISTENs throughout; every step waits a bounded time.
#
#  - one notification per committing transaction and queue: a transaction
#    enqueuing 100 mails to one notify queue and 3 to another gives exactly
#    two, the queues' names; INSERT ... SELECT and COPY give one each;
#  - none on rollback, none for a queue without notify;
#  - mail due 2 s after its commit is announced once, when it comes due
#    (not before, and within a bound after), by the first worker;
#  - unclaim with no delay announces the mail handed back;
#  - a paused queue announces nothing; resume() announces its due mail;
#  - the running worker, delivering to a relay, never claims a queue with
#    background = false (over several seconds, while it sends another
#    queue's mail), an external claim gets that mail, and once the queue
#    is given back to it (alter_queue) the worker sends its mail.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $sink = GatekeeperTest::start_sink(name => 'wakeups');
my $node = GatekeeperTest::new_node('wakeups', sink => $sink);
$node->start;

$node->safe_psql('postgres', 'CREATE EXTENSION gatekeeper');
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT count(*) = 1 AND bool_and(state <> 'waiting for extension') FROM gatekeeper.worker_status",
		't', 30),
	'the worker found the extension');

$node->safe_psql(
	'postgres', q{
SELECT gatekeeper.create_queue('n_a', notify => true);
SELECT gatekeeper.create_queue('n_b', notify => true);
SELECT gatekeeper.create_queue('n_quiet');
SELECT gatekeeper.create_queue('n_later', notify => true, background => false);
SELECT gatekeeper.create_queue('n_back', notify => true, background => false);
SELECT gatekeeper.create_queue('n_paused', notify => true, background => false);
SELECT gatekeeper.create_queue('n_ext', background => false);
SELECT gatekeeper.create_queue('n_worker');
});

my $listener = $node->background_psql('postgres');
$listener->query_safe('LISTEN gatekeeper');

# the notifications the listener received since the last call: [time, payload]
sub received
{
	my $out = $listener->query_safe('SELECT 1');
	my $now = time;
	my @got;
	while ($out =~ /Asynchronous notification "gatekeeper" with payload "([^"]*)" received/g)
	{
		push @got, [ $now, $1 ];
	}
	return @got;
}

# the payloads received within $seconds, polling every 100 ms, as a sorted
# comma-separated list
sub received_within
{
	my ($seconds) = @_;
	my @all;
	my $deadline = time + $seconds;
	while (time < $deadline)
	{
		push @all, map { $_->[1] } received();
		usleep(100_000);
	}
	push @all, map { $_->[1] } received();
	return join(',', sort @all);
}

is(received_within(0.5), '', 'nothing is announced before any mail');

# one transaction, 100 mails to n_a and 3 to n_b, by several statements
$node->safe_psql(
	'postgres', q{
BEGIN;
SELECT count(gatekeeper.enqueue('a' || i || '@example.com', 'S', 'B', queue => 'n_a'))
  FROM generate_series(1, 60) AS i;
SELECT gatekeeper.enqueue('b1@example.com', 'S', 'B', queue => 'n_b');
SELECT count(gatekeeper.enqueue('a' || i || '@example.com', 'S', 'B', queue => 'n_a'))
  FROM generate_series(61, 100) AS i;
SELECT count(gatekeeper.enqueue('b' || i || '@example.com', 'S', 'B', queue => 'n_b'))
  FROM generate_series(2, 3) AS i;
SELECT count(gatekeeper.enqueue('q' || i || '@example.com', 'S', 'B', queue => 'n_quiet'))
  FROM generate_series(1, 5) AS i;
COMMIT;
});
is(received_within(2), 'n_a,n_b',
	'a transaction with 100 mails to n_a and 3 to n_b gives one notification for each');

$node->safe_psql(
	'postgres', q{
BEGIN;
SELECT gatekeeper.enqueue('rolled@example.com', 'S', 'B', queue => 'n_a');
INSERT INTO gatekeeper.mail (recipient, subject, body, queue)
SELECT 'rolled' || i || '@example.com', 'S', 'B', 'n_b' FROM generate_series(1, 10) AS i;
ROLLBACK;
});
is(received_within(1.5), '', 'a transaction rolled back announces nothing');

$node->safe_psql('postgres',
	"SELECT gatekeeper.enqueue('quiet' || i || '\@example.com', 'S', 'B', queue => 'n_quiet') FROM generate_series(1, 3) AS i"
);
is(received_within(1.5), '', 'a queue without notify announces nothing');

$node->safe_psql('postgres', q{
INSERT INTO gatekeeper.mail (recipient, subject, body, queue)
SELECT 'bulk' || i || '@example.com', 'S', 'B', 'n_a' FROM generate_series(1, 50) AS i;
});
is(received_within(1.5), 'n_a', 'INSERT ... SELECT of 50 mails gives one notification');

$node->safe_psql('postgres', join("\n",
	'COPY gatekeeper.mail (recipient, subject, body, queue) FROM STDIN;',
	(map { "copy$_\@example.com\tS\tB\tn_b" } 1 .. 5), '\.', ''));
is(received_within(1.5), 'n_b', 'COPY of 5 mails gives one notification');

# due 2 s after its commit: announced by the worker when it comes due
my ($due) = split(
	/\|/,
	$node->safe_psql('postgres',
		"SELECT extract(epoch FROM now() + interval '2 seconds'), "
		  . "gatekeeper.enqueue('later\@example.com', 'S', 'B', queue => 'n_later', send_at => now() + interval '2 seconds')"
	));
my $committed = time;
my @later;
my $deadline = $committed + 8;
while (time < $deadline && !@later)
{
	@later = grep { $_->[1] eq 'n_later' } received();
	usleep(50_000);
}
ok(@later, 'mail due in 2 s is announced');
SKIP:
{
	skip 'not announced', 2 unless @later;
	my $at = $later[0][0];
	cmp_ok($at, '>=', $due - 0.05, 'not before it is due')
	  or diag(sprintf('announced %.3f s before it was due', $due - $at));
	cmp_ok($at, '<=', $due + 2.5, 'within 2.5 s after it is due')
	  or diag(sprintf('announced %.3f s after it was due', $at - $due));
	note(sprintf('announced %.3f s after it was due (commit %.3f s before due)',
			$at - $due, $due - $committed));
}
is(received_within(2.5), '', 'and announced only once');

# unclaim with no delay: the mail is due again at once, and announced
$node->safe_psql('postgres', "SELECT gatekeeper.enqueue('back\@example.com', 'S', 'B', queue => 'n_back')");
is(received_within(1), 'n_back', 'mail for the external sender is announced');
is( $node->safe_psql(
		'postgres', q{
WITH c AS (SELECT * FROM gatekeeper.claim('ext', 10, queues => '{n_back}'))
SELECT gatekeeper.unclaim(array_agg(c.id), array_agg(c.attempt), 'not now', interval '0') FROM c}),
	'1',
	'an external sender hands it back');
is(received_within(1.5), 'n_back', 'mail handed back with no delay is announced again');

# a paused queue announces nothing; resume() announces its due mail
$node->safe_psql('postgres', q{
SELECT gatekeeper.pause('n_paused');
SELECT gatekeeper.enqueue('paused' || i || '@example.com', 'S', 'B', queue => 'n_paused') FROM generate_series(1, 3) AS i;
});
is(received_within(1.5), '', 'mail for a paused queue is not announced');
$node->safe_psql('postgres', "SELECT gatekeeper.resume('n_paused')");
is(received_within(1.5), 'n_paused', 'resume() announces the due mail, once');

# background = false: the running worker never claims it
$node->safe_psql(
	'postgres', q{
SELECT gatekeeper.enqueue('ext' || i || '@example.com', 'S', 'B', queue => 'n_ext') FROM generate_series(1, 3) AS i;
SELECT gatekeeper.enqueue('worker' || i || '@example.com', 'S', 'B', queue => 'n_worker') FROM generate_series(1, 3) AS i;
});
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT count(*) = 3 AND bool_and(state = 'sent') FROM gatekeeper.mail_status WHERE queue = 'n_worker'",
		't', 30),
	'the worker sends the mail of a background queue');
sleep(3);
is( $node->safe_psql(
		'postgres',
		"SELECT string_agg(state || ':' || attempt, ',') FROM gatekeeper.mail_status WHERE queue = 'n_ext'"),
	'scheduled:0,scheduled:0,scheduled:0',
	'it never claimed the mail of the queue with background = false');
is( $node->safe_psql(
		'postgres',
		"SELECT string_agg(recipient, ',' ORDER BY recipient) FROM gatekeeper.claim('ext', 10) WHERE queue = 'n_ext'"
	),
	'ext1@example.com,ext2@example.com,ext3@example.com',
	'an external claim without queues gets that mail');

# given back to the worker, the queue's mail goes
$node->safe_psql('postgres', "SELECT gatekeeper.enqueue('ext4\@example.com', 'S', 'B', queue => 'n_ext')");
sleep(1);
$node->safe_psql('postgres', "SELECT gatekeeper.alter_queue('n_ext', background => true)");
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT state FROM gatekeeper.mail_status WHERE recipient = 'ext4\@example.com'",
		'sent', 30),
	'after alter_queue(background => true) the worker sends it');

$listener->quit;
$node->stop;
GatekeeperTest::stop_sink($sink);
done_testing();
