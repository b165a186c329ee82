# Copyright: gatekeeper contributors

# DKIM signing (issue 27, item 6).  gatekeeper.dkim_key_table names an
# OpenDKIM KeyTable of an RSA 2048 key (shop.example), an Ed25519 key
# (ed.example), a key of a parent domain (corp.example, for senders in
# mail.news.corp.example) and both kinds for one domain (dual.example:
# two signatures).  Mail from each, and from a domain without a key, goes
# through three relays in turn: a private Postfix offering CHUNKING and
# PIPELINING (the worker sends BDAT), the same without them (DATA, the
# client dot-stuffing), and t/relay.py (aiosmtpd: DATA, the octets kept
# exactly as received).  Every message the relay received (plain ASCII
# with lines starting with '.', trailing whitespace and blank lines at the
# end; multipart with UTF-8 subject and body, long folded headers,
# Reply-To, List-Unsubscribe and the queue's Feedback-ID; 5 MB bodies) is
# verified by two independent verifiers with the public keys given
# through their DNS hooks: dkimpy (t/dkim_verify.py) and Perl's
# Mail::DKIM.  Debian's Mail::DKIM (1.20230212) has no ed25519-sha256: the
# test gives it one (its own canonicalization and body hash, the
# signature checked with openssl pkeyutl), see mail_dkim_verify.
#
# A tampered message fails both verifiers.  Mail without a key goes
# unsigned and is counted in worker_status.unsigned_total.  A key table or
# key that cannot be used (a key readable by others, a short RSA key, a
# bad line, a missing file, a key given inline) is refused by ALTER
# SYSTEM with the reason, and at reload the worker says why in the log and
# sends nothing until it is fixed, and then sends the held mail signed.
# No key material reaches the log.

use strict;
use warnings;
use utf8;

use FindBin;
use lib $FindBin::RealBin;

use Encode ();
use GatekeeperTest;
use JSON::PP;
use MIME::Base64 qw(encode_base64 decode_base64);
use Mail::DKIM::Verifier;
use Net::DNS;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $tmp = PostgreSQL::Test::Utils::tempdir('dkim');
my $keys = "$tmp/keys";
mkdir $keys or die "mkdir $keys: $!";

# --- keys, their DNS records, the key table --------------------------------

sub openssl
{
	my @args = @_;
	my ($out, $err);
	IPC::Run::run([ 'openssl', @args ], '>', \$out, '2>', \$err)
	  or die "openssl @args failed: $err";
	return $out;
}

# a private key in PEM, 0600, and its DNS TXT record
sub make_key
{
	my ($name, $type) = @_;
	my $file = "$keys/$name.key";
	if ($type eq 'ed25519')
	{
		openssl('genpkey', '-algorithm', 'ed25519', '-out', $file);
	}
	else
	{
		openssl('genpkey', '-algorithm', 'RSA', '-pkeyopt', "rsa_keygen_bits:$type", '-out', $file);
	}
	chmod 0600, $file or die "chmod $file: $!";
	openssl('pkey', '-in', $file, '-pubout', '-outform', 'DER', '-out', "$file.pub.der");
	my $der = slurp_file("$file.pub.der");
	# RFC 8463: an Ed25519 record holds the raw 32-octet key, RSA the SPKI
	my $p = $type eq 'ed25519' ? encode_base64(substr($der, -32), '') : encode_base64($der, '');
	my $k = $type eq 'ed25519' ? 'ed25519' : 'rsa';
	return ($file, "v=DKIM1; k=$k; p=$p");
}

my ($rsa_key, $rsa_txt) = make_key('rsa2048', 2048);
my ($ed_key, $ed_txt) = make_key('ed25519', 'ed25519');
my ($corp_key, $corp_txt) = make_key('corp', 2048);
my ($weak_key) = make_key('weak', 512);

my %dns = (
	'rsa2026._domainkey.shop.example' => $rsa_txt,
	'ed2026._domainkey.ed.example' => $ed_txt,
	'corp._domainkey.corp.example' => $corp_txt,
	'rsa._domainkey.dual.example' => $rsa_txt,
	'ed._domainkey.dual.example' => $ed_txt,
);
my $dns_file = "$tmp/dns.json";
PostgreSQL::Test::Utils::append_to_file($dns_file, JSON::PP->new->canonical->encode(\%dns));

my $table = "$tmp/KeyTable";
PostgreSQL::Test::Utils::append_to_file(
	$table, <<"END_TABLE");
# gatekeeper's test keys, OpenDKIM KeyTable format

shop	shop.example:rsa2026:$rsa_key
ed      ed.example:ed2026:$ed_key     # Ed25519 (RFC 8463)
corp corp.example:corp:$corp_key
  dual-rsa   dual.example:rsa:$rsa_key
dual-ed dual.example:ed:$ed_key
END_TABLE

# a line of each private key, which must never reach a log
my %secret_lines = map { $_ => (split /\n/, slurp_file($_))[1] } ($rsa_key, $ed_key, $corp_key);

# --- the two verifiers -------------------------------------------------------

# dkimpy over message files: { file => [ { d, a, result } ... ] }
sub dkimpy_verify
{
	my @files = @_;
	my ($out, $err);
	IPC::Run::run([ $GatekeeperTest::PYTHON, "$FindBin::RealBin/dkim_verify.py", $dns_file, @files ],
		'>', \$out, '2>', \$err)
	  or die "dkim_verify.py failed: $err";
	note("dkimpy: $err") if $err;
	my %r;
	foreach my $line (split /\n/, $out)
	{
		my ($file, $i, $d, $a, $result) = split / /, $line;
		$r{$file} //= [];
		push @{ $r{$file} }, { d => $d, a => $a, result => $result } if $i ne '-';
	}
	return \%r;
}

# Mail::DKIM's DNS lookups answered from %dns
{
	no warnings qw(redefine once);
	*Mail::DKIM::DNS::query = sub {
		my ($name, $type) = @_;
		my $txt = $dns{ lc $name };
		return () unless defined $txt && $type eq 'TXT';
		# character-strings of at most 255 octets, joined by the verifier
		return Net::DNS::RR->new(
			name => $name,
			type => 'TXT',
			txtdata => [ $txt =~ /(.{1,250})/gs ]);
	};

	# ed25519-sha256 (RFC 8463) for Mail::DKIM 1.20230212, which has
	# none: its canonicalization and body hash (as for rsa-sha256), the
	# signature over the SHA-256 hash of the header data checked with
	# openssl pkeyutl
	my $class = \&Mail::DKIM::Signature::get_algorithm_class;
	*Mail::DKIM::Signature::get_algorithm_class = sub {
		return 'GkTestEd25519' if $_[1] eq 'ed25519-sha256';
		return $class->(@_);
	};
	my $hash = \&Mail::DKIM::Signature::hash_algorithm;
	*Mail::DKIM::Signature::hash_algorithm = sub {
		return 'sha256' if ($_[0]->algorithm // '') eq 'ed25519-sha256';
		return $hash->(@_);
	};
	my $check = \&Mail::DKIM::PublicKey::check;
	*Mail::DKIM::PublicKey::check = sub {
		my ($self) = @_;
		if (($self->get_tag('k') // '') eq 'ed25519')
		{
			die "invalid data\n" unless length(decode_base64($self->data // '')) == 32;
			return 1;
		}
		return $check->(@_);
	};
	# the key's size, which the verifier asks of the RSA object
	my $cork = \&Mail::DKIM::Key::cork;
	*Mail::DKIM::PublicKey::cork = sub {
		return bless({}, 'GkTestEd25519Key')
		  if @_ == 1 && ($_[0]->get_tag('k') // '') eq 'ed25519';
		return $cork->(@_);
	};
}

package GkTestEd25519Key;
sub size { return 32 }

package GkTestEd25519;
use base 'Mail::DKIM::Algorithm::rsa_sha256';
use MIME::Base64 qw(decode_base64);

sub verify
{
	my $self = shift;
	my $digest = $self->{header_digest}->digest;
	my $sig = decode_base64($self->signature->data);
	my $raw = decode_base64($self->signature->get_public_key->data);
	my $dir = File::Temp::tempdir(CLEANUP => 1);
	my %f = (pub => "$dir/pub.der", in => "$dir/in", sig => "$dir/sig");
	my %content = (
		# SubjectPublicKeyInfo of an Ed25519 key (RFC 8410)
		pub => pack('H*', '302a300506032b6570032100') . $raw,
		in => $digest,
		sig => $sig);
	foreach my $k (keys %f)
	{
		open(my $fh, '>:raw', $f{$k}) or die $!;
		print $fh $content{$k};
		close($fh);
	}
	my ($out, $err);
	my $ok = IPC::Run::run(
		[
			'openssl', 'pkeyutl', '-verify', '-pubin', '-keyform', 'DER', '-inkey', $f{pub},
			'-rawin', '-in', $f{in}, '-sigfile', $f{sig}
		],
		'>', \$out, '2>', \$err);
	return unless $ok;
	return $self->check_body_hash;
}

package main;

# Mail::DKIM over one message (CRLF): [ { d, a, result, detail } ... ]
sub mail_dkim_verify
{
	my ($octets) = @_;
	my $v = Mail::DKIM::Verifier->new;
	$v->PRINT($octets);
	$v->CLOSE;
	return [ map { { d => $_->domain, a => $_->algorithm, result => $_->result, detail => $_->result_detail } }
		  $v->signatures ];
}

# --- the mail ---------------------------------------------------------------

my $big_body = join('', map { $_ % 997 == 0 ? ".line $_ starts with a dot\n" : "Line $_ of a large message, in 7bit, to be signed whole.\n" } 1 .. 90_000);

my @kinds = (
	{
		kind => 'plain',
		sender => 'Shop <shop@shop.example>',
		subject => 'Your order has shipped',
		body => ".\n..\n.hidden line\nFrom the start\ntrailing spaces   \nand\ttabs\t\there \t\n  leading\n.\n\n\n\n",
		sigs => [ [ 'shop.example', 'rsa-sha256' ] ],
	},
	{
		kind => 'html',
		sender => 'Émile <news@ed.example>',
		queue => 'news',
		subject => 'Grüße – 10 % Rabatt ✓ ' . join(' ', map { "Wort$_" } 1 .. 40),
		body => "Hallo Jörg,\n\nnur heute: 10 % Rabatt auf alle Größen ✓\n" . ("é" x 200) . "\n.\n",
		html => '<p>Hallo Jörg, <b>10&nbsp;% Rabatt</b> ✓</p>' . ('<p>Größe</p>' x 50),
		headers => {
			'Reply-To' => 'service@ed.example',
			'X-Long' => join(' ', map { "token$_" } 1 .. 60),
		},
		sigs => [ [ 'ed.example', 'ed25519-sha256' ] ],
	},
	{
		kind => 'bigrsa',
		sender => 'shop@shop.example',
		subject => 'A large message',
		body => $big_body,
		sigs => [ [ 'shop.example', 'rsa-sha256' ] ],
	},
	{
		kind => 'biged',
		sender => 'news@ed.example',
		subject => 'A large message, Ed25519',
		body => $big_body,
		sigs => [ [ 'ed.example', 'ed25519-sha256' ] ],
	},
	{
		kind => 'parent',
		sender => 'x@mail.news.CORP.example',
		subject => 'From a subdomain',
		body => "Signed by the parent domain's key.\n",
		sigs => [ [ 'corp.example', 'rsa-sha256' ] ],
	},
	{
		kind => 'dual',
		sender => 'both@dual.example',
		subject => 'Two signatures',
		body => "RSA and Ed25519.\n",
		sigs => [ [ 'dual.example', 'rsa-sha256' ], [ 'dual.example', 'ed25519-sha256' ] ],
	},
	{
		kind => 'unsigned',
		sender => 'nobody@unsigned.example',
		subject => 'No key for this domain',
		body => "Goes unsigned.\n",
		sigs => [],
	},
);

sub enqueue_all
{
	my ($node, $phase) = @_;
	foreach my $m (@kinds)
	{
		my $headers = $m->{headers} ? JSON::PP->new->utf8(0)->canonical->encode($m->{headers}) : undef;
		GatekeeperTest::psql_utf8(
			$node, 'postgres',
			sprintf(
				"SELECT gatekeeper.enqueue(%s, %s, %s, queue => %s, html => %s, sender => %s, headers => %s)",
				GatekeeperTest::sql_literal("$phase-$m->{kind}\@customer.example"),
				GatekeeperTest::sql_literal($m->{subject}),
				GatekeeperTest::sql_literal($m->{body}),
				GatekeeperTest::sql_literal($m->{queue} // 'default'),
				defined $m->{html} ? GatekeeperTest::sql_literal($m->{html}) : 'NULL',
				GatekeeperTest::sql_literal($m->{sender}),
				defined $headers ? GatekeeperTest::sql_literal($headers) . '::jsonb' : 'NULL'));
	}
	return;
}

# the messages of a phase as the relay received them: kind => CRLF octets
sub received
{
	my ($phase, @msgs) = @_;
	my %got;
	foreach my $msg (@msgs)
	{
		my ($rcpt) = join(' ', @{ $msg->{rcpt} }) =~ /<?([a-z]+-[a-z]+)\@/ or next;
		my ($p, $kind) = split /-/, $rcpt;
		next unless $p eq $phase;
		my $octets = $msg->{wire};
		if (!defined $octets)
		{
			($octets = $msg->{raw}) =~ s/\n/\r\n/g;
		}
		$got{$kind} = $octets;
	}
	return %got;
}

# the tags of each DKIM-Signature field of a message
sub signature_tags
{
	my ($octets) = @_;
	my ($head) = split /\r\n\r\n/, $octets, 2;
	my @tags;
	while ($head =~ /^DKIM-Signature:((?:[^\r\n]*\r\n)(?:[ \t][^\r\n]*\r\n)*)/mgi)
	{
		(my $v = $1) =~ s/\s+//g;
		push @tags, { map { split /=/, $_, 2 } split /;/, $v };
	}
	return @tags;
}

# every check of one phase's messages
sub check_phase
{
	my ($phase, $node, %got) = @_;

	my %file;
	foreach my $kind (sort keys %got)
	{
		$file{$kind} = "$tmp/$phase-$kind.eml";
		open(my $fh, '>:raw', $file{$kind}) or die $!;
		print $fh $got{$kind};
		close($fh);
	}
	my $py = dkimpy_verify(map { $file{$_} } sort keys %file);

	foreach my $m (@kinds)
	{
		my $kind = $m->{kind};
		my $octets = $got{$kind};
		ok(defined $octets, "$phase/$kind: received") or next;
		my @want = @{ $m->{sigs} };
		my @expect = map { "$_->[0] $_->[1] pass" } @want;

		is_deeply([ map { "$_->{d} $_->{a} $_->{result}" } @{ $py->{ $file{$kind} } } ],
			\@expect, "$phase/$kind: dkimpy: " . (@want ? 'every signature passes' : 'no signature'));
		my $perl = mail_dkim_verify($octets);
		is_deeply([ map { "$_->{d} $_->{a} $_->{result}" } @$perl ],
			\@expect, "$phase/$kind: Mail::DKIM: " . (@want ? 'every signature passes' : 'no signature'))
		  or diag(join("\n", map { "$_->{d} $_->{a} $_->{result} $_->{detail}" } @$perl));

		foreach my $tags (signature_tags($octets))
		{
			my @h = split /:/, lc $tags->{h};
			is(scalar(grep { $_ eq 'from' } @h), 2, "$phase/$kind: From is over-signed (h=$tags->{h})");
			ok(!exists $tags->{l}, "$phase/$kind: no l= tag");
			is($tags->{c}, 'relaxed/relaxed', "$phase/$kind: relaxed/relaxed");
			foreach my $name (qw(to subject date message-id mime-version content-type))
			{
				ok((grep { $_ eq $name } @h), "$phase/$kind: h= covers $name");
			}
			if ($kind eq 'html')
			{
				foreach my $name (qw(reply-to list-unsubscribe list-unsubscribe-post feedback-id))
				{
					ok((grep { $_ eq $name } @h), "$phase/$kind: h= covers $name");
				}
			}
		}
	}

	# the queue's Feedback-ID is in the message, and signed (above)
	if (defined $got{html})
	{
		like($got{html}, qr/^Feedback-ID: campaign42:customer7:newsletter:shop\r$/m,
			"$phase/html: Feedback-ID is the queue's");
	}

	# a tampered message fails both verifiers (the test can fail)
	foreach my $kind (grep { defined $got{$_} } qw(plain html))
	{
		my %tampered = (
			body => $got{$kind} =~ s/(\r\n\r\n(?:.|\n)*?)e/$1E/r,
			subject => $got{$kind} =~ s/^(Subject: )/$1Re: /mr);
		foreach my $what (sort keys %tampered)
		{
			isnt($tampered{$what}, $got{$kind}, "$phase/$kind: tampered $what differs");
			my $f = "$tmp/$phase-$kind-tampered-$what.eml";
			open(my $fh, '>:raw', $f) or die $!;
			print $fh $tampered{$what};
			close($fh);
			my $r = dkimpy_verify($f)->{$f};
			ok(@$r && !grep({ $_->{result} eq 'pass' } @$r), "$phase/$kind: dkimpy fails the tampered $what");
			my $p = mail_dkim_verify($tampered{$what});
			ok(@$p && !grep({ $_->{result} eq 'pass' } @$p), "$phase/$kind: Mail::DKIM fails the tampered $what")
			  or diag(join("\n", map { "$_->{d} $_->{a} $_->{result} $_->{detail}" } @$p));
		}
	}

	# only the mail without a key went unsigned, and was counted
	is($node->safe_psql('postgres', 'SELECT sum(unsigned_total) FROM gatekeeper.worker_status'),
		1, "$phase: worker_status counts one unsigned message");
	return;
}

sub wait_sent
{
	my ($node, $phase) = @_;
	my $n = scalar(@kinds);
	ok( GatekeeperTest::poll_until(
			$node, 'postgres',
			"SELECT count(*) FILTER (WHERE s.state = 'sent') FROM gatekeeper.mail_status s "
			  . "JOIN gatekeeper.mail m USING (id) WHERE m.recipient LIKE '$phase-%'",
			$n, 180),
		"$phase: every mail was sent");
	return;
}

# --- phase 1: Postfix with CHUNKING and PIPELINING ----------------------------

my $pf = GatekeeperTest::start_postfix(name => 'pf_dkim', message_size_limit => 20_000_000);
my $pf_plain = GatekeeperTest::start_postfix(
	name => 'pf_dkim_plain',
	message_size_limit => 20_000_000,
	conf => "smtpd_discard_ehlo_keywords = pipelining, chunking, silent-discard\n");
my $relay = GatekeeperTest::start_relay(name => 'dkim_relay');

my $node = GatekeeperTest::new_node(
	'dkim',
	smtp_url => $pf->{url},
	conf => "gatekeeper.helo_name = 'mta.example.com'\n"
	  . "gatekeeper.dkim_key_table = '$table'\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gatekeeper');
$node->safe_psql('postgres',
	"SELECT gatekeeper.create_queue('news', unsubscribe_url => 'https://ed.example/unsubscribe/{token}', "
	  . "feedback_id => 'campaign42:customer7:newsletter:shop')");

enqueue_all($node, 'chunking');
wait_sent($node, 'chunking');
ok( GatekeeperTest::wait_for(
		sub { scalar(received('chunking', GatekeeperTest::sink_messages($pf->{sink}))) == @kinds }, 30),
	'chunking: Postfix passed every message on');
check_phase('chunking', $node, received('chunking', GatekeeperTest::sink_messages($pf->{sink})));

# --- phase 2: Postfix without CHUNKING and PIPELINING: DATA, dot-stuffed -------

$node->append_conf('postgresql.conf', "gatekeeper.smtp_url = '$pf_plain->{url}'\n");
$node->restart;
enqueue_all($node, 'data');
wait_sent($node, 'data');
ok( GatekeeperTest::wait_for(
		sub { scalar(received('data', GatekeeperTest::sink_messages($pf_plain->{sink}))) == @kinds }, 30),
	'data: Postfix passed every message on');
check_phase('data', $node, received('data', GatekeeperTest::sink_messages($pf_plain->{sink})));

# --- phase 3: aiosmtpd, the octets as received ------------------------------

$node->append_conf('postgresql.conf', "gatekeeper.smtp_url = '$relay->{url}'\n");
$node->restart;
enqueue_all($node, 'exact');
wait_sent($node, 'exact');
check_phase('exact', $node, received('exact', GatekeeperTest::relay_messages($relay)));

# how the messages went: BDAT to the first Postfix, DATA to the second
$node->stop;
GatekeeperTest::wait_for(sub { GatekeeperTest::postfix_command_count($pf, 'bdat') >= @kinds }, 30);
GatekeeperTest::wait_for(sub { GatekeeperTest::postfix_command_count($pf_plain, 'data') >= @kinds }, 30);
cmp_ok(GatekeeperTest::postfix_command_count($pf, 'bdat'), '>=', scalar(@kinds), 'chunking: the messages went with BDAT');
is(GatekeeperTest::postfix_command_count($pf, 'data'), 0, 'chunking: no DATA');
cmp_ok(GatekeeperTest::postfix_command_count($pf_plain, 'data'), '>=', scalar(@kinds), 'data: the messages went with DATA');
is(GatekeeperTest::postfix_command_count($pf_plain, 'bdat'), 0, 'data: no BDAT');
$node->start;

# --- tables and keys that cannot be used ------------------------------------

# ALTER SYSTEM refuses them, saying why (22023), and the table in force stays
sub refused
{
	my ($name, $content, $want) = @_;
	my $path = "$tmp/$name";
	PostgreSQL::Test::Utils::append_to_file($path, $content);
	my ($ret, $out, $err) = $node->psql('postgres',
		"\\set VERBOSITY verbose\nALTER SYSTEM SET gatekeeper.dkim_key_table = '$path'");
	isnt($ret, 0, "$name: ALTER SYSTEM fails");
	like($err, qr/22023: invalid value for parameter "gatekeeper.dkim_key_table"/, "$name: 22023");
	like($err, $want, "$name: the error says why") or diag($err);
	return $err;
}

my $open_key = "$keys/open.key";
PostgreSQL::Test::Utils::append_to_file($open_key, slurp_file($rsa_key));
chmod 0644, $open_key or die $!;
my $group_key = "$keys/group.key";
PostgreSQL::Test::Utils::append_to_file($group_key, slurp_file($ed_key));
chmod 0640, $group_key or die $!;
my $encrypted_key = "$keys/encrypted.key";
openssl('pkey', '-in', $rsa_key, '-aes256', '-passout', 'pass:secret', '-out', $encrypted_key);
chmod 0600, $encrypted_key or die $!;

refused('world_readable', "k shop.example:s:$open_key\n", qr/has group or world access/);
refused('group_readable', "k shop.example:s:$group_key\n", qr/has group or world access/);
refused('weak', "k shop.example:s:$weak_key\n", qr/RSA key of 512 bits: at least 1024/);
# over 8192 bits: no signature of it would fit (a key kept in test/keys:
# making one takes up to a minute)
my $huge_key = "$keys/huge.key";
PostgreSQL::Test::Utils::append_to_file($huge_key,
	slurp_file("$FindBin::RealBin/../test/keys/rsa-8200-bits.pem"));
chmod 0600, $huge_key or die $!;
refused('huge', "k shop.example:s:$huge_key\n", qr/RSA key of 8200 bits: at most 8192 are supported/);
refused('missing', "k shop.example:s:$keys/none.key\n", qr/could not open key file .*none\.key/);
refused('encrypted', "k shop.example:s:$encrypted_key\n", qr/holds no unencrypted PEM private key/);
refused('two_fields', "# fine\nk shop.example:$rsa_key\n", qr/line 2 of key table .* must be/);
refused('no_value', "\n\nk\n", qr/line 3 of key table .* has a key name but no domain/);
refused('bad_domain', "k shop_example:s:$rsa_key\n", qr/names no valid domain/);
refused('repeated', "k shop.example:s:$rsa_key\nk ed.example:s:$ed_key\n", qr/repeats key name "k"/);
my $inline = (split /\n/, slurp_file($rsa_key))[1];
my $err = refused('inline', "k shop.example:s:$inline\n", qr/third field must be the absolute path of a key file/);
unlike($err, qr/\Q$inline\E/, 'inline: the key is not in the error');
my ($ret, $out, $e) = $node->psql('postgres', "ALTER SYSTEM SET gatekeeper.dkim_key_table = '$tmp/no-such-table'");
like($e, qr/could not open key table/, 'a table that does not exist is refused');
is($node->safe_psql('postgres', 'SHOW gatekeeper.dkim_key_table'), $table, 'the table in force stays');

# --- at reload: a key made readable by others stops delivery, with a log line --

my $log_at = -s $node->logfile;
chmod 0644, $ed_key or die $!;
$node->reload;
ok( GatekeeperTest::wait_for(
		sub {
			slurp_file($node->logfile, $log_at) =~
			  /gatekeeper.dkim_key_table cannot be used: key file of "ed", "\Q$ed_key\E", has group or world access/;
		},
		30),
	'reload: the worker says why it cannot use the key table');
like(slurp_file($node->logfile, $log_at),
	qr/invalid value for parameter "gatekeeper.dkim_key_table"/, 'reload: the postmaster reports the table');

my $held_id = $node->safe_psql('postgres',
	"SELECT gatekeeper.enqueue('held-mail\@customer.example', 'Held', 'Body', sender => 'news\@ed.example')");
sleep 3;
is($node->safe_psql('postgres', "SELECT state FROM gatekeeper.mail_status WHERE id = $held_id"),
	'scheduled', 'reload: no mail goes while the key table cannot be used');

chmod 0600, $ed_key or die $!;
$node->reload;
ok(GatekeeperTest::poll_until($node, 'postgres', "SELECT state FROM gatekeeper.mail_status WHERE id = $held_id", 'sent', 60),
	'reload: fixed, the held mail goes');
my ($held) = grep { join(' ', @{ $_->{rcpt} }) =~ /held-mail/ } GatekeeperTest::relay_messages($relay);
ok($held, 'the held mail reached the relay') and is_deeply(
	[ map { "$_->{d} $_->{a} $_->{result}" } @{ mail_dkim_verify($held->{wire}) } ],
	['ed.example ed25519-sha256 pass'], 'the held mail is signed');

# at server start the setting is taken as it is (refused there, it would
# be empty and mail would go unsigned): the worker finds the fault, says
# so and holds the mail until it is fixed
$node->stop;
chmod 0640, $rsa_key or die $!;
$log_at = -s $node->logfile;
$node->start;
ok( GatekeeperTest::wait_for(
		sub {
			slurp_file($node->logfile, $log_at) =~
			  /gatekeeper.dkim_key_table cannot be used: key file of "shop", "\Q$rsa_key\E", has group or world access/;
		},
		30),
	'start: the worker says why it cannot use the key table');
is($node->safe_psql('postgres', 'SHOW gatekeeper.dkim_key_table'), $table, 'start: the table stays set');
my $start_id = $node->safe_psql('postgres',
	"SELECT gatekeeper.enqueue('start-mail\@customer.example', 'Held at start', 'Body', sender => 'shop\@shop.example')");
sleep 3;
is($node->safe_psql('postgres', "SELECT state FROM gatekeeper.mail_status WHERE id = $start_id"),
	'scheduled', 'start: no mail goes while the key table cannot be used');
is($node->safe_psql('postgres', "SELECT attempt FROM gatekeeper.status($start_id)"),
	'0', 'start: the held mail is not charged an attempt');
# worker_status says why where an operator looks (issue 44, item 5)
is($node->safe_psql('postgres', 'SELECT DISTINCT state FROM gatekeeper.worker_status'),
	'holding mail: DKIM keys cannot be used', 'start: worker_status says mail is held for the keys');
like($node->safe_psql('postgres', 'SELECT last_error FROM gatekeeper.worker_status'),
	qr/^gatekeeper.dkim_key_table cannot be used: key file of "shop", "\Q$rsa_key\E", has group or world access/,
	'start: worker_status has the reason as the relay\'s last_error');
chmod 0600, $rsa_key or die $!;
$node->reload;
ok(GatekeeperTest::poll_until($node, 'postgres', "SELECT state FROM gatekeeper.mail_status WHERE id = $start_id", 'sent', 60),
	'start: fixed, the held mail goes');
my ($started) = grep { join(' ', @{ $_->{rcpt} }) =~ /start-mail/ } GatekeeperTest::relay_messages($relay);
ok($started, 'the mail held at start reached the relay') and is_deeply(
	[ map { "$_->{d} $_->{a} $_->{result}" } @{ mail_dkim_verify($started->{wire}) } ],
	['shop.example rsa-sha256 pass'], 'the mail held at start is signed');

# no key material in the server's log
my $log = slurp_file($node->logfile);
foreach my $k (sort keys %secret_lines)
{
	unlike($log, qr/\Q$secret_lines{$k}\E/, "no line of $k in the log");
}

$node->stop;
GatekeeperTest::stop_relay($relay);
GatekeeperTest::stop_postfix($pf);
GatekeeperTest::stop_postfix($pf_plain);
done_testing();
