# Copyright: gatekeeper contributors

# Long and odd header values on the wire (issue 9, defect 9).  Mail goes
# through the background worker to a real SMTP relay (Postfix's smtp-sink)
# on loopback, and each received message is checked as a reader's software
# would see it: no line over 998 octets, header lines folded (at most 78
# octets wherever there is whitespace to fold at), each folded value
# unfolding to exactly the value enqueued, and only printable ASCII in the
# header.
#
# Mail enqueued before 0.2.0 was not validated as strictly: rows written
# with the trigger off stand in for it, and their messages must be just as
# well-formed (what cannot be folded is encoded, control characters too).

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $sink = GatekeeperTest::start_sink(name => 'headers');
my $node = GatekeeperTest::new_node('headers', sink => $sink);
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gatekeeper');

my $url = '<https://shop.example/unsubscribe?u=42&t=' . ('0123456789abcdef' x 4) . '>';
my $many_urls = join(', ', ($url) x 30);
my $long_url = '<https://shop.example/u/' . ('x' x 875) . '>';    # 900 octets

my %mails = (
	# the defect's List-Unsubscribe: 3,000 characters, many URLs
	unsubscribe => {
		subject => 'Many ways to leave',
		headers => { 'List-Unsubscribe' => $many_urls },
	},
	# long runs of spaces, kept as they are
	spaces => {
		subject => join(('  ' x 39), ('word') x 40),
		headers => { 'X-Pad' => join(' ' x 78, 'a' .. 'z') },
	},
	# a long subject of ordinary words
	words => {
		subject => join(' ', map { "word$_" } 1 .. 300),
		headers => {},
	},
	# the longest URL that fits a line, after text that fills one
	longest => {
		subject => 'Longest',
		headers => { 'X-Link' => ('y' x 70) . ' ' . ('z' x 70) . ' ' . $long_url . ' end' },
	},
);

my %id;
foreach my $key (sort keys %mails)
{
	my $m = $mails{$key};
	$id{$key} = $node->safe_psql(
		'postgres',
		sprintf(
			"SELECT gatekeeper.enqueue('%s\@customer.example', %s, 'Body', headers => %s::jsonb)",
			$key,
			GatekeeperTest::sql_literal($m->{subject}),
			GatekeeperTest::sql_literal(JSON::PP->new->canonical->encode($m->{headers}))));
}

# mail from before 0.2.0's checks: an unfoldable 3,000-octet URL, control
# characters and UTF-8 in angle brackets, a run of 1,500 spaces
my $old_url = '<https://shop.example/u/' . ('q' x 3000) . '>';
$node->safe_psql(
	'postgres', qq{
SET session_replication_role = replica;
WITH m AS (
	INSERT INTO gatekeeper.mail (recipient, subject, body, headers)
	VALUES ('old\@customer.example', 'a' || repeat(' ', 1500) || 'b', 'Body',
			jsonb_build_object('List-Unsubscribe', '$old_url',
							   'X-Ctl', E'<https://shop.example/\\x01\\x7f/d\\u00e9j\\u00e0>',
							   'X-Text', E'one \\x02 two'))
	RETURNING id, queue, priority, send_at, dedupe_key, segment)
-- past the trigger, so its live row (the claim state) is written here
INSERT INTO gatekeeper.mail_live (id, queue, priority, send_at, dedupe_key, segment)
SELECT * FROM m;
});

ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT count(*) FILTER (WHERE state = 'sent') || '/' || count(*) FROM gatekeeper.mail_status",
		'5/5', 60),
	'every mail was sent');
ok(GatekeeperTest::wait_for(sub { GatekeeperTest::sink_count($sink) >= 5 }, 10),
	'the relay has five messages');

my %got;
foreach my $msg (GatekeeperTest::sink_messages($sink))
{
	my ($to) = $msg->{rcpt}[0] =~ /<?([a-z]+)\@/;
	$got{$to} = $msg;
}

foreach my $key (sort(keys %mails), 'old')
{
	my $msg = $got{$key};
	ok($msg, "$key: received") or next;
	cmp_ok(GatekeeperTest::longest_line($msg), '<=', 998, "$key: no line over 998 octets");
	my ($head) = GatekeeperTest::split_head_body($msg->{raw});
	unlike($head, qr/[^\x20-\x7e\n\t]/, "$key: the header is printable ASCII");
}

foreach my $key (sort keys %mails)
{
	my $msg = $got{$key} or next;
	my $m = $mails{$key};
	is(GatekeeperTest::header($msg, 'Subject'), $m->{subject}, "$key: Subject unfolds to the value enqueued");
	foreach my $name (sort keys %{ $m->{headers} })
	{
		is(GatekeeperTest::header($msg, $name), $m->{headers}{$name},
			"$key: $name unfolds to the value enqueued");
	}

	# a line may pass 78 octets only when it holds one word (and the
	# whitespace around it), which leaves no place to fold
	my ($head) = GatekeeperTest::split_head_body($msg->{raw});
	my @long = grep { length($_) > 78 && !/^(?:[!-9;-~]+:)?[ \t]*[^ \t]+[ \t]*$/ } split /\n/, $head;
	is(scalar(@long), 0, "$key: folded to 78 octets") or diag(join("\n", @long));
}

# the old mail: folded, encoded where it could not be sent as it was
my $old = $got{old};
if ($old)
{
	is(GatekeeperTest::decode_header_text(GatekeeperTest::header($old, 'Subject')),
		'a' . (' ' x 1500) . 'b', 'old: the subject reads as enqueued');
	is(GatekeeperTest::decode_header_text(GatekeeperTest::header($old, 'List-Unsubscribe')),
		$old_url, 'old: the long URL reads as enqueued');
	like(GatekeeperTest::header($old, 'X-Text'), qr/^one .* two$/, 'old: text around a control character is kept');
}

$node->stop;
GatekeeperTest::stop_sink($sink);

done_testing();
