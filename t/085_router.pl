# Copyright: gatekeeper contributors
# gatekeeper-test: alone

# gatekeeper_router (issue 29): a routing node with plproxy and
# gatekeeper_router in front of four gatekeeper shards on loopback, each
# made shard n of 4 by gatekeeper.shard(n, 4), each shard's worker
# delivering to one smtp-sink.
#
# Three overlapping campaigns behind smart_sending, created through the
# router (on every shard), are enqueued through the router: the audience
# is COPYed into a staging table on the router and each row is one routed
# enqueue.  Every recipient gets exactly one promotional mail, from the
# shard that owns it (its Message-ID carries the mail's id, and the id
# modulo 4 is the shard that drew it, which must be hashtext(lower(
# recipient)) & 3), no Message-ID twice at the sink; queue_stats through
# the router equals the sum of the shards' own.
#
# Then status, cancel (by id and by key), find, history, suppress,
# unsuppress and unsubscribe through the router, each checked against the
# shard that holds the recipient; queue administration that one shard
# refuses changes no shard and names the shard.  Last, one shard is
# stopped: calls for its recipients fail with 08006 naming it, calls for
# the others succeed.
#
# GK_ROUTER_RECIPIENTS sets the audience (default 2000; the issue's
# 40,000 runs in a few minutes on two cores).

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $sharedir = `pg_config --sharedir`;
chomp $sharedir;
plan skip_all => 'plproxy is not installed (Debian: postgresql-15-plproxy)'
  unless -f "$sharedir/extension/plproxy.control";

my $n_recipients = $ENV{GK_ROUTER_RECIPIENTS} // 2000;
my $n_shards = 4;

my $sink = GatekeeperTest::start_sink(name => 'router_sink');

my @shards;
foreach my $i (0 .. $n_shards - 1)
{
	my $shard = GatekeeperTest::new_node("shard$i", sink => $sink,
		conf => "gatekeeper.message_id_domain = 'shop.example'\n");
	$shard->start;
	$shard->safe_psql('postgres',
		"CREATE EXTENSION gatekeeper; SELECT gatekeeper.shard($i, $n_shards);");
	push @shards, $shard;
}

my $router = PostgreSQL::Test::Cluster->new('router');
$router->init(extra => [ '--encoding=UTF8', '--no-locale' ]);
$router->append_conf('postgresql.conf', "statement_timeout = '120s'\n");
$router->start;
my $options = join(', ',
	map { "p$_ 'host=" . $shards[$_]->host . " port=" . $shards[$_]->port . " dbname=postgres'" }
	  0 .. $n_shards - 1);
$router->safe_psql(
	'postgres', qq{
CREATE EXTENSION gatekeeper_router CASCADE;
CREATE SERVER gatekeeper FOREIGN DATA WRAPPER plproxy OPTIONS ($options);
CREATE USER MAPPING FOR PUBLIC SERVER gatekeeper;
});

# the router's functions: search_path pinned, none for PUBLIC; the public
# ones have the shard's signatures (a few more: enqueue_batch, find and
# cancel by key and recipient, shard_queue_stats)
is( $router->safe_psql('postgres', q{
SELECT count(*) FROM pg_proc p
 WHERE p.pronamespace = 'gatekeeper'::regnamespace
   AND (NOT coalesce('search_path=pg_catalog, pg_temp' = ANY (p.proconfig), false)
		OR has_function_privilege('public', p.oid, 'EXECUTE'))}),
	'0', 'router: every function pins search_path, none is executable by PUBLIC');
# and every function an application calls (no leading underscore) says
# what it does in a COMMENT, as the shard's do (sql/27_function_comments.sql)
is( $router->safe_psql('postgres', q{
SELECT string_agg(p.oid::regprocedure::text, ', ' ORDER BY 1) FROM pg_proc p
 WHERE p.pronamespace = 'gatekeeper'::regnamespace AND p.proname !~ '^_'
   AND coalesce(obj_description(p.oid, 'pg_proc'), '') !~ '\w'}),
	'', 'router: every function without a leading underscore has a comment');
my $shard_api = $shards[0]->safe_psql('postgres', q{
SELECT string_agg(p.proname || '(' || pg_get_function_arguments(p.oid) || ') ' || pg_get_function_result(p.oid), E'\n' ORDER BY 1)
  FROM pg_proc p WHERE p.pronamespace = 'gatekeeper'::regnamespace
   AND p.proname IN ('enqueue', 'create_queue', 'alter_queue', 'drop_queue', 'pause', 'resume',
					 'cancel', 'cancel_queue', 'create_gate', 'alter_gate', 'drop_gate', 'status',
					 'find', 'history', 'suppress', 'unsuppress', 'unsubscribe')});
my $router_api = $router->safe_psql('postgres', q{
SELECT string_agg(p.proname || '(' || pg_get_function_arguments(p.oid) || ') ' || pg_get_function_result(p.oid), E'\n' ORDER BY 1)
  FROM pg_proc p WHERE p.pronamespace = 'gatekeeper'::regnamespace
   AND p.proname IN ('enqueue', 'create_queue', 'alter_queue', 'drop_queue', 'pause', 'resume',
					 'cancel', 'cancel_queue', 'create_gate', 'alter_gate', 'drop_gate', 'status',
					 'find', 'history', 'suppress', 'unsuppress', 'unsubscribe')
   AND p.oid::regprocedure::text NOT IN ('gatekeeper.find(text,text,text)', 'gatekeeper.cancel(text,text,text)')});
is($router_api, $shard_api, 'router: the application API has the shard\'s names, arguments, defaults and results');

# the shard that owns each address, as the router routes it
sub shard_of
{
	my (@addresses) = @_;
	my $list = join(',', map { GatekeeperTest::sql_literal($_) } @addresses);
	my @parts = split /\n/,
	  $router->safe_psql('postgres',
		"SELECT gatekeeper._hash(a) & 3 FROM unnest(ARRAY[$list]::text[]) WITH ORDINALITY AS u(a, o) ORDER BY o"
	  );
	return wantarray ? @parts : $parts[0];
}

# run SQL on the router; returns (exit code, stdout, stderr) with the
# SQLSTATE in the error (VERBOSITY verbose)
sub router_try
{
	my ($sql) = @_;
	my ($out, $err) = ('', '');
	my $rc = $router->psql('postgres', "\\set VERBOSITY verbose\n$sql",
		stdout => \$out, stderr => \$err, on_error_stop => 1);
	return ($rc, $out, $err);
}

# ---------------------------------------------------------------- campaigns
# administration through the router reaches every shard
$router->safe_psql(
	'postgres', q{
SELECT gatekeeper.create_queue('spring', gates => '{smart_sending}');
SELECT gatekeeper.create_queue('summer', gates => '{smart_sending}');
SELECT gatekeeper.create_queue('autumn', gates => '{smart_sending}',
	unsubscribe_url => 'https://shop.example/u/{token}');
});
foreach my $i (0 .. $n_shards - 1)
{
	is( $shards[$i]->safe_psql('postgres',
			"SELECT string_agg(name || ':' || array_to_string(gates, ','), ' ' ORDER BY name) FROM gatekeeper.queue WHERE name <> 'default'"
		),
		'autumn:smart_sending spring:smart_sending summer:smart_sending',
		"shard $i has the three campaigns, created through the router");
}

# three overlapping audiences: spring 1..60%, summer 40%..100%, autumn
# every third; together every recipient, most in two or three
my $audience = $router->basedir . '/audience.csv';
my %campaigns_of;
{
	open(my $fh, '>', $audience) or die "$audience: $!";
	foreach my $r (1 .. $n_recipients)
	{
		my $address = "Reader$r\@Example.com";
		my @c;
		push @c, 'spring' if $r <= 0.6 * $n_recipients;
		push @c, 'summer' if $r > 0.4 * $n_recipients;
		push @c, 'autumn' if $r % 3 == 0;
		print $fh "$address,$_\n" foreach @c;
		$campaigns_of{ lc $address } = scalar @c;
	}
	close($fh);
	chmod 0644, $audience;
}
my $rows = 0;
$rows += $_ foreach values %campaigns_of;

my $t0 = time;
$router->safe_psql(
	'postgres', qq{
CREATE TABLE audience (recipient text, campaign text);
COPY audience FROM '$audience' WITH (FORMAT csv);
});
# bounded: 20 ms a routed call at the most (they take 2-5 ms here)
my $bound = $rows / 50 > 120 ? int($rows / 50) : 120;
my $enqueued = $router->safe_psql(
	'postgres', qq{
SET statement_timeout = '${bound}s';
SELECT count(gatekeeper.enqueue(recipient, 'Our ' || campaign || ' sale', 'Hello ' || recipient,
		queue => campaign, dedupe_key => campaign || ':' || lower(recipient)))
  FROM audience});
my $enqueue_seconds = time - $t0;
is($enqueued, $rows, "$rows routed enqueues for $n_recipients recipients");
note(sprintf("routed enqueue: %d calls in %.1f s (%.0f/s)",
		$rows, $enqueue_seconds, $rows / $enqueue_seconds));

# every shard holds exactly its recipients' mail
my %expected_rows;
my @audience = sort keys %campaigns_of;
my @audience_owner = shard_of(@audience);
$expected_rows{ $audience_owner[$_] } += $campaigns_of{ $audience[$_] } foreach 0 .. $#audience;
foreach my $i (0 .. $n_shards - 1)
{
	is( $shards[$i]->safe_psql('postgres',
			"SELECT count(*) FROM gatekeeper.mail WHERE (gatekeeper.mail.id % 4) = $i AND queue IN ('spring', 'summer', 'autumn')"
		),
		$expected_rows{$i} // 0,
		"shard $i holds its recipients' mail, all with ids $i modulo 4");
}

# every campaign mail finished: sent or suppressed by smart_sending
ok( GatekeeperTest::poll_until(
		$router, 'postgres',
		"SELECT sum(scheduled + claimed) = 0 AND sum(sent + suppressed) = $rows FROM gatekeeper.queue_stats WHERE queue IN ('spring', 'summer', 'autumn')",
		't', 300),
	'every campaign mail finished, as queue_stats through the router says');
note(sprintf("enqueued and delivered in %.1f s", time - $t0));

# the sink: one mail per recipient, each once, from its own shard
my (%by_recipient, %message_ids, $wrong_shard, @pairs);
foreach my $m (GatekeeperTest::sink_messages($sink))
{
	my ($rcpt) = $m->{rcpt}[0] =~ /<?([^<>\s]+)>?/;
	$by_recipient{ lc $rcpt }++;
	$message_ids{ $m->{message_id} }++;
	my ($id) = $m->{message_id} =~ /^<(\d+)\./;
	push @pairs, [ lc $rcpt, $id ];
}
my @sent_to = keys %by_recipient;
is(scalar(@sent_to), $n_recipients, 'the sink received mail for every recipient');
is(scalar(grep { $by_recipient{$_} != 1 } @sent_to), 0, 'no recipient got two promotional mails');
is(scalar(grep { $message_ids{$_} != 1 } keys %message_ids), 0, 'no Message-ID arrived twice');
is(scalar(grep { !exists $campaigns_of{$_} } @sent_to), 0, 'no mail went to anyone outside the audience');
my @owners = shard_of(map { $_->[0] } @pairs);
$wrong_shard = grep { $pairs[$_][1] % 4 != $owners[$_] } 0 .. $#pairs;
is($wrong_shard, 0, 'every mail was sent by the shard that owns its recipient (its id modulo 4)');

# queue_stats through the router is the sum of the shards'
# (every count column of a shard's queue_stats, the router's has them all)
my $cols = 'scheduled, due, claimed, enqueued, sent, failed, suppressed, expired, cancelled, unknown, '
  . 'lease_expired, deferred, bounced, complained, retrying';
my %sum;
foreach my $shard (@shards)
{
	foreach my $line (split /\n/,
		$shard->safe_psql('postgres', "SELECT queue, $cols FROM gatekeeper.queue_stats"))
	{
		my ($q, @v) = split /\|/, $line;
		$sum{$q}[$_] += $v[$_] foreach 0 .. $#v;
	}
}
my $summed = join("\n", map { join('|', $_, @{ $sum{$_} }) } sort keys %sum);
is($router->safe_psql('postgres', "SELECT queue, $cols FROM gatekeeper.queue_stats ORDER BY queue"),
	$summed, 'queue_stats through the router equals the sum of the shards');
is( $router->safe_psql('postgres',
		"SELECT sum(sent) FROM gatekeeper.queue_stats WHERE queue IN ('spring', 'summer', 'autumn')"),
	$n_recipients, 'queue_stats: one sent mail per recipient');

# ---------------------------------------------------------------- lookups
# status of a sent mail, by the id its Message-ID carries
my ($some_rcpt, $some_id) = @{ $pairs[0] };
my $owner = shard_of($some_rcpt);
is($router->safe_psql('postgres', "SELECT id, queue, state, message_id, attempt, uncharged FROM gatekeeper.status($some_id)"),
	$shards[$owner]->safe_psql('postgres',
		"SELECT id, queue, state, message_id, attempt, uncharged FROM gatekeeper.status($some_id)"),
	'status through the router is the owning shard\'s');
is($router->safe_psql('postgres', "SELECT state FROM gatekeeper.status($some_id)"),
	'sent', 'status: sent');

# history: the recipient's mail, from its shard
is($router->safe_psql('postgres',
		"SELECT id, queue, state, subject FROM gatekeeper.history('$some_rcpt')"),
	$shards[$owner]->safe_psql('postgres',
		"SELECT id, queue, state, subject FROM gatekeeper.history('$some_rcpt')"),
	'history through the router is the owning shard\'s');

# cancel by id and by key; find by key (with and without the recipient)
my @later = map { "later$_\@example.com" } 1 .. 8;
my %later_id;
foreach my $r (@later)
{
	$later_id{$r} = $router->safe_psql('postgres',
		"SELECT gatekeeper.enqueue('$r', 'Later', 'Body', send_at => now() + interval '1 day', dedupe_key => 'later:$r')"
	);
}
my @later_owner = shard_of(@later);
ok((grep { $later_id{ $later[$_] } % 4 == $later_owner[$_] } 0 .. $#later) == @later,
	'routed enqueue returns ids that name the owning shard');
is($router->safe_psql('postgres', "SELECT gatekeeper.cancel($later_id{$later[0]})"),
	't', 'cancel by id through the router');
is($shards[ $later_owner[0] ]->safe_psql('postgres',
		"SELECT state FROM gatekeeper.status($later_id{$later[0]})"),
	'cancelled', 'the owning shard has it cancelled');
is($router->safe_psql('postgres', "SELECT gatekeeper.cancel($later_id{$later[0]})"),
	'f', 'cancel of a cancelled mail: false');
is($router->safe_psql('postgres', "SELECT gatekeeper.find('default', 'later:$later[1]')"),
	$later_id{ $later[1] }, 'find by key asks every shard');
is($router->safe_psql('postgres', "SELECT gatekeeper.find('default', 'later:$later[1]', '$later[1]')"),
	$later_id{ $later[1] }, 'find by key and recipient asks the recipient\'s shard');
is($router->safe_psql('postgres', "SELECT gatekeeper.find('default', 'no such key')"),
	'', 'find of an unknown key: NULL');
is($router->safe_psql('postgres', "SELECT gatekeeper.cancel('default', 'later:$later[2]')"),
	't', 'cancel by key through the router');
is($shards[ $later_owner[2] ]->safe_psql('postgres',
		"SELECT state FROM gatekeeper.status($later_id{$later[2]})"),
	'cancelled', 'the owning shard has the keyed mail cancelled');

# suppress, unsuppress: on the address's shard only
my $sup = 'Suppressed@Example.com';
my $sup_owner = shard_of($sup);
is($router->safe_psql('postgres', "SELECT gatekeeper.suppress('$sup', 'complaint')"),
	't', 'suppress through the router');
is(join(',', map { $_->safe_psql('postgres', "SELECT count(*) FROM gatekeeper.suppression WHERE address = 'suppressed\@example.com'") } @shards),
	join(',', map { $_ == $sup_owner ? 1 : 0 } 0 .. $n_shards - 1),
	'the suppression is on the address\'s shard only');
is($router->safe_psql('postgres', "SELECT gatekeeper.unsuppress('$sup')"),
	't', 'unsuppress through the router');
is($shards[$sup_owner]->safe_psql('postgres', "SELECT count(*) FROM gatekeeper.suppression"),
	'0', 'the shard\'s suppression is gone');

# unsubscribe: a token of autumn's List-Unsubscribe, as a reader's click sends it
my $reader = 'reader3@example.com';
my $reader_owner = shard_of($reader);
my $token = $shards[$reader_owner]->safe_psql('postgres',
	"SELECT gatekeeper._unsubscribe_token('$reader', 'autumn')");
is($router->safe_psql('postgres', "SELECT gatekeeper.unsubscribe('$token')"),
	't', 'unsubscribe through the router');
is($shards[$reader_owner]->safe_psql('postgres',
		"SELECT queue || ':' || reason FROM gatekeeper.suppression WHERE address = '$reader'"),
	'autumn:unsubscribe', 'the recipient\'s shard has the unsubscribe');
my ($rc, $out, $err) = router_try("SELECT gatekeeper.unsubscribe('${token}x')");
like($err, qr/ERROR:  22023: invalid unsubscribe token/, 'a forged token: 22023');

# enqueue_batch: rows as arrays, one call per shard; ids in row order,
# each on its recipient's shard; run again, the dedupe keys give the same ids
my @batch = map { "batch$_\@example.com" } 1 .. 20;
my $batch_list = join(',', map { "'$_'" } @batch);
my $batch_sql = qq{SELECT array_to_string(gatekeeper.enqueue_batch(ARRAY[$batch_list],
	array_fill('Batch'::text, ARRAY[20]), array_fill('Body'::text, ARRAY[20]),
	send_at => now() + interval '1 day',
	dedupe_keys => ARRAY(SELECT 'batch:' || r FROM unnest(ARRAY[$batch_list]) AS r)), ',')};
my @batch_ids = split /,/, $router->safe_psql('postgres', $batch_sql);
my @batch_owner = shard_of(@batch);
is(scalar(grep { defined $batch_ids[$_] && $batch_ids[$_] % 4 == $batch_owner[$_] } 0 .. $#batch),
	20, 'enqueue_batch: 20 ids, each naming the shard of its row\'s recipient');
is(join(',', map { $_->safe_psql('postgres', "SELECT count(*) FROM gatekeeper.mail WHERE recipient LIKE 'batch%'") } @shards),
	join(',', map { my $p = $_; scalar(grep { $_ == $p } @batch_owner) } 0 .. $n_shards - 1),
	'enqueue_batch: each shard holds its recipients\' rows');
is($router->safe_psql('postgres', $batch_sql), join(',', @batch_ids),
	'enqueue_batch again: the dedupe keys give back the same ids');
($rc, $out, $err) = router_try(
	"SELECT gatekeeper.enqueue_batch(ARRAY['ok\@example.com', 'not an address'], ARRAY['S', 'S'], ARRAY['B', 'B'])");
like($err, qr/ERROR:  22023: enqueue_batch was refused by gatekeeper shard p\d .*invalid recipient address/,
	'enqueue_batch with an invalid row: 22023, naming the shard');

# administration one shard refuses: no shard changes, the shard is named
$shards[2]->safe_psql('postgres', "SELECT gatekeeper.create_queue('clash')");
($rc, $out, $err) = router_try("SELECT gatekeeper.create_queue('clash', weight => 3)");
like($err, qr/ERROR:  42710: create_queue was refused by gatekeeper shard p2 .*queue "clash" already exists/,
	'create_queue refused by one shard: 42710, naming it');
is(join(',', map { $_->safe_psql('postgres', "SELECT count(*) FROM gatekeeper.queue WHERE name = 'clash'") } @shards),
	'0,0,1,0', 'no other shard got the queue');

# ---------------------------------------------------------------- a shard down
my $down = 3;
$shards[$down]->stop('fast');
my ($r_down) = grep { shard_of($_) == $down } map { "down$_\@example.com" } 1 .. 100;
my ($r_up) = grep { shard_of($_) != $down } map { "up$_\@example.com" } 1 .. 100;
($rc, $out, $err) = router_try("SELECT gatekeeper.enqueue('$r_down', 'S', 'B')");
like($err, qr/ERROR:  08006: gatekeeper shard p3 \(host=\S+ port=\d+ dbname=postgres\) is unreachable/,
	'enqueue for a recipient of the stopped shard: 08006 naming it');
($rc, $out, $err) = router_try("SELECT gatekeeper.enqueue('$r_up', 'S', 'B') > 0");
is($out, 't', 'enqueue for a recipient of another shard succeeds');
($rc, $out, $err) = router_try("SELECT count(*) FROM gatekeeper.history('$r_down')");
like($err, qr/08006: gatekeeper shard p3 .* is unreachable/, 'history on the stopped shard: 08006');
($rc, $out, $err) = router_try("SELECT count(*) FROM gatekeeper.history('$r_up')");
is($out, '1', 'history on another shard succeeds');
my ($id_up) = map { $_->[1] } grep { $_->[1] % 4 != $down } @pairs;
($rc, $out, $err) = router_try("SELECT state FROM gatekeeper.status($id_up)");
is($out, 'sent', 'status of a mail on another shard succeeds');
($rc, $out, $err) = router_try("SELECT gatekeeper.suppress('$r_down')");
like($err, qr/08006: gatekeeper shard p3 .* is unreachable/, 'suppress on the stopped shard: 08006');
($rc, $out, $err) = router_try("SELECT count(*) FROM gatekeeper.queue_stats");
like($err, qr/08006: gatekeeper shard p3 .* is unreachable/, 'queue_stats needs every shard: 08006 naming it');
($rc, $out, $err) = router_try("SELECT gatekeeper.create_queue('while_down')");
like($err, qr/08006: gatekeeper shard p3 .* is unreachable/, 'create_queue needs every shard: 08006 naming it');
is(join(',', map { $shards[$_]->safe_psql('postgres', "SELECT count(*) FROM gatekeeper.queue WHERE name = 'while_down'") } 0 .. 2),
	'0,0,0', 'and no shard got the queue');

$shards[$down]->start;
($rc, $out, $err) = router_try("SELECT gatekeeper.enqueue('$r_down', 'S', 'B') > 0");
is($out, 't', 'the shard back: its recipients can be enqueued again');

$_->stop foreach @shards;
$router->stop;
GatekeeperTest::stop_sink($sink);
done_testing();
