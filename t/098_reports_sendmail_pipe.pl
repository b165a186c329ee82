# Copyright: gatekeeper contributors

# Sendmail's bounces through a pipe into ingest_report() (issue 49, item
# 4), as t/095 and t/097 do for Exim and OpenSMTPD.  Debian's Sendmail
# 8.17 (sendmail-bin; sendmail-cf and m4 build its .cf from an .mc),
# unpacked under GK_SENDMAIL_ROOT (scripts/test.sh does it: `apt-get
# download`, `dpkg -x`; it conflicts with the Postfix the other tests use,
# so it is never installed), runs as the postgres user, in a user and mount
# namespace of its own:
#
#  - Sendmail clears its environment as it starts (main.c, "clear
#    sendmail's environment"), so nss_wrapper, which reads its
#    NSS_WRAPPER_* variables at each lookup, is of no use: its users and
#    hosts are files bind-mounted on /etc/passwd, /etc/group, /etc/hosts
#    and /etc/nsswitch.conf (files only: no DNS, nowhere.invalid is a
#    host not found at once) in a namespace where the postgres user is root
#    (`unshare -r -m`);
#  - there it runs, not as root, as the postgres user again (a nested
#    `unshare --map-user`), with RunAsUser, DefaultUser and TrustedUser
#    that user, its queue, .cf, maps and mailboxes under TMPDIR, and
#    loopback ports only.
#
# No root, no system user, no system MTA touched.  Two Sendmails: "the
# relay", the smarthost the background worker relays to (it offers DSN, so
# the worker asks with RET=HDRS and ENVID), and "the MX" of remote.example
# (its mailertable entry), with a MaxMessageSize of 2000 and two local users.
# The relay accepts every recipient, then
#
#  - gone@remote.example: the MX refuses the recipient (550 5.1.1 User unknown);
#  - x@nowhere.invalid: a domain that does not exist (Host unknown);
#  - full@users.example: its local mailer, as dovecot-lda over quota, prints
#    "Quota exceeded (mailbox for user is full)" and exits EX_CANTCREAT;
#  - tempfull@users.example: the same but EX_TEMPFAIL, until the relay's
#    Timeout.queuereturn (4s) returns it;
#  - large@remote.example: the MX refuses its size (552 5.2.3 at MAIL);
#  - reader@users.example and someone@remote.example are delivered;
#
# and sends each bounce it writes to the mail's VERP address (queue news),
# or, for a queue without return_path (plain), to its From address, where
# only the Message-ID of the headers it returns names the mail; its
# mailertable gives both domains to a mailer, gkbounce, running psql -f
# scripts/bounce-pipe.sql into gatekeeper.ingest_report() as a role with
# only the documented grants (a copy of each goes to an mbox the test keeps
# in its log directory).  Per bounce the test checks the event, its status
# and reason, and the suppression, and prints a summary (share recorded,
# reasons, suppressions) with note().

use strict;
use warnings;

use File::Path qw(make_path);
use FindBin;
use lib $FindBin::RealBin;
use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use IPC::Run;
use Test::More;

my $root = $ENV{GK_SENDMAIL_ROOT} // '';
my $sendmail = "$root/usr/libexec/sendmail/sendmail";
my $makemap = "$root/usr/libexec/sendmail/makemap";
my $m4 = "$root/usr/bin/m4";
my $cfdir = "$root/usr/share/sendmail/cf";
my $libdir = "$root/usr/lib/x86_64-linux-gnu";
plan skip_all => 'GK_SENDMAIL_ROOT is not a directory with sendmail-bin, sendmail-cf and m4 '
  . 'unpacked (scripts/test.sh unpacks them)'
  unless $root ne '' && -f $sendmail && -f $m4 && -f "$cfdir/m4/cf.m4";
my ($unshare_out, $unshare_err) = ('', '');
plan skip_all => "Sendmail runs in a user and mount namespace, and this machine refuses one: "
  . "`unshare -r -m true` said: $unshare_err"
  unless IPC::Run::run([ 'unshare', '-r', '-m', 'true' ], '<', \undef, '>', \$unshare_out, '2>', \$unshare_err);

my $dir = "$PostgreSQL::Test::Utils::tmp_check/sendmail";
make_path($dir);
my ($user, undef, $uid, $gid) = getpwuid($<);
my $group = getgrgid($gid);
chomp(my $hostname = `hostname`);

# launch.sh INSTANCE ARG...: the instance's passwd, group and hosts on
# /etc, then Sendmail with its .cf and ARGs as the running user again (the
# daemon: in the foreground, -bD, running its queue every second, logging
# its SMTP traffic, -X).  Outside, Sendmail would wait a minute for a host
# name /etc/hosts may not give ("My unqualified host name unknown")
append_to_file(
	"$dir/nsswitch.conf", "passwd: files\ngroup: files\nhosts: files\n");
append_to_file(
	"$dir/launch.sh", <<"END");
#!/bin/sh
set -e
for f in passwd group hosts; do mount --bind $dir/\$1/\$f /etc/\$f; done
mount --bind $dir/nsswitch.conf /etc/nsswitch.conf
# the libraries the machine lacked, unpacked beside Sendmail
export LD_LIBRARY_PATH=$libdir
i=\$1
shift
exec unshare --map-user=$uid --map-group=$gid $sendmail -C $dir/\$i/sendmail.cf "\$@"
END
chmod(0755, "$dir/launch.sh") or die "chmod: $!";

my $relay_port = PostgreSQL::Test::Cluster::get_free_port();
my $mx_port = PostgreSQL::Test::Cluster::get_free_port();
my $node = GatekeeperTest::bounce_pipe_node('sendmail', $relay_port, plain => 1);
my $pipe_psql = GatekeeperTest::bounce_pipe_psql($node);
my $pipe_sql = GatekeeperTest::bounce_pipe_sql();

# A Sendmail instance: its .mc (built into its .cf with the package's m4
# files), maps, users and local mailer.  The local mailer is a script:
# "full" exits EX_CANTCREAT and "tempfull" EX_TEMPFAIL, each saying why
# as dovecot-lda does; anyone else's mail is appended to a mailbox.
sub sendmail_instance
{
	my ($name, $port, $mc, $mailertable, @users) = @_;
	my $d = "$dir/$name";
	make_path("$d/queue", "$d/mail");
	append_to_file("$d/passwd",
		    "root:x:0:0:root:/root:/bin/sh\n"
		  . "$user:x:$uid:$gid:$user:$d:/bin/sh\n"
		  . join('', map { "$_:x:$uid:$gid:mailbox:$d/mail:/bin/sh\n" } @users));
	append_to_file("$d/group", "root:x:0:\n$group:x:$gid:\n");
	append_to_file("$d/hosts", "127.0.0.1 localhost $name.test.example $hostname\n");
	append_to_file("$d/service.switch", "hosts files\naliases files\n");
	append_to_file("$d/aliases", "postmaster: $user\nMAILER-DAEMON: $user\n");
	append_to_file(
		"$d/local.sh", <<"END");
#!/bin/sh
case "\$1" in
full) echo 'Quota exceeded (mailbox for user is full)'; exit 73 ;;
tempfull) echo 'Quota exceeded (mailbox for user is full)'; exit 75 ;;
esac
exec cat >> $d/mail/\$1
END
	chmod(0755, "$d/local.sh") or die "chmod: $!";
	append_to_file(
		"$d/sendmail.mc", <<"END" . $mc . "MAILER(`local')dnl\nMAILER(`smtp')dnl\n");
divert(-1)
t/098's Sendmail: $name
divert(0)dnl
OSTYPE(`linux')dnl
define(`confDOMAIN_NAME', `$name.test.example')dnl
define(`confRUN_AS_USER', `$user')dnl
define(`confDEF_USER_ID', `$user')dnl
define(`confTRUSTED_USER', `$user')dnl
define(`QUEUE_DIR', `$d/queue')dnl
define(`confPID_FILE', `$d/sendmail.pid')dnl
define(`STATUS_FILE', `$d/statistics')dnl
define(`ALIAS_FILE', `$d/aliases')dnl
define(`confHOST_STATUS_DIRECTORY', `')dnl
define(`confSERVICE_SWITCH_FILE', `$d/service.switch')dnl
define(`confHOSTS_FILE', `$d/hosts')dnl
define(`confBIND_OPTS', `-DNSRCH -DEFNAMES')dnl
define(`confDELIVERY_MODE', `background')dnl
define(`confTO_QUEUERETURN', `4s')dnl
define(`ESMTP_MAILER_ARGS', `TCP \$h $mx_port')dnl
define(`LOCAL_MAILER_PATH', `$d/local.sh')dnl
define(`LOCAL_MAILER_ARGS', `local.sh \$u')dnl
define(`LOCAL_MAILER_FLAGS', `n')dnl
DAEMON_OPTIONS(`Port=$port, Addr=127.0.0.1, Name=MTA')dnl
FEATURE(`no_default_msa')dnl
FEATURE(`nocanonify')dnl
FEATURE(`accept_unresolvable_domains')dnl
END
	my ($ok, $cf, $err) = (0, '', '');
	$ok = IPC::Run::run([ $m4, "-D_CF_DIR_=$cfdir/", "$cfdir/m4/cf.m4", "$d/sendmail.mc" ],
		'<', \undef, '>', "$d/sendmail.cf", '2>', \$err);
	ok($ok && -s "$d/sendmail.cf", "$name: m4 builds sendmail.cf from sendmail.mc") or BAIL_OUT($err);
	if (defined $mailertable)
	{
		append_to_file("$d/mailertable", $mailertable);
		IPC::Run::run([ 'env', "LD_LIBRARY_PATH=$libdir", $makemap, 'hash', "$d/mailertable" ],
			'<', "$d/mailertable", '2>', \$err)
		  or BAIL_OUT("makemap: $err");
	}
	IPC::Run::run([ 'unshare', '-r', '-m', "$dir/launch.sh", $name, '-bi' ], '<', \undef, '>', \$cf, '2>', \$err)
	  or BAIL_OUT("newaliases: $cf$err");
	return { name => $name, dir => $d, port => $port };
}

sub traffic
{
	my ($inst) = @_;
	return -r "$inst->{dir}/traffic.log" ? slurp_file("$inst->{dir}/traffic.log") : '';
}

# the MX of remote.example: two local users, a 2000-octet limit
my $mx = sendmail_instance(
	'mx', $mx_port, <<"END", undef, qw(someone large));
define(`confMAX_MESSAGE_SIZE', `2000')dnl
LOCAL_DOMAIN(`remote.example')dnl
END

# the relay: remote.example to the MX, the gkbounce mailer for the VERP
# domain and the plain queue's From domain, its own users (users.example),
# DNS (here: /etc/hosts) for the rest; it relays for the worker on loopback
append_to_file(
	"$dir/bounce.sh", <<"END");
#!/bin/sh
# gkbounce: Sendmail's mailer for bounces; \$1 is the envelope recipient
tee -a $dir/relay/mail/bounces | /usr/bin/env $pipe_psql"\$1" -f $pipe_sql
END
chmod(0755, "$dir/bounce.sh") or die "chmod: $!";
my $relay = sendmail_instance(
	'relay', $relay_port, <<"END", <<"END", qw(reader full tempfull));
define(`confMAX_MESSAGE_SIZE', `10000000')dnl
FEATURE(`promiscuous_relay')dnl
FEATURE(`mailertable', `hash -o $dir/relay/mailertable')dnl
LOCAL_DOMAIN(`users.example')dnl
MAILER_DEFINITIONS
Mgkbounce,	P=$dir/bounce.sh, F=DFMnqs, S=EnvFromSMTP/HdrFromSMTP, R=EnvToSMTP/HdrToSMTP,
		T=DNS/RFC822/X-Unix, A=bounce.sh \$u
END
remote.example esmtp:[127.0.0.1]
bounce.shop.example gkbounce:pipe
mailer.shop.example gkbounce:pipe
END

# the daemons, in the foreground, each in its namespace
my @daemons;
END
{
	foreach my $h (@daemons)
	{
		eval { $h->signal('TERM'); $h->finish; };
	}
}
foreach my $inst ($mx, $relay)
{
	push @daemons,
	  IPC::Run::start(
		[ 'unshare', '-r', '-m', "$dir/launch.sh", $inst->{name}, '-bD', '-q1s', '-X', "$inst->{dir}/traffic.log" ],
		'<', \undef, '>&', "$inst->{dir}/sendmail.log");
	ok(GatekeeperTest::wait_for(sub { GatekeeperTest::sink_accepts($inst->{port}) }, 15),
		"Sendmail ($inst->{name}) greets on loopback, run as $user in its own namespace")
	  or BAIL_OUT(slurp_file("$inst->{dir}/sendmail.log"));
}

my $small = 'Hello';
my $large = join('', map { "line $_ of a long letter, long enough to be over the limits\n" } 1 .. 60);

# each case: recipient, what, body, the status, reason and suppression
# expected, the queue (news when not given)
my @cases = (
	[ 'gone@remote.example', 'MX: 550 5.1.1 User unknown', $small, '5.1.1', 'user_unknown', 'hard_bounce' ],
	[ 'x@nowhere.invalid', 'unknown domain', $small, '5.1.2', 'host_unknown', 'hard_bounce' ],
	[ 'full@users.example', 'local: over quota, EX_CANTCREAT', $small, '5.3.0', 'mailbox_full', '' ],
	[ 'tempfull@users.example', 'local: EX_TEMPFAIL until returned', $small, '4.4.7', 'expired', '' ],
	[ 'large@remote.example', 'MX: 552 5.2.3 (size)', $large, '5.2.3', 'message_too_large', '' ],
	[ 'reader@users.example', 'delivered', $small ],
	[ 'someone@remote.example', 'delivered', $small ],
	[ 'gone2@remote.example', 'no VERP; MX: 550 5.1.1', $small, '5.1.1', 'user_unknown', 'hard_bounce', 'plain' ],
	[ 'y@nowhere.invalid', 'no VERP; unknown domain', $small, '5.1.2', 'host_unknown', 'hard_bounce', 'plain' ],
	[ 'large2@remote.example', 'no VERP; MX: size', $large, '5.2.3', 'message_too_large', '', 'plain' ]);
my %id = GatekeeperTest::enqueue_cases($node, @cases);
ok(GatekeeperTest::all_sent($node, \%id), 'Sendmail took every mail (250)')
  or diag(traffic($relay));

# every bounce Sendmail wrote went through the pipe (the pipe's copies)
my @bounced = grep { $_->[1] ne 'delivered' } @cases;
my $copies = '';
ok( GatekeeperTest::wait_for(
		sub {
			$copies = slurp_file("$relay->{dir}/mail/bounces") if -r "$relay->{dir}/mail/bounces";
			my $n = () = $copies =~ /^From: Mail Delivery Subsystem <MAILER-DAEMON(?:\@[^>]*)?>/mg;
			return $n >= scalar(@bounced);
		},
		30),
	scalar(@bounced) . ' bounces delivered to the gkbounce mailer')
  or diag($copies);
foreach my $c (grep { $_->[1] eq 'delivered' } @cases)
{
	my ($box, $domain) = split(/@/, $c->[0]);
	my $file = $domain eq 'users.example' ? "$relay->{dir}/mail/$box" : "$mx->{dir}/mail/$box";
	ok(GatekeeperTest::wait_for(sub { -s $file }, 30), "$c->[0] delivered to its mailbox");
}
like(traffic($mx), qr/>>> 550 5\.1\.1 <gone\@remote\.example>\.\.\. User unknown/,
	'the MX refused gone@remote.example at RCPT');
like(traffic($mx), qr/>>> 552 5\.2\.3 Message size exceeds fixed maximum message size \(2000\)/,
	'and the size of large@remote.example at MAIL');
like($copies, qr/^Original-Envelope-Id: \S+$/m, 'the relay\'s DSNs give the ENVID the worker asked with');
# the pipe writes its copy before psql is done: wait for the last one
GatekeeperTest::poll_until($node, 'postgres', 'SELECT recorded + ignored FROM gatekeeper.report_stats',
	scalar(@bounced), 30);

# per bounce its event, status, reason and suppression; no event for a
# mail delivered; report_stats; the summary
GatekeeperTest::check_bounce_outcomes($node, 'Sendmail 8.17', \%id, @cases);

my $logdir = $PostgreSQL::Test::Utils::log_path;
foreach my $inst ($relay, $mx)
{
	append_to_file("$logdir/098_sendmail_$inst->{name}_traffic.log", traffic($inst));
}
append_to_file("$logdir/098_bounces.mbox", $copies);
append_to_file(
	"$logdir/098_events.txt",
	$node->safe_psql('postgres',
		"SELECT mail_id, recipient, event, source, status, reason, detail FROM gatekeeper.events ORDER BY id"));

$node->stop;
done_testing();
