-- tables of prototype B (bench/proto/run.sh)
DROP TABLE IF EXISTS t_live, t_sched, t_batch;
CREATE TABLE t_live (LIKE gatekeeper.mail_live INCLUDING DEFAULTS) WITH (fillfactor = 50);
ALTER TABLE t_live ADD PRIMARY KEY (id);
CREATE TABLE t_sched (queue text NOT NULL, priority int NOT NULL, send_at timestamptz NOT NULL, id bigint NOT NULL);
CREATE INDEX t_sched_due ON t_sched (queue, priority DESC, send_at, id);
CREATE TABLE t_batch (batch_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, lease_until timestamptz NOT NULL, ids bigint[] NOT NULL);
CREATE INDEX ON t_batch (lease_until);
