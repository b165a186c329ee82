# Copyright: gatekeeper contributors

# What an application role can make the worker hold is bounded by
# gatekeeper.max_in_flight, whatever it enqueues (issue 44, item 3).
#
# Placeholders: a header value's {message_id} becomes the mail's
# Message-ID at the claim, up to 295 octets with a 252-octet sender
# domain.  Enqueue counts each placeholder at GATEKEEPER_MESSAGE_ID_MAX
# (384) octets, so a mail made of placeholders is refused (54000) unless
# its Message-IDs fit max_message_size; the most amplified mail enqueue
# accepts arrives at the relay no larger than max_message_size, and the
# worker's memory for it stays within the bound below.
#
# Claims: after 300 tiny mails the worker's mean mail size is small; 40
# mails of 4 MB due at once must still be claimed no more than
# max_in_flight at a time.
#
# The bound, from max_in_flight (8 MB here) and max_message_size (5 MB):
# the worker keeps claiming while it holds less than max_in_flight, a
# claim takes mail up to max_in_flight less what it holds (always one),
# and building a message holds the mail and its message at once: so at
# most 2 x max_in_flight + 2 x max_message_size of mail and messages
# (26 MB), plus what the worker holds idle (its baseline, measured here:
# about 5 MB private, 25 MB resident) and 20 MB of slack for the
# allocator, SPI and the transient copies of a claim.  Resident memory
# also counts the shared buffers it touches (16 MB here).  On acef44e the
# amplified mail took 1.29 GB of private memory, the large mails 180 MB.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $mb = 1024 * 1024;
my $max_in_flight_mb = 8;
my $max_message_size = 5 * $mb;

my $sink = GatekeeperTest::start_sink(name => 'placeholders');
my $node = GatekeeperTest::new_node(
	'placeholders',
	sink => $sink,
	conf => "gatekeeper.max_in_flight = '${max_in_flight_mb}MB'\n"
	  . "gatekeeper.max_message_size = '5MB'\n"
	  . "gatekeeper.smtp_connections = 8\n"
	  . "gatekeeper.helo_name = 'mta.example.com'\n"
	  . "shared_buffers = '16MB'\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gatekeeper');
my ($pid) = GatekeeperTest::worker_pids($node);
ok($pid, "the worker runs (pid $pid)") or die 'no worker';

# the worker's memory idle, with the extension ready: private, and
# resident (which counts the binary and libraries it maps too)
usleep(1_500_000);
my $baseline_kb = anon_kb($pid);
my $baseline_rss_kb = GatekeeperTest::process_memory_kb($pid)->{VmRSS};
note("worker baseline: RssAnon $baseline_kb kB, VmRSS $baseline_rss_kb kB");
my $held_kb = (2 * $max_in_flight_mb + 2 * 5 + 20) * 1024;
my $anon_bound_kb = $baseline_kb + $held_kb;
my $rss_bound_kb = $baseline_rss_kb + $held_kb + 16 * 1024;

# RssAnon of a process, kB
sub anon_kb
{
	my ($p) = @_;
	open(my $fh, '<', "/proc/$p/status") or return 0;
	my $kb = 0;
	while (my $line = <$fh>)
	{
		$kb = $1 if $line =~ /^RssAnon:\s+(\d+)/;
	}
	close($fh);
	return $kb;
}

# Forget the worker's peak resident size (VmHWM), so that each part of
# the test measures its own.
sub reset_peak
{
	open(my $fh, '>', "/proc/$pid/clear_refs") or die "clear_refs: $!";
	print $fh "5\n";
	close($fh);
}

# Sample the worker's private memory until no mail is scheduled or
# claimed (at most $timeout s); returns whether it finished and the
# highest RssAnon seen.
sub sample_until_done
{
	my ($timeout) = @_;
	my $max_anon = 0;
	my $deadline = time + $timeout;
	while (time < $deadline)
	{
		my $a = anon_kb($pid);
		$max_anon = $a if $a > $max_anon;
		my $left = $node->safe_psql('postgres',
			"SELECT count(*) FROM gatekeeper.mail_status WHERE state IN ('scheduled', 'claimed')"
		);
		return (1, $max_anon) if $left eq '0';
		usleep(50_000);
	}
	return (0, $max_anon);
}

# a sender whose domain is 252 octets, the longest an address allows:
# the longest Message-ID the worker makes without message_id_domain
my $domain = join('.',
	'a' x 63, 'b' x 63, 'c' x 63, 'd' x 52, 'example');
is(length($domain), 252, 'the sender domain is 252 octets');
my $sender = "s\@$domain";

#
# 1. A mail of placeholders that expands twentyfold is refused at enqueue,
#    by enqueue() and by INSERT alike.
#
my $many = int($max_message_size / 13) - 100;
my ($ret, $out, $err) = $node->psql('postgres',
	"SELECT gatekeeper.enqueue('amp\@customer.example', 's', 'b', sender => '$sender', "
	  . "headers => jsonb_build_object('X-Ref', repeat('{message_id} ', $many)))",
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/54000/,
	"a mail of $many placeholders (under max_message_size as text) is refused at enqueue (54000)"
);
($ret, $out, $err) = $node->psql('postgres',
	"INSERT INTO gatekeeper.mail (recipient, subject, body, sender, headers) "
	  . "SELECT 'amp2\@customer.example', 's', 'b', '$sender', "
	  . "jsonb_build_object('X-Ref', repeat('{message_id} ', $many))",
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/54000/, 'and by INSERT (54000)');

#
# 2. The most amplified mail enqueue accepts: as many placeholders as fit
#    at 384 octets each.  It arrives no larger than max_message_size.
#
reset_peak();
my $fits = int(($max_message_size - 100) / 385);
$node->safe_psql('postgres',
	"SELECT gatekeeper.enqueue('fits\@customer.example', 's', 'b', sender => '$sender', "
	  . "headers => jsonb_build_object('X-Ref', repeat('{message_id} ', $fits)))");
($ret, $out, $err) = $node->psql('postgres',
	"SELECT gatekeeper.enqueue('over\@customer.example', 's', 'b', sender => '$sender', "
	  . "headers => jsonb_build_object('X-Ref', repeat('{message_id} ', $fits + 20)))",
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/54000/, "$fits placeholders fit, 20 more do not (54000)");
my ($done, $max_anon) = sample_until_done(120);
ok($done, 'the worker finished the amplified mail');
my $mem = GatekeeperTest::process_memory_kb($pid);
my @files = GatekeeperTest::sink_files($sink);
my $largest = 0;
foreach (@files) { $largest = -s $_ if -s $_ > $largest }
note(sprintf(
		"amplified mail: %d placeholders, %.1f MB at the relay; worker VmHWM %d kB, max RssAnon %d kB",
		$fits, $largest / $mb, $mem->{VmHWM} // 0, $max_anon));
is(GatekeeperTest::mail_states($node, "recipient LIKE 'fits\@%'"),
	'sent:1', 'the amplified mail enqueue accepted is sent');
cmp_ok($largest, '<=', $max_message_size + 64 * 1024,
	"it arrives no larger than max_message_size: $largest octets");
cmp_ok($max_anon, '<', $anon_bound_kb,
	"the worker's private memory for it stays within the bound: $max_anon kB < $anon_bound_kb kB"
);
cmp_ok($mem->{VmHWM} // 0, '<', $rss_bound_kb,
	"its peak resident memory too: $mem->{VmHWM} kB < $rss_bound_kb kB");

#
# 3. 300 tiny mails, then 40 of 4 MB due at once.
#
$node->safe_psql('postgres',
	"SELECT count(gatekeeper.enqueue('tiny' || i || '\@customer.example', 'Tiny ' || i, 'hi')) "
	  . "FROM generate_series(1, 300) AS i");
($done) = sample_until_done(60);
ok($done, 'the 300 tiny mails are sent');
reset_peak();
my $lines = int(4 * $mb / 77);
$node->safe_psql('postgres',
	"SELECT count(gatekeeper.enqueue('big' || i || '\@customer.example', 'Big ' || i, "
	  . "repeat(lpad(i::text, 8, '0') || repeat('y', 67) || E'\\n', $lines))) "
	  . "FROM generate_series(1, 40) AS i");
($done, $max_anon) = sample_until_done(180);
ok($done, 'the worker finished the 40 large mails');
$mem = GatekeeperTest::process_memory_kb($pid);
note(sprintf("40 mails of 4 MB after 300 tiny ones: worker VmHWM %d kB, max RssAnon %d kB",
		$mem->{VmHWM} // 0, $max_anon));
is(GatekeeperTest::mail_states($node, "recipient LIKE 'big%'"),
	'sent:40', 'every large mail is sent');
cmp_ok($max_anon, '<', $anon_bound_kb,
	"the worker's private memory stays within the bound: $max_anon kB < $anon_bound_kb kB");
cmp_ok($mem->{VmHWM} // 0, '<', $rss_bound_kb,
	"its peak resident memory too: $mem->{VmHWM} kB < $rss_bound_kb kB");

$node->stop;
GatekeeperTest::stop_sink($sink);

done_testing();
