# Copyright: gatekeeper contributors
# gatekeeper-test: alone

# Failover (SPEC "Failover"): a primary delivering to a real SMTP relay
# (Postfix's smtp-sink on loopback) and a streaming hot standby whose WAL
# arrives late (t/delay_proxy.py between them, delaying only what
# the primary sends); the primary is killed (SIGKILL to the postmaster and
# every child at once, and the proxy with the WAL it held) in the middle of
# delivery, the standby is promoted, and every message the relay received
# is accounted for by Message-ID: none lost, no recipient with two
# promotional mails, and duplicates only of what was in flight.
#
# A: gatekeeper.claim_standbys = 0.  Before the failover: every read-only
#    lookup answers on the standby, and a read-only spell on the primary
#    (default_transaction_read_only, as pg_auto_failover sets it while it
#    switches) makes the worker wait and say so, not exit; it resumes
#    within a second or two of the spell's end.  The lag (2 s here) turns
#    into duplicates (the standby never saw the last seconds' claims and
#    acks), and can let a second campaign's mail through a gate whose pass
#    was lost with that WAL (counted, not asserted).
# B: gatekeeper.claim_standbys = 1, 1 s lag: a claim goes on the wire only
#    once the standby has it (worker_status says the worker waits), so the
#    duplicates are at most the worker's in-flight window, and the gates
#    are exact.
# Both: the promoted node takes back the dead primary's claims at once (they
# name a server incarnation that is gone), not after their 5-minute lease;
# and so does a restarted server (B's promoted node, restarted while its
# worker holds mail claimed for a relay that never answers).

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IO::Socket::INET;
use Time::HiRes qw(time usleep);

# the worker's in-flight window: min(batch_size, smtp_connections * 16)
my $window = 64;
my $recipients = 500;	# each gets one mail of each of 3 campaigns
my $receipts = 1500;
my $expected_sent = $recipients + $receipts;

# Every pid of a postmaster's tree: the postmaster and its children.
sub tree_pids
{
	my ($pm) = @_;
	my @pids = ($pm);
	opendir(my $dh, '/proc') or die "/proc: $!";
	foreach my $p (grep { /^\d+$/ } readdir($dh))
	{
		open(my $fh, '<', "/proc/$p/stat") or next;
		my $stat = <$fh>;
		close($fh);
		next unless defined $stat && $stat =~ /\)\s+\S+\s+(\d+)/;
		push @pids, $p if $1 == $pm;
	}
	closedir($dh);
	return @pids;
}

# A primary with gatekeeper, queues and the mail of one run (paused), and
# a streaming standby behind a proxy delaying the primary's WAL by $lag_ms.
sub start_pair
{
	my ($name, $sink, $claim_standbys, $lag_ms) = @_;
	my $primary = GatekeeperTest::new_node(
		"${name}_primary",
		sink => $sink,
		conf => qq{
listen_addresses = '127.0.0.1'
wal_level = replica
max_wal_senders = 4
wal_sender_timeout = '60s'
gatekeeper.batch_size = $window
gatekeeper.smtp_connections = 4
gatekeeper.claim_standbys = $claim_standbys
gatekeeper.lease = '5min'
gatekeeper.naptime = '100ms'
});
	$primary->start;
	$primary->safe_psql(
		'postgres', qq{
CREATE EXTENSION gatekeeper;
SELECT gatekeeper.create_queue(q, gates => '{smart_sending}', rate_limit => 100)
  FROM unnest(ARRAY['promo_a', 'promo_b', 'promo_c']) q;
SELECT gatekeeper.create_queue('receipts', transactional => true, rate_limit => 250);
SELECT gatekeeper.create_queue('external', background => false);
SELECT gatekeeper.enqueue('x' || i || '\@customer.example', 'Sent by the app', 'body', 'external')
  FROM generate_series(1, 5) i;
SELECT gatekeeper.pause(q) FROM unnest(ARRAY['promo_a', 'promo_b', 'promo_c', 'receipts']) q;
SELECT gatekeeper.enqueue('c' || i || '\@customer.example', 'Sale ' || q, 'body', q,
                          dedupe_key => q || i)
  FROM unnest(ARRAY['promo_a', 'promo_b', 'promo_c']) q, generate_series(1, $recipients) i;
SELECT gatekeeper.enqueue('r' || i || '\@customer.example', 'Receipt ' || i, 'body', 'receipts',
                          dedupe_key => 'order' || i)
  FROM generate_series(1, $receipts) i;
SELECT gatekeeper.gate_pass('smart_sending', 'seen\@customer.example');
SELECT gatekeeper.suppress('gone\@customer.example', 'manual');
});
	$primary->backup("${name}_backup");

	my $proxy_port = PostgreSQL::Test::Cluster::get_free_port();
	my $proxy_log = "$PostgreSQL::Test::Utils::tmp_check/${name}_proxy.log";
	my $proxy = GatekeeperTest::start_helper(
		"wal delay proxy $name",
		[
			'/usr/bin/python3', "$FindBin::RealBin/delay_proxy.py",
			'--listen', $proxy_port, '--target', $primary->port,
			'--delay-ms', $lag_ms, '--delay-up-ms', 0,
			'--log', $proxy_log, '--lifetime', 600
		],
		$proxy_log);
	GatekeeperTest::wait_for(sub { -f $proxy_log && slurp_file($proxy_log) =~ /listening/ },
		15, 'the proxy to listen') or die "proxy does not start";

	my $standby = PostgreSQL::Test::Cluster->new("${name}_standby");
	$standby->init_from_backup($primary, "${name}_backup", has_streaming => 1);
	$standby->append_conf('postgresql.conf',
		"primary_conninfo = 'host=127.0.0.1 port=$proxy_port application_name=${name}_standby'\n");
	$standby->start;
	$primary->wait_for_catchup("${name}_standby", 'replay', $primary->lsn('insert'));
	return ($primary, $standby, $proxy);
}

# Resume the run's queues.
sub resume
{
	my ($node) = @_;
	$node->safe_psql('postgres',
		"SELECT gatekeeper.resume(q) FROM unnest(ARRAY['promo_a', 'promo_b', 'promo_c', 'receipts']) q"
	);
}

# SIGKILL the primary's every process and the proxy at once: the host is
# gone, and with it the WAL the standby had not received yet.
sub crash
{
	my ($primary, $proxy) = @_;
	my @pids = tree_pids($primary->{_pid});
	kill('KILL', $proxy, @pids);
	GatekeeperTest::stop_helper($proxy);
	GatekeeperTest::wait_for(sub { !grep { kill(0, $_) } @pids }, 30,
		'the primary\'s processes to be gone');
	# the test framework must not try to stop it
	$primary->{_pid} = undef;
	return scalar(@pids);
}

# Promote the standby and take the time; returns the promotion time and
# the ids the dead primary's workers held claimed as the standby saw them
# once it had replayed all it received (the promoted node's worker takes
# them back within milliseconds: they must be read before).
sub promote
{
	my ($standby, $reset_claim_standbys) = @_;
	GatekeeperTest::poll_until($standby, 'postgres',
		"SELECT pg_last_wal_replay_lsn() >= pg_last_wal_receive_lsn()", 't', 30)
	  or die "the standby does not replay what it received";
	my $claimed = $standby->safe_psql('postgres',
		"SELECT coalesce(string_agg(id::text, ',' ORDER BY id), '') FROM gatekeeper.mail_status WHERE state = 'claimed' AND worker LIKE 'bgworker:%'"
	);
	$standby->promote;
	my $at = time;
	# the new primary has no standby of its own (yet): a node that keeps
	# claim_standbys = 1 would wait for one, as synchronous_standby_names
	# would; the operator (or the failover manager) lowers it
	if ($reset_claim_standbys)
	{
		$standby->safe_psql('postgres',
			"ALTER SYSTEM SET gatekeeper.claim_standbys = 0; SELECT pg_reload_conf();");
	}
	return ($at, [ grep { $_ ne '' } split /,/, $claimed ]);
}

# After a failover: wait until every mail is finished, then account for
# every message the relay received.  Returns (lost, duplicates, copies of
# gated mail to one recipient beyond one, seconds the old claims took).
sub account
{
	my ($name, $node, $sink, $promoted_at, $old_claims, $gates_exact) = @_;

	my $took;
	if (@$old_claims)
	{
		my $ids = join(',', @$old_claims);
		ok( GatekeeperTest::poll_until(
				$node, 'postgres',
				"SELECT count(*) = 0 FROM gatekeeper.mail_status WHERE id IN ($ids) AND state IN ('claimed', 'scheduled')",
				't', 20),
			"$name: the "
			  . scalar(@$old_claims)
			  . " mails the dead primary held claimed are finished within 20 s of promotion (their lease is 5 minutes)"
		);
		$took = time - $promoted_at;
		note(sprintf("$name: the dead primary's claims finished %.1f s after promotion", $took));
	}
	ok( GatekeeperTest::poll_until(
			$node, 'postgres',
			"SELECT count(*) FROM gatekeeper.mail_status WHERE state IN ('scheduled', 'claimed') AND queue <> 'external'",
			'0', 60),
		"$name: every mail is finished after the failover");

	# the relay's messages by mail id (the Message-ID names the mail)
	my %received;
	foreach my $msg (GatekeeperTest::sink_messages($sink))
	{
		my ($id) = ($msg->{message_id} // '') =~ /^<(\d+)\./;
		$received{ $id // 'none' }++;
	}
	my %mail;
	foreach my $line (split /\n/,
		$node->safe_psql('postgres',
			"SELECT s.id, s.queue, s.state, m.recipient FROM gatekeeper.mail_status s JOIN gatekeeper.mail m USING (id)"
		))
	{
		my ($id, $queue, $state, $recipient) = split /\|/, $line;
		# the external claimer's mail never goes through the relay
		next if $queue eq 'external';
		$mail{$id} = { queue => $queue, state => $state, recipient => $recipient };
	}
	my $sent = grep { $_->{state} eq 'sent' } values %mail;
	my $lost = grep { $mail{$_}{state} eq 'sent' && !$received{$_} } keys %mail;
	my $unknown = grep { !$mail{$_} } keys %received;
	my $duplicates = 0;
	$duplicates += $received{$_} - 1 foreach keys %received;
	my %promos;
	foreach my $id (keys %received)
	{
		next unless $mail{$id} && $mail{$id}{queue} =~ /^promo_/;
		$promos{ $mail{$id}{recipient} }++;
	}
	my $double_promos = grep { $_ > 1 } values %promos;

	is($sent, $expected_sent, "$name: every mail that could go was sent");
	is($lost, 0, "$name: no sent mail is missing at the relay");
	is($unknown, 0, "$name: every message at the relay is a mail of the run");
	# with claim_standbys = 0 the passes in the WAL the standby never got
	# are lost with it: the promoted node may let another campaign's mail
	# through to a recipient the dead primary had mailed
	is($double_promos, 0, "$name: no recipient received two promotional mails (gates exact)")
	  if $gates_exact;
	note("$name: $double_promos recipients received two promotional mails");
	note("$name: $sent mails sent, " . scalar(keys %received)
		  . " distinct messages at the relay, $duplicates second copies, $lost lost");
	return ($lost, $duplicates, $double_promos, $took);
}

my $sink_a = GatekeeperTest::start_sink(name => 'failover_a');
my $sink_b = GatekeeperTest::start_sink(name => 'failover_b');

#
# A: claim_standbys = 0
#
my ($primary, $standby, $proxy) = start_pair('a', $sink_a, 0, 2000);

# the lookups on the standby, answering as the primary would
my $id = $primary->safe_psql('postgres', "SELECT gatekeeper.find('receipts', 'order7')");
my %lookups = (
	status => [ "SELECT state FROM gatekeeper.status($id)", 'scheduled' ],
	find => [ "SELECT gatekeeper.find('receipts', 'order7')", $id ],
	history => [ "SELECT count(*) FROM gatekeeper.history('r7\@customer.example')", '1' ],
	gate_open => [
		"SELECT gatekeeper.gate_open('smart_sending', 'seen\@customer.example'), gatekeeper.gate_open('smart_sending', 'c1\@customer.example')",
		'f|t'
	],
	gate_next_open => [
		"SELECT gatekeeper.gate_next_open('smart_sending', 'seen\@customer.example') > now(), gatekeeper.gate_next_open('smart_sending', 'c1\@customer.example') IS NULL",
		't|t'
	],
	explain => [
		"SELECT gate, open, sends_in_period, max_sends FROM gatekeeper.explain('seen\@customer.example') ORDER BY gate",
		'smart_sending|f|1|1'
	],
	queue_stats => [
		"SELECT queue, paused, scheduled FROM gatekeeper.queue_stats WHERE queue = 'receipts'",
		"receipts|t|$receipts"
	],
	worker_status => [ "SELECT count(*) FROM gatekeeper.worker_status", '0' ],
	gate_memory => [ "SELECT count(*) FROM gatekeeper.gate_memory", '1' ],
	suppression => [ "SELECT address, reason FROM gatekeeper.suppression", 'gone@customer.example|manual' ],
);
foreach my $what (sort keys %lookups)
{
	my ($sql, $want) = @{ $lookups{$what} };
	my ($ret, $out, $err) = $standby->psql('postgres', $sql);
	is("$ret|$out|$err", "0|$want|", "$what answers on the hot standby");
}
is( $standby->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'gatekeeper worker'"),
	'0',
	'no gatekeeper worker runs on the standby');

my ($ret, $out, $err) = $primary->psql('postgres',
	"SELECT count(*) FROM gatekeeper.claim('bgworker:1\@0123456789abcdef', 10)",
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/22023: worker names beginning with "bgworker:" are reserved/,
	'a claim of your own may not take a background worker\'s name (22023)');

my ($worker) = GatekeeperTest::worker_pids($primary);
resume($primary);
ok(GatekeeperTest::wait_for(sub { GatekeeperTest::sink_count($sink_a) >= 300 }, 60, 'delivery'),
	'a: the primary delivers');

# the read-only spell
my $log_offset = -s $primary->logfile;
$primary->safe_psql('postgres',
	"ALTER SYSTEM SET default_transaction_read_only = on; SELECT pg_reload_conf();");
ok( GatekeeperTest::poll_until(
		$primary, 'postgres',
		"SELECT state LIKE 'read-only%' FROM gatekeeper.worker_status",
		't', 5),
	'a: in a read-only spell the worker says it waits');
# what was on the wire finishes; then nothing more goes
usleep(500_000);
my $during = GatekeeperTest::sink_count($sink_a);
usleep(2_000_000);
is(GatekeeperTest::sink_count($sink_a), $during, 'a: no mail goes on the wire during the spell');
is(join(',', GatekeeperTest::worker_pids($primary)), $worker, 'a: the worker did not exit');
$primary->safe_psql('postgres',
	"ALTER SYSTEM RESET default_transaction_read_only; SELECT pg_reload_conf();");
my $spell_end = time;
ok(GatekeeperTest::wait_for(sub { GatekeeperTest::sink_count($sink_a) > $during }, 10, 'resumption'),
	'a: delivery resumes after the spell');
my $resumed = time - $spell_end;
note(sprintf("a: delivery resumed %.2f s after the spell ended", $resumed));
cmp_ok($resumed, '<', 1, 'a: within a second of the spell\'s end');
my $spell_log = substr(slurp_file($primary->logfile), $log_offset);
unlike($spell_log, qr/ERROR:.*read-only transaction/, 'a: no read-only error in the log');
is(scalar(() = $spell_log =~ /gatekeeper worker waits: transactions are read-only/g),
	1, 'a: the spell is logged once');
is(join(',', GatekeeperTest::worker_pids($primary)), $worker, 'a: the worker is the same process');

# the standby's gate lookups agree with the primary's passes it has
# replayed: every recipient the primary's gate holds closed is closed there
my $closed_sql =
  "SELECT coalesce(string_agg(r, ',' ORDER BY r), '') FROM (SELECT 'c' || i || '\@customer.example' AS r FROM generate_series(1, $recipients) i) s WHERE NOT gatekeeper.gate_open('smart_sending', r)";
my $closed_primary = $primary->safe_psql('postgres', $closed_sql);
$primary->wait_for_catchup('a_standby', 'replay', $primary->lsn('insert'));
my %closed_standby = map { $_ => 1 } split /,/, $standby->safe_psql('postgres', $closed_sql);
my @closed = split /,/, $closed_primary;
ok(@closed > 0 && !grep({ !$closed_standby{$_} } @closed),
	'a: every recipient the primary\'s gate holds closed ('
	  . scalar(@closed)
	  . ') is closed on the standby');

# the failover, in the middle of delivery
ok(GatekeeperTest::wait_for(sub { GatekeeperTest::sink_count($sink_a) >= $expected_sent / 2 }, 60,
		'half the mail'),
	'a: half the mail is delivered');
crash($primary, $proxy);
my $at_kill = GatekeeperTest::sink_count($sink_a);
my ($promoted_at, $old_claims) = promote($standby, 0);
note("a: killed the primary with $at_kill messages at the relay; the promoted node sees "
	  . scalar(@$old_claims) . " mails claimed");
my ($lost_a, $dups_a, $promos_a, $took_a) =
  account('a', $standby, $sink_a, $promoted_at, $old_claims, 0);
cmp_ok($dups_a, '>', $window,
	"a: without claim_standbys the lag turns into more duplicates than the in-flight window ($dups_a)");
$standby->stop;

#
# B: claim_standbys = 1
#
($primary, $standby, $proxy) = start_pair('b', $sink_b, 1, 1000);

# an external claimer's claim, on the standby before the failover
my $external = $primary->safe_psql('postgres',
	"SELECT string_agg(id || ':' || attempt, ',' ORDER BY id) FROM gatekeeper.claim('app-1', 10, '5 minutes', '{external}')"
);
$primary->wait_for_catchup('b_standby', 'replay', $primary->lsn('insert'));
resume($primary);
my $waited = GatekeeperTest::wait_for(
	sub {
		$primary->safe_psql('postgres',
			"SELECT count(*) FROM gatekeeper.worker_status WHERE state LIKE 'waiting for%standby%'")
		  eq '1';
	},
	30,
	'the worker to wait for the standby');
ok($waited, 'b: worker_status says the worker waits for the standby');
ok(GatekeeperTest::wait_for(sub { GatekeeperTest::sink_count($sink_b) >= 150 }, 60, 'delivery'),
	'b: the primary delivers, at the pace the standby takes its claims');
crash($primary, $proxy);
$at_kill = GatekeeperTest::sink_count($sink_b);
($promoted_at, $old_claims) = promote($standby, 1);
note("b: killed the primary with $at_kill messages at the relay; the promoted node sees "
	  . scalar(@$old_claims) . " mails claimed");
ok(scalar(@$old_claims) > 0, 'b: the standby holds the dead primary\'s claims');
my ($lost_b, $dups_b, $promos_b, $took_b) =
  account('b', $standby, $sink_b, $promoted_at, $old_claims, 1);
# the external claimer reconnects to the promoted node and acks there
is( $standby->safe_psql('postgres',
		"SELECT count(*) FROM gatekeeper.mail_status WHERE queue = 'external' AND state = 'claimed' AND worker = 'app-1'"
	),
	'5',
	'b: an external claimer\'s claims keep their lease on the promoted node');
my @ext = map { [ split /:/ ] } split /,/, $external;
is( $standby->safe_psql('postgres',
		'SELECT gatekeeper.ack_batch(ARRAY['
		  . join(',', map { $_->[0] } @ext)
		  . ']::bigint[], ARRAY['
		  . join(',', map { $_->[1] } @ext)
		  . ']::int[])'),
	'5',
	'b: the external claimer acks its mail on the promoted node, not fenced off');
cmp_ok($dups_b, '<=', $window,
	"b: with claim_standbys = 1 the duplicates are at most the in-flight window ($dups_b <= $window)");

# A restart is a new incarnation too: mail the worker held claimed, waiting
# for a relay that never greets (a socket nobody accepts from), comes back
# as soon as the server is up again, not after its 5-minute lease.
my $hole = IO::Socket::INET->new(Listen => 16, LocalAddr => '127.0.0.1', LocalPort => 0)
  or die "no listening socket: $!";
my $hole_port = $hole->sockport;
$standby->safe_psql('postgres',
	"ALTER SYSTEM SET gatekeeper.smtp_url = 'smtp://127.0.0.1:$hole_port'; SELECT pg_reload_conf();");
# the worker reads the new setting at the top of its next round: mail it
# claimed in the round the reload came in goes to the relay it had
ok( GatekeeperTest::poll_until(
		$standby, 'postgres',
		"SELECT bool_and(relay_url = 'smtp://127.0.0.1:$hole_port') FROM gatekeeper.worker_status",
		't', 30),
	'restart: the worker took the new relay');
$standby->safe_psql('postgres',
	"SELECT gatekeeper.enqueue('restart' || i || '\@customer.example', 'Receipt', 'body', 'receipts') FROM generate_series(1, 20) i"
);
ok( GatekeeperTest::poll_until(
		$standby, 'postgres',
		"SELECT count(*) FROM gatekeeper.mail_status s JOIN gatekeeper.mail m USING (id) WHERE m.recipient LIKE 'restart%' AND s.state = 'claimed'",
		'20', 30),
	'restart: the worker holds 20 mails claimed for a relay that does not answer')
  or diag("restart mails by state, attempt and error: "
	  . $standby->safe_psql('postgres',
		"SELECT string_agg(format('%s/%s/%s: %s', s.state, s.attempt, coalesce(s.last_error, '-'), n), '; ') FROM "
		  . "(SELECT s.state, s.attempt, s.last_error, count(*) AS n FROM gatekeeper.mail_status s JOIN gatekeeper.mail m USING (id) "
		  . "WHERE m.recipient LIKE 'restart%' GROUP BY 1, 2, 3) s")
	  . "; the worker: "
	  . $standby->safe_psql('postgres', 'SELECT row_to_json(w) FROM gatekeeper.worker_status w'));
$standby->safe_psql('postgres', "ALTER SYSTEM SET gatekeeper.smtp_url = '$sink_b->{url}'");
$standby->restart;
my $restarted_at = time;
ok( GatekeeperTest::poll_until(
		$standby, 'postgres',
		"SELECT count(*) FROM gatekeeper.mail_status s JOIN gatekeeper.mail m USING (id) WHERE m.recipient LIKE 'restart%' AND s.state = 'sent' AND s.attempt = 2",
		'20', 20),
	'restart: the claims of the server before the restart are taken back and sent within 20 s (their lease is 5 minutes)');
note(sprintf("restart: the old claims were sent %.1f s after the restart", time - $restarted_at));
close($hole);
$standby->stop;

note(sprintf("figures: A (claim_standbys 0, 2 s lag): %d lost, %d duplicates, %d recipients with two promotional mails, old claims finished %.1f s after promotion; "
	  . "B (claim_standbys 1, 1 s lag): %d lost, %d duplicates, %d recipients with two promotional mails, old claims finished %.1f s after promotion",
	$lost_a, $dups_a, $promos_a, $took_a // -1, $lost_b, $dups_b, $promos_b, $took_b // -1));

done_testing();
