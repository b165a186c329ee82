# Copyright: gatekeeper contributors
#
# A templated mail reaches a real relay rendered (issue 48): the
# background worker claims mail that names a template, its version and
# data (enqueued by enqueue, INSERT ... SELECT and COPY), and Postfix's
# smtp-sink receives each customer's own subject, text, HTML (its
# values escaped) and header, from the version the mail was enqueued
# with, with the Message-ID the mail records.  A mail whose rendering is
# over gatekeeper.max_message_size fails alone, with its reason; the
# others of its claim are delivered.  metadata is never rendered.

use strict;
use warnings;
use utf8;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $sink = GatekeeperTest::start_sink(name => 'templates');
my $node = GatekeeperTest::new_node('templates', sink => $sink,
	conf => "gatekeeper.max_message_size = '64kB'\n");
$node->start;
$node->safe_psql('postgres', q{
CREATE EXTENSION gatekeeper;
SELECT gatekeeper.create_queue('campaign', background => false);
SELECT gatekeeper.create_template('spring', 'Hello {{first_name}}',
	E'Hi {{first_name}},\n{{#products}}- {{name}}\n{{/products}}{{^products}}nothing yet\n{{/products}}',
	'<p>Hi {{first_name}}</p><ul>{{#products}}<li>{{name}}</li>{{/products}}</ul>',
	'{"X-Customer": "{{id}}"}');
SELECT gatekeeper.create_template('huge', 'Huge', '{{#n}}{{{blob}}}{{/n}}');
CREATE TABLE customers (id int, email text, first_name text, products text[]);
INSERT INTO customers VALUES
	(1, 'ann@example.com', 'Ann', '{Tea,Cups}'),
	(2, 'bob@example.com', 'Bob & <Co>', '{Kettle}'),
	(3, 'cy@example.com', 'Cy', '{}');
});

# version 1 for the campaign; version 2, made after it was enqueued, is
# the version the later mail gets
$node->safe_psql('postgres', q{
INSERT INTO gatekeeper.mail (recipient, queue, template, data, metadata)
SELECT c.email, 'campaign', 'spring',
	   jsonb_build_object('id', c.id, 'first_name', c.first_name,
						  'products', (SELECT coalesce(jsonb_agg(jsonb_build_object('name', p)), '[]')
										 FROM unnest(c.products) p)),
	   '{"note": "{{first_name}}"}'
  FROM customers c;
SELECT gatekeeper.alter_template('spring', subject => 'Welcome back {{first_name}}');
SELECT gatekeeper.enqueue('dee@example.com', NULL, NULL, 'campaign', template => 'spring',
	data => '{"id": 4, "first_name": "Dee", "products": [{"name": "Pot"}]}');
});
# by COPY: one customer's mail, and one whose rendering (1,000 octets 70
# times) is past the limit though its data is not
$node->safe_psql('postgres', q{
COPY gatekeeper.mail (recipient, queue, template, template_version, data) FROM STDIN (FORMAT csv);
fay@example.com,campaign,spring,1,"{""id"": 6, ""first_name"": ""Fay"", ""products"": [{""name"": ""Jam""}]}"
\\.
INSERT INTO gatekeeper.mail (recipient, queue, template, data)
SELECT 'eve@example.com', 'campaign', 'huge',
	   jsonb_build_object('blob', repeat('x', 1000), 'n', (SELECT jsonb_agg(i) FROM generate_series(1, 70) i));
});
is($node->safe_psql('postgres', q{SELECT count(*) FROM gatekeeper.mail WHERE template IS NOT NULL}),
	'6', 'six templated mails enqueued');

# now the worker may send them
$node->safe_psql('postgres', q{SELECT gatekeeper.alter_queue('campaign', background => true)});
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		q{SELECT count(*) FILTER (WHERE state = 'sent') || '/' || count(*) FILTER (WHERE state = 'failed')
			FROM gatekeeper.mail_status WHERE queue = 'campaign'},
		'5/1', 60),
	'five templated mails sent, the one rendered past the limit failed');
ok(GatekeeperTest::wait_for(sub { GatekeeperTest::sink_count($sink) >= 5 }, 10, 'five messages'),
	'the relay received five messages');

my %expected = (
	'ann@example.com' => ['Hello Ann', "Hi Ann,\n- Tea\n- Cups\n", '<p>Hi Ann</p><ul><li>Tea</li><li>Cups</li></ul>', '1'],
	'bob@example.com' => ['Hello Bob & <Co>', "Hi Bob & <Co>,\n- Kettle\n",
		'<p>Hi Bob &amp; &lt;Co&gt;</p><ul><li>Kettle</li></ul>', '2'],
	'cy@example.com' => ['Hello Cy', "Hi Cy,\nnothing yet\n", '<p>Hi Cy</p><ul></ul>', '3'],
	'dee@example.com' => ['Welcome back Dee', "Hi Dee,\n- Pot\n", '<p>Hi Dee</p><ul><li>Pot</li></ul>', '4'],
	'fay@example.com' => ['Hello Fay', "Hi Fay,\n- Jam\n", '<p>Hi Fay</p><ul><li>Jam</li></ul>', '6'],
);
foreach my $rcpt (sort keys %expected)
{
	my ($subject, $text, $html, $id) = @{ $expected{$rcpt} };
	my @msgs = GatekeeperTest::sink_messages_to($sink, $rcpt);
	is(scalar(@msgs), 1, "$rcpt: one message");
	next unless @msgs;
	my $msg = $msgs[0];
	is(GatekeeperTest::decode_header_text(GatekeeperTest::header($msg, 'Subject')), $subject,
		"$rcpt: the subject rendered from its version");
	my $parts = GatekeeperTest::text_parts($msg);
	is(GatekeeperTest::normalize_text($parts->{'text/plain'}), GatekeeperTest::normalize_text($text),
		"$rcpt: the text rendered");
	is(GatekeeperTest::normalize_text($parts->{'text/html'}), GatekeeperTest::normalize_text($html),
		"$rcpt: the html rendered, its values escaped");
	is(GatekeeperTest::header($msg, 'X-Customer'), $id, "$rcpt: the template's header rendered");
	is($msg->{message_id}, $node->safe_psql('postgres',
		"SELECT message_id FROM gatekeeper.mail_status WHERE recipient = '$rcpt'"),
		"$rcpt: the Message-ID the mail records");
	unlike($msg->{raw}, qr/\{\{|note/, "$rcpt: nothing left unrendered, metadata not sent");
}
is($node->safe_psql('postgres',
	q{SELECT attempt || ' ' || last_error FROM gatekeeper.mail_status WHERE recipient = 'eve@example.com'}),
	'0 template "huge" could not be rendered: rendered body is larger than gatekeeper.max_message_size',
	'the mail over the limit failed alone, uncharged, with its reason');
is(scalar(GatekeeperTest::sink_messages_to($sink, 'eve@example.com')), 0, '... and was not sent');

# sent mail no longer holds its template
is($node->safe_psql('postgres', q{SELECT sum(in_use) FROM gatekeeper.templates}), '0',
	'no template in use once the mail is finished');

$node->stop;
GatekeeperTest::stop_sink($sink);
done_testing();
