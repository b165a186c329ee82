# Copyright: gatekeeper contributors

# What the relay receives is what was enqueued.  Mail with non-ASCII
# subjects and bodies (German, Cyrillic, emoji), an HTML alternative, the
# user's own headers, lines that start with "." (SMTP's end of data), a
# line alone holding ".", lines of thousands of characters and a subject
# longer than a header line goes through the background worker to a real
# SMTP relay (Postfix's smtp-sink) on loopback.  Each received message is
# parsed and decoded (RFC 2047 words, quoted-printable, base64) and
# compared with the row it came from: envelope, From, To, Subject,
# Message-ID, MIME structure, text, custom headers; no line over 998
# octets; only 7-bit octets on the wire.

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
use Time::HiRes qw(time);

my $default_sender = 'shop@example.com';

my @mails = (
	{
		key => 'german',
		subject => 'Grüße – 10 % Rabatt ✓',
		body => "Hallo Jörg,\n\nnur heute: 10 % Rabatt auf alle Größen – gültig bis Mitternacht ✓\n\nViele Grüße\nIhr Shop\n",
		html => '<html><body><p>Hallo Jörg,</p><p>nur heute: <b>10&nbsp;% Rabatt</b> auf alle Größen – gültig bis Mitternacht ✓</p></body></html>',
		headers => {
			'X-Campaign' => 'spring-sale-2025',
			'List-Unsubscribe' =>
			  '<mailto:unsubscribe@shop.example?subject=unsubscribe>, <https://shop.example/unsubscribe?u=42&c=spring-sale-2025>',
		},
	},
	{
		key => 'cyrillic',
		subject => 'Привет, мир! Скидка 10 % только сегодня',
		body => "Здравствуйте, Иван!\n\nМы рады предложить вам скидку 10 % на все товары.\nС уважением,\nМагазин\n",
	},
	{
		key => 'emoji',
		subject => '🎉 Party tonight 🎈🍕',
		body => "Bring friends 👯 and snacks 🍿.\nSee you 😀\n",
		html => "<p>Bring friends 👯 and snacks 🍿.</p>\n<p>See you 😀</p>",
	},
	{
		# ASCII with short lines: sent as 7bit, so the relay sees the dots
		# as they are and libcurl alone must dot-stuff them
		key => 'dots',
		subject => 'Dots at the start of lines',
		body => ".\n..\n.hidden line\nFrom the start of a line\n. \nmiddle . dot\n.\n\n.\nlast line",
	},
	{
		key => 'longline',
		subject => 'A line of 5000 characters',
		body => "before\n" . ('0123456789' x 500) . "\nafter\n",
	},
	{
		key => 'longutf8',
		subject => 'Eine lange Zeile',
		body => ('Größe ' x 1000) . "\n.\nEnde",
	},
	{
		key => 'longsubject',
		subject => join(' ', ('Überraschung') x 30) . ' ' . ('x' x 1000) . ' Ende',
		body => "short\n",
	},
	{
		key => 'sender',
		sender => 'news@brand.example',
		subject => 'Plain ASCII =?not-a-word?= test',
		body => "Hello,\r\nthis text uses CRLF line breaks.\r\nBye\r\n",
		headers => { 'X-Note' => 'Grüße aus Köln', 'X-Priority' => '3' },
	},
	{
		key => 'htmldots',
		subject => 'HTML with dots',
		body => "plain text\n",
		html => "<p>a</p>\n.\n..\n<p>" . ('y' x 3000) . "</p>\n",
	},
);

my $sink = GatekeeperTest::start_sink(name => 'content');
my $node = GatekeeperTest::new_node('content', sink => $sink);
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gatekeeper');

# one transaction: the commit wakes the worker
my $json = JSON::PP->new->canonical;
my $sql = "BEGIN;\n";
foreach my $m (@mails)
{
	$m->{recipient} = "$m->{key}\@customer.example";
	$sql .= sprintf(
		"SELECT gatekeeper.enqueue(recipient => %s, subject => %s, body => %s, html => %s, sender => %s, headers => %s);\n",
		GatekeeperTest::sql_literal($m->{recipient}),
		GatekeeperTest::sql_literal($m->{subject}),
		GatekeeperTest::sql_literal($m->{body}),
		GatekeeperTest::sql_literal($m->{html}),
		GatekeeperTest::sql_literal($m->{sender}),
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
		'0', 60),
	'the worker finished every mail');

is( $node->safe_psql(
		'postgres',
		"SELECT string_agg(recipient || ': ' || state || coalesce(' (' || last_error || ')', ''), ', ' ORDER BY id) "
		  . "FROM gatekeeper.mail_status WHERE state <> 'sent'"),
	'',
	'every mail is sent');

ok(GatekeeperTest::wait_for(sub { GatekeeperTest::sink_count($sink) >= $n }, 10,
		"$n messages at the relay"),
	"the relay received $n messages");

my %db;
foreach my $row (
	split /\n/,
	$node->safe_psql(
		'postgres',
		"SELECT recipient, message_id, attempt FROM gatekeeper.mail_status ORDER BY id"))
{
	my ($rcpt, $mid, $attempt) = split /\|/, $row;
	$db{$rcpt} = { message_id => $mid, attempt => $attempt };
}

my @received = GatekeeperTest::sink_messages($sink);
is(scalar(@received), $n, "exactly $n messages at the relay");
my %by_id;
push @{ $by_id{ $_->{message_id} // '' } }, $_ foreach @received;

my %ids_seen;
foreach my $m (@mails)
{
	my $key = $m->{key};
	my $row = $db{ $m->{recipient} };
	subtest "mail $key" => sub {
		ok(defined $row, 'the mail is in the table') or return;
		like($row->{message_id}, qr/^<[^<>\s@]+@[^<>\s@]+>$/, 'the mail has a Message-ID');
		ok(!$ids_seen{ $row->{message_id} }++, 'its Message-ID is unique');
		is($row->{attempt}, 1, 'sent on its first attempt');

		my $copies = $by_id{ $row->{message_id} } // [];
		is(scalar(@$copies), 1, 'the relay received it exactly once') or return;
		my $msg = $copies->[0];

		my $from = $m->{sender} // $default_sender;
		is($msg->{mail_from}, "<$from>", 'envelope sender');
		is_deeply($msg->{rcpt}, ["<$m->{recipient}>"], 'envelope recipient');

		foreach my $h ('Date', 'From', 'To', 'Subject', 'Message-ID', 'MIME-Version')
		{
			is(scalar(@{ $msg->{headers}{ lc $h } // [] }), 1, "one $h header");
		}
		is(GatekeeperTest::header($msg, 'Message-ID'), $row->{message_id},
			'Message-ID is gatekeeper.mail.message_id');
		is(GatekeeperTest::header($msg, 'From'), $from, 'From');
		is(GatekeeperTest::header($msg, 'To'), $m->{recipient}, 'To');
		like(
			GatekeeperTest::header($msg, 'Date'),
			qr/^(Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d{1,2} (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) \d{4} \d\d:\d\d:\d\d [+-]\d{4}$/,
			'Date in RFC 5322 form');
		is(GatekeeperTest::header($msg, 'MIME-Version'), '1.0', 'MIME-Version');
		is(GatekeeperTest::decode_header_text(GatekeeperTest::header($msg, 'Subject')),
			$m->{subject}, 'Subject decodes to what was enqueued');

		my $text = GatekeeperTest::text_parts($msg);
		if (defined $m->{html})
		{
			is($text->{_type}, 'multipart/alternative', 'multipart/alternative');
			is_deeply($text->{_parts}, [ 'text/plain', 'text/html' ],
				'a text/plain part, then a text/html part');
			is( GatekeeperTest::normalize_text($text->{'text/html'}),
				GatekeeperTest::normalize_text($m->{html}),
				'the HTML decodes to what was enqueued');
		}
		else
		{
			is($text->{_type}, 'text/plain', 'a single text/plain part');
		}
		is( GatekeeperTest::normalize_text($text->{'text/plain'}),
			GatekeeperTest::normalize_text($m->{body}),
			'the text decodes to what was enqueued');

		foreach my $h (sort keys %{ $m->{headers} // {} })
		{
			my $value = GatekeeperTest::header($msg, $h);
			is(GatekeeperTest::decode_header_text($value), $m->{headers}{$h},
				"header $h decodes to what was enqueued");
			is($value, $m->{headers}{$h}, "header $h is sent as written (ASCII)")
			  if $m->{headers}{$h} !~ /[^\x00-\x7f]/;
		}

		my $longest = GatekeeperTest::longest_line($msg);
		cmp_ok($longest, '<=', 998, "no line over 998 octets (longest: $longest)");
		unlike($msg->{raw}, qr/[^\x00-\x7f]/, 'only 7-bit octets on the wire');
	};
}

$node->stop;
GatekeeperTest::stop_sink($sink);

done_testing();
