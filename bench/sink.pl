#!/usr/bin/perl
# bench/sink.pl: read smtp-sink's running counter (smtp-sink -c writes
# "sess=N quit=N mesg=N" lines, separated by carriage returns, to stdout).
#
#   sink.pl count FILE                  messages received so far
#   sink.pl wait FILE TARGET TIMEOUT    wait until TARGET messages; print the
#                                       epoch time it was seen (exit 1 on timeout)
#   sink.pl latency FILE N TIMEOUT -- CMD...   (CMD commits one mail, then prints
#                                              the server clock as epoch seconds)
#                                       N times: run CMD (it commits one due
#                                       mail), then time from its return until
#                                       the counter moves; print "median p99"
#                                       in milliseconds (exit 1 on a timeout)
use strict;
use warnings;
use Time::HiRes qw(time sleep);

sub count {
	my ($file) = @_;
	open(my $fh, '<', $file) or return 0;
	my $size = -s $fh;
	seek($fh, $size > 256 ? $size - 256 : 0, 0);
	local $/;
	my $tail = <$fh> // '';
	close $fh;
	my @m = $tail =~ /mesg=(\d+)/g;
	return @m ? $m[-1] : 0;
}

sub wait_for {
	my ($file, $target, $timeout) = @_;
	my $deadline = time + $timeout;
	while (1) {
		return time if count($file) >= $target;
		return undef if time > $deadline;
		sleep 0.0005;
	}
}

my $mode = shift // '';
if ($mode eq 'count') {
	print count($ARGV[0]), "\n";
} elsif ($mode eq 'wait') {
	my ($file, $target, $timeout) = @ARGV;
	my $t = wait_for($file, $target, $timeout);
	exit 1 unless defined $t;
	printf "%.6f\n", $t;
} elsif ($mode eq 'latency') {
	my ($file, $n, $timeout, $sep, @cmd) = @ARGV;
	die "usage: sink.pl latency FILE N TIMEOUT -- CMD...\n" unless $sep && $sep eq '--' && @cmd;
	my @ms;
	for (1 .. $n) {
		my $c0 = count($file);
		# CMD commits one mail and then prints the server's clock: the
		# time of the commit, give or take a round trip.  Timing from
		# CMD's exit instead would start the clock after the worker may
		# already have delivered.
		open(my $out, '-|', @cmd) or die "sink.pl: @cmd: $!\n";
		my @lines = <$out>;
		close($out) or die "sink.pl: @cmd failed\n";
		my $t0 = $lines[-1];
		defined $t0 && $t0 =~ /^\s*(\d+(?:\.\d+)?)\s*$/
		  or die "sink.pl: @cmd did not print the commit time\n";
		$t0 = $1;
		my $t1 = wait_for($file, $c0 + 1, $timeout);
		exit 1 unless defined $t1;
		push @ms, ($t1 - $t0) * 1000;
		sleep 0.05;
	}
	@ms = sort { $a <=> $b } @ms;
	my $median = @ms % 2 ? $ms[$#ms / 2] : ($ms[@ms / 2 - 1] + $ms[@ms / 2]) / 2;
	my $p99 = $ms[int(0.99 * $#ms + 0.5)];
	printf "%.2f %.2f\n", $median, $p99;
} else {
	die "usage: sink.pl count|wait|latency ...\n";
}
