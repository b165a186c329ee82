-- tables of prototype A (bench/proto/run.sh); proto_done is the variant with outcomes kept per batch
DROP TABLE IF EXISTS proto_claim, proto_done;
CREATE TABLE proto_claim (batch_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, queue text NOT NULL, worker text, lease_until timestamptz NOT NULL, mails gatekeeper.mail_live[] NOT NULL);
CREATE INDEX ON proto_claim (lease_until);
CREATE TABLE proto_done (finished_at timestamptz NOT NULL, ids int8range NOT NULL, mails gatekeeper.mail_live[] NOT NULL);
CREATE INDEX ON proto_done USING gist (ids);
CREATE INDEX ON proto_done USING brin (finished_at);
