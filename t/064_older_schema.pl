# Copyright: gatekeeper contributors

# The library serves the current schema only (SPEC "Versions", issue 26):
# a database whose extension is older (here 0.2.0, installed by CREATE
# EXTENSION gatekeeper VERSION '0.2.0' with this library loaded) holds
# mail that 0.2.0's library enqueued before the upgrade.  Until ALTER
# EXTENSION gatekeeper UPDATE:
#
#  - the worker says once in the log that the update is needed (with the
#    hint ALTER EXTENSION gatekeeper UPDATE), and nothing else: over several
#    of its rounds no further message, and no mail reaches the relay;
#  - a 0.2.0 function whose C code is gone (claim, ack_batch, an INSERT
#    into gatekeeper.mail through its trigger) fails with SQLSTATE 0A000
#    and that same message, and writes nothing.
#
# After ALTER EXTENSION gatekeeper UPDATE, without a restart, the worker
# delivers the mail: each Message-ID once at the relay, each mail sent.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use GatekeeperTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $sink = GatekeeperTest::start_sink(name => 'older');
my $node = GatekeeperTest::new_node('older', sink => $sink);
$node->start;

my $current = $node->safe_psql('postgres',
	"SELECT default_version FROM pg_available_extensions WHERE name = 'gatekeeper'");
isnt($current, '0.2.0', "the library's version ($current) is newer than 0.2.0");

my $log_offset = -s $node->logfile;
$node->safe_psql('postgres', "CREATE EXTENSION gatekeeper VERSION '0.2.0'");
is($node->safe_psql('postgres', "SELECT extversion FROM pg_extension WHERE extname = 'gatekeeper'"),
	'0.2.0', '0.2.0 installed');

# Mail as 0.2.0's library wrote it before the new one was installed: the
# content in gatekeeper.mail, the claim state in mail_live, the queue's
# count in mail_live_count (0.2.0's insert trigger wrote the last two;
# the C triggers are bypassed here, as they belong to the old library).
my $n = 5;
$node->safe_psql(
	'postgres', qq{
BEGIN;
ALTER TABLE gatekeeper.mail DISABLE TRIGGER USER;
ALTER TABLE gatekeeper.mail_live DISABLE TRIGGER USER;
INSERT INTO gatekeeper.mail (recipient, subject, body, segment)
SELECT 'old' || i || '\@customer.example', 'Old ' || i, 'Body ' || i, 0
  FROM generate_series(1, $n) AS i;
INSERT INTO gatekeeper.mail_live (id, queue, priority, send_at, dedupe_key, segment)
SELECT id, queue, priority, send_at, dedupe_key, segment FROM gatekeeper.mail;
INSERT INTO gatekeeper.mail_live_count (queue, slot, scheduled) VALUES ('default', 0, $n);
ALTER TABLE gatekeeper.mail ENABLE TRIGGER USER;
ALTER TABLE gatekeeper.mail_live ENABLE TRIGGER USER;
COMMIT;
});
is($node->safe_psql('postgres', "SELECT count(*) FROM gatekeeper.mail_status WHERE state = 'scheduled'"),
	$n, "$n mails scheduled in 0.2.0's tables");

# the worker's message: once, after it looked
my $message = qr/extension gatekeeper in database "postgres" is version 0\.2\.0, but its library serves \Q$current\E/;
ok( GatekeeperTest::wait_for(
		sub { slurp_file($node->logfile, $log_offset) =~ $message }, 60,
		'the update-needed message'),
	'the worker logs that the extension must be updated');
# then several of its rounds (naptime 1 s, housekeeping every 5 s)
my $until = time + 7;
usleep(100_000) while time < $until;
my $log = slurp_file($node->logfile, $log_offset);
my @said = $log =~ /$message/g;
is(scalar(@said), 1, 'the worker says it once over several rounds');
like($log, qr/$message[^\n]*\n(?:[^\n]*\n)*?[^\n]*HINT:\s+Run ALTER EXTENSION gatekeeper UPDATE\./,
	'... with the hint ALTER EXTENSION gatekeeper UPDATE');
unlike($log, qr/\b(?:ERROR|FATAL|PANIC):|terminated by signal/, '... and no error, no crash');
is(GatekeeperTest::sink_count($sink), 0, 'no mail reaches the relay before the update');
is($node->safe_psql('postgres', "SELECT count(*) FROM gatekeeper.mail_status WHERE state = 'scheduled'"),
	$n, '... and every mail is still scheduled');

# A 0.2.0 function whose C code is gone: its SQLSTATE and message, and
# nothing written.
$node->safe_psql(
	'postgres', q{
CREATE FUNCTION public.try(q text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE q;
	RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE || ' ' || SQLERRM;
END
$$;});
my $refused = qr/^0A000 extension gatekeeper in database "postgres" is version 0\.2\.0, but its library serves \Q$current\E$/;
like($node->safe_psql('postgres', q{SELECT public.try('SELECT * FROM gatekeeper.claim(''app'', 10)')}),
	$refused, 'claim() raises 0A000 with the message');
like($node->safe_psql('postgres', q{SELECT public.try('SELECT gatekeeper.ack_batch(''{1}'', ''{1}'')')}),
	$refused, 'ack_batch() raises 0A000 with the message');
like( $node->safe_psql(
		'postgres',
		q{SELECT public.try('SELECT gatekeeper.enqueue(''new@customer.example'', ''New'', ''Body'')')}),
	$refused, 'enqueue() (the insert trigger of gatekeeper.mail) raises 0A000 with the message');
is($node->safe_psql('postgres',
		"SELECT count(*) FILTER (WHERE state = 'scheduled') || '/' || count(*) FROM gatekeeper.mail_status"),
	"$n/$n", '... and nothing was written');

# the update, without a restart: the mail goes, each Message-ID once
$node->safe_psql('postgres', 'ALTER EXTENSION gatekeeper UPDATE');
is($node->safe_psql('postgres', "SELECT extversion FROM pg_extension WHERE extname = 'gatekeeper'"),
	$current, "ALTER EXTENSION gatekeeper UPDATE reaches $current");
ok( GatekeeperTest::poll_until(
		$node, 'postgres',
		"SELECT count(*) FILTER (WHERE state = 'sent') = $n FROM gatekeeper.mail_status", 't', 60),
	'after the update every mail is sent');
my %expected = map { $_ => 1 } split /\n/,
  $node->safe_psql('postgres', 'SELECT message_id FROM gatekeeper.mail_status ORDER BY id');
is(scalar(keys %expected), $n, "$n distinct Message-IDs");
ok(GatekeeperTest::wait_for(sub { GatekeeperTest::sink_count($sink) >= $n }, 30, 'the relay'),
	'the relay received the mail');
my %seen;
$seen{ $_->{message_id} // '' }++ foreach GatekeeperTest::sink_messages($sink);
is_deeply(\%seen, { map { $_ => 1 } keys %expected },
	'the relay received each mail once, by Message-ID');
@said = slurp_file($node->logfile, $log_offset) =~ /$message/g;
is(scalar(@said), 1, 'the update-needed message was not said again');

$node->stop;
GatekeeperTest::stop_sink($sink);
done_testing();
