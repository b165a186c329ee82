-- bench/sql/setup.sql: helpers the benchmark creates in its bench database.
-- Not part of gatekeeper.

-- The one shape of mail every scenario uses: a distinct recipient per row,
-- a short subject, a body of about 1,000 bytes (stored inline, uncompressed).
CREATE FUNCTION bench_body(i bigint) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
	SELECT 'Hello ' || i || E',\n' || repeat(md5(i::text) || ' ', 29)
$$;

-- n rows for gatekeeper.mail (or a copy of its columns), recipients
-- <prefix><i>@example.com, due at now() + due_in.
CREATE FUNCTION bench_rows(n bigint, prefix text, q text, due_in interval)
RETURNS TABLE (queue text, recipient text, subject text, body text, send_at timestamptz)
LANGUAGE sql AS $$
	SELECT q, prefix || i || '@example.com', 'Subject ' || i, bench_body(i), now() + due_in
	  FROM generate_series(1, n) AS i
$$;

-- Load n mails into gatekeeper.mail directly, as a superuser, without the
-- validation trigger (these rows are known valid; loading is not what is
-- measured), with their state rows: mail_live for scheduled mail,
-- mail_done for finished mail ('sent', as retention keeps it).
CREATE PROCEDURE bench_load(n bigint, prefix text, q text, due_in interval,
							st gatekeeper.state DEFAULT 'scheduled')
LANGUAGE plpgsql AS $$
BEGIN
	SET LOCAL session_replication_role = replica;
	IF st = 'scheduled' THEN
		WITH m AS (
			INSERT INTO gatekeeper.mail (queue, recipient, subject, body, send_at)
			SELECT * FROM bench_rows(n, prefix, q, due_in)
			RETURNING id, queue, priority, send_at, segment)
		INSERT INTO gatekeeper.mail_live (id, queue, priority, send_at, segment)
		SELECT id, queue, priority, send_at, segment FROM m;
	ELSE
		WITH m AS (
			INSERT INTO gatekeeper.mail (queue, recipient, subject, body, send_at)
			SELECT * FROM bench_rows(n, prefix, q, due_in)
			RETURNING id, queue, recipient, send_at, segment)
		INSERT INTO gatekeeper.mail_done (id, queue, state, attempt, send_at, message_id, worker,
										  finished_at, segment)
		SELECT id, queue, st, 1, send_at, '<sent.' || recipient || '>', 'bench',
			   now() - interval '1 hour', segment
		  FROM m;
	END IF;
END
$$;

-- The raw-UPDATE reference: the mail as one table, 0.1.0's (every column
-- of gatekeeper.mail_status, with 0.1.0's indexes), but none of
-- gatekeeper's code: one row write per row.
CREATE TABLE bench_raw AS SELECT * FROM gatekeeper.mail_status WITH NO DATA;
ALTER TABLE bench_raw ADD PRIMARY KEY (id);
CREATE INDEX ON bench_raw (queue, priority DESC, send_at, id) WHERE state = 'scheduled';
CREATE INDEX ON bench_raw (lease_until) WHERE lease_until IS NOT NULL;
CREATE UNIQUE INDEX ON bench_raw (queue, dedupe_key)
	WHERE dedupe_key IS NOT NULL AND state IN ('scheduled', 'claimed');
CREATE INDEX ON bench_raw (queue, dedupe_key, finished_at) WHERE dedupe_key IS NOT NULL AND state = 'sent';
CREATE INDEX ON bench_raw (finished_at) WHERE finished_at IS NOT NULL;

-- The enqueue reference: a plain table with the same columns and
-- defaults, an identity primary key, and nothing else.
CREATE TABLE bench_plain (LIKE gatekeeper.mail INCLUDING DEFAULTS INCLUDING IDENTITY);
ALTER TABLE bench_plain DROP COLUMN segment;
ALTER TABLE bench_plain ADD PRIMARY KEY (id);

-- The gates' "machine ceiling" line: gate_pass's key and nothing else.
CREATE TABLE bench_pass (
	recipient text COLLATE "C" NOT NULL,
	gate int NOT NULL,
	PRIMARY KEY (recipient, gate)
);

SELECT gatekeeper.create_queue('bench');
SELECT gatekeeper.create_queue('bench_gated', gates => '{smart_sending}');
