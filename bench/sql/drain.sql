-- One claimer's round, as an external worker does it: claim a batch (one
-- transaction), then report it sent (another).  -D batch=N.
SELECT coalesce(array_agg(id), '{}') AS ids, coalesce(array_agg(attempt), '{}') AS atts
  FROM gatekeeper.claim('bench', :batch) \gset
SELECT gatekeeper.ack_batch(:ids::bigint[], :atts::int[]);
