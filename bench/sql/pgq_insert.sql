-- PgQ producer: one transaction inserts a batch of events carrying the
-- same recipient and body as a mail, then the ticker closes a batch
-- (ticker_max_count = batch) in a transaction of its own.
-- -D batch=N -D i=0.
\set i :i + 1
SELECT count(pgq.insert_event('bench_q', 'mail',
			'p' || :client_id || '_' || :i || '_' || g || '@example.com' || E'\n' || bench_body(g)))
  FROM generate_series(1, :batch) AS g;
SELECT pgq.ticker('bench_q');
