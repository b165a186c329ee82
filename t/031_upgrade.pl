# Copyright: gatekeeper contributors

# The update from 0.1.0 (the released version) to the current one.
#
# Database "updated": CREATE EXTENSION gatekeeper VERSION '0.1.0', data in
# it (gates, queues with options, the built-in rows changed, mail in
# several states, gate passes by gate_pass and by claims), then ALTER
# EXTENSION gatekeeper UPDATE.  Database "fresh": CREATE EXTENSION
# gatekeeper.  Both must have the same catalog objects: the extension's
# members; functions with their signatures, defaults, result types,
# properties (kind, volatility, strictness, parallel safety, SECURITY
# DEFINER, settings such as search_path), bodies and ACLs; tables with
# their columns in order (types, defaults, NOT NULL, identity, generated,
# compression), options and ACLs; constraints; indexes; views; triggers
# (enabled or not); sequences; types and enum labels; the extension's
# config tables and their dump conditions; comments.  A mismatch prints
# what is only in one of them, object by object.
#
# The updated database keeps its data: every row of every table (in the
# columns 0.1.0 had), the sequences, and what explain() says of the
# recipients' passes, are as before the update; and it works after.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = GatekeeperTest::new_node('upgrade', conf => "gatekeeper.workers = 0\n");
$node->start;

my $current = $node->safe_psql('postgres',
	"SELECT default_version FROM pg_available_extensions WHERE name = 'gatekeeper'");
isnt($current, '0.1.0', "the current version ($current) is not 0.1.0");

$node->safe_psql('postgres', 'CREATE DATABASE updated');
$node->safe_psql('postgres', 'CREATE DATABASE fresh');

$node->safe_psql('updated', "CREATE EXTENSION gatekeeper VERSION '0.1.0'");
$node->safe_psql('fresh', 'CREATE EXTENSION gatekeeper');
is($node->safe_psql('updated', "SELECT extversion FROM pg_extension WHERE extname = 'gatekeeper'"),
	'0.1.0', 'updated: 0.1.0 installed');

# EXECUTE grants carry over to the functions that replace 0.1.0's array
# overloads (issue 13): granted on the old ones in "updated" and on their
# replacements in "fresh", so that the ACLs compared below must match
$node->safe_psql('postgres', 'CREATE ROLE upgrade_worker; CREATE ROLE upgrade_gates; CREATE ROLE upgrade_app');
$node->safe_psql('updated', q{
GRANT EXECUTE ON FUNCTION gatekeeper.ack(bigint[], int[]), gatekeeper.nack(bigint, int, text, boolean)
   TO upgrade_worker;
GRANT EXECUTE ON FUNCTION gatekeeper.gate_pass(text, text[]) TO upgrade_gates;
GRANT EXECUTE ON FUNCTION gatekeeper.cancel(bigint) TO upgrade_app;
});
$node->safe_psql('fresh', q{
GRANT EXECUTE ON FUNCTION gatekeeper.ack_batch(bigint[], int[]), gatekeeper.nack(bigint, int, text, boolean),
                          gatekeeper.nack_batch(bigint[], int[], text[], boolean) TO upgrade_worker;
GRANT EXECUTE ON FUNCTION gatekeeper.gate_pass_batch(text, text[]) TO upgrade_gates;
GRANT EXECUTE ON FUNCTION gatekeeper.cancel(bigint), gatekeeper.cancel(text, text) TO upgrade_app;
});

# 0.1.0 in use
$node->safe_psql(
	'updated', q{
SELECT gatekeeper.create_gate('weekly', '7 days', 3);
SELECT gatekeeper.create_queue('promo', gates => '{smart_sending,weekly}', on_gate_closed => 'defer',
	max_attempts => 3, weight => 2, rate_limit => 1000, dedupe_window => '1 day');
SELECT gatekeeper.create_queue('news', delivery => 'at_most_once');
SELECT gatekeeper.pause('news');
SELECT gatekeeper.alter_queue('default', weight => 5);
SELECT gatekeeper.alter_gate('smart_sending', period => '20 hours');

SELECT gatekeeper.enqueue('sent@example.com', 'Sent', 'Body', queue => 'promo', dedupe_key => 'sent-1');
SELECT gatekeeper.enqueue('failed@example.com', 'Failed', 'Body', queue => 'promo', dedupe_key => 'failed-1');
SELECT gatekeeper.enqueue('held@example.com', 'Held', 'Body', queue => 'promo', dedupe_key => 'held-1');
CREATE TEMP TABLE c AS SELECT * FROM gatekeeper.claim('w1', 10, queues => '{promo}');
SELECT gatekeeper.ack(id, attempt) FROM c WHERE recipient = 'sent@example.com';
SELECT gatekeeper.nack(id, attempt, 'mailbox unavailable', true) FROM c WHERE recipient = 'failed@example.com';

SELECT gatekeeper.gate_pass('smart_sending', 'passed@example.com');
SELECT gatekeeper.gate_pass('weekly', 'capped@example.com', h) FROM generate_series(1, 3) AS h;
SELECT * FROM gatekeeper.gate_pass('weekly', ARRAY['b1@example.com', 'b2@example.com']);

SELECT gatekeeper.enqueue('passed@example.com', 'Passed', 'Body', queue => 'promo', dedupe_key => 'passed-1');
SELECT gatekeeper.enqueue('fresh@example.com', 'Fresh', 'Body', queue => 'promo', dedupe_key => 'fresh-1',
	headers => '{"X-Campaign": "spring"}', html => '<p>Fresh</p>', priority => 3);
SELECT gatekeeper.enqueue('later@example.com', 'Later', 'Body', send_at => now() + interval '2 days');
SELECT gatekeeper.enqueue('news@example.com', 'News', 'Body', queue => 'news');
SELECT gatekeeper.cancel(gatekeeper.enqueue('gone@example.com', 'Gone', 'Body', send_at => now() + interval '1 day'));

-- the other terminal states: suppressed at a closed gate, expired past
-- send_by, unknown (an at-most-once lease ran out); and a retry due later
SELECT gatekeeper.create_queue('strict', gates => '{smart_sending}');
SELECT gatekeeper.create_queue('once', delivery => 'at_most_once');
SELECT gatekeeper.enqueue('passed@example.com', 'Suppressed', 'Body', queue => 'strict');
SELECT gatekeeper.enqueue('late@example.com', 'Expired', 'Body', queue => 'strict',
	send_at => now() - interval '2 hours', send_by => now() - interval '1 hour');
SELECT gatekeeper.enqueue('lost@example.com', 'Unknown', 'Body', queue => 'once');
SELECT gatekeeper.enqueue('retry@example.com', 'Retry', 'Body', queue => 'once');
SELECT count(*) FROM gatekeeper.claim('w3', 10, queues => '{strict,once}');
SELECT gatekeeper.nack(id, attempt, '451 try later') FROM gatekeeper.mail WHERE recipient = 'retry@example.com';
UPDATE gatekeeper.mail SET lease_until = now() - interval '1 second' WHERE recipient = 'lost@example.com';
SELECT gatekeeper.reap();
});

# ---------------------------------------------------------------- data

my @recipients = map { "$_\@example.com" }
  qw(sent failed held passed fresh capped b1 b2 news new);
my %table_key = (queue => 'name', gate => 'name', mail => 'id', gate_log => 'id');

# the tables' columns in the updated database now (0.1.0's); durations are
# compared by length, since the update stores each as its exact length
# ('7 days' becomes '168:00:00', the same interval)
my %old_columns;
foreach my $table (sort keys %table_key)
{
	$old_columns{$table} = $node->safe_psql(
		'updated', qq{
SELECT string_agg(CASE WHEN atttypid = 'interval'::regtype
					   THEN format('extract(epoch FROM %I)', attname)
					   ELSE quote_ident(attname) END, ', ' ORDER BY attnum) FROM pg_attribute
 WHERE attrelid = 'gatekeeper.$table'::regclass AND attnum > 0 AND NOT attisdropped});
}

sub data_snapshot
{
	my ($db) = @_;
	my %s;
	foreach my $table (sort keys %table_key)
	{
		# 0.2.0 keeps the mail's state apart from its content:
		# gatekeeper.mail_status has every column 0.1.0's mail had
		my $from = $table;
		$from = 'mail_status'
		  if $table eq 'mail'
		  && $node->safe_psql($db, "SELECT to_regclass('gatekeeper.mail_status') IS NOT NULL") eq 't';
		$s{$table} = $node->safe_psql($db,
			"SELECT $old_columns{$table} FROM gatekeeper.$from ORDER BY $table_key{$table}");
	}
	foreach my $seq (qw(mail gate gate_log))
	{
		$s{"${seq}_id_seq"} = $node->safe_psql($db,
			"SELECT last_value, is_called FROM gatekeeper.${seq}_id_seq");
	}
	my $list = join(',', map { "'$_'" } @recipients);
	$s{passes} = $node->safe_psql(
		$db, qq{
SELECT r, e.gate, e.open, e.next_open, e.sends_in_period, e.max_sends
  FROM unnest(ARRAY[$list]) AS r, gatekeeper.explain(r) AS e
 ORDER BY r, e.gate});
	return \%s;
}

my $before = data_snapshot('updated');
foreach my $state (qw(scheduled claimed sent failed suppressed expired cancelled unknown))
{
	like($before->{mail}, qr/\|$state\|/, "updated: mail $state before the update");
}

$node->safe_psql('updated', 'ALTER EXTENSION gatekeeper UPDATE');
is($node->safe_psql('updated', "SELECT extversion FROM pg_extension WHERE extname = 'gatekeeper'"),
	$current, "updated: ALTER EXTENSION gatekeeper UPDATE reaches $current");

my $after = data_snapshot('updated');
foreach my $what (sort keys %$before)
{
	is($after->{$what}, $before->{$what}, "updated: $what intact");
}

# queue_stats' live counts (kept in mail_live_count from the update on)
# against a count of the live mail
my $kept_counts = q{
SELECT string_agg(format('%s %s/%s/%s', queue, scheduled, claimed, due), ', ' ORDER BY queue)
  FROM gatekeeper.queue_stats WHERE scheduled + claimed > 0};
my $live_counts = q{
SELECT string_agg(format('%s %s/%s/%s', queue, s, c, d), ', ' ORDER BY queue)
  FROM (SELECT queue, count(*) FILTER (WHERE state = 'scheduled') AS s,
			   count(*) FILTER (WHERE state = 'claimed') AS c,
			   count(*) FILTER (WHERE state = 'scheduled' AND send_at <= now()) AS d
		  FROM gatekeeper.mail_live GROUP BY queue) l};
my $counted = $node->safe_psql('updated', $live_counts);
like($counted, qr{ [1-9][0-9]*/[1-9]}, 'updated: live mail both scheduled and claimed in one queue');
is($node->safe_psql('updated', $kept_counts), $counted,
	'updated: queue_stats counts the live mail the update moved');

# ---------------------------------------------------------------- catalog

# Each query returns one line per object, in a form that does not depend
# on OIDs or on the order objects were made in.  ACLs are compared as
# effective privileges (NULL as the default it stands for), sorted.
my $ext = "(SELECT oid FROM pg_extension WHERE extname = 'gatekeeper')";
my $nsp = "'gatekeeper'::regnamespace";
my $rels = "(SELECT oid FROM pg_class WHERE relnamespace = $nsp)";

sub acl
{
	my ($column, $kind, $owner) = @_;
	return
	  "(SELECT array_agg(a::text ORDER BY a::text) FROM unnest(coalesce($column, acldefault($kind, $owner))) AS a)";
}

my %catalog_queries = (
	members => qq{
SELECT pg_describe_object(classid, objid, objsubid) FROM pg_depend
 WHERE refclassid = 'pg_extension'::regclass AND refobjid = $ext AND deptype = 'e'},

	schema => qq{
SELECT nspname, @{[ acl('nspacl', "'n'", 'nspowner') ]} FROM pg_namespace WHERE oid = $nsp},

	functions => qq{
SELECT concat_ws(' | ', p.oid::regprocedure::text, 'args: ' || pg_get_function_arguments(p.oid),
	   'returns: ' || pg_get_function_result(p.oid), 'kind ' || p.prokind::text, 'lang ' || l.lanname,
	   'volatility ' || p.provolatile::text, 'strict ' || p.proisstrict, 'security definer ' || p.prosecdef,
	   'leakproof ' || p.proleakproof, 'parallel ' || p.proparallel::text, 'cost ' || p.procost,
	   'rows ' || p.prorows, 'config ' || coalesce(p.proconfig::text, '-'),
	   'acl ' || @{[ acl('p.proacl', "'f'", 'p.proowner') ]}::text)
  FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
 WHERE p.pronamespace = $nsp},

	# bodies, with runs of white space as one space
	function_bodies => qq{
SELECT p.oid::regprocedure::text || ' body ' ||
	   md5(btrim(regexp_replace(p.prosrc, '\\s+', ' ', 'g')) || coalesce(' ' || p.probin, ''))
  FROM pg_proc p WHERE p.pronamespace = $nsp},

	relations => qq{
SELECT concat_ws(' | ', c.relname, 'kind ' || c.relkind::text, 'persistence ' || c.relpersistence::text,
	   'options ' || coalesce(c.reloptions::text, '-'), 'rls ' || c.relrowsecurity,
	   'acl ' || @{[ acl('c.relacl', q{(CASE WHEN c.relkind = 'S' THEN 's' ELSE 'r' END)::"char"}, 'c.relowner') ]}::text)
  FROM pg_class c WHERE c.relnamespace = $nsp AND c.relkind <> 'i'},

	columns => qq{
SELECT concat_ws(' | ', c.relname || '.' || a.attname,
	   'position ' || row_number() OVER (PARTITION BY c.oid ORDER BY a.attnum),
	   format_type(a.atttypid, a.atttypmod), 'not null ' || a.attnotnull,
	   'default ' || coalesce(pg_get_expr(d.adbin, d.adrelid), '-'),
	   'identity ' || a.attidentity::text, 'generated ' || a.attgenerated::text,
	   'compression ' || a.attcompression::text, 'collation ' || coalesce(co.collname, '-'),
	   'acl ' || coalesce(a.attacl::text, '-'))
  FROM pg_class c
  JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
  LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
  LEFT JOIN pg_collation co ON co.oid = a.attcollation AND a.attcollation <> 0
 WHERE c.relnamespace = $nsp AND c.relkind IN ('r', 'p', 'v', 'm', 'c', 'f')},

	constraints => qq{
SELECT concat_ws(' | ', coalesce(c.relname, t.typname) || ': ' || k.conname, 'type ' || k.contype::text,
	   pg_get_constraintdef(k.oid), 'validated ' || k.convalidated,
	   'deferrable ' || k.condeferrable || '/' || k.condeferred)
  FROM pg_constraint k
  LEFT JOIN pg_class c ON c.oid = k.conrelid
  LEFT JOIN pg_type t ON t.oid = k.contypid
 WHERE k.connamespace = $nsp},

	indexes => qq{
SELECT pg_get_indexdef(i.indexrelid) || coalesce(' options ' || ic.reloptions::text, '')
  FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid
 WHERE i.indrelid IN $rels},

	views => qq{
SELECT c.relname || ': ' || regexp_replace(pg_get_viewdef(c.oid, true), '\\s+', ' ', 'g')
  FROM pg_class c WHERE c.relnamespace = $nsp AND c.relkind IN ('v', 'm')},

	# internal (foreign key) triggers are named by their constraint
	triggers => qq{
SELECT concat_ws(' | ', c.relname,
	   CASE WHEN t.tgisinternal
			THEN 'internal for ' || k.conname || ' ' || t.tgfoid::regproc::text || ' type ' || t.tgtype
			ELSE pg_get_triggerdef(t.oid, true) END,
	   'enabled ' || t.tgenabled::text)
  FROM pg_trigger t
  JOIN pg_class c ON c.oid = t.tgrelid
  LEFT JOIN pg_constraint k ON k.oid = t.tgconstraint
 WHERE t.tgrelid IN $rels},

	sequences => qq{
SELECT concat_ws(' | ', c.relname, format_type(s.seqtypid, NULL), 'start ' || s.seqstart,
	   'increment ' || s.seqincrement, 'min ' || s.seqmin, 'max ' || s.seqmax,
	   'cache ' || s.seqcache, 'cycle ' || s.seqcycle,
	   'owned by ' || coalesce((SELECT d.deptype::text || ' ' || tc.relname || '.' || a.attname
								  FROM pg_depend d
								  JOIN pg_class tc ON tc.oid = d.refobjid
								  JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
								 WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
								   AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')), '-'))
  FROM pg_sequence s JOIN pg_class c ON c.oid = s.seqrelid
 WHERE c.relnamespace = $nsp},

	types => qq{
SELECT concat_ws(' | ', t.typname, 'type ' || t.typtype::text,
	   CASE WHEN t.typtype = 'e'
			THEN 'labels ' || (SELECT string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder)
								 FROM pg_enum e WHERE e.enumtypid = t.oid) END,
	   CASE WHEN t.typtype = 'd' THEN 'base ' || format_type(t.typbasetype, t.typtypmod) END,
	   'acl ' || @{[ acl('t.typacl', "'T'", 't.typowner') ]}::text)
  FROM pg_type t
 WHERE t.typnamespace = $nsp
   AND NOT (t.typtype = 'c' AND t.typrelid IN (SELECT oid FROM pg_class WHERE relkind <> 'c'))
   AND t.typelem = 0},

	config => qq{
SELECT u.c::regclass::text || ' ' || coalesce(quote_literal(u.cond), 'NULL')
  FROM pg_extension x, unnest(x.extconfig, x.extcondition) AS u(c, cond)
 WHERE x.extname = 'gatekeeper'},

	comments => qq{
SELECT pg_describe_object(d.classoid, d.objoid, d.objsubid) || ': ' || d.description
  FROM pg_description d
 WHERE (d.classoid = 'pg_extension'::regclass AND d.objoid = $ext)
	OR (d.classoid, d.objoid) IN (SELECT classid, objid FROM pg_depend
								   WHERE refclassid = 'pg_extension'::regclass AND refobjid = $ext
									 AND deptype = 'e')
	OR (d.classoid = 'pg_class'::regclass AND d.objoid IN $rels)
	OR (d.classoid = 'pg_constraint'::regclass AND d.objoid IN (SELECT oid FROM pg_constraint WHERE connamespace = $nsp))
	OR (d.classoid = 'pg_trigger'::regclass AND d.objoid IN (SELECT oid FROM pg_trigger WHERE tgrelid IN $rels))});

sub catalog
{
	my ($db, $what) = @_;
	my $out = $node->safe_psql($db,
		"SELECT line FROM ($catalog_queries{$what}) AS q(line) ORDER BY 1");
	return [ split /\n/, $out ];
}

foreach my $what (sort keys %catalog_queries)
{
	my $fresh = catalog('fresh', $what);
	my $updated = catalog('updated', $what);
	my %in_fresh = map { $_ => 1 } @$fresh;
	my %in_updated = map { $_ => 1 } @$updated;
	my @only_fresh = grep { !$in_updated{$_} } @$fresh;
	my @only_updated = grep { !$in_fresh{$_} } @$updated;
	ok(@$fresh > 0 || $what eq 'comments', "fresh: some $what to compare");
	ok(!@only_fresh && !@only_updated,
		"$what: the same after the update from 0.1.0 as in a fresh install")
	  or diag(join("\n",
		"$what differ:",
		(map { "  only in fresh $current:   $_" } @only_fresh),
		(map { "  only in updated 0.1.0:  $_" } @only_updated)));
}

# ---------------------------------------------------------------- works after

is( $node->safe_psql(
		'updated', q{
SELECT gatekeeper.gate_pass('smart_sending', 'passed@example.com'),
	   gatekeeper.gate_pass('smart_sending', 'failed@example.com'),
	   gatekeeper.gate_pass('smart_sending', 'new@example.com')}),
	'f|t|t', 'updated: passes made before the update hold, others are open');
is( $node->safe_psql(
		'updated', "SELECT string_agg(recipient, ',') FROM gatekeeper.claim('w2', 10, queues => '{promo}')"),
	'fresh@example.com', 'updated: claim after the update passes the open recipient only');
is( $node->safe_psql(
		'updated', q{
SELECT gatekeeper.enqueue('sent@example.com', 'Again', 'Body', queue => 'promo', dedupe_key => 'sent-1')
	   = (SELECT id FROM gatekeeper.mail WHERE dedupe_key = 'sent-1'),
	   gatekeeper.enqueue('one@example.com', 'New', 'Body') > 0}),
	't|t', 'updated: enqueue after the update');
is($node->safe_psql('updated', $kept_counts), $node->safe_psql('updated', $live_counts),
	'updated: queue_stats keeps counting after claims and enqueues');
$node->safe_psql('updated', "SELECT gatekeeper.create_gate('brand_new', '1 hour')");
$node->safe_psql('updated', "SELECT gatekeeper.create_queue('brand_new', gates => '{brand_new}')");

$node->stop;
done_testing();
