#!/usr/bin/perl
# bench/report.pl: turn bench/run.sh's results.tsv into the table (stdout)
# and BENCHMARKS.md.
#
#   report.pl --mode full|smoke --runs N --output FILE RESULTS.tsv
#   report.pl --latency-median PGBENCH-LOG...   median latency of a pgbench
#                                               per-transaction log, in ms
#
# Each figure is reported as the median of its runs, with their min-max,
# and, where it has one, the ratio of its median to the median of its
# reference measured in the same run of the harness.  Targets are printed
# next to the ratio with whether they are met; they never change the exit
# status.
use strict;
use warnings;
use Getopt::Long;
use POSIX qw(strftime);

my ($mode, $runs, $output, @latency) = ('full', 5, undef);
GetOptions(
	'mode=s' => \$mode,
	'runs=i' => \$runs,
	'output=s' => \$output,
	'latency-median' => \my $latency_median,
) or die "bad options\n";

sub median {
	my @v = sort { $a <=> $b } @_;
	return undef unless @v;
	return @v % 2 ? $v[$#v / 2] : ($v[@v / 2 - 1] + $v[@v / 2]) / 2;
}

if ($latency_median) {
	my @us;
	for my $f (@ARGV) {
		open(my $fh, '<', $f) or die "$f: $!\n";
		while (<$fh>) {
			my @c = split;
			push @us, $c[2] if @c >= 3;
		}
	}
	die "no transactions in @ARGV\n" unless @us;
	printf "%.3f\n", median(@us) / 1000;
	exit 0;
}

# ------------------------------------------------------------------ figures
#
# id => [label, unit]; a reference row has no ref.  Rows of the table:
# [figure, reference or undef, target or undef, note]; a target is
# [op, value] applied to the ratio, or [op, value, 'abs'] applied to the
# median itself.
my %fig = (
	'enqueue.copy_plain' => ['COPY into a plain table (same columns)', 'rows/s'],
	'enqueue.copy_gk'    => ['COPY into gatekeeper.mail', 'rows/s'],
	'enqueue.insert_gk'  => ['INSERT ... SELECT into gatekeeper.mail', 'rows/s'],
	'enqueue.pgmq'       => ['pgmq.send_batch() of the same rows (BK_PGMQ_SQL)', 'rows/s'],
	'enqueue.fn'         => ['enqueue() calls, all in one transaction', 'calls/s'],
	'reports.ingest'     => ['ingest_report(), one 4 kB DSN a call, one backend', 'reports/s'],
	'reports.record_event' => ['record_event(), one webhook event a call, one backend', 'events/s'],
	'reports.enqueue'    => ['enqueue() calls, one backend (same run)', 'calls/s'],
	'backlog.small'      => ['claim(1000)+ack, 50k not-yet-due', 'ms'],
	'backlog.big'        => ['claim(1000)+ack, 5M not-yet-due', 'ms'],
	'backlog.sent'       => ['claim(1000)+ack, 50k not-yet-due + 5M sent retained', 'ms'],
	'sustained.first'    => ['drain rate, first wave', 'mails/s'],
	'sustained.last'     => ['drain rate, last wave', 'mails/s'],
	'held_snapshot.none.first' => ['drain rate, first wave, no snapshot held', 'mails/s'],
	'held_snapshot.none.last'  => ['drain rate, last wave, no snapshot held', 'mails/s'],
	'held_snapshot.held.first' => ['drain rate, first wave, a REPEATABLE READ snapshot held', 'mails/s'],
	'held_snapshot.held.last'  => ['drain rate, last wave, the snapshot held across every wave', 'mails/s'],
	'held_snapshot.none.last.cpu' => ['server CPU per mail over the last wave\'s drain, no snapshot held', 'us'],
	'held_snapshot.held.last.cpu' => ['server CPU per mail over the last wave\'s drain, the snapshot held', 'us'],
	'storage.first'      => ['drain rate, first wave of 1 kB mail', 'mails/s'],
	'storage.last'       => ['drain rate, last wave, finished mail retained', 'mails/s'],
	'storage.vacuum_first' => ['VACUUM of the mail tables before the first wave\'s drain', 'ms'],
	'storage.vacuum_last'  => ['VACUUM of the mail tables before the last wave\'s drain, finished mail retained', 'ms'],
	'storage.size_plain' => ['the same rows in a plain table (heap, TOAST, primary key)', 'MB'],
	'storage.size_gk'    => ['gatekeeper\'s mail tables after the waves (heap, TOAST, indexes)', 'MB'],
	'stats.queue.small'  => ['SELECT * FROM queue_stats, 50k finished mails retained', 'ms'],
	'stats.queue.big'    => ['SELECT * FROM queue_stats, 5M finished mails retained', 'ms'],
	'stats.worker.small' => ['SELECT * FROM worker_status, 50k finished mails retained', 'ms'],
	'stats.worker.big'   => ['SELECT * FROM worker_status, 5M finished mails retained', 'ms'],
	'stats.scrape.big'   => ['one scrape of postgres_exporter with monitoring/queries.yaml, 5M retained', 'ms'],
	'stats.scrape.bare'  => ['one scrape of the same exporter with no queries (its own cost)', 'ms'],
	'stats.scan.big'     => ['reference: counting the finished mail by queue and state (what queue_stats did before), 5M', 'ms'],
	'stats.queue.live'   => ['SELECT * FROM queue_stats, 5M scheduled for tomorrow + 50k due, 5M retained', 'ms'],
	'stats.worker.live'  => ['SELECT * FROM worker_status, the same', 'ms'],
	'stats.livescan.live' => ['reference: counting the live mail by queue and state (what queue_stats did before), 5.05M', 'ms'],
	'gates.redis_p64'    => ['Redis SET NX EX, pipelined -P 64, 4 clients', 'ops/s'],
	'gates.redis_p1'     => ['Redis SET NX EX, unpipelined, 4 clients', 'ops/s'],
	'gates.batch'        => ['gate_pass_batch(text[]) 1,000 new recipients/call, 4 clients', 'passes/s'],
	'gates.ceiling'      => ['INSERT ON CONFLICT DO NOTHING, same keys, bare table (ceiling)', 'rows/s'],
	'gates.single_on'    => ['gate_pass(text), 4 clients, synchronous_commit on', 'calls/s'],
	'gates.single_off'   => ['gate_pass(text), 4 clients, synchronous_commit off', 'calls/s'],
	'delivery.smtp_source' => ['smtp-source -> smtp-sink, 16 sessions', 'mails/s'],
	'delivery.rate'      => ['worker -> smtp-sink, 16 connections', 'mails/s'],
	'delivery.rate_2w'   => ['2 workers x 8 connections -> smtp-sink', 'mails/s'],
	'delivery.lat_median' => ['commit to acceptance, one due mail, median', 'ms'],
	'delivery.lat_p99'   => ['commit to acceptance, one due mail, p99', 'ms'],
	'relays.loopback.source' => ['smtp-source -d -s 16 -> loopback smtp-sink', 'mails/s'],
	'relays.loopback.gk' => ['worker, 16 connections -> loopback smtp-sink', 'mails/s'],
	'relays.rtt20.source' => ['smtp-source -d -s 16 -> smtp-sink 20 ms away (proxy, 10 ms each way)', 'mails/s'],
	'relays.rtt20.gk'    => ['worker, 16 connections -> smtp-sink 20 ms away', 'mails/s'],
	'relays.slow_eod.bound' => ['parallel bound: 16 connections / 1 s per end-of-data', 'mails/s'],
	'relays.slow_eod.source' => ['smtp-source -d -s 16 -> smtp-sink -W .:1', 'mails/s'],
	'relays.slow_eod.gk' => ['worker, 16 connections -> smtp-sink -W .:1', 'mails/s'],
	'suppression.none'   => ['claim+ack smart_sending, batch 1000, 4 claimers, empty suppression list', 'mails/s'],
	'suppression.miss'   => ['the same, 1,000,000 suppressed addresses, none of them drained', 'mails/s'],
	'suppression.hit10'  => ['the same, 1,000,000 suppressed addresses, 10% of the drained among them', 'mails/s'],
	'suppression.none.round'  => ['median claim(1000)+ack round of those drains, empty list', 'ms'],
	'suppression.miss.round'  => ['median round, 1,000,000 suppressed, none drained', 'ms'],
	'suppression.hit10.round' => ['median round, 1,000,000 suppressed, 10% of the drained', 'ms'],
	'suppression.none.cpu'  => ['server CPU per mail over those drains, empty list', 'us'],
	'suppression.miss.cpu'  => ['server CPU per mail, 1,000,000 suppressed, none drained', 'us'],
	'suppression.hit10.cpu' => ['server CPU per mail, 1,000,000 suppressed, 10% of the drained', 'us'],
	'shards.enqueue.direct' => ['enqueue() on one shard, one per transaction, 4 clients', 'calls/s'],
	'shards.enqueue.routed' => ['enqueue() through gatekeeper_router, one per transaction, 4 clients', 'calls/s'],
	'shards.bulk.direct'    => ['enqueue() on one shard, all in one statement', 'calls/s'],
	'shards.bulk.routed'    => ['enqueue() through gatekeeper_router, all in one statement (one routed call each)', 'calls/s'],
	'shards.bulk.batch'     => ['enqueue_batch() through gatekeeper_router, arrays of 1,000 rows', 'rows/s'],
	'shards.claim.k1'       => ['claim(1000)+ack, 1 shard, 2 claimers', 'mails/s'],
	'shards.claim.k2'       => ['claim(1000)+ack, 2 shards at once, 2 claimers each', 'mails/s'],
	'shards.claim.k4'       => ['claim(1000)+ack, 4 shards at once, 2 claimers each', 'mails/s'],
	'shards.claim_per.k1'   => ['the same per shard, 1 shard', 'mails/s'],
	'shards.claim_per.k2'   => ['the same per shard, 2 shards', 'mails/s'],
	'shards.claim_per.k4'   => ['the same per shard, 4 shards', 'mails/s'],
);
my @sections = (
	['enqueue', [
		['enqueue.copy_plain'],
		['enqueue.copy_gk', 'enqueue.copy_plain', ['>=', 0.8]],
		['enqueue.insert_gk', 'enqueue.copy_plain'],
		['enqueue.pgmq', 'enqueue.copy_plain'],
		['enqueue.copy_gk', 'enqueue.pgmq', ['>=', 1.0]],
		['enqueue.insert_gk', 'enqueue.pgmq', ['>=', 1.0]],
		['enqueue.fn', 'enqueue.copy_plain'],
	]],
	['drain', []],
	['backlog', [
		['backlog.small'],
		['backlog.big', 'backlog.small', ['<=', 1.5]],
		['backlog.sent', 'backlog.small', ['<=', 1.5]],
	]],
	['sustained', [
		['sustained.first'],
		['sustained.last', 'sustained.first', ['>=', 0.8]],
	]],
	['held_snapshot', [
		['held_snapshot.none.first'],
		['held_snapshot.none.last'],
		['held_snapshot.held.first', 'held_snapshot.none.first'],
		['held_snapshot.held.last', 'held_snapshot.none.last', ['>=', 0.8]],
		['held_snapshot.none.last.cpu'],
		['held_snapshot.held.last.cpu', 'held_snapshot.none.last.cpu', ['<=', 1.25]],
	]],
	['storage', [
		['storage.first'],
		['storage.last', 'storage.first', ['>=', 0.9]],
		['storage.vacuum_first'],
		['storage.vacuum_last', 'storage.vacuum_first'],
		['storage.size_plain'],
		['storage.size_gk', 'storage.size_plain', ['<=', 1.5]],
	]],
	['stats', [
		['stats.queue.small', undef, ['<', 20, 'abs']],
		['stats.queue.big', 'stats.queue.small', ['<', 20, 'abs']],
		['stats.worker.small', undef, ['<', 20, 'abs']],
		['stats.worker.big', 'stats.worker.small', ['<', 20, 'abs']],
		['stats.scrape.bare'],
		['stats.scrape.big', 'stats.scrape.bare', ['<', 20, 'abs']],
		['stats.scan.big', 'stats.queue.big'],
		['stats.queue.live', 'stats.queue.small', ['<', 20, 'abs']],
		['stats.worker.live', 'stats.worker.small', ['<', 20, 'abs']],
		['stats.livescan.live', 'stats.queue.live'],
	]],
	['gates', [
		['gates.redis_p64'],
		['gates.redis_p1'],
		['gates.batch', 'gates.redis_p64', ['>=', 1.0]],
		['gates.ceiling', 'gates.redis_p64'],
		['gates.single_on', 'gates.redis_p1'],
		['gates.single_off', 'gates.redis_p1', ['>=', 0.3]],
	]],
	['reports', [
		['reports.enqueue'],
		['reports.ingest', 'reports.enqueue', ['>=', 2000, 'abs']],
		['reports.record_event', 'reports.enqueue', ['>=', 10000, 'abs']],
	]],
	['delivery', [
		['delivery.smtp_source'],
		['delivery.rate', 'delivery.smtp_source', ['>=', 0.8]],
		['delivery.rate_2w', 'delivery.smtp_source'],
		['delivery.lat_median', undef, ['<', 20, 'abs']],
		['delivery.lat_p99'],
	]],
	['relays', [
		['relays.loopback.source'],
		['relays.loopback.gk', 'relays.loopback.source', ['>=', 0.8]],
		['relays.rtt20.source'],
		['relays.rtt20.gk', 'relays.rtt20.source', ['>=', 2.0]],
		['relays.slow_eod.bound'],
		['relays.slow_eod.source', 'relays.slow_eod.bound'],
		['relays.slow_eod.gk', 'relays.slow_eod.bound', ['>=', 0.9]],
		['relays.slow_eod.gk', 'relays.slow_eod.source'],
	]],
	['suppression', [
		['suppression.none'],
		['suppression.miss', 'suppression.none', ['>=', 0.9]],
		['suppression.hit10', 'suppression.none', ['>=', 0.9]],
		['suppression.none.round'],
		['suppression.miss.round', 'suppression.none.round', ['<=', 1.1]],
		['suppression.hit10.round', 'suppression.none.round', ['<=', 1.1]],
		['suppression.none.cpu'],
		['suppression.miss.cpu', 'suppression.none.cpu', ['<=', 1.1]],
		['suppression.hit10.cpu', 'suppression.none.cpu', ['<=', 1.1]],
	]],
	['shards', [
		['shards.enqueue.direct'],
		['shards.enqueue.routed', 'shards.enqueue.direct'],
		['shards.bulk.direct'],
		['shards.bulk.routed', 'shards.bulk.direct'],
		['shards.bulk.batch', 'shards.bulk.direct'],
		['shards.claim.k1'],
		['shards.claim.k2', 'shards.claim.k1'],
		['shards.claim.k4', 'shards.claim.k1'],
		['shards.claim_per.k1'],
		['shards.claim_per.k2', 'shards.claim_per.k1'],
		['shards.claim_per.k4', 'shards.claim_per.k1'],
	]],
);
for my $b (100, 1000) {
	for my $k (1, 2, 4, 8) {
		my $c = $k == 1 ? '1 claimer' : "$k claimers";
		$fig{"drain.raw.b$b.k$k"}   = ["raw UPDATE by id range, batch $b, $k client" . ($k > 1 ? 's' : ''), 'rows/s'];
		$fig{"drain.pgq.b$b.k$k"}   = ["PgQ insert+consume, batch $b, $k producer" . ($k > 1 ? 's' : '') . ', 1 consumer', 'events/s'];
		$fig{"drain.pgqc.b$b.k$k"}  = ["PgQ consume only, batch $b (after $k producer" . ($k > 1 ? 's' : '') . ')', 'events/s'];
		$fig{"drain.pgmq.b$b.k$k"}  = ["pgmq read+delete (BK_PGMQ_SQL), batch $b, $k consumer" . ($k > 1 ? 's' : ''), 'msgs/s'];
		$fig{"drain.gk.b$b.k$k"}    = ["claim+ack ungated, batch $b, $c", 'mails/s'];
		$fig{"drain.gated.b$b.k$k"} = ["claim+ack smart_sending, batch $b, $c", 'mails/s'];
	}
}
{
	my $rows = $sections[1][1];
	for my $b (100, 1000) {
		for my $k (1, 2, 4, 8) {
			push @$rows,
				["drain.raw.b$b.k$k"],
				["drain.pgq.b$b.k$k"],
				["drain.gk.b$b.k$k", "drain.raw.b$b.k$k", ['>=', 0.6]],
				["drain.gk.b$b.k$k", "drain.pgq.b$b.k$k", ['>=', 1.5]],
				["drain.gated.b$b.k$k", "drain.raw.b$b.k$k", ['>=', 0.4]],
				["drain.gated.b$b.k$k", "drain.pgq.b$b.k$k", ['>=', 1.5]],
				["drain.pgmq.b$b.k$k"],
				["drain.gk.b$b.k$k", "drain.pgmq.b$b.k$k", ['>=', 1.5]],
				["drain.gated.b$b.k$k", "drain.pgmq.b$b.k$k", ['>=', 1.0]];
		}
	}
}

# ------------------------------------------------------------------ results
my (%values, %skip, %notes, @info);
my $file = shift @ARGV or die "usage: report.pl [options] RESULTS.tsv\n";
open(my $fh, '<', $file) or die "$file: $!\n";
while (<$fh>) {
	chomp;
	my ($kind, $key, $run, $text) = split /\t/, $_, 4;
	next unless defined $text;
	if ($kind eq 'value') {
		push @{$values{$key}}, $text;
	} elsif ($kind eq 'skip') {
		$skip{$key} //= $text;
	} elsif ($kind eq 'note') {
		push @{$notes{$key}}, $text;
	} elsif ($kind eq 'info') {
		push @info, [$key, $text];
	}
}
close $fh;

sub fmt {
	my ($v, $unit) = @_;
	return '-' unless defined $v;
	if ($unit eq 'ms' || $unit eq 'us') {
		return sprintf($v < 10 ? '%.2f' : '%.1f', $v);
	}
	my $s = sprintf('%.0f', $v);
	1 while $s =~ s/^(\d+)(\d{3})/$1,$2/;
	return $s;
}

sub stats {
	my ($id) = @_;
	my $v = $values{$id} or return;
	my @s = sort { $a <=> $b } @$v;
	return (median(@s), $s[0], $s[-1], scalar @s);
}

my $seen_any = 0;
my @table;	# [section, label, median, range, ref label, ref median, ratio, target, met]
for my $sec (@sections) {
	my ($name, $rows) = @$sec;
	my @out;
	for my $row (@$rows) {
		my ($id, $ref, $target) = @$row;
		my ($label, $unit) = @{$fig{$id}};
		my ($med, $min, $max, $n) = stats($id);
		next unless defined $med || $skip{$id};
		# a comparison with a peer that was not run at all (pgmq) is left out
		next if $ref && !$values{$ref} && !$skip{$ref};
		$seen_any = 1;
		my @r = ($name, $label);
		if (!defined $med) {
			push @out, [@r, "not measured: $skip{$id}", '', '', '', '', '', ''];
			next;
		}
		my $range = $n > 1 ? fmt($min, $unit) . '-' . fmt($max, $unit) : '(1 run)';
		my ($rlabel, $rmed, $ratio, $tgt, $met) = ('', '', '', '', '');
		if ($ref) {
			my ($rm) = stats($ref);
			$rlabel = $fig{$ref}[0];
			if (defined $rm && $rm > 0) {
				$rmed = fmt($rm, $fig{$ref}[1]) . " $fig{$ref}[1]";
				$ratio = $med / $rm;
			} else {
				$rmed = $skip{$ref} ? "not measured" : '-';
			}
		}
		if ($target) {
			my ($op, $val, $abs) = @$target;
			my $x = $abs ? $med : ($ratio eq '' ? undef : $ratio);
			$tgt = $abs ? "$op $val $unit" : "$op ${val}x";
			if (defined $x) {
				my $ok = $op eq '>=' ? $x >= $val : $op eq '<=' ? $x <= $val : $op eq '<' ? $x < $val : $x > $val;
				$met = $ok ? 'yes' : 'NO';
			} else {
				$met = '?';
			}
		}
		push @out, [@r, fmt($med, $unit) . " $unit", $range, $rlabel, $rmed,
			$ratio eq '' ? '' : sprintf('%.2fx', $ratio), $tgt, $met];
	}
	push @table, @out;
}

# ------------------------------------------------------------------ stdout
my @head = ('scenario', 'figure', 'median', 'min-max', 'reference', 'ref median', 'ratio', 'target', 'met');
{
	my @w = map { length } @head;
	for my $r (@table) {
		for my $i (0 .. $#$r) {
			$w[$i] = length $r->[$i] if length $r->[$i] > $w[$i];
		}
	}
	my $line = sub { join('  ', map { sprintf("%-*s", $w[$_], $_[$_]) } 0 .. $#_) . "\n" };
	print "\n", $line->(@head), $line->(map { '-' x $_ } @w);
	my $last = '';
	for my $r (@table) {
		my @c = @$r;
		$c[0] = '' if $c[0] eq $last;
		$last = $r->[0];
		print $line->(@c);
	}
	print "\n";
}

# ------------------------------------------------------------------ Markdown
exit 0 unless $output;
my %desc = (
	enqueue => 'Enqueue: 200,000 rows (a recipient, a 25-character subject, a 500-byte body), each way in turn in every run, from empty tables after a CHECKPOINT: server-side COPY of them (a CSV file) into gatekeeper.mail and into a plain table with the same columns and defaults (identity primary key, no other index, no trigger: the ceiling); one INSERT ... SELECT of them into gatekeeper.mail; with BK_PGMQ_SQL, one pgmq.send_batch() of the same rows as jsonb messages built in the same statement (issue 26: both gatekeeper ways >= 1.0x of it); and gatekeeper.enqueue() called once per row by one statement, all in one transaction.',
	drain => 'Drain: N due mails preloaded and vacuumed, then drained by k pgbench clients (-M prepared), each looping claim(batch) in one transaction and ack(ids, attempts) in the next, until all are sent; rate = N / wall time. Raw UPDATE: the same rows copied into a table with the same columns, defaults and indexes (no gatekeeper code), marked sent by id range in batches of the same size by the same number of clients: one row write per row, the machine\'s row-write ceiling for this layout. PgQ: the same number of events (same payload) inserted by k producers in transactions of `batch` events with a tick after each, then consumed by one consumer (next_batch, get_batch_events, finish_batch per transaction); rate = N / (insert + consume). "Well ahead of PgQ" is taken as >= 1.5x.',
	backlog => 'Backlog: latency of one claim(1000)+ack round (pgbench -M prepared, one client, 30 rounds a run, per-transaction log; median per run) with 50,000 or 5,000,000 not-yet-due mails (due a day later) in the same queue, or 50,000 not-yet-due plus 5,000,000 sent mails retained. Each backlog is loaded into a database of its own, vacuumed and analyzed; every run measures the three in turn, in reverse order in even runs.',
	storage => 'Storage: 6 waves of 300,000 mails with 1 kB bodies, each enqueued by one INSERT ... SELECT and drained to completion by 4 claimers at batch 1000, finished mail retained, one gatekeeper worker in the database for housekeeping; between the enqueue and the drain of each wave the mail tables are vacuumed (timed on its own, not in the drain); the on-disk size of the mail tables against the same rows in a plain table; each run from empty tables.',
	sustained => 'Sustained: 10 consecutive waves of 400,000 mails, each enqueued by one INSERT ... SELECT and drained by 4 claimers at batch 1000, with default autovacuum and nothing in between but the housekeeping of one gatekeeper worker in the database (its own senders claim: the queue is not delivered by it); run once.',
	stats => 'Stats (issue 13): what a Prometheus scrape costs. Latency of SELECT * FROM gatekeeper.queue_stats and of gatekeeper.worker_status (pgbench -M prepared, one client, 50 calls a run, per-call log; median per run) with 50,000 and then 5,000,000 finished mails retained in mail_done (loaded in bulk past the triggers), beside 2,000 mails enqueued through the trigger, 1,000 of them claimed and acked, 1,000 left due; at 5,000,000 also one scrape of prometheus-postgres-exporter with monitoring/queries.yaml (wall time of the HTTP GET after a warm-up scrape; the exporter\'s own database and bgwriter collectors off, so only gatekeeper\'s queries run), against the same exporter with no queries; and for reference the count over the finished mail by queue and state that queue_stats ran before it kept totals.',
	gates => 'Gates: gate_pass_batch(\'smart_sending\', text[]) with 1,000 never-seen recipients per call, and gate_pass(\'smart_sending\', text) with one, each by 4 pgbench clients; against redis-benchmark SET key:__rand_int__ v NX EX 57600 (-r 100000000, 4 clients) on a redis-server without persistence.',
	relays => 'Relays (issue 10): the relays a user meets, each measured with the worker (gatekeeper.smtp_connections = 16, helo_name set; time from the commit of N due mails in one INSERT until smtp-sink has counted them) and with smtp-source -s 16 -d (16 sessions, connections reused, same body size) through the same endpoint in the same run: a loopback smtp-sink -c; the same sink behind t/delay_proxy.py adding 10 ms to every chunk each way (a relay 20 ms away; the proxy counts the chunks each client wrote, about one per round trip waited for, noted per mail); smtp-sink -W .:1 (one second per end-of-data), against the parallel bound of 16 connections per second.',
	held_snapshot => 'Held snapshot (issue 46): 4 waves of 100,000 mails, each enqueued by one INSERT ... SELECT (not timed) and drained by 2 pgbench clients looping claim(1000) and ack_batch, no worker in the database, while one session holds BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1 FROM gatekeeper.mail LIMIT 1 open across all four (nothing a claim deletes can be vacuumed or marked dead); reference: the same waves without it, in the same run, the two sides alternated (odd runs the reference first), each from empty tables.',
	suppression => 'Suppression (issue 12, opt-in: --only suppression): 80,000 due mails through a queue gated by smart_sending (distinct recipients), drained by 4 pgbench clients looping claim(1000) and ack, three ways in each run: with the suppression list empty (the reference), with 1,000,000 global hard_bounce entries none of which is a drained recipient, and with 1,000,000 entries of which one in ten drained recipients (8,000) are part (those mails end suppressed); rate = mails finished / wall time. The list is loaded, vacuumed and analyzed before it is measured (not timed).',
	shards => 'Shards (issue 29): four gatekeeper databases of the same cluster, each made shard n of 4 by gatekeeper.shard(), and a router database with plproxy and gatekeeper_router whose foreign server names them (one machine: these figures show what routing costs and what the machine bounds, not what separate machines carry). enqueue() with random recipients, one per transaction, by 4 pgbench clients (-M prepared), on one shard directly and through the router; enqueue() called once per row by one statement on one shard and through the router (each routed call commits on its shard), and the router\'s enqueue_batch() with arrays of 1,000 rows (one call and transaction per shard and array); claim(1000)+ack drains of 160,000 mails spread over 1, 2 and 4 shards, 2 pgbench claimers per shard, all shards at once, total and per shard.',
	reports => 'Reports (issue 27): a bounce storm. 20,000 mails loaded as sent, then one DSN per mail in Postfix\'s shape (about 4 kB: notification, delivery status, the returned message; half 5.1.1, half 5.2.2, found by the VERP token of the address it was delivered to) through ingest_report() by one statement in one backend, every one recorded (its event, and a hard_bounce suppression or a soft-bounce count); and 50,000 record_event() calls (a webhook\'s delivered event, found by Message-ID) by one statement. Reference: as many enqueue() calls by one statement, in the same run.',
	delivery => 'Delivery: the worker (gatekeeper.smtp_connections = 16) sending to a loopback smtp-sink that counts and discards; time from the commit of N due mails until smtp-sink has counted N; and from the commit of one due mail until smtp-sink counts it, repeated (median, p99). Reference: smtp-source -s 16 -d (16 sessions, connections reused) into the same sink, same body size. The 2-worker line runs gatekeeper.workers = 2 with 8 connections each (the same 16 in all), after the 1-worker runs, against the same smtp-source figures.',
);
my $bench_dir = ($0 =~ s{[^/]*$}{}r) || '.';
open(my $md, '>', $output) or die "$output: $!\n";
print $md "# gatekeeper benchmarks\n\n";
my $commit = `git -C '$bench_dir' rev-parse --short HEAD 2>/dev/null` // '';
chomp $commit;
print $md "Produced by `bash bench/run.sh` (" . ($mode eq 'smoke' ? 'smoke mode: tiny sizes, not a measurement' : "full mode, $runs runs per figure") .
	") on " . strftime('%Y-%m-%d', gmtime) . ($commit ne '' ? " at commit $commit" : '') . ". Every figure is the median of its runs, with their min-max; a ratio is the figure's median over its reference's median, both measured in the same run of the harness. Targets never fail the run. See bench/README.md for the method.\n\n";
print $md "## Machine\n\n";
print $md "| | |\n|---|---|\n";
for my $i (@info) {
	print $md "| $i->[0] | $i->[1] |\n";
}
print $md "\n## Results\n\n";
print $md '| ' . join(' | ', @head) . " |\n";
print $md '|' . join('|', map { '---' } @head) . "|\n";
my $last = '';
for my $r (@table) {
	my @c = @$r;
	$c[0] = '' if $c[0] eq $last;
	$last = $r->[0];
	$c[8] = "**$c[8]**" if $c[8] eq 'NO';
	print $md '| ' . join(' | ', map { s/\|/\\|/gr } @c) . " |\n";
}
print $md "\n## What each scenario measures\n\n";
for my $sec (@sections) {
	next unless grep { $_->[0] eq $sec->[0] } @table;
	print $md "- $desc{$sec->[0]}\n";
}
{
	my @c;
	for my $b (100, 1000) {
		for my $k (1, 2, 4, 8) {
			my ($m) = stats("drain.pgqc.b$b.k$k");
			push @c, "batch $b after $k producer" . ($k > 1 ? 's' : '') . ': ' . fmt($m, '') if defined $m;
		}
	}
	unshift @{$notes{drain}}, 'PgQ consume phase alone, events/s (one consumer): ' . join(', ', @c) if @c;
}
print $md "\n## Observations from this run\n\n";
for my $sec (@sections) {
	my $n = $notes{$sec->[0]} or next;
	print $md "- $sec->[0]: " . join('; ', @$n) . "\n";
}
# the hand-written analysis (what bounds each figure) and the earlier runs
# stay in bench/notes.md: linked, not appended, so that this file is the
# latest run alone
print $md "\n## History\n\nWhat bounds each figure, every earlier full run and the studies behind the\n"
  . "storage layout: [bench/notes.md](bench/notes.md).\n" if $mode ne 'smoke';
close $md;
