# Copyright: gatekeeper contributors
# gatekeeper-test: alone

# A frozen shard behind the router (issue 45).  One of two shards stops
# answering as a host that hangs does: its postmaster and every backend are
# stopped with SIGSTOP, so its kernel still accepts connections and takes
# what is sent, and nothing ever answers.  With gatekeeper_router.timeout
# = 2s (ALTER DATABASE, as a DBA sets it) every routed call that needs the
# frozen shard fails with 08006 naming the shard within the timeout and a
# margin (under 8 s here): on the connection the router had open to it
# (the call is sent and never answered), on the new one it opens next (the
# connect is never answered), in a new session, for enqueue, history,
# administration and queue_stats; a mail larger than the connection's
# buffers take, whose write libpq waits on out of PL/Proxy's loop, a
# second later.  Calls for the other shard's recipients
# succeed meanwhile, also while another session waits on the frozen shard.
# Before, each of these calls hung until the shard came back.
#
# Once the shard resumes (SIGCONT), the enqueue that timed out on the open
# connection turns out to have been carried out there, as the error said
# it may: run again with its dedupe_key it gives the one mail, not two.
#
# Last, a shard shut down during a call (the call waits for a lock there)
# fails it with 08006 and the shard's 57P01 in the detail, not with 57P01.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $sharedir = `pg_config --sharedir`;
chomp $sharedir;
plan skip_all => 'plproxy is not installed (Debian: postgresql-15-plproxy)'
  unless -f "$sharedir/extension/plproxy.control";

my @shards;
foreach my $i (0, 1)
{
	my $shard = GatekeeperTest::new_node("frozen_shard$i", conf => "gatekeeper.workers = 0\n");
	$shard->start;
	$shard->safe_psql('postgres', "CREATE EXTENSION gatekeeper; SELECT gatekeeper.shard($i, 2);");
	push @shards, $shard;
}

my $router = PostgreSQL::Test::Cluster->new('frozen_router');
$router->init;
$router->start;
my $options = join(', ',
	map { "p$_ 'host=" . $shards[$_]->host . " port=" . $shards[$_]->port . " dbname=postgres'" } 0, 1);
$router->safe_psql(
	'postgres', qq{
CREATE EXTENSION gatekeeper_router CASCADE;
CREATE SERVER gatekeeper FOREIGN DATA WRAPPER plproxy OPTIONS ($options);
CREATE USER MAPPING FOR PUBLIC SERVER gatekeeper;
});

# the setting: 10 s unless set, and the DBA's ALTER DATABASE for new sessions
my ($rc, $out, $err) = ('', '', '');
$router->psql('postgres', 'SELECT gatekeeper._timeout()', stdout => \$out, stderr => \$err);
is($out, '10', 'gatekeeper_router.timeout: 10 s by default');
$router->safe_psql('postgres', "ALTER DATABASE postgres SET gatekeeper_router.timeout = '2s'");
$router->psql('postgres', 'SELECT gatekeeper._timeout()', stdout => \$out, stderr => \$err);
is($out, '2', 'ALTER DATABASE ... SET gatekeeper_router.timeout = 2s');
$rc = $router->psql('postgres',
	"\\set VERBOSITY verbose\nSET gatekeeper_router.timeout = 'soon';\nSELECT gatekeeper.enqueue('a\@example.com', 'S', 'B');",
	stdout => \$out, stderr => \$err);
like($err, qr/ERROR:  22023: invalid value for gatekeeper_router.timeout: "soon"/, 'a timeout that is not a time: 22023');

# a test helper on the router: a call's SQLSTATE, message and seconds
$router->safe_psql(
	'postgres', q{
CREATE FUNCTION try_call(call text, OUT state text, OUT message text, OUT seconds numeric)
LANGUAGE plpgsql AS $$
DECLARE
	t0 timestamptz := clock_timestamp();
BEGIN
	BEGIN
		EXECUTE call;
		state := '00000';
	EXCEPTION WHEN OTHERS THEN
		GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, message = MESSAGE_TEXT;
	END;
	seconds := round(extract(epoch FROM clock_timestamp() - t0)::numeric, 2);
END
$$;
});

# a recipient of each shard
my ($r_frozen) = grep {
	$router->safe_psql('postgres', "SELECT gatekeeper._hash('$_') & 1") eq '1'
} map { "frozen$_\@example.com" } 1 .. 50;
my ($r_up) = grep {
	$router->safe_psql('postgres', "SELECT gatekeeper._hash('$_') & 1") eq '0'
} map { "up$_\@example.com" } 1 .. 50;

# every process of a cluster: its postmaster and the postmaster's children
sub cluster_pids
{
	my ($node) = @_;
	my ($pm) = split /\n/, slurp_file($node->data_dir . '/postmaster.pid');
	my @pids;
	opendir(my $proc, '/proc') or die "/proc: $!";
	foreach my $pid (grep { /^\d+$/ } readdir $proc)
	{
		my $stat = eval { slurp_file("/proc/$pid/stat") } // next;
		my ($ppid) = $stat =~ /^\d+ \(.*\) \S (\d+)/s;
		push @pids, $pid if defined $ppid && $ppid == $pm;
	}
	closedir $proc;
	return ($pm, @pids);
}

# whatever happens, a frozen shard is resumed before the nodes are stopped
my @frozen;
END { kill('CONT', @frozen) if @frozen; }

sub freeze
{
	my ($node) = @_;
	my ($pm) = cluster_pids($node);
	kill('STOP', $pm);    # first: it starts no backend from now on
	@frozen = cluster_pids($node);
	kill('STOP', @frozen);
	note('frozen: ' . join(' ', @frozen));
}

sub thaw
{
	kill('CONT', @frozen);
	@frozen = ();
}

# two router sessions with a connection open to each shard
my $session = $router->background_psql('postgres', on_error_stop => 0, timeout => 40);
$session->set_query_timer_restart;
$session->query_safe("SELECT gatekeeper.enqueue('$r_frozen', 'Warm', 'B'), gatekeeper.enqueue('$r_up', 'Warm', 'B')");
my $session2 = $router->background_psql('postgres', on_error_stop => 0, timeout => 40);
$session2->query_safe("SELECT gatekeeper.enqueue('$r_frozen', 'Warm', 'B')");

freeze($shards[1]);

# a mail larger than the connection's buffers take: libpq waits to write
# the rest, out of PL/Proxy's loop
my $large = $session2->query(
	"SELECT state || '|' || coalesce(message, '') || '|' || seconds FROM try_call('SELECT gatekeeper.enqueue(''$r_frozen'', ''Large'', repeat(''x'', 4000000))')");
note("large: $large");
my @large = split /\|/, $large // '', 3;
is($large[0], '08006', 'a large mail for the frozen shard, on an open connection: 08006');
like($large[1] // '', qr/did not answer within 2 s/, 'a large mail: the message names the timeout');
ok(defined $large[2] && $large[2] >= 1.9 && $large[2] < 8, "a large mail: returned within 8 s ($large[2] s)");
$session2->quit;

my %call = (
	sent => "SELECT gatekeeper.enqueue('$r_frozen', 'Order', 'B', dedupe_key => 'order-1')",
	other => "SELECT gatekeeper.enqueue('$r_up', 'Order', 'B', dedupe_key => 'order-up')",
	reconnect => "SELECT gatekeeper.enqueue('$r_frozen', 'Order', 'B', dedupe_key => 'order-2')",
	history => "SELECT * FROM gatekeeper.history('$r_frozen')",
	create_queue => "SELECT gatekeeper.create_queue('while_frozen')",
	queue_stats => "SELECT * FROM gatekeeper.queue_stats",
	other_after => "SELECT gatekeeper.history('$r_up')");
my %result;
foreach my $what (qw(sent other reconnect history create_queue queue_stats other_after))
{
	my $sql = $call{$what} =~ s/'/''/gr;
	my $row = $session->query("SELECT state || '|' || coalesce(message, '') || '|' || seconds FROM try_call('$sql')");
	$result{$what} = [ split /\|/, $row // '', 3 ];
	note("$what: $row");
}

my $shard1 = qr/gatekeeper shard p1 \(host=\S+ port=\d+ dbname=postgres\)/;
foreach my $what (qw(sent reconnect history create_queue queue_stats))
{
	my ($state, $message, $seconds) = @{ $result{$what} };
	is($state, '08006', "$what, frozen shard: 08006");
	like($message, qr/^$shard1 did not answer within 2 s/, "$what, frozen shard: the message names the shard and the timeout");
	ok(defined $seconds && $seconds >= 1.9 && $seconds < 8, "$what, frozen shard: returned after the 2 s timeout, within 8 s ($seconds s)");
}
foreach my $what (qw(other other_after))
{
	my ($state, $message, $seconds) = @{ $result{$what} };
	is($state, '00000', "$what shard's recipient meanwhile: succeeds");
	ok(defined $seconds && $seconds < 2, "$what shard's recipient meanwhile: at once ($seconds s)");
}

# a new session: its first connection to the frozen shard
my $t0 = time;
my $timed_out = 0;
$router->psql('postgres', "\\set VERBOSITY verbose\nSELECT gatekeeper.suppress('$r_frozen')",
	stdout => \$out, stderr => \$err, timeout => 30, timed_out => \$timed_out);
my $seconds = time - $t0;
like($err, qr/ERROR:  08006: $shard1 did not answer within 2 s/, 'a new session: suppress for the frozen shard fails with 08006');
like($err, qr/DETAIL:  The call may have been carried out on the shard\./, 'the detail says the outcome is unknown');
like($err, qr/HINT:  Calls routed to the other shards go on\. .*dedupe_key/, 'the hint says how to run it again');
ok(!$timed_out && $seconds < 8, sprintf('a new session: returned within 8 s (%.1f s)', $seconds));

# another session waits on the frozen shard (for 4 s, its own SET); calls
# for the other shard's recipients go on meanwhile
my $waiting = $router->background_psql('postgres', on_error_stop => 0, timeout => 40, wait => 1);
$waiting->query_safe("SET gatekeeper_router.timeout = '4s'");
$t0 = time;
$waiting->{stdin} .= "SELECT state, seconds FROM try_call(\$\$SELECT gatekeeper.enqueue('$r_frozen', 'S', 'B')\$\$);\n\\echo done\n";
$waiting->{run}->pump_nb;
usleep(500_000);
my @meanwhile;
foreach my $i (1 .. 3)
{
	my $t = time;
	my $id = $router->safe_psql('postgres', "SELECT gatekeeper.enqueue('$r_up', 'S', 'B', dedupe_key => 'meanwhile-$i')");
	push @meanwhile, [ $id, time - $t ];
}
my $still_waiting = $waiting->{stdout} !~ /done/;
pump_until($waiting->{run}, $waiting->{timeout}, \$waiting->{stdout}, qr/done/);
ok((grep { $_->[0] =~ /^\d+$/ && $_->[1] < 2 } @meanwhile) == 3,
	'while a session waits on the frozen shard, enqueues for the other shard succeed at once: '
	  . join(', ', map { sprintf('%.2f s', $_->[1]) } @meanwhile));
ok($still_waiting, 'and the waiting session was still waiting then');
like($waiting->{stdout}, qr/08006\|[4-7]\.\d+/, 'the waiting session got 08006 after its own 4 s: ' . $waiting->{stdout} =~ s/\n/ /gr);
$waiting->quit;

# the shard resumes: the enqueue sent before it froze was carried out
# there; run again with its key, it gives that mail and no second one
thaw();
ok(GatekeeperTest::poll_until($shards[1], 'postgres',
		"SELECT count(*) = 1 FROM gatekeeper.mail WHERE dedupe_key = 'order-1'", 't', 30),
	'the enqueue that timed out was carried out on the shard once it resumed');
my $first = $shards[1]->safe_psql('postgres', "SELECT id FROM gatekeeper.mail WHERE dedupe_key = 'order-1'");
is($session->query("SELECT gatekeeper.enqueue('$r_frozen', 'Order', 'B', dedupe_key => 'order-1')"),
	$first, 'run again with its dedupe_key: the first mail\'s id');
is($shards[1]->safe_psql('postgres', "SELECT count(*) FROM gatekeeper.mail WHERE dedupe_key = 'order-1'"),
	'1', 'one mail for that key on the shard');
# the enqueue whose connect was never answered was not carried out: its
# query was never sent; run again, it makes its mail, once
is($shards[1]->safe_psql('postgres', "SELECT count(*) FROM gatekeeper.mail WHERE dedupe_key = 'order-2'"),
	'0', 'the enqueue whose connect was never answered was not carried out');
$session->query("SELECT gatekeeper.enqueue('$r_frozen', 'Order', 'B', dedupe_key => 'order-2')");
$session->query("SELECT gatekeeper.enqueue('$r_frozen', 'Order', 'B', dedupe_key => 'order-2')");
is($shards[1]->safe_psql('postgres', "SELECT count(*) FROM gatekeeper.mail WHERE dedupe_key = 'order-2'"),
	'1', 'run again (twice) with its dedupe_key: one mail');
is($shards[0]->safe_psql('postgres', "SELECT count(*) FROM gatekeeper.queue WHERE name = 'while_frozen'")
	  . $shards[1]->safe_psql('postgres', "SELECT count(*) FROM gatekeeper.queue WHERE name = 'while_frozen'"),
	'00', 'the administration call that timed out changed no shard');
$session->quit;

# a shard shut down during a call: the call waits for a lock on the shard
# when the shard stops (its backends end with 57P01)
my $lock = $shards[1]->background_psql('postgres', on_error_stop => 0);
$lock->query_safe('BEGIN; LOCK gatekeeper.mail IN ACCESS EXCLUSIVE MODE');
my $call = $router->background_psql('postgres', on_error_stop => 0, timeout => 40);
$call->query_safe("SET gatekeeper_router.timeout = '30s'");
$call->{stdin} .= "\\set VERBOSITY verbose\nSELECT gatekeeper.enqueue('$r_frozen', 'S', 'B');\n\\echo done\n";
$call->{run}->pump_nb;
ok(GatekeeperTest::poll_until($shards[1], 'postgres',
		"SELECT count(*) > 0 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%gatekeeper.enqueue%'"),
	'the routed enqueue waits for the lock on the shard');
$shards[1]->stop('fast');
pump_until($call->{run}, $call->{timeout}, \$call->{stdout}, qr/done/);
like($call->{stderr}, qr/ERROR:  08006: the connection to $shard1 broke during the call/,
	'the shard shut down during the call: 08006 naming it');
like($call->{stderr}, qr/DETAIL:  The call may have been carried out on the shard\. The shard said: terminating connection due to administrator command \(57P01\)\./,
	'the detail has the shard\'s 57P01');
eval { $call->quit; };
eval { $lock->quit; };
$shards[1]->start;
is($router->safe_psql('postgres', "SELECT gatekeeper.enqueue('$r_frozen', 'S', 'B') > 0"), 't',
	'the shard back, the router reaches it again');

$router->stop;
$_->stop foreach @shards;
done_testing();
