# Copyright: gatekeeper contributors

# pg_dump and pg_restore of a database using gatekeeper.  A database holds
# every kind of user object: gates, queues with options (one paused), the
# default queue and the smart_sending gate changed, mail in every state
# (scheduled and due, scheduled later, claimed, sent, failed, cancelled in
# a queue dropped since), with dedupe keys, and gate passes made by
# gate_pass (one at a time, in a batch, with a holder) and by claims (one
# given back by a permanent failure).  It is dumped in custom and in plain
# format, each also with --load-via-partition-root (the mail's rows then
# load through gatekeeper.mail, before the queues' rows), and restored into
# new databases, CREATE EXTENSION included: pg_restore --exit-on-error and
# psql with ON_ERROR_STOP must succeed.
#
# In each restored database, the rows of every table (claimed mail's
# batches in mail_claim and the dedupe keys in mail_key among them) and the
# values of the sequences equal the source's, and so does what explain()
# says of each recipient's passes (the passes are rebuilt from the gate log
# on first use).  Then it works: enqueue (new ids, dedupe against restored
# mail, the claimed mail's key included), the ack of the claim held in the
# source (with its attempt, once), claim (the gate closed for a recipient
# who passed in the source, open for another), gate_pass (closed for a
# passed recipient, open for a new one and for one whose pass was given
# back), create_gate and create_queue, all without 23505 or 42710.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# no background worker: nothing claims but this test
my $node = GatekeeperTest::new_node('dump_restore', conf => "gatekeeper.workers = 0\n");
$node->start;

$node->safe_psql('postgres', 'CREATE DATABASE src');
$node->safe_psql('src', 'CREATE EXTENSION gatekeeper');

$node->safe_psql(
	'src', q{
SELECT gatekeeper.create_gate('weekly', '7 days', 3);
SELECT gatekeeper.create_gate('daily', '1 day');
SELECT gatekeeper.create_queue('promo', gates => '{smart_sending,weekly}', on_gate_closed => 'defer',
	max_attempts => 3, weight => 2, rate_limit => 1000, dedupe_window => '1 day');
SELECT gatekeeper.create_queue('news', gates => '{daily}', delivery => 'at_most_once');
SELECT gatekeeper.pause('news');
-- issue 12: queue options, suppressions (one global, one for a queue)
-- (a window open from an hour before now to two after, whatever the time
-- the test runs: the claims below must find promo's mail inside it)
SELECT gatekeeper.alter_queue('promo', unsubscribe_url => 'https://shop.example.com/u/{token}',
	send_window => to_char(now() AT TIME ZONE 'Europe/Paris' - interval '1 hour', 'HH24:00') || '-'
				   || to_char(now() AT TIME ZONE 'Europe/Paris' + interval '3 hours', 'HH24:00'),
	timezone => 'Europe/Paris', transactional => true);
SELECT gatekeeper.suppress('gone@example.com', 'hard_bounce', detail => '550 5.1.1 no such user');
SELECT gatekeeper.suppress('tired@example.com', 'unsubscribe', 'news');
-- the built-in rows, changed
SELECT gatekeeper.alter_queue('default', weight => 5, max_attempts => 7);
-- issue 13: wake-up options, on a queue and on the default queue
SELECT gatekeeper.alter_queue('news', background => false, notify => true);
SELECT gatekeeper.alter_queue('default', notify => true);
SELECT gatekeeper.alter_gate('smart_sending', period => '20 hours');

-- finished mail of a queue dropped since
SELECT gatekeeper.create_queue('old');
SELECT gatekeeper.cancel(gatekeeper.enqueue('old@example.com', 'Old', 'Body', queue => 'old',
	send_at => now() + interval '1 day'));
SELECT gatekeeper.drop_queue('old');

-- claimed through promo's gates: one sent, one failed (its passes given
-- back), one still claimed
SELECT gatekeeper.enqueue('sent@example.com', 'Sent', 'Body', queue => 'promo', dedupe_key => 'sent-1');
SELECT gatekeeper.enqueue('failed@example.com', 'Failed', 'Body', queue => 'promo', dedupe_key => 'failed-1');
SELECT gatekeeper.enqueue('held@example.com', 'Held', 'Body', queue => 'promo', dedupe_key => 'held-1');
CREATE TEMP TABLE c AS SELECT * FROM gatekeeper.claim('w1', 10, lease => '1 hour', queues => '{promo}');
SELECT gatekeeper.ack(id, attempt) FROM c WHERE recipient = 'sent@example.com';
SELECT gatekeeper.nack(id, attempt, 'mailbox unavailable', true) FROM c WHERE recipient = 'failed@example.com';

-- passes without mail: one at a time, with a holder, in a batch
SELECT gatekeeper.gate_pass('smart_sending', 'passed@example.com');
SELECT gatekeeper.gate_pass('weekly', 'capped@example.com', h) FROM generate_series(41, 43) AS h;
-- holder 41 holds its pass already: this one counts nothing
SELECT gatekeeper.gate_pass('weekly', 'capped@example.com', 41);
SELECT * FROM gatekeeper.gate_pass_batch('weekly', ARRAY['b1@example.com', 'b2@example.com']);
SELECT gatekeeper.gate_pass('daily', 'news@example.com');

-- scheduled: due in promo (one gate closed, one open), later, paused
SELECT gatekeeper.enqueue('passed@example.com', 'Passed', 'Body', queue => 'promo', dedupe_key => 'passed-1');
SELECT gatekeeper.enqueue('fresh@example.com', 'Fresh', 'Body', queue => 'promo', dedupe_key => 'fresh-1',
	headers => '{"X-Campaign": "spring"}', html => '<p>Fresh</p>', priority => 3);
SELECT gatekeeper.enqueue('later@example.com', 'Later', 'Body', send_at => now() + interval '2 days',
	send_by => now() + interval '3 days', dedupe_key => 'later-1');
SELECT gatekeeper.enqueue('news@example.com', 'News', 'Body', queue => 'news');
-- more than one block of the id sequence's cache
INSERT INTO gatekeeper.mail (recipient, subject, body, send_at)
SELECT 'bulk' || i || '@example.com', 'Bulk ' || i, 'Body', now() + interval '1 day'
  FROM generate_series(1, 250) AS i;
});

is( $node->safe_psql(
		'src',
		"SELECT string_agg(recipient || ':' || state, ',' ORDER BY recipient) FROM gatekeeper.mail_status WHERE queue = 'promo'"
	),
	'failed@example.com:failed,fresh@example.com:scheduled,held@example.com:claimed,'
	  . 'passed@example.com:scheduled,sent@example.com:sent',
	'source: promo holds mail in every state');

# every table's rows, and the sequences' values, as text
my @tables = (
	[ 'queue', 'name' ],
	[ 'gate', 'name' ],
	[ 'mail', 'id' ],
	[ 'mail_live', 'id' ],
	[ 'mail_done', 'id' ],
	[ 'mail_claim', 'batch' ],
	[ 'mail_key', 'queue, dedupe_key' ],
	[ 'mail_status', 'id' ],
	[ 'gate_log', 'id' ],
	[ 'suppression_list', 'address, queue' ],
	[ 'unsubscribe_secret', 'secret' ]);
my @recipients = map { "$_\@example.com" }
  qw(sent failed held passed fresh capped b1 b2 news new);

sub snapshot
{
	my ($db) = @_;
	my %s;
	foreach my $t (@tables)
	{
		my ($table, $order) = @$t;
		$s{$table} = $node->safe_psql($db, "SELECT * FROM gatekeeper.$table ORDER BY $order");
	}
	foreach my $seq (qw(mail_id_seq gate_id_seq gate_log_id_seq mail_claim_batch_seq))
	{
		$s{$seq} = $node->safe_psql($db,
			"SELECT last_value, is_called FROM gatekeeper.$seq");
	}
	my $list = join(',', map { "'$_'" } @recipients);
	$s{passes} = $node->safe_psql(
		$db, qq{
SELECT r, e.gate, e.open, e.next_open, e.sends_in_period, e.max_sends
  FROM unnest(ARRAY[$list]) AS r, gatekeeper.explain(r) AS e
 ORDER BY r, e.gate});
	return \%s;
}

my $source = snapshot('src');
# a token made before the dump, to be used after the restore
my $token = $node->safe_psql('src',
	"SELECT gatekeeper._unsubscribe_token('reader\@example.com', 'promo')");

# each dump: custom and plain, from the partitions (the default) and
# through the partitioned tables (the mail's rows then come before the
# queues'); each restored into a database of its own
my @dumps = (
	[ 'dst_custom',      'src.dump',      [ '-Fc' ] ],
	[ 'dst_plain',       'src.sql',       [] ],
	[ 'dst_root_custom', 'src_root.dump', [ '--load-via-partition-root', '-Fc' ] ],
	[ 'dst_root_plain',  'src_root.sql',  [ '--load-via-partition-root' ] ]);
foreach my $d (@dumps)
{
	my ($db, $file, $options) = @$d;
	my $path = $node->basedir . "/$file";
	my $custom = grep { $_ eq '-Fc' } @$options;

	$node->command_ok(
		[ 'pg_dump', @$options, '-f', $path, '-d', $node->connstr('src') ],
		"pg_dump " . join(' ', @$options, '-f', $file));
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->command_ok(
		$custom
		? [ 'pg_restore', '--exit-on-error', '-d', $node->connstr($db), $path ]
		: [
			'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d',
			$node->connstr($db), '-f', $path
		],
		"$db: $file restores without error");
}

foreach my $db (map { $_->[0] } @dumps)
{
	my $restored = snapshot($db);
	foreach my $what (sort keys %$source)
	{
		is($restored->{$what}, $source->{$what}, "$db: $what as in the source");
	}

	# a restore is not new work: queue_stats' totals count none of it
	is( $node->safe_psql(
			$db,
			"SELECT sum(enqueued + sent + failed + suppressed + expired + cancelled + unknown) FROM gatekeeper.queue_stats"
		),
		'0', "$db: the restore counted nothing in queue_stats' totals");
	# but its live mail is live: queue_stats counts the source's scheduled
	# and claimed mail (claimed mail is no row of mail_live but a record of
	# a mail_claim batch: the states are read through mail_status)
	is( $node->safe_psql(
			$db, q{
SELECT string_agg(format('%s %s/%s/%s', queue, scheduled, claimed, due), ', ' ORDER BY queue)
  FROM gatekeeper.queue_stats WHERE scheduled + claimed > 0}),
		$node->safe_psql(
			'src', q{
SELECT string_agg(format('%s %s/%s/%s', queue, s, c, d), ', ' ORDER BY queue)
  FROM (SELECT queue, count(*) FILTER (WHERE state = 'scheduled') AS s,
			   count(*) FILTER (WHERE state = 'claimed') AS c,
			   count(*) FILTER (WHERE state = 'scheduled' AND send_at <= now()) AS d
		  FROM gatekeeper.mail_status WHERE state IN ('scheduled', 'claimed') GROUP BY queue) l}),
		"$db: queue_stats counts the restored live mail as the source holds it");
	is($node->safe_psql($db, "SELECT count(*) FROM gatekeeper.unsubscribe_secret"),
		'1', "$db: one unsubscribe secret, the source's");
	is($node->safe_psql($db, "SELECT gatekeeper.unsubscribe('$token')"),
		't', "$db: an unsubscribe token made before the dump verifies");
	is( $node->safe_psql(
			$db,
			"SELECT string_agg(recipient || ':' || queue || ':' || reason, ',' ORDER BY recipient) "
			  . "FROM gatekeeper._suppressed('{gone\@example.com,tired\@example.com,reader\@example.com}', '{default,news,promo}')"
		),
		'gone@example.com:default:hard_bounce,reader@example.com:promo:unsubscribe,tired@example.com:news:unsubscribe',
		"$db: restored suppressions stop their mail");
	is($node->safe_psql($db, "SELECT weight || ',' || max_attempts FROM gatekeeper.queue WHERE name = 'default'"),
		'5,7', "$db: the changed default queue");
	is( $node->safe_psql(
			$db,
			"SELECT string_agg(name || ':' || background || ':' || notify, ',' ORDER BY name) FROM gatekeeper.queue WHERE name IN ('default', 'news', 'promo')"
		),
		'default:true:true,news:false:true,promo:true:false',
		"$db: the queues' background and notify options");
	is($node->safe_psql($db, "SELECT period FROM gatekeeper.gate WHERE name = 'smart_sending'"),
		'20:00:00', "$db: the changed smart_sending gate");

	# gate passes made in the source hold; one given back does not
	is( $node->safe_psql(
			$db, q{
SELECT string_agg(r || ':' || gatekeeper.gate_pass('smart_sending', r), ',' ORDER BY r)
  FROM unnest(ARRAY['passed@example.com', 'sent@example.com', 'held@example.com',
					'failed@example.com', 'new@example.com']) AS r}),
		'failed@example.com:true,held@example.com:false,new@example.com:true,'
		  . 'passed@example.com:false,sent@example.com:false',
		"$db: gate_pass is closed for recipients who passed, open for the others");
	is($node->safe_psql($db, "SELECT gatekeeper.gate_pass('weekly', 'capped\@example.com')"),
		'f', "$db: a frequency cap reached in the source holds");
	is($node->safe_psql($db, "SELECT gatekeeper.gate_pass('weekly', 'b1\@example.com')"),
		't', "$db: a frequency cap not reached in the source passes");

	# the claim: passed@ waits behind its closed gate (defer), fresh@ goes
	is( $node->safe_psql(
			$db, "SELECT string_agg(recipient || ':' || attempt, ',') FROM gatekeeper.claim('w2', 10, queues => '{promo}')"),
		'fresh@example.com:1',
		"$db: claim passes the gates of the open recipient only");
	is($node->safe_psql($db, "SELECT state FROM gatekeeper.mail_status WHERE recipient = 'passed\@example.com'"),
		'scheduled', "$db: the mail behind the closed gate waits");

	# enqueue: dedupe against restored mail (scheduled, claimed, sent), and
	# new ids after the old ones
	is( $node->safe_psql(
			$db, q{
SELECT gatekeeper.enqueue('fresh@example.com', 'Again', 'Body', queue => 'promo', dedupe_key => 'fresh-1')
	   = (SELECT id FROM gatekeeper.mail_status WHERE dedupe_key = 'fresh-1'),
	   gatekeeper.enqueue('held@example.com', 'Again', 'Body', queue => 'promo', dedupe_key => 'held-1')
	   = (SELECT id FROM gatekeeper.mail_status WHERE dedupe_key = 'held-1'),
	   gatekeeper.enqueue('sent@example.com', 'Again', 'Body', queue => 'promo', dedupe_key => 'sent-1')
	   = (SELECT id FROM gatekeeper.mail_status WHERE dedupe_key = 'sent-1');
SELECT count(*) FROM gatekeeper.mail_status WHERE dedupe_key IN ('fresh-1', 'held-1', 'sent-1')}),
		"t|t|t\n3", "$db: enqueue finds restored mail by its dedupe key, making none");

	# the claim held in the source is held in the restore: its worker's
	# ack with the claim's attempt finishes it, another attempt does not
	is( $node->safe_psql(
			$db, q{
SELECT gatekeeper.ack(s.id, s.attempt + 1), gatekeeper.ack(s.id, s.attempt), gatekeeper.ack(s.id, s.attempt)
  FROM gatekeeper.mail_status s WHERE s.recipient = 'held@example.com' AND s.subject = 'Held';
SELECT state || ':' || attempt || ':' || worker FROM gatekeeper.mail_status WHERE recipient = 'held@example.com' AND subject = 'Held'}),
		"f|t|f\nsent:1:w1", "$db: the restored claim is acked with its attempt, once");
	my ($out, $err) = ('', '');
	my $ret = $node->psql(
		$db, q{
SELECT gatekeeper.enqueue('one@example.com', 'New', 'Body', queue => 'promo', dedupe_key => 'new-1')
	   > (SELECT max(id) FROM gatekeeper.mail_status WHERE recipient <> 'one@example.com');
INSERT INTO gatekeeper.mail (recipient, subject, body)
SELECT 'more' || i || '@example.com', 'More', 'Body' FROM generate_series(1, 300) AS i;
SELECT gatekeeper.create_gate('brand_new', '1 hour', 2);
SELECT gatekeeper.create_queue('brand_new', gates => '{brand_new}');
SELECT gatekeeper.gate_pass('brand_new', 'x@example.com');
SELECT id > (SELECT max(id) FROM gatekeeper.gate WHERE name <> 'brand_new') FROM gatekeeper.gate WHERE name = 'brand_new';
},
		stdout => \$out,
		stderr => \$err,
		on_error_stop => 1);
	is($ret, 0, "$db: enqueue, INSERT, create_gate, create_queue and gate_pass succeed");
	is($err, '', "$db: ... with no error") or diag($err);
	# (create_gate and create_queue print empty lines)
	is( join(',', grep { $_ ne '' } split(/\n/, $out)),
		't,t,t', "$db: ... the new pass is granted, new mail and gates get ids after the restored ones");
}

$node->stop;
done_testing();
