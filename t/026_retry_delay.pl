# Copyright: gatekeeper contributors
# gatekeeper-test: alone

# nack's backoff follows gatekeeper.retry_delay as the setting means it
# (issue 9, defect 11).  With the library not preloaded, a session that
# has not loaded it holds the setting from postgresql.conf as a
# placeholder, a bare string: '30000' is 30000 ms to gatekeeper, but
# 30000 seconds (8 h 20 min) to current_setting(...)::interval.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('retry');
$node->init;
$node->append_conf('postgresql.conf', "gatekeeper.retry_delay = 30000\n");
$node->start;

$node->safe_psql(
	'postgres', q{
CREATE EXTENSION gatekeeper;
SELECT gatekeeper.enqueue('a@customer.example', 'Subject', 'Body');
SELECT count(*) FROM gatekeeper.claim('external', 1);
});

# a fresh session: nack is PL/pgSQL, so nothing has loaded the library yet
my $delay = $node->safe_psql(
	'postgres', q{
SELECT gatekeeper.nack(id, attempt, 'try later') FROM gatekeeper.mail_status;
SELECT extract(epoch FROM send_at - now())::int FROM gatekeeper.mail_status;
});
my ($state, $seconds) = split /\n/, $delay;
is($state, 'scheduled', 'the mail is scheduled again');
cmp_ok($seconds, '>=', 14, "the first retry waits at least half of 30 s ($seconds s)");
cmp_ok($seconds, '<=', 30, "the first retry waits at most 30 s ($seconds s)");

$node->stop;
done_testing();
