# Copyright: gatekeeper contributors
# gatekeeper-test: alone

# The worker's SMTP client against Postfix's smtp-sink in the ways a relay
# may speak (issue 10):
#
#  1. PIPELINING offered (smtp-sink's default), not offered (-p), and no
#     ESMTP at all (-e: EHLO refused, HELO instead): every mail arrives
#     once, intact, with its Message-ID, including lines that begin with
#     "." (dot-stuffing) and UTF-8 text; the relay saw EHLO (ESMTP) or HELO
#     (SMTP) as it offered; gatekeeper.helo_name is the name given.
#  2. A relay that takes 1 s to answer each end-of-data (-W .:1), 16
#     connections: 64 mails go in well under 10 s (one connection's wait
#     must not hold the others: a client that waits for each reply in turn
#     takes 64 s).
#  3. A relay that refuses every MAIL FROM with the same 5xx: the breaker
#     opens; no mail fails, none is charged, gatekeeper.worker_status says
#     what the relay said; once the relay takes mail again, all of it goes.
#  4. gatekeeper.worker_status shows the worker, its relay connections and
#     the mail it sent.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $port = PostgreSQL::Test::Cluster::get_free_port();
my $helo = 'mailer.gatekeeper.example';

my $node = GatekeeperTest::new_node(
	'smtp_client',
	smtp_url => "smtp://127.0.0.1:$port",
	conf => "gatekeeper.helo_name = '$helo'\n"
	  . "gatekeeper.smtp_connections = 16\n"
	  . "gatekeeper.retry_delay = '1s'\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gatekeeper');

# a body with lines that a careless client would take for the end of
# the data, or mangle
my $body = "Dear customer,\n.\n..two dots\n.one dot\nend . here\nCafé ✓\n.";

#
# 1. With and without PIPELINING and ESMTP
#
foreach my $mode (
	[ 'pipelining', [], 'ESMTP' ],
	[ 'lockstep', ['-p'], 'ESMTP' ],
	[ 'no_esmtp', ['-e'], 'SMTP' ])
{
	my ($name, $args, $proto) = @$mode;
	my $sink = GatekeeperTest::start_sink(port => $port, name => $name, args => $args);
	my $n = 12;

	my $first = $node->safe_psql(
		'postgres', qq{
WITH m AS (
	INSERT INTO gatekeeper.mail (recipient, subject, body, html)
	SELECT '$name' || i || '\@customer.example', '$name ' || i,
		   } . GatekeeperTest::sql_literal($body) . qq{ || ' ' || i,
		   CASE WHEN i % 3 = 0 THEN '<p>.html ' || i || '</p>' END
	  FROM generate_series(1, $n) AS i
	RETURNING id)
SELECT min(id) FROM m});

	ok( GatekeeperTest::poll_until(
			$node, 'postgres',
			"SELECT count(*) FROM gatekeeper.mail_status WHERE id >= $first AND state = 'sent'",
			$n, 60),
		"$name: every mail is sent");
	ok(GatekeeperTest::wait_for(sub { GatekeeperTest::sink_count($sink) >= $n }, 10),
		"$name: the relay has them");

	my %mail = map { my @f = split /\|/; $f[0] => { id => $f[1], i => $f[2] } }
	  split /\n/, $node->safe_psql('postgres',
		"SELECT message_id, id, id - $first + 1 FROM gatekeeper.mail_status WHERE id >= $first");
	my @got = GatekeeperTest::sink_messages($sink);
	is(scalar(@got), $n, "$name: $n messages at the relay, none twice");
	my $intact = 0;
	foreach my $msg (@got)
	{
		my $m = $mail{ $msg->{message_id} // '' } or next;
		my $text = GatekeeperTest::text_parts($msg);
		my $want = GatekeeperTest::normalize_text(Encode::decode('UTF-8', $body) . " $m->{i}");
		my $ok = GatekeeperTest::normalize_text($text->{'text/plain'}) eq $want;
		$ok &&= GatekeeperTest::normalize_text($text->{'text/html'}) eq
		  "<p>.html $m->{i}</p>"
		  if $m->{i} % 3 == 0;
		$intact++ if $ok;
		diag("$name: mail $m->{i} arrived as: $msg->{raw}") unless $ok;
	}
	is($intact, $n, "$name: every message arrived intact, dots and UTF-8 included");

	my @protos = map { /^X-Client-Proto: (\S+)/m ? $1 : '?' }
	  map { slurp_file($_->{file}) } @got;
	is(scalar(grep { $_ eq $proto } @protos), $n, "$name: the client spoke $proto");
	my @helos = map { /^X-Helo-Args: (.*)$/m ? $1 : '?' }
	  map { slurp_file($_->{file}) } @got;
	is(scalar(grep { $_ eq $helo } @helos), $n, "$name: it said $helo in EHLO/HELO");

	GatekeeperTest::stop_sink($sink);
}

#
# 2. A slow end-of-data: 16 connections keep going
#
{
	my $sink = GatekeeperTest::start_sink(port => $port, name => 'slow_dot', args => [ '-W', '.:1' ]);
	my $n = 64;
	my $start = time;
	my $first = $node->safe_psql(
		'postgres', qq{
WITH m AS (
	INSERT INTO gatekeeper.mail (recipient, subject, body)
	SELECT 'slow' || i || '\@customer.example', 'slow ' || i, 'Body ' || i
	  FROM generate_series(1, $n) AS i
	RETURNING id)
SELECT min(id) FROM m});
	ok( GatekeeperTest::poll_until(
			$node, 'postgres',
			"SELECT count(*) FROM gatekeeper.mail_status WHERE id >= $first AND state = 'sent'",
			$n, 90),
		"slow end-of-data: all $n mails are sent");
	my $took = time - $start;
	cmp_ok($took, '<', 10, sprintf("slow end-of-data: %d mails over 16 connections in %.1f s (1 s per reply)", $n, $took));
	is(GatekeeperTest::sink_count($sink), $n, "slow end-of-data: the relay has each once");

	my ($connections, $sent) = split /\|/, $node->safe_psql('postgres',
		"SELECT connections, sent_total FROM gatekeeper.worker_status");
	cmp_ok($sent, '>=', 36 + $n, "worker_status: sent_total counts the mail sent ($sent)");
	cmp_ok($connections, '>', 1, "worker_status: several relay connections ($connections)");
	GatekeeperTest::stop_sink($sink);
}

#
# 3. Every MAIL FROM refused: the relay's fault, not the mail's
#
{
	my $sink = GatekeeperTest::start_sink(
		port => $port,
		name => 'refuse_all',
		args => [ '-f', 'MAIL', '-B', '550 5.7.1 Client host rejected: go away' ]);
	my $n = 40;
	my $log_offset = -s $node->logfile;
	my $first = $node->safe_psql(
		'postgres', qq{
WITH m AS (
	INSERT INTO gatekeeper.mail (recipient, subject, body)
	SELECT 'refused' || i || '\@customer.example', 'refused ' || i, 'Body ' || i
	  FROM generate_series(1, $n) AS i
	RETURNING id)
SELECT min(id) FROM m});
	my $range = "id >= $first";
	ok( GatekeeperTest::poll_until(
			$node, 'postgres',
			"SELECT count(*) FROM gatekeeper.mail_status WHERE $range AND uncharged >= 2",
			$n, 60),
		'refused MAIL FROM: every mail was handed back, uncharged, twice');
	is( $node->safe_psql('postgres',
			"SELECT count(*) FILTER (WHERE state NOT IN ('scheduled', 'claimed')) || ',' || max(attempt - uncharged) FROM gatekeeper.mail_status WHERE $range"
		),
		'0,0',
		'refused MAIL FROM: no mail failed, no attempt was charged');
	my ($relay, $error) = split /\|/, $node->safe_psql('postgres',
		"SELECT relay, last_error FROM gatekeeper.worker_status");
	like($relay, qr/^(open|half-open)$/, "refused MAIL FROM: the breaker is open ($relay)");
	like($error, qr/550 5\.7\.1 Client host rejected/, 'refused MAIL FROM: worker_status says what the relay said');
	my $log = slurp_file($node->logfile, $log_offset);
	my $said = () = $log =~ /refuses its mail: .*550 5\.7\.1 Client host rejected/g;
	is($said, 1, 'refused MAIL FROM: the log says so once');
	GatekeeperTest::stop_sink($sink);

	my $ok_sink = GatekeeperTest::start_sink(port => $port, name => 'accept_again');
	ok( GatekeeperTest::poll_until(
			$node, 'postgres',
			"SELECT count(*) FROM gatekeeper.mail_status WHERE $range AND state = 'sent'",
			$n, 60),
		'relay fixed: every mail is sent');
	is( $node->safe_psql('postgres',
			"SELECT min(attempt - uncharged) || ',' || max(attempt - uncharged) FROM gatekeeper.mail_status WHERE $range"
		),
		'1,1',
		'relay fixed: one charged attempt each');
	ok( GatekeeperTest::poll_until(
			$node, 'postgres', "SELECT relay FROM gatekeeper.worker_status", 'closed', 30),
		'relay fixed: the breaker is closed');
	GatekeeperTest::stop_sink($ok_sink);
}

#
# 4. worker_status
#
is( $node->safe_psql('postgres',
		"SELECT count(*) || ',' || CASE WHEN bool_and(pid > 0 AND started <= now() AND last_success IS NOT NULL) THEN 't' ELSE 'f' END FROM gatekeeper.worker_status"
	),
	'1,t',
	'worker_status: one row for the one worker');

$node->stop;
done_testing();
