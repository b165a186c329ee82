-- Batch gate_pass (gate_pass_batch): 1,000 recipients never seen before per call.
-- -D run=R -D i=0.
\set i :i + 1
SELECT count(*) FROM gatekeeper.gate_pass_batch('smart_sending',
	ARRAY(SELECT 'b' || :run || '_' || :client_id || '_' || :i || '_' || g || '@example.com'
			FROM generate_series(1, 1000) AS g));
