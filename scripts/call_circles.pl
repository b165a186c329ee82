#!/usr/bin/perl
# Copyright: gatekeeper contributors
#
# perl scripts/call_circles.pl DIR
#
# The files of a built tree (DIR/src/**/*.o) that call one another in a
# circle: a.c -> b.c when a.o uses a function or variable b.o defines (nm).
# Prints each strongly connected set of two or more files, with the
# symbols of its edges, and exits 1 if there is any: the layers of src/
# (a module owns its settings and state, and what two modules share lies
# in a file below both) keep the graph acyclic.
use strict;
use warnings;
use File::Find;

my $dir = shift // '.';
my @objs;
find(sub { push @objs, $File::Find::name if /\.o$/ }, "$dir/src");
die "no objects under $dir/src: build first\n" unless @objs;

my (%def, %und);
for my $o (sort @objs) {
	(my $f = $o) =~ s/\.o$/.c/;
	$f =~ s{^\Q$dir\E/}{};
	open my $nm, '-|', 'nm', $o or die "nm $o: $!\n";
	while (<$nm>) {
		if (/^\s*[0-9a-f]+ [TDBR] (\S+)/) { $def{$1} = $f }
		elsif (/^\s+U (\S+)/) { push @{ $und{$f} }, $1 }
	}
	close $nm or die "nm $o failed\n";
}
my %e;
for my $f (keys %und) {
	for my $s (@{ $und{$f} }) {
		my $g = $def{$s};
		push @{ $e{$f}{$g} }, $s if $g && $g ne $f;
	}
}

# Tarjan's strongly connected components
my ($idx, @st, %on, %ix, %low, @scc) = (0);
my $visit;
$visit = sub {
	my $v = shift;
	$ix{$v} = $low{$v} = $idx++;
	push @st, $v; $on{$v} = 1;
	for my $w (sort keys %{ $e{$v} || {} }) {
		if (!exists $ix{$w}) { $visit->($w); $low{$v} = $low{$w} if $low{$w} < $low{$v} }
		elsif ($on{$w}) { $low{$v} = $ix{$w} if $ix{$w} < $low{$v} }
	}
	if ($low{$v} == $ix{$v}) {
		my (@c, $w);
		do { $w = pop @st; $on{$w} = 0; push @c, $w } while ($w ne $v);
		push @scc, [sort @c] if @c > 1;
	}
};
my %all = map { $_ => 1 } values %def, keys %und;
$visit->($_) for grep { !exists $ix{$_} } sort keys %all;

for my $c (@scc) {
	my %in = map { $_ => 1 } @$c;
	print "call circle: @$c\n";
	for my $a (@$c) {
		for my $b (sort grep { $in{$_} } keys %{ $e{$a} || {} }) {
			print "  $a -> $b: ", join(', ', sort @{ $e{$a}{$b} }), "\n";
		}
	}
}
printf "%d files, no call circles\n", scalar(keys %all) unless @scc;
exit(@scc ? 1 : 0);
