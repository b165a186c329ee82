# Copyright: gatekeeper contributors

# Courier's bounces through a pipe into ingest_report() (issue 49, item 4),
# as t/095, t/097 and t/098 do for Exim, OpenSMTPD and Sendmail.  Debian's
# Courier 1.0.16 (courier-mta, courier-base, courier-authdaemon,
# courier-authlib-userdb), unpacked under GK_COURIER_ROOT (scripts/test.sh
# does it: `apt-get download`, `dpkg -x`; it conflicts with the Postfix the
# other tests use, so it is never installed), runs as the postgres user.
# Courier's paths are compiled in (/etc/courier, /usr/lib/courier,
# /var/lib/courier, /run/courier), so each instance runs in a user, mount
# and PID namespace of its own (`unshare -Urmpf`: the postgres user is
# root there and nowhere else; the namespace ends with its first process),
# where
#
#  - the unpacked package is laid over /etc and /usr, and a directory of
#    the instance over /var/lib and /run, with overlays; its passwd and
#    group (courier is uid 0 there: the postgres user) are bind-mounted;
#  - the kernel refuses setgroups() in such a namespace, so courierd and
#    its modules run with uid_wrapper preloaded, and so does submit (behind
#    a two-line wrapper), but courieresmtpd does not: with uid_wrapper it
#    hands submit an environment with freed pointers in it, execve() fails
#    with EFAULT, and every MAIL FROM gets "400 Unable to submit message";
#    couriertcpd is started without -user (its initgroups() fails too);
#  - its accounts are a userdb read by authdaemond (authuserdb); authlib
#    refuses accounts with uid 0, so they have uid 1000, which uid_wrapper
#    lets the local delivery become;
#  - Courier 1.0 looks up an MTA-STS policy for every domain it relays to
#    with its own resolver; there is no DNS server here, so the STS cache
#    size is 0 (MTA-STS off) and its routes name addresses (esmtproutes).
#
# No root, no system user, loopback only.  Two Courier instances: "the
# relay", the smarthost the background worker relays to (it offers DSN, so
# the worker asks with RET=HDRS and ENVID), and "the MX" of remote.example
# (SIZELIMIT 2000, two accounts).  The relay accepts every recipient, then
#
#  - gone@remote.example: the MX refuses the recipient (550 User <gone> unknown);
#  - full@users.example: its .courier delivers with Courier's deliverquota
#    into a maildir whose quota is one byte ("Mail quota exceeded", exit 77);
#  - large@remote.example: the MX refuses its size (534 SIZE=Message too big);
#  - reader@users.example and someone@remote.example are delivered;
#
# and sends each bounce it writes to the mail's VERP address (queue news),
# or, for a queue without return_path (plain), to its From address, where
# only the Message-ID of the headers it returns names the mail.  The relay's
# aliases give each of the two domains to an account whose .courier-default
# pipes the bounce into psql -f scripts/bounce-pipe.sql, i.e. into
# gatekeeper.ingest_report(), as a role with only the documented grants (a
# copy of each goes to an mbox the test keeps in its log directory).  Per
# bounce the test checks the event, its status and reason, and the
# suppression, and prints a summary (share recorded, reasons, suppressions)
# with note().
#
# An unknown domain is not among the cases: Courier resolves with its own
# DNS client (not NSS), which needs a DNS server on port 53, and an
# unprivileged test cannot listen there.

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

my $root = $ENV{GK_COURIER_ROOT} // '';
plan skip_all => 'GK_COURIER_ROOT is not a directory with courier-mta, courier-authdaemon, '
  . 'courier-authlib-userdb and libuid-wrapper unpacked (scripts/test.sh unpacks them)'
  unless $root ne ''
  && -f "$root/usr/lib/courier/courier/courierd"
  && -f "$root/usr/lib/courier/courier-authlib/authdaemond"
  && -f "$root/usr/lib/courier-authlib/libauthuserdb.so"
  && -f "$root/usr/lib/x86_64-linux-gnu/libuid_wrapper.so";
my ($unshare_out, $unshare_err) = ('', '');
plan skip_all => "Courier runs in a user, mount and PID namespace, and this machine refuses one: "
  . "`unshare -Urmpf true` said: $unshare_err"
  unless IPC::Run::run([ 'unshare', '-Urmpf', 'true' ], '<', \undef, '>', \$unshare_out, '2>', \$unshare_err);

my $dir = "$PostgreSQL::Test::Utils::tmp_check/courier";
make_path($dir);

# courier.sh INSTANCE PORT: in the namespace, the overlays, the instance's
# configuration (INSTANCE/conf over /etc/courier), its accounts and
# maildirs (INSTANCE/setup.sh), then authdaemond, courierd and couriertcpd;
# the script stays as the namespace's first process
my $wrap = 'LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libuid_wrapper.so UID_WRAPPER=1 UID_WRAPPER_ROOT=1';
append_to_file(
	"$dir/courier.sh", <<"END");
#!/bin/sh
set -e
R=$root
W=$dir/\$1
PORT=\$2
# the overlays' upper and work directories on a tmpfs of the namespace's
# own, gone with it (overlayfs leaves work directories no one may enter)
O=\$W/overlay
mkdir -p \$O
mount -t tmpfs tmpfs \$O
for t in etc usr var run; do mkdir -p \$O/\$t-up \$O/\$t-work; done
mkdir -p \$O/var-up/courier/sts \$O/run-up/courier/authdaemon
cp -a \$R/var/lib/courier/. \$O/var-up/courier/
# MTA-STS off: no DNS here
echo 0 > \$O/var-up/courier/sts/.cache_size
mount -t overlay overlay -o lowerdir=\$R/etc:/etc,upperdir=\$O/etc-up,workdir=\$O/etc-work /etc
mount -t overlay overlay -o lowerdir=\$R/usr:/usr,upperdir=\$O/usr-up,workdir=\$O/usr-work /usr
mount -t overlay overlay -o lowerdir=/var/lib,upperdir=\$O/var-up,workdir=\$O/var-work /var/lib
mount -t overlay overlay -o lowerdir=/run,upperdir=\$O/run-up,workdir=\$O/run-work /run
printf 'root:x:0:0:root:/root:/bin/sh\\ncourier:x:0:0:courier:/var/lib/courier:/bin/sh\\n' > \$W/passwd
printf 'root:x:0:\\ncourier:x:0:\\n' > \$W/group
printf 'nameserver 127.0.0.1\\n' > \$W/resolv.conf
for f in passwd group resolv.conf; do mount --bind \$W/\$f /etc/\$f; done
for b in makedat maildirmake deliverquota; do [ -e /usr/bin/\$b ] || ln -s \$b.courier /usr/bin/\$b; done
L=/usr/lib/courier/courier
mv \$L/submit \$L/submit.real
printf '#!/bin/sh\\n$wrap exec %s/submit.real "\$@"\\n' \$L > \$L/submit
chmod 755 \$L/submit
C=/etc/courier
cp -r \$W/conf/. \$C/
printf '127.0.0.1\\tallow,RELAYCLIENT\\n' > \$C/smtpaccess/default
/usr/sbin/makesmtpaccess
chmod 600 \$C/userdb
/usr/sbin/makeuserdb
[ ! -f \$C/aliases/system ] || /usr/sbin/makealiases
sed -i 's/^authmodulelist=.*/authmodulelist="authuserdb"/' \$C/authdaemonrc
sed -i 's/^ESMTP_USE_STARTTLS=.*/ESMTP_USE_STARTTLS=0/' \$C/courierd
printf '$wrap\\n' | tr ' ' '\\n' >> \$C/courierd
sh \$W/setup.sh
/usr/sbin/authdaemond start
/usr/lib/courier/courierctl.start
cd /usr
env -i /bin/sh -c "set -a; . \$C/esmtpd; BOFHCHECKDNS=0; TARPIT=0; exec /usr/sbin/couriertcpd -noidentlookup -nodnslookup -address=127.0.0.1 -access=\$C/smtpaccess.dat \$PORT /usr/sbin/courieresmtpd"
exec sleep 3600
END
chmod(0755, "$dir/courier.sh") or die "chmod: $!";

my $relay_port = PostgreSQL::Test::Cluster::get_free_port();
my $mx_port = PostgreSQL::Test::Cluster::get_free_port();
my $node = GatekeeperTest::bounce_pipe_node('courier', $relay_port, plain => 1);
my $pipe_psql = GatekeeperTest::bounce_pipe_psql($node);
my $pipe_sql = GatekeeperTest::bounce_pipe_sql();

# A Courier instance: its name (me), local domains, accounts (userdb, each
# with a maildir; uid 1000, see above), and further files of /etc/courier.
sub courier_instance
{
	my ($name, $port, $locals, $users, %files) = @_;
	my $d = "$dir/$name";
	make_path("$d/conf/aliases", "$d/home");
	append_to_file("$d/conf/me", "$name.test.example\n");
	append_to_file("$d/conf/defaultdomain", "$name.test.example\n");
	append_to_file("$d/conf/locals", join('', map { "$_\n" } "$name.test.example", 'localhost', @$locals));
	my ($userdb, $setup) = ('', "set -e\n");
	foreach my $u (@$users)
	{
		make_path("$d/home/$u");
		$userdb .= "$u\tuid=1000|gid=1000|home=$d/home/$u|shell=/bin/sh\n";
		$setup .= "maildirmake $d/home/$u/Maildir\n";
	}
	append_to_file("$d/conf/userdb", $userdb);
	append_to_file("$d/setup.sh", $setup);
	append_to_file("$d/$_", $files{$_}) foreach keys %files;
	return { name => $name, dir => $d, port => $port };
}

# the MX of remote.example: two accounts, a 2000-octet limit
my $mx = courier_instance('mx', $mx_port, ['remote.example'], [qw(someone large)],
	'conf/sizelimit' => "2000\n");

# the relay: remote.example to the MX, its own accounts (users.example),
# full's maildir over quota, and the two bounce domains to the accounts
# whose .courier-default is the pipe (DEFAULT is the local part)
append_to_file(
	"$dir/bounce.sh", <<"END");
#!/bin/sh
# the pipe: \$1 is the bounce's domain, DEFAULT (Courier's) its local part
tee -a $dir/relay/bounces | /usr/bin/env -u LD_PRELOAD $pipe_psql"\$DEFAULT@\$1" -f $pipe_sql
END
chmod(0755, "$dir/bounce.sh") or die "chmod: $!";
my $relay = courier_instance(
	'relay', $relay_port,
	['users.example'],
	[qw(reader full gkverp gkplain)],
	'conf/esmtproutes' => "remote.example: [127.0.0.1],$mx_port\n",
	'conf/aliases/system' =>
	  "\@bounce.shop.example: gkverp\n\@mailer.shop.example: gkplain\npostmaster: reader\n",
	'home/full/.courier' => "| /usr/bin/deliverquota ./Maildir\n",
	'home/gkverp/.courier-default' => "| $dir/bounce.sh bounce.shop.example\n",
	'home/gkplain/.courier-default' => "| $dir/bounce.sh mailer.shop.example\n",
	'setup.sh' => "maildirmake -q 1S $dir/relay/home/full/Maildir\n");

# the daemons, each in its namespace (killing unshare ends it)
my @daemons;
END
{
	# (finish() gives the KILL's status: not the test's)
	local $?;
	foreach my $h (@daemons)
	{
		eval { $h->signal('KILL'); $h->finish; };
	}
}
foreach my $inst ($mx, $relay)
{
	push @daemons,
	  IPC::Run::start([ 'unshare', '-Urmpf', '--kill-child', "$dir/courier.sh", $inst->{name}, $inst->{port} ],
		'<', \undef, '>&', "$inst->{dir}/courier.log");
	ok(GatekeeperTest::wait_for(sub { GatekeeperTest::sink_accepts($inst->{port}) }, 15),
		"Courier ($inst->{name}) greets on loopback, run as the postgres user in its own namespace")
	  or BAIL_OUT(slurp_file("$inst->{dir}/courier.log"));
}

my $small = 'Hello';
my $large = join('', map { "line $_ of a long letter, long enough to be over the limits\n" } 1 .. 60);

# each case: recipient, what, body, the status, reason and suppression
# expected, the queue (news when not given)
my @cases = (
	[ 'gone@remote.example', 'MX: 550 User <gone> unknown', $small, '5.0.0', 'user_unknown', 'hard_bounce' ],
	[ 'full@users.example', 'deliverquota: Mail quota exceeded', $small, '5.0.0', 'mailbox_full', '' ],
	[ 'large@remote.example', 'MX: 534 SIZE=Message too big', $large, '5.0.0', 'message_too_large', '' ],
	[ 'reader@users.example', 'delivered', $small ],
	[ 'someone@remote.example', 'delivered', $small ],
	[ 'gone2@remote.example', 'no VERP; MX: 550', $small, '5.0.0', 'user_unknown', 'hard_bounce', 'plain' ],
	[ 'large2@remote.example', 'no VERP; MX: size', $large, '5.0.0', 'message_too_large', '', 'plain' ]);
my %id = GatekeeperTest::enqueue_cases($node, @cases);
ok(GatekeeperTest::all_sent($node, \%id), 'Courier took every mail (250)');

# every bounce Courier wrote went through the pipe (the pipe's copies)
my @bounced = grep { $_->[1] ne 'delivered' } @cases;
my $copies = '';
ok( GatekeeperTest::wait_for(
		sub {
			$copies = slurp_file("$relay->{dir}/bounces") if -r "$relay->{dir}/bounces";
			my $n = () = $copies =~ /^From: Courier mail server at /mg;
			return $n >= scalar(@bounced);
		},
		30),
	scalar(@bounced) . ' bounces delivered to the pipe')
  or diag($copies);
foreach my $c (grep { $_->[1] eq 'delivered' } @cases)
{
	my ($box, $domain) = split(/@/, $c->[0]);
	my $inst = $domain eq 'users.example' ? $relay : $mx;
	ok( GatekeeperTest::wait_for(
			sub { my @f = glob("$inst->{dir}/home/$box/Maildir/new/*"); return scalar(@f); }, 30),
		"$c->[0] delivered to its maildir");
}
like($copies, qr/^ <<< 550 User <gone> unknown$/m, 'the MX refused gone@remote.example at RCPT');
like($copies, qr/^ <<< 534 SIZE=Message too big\.$/m, 'and the size of large@remote.example at MAIL');
like($copies, qr/^ <<< Mail quota exceeded\.$/m, 'deliverquota refused full@users.example');
like($copies, qr/^Original-Envelope-Id: \S+$/m, 'the relay\'s DSNs give the ENVID the worker asked with');
# the pipe writes its copy before psql is done: wait for the last one
GatekeeperTest::poll_until($node, 'postgres', 'SELECT recorded + ignored FROM gatekeeper.report_stats',
	scalar(@bounced), 30);

# per bounce its event, status, reason and suppression; no event for a
# mail delivered; report_stats; the summary
GatekeeperTest::check_bounce_outcomes($node, 'Courier 1.0.16', \%id, @cases);

my $logdir = $PostgreSQL::Test::Utils::log_path;
append_to_file("$logdir/099_bounces.mbox", $copies);
append_to_file(
	"$logdir/099_events.txt",
	$node->safe_psql('postgres',
		"SELECT mail_id, recipient, event, source, status, reason, detail FROM gatekeeper.events ORDER BY id"));

$node->stop;
done_testing();
