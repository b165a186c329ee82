/*-------------------------------------------------------------------------
 *
 * report.c
 *		After the relay said 250: the VERP token that names a mail in its
 *		envelope, gatekeeper.ingest_report() for the DSNs and feedback
 *		reports that come back, and gatekeeper.record_event() for an ESP's
 *		webhook.
 *
 * A VERP token names one mail: the mail's id and the first 80 bits of an
 * HMAC-SHA256 of it under the secret that signs the unsubscribe tokens
 * (src/unsubscribe.c; the signed data starts with "gatekeeper verp", so
 * that neither kind of token can stand for the other), in lower-case
 * base32 (RFC 4648, no padding): 29 letters and digits, which survive an
 * MTA that lower-cases the local part, and fit it with room to spare.  A
 * queue's return_path carries it in the envelope sender
 * ('bounces+{token}@bounce.example'), and every mail carries it as the
 * DSN's ENVID, so a DSN names its mail by the address it is delivered to
 * or by its Original-Envelope-Id.  Failing both, a report names its mail
 * by the returned Message-ID, which gatekeeper writes as <id.mac@domain>
 * (src/message_id.c): the id is read from it, its MAC must be right, and
 * the whole must equal the sent mail's.  Mail sent before the MAC has a
 * Message-ID without one, <id.created@domain>, which any recipient of a
 * neighbouring mail could write: a report naming it counts only when it
 * names the mail's recipient too.
 *
 * A report counts only when it names a mail gatekeeper sent and, where it
 * names a recipient (Final-Recipient or Original-Recipient, Original-Rcpt-To,
 * a webhook's recipient), that mail's recipient: report_rows() checks
 * both and writes the event and, in suppress_for_report(), the
 * suppression it calls for (report_bounce(), the one place of the
 * soft-bounce rule, which the nacks of src/mail/mail_state.c call too;
 * gatekeeper_suppression_add).  The mail is
 * read by key from its segment's partitions of mail_done and mail
 * (find_sent_mail), not by a statement over the partitioned tables.
 * Anything else writes nothing and is counted as ignored
 * (gatekeeper.report_stats).  A mail counts one complaint and one bounce
 * from reports: a later complained or bounced event of the mail is kept
 * (event_log.repeated), but counted nowhere and suppresses no one again.
 * The parse itself (src/report_parse.c) raises
 * no error for what a message holds: a junk message gives no row and
 * leaves the caller's transaction alone.
 *
 * A message delivered to a mail's VERP address is about that mail
 * whatever its format (issue 49): when it holds no DSN group gatekeeper
 * can use (Exim's and qmail's plain-text bounces, a provider's own
 * layout), its status is read from its text (smtp_trouble_in_text) and
 * it is a bounced event, with no status when nothing can be read (a
 * deferred one when it only warns of a delay: report_parse's
 * delay_notice); an auto-reply (RFC 3834) is none.  A DSN's only group that has no
 * Diagnostic-Code takes its detail from the text the same way (Exim 4.96
 * writes its own failures so: Status 5.0.0, the reason for people only,
 * t/093_reports_exim_pipe.pl); so does one whose Diagnostic-Code is only
 * a mailer's exit code (Sendmail's "X-Unix; 73" for a local mailer's
 * EX_CANTCREAT, whose words are in its transcript,
 * t/098_reports_sendmail_pipe.pl).  Why a bounce or deferral failed, and
 * whether it was hard, is src/smtp_trouble.c's one classifier.
 *
 * ingest_report() reads a message in three steps: report_parse() says
 * what it is, find_reported_mail() which mail it is about, and one
 * recorder per kind writes it: record_dsn_groups() (a DSN, a row per
 * recipient group, its detail from dsn_group_diagnostic()),
 * record_feedback_report() (an ARF report), record_plain_message() (a
 * bounce or delay warning written for people, or
 * record_forwarded_complaint()), each through report_rows().
 *
 * IDENTIFICATION
 *		src/report.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/relation.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "funcapi.h"
#include "storage/proc.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/tuplestore.h"

#include <openssl/evp.h>

#include "gatekeeper.h"
#include "message_id.h"
#include "report.h"
#include "report_parse.h"
#include "smtp_trouble.h"
#include "suppression.h"
#include "unsubscribe.h"
#include "address.h"
#include "catalog.h"
#include "mail/mail_store.h"

PG_FUNCTION_INFO_V1(gatekeeper_verp_token);
PG_FUNCTION_INFO_V1(gatekeeper_check_return_path);
PG_FUNCTION_INFO_V1(gatekeeper_ingest_report);
PG_FUNCTION_INFO_V1(gatekeeper_record_event);

#define VERP_MAC_LEN		10
#define VERP_RAW_LEN		(8 + VERP_MAC_LEN)
#define TOKEN_PLACEHOLDER	"{token}"

/* the largest message ingest_report() reads (54000 beyond) */
#define REPORT_MAX_MESSAGE	(64 * 1024 * 1024)

/* return_path lookups remembered until gatekeeper_report_envelope_refresh */
#define RETURN_PATH_CACHE	16

/* SHA-256's block: HMAC's pads are this long */
#define SHA256_BLOCK		64

static const char base32_digits[] = "abcdefghijklmnopqrstuvwxyz234567";
static const char verp_context[16] = "gatekeeper verp";

static SPIPlanPtr return_path_plan = NULL;
static const char return_path_sql[] =
"SELECT q.return_path FROM gatekeeper.queue q WHERE q.name = $1";


/*
 * The sent mail a report names, and what is checked of it: its mail_done
 * row (state sent) and its mail row, in the same segment.  Read by index
 * scans of the segments' partitions (find_sent_mail), not by a statement
 * over the partitioned tables: a generic plan cannot prune by id, and its
 * executor start-up over eight partitions was a third of a record_event()
 * call (docs/internals.md, "Reports").
 */
typedef struct SentMail
{
	char	   *queue;
	int16		segment;
	char	   *message_id;		/* or NULL */
	char	   *recipient;
} SentMail;

/*
 * What find_sent_mail reads, by segment: the partitions (whose OIDs
 * catalog.c keeps), their primary keys (id, segment) and the columns'
 * numbers.  Derived once and kept while catalog.c's count of
 * invalidations of each partition stays where it was when they were read
 * (ALTER, DROP EXTENSION, an index created or dropped and a TRUNCATE by
 * rotation all move it).
 */
typedef struct SegmentRels
{
	Oid			done_relid;		/* mail_done_<n> */
	uint32		done_generation;
	Oid			done_index;
	AttrNumber	done_queue;
	AttrNumber	done_state;
	AttrNumber	done_message_id;
	Oid			mail_relid;		/* mail_<n> */
	uint32		mail_generation;
	Oid			mail_index;
	AttrNumber	mail_recipient;
} SegmentRels;

/*
 * The mail a message given to ingest_report() is about, and how it was
 * found: by a VERP token of the address the message was delivered to, by
 * one the report carries, or by the returned Message-ID.
 */
typedef struct ReportedMail
{
	int64		id;
	bool		found;
	const char *message_id;		/* the returned Message-ID that found it, or
								 * NULL */
	bool		signed_id;		/* that Message-ID has its MAC */
	bool		delivered_to_token; /* found by the address delivered to */
} ReportedMail;

static SegmentRels segment_rels[GATEKEEPER_SEGMENTS];
static Oid	sent_state = InvalidOid;	/* gatekeeper.state's 'sent' */
static bool segment_rels_valid = false;

/*
 * The event, in the mail's retention segment: nothing when the same one
 * was taken before (event_log_report), and, as the mail's counted
 * complaint or bounce, nothing when it has one (event_log_counted)
 */
static SPIPlanPtr insert_event_plan = NULL;
static const char insert_event_sql[] =
"INSERT INTO gatekeeper.event_log (mail_id, queue, recipient, event, status, detail, source, segment, repeated, reason) "
"VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT DO NOTHING";

/* the bounces that count towards a soft_bounce entry */
static SPIPlanPtr soft_bounces_plan = NULL;
static const char soft_bounces_sql[] =
"SELECT count(DISTINCT e.mail_id) FROM gatekeeper.event_log e "
" WHERE translate(e.recipient, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ', 'abcdefghijklmnopqrstuvwxyz') = $1 "
"   AND e.event = 'bounced' AND e.at > now() - interval '30 days'";

/*
 * What the worker's envelopes read, kept until
 * gatekeeper_report_envelope_refresh: the return paths looked up (in
 * envelope_cxt) and the HMAC key, as SHA-256 states after its inner and
 * outer pad, so that a token costs two short digests and no statement.
 */
static struct
{
	char		queue[NAMEDATALEN * 2];
	char	   *return_path;	/* in envelope_cxt, or NULL */
}			return_paths[RETURN_PATH_CACHE];
static int	nreturn_paths = 0;
static MemoryContext envelope_cxt = NULL;
static EVP_MD_CTX *verp_inner = NULL;
static EVP_MD_CTX *verp_outer = NULL;
static EVP_MD_CTX *verp_work = NULL;
static bool verp_keyed = false;

static void verp_mac(int64 id, uint8 *mac);
static void verp_key(void);
static void verp_mac_kept(int64 id, uint8 *mac);
static char *verp_token(int64 id, bool kept);
static bool verp_verify(const char *token, size_t len, int64 *id);
static bool token_in(const char *text, int64 *id);
static bool segment_rels_current(void);
static void segment_rels_load(void);
static bool fetch_by_id(Oid relid, Oid indexid, int64 id, int16 segment, bool by_segment,
						TupleTableSlot **slot, Relation *rel);
static bool find_sent_mail(int64 id, SentMail *mail);
static const char *dsn_event(const ReportRecipient *rr);
static char *mailer_transcript(const char *text);
static int	report_rows(int64 id, const char *message_id, bool signed_id,
						const char *recipient1, const char *recipient2,
						const char *event, const char *status, const char *detail,
						const char *source, Tuplestorestate *out, TupleDesc desc,
						bool *matched);
static void suppress_for_report(int64 id, const char *queue, const char *recipient,
								const char *event, bool counted, TroubleReason reason,
								const char *detail);
static void find_reported_mail(const ParsedReport *r, const char *envelope_to,
							   ReportedMail *m);
static const char *dsn_group_diagnostic(const ParsedReport *r, ReportRecipient *rr);
static int	record_dsn_groups(ParsedReport *r, const ReportedMail *m, ReturnSetInfo *rsinfo,
							  bool *usable);
static int	record_feedback_report(const ParsedReport *r, const ReportedMail *m,
								   ReturnSetInfo *rsinfo);
static int	record_forwarded_complaint(const ParsedReport *r, ReturnSetInfo *rsinfo);
static int	record_plain_message(const ParsedReport *r, const ReportedMail *m,
								 ReturnSetInfo *rsinfo);

/*
 * The first VERP_MAC_LEN bytes of the HMAC of a mail id, into mac.
 */
static void
verp_mac(int64 id, uint8 *mac)
{
	uint8		data[sizeof(verp_context) + 8];
	uint8		full[32];
	int			i;

	memcpy(data, verp_context, sizeof(verp_context));
	for (i = 0; i < 8; i++)
		data[sizeof(verp_context) + i] = (uint8) (((uint64) id) >> (56 - 8 * i));
	gatekeeper_token_sign(data, sizeof(data), full);
	memcpy(mac, full, VERP_MAC_LEN);
}

/*
 * Derive the kept HMAC key (verp_inner, verp_outer) from the database's
 * secret, unless it is: HMAC-SHA256 (RFC 2104) hashes the key's inner and
 * outer pad ahead of every message, so both states are hashed once here
 * and copied per token.  SPI must be connected.
 */
static void
verp_key(void)
{
	uint8		key[GATEKEEPER_TOKEN_SECRET_MAX];
	uint8		pad[SHA256_BLOCK];
	int			len;
	int			i;

	if (verp_keyed)
		return;
	len = gatekeeper_token_secret(key);
	Assert(len <= SHA256_BLOCK);
	if (verp_inner == NULL)
		verp_inner = EVP_MD_CTX_new();
	if (verp_outer == NULL)
		verp_outer = EVP_MD_CTX_new();
	if (verp_work == NULL)
		verp_work = EVP_MD_CTX_new();
	if (verp_inner == NULL || verp_outer == NULL || verp_work == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("out of memory")));
	for (i = 0; i < SHA256_BLOCK; i++)
		pad[i] = (i < len ? key[i] : 0) ^ 0x36;
	if (EVP_DigestInit_ex(verp_inner, EVP_sha256(), NULL) != 1 ||
		EVP_DigestUpdate(verp_inner, pad, SHA256_BLOCK) != 1)
		elog(ERROR, "could not compute HMAC-SHA256");
	for (i = 0; i < SHA256_BLOCK; i++)
		pad[i] = (i < len ? key[i] : 0) ^ 0x5c;
	if (EVP_DigestInit_ex(verp_outer, EVP_sha256(), NULL) != 1 ||
		EVP_DigestUpdate(verp_outer, pad, SHA256_BLOCK) != 1)
		elog(ERROR, "could not compute HMAC-SHA256");
	explicit_bzero(key, sizeof(key));
	explicit_bzero(pad, sizeof(pad));
	verp_keyed = true;
}

/*
 * verp_mac under the kept key (verp_key): the same bytes.
 */
static void
verp_mac_kept(int64 id, uint8 *mac)
{
	uint8		data[sizeof(verp_context) + 8];
	uint8		inner[32];
	uint8		full[32];
	unsigned int len;
	int			i;

	memcpy(data, verp_context, sizeof(verp_context));
	for (i = 0; i < 8; i++)
		data[sizeof(verp_context) + i] = (uint8) (((uint64) id) >> (56 - 8 * i));
	if (EVP_MD_CTX_copy_ex(verp_work, verp_inner) != 1 ||
		EVP_DigestUpdate(verp_work, data, sizeof(data)) != 1 ||
		EVP_DigestFinal_ex(verp_work, inner, &len) != 1 ||
		EVP_MD_CTX_copy_ex(verp_work, verp_outer) != 1 ||
		EVP_DigestUpdate(verp_work, inner, sizeof(inner)) != 1 ||
		EVP_DigestFinal_ex(verp_work, full, &len) != 1)
		elog(ERROR, "could not compute HMAC-SHA256");
	memcpy(mac, full, VERP_MAC_LEN);
}

/*
 * The VERP token of a mail id, signed under the kept key (verp_key) or
 * the secret as this transaction reads it.  SPI must be connected.
 */
static char *
verp_token(int64 id, bool kept)
{
	uint8		raw[VERP_RAW_LEN];
	char	   *out = palloc(GATEKEEPER_VERP_TOKEN_LEN + 1);
	uint32		acc = 0;
	int			bits = 0;
	int			o = 0;
	int			i;

	for (i = 0; i < 8; i++)
		raw[i] = (uint8) (((uint64) id) >> (56 - 8 * i));
	if (kept)
		verp_mac_kept(id, raw + 8);
	else
		verp_mac(id, raw + 8);
	for (i = 0; i < VERP_RAW_LEN; i++)
	{
		acc = (acc << 8) | raw[i];
		bits += 8;
		while (bits >= 5)
		{
			bits -= 5;
			out[o++] = base32_digits[(acc >> bits) & 31];
		}
	}
	if (bits > 0)
		out[o++] = base32_digits[(acc << (5 - bits)) & 31];
	out[o] = '\0';
	Assert(o == GATEKEEPER_VERP_TOKEN_LEN);
	return out;
}

/*
 * Whether len characters at token are a VERP token this database signed
 * (letters in either case); *id is then its mail.  The MAC is compared in
 * constant time.  SPI must be connected.
 */
static bool
verp_verify(const char *token, size_t len, int64 *id)
{
	uint8		raw[VERP_RAW_LEN + 1];
	uint8		mac[VERP_MAC_LEN];
	uint32		acc = 0;
	int			bits = 0;
	int			o = 0;
	uint64		v = 0;
	size_t		i;

	if (len != GATEKEEPER_VERP_TOKEN_LEN)
		return false;
	for (i = 0; i < len; i++)
	{
		const char *d = memchr(base32_digits, pg_ascii_tolower((unsigned char) token[i]), 32);

		if (d == NULL || token[i] == '\0')
			return false;
		acc = (acc << 5) | (uint32) (d - base32_digits);
		bits += 5;
		if (bits >= 8)
		{
			bits -= 8;
			raw[o++] = (acc >> bits) & 0xff;
		}
	}
	/* the bits past the last byte are zero in a token we wrote */
	if (o != VERP_RAW_LEN || (acc & ((1 << bits) - 1)) != 0)
		return false;
	for (i = 0; i < 8; i++)
		v = (v << 8) | raw[i];
	verp_mac((int64) v, mac);
	if (timingsafe_bcmp(mac, raw + 8, VERP_MAC_LEN) != 0)
		return false;
	*id = (int64) v;
	return true;
}

/*
 * Whether text (an address, or an ENVID) holds a valid VERP token as one
 * of the words of its local part (words are set apart by + - = . _ or
 * the part's ends); *id is then its mail.
 */
static bool
token_in(const char *text, int64 *id)
{
	const char *p = text;
	const char *at;
	const char *end;

	if (text == NULL)
		return false;
	at = strrchr(text, '@');
	end = at ? at : text + strlen(text);
	while (p < end)
	{
		size_t		n = 0;

		while (p + n < end && strchr("+-=._", p[n]) == NULL)
			n++;
		if (verp_verify(p, n, id))
			return true;
		p += n + 1;
	}
	return false;
}

/*
 * report_bounce
 *		What a bounce does to the suppression list: see report.h.  In C with
 *		kept plans, not a PL/pgSQL call per report (docs/internals.md,
 *		"Reports"); the nacks (src/mail/mail_state.c) call it too.
 */
void
report_bounce(const char *address_key, bool hard, const char *detail, int64 mail_id)
{
	Oid			types[1] = {TEXTOID};
	Datum		count_arg;
	bool		isnull;
	int64		mails;

	SPI_connect();
	if (hard)
	{
		(void) gatekeeper_suppression_add(address_key, "hard_bounce", NULL, detail, mail_id);
		SPI_finish();
		return;
	}
	/*
	 * Not read-only: the count must see the event the caller just wrote.  By
	 * key (event_log_bounced): a generic plan made while event_log was nearly
	 * empty scanned all of it for every bounce, quadratic in a bounce storm
	 * (a benchmark run of 20,000 DSNs took over ten minutes).
	 */
	count_arg = CStringGetTextDatum(address_key);
	if (gatekeeper_execute_by_key(gatekeeper_plan(&soft_bounces_plan, soft_bounces_sql, 1, types),
								  &count_arg, NULL, false, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "counting soft bounces failed");
	mails = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	SPI_freetuptable(SPI_tuptable);
	if (!isnull && mails >= gatekeeper_soft_bounce_limit)
		(void) gatekeeper_suppression_add(address_key, "soft_bounce", NULL,
										  psprintf("soft bounces within 30 days: %d; the last: %s",
												   gatekeeper_soft_bounce_limit,
												   detail ? detail : ""),
										  mail_id);
	SPI_finish();
}

/*
 * Whether what find_sent_mail reads was derived from the partitions
 * catalog.c knows now: none of them invalidated since it was read.
 */
static bool
segment_rels_current(void)
{
	int			i;

	for (i = 0; i < GATEKEEPER_SEGMENTS; i++)
	{
		SegmentRels *r = &segment_rels[i];

		if (r->done_generation != gatekeeper_relid_generation(GATEKEEPER_REL_MAIL_DONE_PART(i)) ||
			r->mail_generation != gatekeeper_relid_generation(GATEKEEPER_REL_MAIL_PART(i)))
			return false;
	}
	return true;
}

/*
 * The column number of name in rel; an error when it has none (the
 * schema is not the library's).
 */
static AttrNumber
column_of(Relation rel, const char *name)
{
	TupleDesc	desc = RelationGetDescr(rel);
	int			i;

	for (i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);

		if (!att->attisdropped && strcmp(NameStr(att->attname), name) == 0)
			return att->attnum;
	}
	elog(ERROR, "table \"%s\" has no column \"%s\"", RelationGetRelationName(rel), name);
	return InvalidAttrNumber;	/* keep the compiler quiet */
}

/*
 * The primary key of rel, checked to lead with its id and segment columns
 * (find_sent_mail's scan keys).
 */
static Oid
id_index_of(Relation rel)
{
	Oid			indexid = RelationGetPrimaryKeyIndex(rel);
	Relation	index;
	bool		ok;

	if (!OidIsValid(indexid))
		elog(ERROR, "table \"%s\" has no primary key", RelationGetRelationName(rel));
	index = index_open(indexid, AccessShareLock);
	ok = index->rd_index->indnkeyatts >= 2 &&
		index->rd_index->indkey.values[0] == column_of(rel, "id") &&
		index->rd_index->indkey.values[1] == column_of(rel, "segment");
	index_close(index, AccessShareLock);
	if (!ok)
		elog(ERROR, "the primary key of \"%s\" is not (id, segment)", RelationGetRelationName(rel));
	return indexid;
}

/*
 * Derive what find_sent_mail reads of the partitions, unless it is
 * current.
 */
static void
segment_rels_load(void)
{
	int			i;

	if (segment_rels_valid && segment_rels_current())
		return;
	segment_rels_valid = false;
	for (i = 0; i < GATEKEEPER_SEGMENTS; i++)
	{
		SegmentRels *r = &segment_rels[i];
		Relation	rel;

		r->done_relid = gatekeeper_relid(GATEKEEPER_REL_MAIL_DONE_PART(i), true);
		r->done_generation = gatekeeper_relid_generation(GATEKEEPER_REL_MAIL_DONE_PART(i));
		r->mail_relid = gatekeeper_relid(GATEKEEPER_REL_MAIL_PART(i), true);
		r->mail_generation = gatekeeper_relid_generation(GATEKEEPER_REL_MAIL_PART(i));
		if (!OidIsValid(r->done_relid) || !OidIsValid(r->mail_relid))
			elog(ERROR, "the partitions of segment %d of gatekeeper.mail and gatekeeper.mail_done are missing", i);

		rel = table_open(r->done_relid, AccessShareLock);
		r->done_index = id_index_of(rel);
		r->done_queue = column_of(rel, "queue");
		r->done_state = column_of(rel, "state");
		r->done_message_id = column_of(rel, "message_id");
		if (i == 0)
			sent_state = DatumGetObjectId(DirectFunctionCall2(enum_in, CStringGetDatum("sent"),
															  ObjectIdGetDatum(TupleDescAttr(RelationGetDescr(rel),
																							 r->done_state - 1)->atttypid)));
		table_close(rel, AccessShareLock);

		rel = table_open(r->mail_relid, AccessShareLock);
		r->mail_index = id_index_of(rel);
		r->mail_recipient = column_of(rel, "recipient");
		table_close(rel, AccessShareLock);
	}

	/*
	 * An invalidation while loading (opening a partition takes a lock, which
	 * reads invalidations) moved a count: load again next time.
	 */
	segment_rels_valid = segment_rels_current();
}

/*
 * Fetch the row of relid whose id (and segment, when by_segment) is the
 * given one, by its primary key indexid, as the active snapshot sees it:
 * true and the row in *slot, relid open in *rel (the caller drops the
 * slot and closes the relation), or false and nothing open.
 */
static bool
fetch_by_id(Oid relid, Oid indexid, int64 id, int16 segment, bool by_segment,
			TupleTableSlot **slot, Relation *rel)
{
	Relation	heap = table_open(relid, AccessShareLock);
	Relation	index = index_open(indexid, AccessShareLock);
	IndexScanDesc scan;
	ScanKeyData keys[2];
	int			nkeys = by_segment ? 2 : 1;
	bool		found = false;

	ScanKeyInit(&keys[0], 1, BTEqualStrategyNumber, F_INT8EQ, Int64GetDatum(id));
	ScanKeyInit(&keys[1], 2, BTEqualStrategyNumber, F_INT2EQ, Int16GetDatum(segment));
	*slot = table_slot_create(heap, NULL);
	scan = index_beginscan(heap, index, GetActiveSnapshot(), nkeys, 0);
	index_rescan(scan, keys, nkeys, NULL, 0);
	found = index_getnext_slot(scan, ForwardScanDirection, *slot);
	index_endscan(scan);
	index_close(index, AccessShareLock);
	if (!found)
	{
		ExecDropSingleTupleTableSlot(*slot);
		*slot = NULL;
		table_close(heap, AccessShareLock);
		return false;
	}
	*rel = heap;
	return true;
}

/*
 * The sent mail id, read into *mail (palloc'd in the current memory
 * context): its mail_done row, state sent, in whichever segment holds it,
 * and its mail row in that segment.  false when there is none.
 */
static bool
find_sent_mail(int64 id, SentMail *mail)
{
	int			i;

	segment_rels_load();
	for (i = 0; i < GATEKEEPER_SEGMENTS; i++)
	{
		SegmentRels r = segment_rels[i];	/* a copy: opening may invalidate */
		TupleTableSlot *slot;
		Relation	rel;
		bool		isnull;
		Datum		v;
		bool		sent;

		if (!fetch_by_id(r.done_relid, r.done_index, id, (int16) i, false, &slot, &rel))
			continue;
		v = slot_getattr(slot, r.done_state, &isnull);
		sent = !isnull && DatumGetObjectId(v) == sent_state;
		if (sent)
		{
			v = slot_getattr(slot, r.done_queue, &isnull);
			mail->queue = isnull ? NULL : TextDatumGetCString(v);
			v = slot_getattr(slot, r.done_message_id, &isnull);
			mail->message_id = isnull ? NULL : TextDatumGetCString(v);
			mail->segment = (int16) i;
		}
		ExecDropSingleTupleTableSlot(slot);
		table_close(rel, AccessShareLock);
		if (!sent)
			continue;

		if (!fetch_by_id(r.mail_relid, r.mail_index, id, (int16) i, true, &slot, &rel))
			continue;
		v = slot_getattr(slot, r.mail_recipient, &isnull);
		mail->recipient = isnull ? NULL : TextDatumGetCString(v);
		ExecDropSingleTupleTableSlot(slot);
		table_close(rel, AccessShareLock);
		if (mail->queue != NULL && mail->recipient != NULL)
			return true;
	}
	return false;
}

/*
 * Record one report (a DSN's recipient group, an ARF report, a webhook's
 * event) about mail id: only when the mail was sent, its Message-ID is
 * message_id (when given: the report found the mail by it) and its
 * recipient is recipient1 or recipient2 (when either is given).  A
 * Message-ID without a MAC (!signed_id: mail sent before there was one,
 * whose neighbours' recipients could write it) counts only with a
 * recipient, the mail's.  Writes the event, in the mail's retention
 * segment, and what it does to the suppression list (report_bounce, or a
 * global complaint), and puts the row recorded into out (when not NULL).
 * The same event (event, source, status and detail) taken before for the
 * mail (a DSN or webhook delivered twice) writes nothing and is no row,
 * but sets *matched (when not NULL) as a new one does.  A complaint or
 * bounce of a mail that has one from a report already is written as a
 * repeat: kept, counted in no total, suppressing no one.  Returns the rows
 * recorded, 0 or 1.  SPI must be connected.
 */
static int
report_rows(int64 id, const char *message_id, bool signed_id,
			const char *recipient1, const char *recipient2,
			const char *event, const char *status, const char *detail,
			const char *source, Tuplestorestate *out, TupleDesc desc,
			bool *matched)
{
	Oid			event_types[10] = {INT8OID, TEXTOID, TEXTOID, TEXTOID, TEXTOID, TEXTOID, TEXTOID,
	INT2OID, BOOLOID, TEXTOID};
	Datum		args[10];
	char		nulls[10] = {' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', 'n'};
	bool		counted = strcmp(event, "bounced") == 0 || strcmp(event, "complained") == 0;
	SPIPlanPtr	plan;
	SentMail	mail;
	char	   *queue;
	int16		segment;
	char	   *recipient;
	TroubleReason reason = TROUBLE_OTHER;

	if (!find_sent_mail(id, &mail))
		return 0;
	queue = mail.queue;
	segment = mail.segment;
	recipient = mail.recipient;
	if (message_id != NULL && (mail.message_id == NULL || strcmp(mail.message_id, message_id) != 0))
		return 0;
	if (message_id != NULL && !signed_id && recipient1 == NULL && recipient2 == NULL)
		return 0;
	if ((recipient1 != NULL || recipient2 != NULL) &&
		!gatekeeper_same_address(recipient1, recipient) &&
		!gatekeeper_same_address(recipient2, recipient))
		return 0;

	args[0] = Int64GetDatum(id);
	args[1] = CStringGetTextDatum(queue);
	args[2] = CStringGetTextDatum(recipient);
	args[3] = CStringGetTextDatum(event);
	if (status)
		args[4] = CStringGetTextDatum(status);
	else
		nulls[4] = 'n';
	if (detail)
		args[5] = CStringGetTextDatum(detail);
	else
		nulls[5] = 'n';
	args[6] = CStringGetTextDatum(source);
	args[7] = Int16GetDatum(segment);
	args[8] = BoolGetDatum(false);
	/* why a failure failed: the classifier the suppression below reads too */
	if (strcmp(event, "bounced") == 0 || strcmp(event, "deferred") == 0)
	{
		reason = smtp_trouble_reason(status, detail);
		args[9] = CStringGetTextDatum(smtp_trouble_name(reason));
		nulls[9] = ' ';
	}
	plan = gatekeeper_plan(&insert_event_plan, insert_event_sql, 10, event_types);
	if (SPI_execute_plan(plan, args, nulls, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "writing an event failed");
	if (matched != NULL)
		*matched = true;
	if (SPI_processed == 0 && counted)
	{
		/* the mail has its complaint or bounce (event_log_counted): a repeat */
		args[8] = BoolGetDatum(true);
		if (SPI_execute_plan(plan, args, nulls, false, 0) != SPI_OK_INSERT)
			elog(ERROR, "writing an event failed");
		counted = false;
	}
	/* taken before (event_log_report): the same event again changes nothing */
	if (SPI_processed == 0)
		return 0;

	suppress_for_report(id, queue, recipient, event, counted, reason, detail);
	if (out != NULL)
	{
		Datum		values[5];
		bool		vnulls[5] = {false, false, false, status == NULL, detail == NULL};

		values[0] = Int64GetDatum(id);
		values[1] = CStringGetTextDatum(recipient);
		values[2] = CStringGetTextDatum(event);
		values[3] = status ? CStringGetTextDatum(status) : (Datum) 0;
		values[4] = detail ? CStringGetTextDatum(detail) : (Datum) 0;
		tuplestore_putvalues(out, desc, values, vnulls);
	}
	return 1;
}

/*
 * What a report's new event of mail id does to the suppression list: the
 * mail's counted bounce goes to report_bounce (hard by its reason, or
 * counted towards soft_bounce), its counted complaint suppresses the
 * recipient everywhere, an unsubscribe from the mail's queue.  Repeats
 * (!counted) and other events suppress no one.
 */
static void
suppress_for_report(int64 id, const char *queue, const char *recipient, const char *event,
					bool counted, TroubleReason reason, const char *detail)
{
	char	   *key;
	char	   *p;

	/* the suppression list keys addresses with their ASCII letters lower-cased */
	key = pstrdup(recipient);
	for (p = key; *p; p++)
		*p = pg_ascii_tolower((unsigned char) *p);
	if (counted && strcmp(event, "bounced") == 0)
		report_bounce(key, smtp_trouble_hard(reason), detail, id);
	else if (counted && strcmp(event, "complained") == 0)
		(void) gatekeeper_suppression_add(key, "complaint", NULL, detail, id);
	else if (strcmp(event, "unsubscribed") == 0)
		(void) gatekeeper_suppression_add(key, "unsubscribe", queue, detail, id);
}

/*
 * What Sendmail's "Transcript of session follows" says, up to the next
 * blank line, white space as one space (the mailer's own output, then
 * Sendmail's line with the status); NULL when the text has none.
 */
static char *
mailer_transcript(const char *text)
{
	const char *p = text ? strstr(text, "Transcript of session follows") : NULL;
	StringInfoData out;

	if (p == NULL || (p = strchr(p, '\n')) == NULL)
		return NULL;
	initStringInfo(&out);
	for (p++; *p != '\0' && out.len < 900; p++)
	{
		if (*p == '\n')
		{
			const char *q = p + 1;

			while (*q == ' ' || *q == '\t' || *q == '\r')
				q++;
			if (*q == '\n' || *q == '\0')
				break;
		}
		if (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')
		{
			if (out.len > 0 && out.data[out.len - 1] != ' ')
				appendStringInfoChar(&out, ' ');
		}
		else
			appendStringInfoChar(&out, *p);
	}
	while (out.len > 0 && out.data[out.len - 1] == ' ')
		out.data[--out.len] = '\0';
	if (out.len == 0)
	{
		pfree(out.data);
		return NULL;
	}
	return out.data;
}

/*
 * The event of a DSN's recipient group: its Action's, or, where it gives
 * none, its Status's class (5 failed, 4 delayed); NULL for neither.
 */
static const char *
dsn_event(const ReportRecipient *rr)
{
	const char *action = rr->action;

	if (action == NULL)
	{
		if (rr->status != NULL && rr->status[0] == '5')
			return "bounced";
		if (rr->status != NULL && rr->status[0] == '4')
			return "deferred";
		return NULL;
	}
	if (strcmp(action, "failed") == 0)
		return "bounced";
	if (strcmp(action, "delayed") == 0)
		return "deferred";
	if (strcmp(action, "delivered") == 0 || strcmp(action, "relayed") == 0 ||
		strcmp(action, "expanded") == 0)
		return "delivered";
	return NULL;
}

/*
 * gatekeeper_report_envelope_refresh
 *		Forget the return paths and the key the envelopes read: see
 *		report.h.
 */
void
gatekeeper_report_envelope_refresh(void)
{
	nreturn_paths = 0;
	verp_keyed = false;
	if (envelope_cxt != NULL)
		MemoryContextReset(envelope_cxt);
}

/*
 * gatekeeper_report_envelope
 *		The envelope sender and VERP token of a mail: see report.h.  Only a
 *		queue not looked up since the last refresh, or a key not derived
 *		since, takes a snapshot and SPI.
 */
char *
gatekeeper_report_envelope(const char *queue, int64 mail_id, char **token)
{
	MemoryContext caller = CurrentMemoryContext;
	char	   *template = NULL;
	char	   *result = NULL;
	bool		found = false;
	int			i;

	/* a dropped extension has no return paths (the caller's mail goes as is) */
	if (!OidIsValid(gatekeeper_relid(GATEKEEPER_REL_QUEUE, true)))
	{
		*token = NULL;
		return NULL;
	}
	for (i = 0; i < nreturn_paths; i++)
	{
		if (strcmp(return_paths[i].queue, queue) == 0)
		{
			template = return_paths[i].return_path;
			found = true;
			break;
		}
	}
	if (!found || !verp_keyed)
	{
		bool		pushed = false;

		if (envelope_cxt == NULL)
			envelope_cxt = AllocSetContextCreate(TopMemoryContext,
												 "gatekeeper envelopes",
												 ALLOCSET_SMALL_SIZES);
		/* the worker builds messages in a transaction with no snapshot yet */
		if (!ActiveSnapshotSet())
		{
			PushActiveSnapshot(GetTransactionSnapshot());
			pushed = true;
		}
		SPI_connect();
		if (!found)
		{
			Oid			argtype = TEXTOID;
			Datum		arg = CStringGetTextDatum(queue);
			bool		isnull = true;
			Datum		v = (Datum) 0;

			if (SPI_execute_plan(gatekeeper_plan(&return_path_plan, return_path_sql, 1, &argtype),
								 &arg, NULL, true, 1) != SPI_OK_SELECT)
				elog(ERROR, "reading the return_path of queue \"%s\" failed", queue);
			if (SPI_processed == 1)
				v = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
			if (!isnull)
				template = MemoryContextStrdup(envelope_cxt, TextDatumGetCString(v));
			if (nreturn_paths < RETURN_PATH_CACHE && strlen(queue) < sizeof(return_paths[0].queue))
			{
				strlcpy(return_paths[nreturn_paths].queue, queue, sizeof(return_paths[0].queue));
				return_paths[nreturn_paths].return_path = template;
				nreturn_paths++;
			}
		}
		verp_key();
		/* what is made below is the caller's, and outlives SPI_finish */
		MemoryContextSwitchTo(caller);
		*token = verp_token(mail_id, true);
		SPI_finish();
		if (pushed)
			PopActiveSnapshot();
	}
	else
		*token = verp_token(mail_id, true);

	if (template != NULL)
	{
		const char *at = strstr(template, TOKEN_PLACEHOLDER);

		if (at == NULL)
			result = pstrdup(template);
		else
			result = psprintf("%.*s%s%s", (int) (at - template), template, *token,
							  at + strlen(TOKEN_PLACEHOLDER));
	}
	return result;
}

/*
 * gatekeeper._verp_token(mail_id bigint) RETURNS text
 *		The token the worker puts in the mail's envelope (for tests, and for
 *		an operator checking a bounce address).
 */
Datum
gatekeeper_verp_token(PG_FUNCTION_ARGS)
{
	MemoryContext caller = CurrentMemoryContext;
	text	   *result;

	gatekeeper_require_schema();
	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("mail_id must not be null")));
	SPI_connect();
	result = (text *) MemoryContextAlloc(caller, VARHDRSZ + GATEKEEPER_VERP_TOKEN_LEN);
	SET_VARSIZE(result, VARHDRSZ + GATEKEEPER_VERP_TOKEN_LEN);
	memcpy(VARDATA(result), verp_token(PG_GETARG_INT64(0), false), GATEKEEPER_VERP_TOKEN_LEN);
	SPI_finish();
	PG_RETURN_TEXT_P(result);
}

/*
 * gatekeeper._check_return_path(value text) RETURNS void
 *		Raise 22023 unless value (NULL: none) can be a queue's return_path:
 *		an address once {token} is replaced, {token} at most once, in the
 *		local part, as a word of its own (set apart by + - = . _ or the
 *		part's ends); 54000 when the local part or the address would be too
 *		long for SMTP (64 and 254 octets).
 */
Datum
gatekeeper_check_return_path(PG_FUNCTION_ARGS)
{
	char	   *value;
	const char *token;
	const char *at;
	const char *problem;
	char		sample[GATEKEEPER_VERP_TOKEN_LEN + 1];
	char	   *expanded;
	size_t		local_len;

	if (PG_ARGISNULL(0))
		PG_RETURN_VOID();
	value = text_to_cstring(PG_GETARG_TEXT_PP(0));
	at = strrchr(value, '@');
	token = strstr(value, TOKEN_PLACEHOLDER);
	if (token != NULL && strstr(token + 1, TOKEN_PLACEHOLDER) != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid return_path \"%s\"", value),
				 errdetail("{token} may appear at most once.")));
	if (token != NULL &&
		(at == NULL || token > at ||
		 (token > value && strchr("+-=._", token[-1]) == NULL) ||
		 strchr("+-=._@", token[strlen(TOKEN_PLACEHOLDER)]) == NULL))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid return_path \"%s\"", value),
				 errdetail("{token} must be a word of the local part of its own, set apart by one of + - = . _ or the local part's ends."),
				 errhint("Write it as 'bounces+{token}@bounce.example.com'.")));

	memset(sample, 'a', GATEKEEPER_VERP_TOKEN_LEN);
	sample[GATEKEEPER_VERP_TOKEN_LEN] = '\0';
	if (token != NULL)
		expanded = psprintf("%.*s%s%s", (int) (token - value), value, sample,
							token + strlen(TOKEN_PLACEHOLDER));
	else
		expanded = value;
	problem = gatekeeper_address_problem(expanded);
	if (problem != NULL || strchr(expanded, '<') != NULL || strchr(expanded, ' ') != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid return_path \"%s\"", value),
				 errdetail("%s", problem ? problem : "The return path must be a bare address.")));
	at = strrchr(expanded, '@');
	local_len = at ? (size_t) (at - expanded) : strlen(expanded);
	if (local_len > 64 || strlen(expanded) > 254)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("return_path \"%s\" is too long", value),
				 errdetail("With its token the local part has %d octets and the address %d; SMTP allows 64 and 254.",
						   (int) local_len, (int) strlen(expanded))));
	PG_RETURN_VOID();
}

/*
 * Find the mail a message is about, into *m: a VERP token in the address
 * the MTA delivered it to (envelope_to, then the report's Delivered-To,
 * X-Original-To and To), else, in a report or a forwarded message, a
 * token the report carries (its ENVID, the original MAIL FROM, the
 * returned Return-Path), else the returned Message-ID.
 */
static void
find_reported_mail(const ParsedReport *r, const char *envelope_to, ReportedMail *m)
{
	const char *carriers[4];
	int			i;

	memset(m, 0, sizeof(*m));
	carriers[0] = envelope_to;
	carriers[1] = r->delivered_to[0];
	carriers[2] = r->delivered_to[1];
	carriers[3] = r->delivered_to[2];
	for (i = 0; i < (int) lengthof(carriers) && !m->found; i++)
		m->found = token_in(carriers[i], &m->id);
	m->delivered_to_token = m->found;
	if (r->kind != REPORT_NONE || r->forwarded)
	{
		const char *more[3];

		more[0] = r->envid;
		more[1] = r->original_mail_from;
		more[2] = r->returned_return_path;
		for (i = 0; i < (int) lengthof(more) && !m->found; i++)
			m->found = token_in(more[i], &m->id);
		if (!m->found)
		{
			MessageIdKind kind = gatekeeper_message_id_check(r->returned_message_id, &m->id);

			m->found = kind != MESSAGE_ID_NONE;
			m->signed_id = kind == MESSAGE_ID_SIGNED;
			m->message_id = r->returned_message_id;
		}
	}
}

/*
 * The detail of a DSN's recipient group: its Diagnostic-Code, or, where
 * that says too little about the report's only recipient, what the
 * report's text says.  May give rr a status read from the text.
 */
static const char *
dsn_group_diagnostic(const ParsedReport *r, ReportRecipient *rr)
{
	const char *diagnostic = rr->diagnostic;

	/*
	 * A group without Diagnostic-Code about the report's only recipient:
	 * what failed is in the report's text, as Exim writes its own failures
	 * ("Status: 5.0.0", and "Unrouteable address" or "mailbox is full" for
	 * people only).
	 */
	if (diagnostic == NULL && r->nrecipients == 1)
	{
		char	   *text_status;
		char	   *text_line;

		if (smtp_trouble_in_text(r->text, &text_status, &text_line))
		{
			diagnostic = report_clean(text_line, strlen(text_line));
			/* a status of its class only gives way to the text's */
			if (text_status != NULL && rr->status != NULL &&
				strcmp(rr->status + 1, ".0.0") == 0 &&
				text_status[0] == rr->status[0])
				rr->status = report_clean(text_status, strlen(text_status));
		}
	}

	/*
	 * Sendmail gives a local or program mailer's failure as its exit code
	 * only ("Diagnostic-Code: X-Unix; 73", EX_CANTCREAT): what the mailer
	 * said ("Quota exceeded") is in the transcript of the text.  An expiry
	 * (4.4.7) keeps the reason its status gives.
	 */
	if (diagnostic != NULL && r->nrecipients == 1 && rr->status != NULL &&
		rr->status[0] == '5' && diagnostic[0] != '\0' &&
		diagnostic[strspn(diagnostic, "0123456789")] == '\0')
	{
		char	   *said = mailer_transcript(r->text);

		if (said != NULL)
			diagnostic = said;
	}
	return diagnostic;
}

/*
 * Record the recipient groups of a DSN about mail m: one event each, for
 * a group that names the mail's recipient (or, found by a token of the
 * address delivered to, names none).  Sets *usable when any group was
 * one to record.  Returns the rows recorded.
 */
static int
record_dsn_groups(ParsedReport *r, const ReportedMail *m, ReturnSetInfo *rsinfo,
				  bool *usable)
{
	int			rows = 0;
	int			i;

	for (i = 0; i < r->nrecipients; i++)
	{
		ReportRecipient *rr = &r->recipients[i];
		const char *event = dsn_event(rr);
		const char *diagnostic;

		if (event == NULL)
			continue;
		diagnostic = dsn_group_diagnostic(r, rr);

		/*
		 * OpenSMTPD 6.8 reports the expiry of a mail it gave up on as
		 * "Action: delayed", "Status: 4.4.7" and "Envelope expired": the
		 * mail will not be delivered, which is a bounce.
		 */
		if (strcmp(event, "deferred") == 0 && rr->status != NULL &&
			strcmp(rr->status, "4.4.7") == 0 && diagnostic != NULL &&
			pg_strcasecmp(diagnostic + strlen(diagnostic) -
						  Min(strlen(diagnostic), 16), "envelope expired") == 0)
			event = "bounced";

		/*
		 * A group that names no recipient names none we sent to, unless a
		 * token names the mail: then it is about the mail's.
		 */
		if (rr->final_recipient == NULL && rr->original_recipient == NULL &&
			(m->message_id != NULL || !m->delivered_to_token))
			continue;
		*usable = true;
		rows += report_rows(m->id, m->message_id, m->signed_id, rr->final_recipient,
							rr->original_recipient, event, rr->status, diagnostic,
							"dsn", rsinfo->setResult, rsinfo->setDesc, NULL);
	}
	return rows;
}

/*
 * Record an ARF report about mail m: abuse and fraud are a complaint, an
 * opt-out that names its Removal-Recipient an unsubscribe, any other
 * feedback type (not-spam, auth-failure, virus, ...) a feedback event,
 * kept and suppressing no one.  Returns the rows recorded.
 */
static int
record_feedback_report(const ParsedReport *r, const ReportedMail *m, ReturnSetInfo *rsinfo)
{
	char	   *detail = psprintf("Feedback-Type: %s%s%s", r->feedback_type,
								  r->user_agent ? "; User-Agent: " : "",
								  r->user_agent ? r->user_agent : "");

	if (strcmp(r->feedback_type, "abuse") == 0 || strcmp(r->feedback_type, "fraud") == 0)
		return report_rows(m->id, m->message_id, m->signed_id, r->original_rcpt_to, NULL,
						   "complained", NULL, detail, "arf", rsinfo->setResult,
						   rsinfo->setDesc, NULL);
	if (strcmp(r->feedback_type, "opt-out") == 0 && r->removal_recipient != NULL)
		return report_rows(m->id, m->message_id, m->signed_id, r->removal_recipient, NULL,
						   "unsubscribed", NULL, detail, "arf", rsinfo->setResult,
						   rsinfo->setDesc, NULL);
	return report_rows(m->id, m->message_id, m->signed_id, r->original_rcpt_to, NULL,
					   "feedback", r->feedback_type, detail, "arf", rsinfo->setResult,
					   rsinfo->setDesc, NULL);
}

/*
 * Record a complaint forwarded with the message it is about, which must
 * name the mail itself: by the token of its Return-Path or a Message-ID
 * with its MAC, never by a Message-ID without one.  Returns the rows
 * recorded.
 */
static int
record_forwarded_complaint(const ParsedReport *r, ReturnSetInfo *rsinfo)
{
	int64		fwd = 0;
	const char *fwd_id = NULL;

	if (!token_in(r->returned_return_path, &fwd))
	{
		fwd_id = r->returned_message_id;
		if (fwd_id == NULL ||
			gatekeeper_message_id_check(fwd_id, &fwd) != MESSAGE_ID_SIGNED)
			return 0;
	}
	return report_rows(fwd, fwd_id, true, NULL, NULL, "complained", NULL,
					   "a complaint forwarded with the message", "arf",
					   rsinfo->setResult, rsinfo->setDesc, NULL);
}

/*
 * Record a message about mail m that holds no report part that could be
 * read: a bounce written for people (Exim's and qmail's text, a
 * provider's own layout), one bounced event, or deferred when it only
 * warns of a delay, its status and detail read from its text; a
 * complaint forwarded with the mail it is about; an auto-reply, nothing.
 * Returns the rows recorded.
 */
static int
record_plain_message(const ParsedReport *r, const ReportedMail *m, ReturnSetInfo *rsinfo)
{
	char	   *status = NULL;
	char	   *line = NULL;
	bool		failure;

	/*
	 * What says a delivery failed: a daemon's From, a failure Subject, a
	 * status quoted; not a phrase alone ("unsolicited" in an abuse desk's
	 * note, "away" in a vacation message).
	 */
	(void) smtp_trouble_in_text(r->text, &status, &line);
	failure = status != NULL || r->from_daemon || r->failure_subject ||
		r->kind == REPORT_DSN;

	if (r->kind == REPORT_NONE && r->forwarded && !failure && !r->auto_reply)
		return record_forwarded_complaint(r, rsinfo);
	if (m->delivered_to_token && (failure || !r->auto_reply))
		return report_rows(m->id, NULL, false, NULL, NULL,
						   r->delay_notice ? "deferred" : "bounced",
						   status ? report_clean(status, strlen(status)) : NULL,
						   line ? report_clean(line, strlen(line)) : NULL,
						   "dsn", rsinfo->setResult, rsinfo->setDesc, NULL);
	return 0;
}

/*
 * gatekeeper.ingest_report(message text, envelope_to text DEFAULT NULL)
 *		RETURNS TABLE (mail_id bigint, recipient text, event text,
 *					   status text, detail text)
 *		Read one raw message as the bounce mailbox received it: a DSN gives
 *		one row per recipient group that names a mail gatekeeper sent to
 *		that recipient; an ARF report one complaint, unsubscribe or
 *		feedback event; a message delivered to a VERP address that is no
 *		usable report, one bounce (unless it is an auto-reply); a complaint
 *		forwarded with the message it is about, one complaint.  Anything
 *		else gives no row and writes nothing.  22004 for a NULL message, 54000
 *		for one over 64 MB; no other error comes of what it holds.
 */
Datum
gatekeeper_ingest_report(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	MemoryContext cxt;
	MemoryContext old;
	text	   *message;
	char	   *envelope_to = NULL;
	ParsedReport r;
	ReportedMail m;
	bool		usable = false;
	int			rows = 0;

	gatekeeper_require_schema();
	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("message must not be null")));
	message = PG_GETARG_TEXT_PP(0);
	if (VARSIZE_ANY_EXHDR(message) > REPORT_MAX_MESSAGE)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("report is too large"),
				 errdetail("The message has %zu octets; ingest_report() reads at most %d.",
						   (size_t) VARSIZE_ANY_EXHDR(message), REPORT_MAX_MESSAGE)));
	InitMaterializedSRF(fcinfo, 0);

	cxt = AllocSetContextCreate(CurrentMemoryContext, "gatekeeper report",
								ALLOCSET_DEFAULT_SIZES);
	old = MemoryContextSwitchTo(cxt);
	if (!PG_ARGISNULL(1))
	{
		text	   *t = PG_GETARG_TEXT_PP(1);

		if (VARSIZE_ANY_EXHDR(t) <= 1000)
			envelope_to = report_clean(VARDATA_ANY(t), VARSIZE_ANY_EXHDR(t));
	}
	report_parse(VARDATA_ANY(message), VARSIZE_ANY_EXHDR(message), &r);

	SPI_connect();
	find_reported_mail(&r, envelope_to, &m);
	if (m.found && r.kind == REPORT_DSN)
		rows += record_dsn_groups(&r, &m, rsinfo, &usable);
	else if (m.found && r.kind == REPORT_ARF)
	{
		usable = true;
		rows += record_feedback_report(&r, &m, rsinfo);
	}
	if (m.found && !usable)
		rows += record_plain_message(&r, &m, rsinfo);
	mail_store_count_report(rows > 0);
	SPI_finish();
	MemoryContextSwitchTo(old);
	MemoryContextDelete(cxt);
	return (Datum) 0;
}

/*
 * gatekeeper.record_event(message_id text, event text, status text,
 *						   detail text, recipient text) RETURNS bigint
 *		Record an ESP webhook's event for the sent mail whose Message-ID
 *		(with or without its angle brackets) is message_id, and whose
 *		recipient is recipient when given (and must be, for a Message-ID
 *		without a MAC): its id, or NULL (and nothing written) when there
 *		is no such mail.  event is deferred, bounced,
 *		delivered or complained (22023 otherwise); message_id and event
 *		must not be NULL (22004).
 */
Datum
gatekeeper_record_event(PG_FUNCTION_ARGS)
{
	static const char *const events[] = {"deferred", "bounced", "delivered", "complained"};
	char	   *event;
	char	   *message_id = NULL;
	char	   *status = NULL;
	char	   *detail = NULL;
	char	   *recipient = NULL;
	int64		id;
	int			rows = 0;
	bool		matched = false;
	MessageIdKind kind;
	int			i;

	gatekeeper_require_schema();
	if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("message_id and event must not be null")));
	event = text_to_cstring(PG_GETARG_TEXT_PP(1));
	for (i = 0; i < (int) lengthof(events); i++)
		if (strcmp(event, events[i]) == 0)
			break;
	if (i == (int) lengthof(events))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid event \"%s\"", event),
				 errdetail("event must be deferred, bounced, delivered or complained.")));

	{
		text	   *t = PG_GETARG_TEXT_PP(0);
		char	   *v = report_clean(VARDATA_ANY(t), Min(VARSIZE_ANY_EXHDR(t), 1000));

		if (v != NULL && v[0] != '<')
			message_id = psprintf("<%s>", v);
		else
			message_id = v;
	}
	if (!PG_ARGISNULL(2))
	{
		text	   *t = PG_GETARG_TEXT_PP(2);

		status = report_clean(VARDATA_ANY(t), Min(VARSIZE_ANY_EXHDR(t), 64));
	}
	if (!PG_ARGISNULL(3))
	{
		text	   *t = PG_GETARG_TEXT_PP(3);

		detail = report_clean(VARDATA_ANY(t), Min(VARSIZE_ANY_EXHDR(t), 4000));
	}
	if (!PG_ARGISNULL(4))
	{
		text	   *t = PG_GETARG_TEXT_PP(4);

		recipient = report_clean(VARDATA_ANY(t), Min(VARSIZE_ANY_EXHDR(t), 1000));
	}

	SPI_connect();
	kind = gatekeeper_message_id_check(message_id, &id);
	if (kind != MESSAGE_ID_NONE)
		rows = report_rows(id, message_id, kind == MESSAGE_ID_SIGNED, recipient, NULL,
						   event, status, detail, "webhook", NULL, NULL, &matched);
	mail_store_count_report(rows > 0);
	SPI_finish();
	/* an event taken before names the mail too: the endpoint may answer OK */
	if (!matched)
		PG_RETURN_NULL();
	PG_RETURN_INT64(id);
}
