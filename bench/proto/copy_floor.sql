-- The floor under a COPY into gatekeeper.mail (bench/proto/copy_floor.sh,
-- bench/notes.md "COPY's floor on PostgreSQL 15"): tables that each add
-- one part of what gatekeeper.mail is to bench_plain (bench/sql/setup.sql)
--
--   plain_h    bench_plain plus a hash index on recipient (history())
--   content    gatekeeper.mail's content table alone: the same columns
--              and defaults, list-partitioned by segment into four, primary
--              key (id, segment), hash on recipient; no trigger
--   content_t  content plus an AFTER INSERT statement trigger with a
--              transition table whose function does nothing: the cheapest
--              way for one statement to see every row it inserted, and
--              what makes COPY into a partitioned table insert row by row
--              (copyfrom.c, CIM_SINGLE)
--   content_w  content plus an AFTER INSERT row trigger whose WHEN calls a
--              pinned C function per row (gatekeeper._segment(), false
--              always, so no event is ever queued) and a statement trigger
--              without a transition table: the cheapest way to see each
--              row with a function of ours while COPY keeps its multi-row
--              inserts
--   content_g  content plus a tag column whose default is a builtin
--              current_setting() (no call of ours per row; it stands in
--              for a number given each statement) with a btree index, and
--              a statement trigger without a transition table that reads
--              the statement's rows back through that index

CREATE TABLE plain_h (LIKE bench_plain INCLUDING ALL);
CREATE INDEX ON plain_h USING hash (recipient);

CREATE TABLE content (LIKE gatekeeper.mail INCLUDING DEFAULTS INCLUDING IDENTITY,
	PRIMARY KEY (id, segment)) PARTITION BY LIST (segment);
CREATE TABLE content_t (LIKE content INCLUDING ALL) PARTITION BY LIST (segment);
CREATE TABLE content_w (LIKE content INCLUDING ALL) PARTITION BY LIST (segment);
CREATE TABLE content_g (LIKE content INCLUDING ALL) PARTITION BY LIST (segment);
ALTER TABLE content_g ADD COLUMN tag bigint
	DEFAULT pg_catalog.current_setting('gatekeeper.current_segment')::bigint;
CREATE INDEX ON content_g (tag);
DO $$
DECLARE
	t text;
BEGIN
	FOREACH t IN ARRAY ARRAY['content', 'content_t', 'content_w', 'content_g'] LOOP
		FOR s IN 0..3 LOOP
			EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES IN (%s)', t || '_' || s, t, s);
		END LOOP;
		EXECUTE format('CREATE INDEX ON %I USING hash (recipient)', t);
	END LOOP;
END
$$;
CREATE FUNCTION copy_floor_noop() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
CREATE TRIGGER t AFTER INSERT ON content_t REFERENCING NEW TABLE AS n
	FOR EACH STATEMENT EXECUTE FUNCTION copy_floor_noop();
CREATE TRIGGER w AFTER INSERT ON content_w FOR EACH ROW WHEN (gatekeeper._segment() < 0)
	EXECUTE FUNCTION copy_floor_noop();
CREATE TRIGGER s AFTER INSERT ON content_w
	FOR EACH STATEMENT EXECUTE FUNCTION copy_floor_noop();
CREATE FUNCTION copy_floor_readback() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	PERFORM count(*) FROM content_g
	  WHERE tag = pg_catalog.current_setting('gatekeeper.current_segment')::bigint
		AND body IS NOT NULL;
	RETURN NULL;
END
$$;
CREATE TRIGGER s AFTER INSERT ON content_g
	FOR EACH STATEMENT EXECUTE FUNCTION copy_floor_readback();
