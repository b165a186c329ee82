# Copyright: gatekeeper contributors
# gatekeeper-test: as root

# The bounce round trip with a whole Postfix (issue 27): master(8), its
# queue manager, bounce daemon and pipe(8) transport, a private instance
# (t/PrivatePostfix.pm: its own config, queue and data directories under
# TMPDIR, loopback only, mail_owner 'postfix', pipe user 'postgres')
# as the smarthost the background worker relays to.  Postfix accepts
# every recipient, then
#
#  - fails gone@dead.example at once with 5.1.1 (transport_maps to
#    error:5.1.1), and
#  - defers busy@full.example with 4.2.2 (retry:4.2.2, with a delay
#    warning), then, once its transport says error:5.2.2, bounces it;
#
# and sends each DSN to the mail's VERP address, whose domain its
# transport_maps hand to the `gkbounce` pipe(8) service written exactly
# as docs/reference.md tells an operator (psql -f scripts/bounce-pipe.sql
# into gatekeeper.ingest_report(), as a role with only the documented
# grants).  The test then finds the suppressions (hard_bounce for the
# dead address, soft_bounce for the full one, soft_bounce_limit being 1),
# the events and the mails' history, and that the next campaign never
# hands those addresses to Postfix while the third reader's mail goes.
#
# A copy of each DSN (by virtual_alias_maps: an address that expands to
# itself and one more) and of each mail to the failing domains (by
# recipient_bcc_maps) goes to an smtp-sink, so the test reads Postfix's
# DSN as the pipe received it.  Needs root: run as any other
# user it skips (scripts/test.sh runs it as root after the TAP suite).

use strict;
use warnings;

BEGIN
{
	require FindBin;
	unshift @INC, $FindBin::RealBin;
	require PrivatePostfix;
	PrivatePostfix::split_root('postgres')
	  or PrivatePostfix::skip_all_unless_root();
}

use Config;
use File::Spec;
use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $started = time;
my $dead = 'gone@dead.example';
my $full = 'busy@full.example';
my $alive = 'reader@live.example';

# where Postfix delivers live.example and the copies
my $sink = GatekeeperTest::start_sink(name => 'pipe_sink');

my $node = GatekeeperTest::new_node(
	'pipe',
	conf => "gatekeeper.helo_name = 'mta.shop.example'\n"
	  . "gatekeeper.soft_bounce_limit = 1\n");
my $pf_port = PostgreSQL::Test::Cluster::get_free_port();
$node->append_conf('postgresql.conf', "gatekeeper.smtp_url = 'smtp://127.0.0.1:$pf_port'\n");
$node->start;
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION gatekeeper;
SELECT gatekeeper.create_queue('news', gates => '{smart_sending}',
							   return_path => 'bounces+{token}@bounce.shop.example');
-- the bounce pipe's role, as docs/reference.md creates it
CREATE ROLE gkbounce LOGIN;
GRANT USAGE ON SCHEMA gatekeeper TO gkbounce;
GRANT EXECUTE ON FUNCTION gatekeeper.ingest_report(text, text),
						  gatekeeper.record_event(text, text, text, text, text) TO gkbounce;
});

#
# The private Postfix
#
my $dir = PrivatePostfix::instance_dir();
my $psql = (grep { -x $_ } map { File::Spec->catfile($_, 'psql') } split(/:/, $ENV{PATH}))[0];
my $pipe_sql = File::Spec->rel2abs("$FindBin::RealBin/../scripts/bounce-pipe.sql");
my $host = $node->host;
my $port = $node->port;

sub write_conf
{
	my ($name, $text) = @_;
	open(my $fh, '>', "$dir/conf/$name") or die "$dir/conf/$name: $!";
	print $fh $text;
	close($fh);
}

sub write_transport
{
	my ($full_transport) = @_;
	write_conf('transport', <<"END");
dead.example		error:5.1.1 User unknown
full.example		$full_transport
live.example		smtp:[127.0.0.1]:$sink->{port}
capture.example		smtp:[127.0.0.1]:$sink->{port}
bounce.shop.example	gkbounce:
END
}

write_conf('main.cf', <<"END");
compatibility_level = 3.6
config_directory = $dir/conf
queue_directory = $dir/queue
data_directory = $dir/data
mail_owner = postfix
setgid_group = postdrop
myhostname = relay.test.example
mydomain = test.example
inet_interfaces = 127.0.0.1
inet_protocols = ipv4
mynetworks = 127.0.0.0/8
mydestination =
relay_domains =
local_recipient_maps =
smtpd_reject_unlisted_recipient = no
smtpd_relay_restrictions = permit_mynetworks, reject
smtpd_peername_lookup = no
smtp_dns_support_level = disabled
transport_maps = texthash:$dir/conf/transport
recipient_bcc_maps = regexp:$dir/conf/copies
# a copy of each DSN (bcc maps skip the mail Postfix makes itself)
virtual_alias_maps = regexp:$dir/conf/dsn_copies
recipient_delimiter = +
# retries and delay warnings in seconds, not minutes
queue_run_delay = 1s
minimal_backoff_time = 1s
maximal_backoff_time = 2s
delay_warning_time = 1s
maillog_file = $dir/maillog
maillog_file_prefixes = $dir
END
write_conf('copies', <<'END');
/@(dead|full)\.example$/	sent-copy@capture.example
END
write_conf('dsn_copies', <<'END');
/^(bounces\+.*@bounce\.shop\.example)$/	${1}, dsn-copy@capture.example
END
write_transport('retry:4.2.2 Mailbox full');
# the services the path needs; gkbounce as docs/reference.md writes it,
# with the test's server, database and psql
write_conf('master.cf', <<"END");
127.0.0.1:$pf_port inet n - n - - smtpd
pickup    unix  n       -       n       60      1       pickup
cleanup   unix  n       -       n       -       0       cleanup
qmgr      unix  n       -       n       300     1       qmgr
rewrite   unix  -       -       n       -       -       trivial-rewrite
bounce    unix  -       -       n       -       0       bounce
defer     unix  -       -       n       -       0       bounce
trace     unix  -       -       n       -       0       bounce
flush     unix  n       -       n       1000?   0       flush
proxymap  unix  -       -       n       -       -       proxymap
smtp      unix  -       -       n       -       -       smtp
showq     unix  n       -       n       -       -       showq
error     unix  -       -       n       -       -       error
retry     unix  -       -       n       -       -       error
anvil     unix  -       -       n       -       1       anvil
postlog   unix-dgram n  -       n       -       1       postlogd
gkbounce  unix  -       n       n       -       4       pipe
  flags=q user=postgres argv=/usr/bin/env PGCLIENTENCODING=LATIN1 PGDATABASE=postgres
    PGHOST=$host PGPORT=$port PGUSER=gkbounce
    $psql -X -q -v ON_ERROR_STOP=1 -v recipient=\${recipient}
    -f $pipe_sql
END
my ($ok, $why) = PrivatePostfix::control('start');
ok($ok, 'a private Postfix master starts (postfix -c <dir> start)') or BAIL_OUT("postfix start: $why");
ok(GatekeeperTest::wait_for(sub { GatekeeperTest::sink_accepts($pf_port) }, 15),
	'its smtpd greets on loopback');

# Postfix's log, as far as written
sub maillog
{
	return -r "$dir/maillog" ? slurp_file("$dir/maillog") : '';
}

# the Postfix queue ids that had a delivery attempt to an address
sub queue_ids_for
{
	my ($rcpt) = @_;
	my $log = maillog();
	my %ids;
	$ids{$1} = 1 while $log =~ /: ([0-9A-F]+): to=<\Q$rcpt\E>,/g;
	return scalar keys %ids;
}

# the copies and live mail the sink received for one recipient
sub sunk_for
{
	my ($rcpt) = @_;
	return GatekeeperTest::sink_messages_to($sink, $rcpt);
}

#
# 1. The campaign
#
my %id;
foreach my $r ($dead, $full, $alive)
{
	$id{$r} = $node->safe_psql('postgres',
		"SELECT gatekeeper.enqueue('$r', 'Weekly picks', 'Hello', 'news', sender => 'Shop <shop\@shop.example>')");
}
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT string_agg(state::text, ',') FROM gatekeeper.mail_status", 'sent,sent,sent', 30),
	'the three mails are sent to Postfix');
ok(GatekeeperTest::wait_for(sub { sunk_for($alive) == 1 }, 20), 'Postfix delivered the live reader\'s mail');

#
# 2. Postfix's DSNs, through pipe(8) into ingest_report()
#
sub events_of
{
	my ($r) = @_;
	return GatekeeperTest::mail_events_sql($id{$r});
}
ok( GatekeeperTest::poll_until($node, 'postgres', events_of($dead), 'sent:relay:,bounced:dsn:5.1.1', 30),
	'the dead address: Postfix\'s 5.1.1 DSN came through the pipe as a bounced event')
  or diag(maillog());
ok( GatekeeperTest::poll_until($node, 'postgres', events_of($full), 'sent:relay:,deferred:dsn:4.2.2', 30),
	'the full mailbox: Postfix\'s delay warning (4.2.2) came through the pipe as a deferred event')
  or diag(maillog());
like(maillog(), qr/to=<\Q$full\E>, relay=none, .*dsn=4\.2\.2, status=deferred/,
	'Postfix deferred the full mailbox');

# now the mailbox stays full: Postfix gives up with 5.2.2
write_transport('error:5.2.2 Mailbox full');
($ok, $why) = PrivatePostfix::control('reload');
ok($ok, 'postfix reload') or diag($why);
ok( GatekeeperTest::poll_until(
		$node, 'postgres', events_of($full), 'sent:relay:,deferred:dsn:4.2.2,bounced:dsn:5.2.2', 30),
	'then its 5.2.2 DSN came through the pipe as a bounced event')
  or diag(maillog());
is($node->safe_psql('postgres', events_of($alive)), 'sent:relay:',
	'the live reader\'s mail has only its sent event');

# what the pipe received, as the copies show it
my $token = $node->safe_psql('postgres', "SELECT gatekeeper._verp_token($id{$dead})");
my @dsn = grep { $_->{raw} =~ /^Final-Recipient: rfc822; ?\Q$dead\E$/mi } sunk_for('dsn-copy@capture.example');
is(scalar(@dsn), 1, 'Postfix sent one DSN for the dead address');
my $dsn = $dsn[0]{raw} // '';
like($dsn, qr/^To: <?bounces\+\Q$token\E\@bounce\.shop\.example>?$/mi, 'to the mail\'s VERP address');
like($dsn, qr/^Original-Envelope-Id: \Q$token\E$/mi, 'with the ENVID gatekeeper gave');
like($dsn, qr/^Action: failed$/mi, 'Action: failed');
like($dsn, qr/^Status: 5\.1\.1$/mi, 'Status: 5.1.1');
like($dsn, qr/^Message-ID: <\Q$id{$dead}\E\./mi, 'returning the mail\'s headers (RET=HDRS)');
like(maillog(), qr/to=<bounces\+\Q$token\E\@bounce\.shop\.example>, relay=gkbounce, .*status=sent \(delivered via gkbounce service/,
	'pipe(8) delivered it to the gkbounce service');
my @sent = sunk_for('sent-copy@capture.example');
my ($sent_dead) = grep { $_->{raw} =~ /^To: \Q$dead\E$/mi } @sent;
ok($sent_dead, 'the mail Postfix accepted for the dead address (its copy)');

#
# 3. The suppressions, the history
#
is( $node->safe_psql(
		'postgres',
		"SELECT string_agg(address || '|' || coalesce(queue, 'every queue') || '|' || reason || '|' "
		  . "|| (mail_id = CASE address WHEN '$dead' THEN $id{$dead} ELSE $id{$full} END), ',' ORDER BY address) "
		  . "FROM gatekeeper.suppression"),
	"$full|every queue|soft_bounce|true,$dead|every queue|hard_bounce|true",
	'the dead address is suppressed as a hard bounce, the full one as a soft bounce (limit 1), by their mails');
is( $node->safe_psql(
		'postgres',
		"SELECT string_agg(h.id || '|' || h.state, ',') FROM unnest(ARRAY['$dead', '$full']) r, "
		  . "gatekeeper.history(r) h"),
	"$id{$dead}|sent,$id{$full}|sent",
	'history() shows both mails as the relay took them');
is( $node->safe_psql(
		'postgres', "SELECT sent || '|' || deferred || '|' || bounced FROM gatekeeper.queue_stats WHERE queue = 'news'"),
	'3|1|2', 'queue_stats counts the deferral and the two bounces');
is( $node->safe_psql('postgres', "SELECT recorded FROM gatekeeper.report_stats"),
	'3', 'report_stats: three reports recorded');

#
# 4. The next campaign never hands those addresses to Postfix
#
ok( GatekeeperTest::next_campaign(
		$node, "$full:suppressed,$dead:suppressed,$alive:sent", $dead, $full, $alive),
	'the next mails to the bounced addresses are suppressed, the other is sent');
ok(GatekeeperTest::wait_for(sub { sunk_for($alive) == 2 }, 20), 'Postfix delivered the other');
is(queue_ids_for($dead), 1, 'Postfix never had the dead address again (one queue file in its log)');
is(queue_ids_for($full), 1, 'nor the full mailbox');
is(queue_ids_for($alive), 2, 'the live reader twice');
is(scalar(@sent), 2, 'two copies of mail to the failing domains: the first campaign\'s');
is(scalar(sunk_for('sent-copy@capture.example')), 2, 'and still two');

# what the closing note shows
my $logdir = $PostgreSQL::Test::Utils::log_path;
append_to_file("$logdir/059_sent_to_dead.eml", $sent_dead ? $sent_dead->{raw} : '');
append_to_file("$logdir/059_postfix_dsn.eml", $dsn);
append_to_file(
	"$logdir/059_suppression.txt",
	$node->safe_psql('postgres',
		"SELECT address, queue, reason, detail, mail_id FROM gatekeeper.suppression ORDER BY address")
	  . "\n\n"
	  . $node->safe_psql('postgres',
		"SELECT mail_id, recipient, event, source, status, detail FROM gatekeeper.events ORDER BY id"));
note(sprintf('round trip took %.1f s', time - $started));

($ok, $why) = PrivatePostfix::control('stop');
ok($ok, 'postfix -c <dir> stop') or diag($why);
$node->stop;
done_testing();
