# Copyright: gatekeeper contributors

# Exim's bounces through a pipe into ingest_report() (issue 49, item 4).
# Debian's Exim 4 (exim4-daemon-light), its binary unpacked from the
# package under GK_EXIM_ROOT (scripts/test.sh does it: `apt-get download`,
# `dpkg -x`; Exim conflicts with the Postfix the other tests use, so it is
# never installed), runs as the postgres user: its compiled-in exim user
# Debian-exim is given to it, for this test only, by nss_wrapper (a passwd
# file naming the running user Debian-exim, LD_PRELOAD'ed), and its
# configuration is a private file (-C) with exim_user the running user,
# its spool, logs and mailboxes under TMPDIR, loopback only.  No root, no
# system user.
#
# Exims: "the relay", the smarthost the background worker relays to (twice:
# one offering no DSN, Exim's default, then one offering DSN, so that the
# worker asks with ENVID and RET=HDRS), and "the MX" of remote.example, to
# which the relay forwards.  The relay accepts every recipient, then
#
#  - nobody@users.example: no such local user (Exim: Unrouteable address);
#  - full@users.example: its appendfile mailbox is over quota (1K);
#  - big@users.example: over the appendfile transport's size limit (2K);
#  - x@nowhere.invalid: a domain that does not exist (dnslookup);
#  - gone@remote.example: the MX refuses the recipient at RCPT (550);
#  - large@remote.example: the MX refuses the size at MAIL (552);
#  - reader@users.example and someone@remote.example are delivered;
#
# and sends each bounce it writes to the mail's VERP address, whose domain
# its `bounces` router gives a pipe transport running psql -f
# scripts/bounce-pipe.sql into gatekeeper.ingest_report(), as a role with
# only the documented grants (a copy of each goes to an mbox the test
# reads, and keeps in its log directory).  Per bounce the test checks the event, its
# status and reason, and the suppression, and prints a summary (share
# recorded, reasons, suppressions) with note().

use strict;
use warnings;

use File::Copy;
use FindBin;
use lib $FindBin::RealBin;
use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use IPC::Run;
use Test::More;

my $root = $ENV{GK_EXIM_ROOT} // '';
my $exim_bin = "$root/usr/sbin/exim4";
my $libdir = "$root/usr/lib/x86_64-linux-gnu";
plan skip_all => 'GK_EXIM_ROOT is not a directory with exim4-daemon-light, libidn12 and libnss-wrapper '
  . 'unpacked (scripts/test.sh unpacks them)'
  unless $root ne '' && -f $exim_bin && -f "$libdir/libnss_wrapper.so";

my $dir = "$PostgreSQL::Test::Utils::tmp_check/exim";
mkdir($dir) or die "mkdir $dir: $!";

# the binary without its set-user-id bit (so that LD_PRELOAD applies)
copy($exim_bin, "$dir/exim4") or die "copy $exim_bin: $!";
chmod(0755, "$dir/exim4") or die "chmod: $!";

# Debian-exim, for Exim's lookup at start, is the running user
my ($user, undef, $uid, $gid, undef, undef, $gecos, $home, $shell) = getpwuid($<);
my $group = getgrgid($gid);
append_to_file("$dir/passwd", "Debian-exim:x:$uid:$gid:$gecos:$home:$shell\n$user:x:$uid:$gid:$gecos:$home:$shell\n");
append_to_file("$dir/group", "Debian-exim:x:$gid:\n$group:x:$gid:\n");
# the wrapper, also Exim's exim_path for its re-executions
append_to_file(
	"$dir/exim.sh", <<"END");
#!/bin/sh
LD_LIBRARY_PATH=$libdir LD_PRELOAD=$libdir/libnss_wrapper.so \\
NSS_WRAPPER_PASSWD=$dir/passwd NSS_WRAPPER_GROUP=$dir/group \\
exec $dir/exim4 "\$@"
END
chmod(0755, "$dir/exim.sh") or die "chmod: $!";

my $relay_port = PostgreSQL::Test::Cluster::get_free_port();
my $mx_port = PostgreSQL::Test::Cluster::get_free_port();
my $node = GatekeeperTest::bounce_pipe_node('exim', $relay_port);
my $pipe_psql = GatekeeperTest::bounce_pipe_psql($node);
my $pipe_sql = GatekeeperTest::bounce_pipe_sql();

# an Exim instance: its directory, configuration and daemon
sub exim_instance
{
	my ($name, $port, $body) = @_;
	my $d = "$dir/$name";
	mkdir($d) or die "mkdir $d: $!";
	mkdir("$d/$_") or die "mkdir $d/$_: $!" for qw(spool log mail);
	append_to_file(
		"$d/exim.conf", <<"END" . $body);
primary_hostname = $name.test.example
exim_path = $dir/exim.sh
exim_user = $user
exim_group = $group
spool_directory = $d/spool
log_file_path = $d/log/%slog
daemon_smtp_ports = $port
pid_file_path = $d/exim.pid
local_interfaces = 127.0.0.1
keep_environment =
tls_advertise_hosts =
host_lookup =
rfc1413_hosts =
dns_retrans = 1s
dns_retry = 1
END
	return { dir => $d, conf => "$d/exim.conf", port => $port };
}

sub exim
{
	my ($inst, @args) = @_;
	my ($stdout, $stderr) = ('', '');
	my $ok = IPC::Run::run([ "$dir/exim.sh", '-C', $inst->{conf}, @args ], '<', \undef, '>', \$stdout, '2>', \$stderr);
	return ($ok, $stdout . $stderr);
}

sub mainlog
{
	my ($inst) = @_;
	return -r "$inst->{dir}/log/mainlog" ? slurp_file("$inst->{dir}/log/mainlog") : '';
}

# the MX of remote.example: one mailbox, a 2K size limit
my $mx = exim_instance(
	'mx', $mx_port, <<"END");
domainlist local_domains = remote.example
message_size_limit = 2K
acl_smtp_rcpt = acl_check_rcpt

begin acl
acl_check_rcpt:
  require domains = +local_domains
  require verify = recipient
  accept

begin routers
mailboxes:
  driver = accept
  domains = +local_domains
  local_parts = someone : large
  transport = mailbox

begin transports
mailbox:
  driver = appendfile
  user = $user
  file = $dir/mx/mail/\$local_part_data

begin retry
END

# A relay: the gkbounce pipe, the MX, DNS, and its own mailboxes; with
# $dsn, it offers DSN (RFC 3461), so the worker asks for reports with RET,
# ENVID, NOTIFY and ORCPT.  A copy of each bounce goes to the mbox
# mail/bounces too (an unseen router), for the test to read.
sub relay_instance
{
	my ($name, $port, $dsn) = @_;
	my $d = "$dir/$name";
	my $offer = $dsn ? 'dsn_advertise_hosts = 127.0.0.1' : '# DSN not offered (the default)';
	return exim_instance(
		$name, $port, <<"END");
$offer
domainlist local_domains = users.example
acl_smtp_rcpt = acl_check_rcpt

begin acl
acl_check_rcpt:
  accept hosts = 127.0.0.1
  deny message = relay not permitted

begin routers
bounce_copy:
  driver = accept
  domains = bounce.shop.example
  transport = bounce_copy
  unseen
bounces:
  driver = accept
  domains = bounce.shop.example
  transport = gkbounce
remote:
  driver = manualroute
  domains = remote.example
  route_list = * 127.0.0.1
  self = send
  transport = to_mx
dnslookup:
  driver = dnslookup
  domains = ! +local_domains
  transport = to_mx
  ignore_target_hosts = 0.0.0.0 : 127.0.0.0/8
  no_more
big:
  driver = accept
  domains = +local_domains
  local_parts = big
  transport = small_mailbox
mailboxes:
  driver = accept
  domains = +local_domains
  local_parts = reader : full
  transport = mailbox

begin transports
to_mx:
  driver = smtp
  port = $mx_port
gkbounce:
  driver = pipe
  user = $user
  # the envelope recipient is tainted (Exim refuses it as an argument);
  # Exim gives it to the command as \$RECIPIENT, which the shell quotes
  command = /bin/sh -c 'exec /usr/bin/env $pipe_psql"\\\$RECIPIENT" -f $pipe_sql'
  return_fail_output
  log_output
  timeout = 60s
bounce_copy:
  driver = appendfile
  user = $user
  file = $d/mail/bounces
mailbox:
  driver = appendfile
  user = $user
  file = $d/mail/\$local_part_data
  quota = \${if eq{\$local_part_data}{full}{1K}{10M}}
small_mailbox:
  driver = appendfile
  user = $user
  file = $d/mail/\$local_part_data
  message_size_limit = 2K

# none: a temporary failure (the full mailbox) is final at once
begin retry
END
}
my $relay = relay_instance('relay', $relay_port, 0);
my $relay_dsn = relay_instance('relay-dsn', PostgreSQL::Test::Cluster::get_free_port(), 1);

# the daemons, at the end or when the test dies
my @started;
sub stop_exims
{
	foreach my $inst (@started)
	{
		my $pidfile = "$inst->{dir}/exim.pid";
		next unless -r $pidfile;
		my $pid = slurp_file($pidfile);
		chomp $pid;
		kill('TERM', $pid) if $pid =~ /^\d+$/;
		unlink($pidfile);
	}
}
END { stop_exims(); }

my ($ok, $out) = exim($relay, '-bV');
ok($ok, 'the unpacked Exim runs as ' . $user . ' with a private configuration (exim -bV)') or BAIL_OUT($out);
note((split /\n/, $out)[0]);
foreach my $inst ($mx, $relay, $relay_dsn)
{
	($ok, $out) = exim($inst, '-bd', '-q1s');
	push @started, $inst;
	ok($ok, "exim -bd -q1s starts ($inst->{dir})") or BAIL_OUT($out);
	ok(GatekeeperTest::wait_for(sub { GatekeeperTest::sink_accepts($inst->{port}) }, 15),
		'and greets on loopback');
}

my $small = 'Hello';
my $large = join('', map { "line $_ of a long letter, long enough to be over the limits\n" } 1 .. 60);
my %got;
my @summary;

# One campaign through one relay: per bounce, the event, its status and
# reason, the suppression.  Each case: recipient, where it fails, what,
# body, the reason expected, the suppression expected.
sub campaign
{
	my ($inst, $phase, @cases) = @_;
	my $name = $inst->{dir} =~ s{.*/}{}r;
	my %id;

	$node->safe_psql('postgres',
		"ALTER SYSTEM SET gatekeeper.smtp_url = 'smtp://127.0.0.1:$inst->{port}'; SELECT pg_reload_conf()");
	sleep(1);
	foreach my $c (@cases)
	{
		$id{ $c->[0] } = $node->safe_psql('postgres',
			"SELECT gatekeeper.enqueue('$c->[0]', 'Weekly picks', "
			  . GatekeeperTest::sql_literal($c->[3])
			  . ", 'news', sender => 'Shop <shop\@shop.example>')");
	}
	my $ids = join(',', values %id);
	ok( GatekeeperTest::poll_until(
			$node, 'postgres',
			"SELECT count(*) FILTER (WHERE state = 'sent') FROM gatekeeper.mail_status WHERE id IN ($ids)",
			scalar(@cases), 60),
		"$phase: Exim took every mail (250)")
	  or diag(mainlog($inst));

	# every bounce Exim wrote went through the pipe
	my $bounces = grep { $_->[2] ne 'delivered' } @cases;
	ok( GatekeeperTest::wait_for(
			sub {
				my $log = mainlog($inst);
				my $piped = () =
				  $log =~ /=> bounces\+\S+ <bounces\+[^>]+\@bounce\.shop\.example> R=bounces T=gkbounce/g;
				return $piped >= $bounces;
			},
			60),
		"$phase: Exim delivered $bounces bounces to the gkbounce pipe")
	  or diag(mainlog($inst));
	unlike(mainlog($inst), qr/T=gkbounce.*(?:defer|failed|frozen)|\*\* bounces\+/, "$phase: no pipe delivery failed");
	foreach my $c (grep { $_->[2] eq 'delivered' } @cases)
	{
		my ($box) = $c->[0] =~ /^([^@]+)/;
		my $file = $c->[1] eq 'local' ? "$inst->{dir}/mail/$box" : "$mx->{dir}/mail/$box";
		ok(GatekeeperTest::wait_for(sub { -s $file }, 30), "$phase: $c->[0] delivered to its mailbox")
		  or diag(mainlog($inst));
	}

	my $copies = -r "$inst->{dir}/mail/bounces" ? slurp_file("$inst->{dir}/mail/bounces") : '';
	foreach my $c (@cases)
	{
		my ($r, $where, $what, undef, $reason, $suppression) = @$c;
		my $row = GatekeeperTest::mail_outcome($node, $id{$r}, $r);
		$got{"$phase $r"} = $row;
		my ($events, $supp) = split(/;/, $row, -1);
		if ($what eq 'delivered')
		{
			is($row, ';', "$phase: $r ($what): no event but sent, no suppression");
			next;
		}
		like($events, qr/^bounced\|[0-9.]*\|\Q$reason\E$/, "$phase: $r ($what): one bounced event, reason $reason")
		  or diag($row);
		is($supp, $suppression,
			"$phase: $r ($what): " . ($suppression eq '' ? 'not suppressed' : "suppressed ($suppression)"));
		if ($inst == $relay_dsn)
		{
			my $token = $node->safe_psql('postgres', "SELECT gatekeeper._verp_token($id{$r})");
			# Exim writes the copy to the mailbox on its own delivery, which
			# may come after the pipe's: wait for it rather than read once
			ok( GatekeeperTest::wait_for(
					sub {
						$copies = slurp_file("$inst->{dir}/mail/bounces") if -r "$inst->{dir}/mail/bounces";
						$copies =~ /^Original-Envelope-Id: \Q$token\E$/mi;
					},
					30),
				"$phase: $r: Exim's DSN gives the ENVID the worker asked with")
			  or diag($copies);
		}
	}

	# the summary, per kind of bounce Exim writes
	foreach my $where ('local', 'remote')
	{
		my @b = grep { $_->[1] eq $where && $_->[2] ne 'delivered' } @cases;
		my @rec = grep { $got{"$phase $_->[0]"} =~ /^bounced/ } @b;
		my @supp = grep { $got{"$phase $_->[0]"} =~ /;.+$/ } @b;
		push @summary,
		  sprintf('Exim 4.96, %s, %s: %d of %d bounces recorded, reasons: %s; suppressed: %d (%s)',
			$phase, $where eq 'local' ? 'the relay\'s own failures' : 'an MX\'s SMTP refusals, relayed',
			scalar(@rec), scalar(@b),
			join(', ', map { my ($e) = split(/;/, $got{"$phase $_->[0]"}); (split(/\|/, $e))[2] // 'none' } @b),
			scalar(@supp), join(', ', map { $_->[0] } @supp));
	}
	push @summary, map { sprintf('  %-24s %-30s %s', $_->[0], $_->[2], $got{"$phase $_->[0]"}) } @cases;

	my $logdir = $PostgreSQL::Test::Utils::log_path;
	append_to_file("$logdir/093_${name}_mainlog", mainlog($inst));
	append_to_file("$logdir/093_${name}_bounces.mbox", $copies);
	return $bounces;
}

#
# 1. Through a relay that offers no DSN (Exim's default)
#
my $recorded = campaign(
	$relay, 'no DSN',
	[ 'nobody@users.example', 'local', 'unknown local user', $small, 'user_unknown', 'hard_bounce' ],
	[ 'full@users.example', 'local', 'mailbox over quota', $large, 'mailbox_full', '' ],
	# Exim tells the sender nothing of why a local transport failed
	[ 'big@users.example', 'local', 'over the transport size limit', $large, 'other', '' ],
	# "Unrouteable address", as for an unknown user: Exim does not say which
	[ 'x@nowhere.invalid', 'local', 'unknown domain', $small, 'user_unknown', 'hard_bounce' ],
	[ 'gone@remote.example', 'remote', 'MX: 550 at RCPT', $small, 'user_unknown', 'hard_bounce' ],
	[ 'large@remote.example', 'remote', 'MX: 552 (size)', $large, 'message_too_large', '' ],
	[ 'reader@users.example', 'local', 'delivered', $small ],
	[ 'someone@remote.example', 'remote', 'delivered', $small ]);
like(mainlog($mx), qr/rejected RCPT <gone\@remote\.example>/, 'the MX refused gone@remote.example at RCPT');
like(mainlog($relay), qr/\*\* large\@remote\.example .*: 552 Message size exceeds maximum permitted/,
	'and the size of large@remote.example (552, the relay logs)');

#
# 2. Through a relay that offers DSN: the worker asks for reports with
#    ENVID and RET=HDRS (new addresses where the first suppressed theirs)
#
$recorded += campaign(
	$relay_dsn, 'DSN',
	[ 'ghost@users.example', 'local', 'unknown local user', $small, 'user_unknown', 'hard_bounce' ],
	[ 'full@users.example', 'local', 'mailbox over quota', $large, 'mailbox_full', '' ],
	[ 'big@users.example', 'local', 'over the transport size limit', $large, 'other', '' ],
	[ 'y@nowhere.invalid', 'local', 'unknown domain', $small, 'user_unknown', 'hard_bounce' ],
	[ 'gone2@remote.example', 'remote', 'MX: 550 at RCPT', $small, 'user_unknown', 'hard_bounce' ],
	[ 'large@remote.example', 'remote', 'MX: 552 (size)', $large, 'message_too_large', '' ],
	[ 'reader@users.example', 'local', 'delivered', $small ]);

is($node->safe_psql('postgres', 'SELECT recorded FROM gatekeeper.report_stats'),
	$recorded, "report_stats: $recorded reports recorded");
note($_) foreach @summary;

my $logdir = $PostgreSQL::Test::Utils::log_path;
append_to_file("$logdir/093_exim_mx_mainlog", mainlog($mx));
append_to_file(
	"$logdir/093_events.txt",
	$node->safe_psql('postgres',
		"SELECT mail_id, recipient, event, source, status, reason, detail FROM gatekeeper.events ORDER BY id"));

stop_exims();
$node->stop;
done_testing();
