# Copyright: gatekeeper contributors

# Mail arrives intact through a real Postfix smtpd offering CHUNKING: the
# worker sends every message with BDAT (RFC 3030), not DATA, and what
# Postfix accepted (passed on to an smtp-sink behind it) is what was
# enqueued: envelope, Message-ID (the row's), headers, the text decoded,
# and, for a 7-bit body, the body octet for octet (BDAT carries the
# message as is: a client that dot-stuffed it would add dots).
#
# Needs gatekeeper.helo_name (the private Postfix rejects a bare EHLO name
# with reject_non_fqdn_helo_hostname).

use strict;
use warnings;
use utf8;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $pf = GatekeeperTest::start_postfix(name => 'pf_bdat');
my $node = GatekeeperTest::new_node(
	'bdat',
	smtp_url => $pf->{url},
	conf => "gatekeeper.helo_name = 'mta.example.com'\n"
	  . "gatekeeper.smtp_connections = 4\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gatekeeper');

my @mails = (
	{
		key => 'dots',
		subject => 'Dots at the start of lines',
		body => ".\n..\n.hidden line\nFrom the start of a line\n. \nmiddle . dot\n.\n\n.\nlast line\n",
		raw => 1,
	},
	{
		key => 'ascii',
		subject => 'Plain ASCII',
		body => join('', map { "Line $_ of a plain message, short enough for 7bit.\n" } 1 .. 200),
		headers => { 'X-Campaign' => 'bdat-2026' },
		raw => 1,
	},
	{
		key => 'german',
		subject => 'Grüße – 10 % Rabatt ✓',
		body => "Hallo Jörg,\n\nnur heute: 10 % Rabatt auf alle Größen ✓\n",
		html => '<p>Hallo Jörg, <b>10&nbsp;% Rabatt</b> ✓</p>',
	},
	{
		key => 'longline',
		subject => 'A line of 5000 characters',
		body => "before\n" . ('0123456789' x 500) . "\n.\nafter\n",
	},
	{
		key => 'emoji',
		subject => '🎉 Party tonight',
		body => "Bring friends 👯\n.\n..\n",
	},
);

my $json = JSON::PP->new->canonical;
my $sql = "BEGIN;\n";
foreach my $m (@mails)
{
	$m->{recipient} = "$m->{key}\@customer.example";
	$sql .= sprintf(
		"SELECT gatekeeper.enqueue(recipient => %s, subject => %s, body => %s, html => %s, headers => %s);\n",
		GatekeeperTest::sql_literal($m->{recipient}),
		GatekeeperTest::sql_literal($m->{subject}),
		GatekeeperTest::sql_literal($m->{body}),
		GatekeeperTest::sql_literal($m->{html}),
		$m->{headers}
		? GatekeeperTest::sql_literal($json->encode($m->{headers})) . '::jsonb'
		: 'NULL');
}
$sql .= "COMMIT;\n";
GatekeeperTest::psql_utf8($node, 'postgres', $sql);
my $n = scalar(@mails);

ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT count(*) FROM gatekeeper.mail_status WHERE state IN ('scheduled', 'claimed')",
		'0', 30),
	'the worker finished every mail');
is( $node->safe_psql(
		'postgres',
		"SELECT string_agg(recipient || ': ' || state || coalesce(' (' || last_error || ')', ''), ', ' ORDER BY id) FROM gatekeeper.mail_status WHERE state <> 'sent'"
	),
	'',
	'every mail is sent');
ok( GatekeeperTest::wait_for(sub { GatekeeperTest::sink_count($pf->{sink}) >= $n },
		10, "$n messages behind Postfix"),
	"Postfix accepted $n messages");

my %db;
foreach my $row (
	split /\n/,
	$node->safe_psql('postgres',
		'SELECT recipient, message_id FROM gatekeeper.mail_status ORDER BY id'))
{
	my ($rcpt, $mid) = split /\|/, $row;
	$db{$rcpt} = $mid;
}

my %by_id;
push @{ $by_id{ $_->{message_id} // '' } }, $_
  foreach GatekeeperTest::sink_messages($pf->{sink});

foreach my $m (@mails)
{
	subtest "mail $m->{key}" => sub {
		my $mid = $db{ $m->{recipient} };
		ok(defined $mid, 'the mail is in the table') or return;
		my $copies = $by_id{$mid} // [];
		is(scalar(@$copies), 1, 'Postfix accepted it exactly once, with its Message-ID')
		  or return;
		my $msg = $copies->[0];
		is_deeply($msg->{rcpt}, ["<$m->{recipient}>"], 'envelope recipient');
		is(GatekeeperTest::header($msg, 'To'), $m->{recipient}, 'To');
		is(GatekeeperTest::decode_header_text(GatekeeperTest::header($msg, 'Subject')),
			$m->{subject}, 'Subject');
		foreach my $h (sort keys %{ $m->{headers} // {} })
		{
			is(GatekeeperTest::header($msg, $h), $m->{headers}{$h}, "header $h");
		}
		my $text = GatekeeperTest::text_parts($msg);
		is( GatekeeperTest::normalize_text($text->{'text/plain'}),
			GatekeeperTest::normalize_text($m->{body}),
			'the text decodes to what was enqueued');
		if (defined $m->{html})
		{
			is( GatekeeperTest::normalize_text($text->{'text/html'}),
				GatekeeperTest::normalize_text($m->{html}),
				'the HTML decodes to what was enqueued');
		}
		if ($m->{raw})
		{
			# a 7-bit body with short lines goes as it is
			is($msg->{body}, $m->{body}, 'the body arrived octet for octet');
		}
		my $longest = GatekeeperTest::longest_line($msg);
		cmp_ok($longest, '<=', 998, "no line over 998 octets ($longest)");
	};
}

# how the worker talked to Postfix: Postfix logs each session's commands
# when it ends, and the worker keeps its connections for reuse, so look
# once the node is stopped
$node->stop;
GatekeeperTest::wait_for(sub { GatekeeperTest::postfix_command_count($pf, 'bdat') + GatekeeperTest::postfix_command_count($pf, 'data') >= $n },
	15, 'the worker\'s sessions in Postfix\'s log');
my $bdat = GatekeeperTest::postfix_command_count($pf, 'bdat');
my $data = GatekeeperTest::postfix_command_count($pf, 'data');
cmp_ok($bdat, '>=', $n, "the messages went with BDAT ($bdat BDAT commands)")
  or diag(slurp_file($pf->{log}));
is($data, 0, 'no DATA command: CHUNKING is used when offered');
GatekeeperTest::stop_postfix($pf);

done_testing();
