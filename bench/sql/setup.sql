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
-- measured).  state 'sent' makes finished mail, as retention keeps it.
CREATE PROCEDURE bench_load(n bigint, prefix text, q text, due_in interval,
							st gatekeeper.state DEFAULT 'scheduled')
LANGUAGE plpgsql AS $$
BEGIN
	SET LOCAL session_replication_role = replica;
	IF st = 'scheduled' THEN
		INSERT INTO gatekeeper.mail (queue, recipient, subject, body, send_at)
		SELECT * FROM bench_rows(n, prefix, q, due_in);
	ELSE
		INSERT INTO gatekeeper.mail (queue, recipient, subject, body, send_at, state, attempt,
									 message_id, worker, finished_at)
		SELECT r.queue, r.recipient, r.subject, r.body, r.send_at, st, 1,
			   '<sent.' || r.recipient || '>', 'bench', now() - interval '1 hour'
		  FROM bench_rows(n, prefix, q, due_in) AS r;
	END IF;
END
$$;

-- The raw-UPDATE reference: a plain copy of gatekeeper.mail's rows, with
-- its columns, defaults and indexes, but none of gatekeeper's code.
CREATE TABLE bench_raw (LIKE gatekeeper.mail INCLUDING DEFAULTS INCLUDING INDEXES);

-- The enqueue reference: a plain table with the same columns and
-- defaults, an identity primary key, and nothing else.
CREATE TABLE bench_plain (LIKE gatekeeper.mail INCLUDING DEFAULTS INCLUDING IDENTITY);
ALTER TABLE bench_plain ADD PRIMARY KEY (id);

-- The gates' "machine ceiling" line: gate_pass's key and nothing else.
CREATE TABLE bench_pass (
	recipient text COLLATE "C" NOT NULL,
	gate int NOT NULL,
	PRIMARY KEY (recipient, gate)
);

SELECT gatekeeper.create_queue('bench');
SELECT gatekeeper.create_queue('bench_gated', gates => '{smart_sending}');
