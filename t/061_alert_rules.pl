# Copyright: gatekeeper contributors
#
# The alerting rules an operator loads (monitoring/alerts.yaml): Debian's
# promtool finds them valid and runs their unit tests
# (monitoring/alerts.test.yaml), and every gatekeeper series they name is
# one that monitoring/queries.yaml makes, so no rule waits on a metric the
# exporter never serves.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use PostgreSQL::Test::Utils;
use Test::More;

my $promtool = '/usr/bin/promtool';
plan skip_all => "$promtool is not installed" unless -x $promtool;

my $dir = "$FindBin::RealBin/../monitoring";

my ($out, $err);
my $ok = IPC::Run::run([ $promtool, 'check', 'rules', "$dir/alerts.yaml" ], '>', \$out, '2>', \$err);
ok($ok, 'promtool check rules: alerts.yaml is valid') or diag("$out$err");
like($out, qr/SUCCESS: ([1-9]\d*) rules found/, '... and has rules');

# promtool resolves rule_files against the test file's directory
$ok = IPC::Run::run([ $promtool, 'test', 'rules', "$dir/alerts.test.yaml" ], '>', \$out, '2>', \$err);
ok($ok, 'promtool test rules: alerts.test.yaml passes') or diag("$out$err");
like($out, qr/SUCCESS/, '... SUCCESS') or diag("$out$err");

# The series queries.yaml makes: <prefix>_<column> for each column that is
# not a LABEL, and for a HISTOGRAM column <prefix>_<column>_bucket, _sum
# and _count (the series postgres_exporter makes of it).
my %served;
my ($prefix, $metric);
foreach my $line (split /\n/, slurp_file("$dir/queries.yaml"))
{
	if ($line =~ /^([a-z_]+):\s*$/) { $prefix = $1; next; }
	if ($line =~ /^\s+- ([a-z_]+):\s*$/) { $metric = $1; next; }
	if ($line =~ /^\s+usage:\s*"(\w+)"/ && defined $prefix && defined $metric)
	{
		$served{"${prefix}_$metric"} = 1 unless $1 eq 'LABEL';
		$served{"${prefix}_${metric}_$_"} = 1 foreach ($1 eq 'HISTOGRAM' ? qw(bucket sum count) : ());
		undef $metric;
	}
}
ok(scalar(keys %served) >= 10, 'queries.yaml serves gatekeeper series') or diag(join(' ', sort keys %served));

my %named = map { $_ => 1 } (slurp_file("$dir/alerts.yaml") =~ /\b(gatekeeper_[a-z_]+)/g);
ok(scalar(keys %named) > 0, 'alerts.yaml names gatekeeper series');
my @unknown = grep { !$served{$_} } sort keys %named;
is_deeply(\@unknown, [], 'every series alerts.yaml names is served by queries.yaml');

# every alert in alerts.yaml is exercised by the unit tests, firing at least once
my @alerts = slurp_file("$dir/alerts.yaml") =~ /^\s+- alert: (\w+)/mg;
my $tests = slurp_file("$dir/alerts.test.yaml");
foreach my $alert (@alerts)
{
	like($tests, qr/alertname: $alert\n\s+exp_alerts:\n\s+- exp_labels/,
		"alerts.test.yaml has a case where $alert fires");
}

done_testing();
