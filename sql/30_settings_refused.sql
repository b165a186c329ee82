-- Settings refuse, when they are set, values the workers could not use
-- (issue 28): ALTER SYSTEM fails and writes nothing, naming the setting and
-- the rule or bound; a usable value is taken.
SET client_min_messages = warning;
\set VERBOSITY terse

-- files are named by absolute paths
ALTER SYSTEM SET gatekeeper.smtp_password_file = 'relay_password';
ALTER SYSTEM SET gatekeeper.smtp_ca_file = 'certs/ca.pem';
ALTER SYSTEM SET gatekeeper.dkim_key_table = 'dkim/key.table';

-- and must be usable as the workers use them
\set VERBOSITY default
ALTER SYSTEM SET gatekeeper.smtp_password_file = '/nonexistent/relay_password';
ALTER SYSTEM SET gatekeeper.smtp_ca_file = '/nonexistent/ca.pem';
ALTER SYSTEM SET gatekeeper.smtp_ca_file = '/';
\set VERBOSITY terse

-- a Message-ID domain that would make malformed Message-IDs
ALTER SYSTEM SET gatekeeper.message_id_domain = 'mail example.com';
ALTER SYSTEM SET gatekeeper.message_id_domain = 'mail..example.com';
ALTER SYSTEM SET gatekeeper.message_id_domain = 'example.com.';
ALTER SYSTEM SET gatekeeper.message_id_domain = '<example.com>';

-- numbers outside their bounds: the error names the bounds
ALTER SYSTEM SET gatekeeper.lease = '30d';
ALTER SYSTEM SET gatekeeper.batch_size = 20000;
ALTER SYSTEM SET gatekeeper.smtp_connections = 0;
ALTER SYSTEM SET gatekeeper.smtp_timeout = '2h';
ALTER SYSTEM SET gatekeeper.soft_bounce_limit = 0;
ALTER SYSTEM SET gatekeeper.retry_delay = '7h';

-- none of them was written
SELECT name, setting FROM pg_file_settings
 WHERE name LIKE 'gatekeeper.%' AND sourcefile LIKE '%postgresql.auto.conf'
 ORDER BY name;

-- usable values are taken, then reset
ALTER SYSTEM SET gatekeeper.message_id_domain = 'mail.example.com';
ALTER SYSTEM SET gatekeeper.lease = '7d';
SELECT name, setting FROM pg_file_settings
 WHERE name LIKE 'gatekeeper.%' AND sourcefile LIKE '%postgresql.auto.conf'
 ORDER BY name;
ALTER SYSTEM RESET gatekeeper.message_id_domain;
ALTER SYSTEM RESET gatekeeper.lease;
SELECT count(*) FROM pg_file_settings
 WHERE name LIKE 'gatekeeper.%' AND sourcefile LIKE '%postgresql.auto.conf';
