# Copyright: gatekeeper contributors

=pod

=head1 NAME

PrivatePostfix - a whole private Postfix instance (master(8), its queue
manager, bounce daemon and pipe(8) transport) for a TAP test that
otherwise runs as the PostgreSQL server's OS user.

=head1 SYNOPSIS

  my $helper;
  BEGIN
  {
	  use FindBin;
	  use lib $FindBin::RealBin;
	  use PrivatePostfix;
	  $helper = PrivatePostfix::split_root('postgres')
		or PrivatePostfix::skip_all_unless_root();
  }
  use PostgreSQL::Test::Cluster;      # from here on, the postgres user
  ...
  my $dir = PrivatePostfix::instance_dir();   # write $dir/conf/main.cf, ...
  PrivatePostfix::control('start');            # postfix -c $dir/conf start
  PrivatePostfix::control('reload');
  PrivatePostfix::control('stop');

=head1 DESCRIPTION

Postfix's master(8) and the postfix(1) command are reserved for root, and
pipe(8) must start as root to switch to its user=; initdb and the server
refuse root.  So a test that needs both starts as root and splits in two
before PostgreSQL::Test::Utils is loaded: the child becomes the given
user and runs the whole test; the parent stays root and does only this,
on one instance directory it made itself (mode 0755, under TMPDIR, with
conf/ owned by the child's user so that the test writes the
configuration):

  start    postfix -c DIR/conf start (after making DIR/queue and DIR/data,
           the latter owned by mail_owner, which must be 'postfix')
  reload   postfix -c DIR/conf reload
  stop     postfix -c DIR/conf stop

Each answer is "ok" or "failed <exit status>: <output>".  When the child
ends, however it ends, the parent stops the instance (`postfix stop`,
then `postfix abort` if master is still there), copies DIR/maillog into
the test's log directory, removes DIR, and exits with the child's exit
status.  It never touches the system's Postfix (config_directory is
always DIR/conf, which it checks main.cf names), and it refuses any other
command.

=cut

package PrivatePostfix;

use strict;
use warnings;

use File::Basename ();
use File::Copy ();
use File::Path ();
use File::Temp ();
use IO::Handle;
use POSIX ();
use Socket;

our $POSTFIX = $ENV{GK_POSTFIX} || '/usr/sbin/postfix';

my $channel;		# the child's end: a line-oriented socket
my $dir;			# the instance directory

=pod

=head2 split_root($user)

As root: fork; the child becomes $user (uid, gid, supplementary groups,
HOME, USER) and returns true; the parent serves the child and never
returns.  Not root: returns false and does nothing.

=cut

sub split_root
{
	my ($user) = @_;
	return 0 if $> != 0;
	my ($name, undef, $uid, $gid, undef, undef, undef, $home) = getpwnam($user)
	  or die "no such user: $user\n";
	$dir = File::Temp::tempdir('gk_postfix_XXXXXX', TMPDIR => 1, CLEANUP => 0);
	chmod(0755, $dir) or die "chmod $dir: $!\n";
	mkdir("$dir/conf", 0755) or die "mkdir $dir/conf: $!\n";
	chown($uid, $gid, "$dir/conf") or die "chown $dir/conf: $!\n";

	socketpair(my $child_end, my $parent_end, AF_UNIX, SOCK_STREAM, PF_UNSPEC)
	  or die "socketpair: $!\n";
	STDOUT->flush;
	STDERR->flush;
	my $pid = fork();
	die "fork: $!\n" unless defined $pid;
	if ($pid != 0)
	{
		close($child_end);
		serve($parent_end, $pid);    # exits
	}
	close($parent_end);
	$child_end->autoflush(1);
	$channel = $child_end;

	POSIX::setgid($gid) or die "setgid: $!\n";
	$) = "$gid $gid";
	POSIX::setuid($uid) or die "setuid: $!\n";
	die "still root\n" if $> == 0 || $< == 0;
	$ENV{HOME} = $home;
	$ENV{USER} = $ENV{LOGNAME} = $name;
	return 1;
}

=pod

=head2 skip_all_unless_root()

Prints the TAP plan that skips the whole file, saying why, and exits.

=cut

sub skip_all_unless_root
{
	print "1..0 # SKIP needs root: Postfix's master(8) and pipe(8) start only as root "
	  . "(scripts/test.sh runs this file as root after the TAP suite)\n";
	exit 0;
}

=pod

=head2 instance_dir()

The instance directory (the child writes DIR/conf/main.cf, master.cf and
its maps there).

=cut

sub instance_dir
{
	return $dir;
}

=pod

=head2 control($command)

Ask the root parent to 'start', 'reload' or 'stop' the instance.  Returns
(1, '') on success, (0, why) on failure.

=cut

sub control
{
	my ($command) = @_;
	print $channel "$command\n";
	my $answer = <$channel>;
	return (0, 'the root helper is gone') unless defined $answer;
	chomp $answer;
	$answer =~ s/\\n/\n/g;
	return (1, '') if $answer eq 'ok';
	return (0, $answer);
}

# The parent: run the child's commands until it closes its end or exits,
# then stop and remove the instance and exit as the child did.
sub serve
{
	my ($sock, $child) = @_;
	my $started = 0;
	my $stopping = 0;
	local $SIG{TERM} = local $SIG{INT} = sub { kill('TERM', $child); };
	$sock->autoflush(1);
	while (defined(my $line = <$sock>))
	{
		chomp $line;
		my $answer;
		if ($line eq 'start' || $line eq 'reload' || $line eq 'stop')
		{
			$answer = postfix($line);
			$started = 1 if $line eq 'start';
			$started = 0 if $line eq 'stop' && $answer eq 'ok';
		}
		else
		{
			$answer = "failed: unknown command";
		}
		$answer =~ s/\n/\\n/g;
		print $sock "$answer\n";
	}
	close($sock);
	waitpid($child, 0);
	my $status = $?;
	postfix('stop') if $started;
	# master gone, whatever stop said
	if (-f "$dir/queue/pid/master.pid")
	{
		postfix('abort');
	}
	my $logdir = ($ENV{TESTDIR} ? "$ENV{TESTDIR}/tmp_check" : 'tmp_check') . '/log';
	my $base = File::Basename::basename($0, '.pl');
	if (-d $logdir && -f "$dir/maillog")
	{
		my $copy = "$logdir/${base}_postfix.log";
		File::Copy::copy("$dir/maillog", $copy);
		my (undef, undef, $uid, $gid) = stat($logdir);
		chown($uid, $gid, $copy);
	}
	File::Path::rmtree($dir);
	POSIX::_exit($status & 127 ? 1 : $status >> 8);
}

# postfix -c DIR/conf COMMAND, as root; "ok" or "failed ..."
sub postfix
{
	my ($command) = @_;
	my $conf = "$dir/conf";
	my $main = "$conf/main.cf";
	return "failed: no $main" unless -f $main;
	open(my $fh, '<', $main) or return "failed: $main: $!";
	my $text = do { local $/; <$fh> };
	close($fh);
	return "failed: $main must set config_directory = $conf"
	  unless $text =~ /^config_directory\s*=\s*\Q$conf\E\s*$/m;
	return "failed: $main must set queue_directory = $dir/queue"
	  unless $text =~ /^queue_directory\s*=\s*\Q$dir\E\/queue\s*$/m;
	if ($command eq 'start')
	{
		my (undef, undef, $uid, $gid) = getpwnam('postfix')
		  or return 'failed: no user postfix (mail_owner)';
		foreach my $d ("$dir/queue", "$dir/data")
		{
			-d $d or mkdir($d, 0755) or return "failed: mkdir $d: $!";
		}
		# master(8) locks data_directory/master.lock as mail_owner
		chown($uid, $gid, "$dir/data") or return "failed: chown $dir/data: $!";
	}
	my $out = `$POSTFIX -c $conf $command 2>&1`;
	return 'ok' if $? == 0;
	return sprintf('failed %d: %s', $? >> 8, $out);
}

1;
