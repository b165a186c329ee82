#!/usr/bin/perl
# Copyright: gatekeeper contributors
#
# perl scripts/defined_once.pl sql/gatekeeper--0.2.0--0.3.0.sql
#
# For every CREATE [OR REPLACE] FUNCTION/VIEW/TABLE/INDEX/TRIGGER of an
# install or update script: how often the object is defined (a function by
# its name and argument types, a trigger by its name and table).  Prints
# each object defined more than once, and each DROP or ALTER of an object
# the script created before it (but ENABLE ALWAYS TRIGGER, which CREATE
# TRIGGER cannot say); exits 1 if there is any.
use strict;
use warnings;

local $/; my $sql = <>;
$sql =~ s/\$\$.*?\$\$/\$\$\$\$/gs;        # function bodies
$sql =~ s/--[^\n]*//g; $sql =~ s{/\*.*?\*/}{}gs;
my (%def, %created, $bad);
while ($sql =~ /\bCREATE\s+(?:OR\s+REPLACE\s+)?(?:UNIQUE\s+)?(FUNCTION|VIEW|TABLE|INDEX|TRIGGER)\s+([\w.]+)\s*(\((?:[^()]|\((?:[^()]|\([^()]*\))*\))*\))?([^;]*)/gsi) {
	my ($kind, $name, $args, $rest) = (uc $1, $2, $3 // '', $4);
	$name =~ s/^gatekeeper\.//;
	my $key;
	if ($kind eq 'FUNCTION') {
		my @types;
		(my $a = $args) =~ s/^\(|\)$//g;
		for my $p (split /,(?![^()]*\))/, $a) {
			$p =~ s/\bDEFAULT\b.*//si; $p =~ s/^\s+|\s+$//g;
			next if $p eq '' || $p =~ /^OUT\s/i;
			my @w = split /\s+/, $p; shift @w if @w > 1 && $w[0] =~ /^(IN|INOUT|VARIADIC)$/i;
			push @types, @w > 1 ? join(' ', @w[1..$#w]) : $w[0];
		}
		$key = "function $name(" . join(', ', @types) . ')';
	} elsif ($kind eq 'TRIGGER') {
		my ($tab) = $rest =~ /\bON\s+([\w.]+)/i; $tab =~ s/^gatekeeper\.//;
		$key = "trigger $name on $tab";
	} else {
		$key = lc($kind) . " $name";
	}
	$def{$key}++;
	$created{$name} = $key;
}
for my $k (sort keys %def) { if ($def{$k} > 1) { print "defined $def{$k} times: $k\n"; $bad = 1; } }
while ($sql =~ /\b(DROP|ALTER)\s+(FUNCTION|VIEW|TABLE|INDEX|TRIGGER)\s+(?:IF\s+EXISTS\s+)?([\w.]+)/gsi) {
	my ($verb, $kind, $name) = (uc $1, uc $2, $3); $name =~ s/^gatekeeper\.//;
	next unless $created{$name};
	# a trigger dropped and then created, or the ALTERs that only enable
	# a trigger: defined once all the same
	my $pos = pos($sql);
	my $before = substr($sql, 0, $pos);
	my $created_before = $before =~ /\bCREATE\s+(?:OR\s+REPLACE\s+)?(?:UNIQUE\s+)?\Q$kind\E\s+(?:gatekeeper\.)?\Q$name\E\b/i;
	next unless $created_before;
	my ($stmt) = substr($sql, $pos) =~ /^([^;]*)/;
	next if $verb eq 'ALTER' && $kind eq 'TABLE' && $stmt =~ /^\s*ENABLE\s+ALWAYS\s+TRIGGER/i;
	print "$verb $kind $name after the script created it\n"; $bad = 1;
}
printf "%d objects, each defined once\n", scalar(keys %def) unless $bad;
exit($bad ? 1 : 0);
