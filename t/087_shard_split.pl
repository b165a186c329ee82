# Copyright: gatekeeper contributors

# Growing from one node to two shards (issue 29), the procedure of
# docs/sharding.md, "From one node to two shards", step by step:
#
#   1. pause every queue on the node and wait until no mail is claimed;
#   2. copy the node's database to the new node, a fresh server that has
#      none of the old node's roles: the commands of the docs' step 2 as
#      written there (read from docs/sharding.md), the roles first; the
#      docs' restore tried before the roles exist stops, leaves nothing,
#      and runs again once they do;
#   3. gatekeeper.shard(0, 2) on the old node, gatekeeper.shard(1, 2) on
#      the new one;
#   4. on each, delete the mail, the gate passes and the suppressions of
#      the recipients the other shard owns (hashtext(lower(recipient)) & 1);
#      restart each, so its gates are rebuilt from what is left;
#   5. the router, with p0 the old node and p1 the new;
#   6. resume the queues through the router.
#
# Before the split the node sent a smart_sending campaign to every
# recipient and holds a second mail for each, due tomorrow, and
# suppressions.  After it: each recipient's mail is on its own shard only,
# history and status (by the ids from before the split, which do not name
# a shard) answer through the router; a new campaign through the router is
# stopped for everyone by the passes that moved with them (the sink gets
# nothing new); a suppressed address stays suppressed on its shard; a
# token signed before the split unsubscribes; new ids are unique and name
# their shard.  The application's role, which owns a table of its own
# and was given gatekeeper.grant('shop_app', 'enqueue'), is on the new node
# as on the old: its table is still its own and it can enqueue there.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;

my $sharedir = `pg_config --sharedir`;
chomp $sharedir;
plan skip_all => 'plproxy is not installed (Debian: postgresql-15-plproxy)'
  unless -f "$sharedir/extension/plproxy.control";

my $n = 60;
my @recipients = map { "Split$_\@Example.com" } 1 .. $n;
my $sink = GatekeeperTest::start_sink(name => 'split_sink');

my $old = GatekeeperTest::new_node('old', sink => $sink, database => 'shop',
	conf => "gatekeeper.message_id_domain = 'shop.example'\n");
$old->start;
$old->safe_psql('postgres', 'CREATE DATABASE shop');
$old->safe_psql('shop', q{
CREATE EXTENSION gatekeeper;
CREATE ROLE shop_app LOGIN;
SELECT gatekeeper.grant('shop_app', 'enqueue');
CREATE TABLE orders (id int PRIMARY KEY, customer text);
ALTER TABLE orders OWNER TO shop_app;
SELECT gatekeeper.create_queue('promo', gates => '{smart_sending}',
	unsubscribe_url => 'https://shop.example/u/{token}');
SELECT gatekeeper.create_queue('reminders');
SELECT gatekeeper.suppress('gone' || i || '@example.com', 'hard_bounce') FROM generate_series(1, 8) AS i;
});
my $list = join(',', map { GatekeeperTest::sql_literal($_) } @recipients);
$old->safe_psql('shop', qq{
SELECT gatekeeper.enqueue(r, 'Spring sale', 'Body', queue => 'promo') FROM unnest(ARRAY[$list]) AS r;
SELECT gatekeeper.enqueue(r, 'Reminder', 'Body', queue => 'reminders', send_at => now() + interval '1 day',
	dedupe_key => 'rem:' || lower(r)) FROM unnest(ARRAY[$list]) AS r;
});
ok(GatekeeperTest::poll_until($old, 'shop',
		"SELECT sent = $n FROM gatekeeper.queue_stats WHERE queue = 'promo'", 't', 120),
	'before the split: the campaign went to every recipient');
my $before = GatekeeperTest::sink_count($sink);
is($before, $n, "the sink has $n mails");
my $token = $old->safe_psql('shop',
	"SELECT gatekeeper._unsubscribe_token('split7\@example.com', 'promo')");

# 1. pause every queue, wait until nothing is claimed
$old->safe_psql('shop', 'SELECT gatekeeper.pause(name) FROM gatekeeper.queue');
ok(GatekeeperTest::poll_until($old, 'shop',
		'SELECT sum(claimed) = 0 FROM gatekeeper.queue_stats'), 'paused, nothing claimed');

# 2. copy the database to the new node, a fresh server, by the commands
# of the docs' step 2: its sh block, each line run by the shell in one
# directory (the files are "copied over"), on the node the comment before
# it names (PGHOST and PGPORT)
my $new = GatekeeperTest::new_node('new', sink => $sink, database => 'shop',
	conf => "gatekeeper.message_id_domain = 'shop.example'\n");
$new->start;
is($new->safe_psql('postgres', "SELECT count(*) FROM pg_roles WHERE rolname = 'shop_app'"), '0',
	'the new node has no role of the application');
my @step2;
{
	my $docs = slurp_file("$FindBin::RealBin/../docs/sharding.md");
	my ($step) = $docs =~ /^2\. \*\*Copy the database to the new node\*\*(.*?)^3\. /ms;
	my ($block) = ($step // '') =~ /^\s*```sh\n(.*?)^\s*```/ms;
	my $on;
	foreach my $line (split /\n/, $block // '')
	{
		$line =~ s/^\s+//;
		if ($line =~ /^# on the (old|new) node/) { $on = $1; next; }
		next if $line eq '' || $line =~ /^#/;
		push @step2, [ $on, $line ];
	}
}
ok(@step2 >= 2 && !grep({ !defined $_->[0] } @step2), "the docs' step 2: " . scalar(@step2) . ' commands, each for a node');
my $copy = PostgreSQL::Test::Utils::tempdir();
my $superuser = $new->safe_psql('postgres', 'SELECT current_user');
# the docs' restore, into another database
my ($restore) = map { $_->[1] } grep { $_->[1] =~ /^pg_restore / } @step2;
my $scratch_restore = ($restore // '') =~ s/ -d shop / -d scratch /r;
my ($stdout, $stderr, $tried);
foreach my $c (@step2)
{
	my ($on, $command) = @$c;
	my $node = $on eq 'old' ? $old : $new;
	local $ENV{PGHOST} = $node->host;
	local $ENV{PGPORT} = $node->port;
	if ($on eq 'new' && !$tried++)
	{
		# before the roles: the restore stops, and leaves nothing behind
		$new->safe_psql('postgres', 'CREATE DATABASE scratch');
		ok(!IPC::Run::run([ 'bash', '-c', "cd '$copy' && $scratch_restore" ], '>', \$stdout, '2>', \$stderr),
			'without the roles the restore stops: ' . (split /\n/, $stderr)[0]);
		is($new->safe_psql('scratch', "SELECT count(*) FROM pg_class WHERE relnamespace::regnamespace::text = 'gatekeeper'"),
			'0', 'and leaves nothing of it behind');
	}
	my $ok = IPC::Run::run([ 'bash', '-c', "cd '$copy' && $command" ], '>', \$stdout, '2>', \$stderr);
	ok($ok, "on the $on node: $command");
	# the one error the docs expect: pg_dumpall's CREATE ROLE for the role
	# that runs the restore, which exists on every server
	my @errors = grep { /ERROR/ && !/role "\Q$superuser\E" already exists/ } split /\n/, $stderr;
	is(join("\n", @errors), '', "on the $on node: $command: no other error");
}
{
	local $ENV{PGHOST} = $new->host;
	local $ENV{PGPORT} = $new->port;
	ok(IPC::Run::run([ 'bash', '-c', "cd '$copy' && $scratch_restore" ], '>', \$stdout, '2>', \$stderr),
		'the roles made, the same restore runs again into the database it stopped in');
	$new->safe_psql('postgres', 'DROP DATABASE scratch');
}
is($new->safe_psql('shop', "SELECT tableowner FROM pg_tables WHERE tablename = 'orders'"), 'shop_app',
	'the application\'s table is its own on the new node');
is($new->safe_psql('shop', "SELECT count(*) FROM gatekeeper.suppression"), '8',
	'the new node has the suppressions');

# 3. and 4.
foreach my $s ([ $old, 0 ], [ $new, 1 ])
{
	my ($node, $part) = @$s;
	$node->safe_psql('shop', qq{
SELECT gatekeeper.shard($part, 2);
DELETE FROM gatekeeper.mail m WHERE (hashtext(lower(m.recipient)) & 1) <> $part;
DELETE FROM gatekeeper.suppression_list s WHERE (hashtext(lower(s.address)) & 1) <> $part;
UPDATE gatekeeper.gate_log g
   SET recipients = k.recipients, holders = k.holders
  FROM (SELECT g2.id, array_agg(u.r ORDER BY u.o) AS recipients,
			   CASE WHEN g2.holders IS NOT NULL THEN array_agg(u.h ORDER BY u.o) END AS holders
		  FROM gatekeeper.gate_log g2,
			   unnest(g2.recipients, g2.holders) WITH ORDINALITY AS u(r, h, o)
		 WHERE (hashtext(lower(u.r)) & 1) = $part
		 GROUP BY g2.id) k
 WHERE k.id = g.id;
DELETE FROM gatekeeper.gate_log g
 WHERE NOT EXISTS (SELECT FROM unnest(g.recipients) AS r WHERE (hashtext(lower(r)) & 1) = $part);
});
	$node->restart;
}

# 5. the router
my $router = PostgreSQL::Test::Cluster->new('split_router');
$router->init;
$router->start;
$router->safe_psql('postgres', "CREATE EXTENSION gatekeeper_router CASCADE;
CREATE SERVER gatekeeper FOREIGN DATA WRAPPER plproxy OPTIONS (
	p0 'host=" . $old->host . " port=" . $old->port . " dbname=shop',
	p1 'host=" . $new->host . " port=" . $new->port . " dbname=shop');
CREATE USER MAPPING FOR PUBLIC SERVER gatekeeper;");

# 6. resume through the router
$router->safe_psql('postgres', "SELECT gatekeeper.resume(q) FROM unnest(ARRAY['default', 'promo', 'reminders']) AS q");

my @owner = split /\n/, $router->safe_psql('postgres',
	"SELECT gatekeeper._hash(r) & 1 FROM unnest(ARRAY[$list]) WITH ORDINALITY AS u(r, o) ORDER BY o");
ok((grep { $_ == 0 } @owner) && (grep { $_ == 1 } @owner), 'the recipients are split between the shards');

# each recipient's mail on its own shard only
my @held = map { $_->safe_psql('shop',
		"SELECT string_agg(lower(recipient), ',' ORDER BY lower(recipient)) FROM gatekeeper.mail WHERE queue = 'reminders'") }
  ($old, $new);
foreach my $part (0, 1)
{
	my @mine = sort map { lc $recipients[$_] } grep { $owner[$_] == $part } 0 .. $#recipients;
	is($held[$part], join(',', @mine), "shard $part holds the reminders of its recipients, and no other");
}

# history and status through the router, by the ids from before the split
my $all_found = 1;
my $moved_id;
foreach my $i (0 .. $#recipients)
{
	my $h = $router->safe_psql('postgres',
		"SELECT string_agg(queue || ':' || state || ':' || id, ' ' ORDER BY id) FROM gatekeeper.history('$recipients[$i]')");
	my @rows = split / /, $h;
	$all_found = 0 unless @rows == 2 && $rows[0] =~ /^promo:sent:/ && $rows[1] =~ /^reminders:scheduled:/;
	my ($rid) = $rows[1] =~ /(\d+)$/;
	# an id whose low bit names the other shard: a mail that moved
	$moved_id //= $rid if defined $rid && ($rid & 1) != $owner[$i];
}
ok($all_found, 'history through the router: each recipient has its sent campaign mail and its reminder');
ok(defined $moved_id, 'some reminder ids from before the split do not name their shard');
is($router->safe_psql('postgres', "SELECT state FROM gatekeeper.status($moved_id)"),
	'scheduled', 'status through the router finds a mail whose id names the other shard');
is($router->safe_psql('postgres', "SELECT gatekeeper.find('reminders', 'rem:split3\@example.com')"),
	$router->safe_psql('postgres', "SELECT id FROM gatekeeper.history('Split3\@Example.com') WHERE queue = 'reminders'"),
	'find by key through the router');

# a second campaign through the router: the passes moved with their
# recipients, so smart_sending stops it for everyone
$router->safe_psql('postgres', "SELECT gatekeeper.create_queue('summer', gates => '{smart_sending}')");
my $ids = $router->safe_psql('postgres',
	"SELECT string_agg(gatekeeper.enqueue(r, 'Summer sale', 'Body', queue => 'summer')::text, ',') FROM unnest(ARRAY[$list]) AS r");
my @new_ids = split /,/, $ids;
ok((grep { ($new_ids[$_] & 1) == $owner[$_] } 0 .. $#new_ids) == $n, 'new ids name the shard of their recipient');
my %seen;
$seen{$_}++ foreach @new_ids;
is(scalar(keys %seen), $n, 'new ids are distinct');
ok(GatekeeperTest::poll_until($router, 'postgres',
		"SELECT suppressed = $n FROM gatekeeper.queue_stats WHERE queue = 'summer'", 't', 120),
	'the new campaign is suppressed for every recipient: their passes moved with them');
is(GatekeeperTest::sink_count($sink), $before, 'and nothing more reached the sink');

# suppressions stayed with their addresses
my @gone_owner = split /\n/, $router->safe_psql('postgres',
	"SELECT gatekeeper._hash('gone' || i || '\@example.com') & 1 FROM generate_series(1, 8) AS i ORDER BY i");
is(join(',', map { $_->safe_psql('shop', 'SELECT count(*) FROM gatekeeper.suppression') } ($old, $new)),
	join(',', scalar(grep { $_ == 0 } @gone_owner), scalar(grep { $_ == 1 } @gone_owner)),
	'each shard keeps the suppressions of its addresses only');

# a token signed before the split (the secret was copied)
is($router->safe_psql('postgres', "SELECT gatekeeper.unsubscribe('$token')"), 't',
	'a token from before the split unsubscribes through the router');

# the application's role enqueues on the new shard as it did on the node
my ($r_new) = map { $recipients[$_] } grep { $owner[$_] == 1 } 0 .. $#recipients;
like($new->safe_psql('shop',
		"SELECT gatekeeper.enqueue('$r_new', 'Later', 'Body', send_at => now() + interval '1 day')",
		extra_params => [ '-U', 'shop_app' ]),
	qr/^\d+$/, 'the application\'s role enqueues on the new shard');

$router->stop;
$old->stop;
$new->stop;
GatekeeperTest::stop_sink($sink);
done_testing();
