# Copyright: gatekeeper contributors
#
# A driver's view (issue 13): t/driver_app.py, an application and an
# external sender written with Debian's python3-psycopg2, connects as the
# enqueue role and worker role of docs/operations.md (created by running its
# role recipe) and passes every value as a plain %s parameter, no
# casts: it enqueues in a transaction and rolls back, COPYs 50,000 mails,
# drains them with claim, ack_batch and nack_batch (empty batches too),
# sleeps on LISTEN gatekeeper until a commit into a notify queue wakes it,
# and looks its mail up and cancels it by its own key with status, find,
# history and cancel.  The test checks the program's output line by line
# and the database's state through gatekeeper.mail_status.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use GatekeeperTest;
use IPC::Run ();
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $python = '/usr/bin/python3';
plan skip_all => "$python is not installed" unless -x $python;
my ($probe_out, $probe_err) = ('', '');
IPC::Run::run([ $python, '-c', 'import psycopg2' ], '>', \$probe_out, '2>', \$probe_err)
  or plan skip_all => 'python3-psycopg2 is not installed';

my $mails = 50000;

# no background worker: the program is the only sender; a retried mail
# comes due again long after the test
my $node = GatekeeperTest::new_node('driver',
	conf => "gatekeeper.workers = 0\ngatekeeper.retry_delay = '1h'\n");
$node->start;
$node->safe_psql('postgres', q{
CREATE EXTENSION gatekeeper;
SELECT gatekeeper.create_queue('drv', max_attempts => 3);
SELECT gatekeeper.create_queue('drv_later');
SELECT gatekeeper.create_queue('drv_notify', notify => true);
SELECT gatekeeper.create_queue('drv_quiet');
});

# the roles, exactly as the recipe of docs/operations.md (Security) makes them
open(my $fh, '<', "$FindBin::RealBin/../docs/operations.md") or die "docs/operations.md: $!";
my $readme = do { local $/; <$fh> };
close($fh);
my ($recipe) = grep { /CREATE ROLE app_enqueue LOGIN/ } ($readme =~ /^```sql\n(.*?)^```/msg);
ok(defined $recipe, "docs/operations.md has a role recipe for app_enqueue");
like($recipe, qr/CREATE ROLE app_worker LOGIN/, 'and for app_worker in the same block');
$node->safe_psql('postgres', $recipe);

# the enqueue role cannot read the mail (its id column alone, for RETURNING id)
my ($ret, $stdout, $stderr) = $node->psql('postgres', 'SELECT recipient, subject FROM gatekeeper.mail',
	extra_params => [ '-U', 'app_enqueue' ]);
like($stderr, qr/permission denied for table mail/, 'app_enqueue cannot SELECT gatekeeper.mail');

my ($out, $err) = ('', '');
my $ok = IPC::Run::run(
	[
		$python, "$FindBin::RealBin/driver_app.py",
		'--host', $node->host, '--port', $node->port, '--dbname', 'postgres',
		'--mails', $mails
	],
	'<', \undef, '>', \$out, '2>', \$err,
	IPC::Run::timeout(600));
ok($ok, 'driver_app.py exits 0') or diag("stderr:\n$err");
note("driver_app.py said:\n$out");

my %line;
for (split /\n/, $out)
{
	$line{$1} = $2 if /^(\w+): (.*)$/;
}
sub field
{
	my ($step, $key) = @_;
	return undef unless defined $line{$step};
	return $line{$step} =~ /(?:^| )\Q$key\E=(\S+)/ ? $1 : undef;
}

my $bounces = int($mails / 1000);
my $busy = int(($mails + 500) / 1000);
my $sent = $mails - $bounces - $busy;

like($line{connected} // '', qr/^psycopg2=2\./, 'connected as both roles with psycopg2 2.x');

# enqueue in a transaction, rolled back: nothing
is(field('rollback', 'got_id'), 'True', 'enqueue returned an id inside the transaction');
is(field('rollback', 'status_rows'), '0', 'after the rollback status() finds no mail');
is(field('rollback', 'history_rows'), '0', 'nor does history()');

is(field('copy', 'rows'), $mails, "COPY (copy_expert) wrote $mails mails");

is(field('enqueue_keys', 'mails'), 3, 'three mails with dedupe keys');
is(field('enqueue_keys', 'deduplicated'), 'True', 'a second enqueue of a key returned the first id');

# the sender loop
is(field('sender', 'empty_ack'), '0', 'ack_batch([], []) with untyped parameters: 0');
is(field('sender', 'empty_nack'), '0', 'nack_batch([], [], []): 0');
is(field('sender', 'empty_nack_permanent'), '0', 'nack_batch([], [], [], True): 0');
is(field('sender', 'claimed'), $mails, "the loop claimed all $mails");
is(field('sender', 'batches'), int(($mails + 999) / 1000), 'in batches of 1000');
is(field('sender', 'acked'), $sent, 'ack_batch counted every sent mail');
is(field('sender', 'bounced'), $bounces, 'nack_batch(permanent) counted every bounce');
is(field('sender', 'retried'), $busy, 'nack_batch counted every retry');
cmp_ok(field('sender', 'empty_calls') // 0, '>=', 3, 'the last round sent empty batches');

is(field('listen', 'before_commit'), '0', 'LISTEN gatekeeper: nothing heard before the enqueuing transaction commits');
is(field('listen', 'notifications'), '1', 'one notification for the commit of three due mails (none for the queue without notify)');
is(field('listen', 'payloads'), 'drv_notify', 'naming the notify queue');
is(field('listen', 'claimed'), '3', 'the woken sender claimed its three mails');
is(field('listen', 'acked'), '3', 'and acked them with ack_batch');
is(field('listen', 'next_due_year'), '2099', 'next_due(queues) with an untyped array: the keyed mail due in 2099');

# looking up and cancelling by key
is(field('lookup', 'before'), 'scheduled', 'status() of a keyed mail: scheduled');
is(field('lookup', 'found'), 'True', 'find() by key returns its id');
is(field('lookup', 'cancelled'), 'True', 'cancel(queue, key) cancels it');
is(field('lookup', 'cancelled_again'), 'False', 'a second cancel(queue, key) is false');
is(field('lookup', 'cancelled_unknown'), 'False', 'cancel of a key never enqueued is false');
is(field('lookup', 'after'), 'cancelled', 'status() then says cancelled');
is(field('lookup', 'cancelled_by_id'), 'True', 'cancel(id) by the enqueue role');
is(field('lookup', 'bounce'), 'failed', 'history() of a bounced recipient: failed');
is(field('lookup', 'bounce_error_kept'), 'True', 'with the relay reply nack_batch was given');
is(field('lookup', 'sent'), 'sent', 'history() of a delivered recipient: sent');
is(field('lookup', 'find_missing'), 'None', 'find() of an unknown key: NULL');
is($line{done}, 'ok=True', 'the program ran to its end');

# the database agrees
is(GatekeeperTest::mail_states($node, "queue = 'drv'"),
	"failed:$bounces,scheduled:$busy,sent:$sent", "queue drv: $sent sent, $bounces failed, $busy retrying");
is($node->safe_psql('postgres',
		"SELECT count(*) FROM gatekeeper.mail_status WHERE queue = 'drv' AND state = 'scheduled' AND send_at > now() + interval '20 minutes' AND last_error LIKE '451 %'"),
	$busy, 'the retried mail backs off, with its error');
is(GatekeeperTest::mail_states($node, "queue = 'drv_later'"),
	'cancelled:2,scheduled:1', 'drv_later: one scheduled, two cancelled (by key, by id)');
is(GatekeeperTest::mail_states($node, "queue = 'drv_notify'"), 'sent:3',
	'drv_notify: the three mails the woken sender claimed are sent');
is(GatekeeperTest::mail_states($node, "queue = 'drv_quiet'"), 'scheduled:1',
	'drv_quiet: its mail was not announced and waits for a claim');
is(GatekeeperTest::mail_states($node, "recipient = 'rolledback\@drivers.example'"),
	'', 'the rolled-back enqueue wrote nothing');
is($node->safe_psql('postgres',
		"SELECT count(*) FROM gatekeeper.suppression WHERE reason = 'hard_bounce' AND address LIKE 'bounce%\@drivers.example'"),
	$bounces, 'every bounced mailbox is suppressed');
is($node->safe_psql('postgres',
		"SELECT count(*) FROM gatekeeper.suppression WHERE address NOT LIKE 'bounce%'"),
	0, 'and nothing else');

$node->stop;
done_testing();
