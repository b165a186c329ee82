# Copyright: gatekeeper contributors
#
# Templated mail enqueued by the enqueue-only role, connected as itself,
# reaches a real relay as the docs say (issue 48; docs/reference.md,
# "Templated mail" and "Who may do what with templates"): the background
# worker renders and sends it; the mail's own header replaces the
# template's of the same name in any case, so one header of that name goes
# on the wire, with the mail's value; template syntax in the role's data
# goes out as it is; a line break in a rendered subject or header value
# fails that mail alone and injects no header, the others being sent; the
# role cannot read or render the template it used (42501).

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $sink = GatekeeperTest::start_sink(name => 'template_roles');
my $node = GatekeeperTest::new_node('template_roles', sink => $sink);
$node->start;
$node->safe_psql('postgres', q{
CREATE EXTENSION gatekeeper;
SELECT gatekeeper.create_queue('offers', background => false);
SELECT gatekeeper.create_template('offer', 'Offer for {{first_name}}',
	'Hello {{first_name}}, {{#items}}[{{.}}]{{/items}}',
	'<p>{{first_name}}</p>',
	'{"X-Campaign": "spring-{{first_name}}", "X-Ref": "r-{{ref}}"}');
CREATE ROLE app_enqueue LOGIN;
SELECT gatekeeper.grant('app_enqueue', 'enqueue');
});

# what the application does, connected as its own role
my ($ret, $out, $err) = $node->psql('postgres', q{
SELECT gatekeeper.enqueue('own@example.com', NULL, NULL, 'offers', template => 'offer',
	data => '{"first_name": "Own", "ref": "1"}', headers => '{"x-campaign": "mine"}');
SELECT gatekeeper.enqueue('same@example.com', NULL, NULL, 'offers', template => 'offer',
	data => '{"first_name": "Same", "ref": "2"}', headers => '{"X-Campaign": "mine too {{first_name}}"}');
INSERT INTO gatekeeper.mail (recipient, queue, template, data) VALUES
	('inject@example.com', 'offers', 'offer',
	 '{"first_name": "{{ref}}", "ref": "3", "items": ["{{#items}}", "{{> x}}"]}'),
	('crlf@example.com', 'offers', 'offer',
	 '{"first_name": "Cy", "ref": "4\r\nBcc: victim@example.com"}');
}, extra_params => [ '-U', 'app_enqueue', '-v', 'ON_ERROR_STOP=1' ]);
is($ret, 0, 'the enqueue role enqueues templated mail by enqueue and INSERT') or diag($err);
is($node->safe_psql('postgres', q{SELECT count(*) FROM gatekeeper.mail WHERE queue = 'offers'}),
	'4', 'four mails enqueued');

# ... and cannot read or render the template
foreach my $try ([ 'render', q{SELECT * FROM gatekeeper.render('offer', '{}')} ],
	[ 'the table', q{SELECT subject FROM gatekeeper.template} ],
	[ 'alter_template', q{SELECT gatekeeper.alter_template('offer', subject => 'x')} ])
{
	my ($r, $o, $e) = $node->psql('postgres', $try->[1],
		extra_params => [ '-U', 'app_enqueue', '-v', 'VERBOSITY=verbose' ]);
	like($e, qr/ERROR:\s+42501: permission denied/, "the enqueue role may not use $try->[0]");
}

$node->safe_psql('postgres', q{SELECT gatekeeper.alter_queue('offers', background => true)});
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		q{SELECT count(*) FILTER (WHERE state = 'sent') || '/' || count(*) FILTER (WHERE state = 'failed')
			FROM gatekeeper.mail_status WHERE queue = 'offers'},
		'3/1', 60),
	'three mails sent, the one with a line break in a header value failed');
ok(GatekeeperTest::wait_for(sub { GatekeeperTest::sink_count($sink) >= 3 }, 10, 'three messages'),
	'the relay received three messages');
is(GatekeeperTest::sink_count($sink), 3, 'and no more');

my %campaign = (
	'own@example.com' => 'mine',
	'same@example.com' => 'mine too {{first_name}}',
	'inject@example.com' => 'spring-{{ref}}');
foreach my $rcpt (sort keys %campaign)
{
	my @msgs = GatekeeperTest::sink_messages_to($sink, $rcpt);
	is(scalar(@msgs), 1, "$rcpt: one message");
	next unless @msgs;
	my $values = $msgs[0]{headers}{'x-campaign'} // [];
	is(scalar(@$values), 1, "$rcpt: one X-Campaign header");
	is($values->[0], $campaign{$rcpt}, "$rcpt: X-Campaign is the mail's own, else the template's");
}
my ($inject) = GatekeeperTest::sink_messages_to($sink, 'inject@example.com');
is(GatekeeperTest::decode_header_text(GatekeeperTest::header($inject, 'Subject')),
	'Offer for {{ref}}', 'template syntax in data is sent as it is, in the subject');
like(GatekeeperTest::text_parts($inject)->{'text/plain'}, qr/\Q[{{#items}}][{{> x}}]\E/,
	'... and in the text');
is(scalar(GatekeeperTest::sink_messages_to($sink, 'victim@example.com')), 0,
	'no header was injected');
is($node->safe_psql('postgres',
	q{SELECT attempt || ' ' || last_error FROM gatekeeper.mail_status WHERE recipient = 'crlf@example.com'}),
	'0 template "offer" could not be rendered: rendered header "X-Ref" must not contain a line break',
	'the mail with a line break failed alone, uncharged, naming the part and not the data');

$node->stop;
GatekeeperTest::stop_sink($sink);
done_testing();
