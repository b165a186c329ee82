-- Single gate_pass calls, each for a recipient never seen before.
-- -D run=R -D i=0.
\set i :i + 1
SELECT gatekeeper.gate_pass('smart_sending', 's' || :run || '_' || :client_id || '_' || :i || '@example.com');
