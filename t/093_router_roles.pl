# Copyright: gatekeeper contributors

# The router's roles (issue 47, item 6), set up as docs/sharding.md says:
# two shards, each with an application role given 'enqueue' and a
# monitoring role given 'monitor' by gatekeeper.grant(); a router whose
# roles of the same names are given the same uses by the router's
# gatekeeper.grant(), each with a user mapping to its shard role, and the
# owner's mapping to the shards' owner.  Every call is made as the role
# that makes it in production, never as a superuser: the application
# enqueues, looks up, cancels, suppresses and unsubscribes on both shards;
# it cannot read queue_stats, unsuppress or administer (42501); the
# monitoring role reads queue_stats summed over the shards and nothing
# else; the owner administers on every shard.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $sharedir = `pg_config --sharedir`;
chomp $sharedir;
plan skip_all => 'plproxy is not installed (Debian: postgresql-15-plproxy)'
  unless -f "$sharedir/extension/plproxy.control";

my $n_shards = 2;
my @shards;
foreach my $i (0 .. $n_shards - 1)
{
	my $shard = GatekeeperTest::new_node("rshard$i");
	$shard->start;
	$shard->safe_psql('postgres', qq{
CREATE EXTENSION gatekeeper;
SELECT gatekeeper.shard($i, $n_shards);
CREATE ROLE shop_app LOGIN;
SELECT gatekeeper.grant('shop_app', 'enqueue');
CREATE ROLE shop_monitor LOGIN;
SELECT gatekeeper.grant('shop_monitor', 'monitor');
SELECT gatekeeper.create_queue('news', unsubscribe_url => 'https://shop.example/u/{token}');
});
	push @shards, $shard;
}
my $owner = $shards[0]->safe_psql('postgres', 'SELECT current_user');

my $router = PostgreSQL::Test::Cluster->new('rrouter');
$router->init(extra => [ '--encoding=UTF8', '--no-locale' ]);
$router->start;
my $options = join(', ',
	map { "p$_ 'host=" . $shards[$_]->host . " port=" . $shards[$_]->port . " dbname=postgres'" }
	  0 .. $n_shards - 1);
$router->safe_psql('postgres', qq{
CREATE EXTENSION gatekeeper_router CASCADE;
CREATE SERVER gatekeeper FOREIGN DATA WRAPPER plproxy OPTIONS ($options);
CREATE ROLE shop_app LOGIN;
CREATE ROLE shop_monitor LOGIN;
CREATE USER MAPPING FOR shop_app SERVER gatekeeper OPTIONS (user 'shop_app');
CREATE USER MAPPING FOR shop_monitor SERVER gatekeeper OPTIONS (user 'shop_monitor');
CREATE USER MAPPING FOR CURRENT_USER SERVER gatekeeper OPTIONS (user '$owner');
});

# run SQL on the router as a role; returns (exit code, stdout, stderr)
# with the SQLSTATE in the error
sub as_role
{
	my ($role, $sql) = @_;
	my ($out, $err) = ('', '');
	my $rc = $router->psql('postgres', "\\set VERBOSITY verbose\n$sql",
		stdout => \$out, stderr => \$err, on_error_stop => 1,
		extra_params => [ '-U', $role ]);
	return ($rc, $out, $err);
}

# the documented grants
my ($rc, $out, $err) = as_role($owner, q{
SELECT gatekeeper.grant('shop_app', 'enqueue');
SELECT gatekeeper.grant('shop_monitor', 'monitor');
});
is($rc, 0, 'grant() on the router: enqueue and monitor') or diag($err);
($rc, $out, $err) = as_role($owner, "SELECT gatekeeper.grant('shop_app', 'worker')");
like($err, qr/ERROR:  22023: the router has no use "worker"/, 'grant worker on the router: 22023');

# two recipients, one on each shard
my @rcpt = ('ann@example.com', 'bob@example.com', 'cy@example.com', 'di@example.com');
my %on;
foreach my $r (@rcpt)
{
	my ($c, $o) = as_role($owner, "SELECT gatekeeper._hash('$r') & 1");
	chomp $o;
	$on{$o} //= $r;
}
ok(defined $on{0} && defined $on{1}, 'recipients on both shards');

foreach my $part (0, 1)
{
	my $r = $on{$part};
	($rc, $out, $err) = as_role('shop_app',
		"SELECT gatekeeper.enqueue('$r', 'Hi', 'Body', queue => 'news', send_at => now() + interval '1 day', dedupe_key => 'k-$r')");
	is($rc, 0, "application: enqueue for shard $part") or diag($err);
	chomp(my $id = $out);
	is($id % 2, $part, "the id names shard $part");
	foreach my $call ("SELECT state FROM gatekeeper.status($id)",
		"SELECT gatekeeper.find('news', 'k-$r')",
		"SELECT gatekeeper.find('news', 'k-$r', '$r')",
		"SELECT count(*) FROM gatekeeper.history('$r')",
		"SELECT gatekeeper.enqueue_batch(ARRAY['$r'], ARRAY['B'], ARRAY['b'], send_at => now() + interval '1 day')",
		"SELECT gatekeeper.cancel($id)",
		"SELECT gatekeeper.cancel('news', 'k-$r')",
		"SELECT gatekeeper.suppress('$r', 'complaint')")
	{
		($rc, $out, $err) = as_role('shop_app', $call);
		is($rc, 0, "application on shard $part: $call") or diag($err);
	}
	my $token = $shards[$part]->safe_psql('postgres',
		"SELECT gatekeeper._unsubscribe_token('$r', 'news')");
	($rc, $out, $err) = as_role('shop_app', "SELECT gatekeeper.unsubscribe('$token')");
	is($out, 't', "application: unsubscribe on shard $part") or diag($err);
	is($shards[$part]->safe_psql('postgres',
			"SELECT string_agg(coalesce(queue, '*') || ':' || reason, ',' ORDER BY reason) FROM gatekeeper.suppression WHERE address = '$r'"),
		'*:complaint,news:unsubscribe', "shard $part holds the application's suppressions");
}

# what is not the application's: 42501 on the router, nothing changed
foreach my $call ('SELECT * FROM gatekeeper.queue_stats',
	'SELECT * FROM gatekeeper.shard_queue_stats()',
	"SELECT gatekeeper.unsuppress('$on{0}')",
	"SELECT gatekeeper.create_queue('app_made')",
	"SELECT gatekeeper.pause('news')",
	"SELECT gatekeeper.create_gate('app_gate', interval '1 day')",
	"SELECT gatekeeper._suppress(0, false, '$on{0}', NULL, NULL, NULL)")
{
	($rc, $out, $err) = as_role('shop_app', $call);
	like($err, qr/ERROR:  42501: .*permission denied/, "application: $call is refused (42501)");
}

# the monitoring role: queue_stats summed over the shards, nothing else
($rc, $out, $err) = as_role('shop_monitor',
	"SELECT scheduled || ':' || cancelled || ':' || enqueued FROM gatekeeper.queue_stats WHERE queue = 'news'");
is($rc, 0, 'monitor: queue_stats through the router') or diag($err);
is($out, '0:2:2', 'monitor: the shards\' rows summed (both news mails cancelled)');
($rc, $out, $err) = as_role('shop_monitor',
	"SELECT rate || ':' || coalesce(eta::text, 'null') FROM gatekeeper.queue_stats WHERE queue = 'news'");
is($out, '0:null', 'monitor: rate 0 and eta NULL summed over the shards (cancelled mail is no delivery work)');
($rc, $out, $err) = as_role('shop_monitor', 'SELECT count(*) FROM gatekeeper.shard_queue_stats()');
is($rc, 0, 'monitor: shard_queue_stats') or diag($err);
($rc, $out, $err) = as_role('shop_monitor',
	"SELECT gatekeeper.enqueue('$on{0}', 'Hi', 'Body')");
like($err, qr/ERROR:  42501: permission denied/, 'monitor: enqueue is refused (42501)');

# administration is the owner's, through its own mapping
($rc, $out, $err) = as_role($owner, q{
SELECT gatekeeper.create_queue('owner_made');
SELECT gatekeeper.pause('news');
SELECT gatekeeper.unsuppress('} . $on{0} . q{');
});
is($rc, 0, 'owner: administration and unsuppress through the router') or diag($err);
is(join(',', map { $_->safe_psql('postgres', "SELECT count(*) FROM gatekeeper.queue WHERE name = 'owner_made' OR (name = 'news' AND paused)") } @shards),
	'2,2', 'the owner\'s administration reached every shard');

# grant() is remembered: a role granted before the server existed gets
# USAGE on it at the next grant, and a dropped role is forgotten
is($router->safe_psql('postgres',
		"SELECT string_agg(role::text || ':' || what, ',' ORDER BY 1) FROM gatekeeper.role_grant"),
	'shop_app:enqueue,shop_monitor:monitor', 'role_grant remembers the uses');

done_testing();
