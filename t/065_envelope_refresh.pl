# Copyright: gatekeeper contributors

# The worker keeps what a mail's envelope needs, its queue's return_path
# and the HMAC key of its VERP token, from one claim to the next instead
# of reading them for every mail (issue 26).  What it keeps must follow
# the database: mail claimed after alter_queue changed or removed a
# return_path, or after the secret changed, goes out with what the
# database holds then.  Each mail is found on the wire (Postfix's
# smtp-sink) by its Message-ID, and its MAIL FROM compared with the
# return_path and the token gatekeeper._verp_token gives for it.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $sink = GatekeeperTest::start_sink(name => 'envelope');
my $node = GatekeeperTest::new_node('envelope', sink => $sink);
$node->start;
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION gatekeeper;
SELECT gatekeeper.create_queue('rp', return_path => 'bounces+{token}@one.example');
});

# send one mail through queue rp; returns its id once the relay has it
my $n = 0;
sub send_one
{
	$n++;
	my $id = $node->safe_psql('postgres',
		"SELECT gatekeeper.enqueue('r$n\@example.com', 'Mail $n', 'Hello', 'rp', sender => 'shop\@shop.example')");
	ok( GatekeeperTest::poll_until(
			$node, 'postgres',
			"SELECT state FROM gatekeeper.mail_status WHERE id = $id", 'sent', 30),
		"mail $n is sent");
	return $id;
}

# the MAIL FROM path the relay received for mail $id
sub mail_from
{
	my ($id) = @_;
	my @got;
	GatekeeperTest::wait_for(
		sub {
			@got = grep { ($_->{message_id} // '') =~ /^<\Q$id\E\./ }
			  GatekeeperTest::sink_messages($sink);
			return @got == 1;
		},
		15);
	is(scalar @got, 1, "the relay received mail $id once");
	return @got ? $got[0]{mail_from} : '';
}

sub token
{
	my ($id) = @_;
	return $node->safe_psql('postgres', "SELECT gatekeeper._verp_token($id)");
}

my $id = send_one();
is(mail_from($id), '<bounces+' . token($id) . '@one.example>',
	'the first mail goes with the queue\'s return_path and its token');

$node->safe_psql('postgres',
	"SELECT gatekeeper.alter_queue('rp', return_path => 'bounces+{token}\@two.example')");
$id = send_one();
is(mail_from($id), '<bounces+' . token($id) . '@two.example>',
	'mail claimed after alter_queue goes with the new return_path');

$node->safe_psql('postgres',
	"UPDATE gatekeeper.unsubscribe_secret SET secret = decode(repeat('5a', 48), 'hex')");
$id = send_one();
my $token = token($id);
is(mail_from($id), "<bounces+$token\@two.example>",
	'mail claimed after the secret changed carries a token signed with the new secret');
$node->safe_psql('postgres',
	"UPDATE gatekeeper.unsubscribe_secret SET secret = decode(repeat('a5', 32), 'hex')");
isnt(token($id), $token, 'the token depends on the secret');

$node->safe_psql('postgres', "SELECT gatekeeper.alter_queue('rp', return_path => '')");
$id = send_one();
is(mail_from($id), '<shop@shop.example>',
	'mail claimed after the return_path was removed goes with its sender');

$node->stop;
GatekeeperTest::stop_sink($sink);

done_testing();
