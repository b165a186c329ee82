-- The row-write ceiling: mark the next id range of bench_raw sent, one
-- UPDATE per batch.  Client c's i-th round takes range (i-1)*clients + c,
-- so the clients cover 1..clients*rounds*batch exactly once.
-- -D batch=N -D clients=K -D i=0.
\set i :i + 1
\set lo ((:i - 1) * :clients + :client_id) * :batch
\set hi :lo + :batch
UPDATE bench_raw SET state = 'sent', finished_at = now(), lease_until = NULL
 WHERE id > :lo AND id <= :hi;
