-- One enqueue, its own transaction, to a random recipient: against a
-- shard directly or through gatekeeper_router (issue 29).
\set r random(1, 1000000000)
SELECT gatekeeper.enqueue('s' || :client_id || '_' || :r || '@example.com', 'Subject', 'Body of about a line', 'bench');
