-- The gates' machine ceiling: the same 1,000 new keys into a bare
-- (recipient, gate) table.  -D run=R -D i=0.
\set i :i + 1
INSERT INTO bench_pass (recipient, gate)
SELECT 'b' || :run || '_' || :client_id || '_' || :i || '_' || g || '@example.com', 1
  FROM generate_series(1, 1000) AS g
    ON CONFLICT DO NOTHING;
