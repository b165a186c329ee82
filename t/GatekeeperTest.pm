# Copyright: gatekeeper contributors

=pod

=head1 NAME

GatekeeperTest - helpers for gatekeeper's TAP tests: a node with the
library preloaded, a real SMTP relay (Postfix's smtp-sink) on a free
loopback port, and a parser for the messages the relay received.

=head1 SYNOPSIS

  use FindBin;
  use lib $FindBin::RealBin;
  use GatekeeperTest;

  my $sink = GatekeeperTest::start_sink();
  my $node = GatekeeperTest::new_node('content', sink => $sink);
  ...
  my @messages = GatekeeperTest::sink_messages($sink);

Every wait here is bounded; nothing sleeps for a fixed time to let
something happen.

=cut

package GatekeeperTest;

use strict;
use warnings;

use Carp;
use Encode ();
use Errno;
use Cwd ();
use File::Basename ();
use JSON::PP ();
use File::Path qw(make_path);
use File::Spec;
use HTTP::Tiny;
use IO::Socket::INET;
use IPC::Run;
use MIME::Base64 ();
use MIME::QuotedPrint ();
use POSIX ();
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Time::HiRes qw(time usleep);

our $SMTP_SINK = $ENV{SMTP_SINK} || '/usr/sbin/smtp-sink';

# sinks still running, by pid, stopped when the test ends whatever happens
my %running_sinks;

=pod

=head2 start_sink(%opts)

Start smtp-sink on 127.0.0.1.  Options: port (default: a free one), dir
(where each received message is dumped, one file each; default: a fresh
temporary directory), args (extra smtp-sink options, e.g. ['-r', 'RCPT']
for 4xx replies to RCPT TO), name (a label for the log).  Returns a hash
ref with port, dir, pid, log, url.  Returns once the sink accepts
connections (at most 10 s).

=cut

sub start_sink
{
	my (%opts) = @_;
	my $port = $opts{port} // PostgreSQL::Test::Cluster::get_free_port();
	my $name = $opts{name} // "sink$port";
	my $dir = $opts{dir} // PostgreSQL::Test::Utils::tempdir("sink_$name");
	my $log = "$PostgreSQL::Test::Utils::tmp_check/$name.log";
	my @args = @{ $opts{args} // [] };

	croak "smtp-sink not found at $SMTP_SINK" unless -x $SMTP_SINK;
	make_path("$dir/mail");

	# %H%M%S: a file name is the time it arrived plus a random number
	my @cmd = (
		$SMTP_SINK, '-c', '-d', "$dir/mail/%H%M%S.",
		'-t', '30', @args, "127.0.0.1:$port", '128');
	# smtp-sink needs no privileges on a high port; as root it would
	# need -u
	if ($> == 0)
	{
		splice(@cmd, 1, 0, '-u', 'postgres');
	}

	my $pid = fork();
	croak "fork failed: $!" unless defined $pid;
	if ($pid == 0)
	{
		open(STDOUT, '>>', $log) or POSIX::_exit(126);
		open(STDERR, '>&', \*STDOUT) or POSIX::_exit(126);
		exec(@cmd) or POSIX::_exit(127);
	}
	$running_sinks{$pid} = 1;
	note("started smtp-sink $name (pid $pid) on 127.0.0.1:$port: @cmd");

	my $sink = {
		name => $name,
		port => $port,
		dir => $dir,
		pid => $pid,
		log => $log,
		url => "smtp://127.0.0.1:$port",
		args => [@args],
	};

	my $deadline = time + 10;
	while (1)
	{
		if (waitpid($pid, POSIX::WNOHANG()) == $pid)
		{
			delete $running_sinks{$pid};
			croak "smtp-sink $name exited at once (status $?): "
			  . slurp_file($log);
		}
		last if sink_accepts($port);
		croak "smtp-sink $name does not accept connections on port $port"
		  if time > $deadline;
		usleep(50_000);
	}
	return $sink;
}

# Whether something answers with an SMTP greeting on 127.0.0.1:$port.
sub sink_accepts
{
	my ($port) = @_;
	my $s = IO::Socket::INET->new(
		PeerAddr => '127.0.0.1',
		PeerPort => $port,
		Proto => 'tcp',
		Timeout => 2) or return 0;
	$s->timeout(2);
	my $greeting = <$s>;
	print $s "QUIT\r\n" if defined $greeting;
	close($s);
	return defined $greeting && $greeting =~ /^220/;
}

=pod

=head2 stop_sink($sink)

Stop the sink (SIGTERM, then SIGKILL after 10 s) and wait until its port
refuses connections.  The messages it received stay in its dir.

=cut

sub stop_sink
{
	my ($sink) = @_;
	my $pid = $sink->{pid};
	return unless $pid && $running_sinks{$pid};

	kill('TERM', $pid);
	my $deadline = time + 10;
	while (waitpid($pid, POSIX::WNOHANG()) != $pid)
	{
		if (time > $deadline)
		{
			kill('KILL', $pid);
			waitpid($pid, 0);
			last;
		}
		usleep(20_000);
	}
	delete $running_sinks{$pid};
	$sink->{pid} = undef;
	note("stopped smtp-sink $sink->{name}");
	return;
}

END
{
	my $status = $?;
	foreach my $pid (keys %running_sinks)
	{
		kill('KILL', $pid);
		waitpid($pid, 0);
	}
	$? = $status;
}

=pod

=head2 new_node($name, %opts)

A node with shared_preload_libraries = 'gatekeeper', a UTF8 database
encoding, and gatekeeper settings: database (default 'postgres'),
smtp_url (default the url of opts{sink}, or ''), naptime (default '1s'),
default_sender (default 'shop@example.com'), plus opts{conf} appended
verbatim.  Not started.

=cut

sub new_node
{
	my ($name, %opts) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init(extra => [ '--encoding=UTF8', '--no-locale' ]);

	my $url = $opts{smtp_url} // ($opts{sink} ? $opts{sink}{url} : '');
	my $database = $opts{database} // 'postgres';
	my $naptime = $opts{naptime} // '1s';
	my $sender = $opts{default_sender} // 'shop@example.com';
	$node->append_conf(
		'postgresql.conf', qq{
shared_preload_libraries = 'gatekeeper'
gatekeeper.database = '$database'
gatekeeper.smtp_url = '$url'
gatekeeper.naptime = '$naptime'
gatekeeper.default_sender = '$sender'
# a statement that hangs must fail the test, not stall it
statement_timeout = '60s'
lock_timeout = '30s'
log_min_messages = 'log'
} . ($opts{conf} // ''));
	return $node;
}

=pod

=head2 sql_literal($string)

A standard SQL string literal (standard_conforming_strings is on).

=cut

sub sql_literal
{
	my ($s) = @_;
	return 'NULL' unless defined $s;
	$s =~ s/'/''/g;
	return "'$s'";
}

=pod

=head2 psql_utf8($node, $db, $sql)

safe_psql for SQL holding Perl character strings: sends it as UTF-8 and
returns the output decoded.

=cut

sub psql_utf8
{
	my ($node, $db, $sql) = @_;
	my $out = $node->safe_psql($db, Encode::encode('UTF-8', $sql));
	return Encode::decode('UTF-8', $out);
}

=pod

=head2 poll_until($node, $db, $query, $expected, $timeout)

Run $query every 100 ms until it returns $expected (default 't'), for at
most $timeout seconds (default 60).  Returns true when it did; on timeout
prints the last output and returns false.

=cut

sub poll_until
{
	my ($node, $db, $query, $expected, $timeout) = @_;
	$expected //= 't';
	$timeout //= 60;

	my $deadline = time + $timeout;
	my ($stdout, $stderr) = ('', '');
	while (1)
	{
		$node->psql(
			$db, $query,
			stdout => \$stdout,
			stderr => \$stderr,
			timeout => 30);
		$stdout //= '';
		$stderr //= '';
		return 1 if $stdout eq $expected && $stderr eq '';
		last if time > $deadline;
		usleep(100_000);
	}
	diag(   "poll_until timed out after $timeout s on: $query\n"
		  . "expected: $expected\nlast output: $stdout\nstderr: $stderr");
	return 0;
}

=pod

=head2 wait_for($code, $timeout, $what)

Call $code every 100 ms until it returns true, for at most $timeout
seconds.  Returns the last value.

=cut

sub wait_for
{
	my ($code, $timeout, $what) = @_;
	my $deadline = time + ($timeout // 60);
	while (1)
	{
		my $v = $code->();
		return $v if $v;
		if (time > $deadline)
		{
			diag("timed out after $timeout s waiting for "
				  . ($what // 'a condition'));
			return $v;
		}
		usleep(100_000);
	}
}

=pod

=head2 worker_pids($node, $db)

PIDs of the gatekeeper background workers, from pg_stat_activity.

=cut

sub worker_pids
{
	my ($node, $db) = @_;
	my $out = $node->safe_psql($db // 'postgres',
		"SELECT pid FROM pg_stat_activity WHERE backend_type = 'gatekeeper worker' ORDER BY pid"
	);
	return grep { $_ ne '' } split /\n/, $out;
}

=pod

=head2 sink_files($sink)

The files of the messages the sink received so far.  smtp-sink creates a
message's file when the transaction starts and writes it when the message
is complete; it removes the file of a transaction that is aborted, but a
sink stopped in the middle of one leaves it empty.  Empty files are not
messages.

=cut

sub sink_files
{
	my ($sink) = @_;
	my $dir = "$sink->{dir}/mail";
	opendir(my $dh, $dir) or croak "could not open $dir: $!";
	my @files = sort map { "$dir/$_" }
	  grep { !/^\./ && -f "$dir/$_" && -s "$dir/$_" } readdir($dh);
	closedir($dh);
	return @files;
}

=pod

=head2 sink_count($sink)

How many messages the sink received so far.

=cut

sub sink_count
{
	my ($sink) = @_;
	return scalar(sink_files($sink));
}

=pod

=head2 sink_messages($sink)

Every message the sink received, parsed (see parse_dump), in no
particular order.

=cut

sub sink_messages
{
	my ($sink) = @_;
	return map { parse_dump($_) } sink_files($sink);
}

=pod

=head2 sink_messages_to($sink, $rcpt)

The messages the sink received (see sink_messages) with $rcpt among
their RCPT TO paths, compared without regard to case.

=cut

sub sink_messages_to
{
	my ($sink, $rcpt) = @_;
	return grep {
		grep { lc($_) eq lc("<$rcpt>") } @{ $_->{rcpt} }
	} sink_messages($sink);
}

=pod

=head2 parse_dump($file)

Parse one smtp-sink dump file.  smtp-sink writes its own header lines
(X-Mail-Args, X-Rcpt-Args, ... and a three-line Received), then the
message as received with dot-stuffing undone and each CRLF as LF, then an
empty line.  Returns a hash ref:

  file, mail_from (the MAIL FROM path), mail_params (MAIL FROM's
  parameters: "RET=HDRS ENVID=...", or ''), rcpt (array of RCPT TO
  paths), rcpt_params (array of their parameters, "NOTIFY=... ORCPT=...",
  or ''), raw (the message octets, LF line ends), header_lines (array of
  [name, unfolded value]), headers (lower-cased name => array of unfolded
  values), body (octets after the blank line), message_id

=cut

sub parse_dump
{
	my ($file) = @_;
	my $data = slurp_file($file);

	$data =~ s/\A((?:X-[A-Za-z-]+:[^\n]*\n)*)Received:[^\n]*\n(?:\t[^\n]*\n)*//
	  or croak "$file: not an smtp-sink dump";
	my $envelope = $1;

	# the empty line smtp-sink appends
	$data =~ s/\n\z//;

	my %msg = (file => $file, raw => $data, rcpt => [], rcpt_params => []);
	foreach my $line (split /\n/, $envelope)
	{
		# the path, then the parameters (DSN's since issue 27)
		($msg{mail_from}, $msg{mail_params}) = ($1, $2)
		  if $line =~ /^X-Mail-Args: (\S*) ?(.*)$/;
		if ($line =~ /^X-Rcpt-Args: (\S*) ?(.*)$/)
		{
			push @{ $msg{rcpt} }, $1;
			push @{ $msg{rcpt_params} }, $2;
		}
	}

	my ($head, $body) = split_head_body($data);
	$msg{body} = $body;
	$msg{header_lines} = parse_header_block($head);
	$msg{headers} = {};
	push @{ $msg{headers}{ lc $_->[0] } }, $_->[1] foreach @{ $msg{header_lines} };
	$msg{message_id} = $msg{headers}{'message-id'}[0];
	return \%msg;
}

# Split a message (LF line ends) at its first empty line.
sub split_head_body
{
	my ($data) = @_;
	my $at = index($data, "\n\n");
	return ($data, '') if $at < 0;
	return (substr($data, 0, $at + 1), substr($data, $at + 2));
}

# Header lines as [name, value], unfolded (a line break before whitespace
# removed), the value without the one space after the colon.
sub parse_header_block
{
	my ($head) = @_;
	my @fields;
	foreach my $line (split /\n/, $head)
	{
		if ($line =~ /^[ \t]/ && @fields)
		{
			$fields[-1][1] .= $line;
		}
		elsif ($line =~ /^([^:\s]+):[ \t]?(.*)$/)
		{
			push @fields, [ $1, $2 ];
		}
		else
		{
			croak "malformed header line: $line";
		}
	}
	return \@fields;
}

=pod

=head2 header($msg, $name)

The single unfolded value of header $name; croaks if it appears more than
once, returns undef if never.

=cut

sub header
{
	my ($msg, $name) = @_;
	my $values = $msg->{headers}{ lc $name } // [];
	croak "header $name appears " . scalar(@$values) . " times"
	  if @$values > 1;
	return $values->[0];
}

=pod

=head2 decode_header_text($value)

An unfolded header value with its RFC 2047 encoded-words decoded, as a
Perl character string.

=cut

sub decode_header_text
{
	my ($value) = @_;
	return undef unless defined $value;
	return Encode::decode('MIME-Header', $value);
}

=pod

=head2 text_parts($msg)

The message's text as the reader sees it: a hash ref of content type
(lower case, e.g. 'text/plain', 'text/html') => decoded Perl character
string, plus '_type' => the top-level content type and '_parts' => the
list of part types in order.  Handles a single text part and
multipart/alternative; quoted-printable, base64, 7bit and 8bit.  The
charset must be UTF-8 and the octets valid UTF-8.

=cut

sub text_parts
{
	my ($msg) = @_;
	my %result;
	my $ct = header($msg, 'Content-Type') // 'text/plain';
	my ($type) = $ct =~ m{^\s*([^;\s]+)};
	$result{_type} = lc $type;

	my @parts;
	if ($result{_type} =~ m{^multipart/})
	{
		my ($boundary) = $ct =~ /boundary="([^"]+)"/i;
		($boundary) = $ct =~ /boundary=([^;\s]+)/i unless defined $boundary;
		croak "multipart without boundary: $ct" unless defined $boundary;
		my $delim = "--$boundary";
		my ($current, $closed);
		foreach my $line (split /\n/, $msg->{body}, -1)
		{
			if ($line =~ /^\Q$delim\E--[ \t]*$/)
			{
				push @parts, $current if defined $current;
				undef $current;
				$closed = 1;
				last;
			}
			elsif ($line =~ /^\Q$delim\E[ \t]*$/)
			{
				push @parts, $current if defined $current;
				$current = [];
			}
			elsif (defined $current)
			{
				push @$current, $line;
			}
		}
		croak "multipart body has no closing delimiter" unless $closed;
		@parts = map
		  {
			my ($h, $b) = split_head_body(join("\n", @$_));
			+{ header_lines => parse_header_block($h), body => $b }
		  } @parts;
	}
	else
	{
		@parts = ({ header_lines => $msg->{header_lines}, body => $msg->{body} });
	}

	foreach my $part (@parts)
	{
		my %h;
		$h{ lc $_->[0] } = $_->[1] foreach @{ $part->{header_lines} };
		my $pct = $h{'content-type'} // 'text/plain; charset=us-ascii';
		my ($ptype) = $pct =~ m{^\s*([^;\s]+)};
		my ($charset) = $pct =~ /charset="?([^";\s]+)"?/i;
		my $cte = lc($h{'content-transfer-encoding'} // '7bit');
		$cte =~ s/\s+//g;

		my $octets = $part->{body};
		if ($cte eq 'quoted-printable')
		{
			$octets = MIME::QuotedPrint::decode_qp($octets);
		}
		elsif ($cte eq 'base64')
		{
			$octets = MIME::Base64::decode_base64($octets);
		}
		elsif ($cte ne '7bit' && $cte ne '8bit')
		{
			croak "unexpected Content-Transfer-Encoding $cte";
		}
		croak "part $ptype has charset " . ($charset // 'none') . ", not UTF-8"
		  unless defined $charset && lc $charset eq 'utf-8';
		my $text = Encode::decode('UTF-8', $octets, Encode::FB_CROAK);
		$result{ lc $ptype } = $text;
		push @{ $result{_parts} }, lc $ptype;
	}
	return \%result;
}

=pod

=head2 normalize_text($text)

Text with every line break (CRLF, CR, LF) as LF and one final line break
dropped: what enqueued text and received text are compared as, since a
message's text always ends with a line break.

=cut

sub normalize_text
{
	my ($text) = @_;
	$text =~ s/\r\n|\r/\n/g;
	$text =~ s/\n\z//;
	return $text;
}

=pod

=head2 longest_line($msg)

The length in octets of the longest line of the message as received,
line break excluded.

=cut

sub longest_line
{
	my ($msg) = @_;
	my $max = 0;
	foreach my $line (split /\n/, $msg->{raw})
	{
		$max = length($line) if length($line) > $max;
	}
	return $max;
}

=pod

=head2 note_log_tail($node, $lines)

Print the last lines of the node's log, for a failing test's reader.

=cut

sub note_log_tail
{
	my ($node, $lines) = @_;
	$lines //= 40;
	my @log = split /\n/, slurp_file($node->logfile);
	my $from = @log > $lines ? @log - $lines : 0;
	diag(join("\n", "last lines of " . $node->logfile . ":", @log[ $from .. $#log ]));
	return;
}

=pod

=head2 run_pgbench($node, $dbname, $name, $clients, $transactions, $script)

Run a pgbench script against a database of the node, bounded in time:
past 120 seconds pgbench is killed and the run counts as failed.  Returns
(whether it exited 0 in time, stdout, stderr, seconds taken).

=cut

sub run_pgbench
{
	my ($node, $dbname, $name, $clients, $transactions, $script) = @_;
	my $timeout = 120;
	my $file = $node->basedir . "/$name.sql";
	my ($out, $err) = ('', '');

	PostgreSQL::Test::Utils::append_to_file($file, $script);
	my @cmd = (
		'pgbench', '--no-vacuum', "--client=$clients", '--jobs=2',
		"--transactions=$transactions", '--file', $file,
		'--host', $node->host, '--port', $node->port, $dbname);
	note('running: ' . join(' ', @cmd));
	my $start = time;
	my $h = IPC::Run::start(\@cmd, '>', \$out, '2>', \$err,
		IPC::Run::timeout($timeout));
	my $finished = eval { $h->finish; 1 };
	if (!$finished)
	{
		diag("pgbench did not finish within $timeout s: $@");
		$h->kill_kill;
	}
	my $ok = $finished && $h->result == 0;
	diag("pgbench stderr: $err") if $err ne '';
	return ($ok, $out, $err, time - $start);
}


=pod

=head1 RELAYS OTHER THAN SMTP-SINK

The helpers below start the other servers the delivery tests need, all on
127.0.0.1, on a free port, under the test's own directory, and all ended
when the test ends whatever happens (an END block kills what is still
running): a private Postfix smtpd (start_postfix), a scriptable relay on
Debian's python3-aiosmtpd with STARTTLS and AUTH (start_relay), a TCP
proxy adding latency (start_delay_proxy), and a test CA (make_test_ca).
The Python scripts live next to this module (t/pfmaster.py, t/relay.py,
t/delay_proxy.py) and run under /usr/bin/python3, Debian's, which has
aiosmtpd.

=cut

our $PYTHON = $ENV{GK_PYTHON} || '/usr/bin/python3';
our $OPENSSL = $ENV{GK_OPENSSL} || 'openssl';
our $POSTFIX_DAEMON_DIR = $ENV{GK_POSTFIX_DAEMON_DIR} || '/usr/lib/postfix/sbin';
my $helper_dir = Cwd::abs_path(File::Basename::dirname(__FILE__));

# helper processes still running, by pid => name
my %running_helpers;

END
{
	my $status = $?;
	# TERM first: the Postfix stand-in then ends its daemons itself
	kill('TERM', $_) foreach keys %running_helpers;
	my $deadline = time + 3;
	foreach my $pid (keys %running_helpers)
	{
		while (waitpid($pid, POSIX::WNOHANG()) == 0)
		{
			if (time > $deadline)
			{
				kill('KILL', $pid);
				waitpid($pid, 0);
				last;
			}
			usleep(20_000);
		}
	}
	$? = $status;
}

=pod

=head2 start_helper($name, $cmd, $log)

Run the command (an array ref) in the background, its stdout and stderr
appended to $log, and remember it so that it is killed when the test
ends.  Returns its pid.

=cut

sub start_helper
{
	my ($name, $cmd, $log) = @_;
	my $pid = fork();
	croak "fork failed: $!" unless defined $pid;
	if ($pid == 0)
	{
		open(STDIN, '<', '/dev/null') or POSIX::_exit(126);
		open(STDOUT, '>>', $log) or POSIX::_exit(126);
		open(STDERR, '>&', \*STDOUT) or POSIX::_exit(126);
		exec(@$cmd) or POSIX::_exit(127);
	}
	$running_helpers{$pid} = $name;
	note("started $name (pid $pid): @$cmd");
	return $pid;
}

=pod

=head2 stop_helper($pid)

SIGTERM, then SIGKILL after 10 s; waits for it.

=cut

sub stop_helper
{
	my ($pid) = @_;
	return unless $pid && $running_helpers{$pid};
	kill('TERM', $pid);
	my $deadline = time + 10;
	while (waitpid($pid, POSIX::WNOHANG()) != $pid)
	{
		if (time > $deadline)
		{
			kill('KILL', $pid);
			waitpid($pid, 0);
			last;
		}
		usleep(20_000);
	}
	note("stopped $running_helpers{$pid} (pid $pid)");
	delete $running_helpers{$pid};
	return;
}

# Wait until something greets with 220 on the port, or the helper exits
# (then croak with its log).
sub wait_for_greeting
{
	my ($name, $pid, $port, $log, $timeout) = @_;
	my $deadline = time + ($timeout // 15);
	while (1)
	{
		if (waitpid($pid, POSIX::WNOHANG()) == $pid)
		{
			delete $running_helpers{$pid};
			croak "$name exited at once (status $?): "
			  . (-f $log ? slurp_file($log) : '');
		}
		return if sink_accepts($port);
		croak "$name does not greet on port $port: "
		  . (-f $log ? slurp_file($log) : '')
		  if time > $deadline;
		usleep(50_000);
	}
}

=pod

=head2 start_postfix(%opts)

A private Postfix smtpd on 127.0.0.1 (see t/pfmaster.py for how it runs
without the system's master daemon and without root).  Everything lives
under a fresh directory of the test: config_directory, queue_directory,
data_directory, the log.  It offers PIPELINING, SIZE, ENHANCEDSTATUSCODES,
8BITMIME, SMTPUTF8 and CHUNKING, requires HELO/EHLO with a fully
qualified name (smtpd_helo_required, reject_non_fqdn_helo_hostname: a
bare name gets 504 5.5.2 at RCPT TO), enforces message_size_limit
(default 200000; advertised as SIZE), and rejects the recipients of
opts{reject} (address => reply; default nobody-here@customer.example
=> "550 5.1.1 User unknown") at RCPT TO.  Every message it accepts is
passed on (smtpd_proxy_filter) to an smtp-sink, the returned sink, so
sink_messages() reads what Postfix accepted.

Options: name, message_size_limit, reject, conf (main.cf lines
appended).  Returns a hash ref: name, port, url, dir, log (Postfix's log:
one line per record, e.g. "... disconnect from ... ehlo=1 mail=1 rcpt=1
bdat=1 quit=1"), sink, pid.

=cut

sub start_postfix
{
	my (%opts) = @_;
	my $name = $opts{name} // 'postfix';
	my $port = PostgreSQL::Test::Cluster::get_free_port();
	my $dir = PostgreSQL::Test::Utils::tempdir("postfix_$name");
	my $log = "$PostgreSQL::Test::Utils::tmp_check/$name.log";
	my $limit = $opts{message_size_limit} // 200000;
	my $reject = $opts{reject}
	  // { 'nobody-here@customer.example' => '550 5.1.1 User unknown' };

	croak "no Postfix daemons in $POSTFIX_DAEMON_DIR"
	  unless -x "$POSTFIX_DAEMON_DIR/smtpd";
	my $sink = start_sink(name => "$name-backend");
	make_path("$dir/conf", "$dir/queue", "$dir/data");
	my $user = getpwuid($>);

	open(my $fh, '>', "$dir/conf/recipient_access") or croak $!;
	print $fh "$_ $reject->{$_}\n" foreach sort keys %$reject;
	close($fh);
	# the daemons read no master.cf, but postconf likes one
	PostgreSQL::Test::Utils::append_to_file("$dir/conf/master.cf", '');

	# setgid_group must exist and differ from mail_owner's group; nothing
	# here runs setgid
	my $main = <<"END_MAIN_CF";
compatibility_level = 3.6
config_directory = $dir/conf
queue_directory = $dir/queue
data_directory = $dir/data
mail_owner = $user
setgid_group = postdrop
myhostname = relay.test.example
mydomain = test.example
inet_interfaces = 127.0.0.1
mynetworks = 127.0.0.0/8
mydestination =
relay_domains =
local_recipient_maps =
smtpd_reject_unlisted_recipient = no
smtpd_reject_unlisted_sender = no
smtpd_relay_restrictions = permit_mynetworks, reject
smtpd_recipient_restrictions = check_recipient_access texthash:$dir/conf/recipient_access, permit
smtpd_helo_required = yes
smtpd_helo_restrictions = reject_non_fqdn_helo_hostname
message_size_limit = $limit
smtpd_peername_lookup = no
smtpd_client_connection_count_limit = 0
smtpd_client_connection_rate_limit = 0
smtpd_proxy_filter = 127.0.0.1:$sink->{port}
smtpd_proxy_timeout = 30s
maillog_file_prefixes = $dir
maillog_file = $dir/maillog
END_MAIN_CF
	$main .= $opts{conf} if defined $opts{conf};
	PostgreSQL::Test::Utils::append_to_file("$dir/conf/main.cf", $main);

	my $pid = start_helper(
		"postfix $name",
		[
			$PYTHON, "$helper_dir/pfmaster.py",
			'--config', "$dir/conf",
			'--queue', "$dir/queue",
			'--port', $port,
			'--log', $log,
			'--daemon-dir', $POSTFIX_DAEMON_DIR,
			'--lifetime', 900
		],
		$log);
	wait_for_greeting("postfix $name", $pid, $port, $log);
	return {
		name => $name,
		port => $port,
		url => "smtp://127.0.0.1:$port",
		dir => $dir,
		log => $log,
		sink => $sink,
		pid => $pid,
	};
}

=pod

=head2 stop_postfix($pf)

Stop the private Postfix and its backend sink (the messages stay).

=cut

sub stop_postfix
{
	my ($pf) = @_;
	stop_helper($pf->{pid});
	stop_sink($pf->{sink});
	return;
}

=pod

=head2 postfix_sessions($pf)

The sessions Postfix logged as finished so far: a list of hash refs of
command => count, from its "disconnect from ... ehlo=1 mail=1 rcpt=1
bdat=1 quit=1 commands=5" lines (a count "1/2" means 1 of 2 succeeded:
kept as the string), plus helo => the name the client gave, when a
record of the session names it.  Probe connections of the helpers
(greeting, QUIT) appear too.

=cut

sub postfix_sessions
{
	my ($pf) = @_;
	my $log = -f $pf->{log} ? slurp_file($pf->{log}) : '';
	my (%helo, @sessions);
	foreach my $line (split /\n/, $log)
	{
		my ($pid) = $line =~ /postfix\/smtpd\[(\d+)\]/ or next;
		$helo{$pid} = $1 if $line =~ / helo=<([^>]*)>/;
		if ($line =~ /: disconnect from \S+ (.*)$/)
		{
			my %s = map { split /=/, $_, 2 } grep { /=/ } split / /, $1;
			$s{helo} = $helo{$pid} if defined $helo{$pid};
			push @sessions, \%s;
		}
	}
	return @sessions;
}

=pod

=head2 postfix_command_count($pf, $command)

How many $command commands (lower case: mail, rcpt, bdat, data, ...)
Postfix counted over every finished session (for "rcpt=1/2", the first
number: those that succeeded).  A session is logged when it ends: a client that keeps its connections open (idle
connections are reused) shows its commands once it closes them, so read
this after stopping the node, waiting for the count to arrive.

=cut

sub postfix_command_count
{
	my ($pf, $command) = @_;
	my $n = 0;
	foreach my $s (postfix_sessions($pf))
	{
		$n += $1 if ($s->{$command} // '0') =~ /^(\d+)/;
	}
	return $n;
}

=pod

=head2 make_test_ca($dir, %opts)

A test CA and a server certificate it signed, made with openssl under
$dir: the server certificate's subjectAltName is opts{san} (default
"DNS:localhost,IP:127.0.0.1"), its CN opts{cn} (default localhost).
Returns a hash ref: ca_file, ca_key, cert, key, dir.  Call
make_server_cert($ca, $name, $san) for more server certificates from the
same CA.

=cut

sub make_test_ca
{
	my ($dir, %opts) = @_;
	make_path($dir);
	my $ca = { ca_file => "$dir/ca.crt", ca_key => "$dir/ca.key", dir => $dir };
	run_openssl(
		'req', '-x509', '-newkey', 'rsa:2048', '-nodes',
		'-keyout', $ca->{ca_key}, '-out', $ca->{ca_file},
		'-days', '2', '-subj', '/CN=gatekeeper test CA',
		'-addext', 'basicConstraints=critical,CA:TRUE',
		'-addext', 'keyUsage=critical,keyCertSign,cRLSign');
	my $server = make_server_cert($ca, 'server',
		$opts{san} // 'DNS:localhost,IP:127.0.0.1',
		$opts{cn} // 'localhost');
	$ca->{cert} = $server->{cert};
	$ca->{key} = $server->{key};
	return $ca;
}

=pod

=head2 make_server_cert($ca, $name, $san, $cn)

A server certificate and key signed by the test CA; returns a hash ref:
cert, key.

=cut

sub make_server_cert
{
	my ($ca, $name, $san, $cn) = @_;
	$cn //= 'localhost';
	my $dir = $ca->{dir};
	my %c = (cert => "$dir/$name.crt", key => "$dir/$name.key");
	run_openssl(
		'req', '-newkey', 'rsa:2048', '-nodes',
		'-keyout', $c{key}, '-out', "$dir/$name.csr", '-subj', "/CN=$cn");
	PostgreSQL::Test::Utils::append_to_file("$dir/$name.ext",
		"subjectAltName=$san\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n");
	run_openssl(
		'x509', '-req', '-in', "$dir/$name.csr",
		'-CA', $ca->{ca_file}, '-CAkey', $ca->{ca_key}, '-CAcreateserial',
		'-out', $c{cert}, '-days', '2', '-extfile', "$dir/$name.ext");
	return \%c;
}

sub run_openssl
{
	my @args = @_;
	my ($out, $err) = ('', '');
	my $ok = IPC::Run::run([ $OPENSSL, @args ],
		'<', \undef, '>', \$out, '2>', \$err, IPC::Run::timeout(60));
	croak "openssl @args failed: $err" unless $ok;
	return;
}

=pod

=head2 start_relay(%opts)

The scriptable relay, t/relay.py (Debian's python3-aiosmtpd), on a free
port (or opts{port}).  Options: name, port, mode ('accept', 'reject-mail':
550 5.7.1 to every MAIL FROM, 'hang-first': the first connection is
greeted and then never answered), tls (a hash ref with cert and key, e.g.
from make_test_ca: offers STARTTLS), require_tls (refuses MAIL before
STARTTLS), auth ([user, password_file]: offers AUTH PLAIN and LOGIN,
required for MAIL; only over TLS when TLS is offered), rcpt_replies
(RCPT TO a local part beginning "hard" gets 550 5.1.1, "soft" 451
4.3.0), data_delay (seconds before each message's data is answered).
Returns a hash
ref: name, port, url, dir (messages/: one file per message received),
events (its JSON-lines log, see relay_events), log (its stderr), pid.

=cut

sub start_relay
{
	my (%opts) = @_;
	my $name = $opts{name} // 'relay';
	my $port = $opts{port} // PostgreSQL::Test::Cluster::get_free_port();
	my $dir = PostgreSQL::Test::Utils::tempdir("relay_$name");
	my $log = "$PostgreSQL::Test::Utils::tmp_check/$name.log";
	my $mode = $opts{mode} // 'accept';
	my @cmd = (
		$PYTHON, "$helper_dir/relay.py",
		'--port', $port,
		'--log', "$dir/events.jsonl",
		'--dir', "$dir/messages",
		'--mode', $mode,
		'--lifetime', 900);
	push @cmd, '--cert', $opts{tls}{cert}, '--key', $opts{tls}{key}
	  if $opts{tls};
	push @cmd, '--require-tls' if $opts{require_tls};
	push @cmd, '--auth', join(':', @{ $opts{auth} }) if $opts{auth};
	push @cmd, '--rcpt-replies' if $opts{rcpt_replies};
	push @cmd, '--data-delay', $opts{data_delay} if $opts{data_delay};
	my $pid = start_helper("relay $name", \@cmd, $log);
	my $relay = {
		name => $name,
		port => $port,
		url => "smtp://127.0.0.1:$port",
		dir => $dir,
		log => $log,
		events => "$dir/events.jsonl",
		pid => $pid,
	};
	if ($mode eq 'hang-first')
	{
		# a greeting probe would be the connection that hangs: wait for
		# the relay's own "listening" record instead
		wait_for(sub { grep { $_->{event} eq 'listening' } relay_events($relay) },
			15, "relay $name listening")
		  or croak "relay $name does not start: " . slurp_file($log);
	}
	else
	{
		wait_for_greeting("relay $name", $pid, $port, $log);
	}
	return $relay;
}

=pod

=head2 stop_relay($relay)

Stop the relay; its log and messages stay.

=cut

sub stop_relay
{
	my ($relay) = @_;
	stop_helper($relay->{pid});
	return;
}

=pod

=head2 relay_events($relay)

The relay's log so far: a list of hash refs, one per JSON line (event =>
listening, connect, command (line, AUTH arguments redacted; ahead: octets
the client had sent past the command when it was read), tls, auth
(user, ok), mail (from, tls, user), message (from, rcpt, data_file, size,
tls, user), hang, disconnect; conn numbers the connection).

=cut

sub relay_events
{
	my ($relay) = @_;
	return () unless -f $relay->{events};
	my @events;
	foreach my $line (split /\n/, slurp_file($relay->{events}))
	{
		next if $line eq '';
		# the last line may be half written
		my $e = eval { JSON::PP::decode_json($line) } or next;
		push @events, $e;
	}
	return @events;
}

=pod

=head2 relay_messages($relay)

The messages the relay accepted, parsed like sink_messages (raw with LF
line ends, header_lines, headers, body, message_id), plus mail_from,
rcpt, tls, user and wire (the octets as received, CRLF line ends).

=cut

sub relay_messages
{
	my ($relay) = @_;
	my @msgs;
	foreach my $e (grep { $_->{event} eq 'message' } relay_events($relay))
	{
		my $wire = slurp_file($e->{data_file});
		my $data = $wire;
		$data =~ s/\r\n/\n/g;
		my %msg = (
			file => $e->{data_file},
			wire => $wire,
			raw => $data,
			mail_from => $e->{from},
			rcpt => $e->{rcpt},
			tls => $e->{tls},
			user => $e->{user});
		my ($head, $body) = split_head_body($data);
		$msg{body} = $body;
		$msg{header_lines} = parse_header_block($head);
		$msg{headers} = {};
		push @{ $msg{headers}{ lc $_->[0] } }, $_->[1]
		  foreach @{ $msg{header_lines} };
		$msg{message_id} = $msg{headers}{'message-id'}[0];
		push @msgs, \%msg;
	}
	return @msgs;
}

=pod

=head2 sent_once($node, $relay, $id, $what)

Two tests: mail $id is sent on its first attempt, and the relay (a
start_relay one) holds its Message-ID exactly once.  $what names the
mail in the tests' names.

=cut

sub sent_once
{
	my ($node, $relay, $id, $what) = @_;
	my ($state, $attempt, $mid) = split /\|/,
	  $node->safe_psql('postgres',
		"SELECT state, attempt, message_id FROM gatekeeper.mail_status WHERE id = $id");
	Test::More::is(($state // '') . '/' . ($attempt // ''),
		'sent/1', "$what: sent on its first attempt");
	my $copies =
	  grep { defined $mid && ($_->{message_id} // '') eq $mid } relay_messages($relay);
	Test::More::is($copies, 1, "$what: the relay holds its Message-ID once");
	return;
}

=pod

=head2 start_hostile_relay(%opts)

t/hostile_relay.py on a free port (or opts{port}): a relay that ends its
sessions after opts{session_limit} messages (opts{end}: 'close', '421'
or 'reset'; opts{end_at_mail}: at the first MAIL FROM, unanswered),
offers PIPELINING and CHUNKING unless opts{no_pipelining}
(opts{extensions}: 'chunking', 'pipelining' or 'none'), answers each
final "." opts{dot_delay} seconds late (with the enhanced status code
opts{dot_status} when it takes the message), refuses the messages to
recipients beginning with opts{refuse_prefix}, answers out of order
behind a "." (opts{reorder}) or never answers a DATA behind one
(opts{hold_data_behind}), answers every MAIL FROM with the reply
opts{defer} (while the file opts{defer_file} exists, when given), or
floods (opts{flood}: 'greeting', 'ehlo', 'mail-line', up to
opts{flood_bytes} octets).  Returns a hash ref: name, port, url, events
(its JSON-lines log, read with relay_events), log, pid.

=cut

sub start_hostile_relay
{
	my (%opts) = @_;
	my $name = $opts{name} // 'hostile';
	my $port = $opts{port} // PostgreSQL::Test::Cluster::get_free_port();
	my $dir = PostgreSQL::Test::Utils::tempdir("hostile_$name");
	my $log = "$PostgreSQL::Test::Utils::tmp_check/$name.log";
	my @cmd = (
		$PYTHON, "$helper_dir/hostile_relay.py",
		'--port', $port,
		'--log', "$dir/events.jsonl",
		'--lifetime', 900);
	push @cmd, '--session-limit', $opts{session_limit} if $opts{session_limit};
	push @cmd, '--end-at-mail' if $opts{end_at_mail};
	push @cmd, '--end', $opts{end} // 'close';
	push @cmd, '--no-pipelining' if $opts{no_pipelining};
	push @cmd, '--extensions', $opts{extensions} if $opts{extensions};
	push @cmd, '--dot-delay', $opts{dot_delay} if $opts{dot_delay};
	push @cmd, '--refuse-prefix', $opts{refuse_prefix} if $opts{refuse_prefix};
	push @cmd, '--dot-status', $opts{dot_status} if $opts{dot_status};
	push @cmd, '--reorder' if $opts{reorder};
	push @cmd, '--hold-data-behind' if $opts{hold_data_behind};
	push @cmd, '--defer', $opts{defer} if $opts{defer};
	push @cmd, '--defer-file', $opts{defer_file} if $opts{defer_file};
	push @cmd, '--flood', $opts{flood} if $opts{flood};
	push @cmd, '--flood-bytes', $opts{flood_bytes} if $opts{flood_bytes};
	my $pid = start_helper("hostile relay $name", \@cmd, $log);
	my $relay = {
		name => $name,
		port => $port,
		url => "smtp://127.0.0.1:$port",
		log => $log,
		events => "$dir/events.jsonl",
		pid => $pid,
	};
	# a greeting probe would meet the flood: wait for "listening"
	wait_for(sub { grep { $_->{event} eq 'listening' } relay_events($relay) },
		15, "hostile relay $name listening")
	  or croak "hostile relay $name does not start: " . slurp_file($log);
	return $relay;
}

=pod

=head2 start_delay_proxy(%opts)

t/delay_proxy.py: a TCP proxy on a free loopback port to 127.0.0.1:
opts{target}, adding opts{delay_ms} to every chunk each way (a relay
2 x delay_ms away).  Returns a hash ref: name, port, url, log, pid.

=cut

sub start_delay_proxy
{
	my (%opts) = @_;
	my $name = $opts{name} // 'proxy';
	my $port = PostgreSQL::Test::Cluster::get_free_port();
	my $log = "$PostgreSQL::Test::Utils::tmp_check/$name.log";
	my $pid = start_helper(
		"delay proxy $name",
		[
			$PYTHON, "$helper_dir/delay_proxy.py",
			'--listen', $port, '--target', $opts{target},
			'--delay-ms', $opts{delay_ms}, '--log', $log,
			'--lifetime', 900
		],
		$log);
	wait_for_greeting("delay proxy $name", $pid, $port, $log);
	return {
		name => $name,
		port => $port,
		url => "smtp://127.0.0.1:$port",
		log => $log,
		pid => $pid
	};
}

=pod

=head2 process_memory_kb($pid)

VmRSS and VmHWM (peak resident) of a process, in kB, from
/proc/<pid>/status: a hash ref, empty when the process is gone.

=cut

sub process_memory_kb
{
	my ($pid) = @_;
	my %m;
	open(my $fh, '<', "/proc/$pid/status") or return \%m;
	while (my $line = <$fh>)
	{
		$m{$1} = $2 if $line =~ /^(VmRSS|VmHWM):\s+(\d+) kB/;
	}
	close($fh);
	return \%m;
}

=pod

=head2 start_exporter($node, %opts)

Start Debian's prometheus-postgres-exporter ($GatekeeperTest::EXPORTER)
on a free loopback port with the repository's monitoring/queries.yaml,
its default and settings metrics off, connected to $node as opts{user}
(default 'monitor') to opts{dbname} (default 'postgres'); its output goes
to tmp_check/exporter_<opts{name}>.log (exporter.log without a name).  Returns a hash ref with pid,
port, log.  It does not wait: scrape() does.  An exporter still running
when the test ends is stopped.

=cut

our $EXPORTER = '/usr/bin/prometheus-postgres-exporter';

# exporters still running, by pid, stopped when the test ends whatever happens
my %running_exporters;

sub start_exporter
{
	my ($node, %opts) = @_;
	my $name = defined $opts{name} ? "exporter_$opts{name}" : 'exporter';
	my $exporter = {
		port => PostgreSQL::Test::Cluster::get_free_port(),
		log => "$PostgreSQL::Test::Utils::tmp_check/$name.log",
	};
	my $dsn = sprintf('host=%s port=%d user=%s dbname=%s sslmode=disable',
		$node->host, $node->port, $opts{user} // 'monitor', $opts{dbname} // 'postgres');
	my $queries = "$helper_dir/../monitoring/queries.yaml";
	croak "$queries is missing" unless -f $queries;

	my $pid = fork();
	croak "fork: $!" unless defined $pid;
	if ($pid == 0)
	{
		open(STDOUT, '>>', $exporter->{log}) or POSIX::_exit(126);
		open(STDERR, '>&', \*STDOUT) or POSIX::_exit(126);
		$ENV{DATA_SOURCE_NAME} = $dsn;
		exec($EXPORTER, "--web.listen-address=127.0.0.1:$exporter->{port}",
			"--extend.query-path=$queries", '--disable-default-metrics',
			'--disable-settings-metrics')
		  or POSIX::_exit(127);
	}
	$exporter->{pid} = $pid;
	$running_exporters{$pid} = 1;
	note("started prometheus-postgres-exporter ($name.log) on port $exporter->{port}");
	return $exporter;
}

=pod

=head2 scrape($exporter, $want, $timeout)

The body of one scrape of the exporter's /metrics, once it answers with a
body matching the regex $want; undef if it did not within $timeout
seconds (default 20).

=cut

sub scrape
{
	my ($exporter, $want, $timeout) = @_;
	my $http = HTTP::Tiny->new(timeout => 10);
	my $deadline = time + ($timeout // 20);

	while (time < $deadline)
	{
		my $r = $http->get("http://127.0.0.1:$exporter->{port}/metrics");
		return $r->{content} if $r->{success} && $r->{content} =~ $want;
		usleep(100_000);
	}
	return undef;
}

=pod

=head2 metric($body, $name, @labels)

The value (a number) of the first series of metric $name in a scrape's
body whose labels include each of @labels (strings such as
'worker="1"'); undef if there is none.

=cut

sub metric
{
	my ($body, $name, @labels) = @_;

	foreach my $line (split /\n/, $body // '')
	{
		next if $line =~ /^#/;
		next unless $line =~ /^\Q$name\E(\{[^}]*\})?\s+(\S+)$/;
		my ($l, $v) = ($1 // '', $2);
		next if grep { index($l, $_) < 0 } @labels;
		return $v + 0;
	}
	return undef;
}

=pod

=head2 stop_exporter($exporter)

Stop the exporter (SIGTERM) and wait for it.

=cut

sub stop_exporter
{
	my ($exporter) = @_;
	my $pid = $exporter->{pid};
	return unless $pid && $running_exporters{$pid};

	kill('TERM', $pid);
	waitpid($pid, 0);
	delete $running_exporters{$pid};
	$exporter->{pid} = undef;
	return;
}

END
{
	my $status = $?;
	foreach my $pid (keys %running_exporters)
	{
		kill('KILL', $pid);
		waitpid($pid, 0);
	}
	$? = $status;
}

=pod

=head2 mail_states($node, $where)

"state:count" pairs of the mail matching $where (SQL), sorted by state,
joined with commas: e.g. "failed:1,sent:4".

=cut

sub mail_states
{
	my ($node, $where) = @_;
	return $node->safe_psql('postgres',
		"SELECT coalesce(string_agg(state || ':' || n, ',' ORDER BY state), '') FROM (SELECT state::text AS state, count(*) AS n FROM gatekeeper.mail_status WHERE $where GROUP BY 1) s"
	);
}

=pod

=head2 mail_events_sql($id)

A query of mail $id's events as "event:source:status" (status '' when
NULL), in the order they happened, joined with commas; '' when none.

=cut

sub mail_events_sql
{
	my ($id) = @_;
	return "SELECT coalesce(string_agg(event || ':' || source || ':' || coalesce(status, ''), ',' ORDER BY at, id), '') "
	  . "FROM gatekeeper.events WHERE mail_id = $id";
}

=pod

=head2 next_campaign($node, $expected, @recipients)

The reports tests' second campaign: a queue 'next' with a VERP return
path (bounces+{token}@bounce.shop.example), one mail 'Next week' from
shop@shop.example to each recipient, then poll_until the queue's mail
reads $expected ("recipient:state" by recipient, joined with commas;
30 s at the most).  Returns poll_until's answer.

=cut

sub next_campaign
{
	my ($node, $expected, @recipients) = @_;
	my $list = join(', ', map { sql_literal($_) } @recipients);

	$node->safe_psql('postgres',
		"SELECT gatekeeper.create_queue('next', return_path => 'bounces+{token}\@bounce.shop.example')");
	$node->safe_psql('postgres',
		"SELECT gatekeeper.enqueue(r, 'Next week', 'Hello', 'next', sender => 'shop\@shop.example') "
		  . "FROM unnest(ARRAY[$list]) r");
	return poll_until(
		$node, 'postgres',
		"SELECT string_agg(recipient || ':' || state, ',' ORDER BY recipient) FROM gatekeeper.mail_status "
		  . "WHERE queue = 'next'",
		$expected, 30);
}

=pod

=head2 mail_outcome($node, $id, $recipient)

What the reports tests read of mail $id once its bounce came back: its
events but sent, each "event|status|reason" (status and reason '' when
NULL), joined with commas, then ';' and the reason $recipient is
suppressed for ('' when it is not): "bounced|5.1.1|user_unknown;hard_bounce",
or ";" for a mail that was delivered.

=cut

sub mail_outcome
{
	my ($node, $id, $recipient) = @_;
	return $node->safe_psql(
		'postgres', qq{
SELECT coalesce(string_agg(e.event || '|' || coalesce(e.status, '') || '|' || coalesce(e.reason, ''), ','), '')
	   || ';' || coalesce((SELECT reason FROM gatekeeper.suppression s WHERE s.address = '$recipient'), '')
  FROM gatekeeper.events e WHERE e.mail_id = $id AND e.event <> 'sent'});
}

=pod

=head2 bounce_pipe_node($name, $relay_port, plain => 1)

A started node for an MTA's bounces test (t/095, t/097, t/098, t/099):
gatekeeper.helo_name mta.shop.example, the worker relaying to
127.0.0.1:$relay_port; the extension, the queue news with VERP return paths
(bounces+{token}@bounce.shop.example), with plain also the queue plain
(no VERP), and the bounce pipe's role gkbounce with only the grants
docs/reference.md gives it.

=cut

sub bounce_pipe_node
{
	my ($name, $relay_port, %opts) = @_;
	my $node = new_node($name, conf => "gatekeeper.helo_name = 'mta.shop.example'\n");

	$node->append_conf('postgresql.conf', "gatekeeper.smtp_url = 'smtp://127.0.0.1:$relay_port'\n");
	$node->start;
	$node->safe_psql('postgres',
		"CREATE EXTENSION gatekeeper;\n"
		  . "SELECT gatekeeper.create_queue('news', return_path => 'bounces+{token}\@bounce.shop.example');\n"
		  . ($opts{plain} ? "SELECT gatekeeper.create_queue('plain');\n" : '') . q{
-- the bounce pipe's role, as docs/reference.md creates it
CREATE ROLE gkbounce LOGIN;
GRANT USAGE ON SCHEMA gatekeeper TO gkbounce;
GRANT EXECUTE ON FUNCTION gatekeeper.ingest_report(text, text),
						  gatekeeper.record_event(text, text, text, text, text) TO gkbounce;
});
	return $node;
}

=pod

=head2 bounce_pipe_psql($node)

The bounce pipe's psql, as an MTA's pipe runs it: the environment that
connects it to $node as gkbounce, psql's path and options, then
"-v recipient=" for the caller to complete with its MTA's way of naming
the envelope recipient, before " -f " . bounce_pipe_sql().

=cut

sub bounce_pipe_psql
{
	my ($node) = @_;
	my $psql = (grep { -x $_ } map { File::Spec->catfile($_, 'psql') } split(/:/, $ENV{PATH}))[0];

	return 'PGCLIENTENCODING=LATIN1 PGDATABASE=postgres PGHOST=' . $node->host
	  . ' PGPORT=' . $node->port . " PGUSER=gkbounce $psql -X -q -v ON_ERROR_STOP=1 -v recipient=";
}

=pod

=head2 bounce_pipe_sql()

The path of scripts/bounce-pipe.sql, the script the bounce pipe runs.

=cut

sub bounce_pipe_sql
{
	return Cwd::abs_path(File::Basename::dirname(__FILE__) . '/../scripts/bounce-pipe.sql');
}

=pod

=head2 enqueue_cases($node, @cases)

Enqueue one mail per case of an MTA's bounces test (the cases of
check_bounce_outcomes, with a seventh element, the queue: news when not
given), subject "Weekly picks", from shop@shop.example, or from
shop@mailer.shop.example on the queue plain, whose bounces come back to
that address.  Returns a hash of each recipient's mail id.

=cut

sub enqueue_cases
{
	my ($node, @cases) = @_;
	my %id;

	foreach my $c (@cases)
	{
		my $queue = $c->[6] // 'news';
		my $sender = $queue eq 'plain' ? 'shop@mailer.shop.example' : 'shop@shop.example';
		$id{ $c->[0] } = $node->safe_psql('postgres',
			"SELECT gatekeeper.enqueue('$c->[0]', 'Weekly picks', "
			  . sql_literal($c->[2])
			  . ", '$queue', sender => 'Shop <$sender>')");
	}
	return %id;
}

=pod

=head2 all_sent($node, \%id)

Whether every mail of %id (a recipient's mail id, as enqueue_cases returns)
is sent within 60 seconds.

=cut

sub all_sent
{
	my ($node, $ids) = @_;
	my $list = join(',', values %$ids);

	return poll_until($node, 'postgres',
		"SELECT count(*) FILTER (WHERE state = 'sent') FROM gatekeeper.mail_status WHERE id IN ($list)",
		scalar(keys %$ids), 60);
}

=pod

=head2 check_bounce_outcomes($node, $mta, \%id, @cases)

What an MTA's bounces did, as t/097, t/098 and t/099 check it.  Each case
is [recipient, what, body, status, reason, suppression], what being
'delivered' for a mail that was; %id maps each recipient to its mail.
Per bounced mail, a test that it has one bounced event with that status
and reason (mail_outcome) and one of its suppression ('' for none); per
delivered mail, one that it has no event but sent; then one that
report_stats counted a recorded report per bounce.  Notes a summary
headed $mta ("Sendmail 8.17").  Returns a hash ref of each bounced
recipient's mail_outcome.

=cut

sub check_bounce_outcomes
{
	my ($node, $mta, $ids, @cases) = @_;
	my @bounced = grep { $_->[1] ne 'delivered' } @cases;
	my %got;

	# a failure names the test file's line, not this one
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	foreach my $c (@bounced)
	{
		my ($r, $what, undef, $status, $reason, $suppression) = @$c;
		my $row = mail_outcome($node, $ids->{$r}, $r);
		$got{$r} = $row;
		my ($events, $supp) = split(/;/, $row, -1);
		Test::More::is($events, "bounced|$status|$reason",
			"$r ($what): one bounced event, status $status, reason $reason")
		  or diag($row);
		Test::More::is($supp, $suppression,
			"$r ($what): " . ($suppression eq '' ? 'not suppressed' : "suppressed ($suppression)"));
	}
	foreach my $c (grep { $_->[1] eq 'delivered' } @cases)
	{
		Test::More::is(
			$node->safe_psql('postgres',
				"SELECT count(*) FROM gatekeeper.events WHERE mail_id = $ids->{$c->[0]} AND event <> 'sent'"),
			'0', "$c->[0] (delivered): no event but sent");
	}
	Test::More::is($node->safe_psql('postgres', 'SELECT recorded FROM gatekeeper.report_stats'),
		scalar(@bounced), scalar(@bounced) . ' reports recorded (report_stats)');

	# the summary
	my @rec = grep { $got{ $_->[0] } =~ /^bounced/ } @bounced;
	my @supp = grep { $got{ $_->[0] } =~ /;.+$/ } @bounced;
	note(
		sprintf('%s: %d of %d bounces recorded, reasons: %s; suppressed: %d (%s)',
			$mta, scalar(@rec), scalar(@bounced),
			join(', ', map { my ($e) = split(/;/, $got{ $_->[0] }); (split(/\|/, $e))[2] // 'none' } @bounced),
			scalar(@supp), join(', ', map { $_->[0] } @supp)));
	note(sprintf('  %-24s %-34s %s', $_->[0], $_->[1], $got{ $_->[0] })) foreach @bounced;
	return \%got;
}

sub note { Test::More::note(@_) }
sub diag { Test::More::diag(@_) }

1;
