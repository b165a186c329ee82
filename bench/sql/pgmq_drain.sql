-- pgmq consumer (optional peer, BK_PGMQ_SQL): read a batch (one
-- transaction), then delete it (the next): the analogue of claim + ack.
-- -D batch=N.
SELECT coalesce(array_agg(msg_id), '{}') AS ids FROM pgmq.read('bench_m', 30, :batch) \gset
SELECT count(*) FROM pgmq.delete('bench_m', :ids::bigint[]);
