# Copyright: gatekeeper contributors

# OpenSMTPD's bounces through a pipe into ingest_report() (issue 49, item
# 4), as t/095 does for Exim.  Debian's OpenSMTPD 6.8 (package opensmtpd),
# unpacked under GK_OPENSMTPD_ROOT (scripts/test.sh does it: `apt-get
# download`, `dpkg -x`; it conflicts with the Postfix the other tests use,
# so it is never installed), runs as the postgres user.  smtpd refuses to
# start unless it is root ("need root privileges"), chroots its processes
# and drops to its users opensmtpd and opensmtpq; so each instance runs in
# a user and mount namespace of its own (`unshare -r -m`: the postgres
# user is root there and nowhere else), where
#
#  - its spool (compiled in: /var/spool/smtpd, /var/lib/opensmtpd/empty,
#    /var/run/smtpd.sock) is a directory under TMPDIR bind-mounted on /var,
#    and /usr/libexec is a copy of the package's helpers;
#  - nss_wrapper gives it its users (opensmtpd, opensmtpq, the mailbox
#    owners), and uid_wrapper its setgroups() and setresuid() to them (the
#    kernel refuses setgroups() in such a namespace);
#  - the helper that runs an mda command, mail.mda, is a two-line shell
#    script doing what it does (/bin/sh -c COMMAND), without its check that
#    it is not run as root (the real uid there is 0).
#
# No root, no system user, loopback only.  Two OpenSMTPD: "the relay", the
# smarthost the background worker relays to, and "the MX" of
# remote.example (a 2K max-message-size, two known recipients).  The relay
# accepts every recipient, then
#
#  - gone@remote.example: the MX refuses the recipient (550 Invalid recipient);
#  - x@nowhere.invalid: a domain that does not exist (its MX lookup);
#  - full@users.example: its mda, as dovecot-lda over quota, prints
#    "Quota exceeded (mailbox for user is full)" and exits EX_CANTCREAT;
#  - tempfull@users.example: the same but EX_TEMPFAIL, until the relay's
#    `queue ttl` (4s) expires it;
#  - large@remote.example: the MX refuses its size (MAIL FROM SIZE=);
#  - reader@users.example and someone@remote.example are delivered;
#
# and sends each bounce it writes to the mail's VERP address (queue news),
# or, for a queue without return_path (plain), to its From address, where
# only the Message-ID of the headers it returns names the mail; its
# `bounces` action gives either to an mda running psql -f scripts/bounce-pipe.sql
# into gatekeeper.ingest_report(), as a role with only the documented
# grants (a copy of each goes to an mbox the test keeps in its log
# directory).  Per bounce the test checks the event, its reason and the
# suppression, and prints a summary (share recorded, reasons,
# suppressions) with note().

use strict;
use warnings;

use File::Copy;
use File::Path qw(make_path);
use FindBin;
use lib $FindBin::RealBin;
use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use IPC::Run;
use Test::More;

my $root = $ENV{GK_OPENSMTPD_ROOT} // '';
my $smtpd = "$root/usr/sbin/smtpd";
my $libdir = "$root/usr/lib/x86_64-linux-gnu";
plan skip_all => 'GK_OPENSMTPD_ROOT is not a directory with opensmtpd, libnss-wrapper and libuid-wrapper '
  . 'unpacked (scripts/test.sh unpacks them)'
  unless $root ne '' && -f $smtpd && -f "$libdir/libnss_wrapper.so" && -f "$libdir/libuid_wrapper.so";
my ($unshare_out, $unshare_err) = ('', '');
plan skip_all => "OpenSMTPD needs a user and mount namespace, and this machine refuses one: "
  . "`unshare -r -m true` said: $unshare_err"
  unless IPC::Run::run([ 'unshare', '-r', '-m', 'true' ], '<', \undef, '>', \$unshare_out, '2>', \$unshare_err);

my $dir = "$PostgreSQL::Test::Utils::tmp_check/opensmtpd";
make_path("$dir/libexec/opensmtpd");

# the package's helpers, mail.mda without its refusal of uid 0
foreach my $f (glob("$root/usr/libexec/opensmtpd/*"))
{
	my $to = "$dir/libexec/opensmtpd/" . ($f =~ s{.*/}{}r);
	copy($f, $to) or die "copy $f: $!";
	chmod(0755, $to) or die "chmod: $!";
}
unlink("$dir/libexec/opensmtpd/mail.mda");
append_to_file("$dir/libexec/opensmtpd/mail.mda",
	"#!/bin/sh\n# OpenSMTPD's mail.mda, without its check that it is not run as root\nexec /bin/sh -c \"\$1\"\n");
chmod(0755, "$dir/libexec/opensmtpd/mail.mda") or die "chmod: $!";

# an instance's namespace: its /var, the helpers, its users
append_to_file(
	"$dir/launch.sh", <<"END");
#!/bin/sh
# launch.sh INSTANCE: smtpd -d in this (new) user and mount namespace
set -e
mount --bind $dir/\$1/var /var
mount --bind $dir/libexec /usr/libexec
export LD_LIBRARY_PATH=$libdir UID_WRAPPER=1 UID_WRAPPER_ROOT=1 LD_PRELOAD=$libdir/libuid_wrapper.so:$libdir/libnss_wrapper.so \\
	NSS_WRAPPER_PASSWD=$dir/\$1/passwd NSS_WRAPPER_GROUP=$dir/\$1/group
exec $smtpd -d -f $dir/\$1/smtpd.conf
END
chmod(0755, "$dir/launch.sh") or die "chmod: $!";

my $relay_port = PostgreSQL::Test::Cluster::get_free_port();
my $mx_port = PostgreSQL::Test::Cluster::get_free_port();
my $node = GatekeeperTest::bounce_pipe_node('opensmtpd', $relay_port, plain => 1);
my $pipe_psql = GatekeeperTest::bounce_pipe_psql($node);
my $pipe_sql = GatekeeperTest::bounce_pipe_sql();

# an OpenSMTPD instance: its /var, users (the mailbox owners: uid 1000,
# which uid_wrapper fakes), configuration
sub smtpd_instance
{
	my ($name, $port, $conf, @users) = @_;
	my $d = "$dir/$name";
	make_path("$d/var/spool", "$d/var/lib/opensmtpd/empty", "$d/var/run", "$d/mail");
	append_to_file("$d/passwd",
		    "root:x:0:0:root:/:/bin/sh\n"
		  . "opensmtpd:x:0:0:smtpd:/var/lib/opensmtpd/empty:/bin/false\n"
		  . "opensmtpq:x:0:0:smtpq:/var/lib/opensmtpd/empty:/bin/false\n"
		  . join('', map { "$_:x:1000:1000:mailbox:$d/mail:/bin/sh\n" } @users));
	append_to_file("$d/group", "root:x:0:\nopensmtpd:x:0:\nopensmtpq:x:0:\nmailbox:x:1000:\n");
	append_to_file("$d/smtpd.conf", "listen on 127.0.0.1 port $port\n" . $conf);
	return { name => $name, dir => $d, port => $port };
}

sub smtpd_log
{
	my ($inst) = @_;
	return -r "$inst->{dir}/smtpd.log" ? slurp_file("$inst->{dir}/smtpd.log") : '';
}

# the MX of remote.example
my $mx = smtpd_instance(
	'mx', $mx_port, <<"END", qw(someone large));
table known { "someone\@remote.example", "large\@remote.example" }
smtp max-message-size 2K
action "mailbox" mda "cat >> $dir/mx/mail/%{rcpt.user}"
match from any for rcpt-to <known> action "mailbox"
END

# the relay: the gkbounce pipe (with a copy to mail/bounces), the MX, DNS,
# its own mailboxes
my $relay = smtpd_instance(
	'relay', $relay_port, <<"END", qw(reader full tempfull bounces));
queue ttl 4s
table bouncebox { "\@" = "bounces" }
action "gkbounce" mda "tee -a $dir/relay/mail/bounces | /usr/bin/env $pipe_psql'%{rcpt}' -f $pipe_sql" virtual <bouncebox>
action "mailbox" mda "cat >> $dir/relay/mail/%{rcpt.user}"
action "full" mda "echo 'Quota exceeded (mailbox for user is full)' >&2; exit 73"
action "tempfull" mda "echo 'Quota exceeded (mailbox for user is full)' >&2; exit 75"
action "mx" relay host smtp://127.0.0.1:$mx_port
action "dns" relay
match from any for domain "bounce.shop.example" action "gkbounce"
match from any for rcpt-to "shop\@mailer.shop.example" action "gkbounce"
match from any for rcpt-to "reader\@users.example" action "mailbox"
match from any for rcpt-to "full\@users.example" action "full"
match from any for rcpt-to "tempfull\@users.example" action "tempfull"
match from any for domain "remote.example" action "mx"
match from any for any action "dns"
END

# the daemons, in the foreground (-d), each in its namespace
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
	  IPC::Run::start([ 'unshare', '-r', '-m', "$dir/launch.sh", $inst->{name} ],
		'<', \undef, '>&', "$inst->{dir}/smtpd.log");
	ok(GatekeeperTest::wait_for(sub { GatekeeperTest::sink_accepts($inst->{port}) }, 15),
		"OpenSMTPD ($inst->{name}) greets on loopback, run as postgres in its own namespace")
	  or BAIL_OUT(smtpd_log($inst));
}
note((grep { /starting/ } split /\n/, smtpd_log($relay))[0] // '');

my $small = 'Hello';
my $large = join('', map { "line $_ of a long letter, long enough to be over the limits\n" } 1 .. 60);

# each case: recipient, what, body, the status, reason and suppression
# expected.  Queue news has a VERP return path; queue plain none, so its
# bounces go to its From address, shop@mailer.shop.example, and name
# their mail only by the Message-ID in the headers OpenSMTPD returns (its
# text/rfc822-headers part, in a multipart/mixed)
my @cases = (
	[ 'gone@remote.example', 'MX: 550 Invalid recipient', $small, '550', 'user_unknown', 'hard_bounce' ],
	[ 'x@nowhere.invalid', 'unknown domain', $small, '5.0.0', 'host_unknown', 'hard_bounce' ],
	[ 'full@users.example', 'mda: over quota, EX_CANTCREAT', $small, '5.3.0', 'mailbox_full', '' ],
	[ 'tempfull@users.example', 'mda: EX_TEMPFAIL until expired', $small, '4.4.7', 'expired', '' ],
	[ 'large@remote.example', 'MX: over its size limit', $large, '5.0.0', 'message_too_large', '' ],
	[ 'reader@users.example', 'delivered', $small ],
	[ 'someone@remote.example', 'delivered', $small ],
	[ 'gone2@remote.example', 'no VERP; MX: 550', $small, '550', 'user_unknown', 'hard_bounce', 'plain' ],
	[ 'y@nowhere.invalid', 'no VERP; unknown domain', $small, '5.0.0', 'host_unknown', 'hard_bounce', 'plain' ],
	[ 'large2@remote.example', 'no VERP; MX: size', $large, '5.0.0', 'message_too_large', '', 'plain' ]);
my %id = GatekeeperTest::enqueue_cases($node, @cases);
ok(GatekeeperTest::all_sent($node, \%id), 'OpenSMTPD took every mail (250)')
  or diag(smtpd_log($relay));

# every bounce OpenSMTPD wrote went through the pipe
my @bounced = grep { $_->[1] ne 'delivered' } @cases;
ok( GatekeeperTest::wait_for(
		sub {
			my $piped = () = smtpd_log($relay) =~
			  /mda delivery .* to=<(?:bounces\+[^>]+\@bounce|shop\@mailer)\.shop\.example> .*result=Ok/g;
			return $piped >= scalar(@bounced);
		},
		30),
	scalar(@bounced) . ' bounces delivered to the gkbounce pipe')
  or diag(smtpd_log($relay));
unlike(smtpd_log($relay), qr/to=<(?:bounces\+[^>]*|shop\@mailer\.shop\.example)> .*result=(?:TempFail|PermFail)/,
	'no pipe delivery failed');
foreach my $c (grep { $_->[1] eq 'delivered' } @cases)
{
	my ($box, $domain) = split(/@/, $c->[0]);
	my $file = $domain eq 'users.example' ? "$relay->{dir}/mail/$box" : "$mx->{dir}/mail/$box";
	ok(GatekeeperTest::wait_for(sub { -s $file }, 30), "$c->[0] delivered to its mailbox");
}
like(smtpd_log($mx), qr/result="550 Invalid recipient: <gone\@remote\.example>"/,
	'the MX refused gone@remote.example at RCPT');
like(smtpd_log($relay), qr/to=<large\@remote\.example> .*result="PermFail" stat="message too large for peer"/,
	'and the size of large@remote.example');
like(smtpd_log($relay), qr/Expire for \S+ from=<[^>]*>, to=<tempfull\@users\.example>/,
	'the relay expired tempfull@users.example');

# per bounce its event, status, reason and suppression; no event for a
# mail delivered; report_stats; the summary
GatekeeperTest::check_bounce_outcomes($node, 'OpenSMTPD 6.8', \%id, @cases);
note('  (a DSN in a multipart/mixed; every Status 5.0.0 but for the mda\'s 5.3.0, and the expiry '
	  . 'written as Action: delayed, Status: 4.4.7)');

my $logdir = $PostgreSQL::Test::Utils::log_path;
foreach my $inst ($relay, $mx)
{
	append_to_file("$logdir/097_opensmtpd_$inst->{name}.log", smtpd_log($inst));
}
append_to_file("$logdir/097_bounces.mbox", slurp_file("$relay->{dir}/mail/bounces"))
  if -r "$relay->{dir}/mail/bounces";
append_to_file(
	"$logdir/097_events.txt",
	$node->safe_psql('postgres',
		"SELECT mail_id, recipient, event, source, status, reason, detail FROM gatekeeper.events ORDER BY id"));

$node->stop;
done_testing();
