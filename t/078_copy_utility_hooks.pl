# Copyright: gatekeeper contributors

# A COPY into gatekeeper.mail is written straight into the current
# segment's partition, batched (src/mail_copy.c), by gatekeeper's
# ProcessUtility hook, and never past another library's hook on the
# statement: with pg_stat_statements preloaded after gatekeeper (its hook
# runs first, then gatekeeper's) the COPY is batched and counted; preloaded
# before gatekeeper, the COPY is left to it and to PostgreSQL, row by row,
# and still counted.  Either way every row is a scheduled mail.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = GatekeeperTest::new_node('copy_hooks', conf => "gatekeeper.workers = 0\n");
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'gatekeeper,pg_stat_statements'\n");
$node->start;
$node->safe_psql('postgres', q{
	CREATE EXTENSION gatekeeper;
	CREATE EXTENSION pg_stat_statements;
	CREATE EXTENSION pg_walinspect;
	SELECT gatekeeper.create_queue('hooks');
});

# COPY $n mails (recipients "$tag<i>@hooks.example") from a client, as an
# application would; returns the heap records of the current segment's
# partition it wrote: "single|multi"
sub copy_mails
{
	my ($tag, $n) = @_;
	my $lsn = $node->safe_psql('postgres', 'SELECT pg_current_wal_insert_lsn()');
	my $data = join('', map { "$tag$_\@hooks.example,Hello,Body,hooks\n" } 1 .. $n);
	$node->safe_psql('postgres',
		"COPY gatekeeper.mail (recipient, subject, body, queue) FROM STDIN (FORMAT csv);\n$data\\.\n");
	return $node->safe_psql('postgres', qq{
		SELECT count(*) FILTER (WHERE record_type LIKE 'INSERT%') || '|' ||
			   count(*) FILTER (WHERE record_type LIKE 'MULTI_INSERT%')
		  FROM pg_get_wal_records_info('$lsn', pg_current_wal_flush_lsn())
		 WHERE resource_manager IN ('Heap', 'Heap2')
		   AND block_ref LIKE '%/' || pg_relation_filenode(format('gatekeeper.mail_%s',
				   current_setting('gatekeeper.current_segment'))::regclass) || ' %'});
}

# what pg_stat_statements counted of COPY statements into gatekeeper.mail
sub counted
{
	return $node->safe_psql('postgres', q{
		SELECT coalesce(sum(calls), 0) || '|' || coalesce(sum(rows), 0) FROM pg_stat_statements
		 WHERE query LIKE 'COPY gatekeeper.mail %'});
}

# the mails of a tag, by state
sub states
{
	my ($tag) = @_;
	return $node->safe_psql('postgres', qq{
		SELECT string_agg(state || ':' || n, ',' ORDER BY state)
		  FROM (SELECT state, count(*) AS n FROM gatekeeper.mail_status
				 WHERE recipient LIKE '$tag%\@hooks.example' GROUP BY state) s});
}

# gatekeeper first: its hook is the last to run, and batches the COPY
my ($single, $multi) = split /\|/, copy_mails('first', 50);
is($single, 0, 'gatekeeper preloaded first: no row of the COPY written by itself');
cmp_ok($multi, '>=', 1, 'gatekeeper preloaded first: the COPY written by multi-row inserts');
is(counted(), '1|50', 'pg_stat_statements counted the batched COPY and its 50 rows');
is(states('first'), 'scheduled:50', 'the 50 mails are scheduled');

# pg_stat_statements first: its hook would run after gatekeeper's, which
# leaves the COPY alone
$node->safe_psql('postgres', 'SELECT pg_stat_statements_reset()');
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'pg_stat_statements,gatekeeper'\n");
$node->restart;
($single, $multi) = split /\|/, copy_mails('second', 30);
is($single, 30, 'pg_stat_statements preloaded first: the COPY left to PostgreSQL, row by row');
is($multi, 0, 'pg_stat_statements preloaded first: no multi-row insert');
is(counted(), '1|30', 'pg_stat_statements counted the COPY and its 30 rows');
is(states('second'), 'scheduled:30', 'the 30 mails are scheduled');
is($node->safe_psql('postgres', q{SELECT scheduled FROM gatekeeper.queue_stats WHERE queue = 'hooks'}),
	'80', 'queue_stats counts all 80');

$node->stop;
done_testing();
