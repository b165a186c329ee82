-- PgQ consumer: one batch per transaction.
BEGIN;
SELECT pgq.next_batch('bench_q', 'bench') AS bid \gset
SELECT count(*) FROM pgq.get_batch_events(:bid);
SELECT pgq.finish_batch(:bid);
END;
