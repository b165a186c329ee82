# Copyright: gatekeeper contributors
#
# The alerting rules an operator loads (monitoring/alerts.yaml): Debian's
# promtool finds them valid and runs their unit tests
# (monitoring/alerts.test.yaml), and every gatekeeper series they name is
# one that monitoring/queries.yaml makes, so no rule waits on a metric the
# exporter never serves.  The same of the dashboard (monitoring/dashboard.json),
# which also has a per-server selector, an ETA panel and its axes in the
# units of what they draw.

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

# The dashboard (monitoring/dashboard.json): valid JSON, every gatekeeper
# series it names served by queries.yaml, every series filtered by its
# per-server selector, an ETA panel, and no count drawn on a bytes axis.
# (t/060_exporter.pl asks a real Prometheus for each of its expressions.)
require JSON::PP;
my $dashboard = eval { JSON::PP->new->decode(slurp_file("$dir/dashboard.json")) };
ok($dashboard, 'dashboard.json is valid JSON') or diag($@);
$dashboard //= { panels => [] };
my @targets = map { @{ $_->{targets} // [] } } @{ $dashboard->{panels} };
my %in_dashboard = map { $_ => 1 } map { $_->{expr} =~ /\b(gatekeeper_[a-z_]+)/g } @targets;
ok(scalar(keys %in_dashboard) >= 10, 'dashboard.json names gatekeeper series');
@unknown = grep { !$served{$_} } sort keys %in_dashboard;
is_deeply(\@unknown, [], 'every series dashboard.json names is served by queries.yaml');

my ($server_var) = grep { $_->{name} eq 'server' } @{ $dashboard->{templating}{list} // [] };
ok($server_var && $server_var->{type} eq 'query' && $server_var->{query} =~ /label_values\(gatekeeper_\w+, *server\)/
	  && $server_var->{includeAll} && $server_var->{multi},
	'dashboard.json has a per-server selector (all, one or several servers)');
my @unfiltered = grep { /\bgatekeeper_[a-z_]+(?!\{server=~"\$server"\})(?=[^a-z_{]|$)/ } map { $_->{expr} } @targets;
is_deeply(\@unfiltered, [], 'every series of every panel is filtered by the selected servers');

my @eta = grep {
	my $p = $_;
	grep { $_->{expr} =~ /gatekeeper_queue_eta_seconds/ } @{ $p->{targets} // [] }
} @{ $dashboard->{panels} };
ok(@eta == 1 && $eta[0]{fieldConfig}{defaults}{unit} eq 's', 'dashboard.json has an ETA panel, in seconds');

# a panel in bytes draws its other series (counts, rates) on an axis of their own
my @on_bytes;
foreach my $p (grep { ($_->{fieldConfig}{defaults}{unit} // '') eq 'bytes' } @{ $dashboard->{panels} })
{
	foreach my $t (grep { $_->{expr} !~ /_bytes\b/ } @{ $p->{targets} })
	{
		my ($own) = grep {
			($_->{matcher}{id} // '') eq 'byName' && $_->{matcher}{options} eq ($t->{legendFormat} // '')
		} @{ $p->{fieldConfig}{overrides} // [] };
		my %props = map { $_->{id} => $_->{value} } @{ $own ? $own->{properties} : [] };
		push @on_bytes, "$p->{title}: $t->{expr}"
		  unless $props{unit} && $props{unit} ne 'bytes' && $props{'custom.axisPlacement'};
	}
}
is_deeply(\@on_bytes, [], 'no count or rate is drawn on a bytes axis');

done_testing();
