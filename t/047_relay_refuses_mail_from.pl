# Copyright: gatekeeper contributors

# A relay that refuses the client (550 5.7.1 Client host rejected to every
# MAIL FROM, as a misconfigured relay or one that does not know the
# client's address does) must not destroy a campaign: the same 5xx to
# MAIL FROM for several transactions in a row is the relay's fault, not
# the mails'.  Of 40 mails, at most a handful (5) end `failed`; the rest
# stay scheduled with no attempt charged (attempt = uncharged), and the
# worker says what the relay answered in its log.  Once the relay
# accepts, every mail that did not fail is sent, exactly once.
#
# The refusing phase is observed for a few seconds after the relay has
# refused three MAIL FROMs: that nothing more fails can only be seen by
# watching for a while.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $n = 40;
my $port = PostgreSQL::Test::Cluster::get_free_port();
my $relay = GatekeeperTest::start_relay(name => 'refusing', port => $port, mode => 'reject-mail');
my $node = GatekeeperTest::new_node(
	'refuse_mail',
	smtp_url => $relay->{url},
	conf => "gatekeeper.helo_name = 'mta.example.com'\n"
	  . "gatekeeper.retry_delay = '2s'\n"
	  . "gatekeeper.smtp_connections = 4\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gatekeeper');
my $log_offset = -s $node->logfile;

$node->safe_psql('postgres',
	"SELECT gatekeeper.enqueue('campaign' || i || '\@customer.example', 'Campaign', 'Body ' || i) FROM generate_series(1, $n) AS i"
);

ok( GatekeeperTest::wait_for(
		sub { (grep { $_->{event} eq 'mail' } GatekeeperTest::relay_events($relay)) >= 3 },
		30, 'three refused MAIL FROMs'),
	'the relay refused MAIL FROM three times');

# watch for 4 s: the number of failed mails must stay small all along
my $max_failed = 0;
my $until = time + 4;
while (time < $until)
{
	my $f = $node->safe_psql('postgres', "SELECT count(*) FROM gatekeeper.mail_status WHERE state = 'failed'");
	$max_failed = $f if $f > $max_failed;
	usleep(200_000);
}
cmp_ok($max_failed, '<=', 5, "at most a handful of mails failed ($max_failed of $n)");
is( $node->safe_psql('postgres',
		"SELECT count(*) FROM gatekeeper.mail_status WHERE state NOT IN ('failed', 'scheduled', 'claimed')"),
	'0', 'nothing was sent or otherwise finished');
is( $node->safe_psql('postgres',
		"SELECT count(*) FROM gatekeeper.mail_status WHERE state <> 'failed' AND attempt <> uncharged"),
	'0', 'the mails that did not fail have no attempt charged');
my $failed_errors = $node->safe_psql('postgres',
	"SELECT coalesce(string_agg(DISTINCT last_error, ' / '), '') FROM gatekeeper.mail_status WHERE state = 'failed'");
like($failed_errors, qr/^(|.*5\.7\.1.*)$/, "a mail that failed says 5.7.1 ($failed_errors)");
my $log = slurp_file($node->logfile, $log_offset);
like($log, qr/Client host rejected/, "the worker logs what the relay said");
my $said = () = $log =~ /Client host rejected/g;
cmp_ok($said, '<=', 3, "and does not repeat it for every mail ($said times)");
unlike($log, qr/\b(PANIC|FATAL):/, 'no crash');
my @mails = grep { $_->{event} eq 'mail' } GatekeeperTest::relay_events($relay);
cmp_ok(scalar(@mails), '<', $n,
	'the worker stopped offering the relay every mail (' . scalar(@mails) . " MAIL FROMs for $n mails)");

# the relay is fixed
GatekeeperTest::stop_relay($relay);
my $fixed = GatekeeperTest::start_relay(name => 'fixed', port => $port);
my $failed = $node->safe_psql('postgres', "SELECT count(*) FROM gatekeeper.mail_status WHERE state = 'failed'");
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT count(*) FROM gatekeeper.mail_status WHERE state = 'sent'",
		$n - $failed, 60),
	'once the relay accepts, every mail that did not fail is sent')
  or diag(GatekeeperTest::mail_states($node, 'true'));
my %seen;
$seen{ $_->{message_id} }++ foreach GatekeeperTest::relay_messages($fixed);
is(scalar(keys %seen), $n - $failed, 'the relay has each of them');
is(scalar(grep { $_ > 1 } values %seen), 0, 'once');
is( $node->safe_psql('postgres',
		"SELECT max(attempt - uncharged) FROM gatekeeper.mail_status WHERE state = 'sent'"),
	'1', 'each on one charged attempt');

$node->stop;
GatekeeperTest::stop_relay($fixed);

done_testing();
