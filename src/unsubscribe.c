/*-------------------------------------------------------------------------
 *
 * unsubscribe.c
 *		One-click unsubscribe (RFC 8058): the token in a queue's
 *		unsubscribe_url, and gatekeeper.unsubscribe(token).
 *
 * A token names a recipient and a queue and is signed with HMAC-SHA256
 * under a secret drawn when the extension is created
 * (gatekeeper.unsubscribe_secret, which only the extension's owner
 * reads).  It is URL-safe base64 without padding of
 *
 *		version (1) | length of recipient (1) | recipient | queue | HMAC (32)
 *
 * where the HMAC covers everything before it.  The application's
 * unsubscribe endpoint passes the token to gatekeeper.unsubscribe(), which
 * checks the HMAC in constant time and suppresses the recipient for that
 * queue.  Anything else (a forged, altered or truncated token, one signed
 * under another database's secret) is refused with 22023.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/hmac.h"
#include "common/sha2.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "storage/proc.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"

#include "gatekeeper.h"
#include "suppression.h"
#include "unsubscribe.h"
#include "address.h"
#include "catalog.h"
#include "validate.h"

#define TOKEN_VERSION		1
#define TOKEN_MAC_LEN		PG_SHA256_DIGEST_LENGTH
#define TOKEN_MAX_RECIPIENT 254
#define SECRET_MAX_LEN		64
#define TOKEN_PLACEHOLDER	"{token}"

/* the secret, read once per transaction */
static uint8 secret[SECRET_MAX_LEN];
static int	secret_len = 0;
static LocalTransactionId secret_lxid = InvalidLocalTransactionId;
static SPIPlanPtr read_secret_plan = NULL;

static const char read_secret_sql[] =
"SELECT s.secret FROM gatekeeper.unsubscribe_secret s";

static const char base64url_digits[] =
"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

static void load_secret(void);
static void sign(const uint8 *data, int len, uint8 *mac);
static int	token_max_len(const char *queue);
static char *base64url_encode(const uint8 *data, int len);
static uint8 *base64url_decode(const char *text, int *len);
static char *make_token(const char *recipient, const char *queue);

/*
 * load_secret
 *		Read gatekeeper.unsubscribe_secret, unless this transaction has.
 */
static void
load_secret(void)
{
	bytea	   *value;
	bool		isnull;
	int			ret;

	if (secret_lxid == MyProc->lxid && secret_len > 0)
		return;
	ret = SPI_execute_plan(gatekeeper_plan(&read_secret_plan, read_secret_sql, 0, NULL),
						   NULL, NULL, true, 2);
	if (ret != SPI_OK_SELECT)
		elog(ERROR, "reading the unsubscribe secret failed: %s",
			 SPI_result_code_string(ret));
	if (SPI_processed != 1)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("gatekeeper.unsubscribe_secret must hold one secret"),
				 errdetail("It holds %d.", (int) SPI_processed)));
	value = DatumGetByteaPP(SPI_getbinval(SPI_tuptable->vals[0],
										  SPI_tuptable->tupdesc, 1, &isnull));
	if (isnull || VARSIZE_ANY_EXHDR(value) < 32 ||
		VARSIZE_ANY_EXHDR(value) > SECRET_MAX_LEN)
		elog(ERROR, "the unsubscribe secret is not 32 to %d bytes", SECRET_MAX_LEN);
	secret_len = VARSIZE_ANY_EXHDR(value);
	memcpy(secret, VARDATA_ANY(value), secret_len);
	secret_lxid = MyProc->lxid;
}

/*
 * sign
 *		HMAC-SHA256 of data under the secret, into mac.
 */
static void
sign(const uint8 *data, int len, uint8 *mac)
{
	pg_hmac_ctx *ctx = pg_hmac_create(PG_SHA256);

	if (ctx == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("out of memory")));
	if (pg_hmac_init(ctx, secret, secret_len) < 0 ||
		pg_hmac_update(ctx, data, len) < 0 ||
		pg_hmac_final(ctx, mac, TOKEN_MAC_LEN) < 0)
	{
		const char *why = pstrdup(pg_hmac_error(ctx));

		pg_hmac_free(ctx);
		elog(ERROR, "could not compute HMAC-SHA256: %s", why);
	}
	pg_hmac_free(ctx);
}

/*
 * base64url_encode
 *		RFC 4648 section 5, without padding.
 */
static char *
base64url_encode(const uint8 *data, int len)
{
	char	   *out = palloc((len + 2) / 3 * 4 + 1);
	char	   *p = out;
	int			i;

	for (i = 0; i + 2 < len; i += 3)
	{
		uint32		v = (data[i] << 16) | (data[i + 1] << 8) | data[i + 2];

		*p++ = base64url_digits[(v >> 18) & 63];
		*p++ = base64url_digits[(v >> 12) & 63];
		*p++ = base64url_digits[(v >> 6) & 63];
		*p++ = base64url_digits[v & 63];
	}
	if (len - i == 1)
	{
		uint32		v = data[i] << 16;

		*p++ = base64url_digits[(v >> 18) & 63];
		*p++ = base64url_digits[(v >> 12) & 63];
	}
	else if (len - i == 2)
	{
		uint32		v = (data[i] << 16) | (data[i + 1] << 8);

		*p++ = base64url_digits[(v >> 18) & 63];
		*p++ = base64url_digits[(v >> 12) & 63];
		*p++ = base64url_digits[(v >> 6) & 63];
	}
	*p = '\0';
	return out;
}

/*
 * base64url_decode
 *		The bytes text encodes, or NULL when it is not unpadded base64url
 *		(a length that leaves one digit over, a digit outside the alphabet,
 *		or bits set beyond the last byte, which would let two texts stand
 *		for one token).
 */
static uint8 *
base64url_decode(const char *text, int *len)
{
	int			n = strlen(text);
	uint8	   *out;
	uint32		acc = 0;
	int			bits = 0;
	int			o = 0;
	int			i;

	if (n % 4 == 1)
		return NULL;
	out = palloc(n * 3 / 4 + 1);
	for (i = 0; i < n; i++)
	{
		const char *d = memchr(base64url_digits, text[i], 64);

		if (d == NULL || text[i] == '\0')
			return NULL;
		acc = (acc << 6) | (uint32) (d - base64url_digits);
		bits += 6;
		if (bits >= 8)
		{
			bits -= 8;
			out[o++] = (acc >> bits) & 0xff;
		}
	}
	if ((acc & ((1 << bits) - 1)) != 0)
		return NULL;
	*len = o;
	return out;
}

/*
 * token_max_len
 *		The longest token for queue (a recipient of 254 characters).
 */
static int
token_max_len(const char *queue)
{
	int			raw = 2 + TOKEN_MAX_RECIPIENT + strlen(queue) + TOKEN_MAC_LEN;

	return (raw * 4 + 2) / 3;
}

/*
 * make_token
 *		The signed token for (recipient, queue); recipient is lower-cased
 *		as the suppression list keeps it.
 */
static char *
make_token(const char *recipient, const char *queue)
{
	char	   *key = gatekeeper_recipient_key(recipient);
	int			rlen = strlen(key);
	int			qlen = strlen(queue);
	int			len = 2 + rlen + qlen;
	uint8	   *raw;

	if (rlen < 1 || rlen > TOKEN_MAX_RECIPIENT)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid recipient address \"%s\"", recipient)));
	if (qlen < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("queue name must not be empty")));
	load_secret();
	raw = palloc(len + TOKEN_MAC_LEN);
	raw[0] = TOKEN_VERSION;
	raw[1] = (uint8) rlen;
	memcpy(raw + 2, key, rlen);
	memcpy(raw + 2 + rlen, queue, qlen);
	sign(raw, len, raw + len);
	return base64url_encode(raw, len + TOKEN_MAC_LEN);
}

/*
 * gatekeeper_token_sign
 *		HMAC-SHA256 of data under the database's secret, into mac (32
 *		bytes): for the other tokens signed like these (src/report.c's VERP
 *		tokens, whose data never starts as an unsubscribe token's does).
 *		Call inside a transaction with SPI connected.
 */
void
gatekeeper_token_sign(const uint8 *data, int len, uint8 *mac)
{
	load_secret();
	sign(data, len, mac);
}

/*
 * gatekeeper_token_secret
 *		A copy of the database's secret into key (room for
 *		GATEKEEPER_TOKEN_SECRET_MAX bytes); returns its length.  For a
 *		signer that keeps its HMAC key past the transaction (src/report.c's
 *		VERP tokens in the worker) and so must say when it reads it again.
 *		Call inside a transaction with SPI connected.
 */
int
gatekeeper_token_secret(uint8 *key)
{
	StaticAssertStmt(SECRET_MAX_LEN <= GATEKEEPER_TOKEN_SECRET_MAX,
					 "the secret fits the caller's room");
	load_secret();
	memcpy(key, secret, secret_len);
	return secret_len;
}

/*
 * gatekeeper_check_unsubscribe_url
 *		Raise an error unless url is an https URL with {token} exactly once,
 *		of printable ASCII that may stand in angle brackets, short enough
 *		that with any token for queue it fits one header line.
 */
void
gatekeeper_check_unsubscribe_url(const char *url, const char *queue)
{
	const char *p;
	const char *host;
	const char *token;
	int			len = strlen(url);
	int			max_len;

	for (p = url; *p; p++)
	{
		unsigned char c = (unsigned char) *p;

		if (c <= 0x20 || c >= 0x7f || c == '<' || c == '>' || c == '"' || c == '\\')
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("invalid unsubscribe_url"),
					 errdetail("It holds a space, a control character, a non-ASCII character or one of <>\"\\ at octet %d.",
							   (int) (p - url) + 1),
					 errhint("Percent-encode it, and write the host in its ASCII (punycode) form.")));
	}
	if (pg_strncasecmp(url, "https://", 8) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid unsubscribe_url \"%s\"", url),
				 errdetail("The URL must begin with https:// (RFC 8058 one-click unsubscribe needs HTTPS).")));
	host = url + 8;
	for (p = host; *p && *p != '/' && *p != '?' && *p != '#'; p++)
	{
		if (!isalnum((unsigned char) *p) && *p != '.' && *p != '-' && *p != ':' &&
			*p != '[' && *p != ']')
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("invalid unsubscribe_url \"%s\"", url),
					 errdetail("The host may hold only letters, digits, dots, hyphens and a port.")));
	}
	if (p == host)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid unsubscribe_url \"%s\"", url),
				 errdetail("The URL has no host.")));
	token = strstr(url, TOKEN_PLACEHOLDER);
	if (token == NULL || strstr(token + 1, TOKEN_PLACEHOLDER) != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid unsubscribe_url \"%s\"", url),
				 errdetail("The URL must hold {token} exactly once, where each recipient's signed token goes.")));
	if (token < p)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid unsubscribe_url \"%s\"", url),
				 errdetail("{token} must come after the host.")));

	max_len = len - (int) strlen(TOKEN_PLACEHOLDER) + token_max_len(queue) + 2;
	if (max_len > GATEKEEPER_HEADER_WORD_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("unsubscribe_url is too long for queue \"%s\"", queue),
				 errdetail("With a token for the longest address, the List-Unsubscribe value would be %d octets without a space; at most %d can be written in one header line.",
						   max_len, GATEKEEPER_HEADER_WORD_MAX)));
}

/*
 * gatekeeper_unsubscribe_url
 *		url_template with {token} replaced by the token for (recipient,
 *		queue).
 */
char *
gatekeeper_unsubscribe_url(const char *url_template, const char *recipient,
						   const char *queue)
{
	const char *at = strstr(url_template, TOKEN_PLACEHOLDER);
	StringInfoData buf;

	if (at == NULL)
		elog(ERROR, "unsubscribe_url \"%s\" has no {token}", url_template);
	initStringInfo(&buf);
	appendBinaryStringInfo(&buf, url_template, at - url_template);
	appendStringInfoString(&buf, make_token(recipient, queue));
	appendStringInfoString(&buf, at + strlen(TOKEN_PLACEHOLDER));
	return buf.data;
}

/*
 * gatekeeper_headers_have
 *		Whether the mail's headers (a JSON object, or NULL) name this field,
 *		in any case.
 */
bool
gatekeeper_headers_have(Jsonb *headers, const char *name)
{
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken tok;
	int			len = strlen(name);

	if (headers == NULL || !JB_ROOT_IS_OBJECT(headers))
		return false;
	it = JsonbIteratorInit(&headers->root);
	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		if (tok == WJB_KEY && v.val.string.len == len &&
			pg_strncasecmp(v.val.string.val, name, len) == 0)
			return true;
	}
	return false;
}

/*
 * gatekeeper_unsubscribe_headers_size
 *		The octets of the header lines the claim adds to a mail to
 *		recipient in queue, whose unsubscribe_url is url_template, and
 *		whose own headers are headers (NULL: none): "List-Unsubscribe:
 *		<URL>" and "List-Unsubscribe-Post: List-Unsubscribe=One-Click",
 *		each with its CRLF, as the claim adds them (nothing when the mail
 *		brings its own List-Unsubscribe; no second List-Unsubscribe-Post).
 *		The token's length follows from the lengths of the recipient's key
 *		and the queue's name alone, so the secret is not read: the
 *		enqueuing role need not be able to.
 */
Size
gatekeeper_unsubscribe_headers_size(const char *url_template, const char *recipient,
									const char *queue, Jsonb *headers)
{
	static const char list_unsubscribe[] = "List-Unsubscribe: <>\r\n";
	static const char one_click[] = "List-Unsubscribe-Post: List-Unsubscribe=One-Click\r\n";
	int			raw;
	Size		size;

	if (gatekeeper_headers_have(headers, "List-Unsubscribe"))
		return 0;
	raw = 2 + strlen(gatekeeper_recipient_key(recipient)) + strlen(queue) + TOKEN_MAC_LEN;
	size = strlen(list_unsubscribe) + strlen(url_template) - strlen(TOKEN_PLACEHOLDER) +
		(raw * 4 + 2) / 3;
	if (!gatekeeper_headers_have(headers, "List-Unsubscribe-Post"))
		size += strlen(one_click);
	return size;
}

PG_FUNCTION_INFO_V1(gatekeeper_new_secret);

/*
 * gatekeeper._new_secret() RETURNS bytea
 *		32 bytes from pg_strong_random(), for gatekeeper.unsubscribe_secret.
 */
Datum
gatekeeper_new_secret(PG_FUNCTION_ARGS)
{
	bytea	   *result = palloc(VARHDRSZ + 32);

	SET_VARSIZE(result, VARHDRSZ + 32);
	if (!pg_strong_random(VARDATA(result), 32))
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("could not generate a random secret")));
	PG_RETURN_BYTEA_P(result);
}

PG_FUNCTION_INFO_V1(gatekeeper_unsubscribe_token);

/*
 * gatekeeper._unsubscribe_token(recipient text, queue text) RETURNS text
 *		The token the claim puts in (recipient, queue)'s List-Unsubscribe
 *		URL.
 */
Datum
gatekeeper_unsubscribe_token(PG_FUNCTION_ARGS)
{
	MemoryContext caller = CurrentMemoryContext;
	char	   *token;
	text	   *result;

	gatekeeper_require_schema();
	if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("recipient and queue must not be null")));
	SPI_connect();
	token = make_token(text_to_cstring(PG_GETARG_TEXT_PP(0)),
					   text_to_cstring(PG_GETARG_TEXT_PP(1)));
	/* the token is in SPI's memory, which SPI_finish frees */
	result = (text *) MemoryContextAlloc(caller, VARHDRSZ + strlen(token));
	SET_VARSIZE(result, VARHDRSZ + strlen(token));
	memcpy(VARDATA(result), token, strlen(token));
	SPI_finish();
	PG_RETURN_TEXT_P(result);
}

PG_FUNCTION_INFO_V1(gatekeeper_check_unsubscribe_url_sql);

/*
 * gatekeeper._check_unsubscribe_url(url text, queue text) RETURNS void
 *		gatekeeper_check_unsubscribe_url for create_queue and alter_queue;
 *		a NULL url is no URL.
 */
Datum
gatekeeper_check_unsubscribe_url_sql(PG_FUNCTION_ARGS)
{
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("queue must not be null")));
	if (!PG_ARGISNULL(0))
		gatekeeper_check_unsubscribe_url(text_to_cstring(PG_GETARG_TEXT_PP(0)),
										 text_to_cstring(PG_GETARG_TEXT_PP(1)));
	PG_RETURN_VOID();
}

PG_FUNCTION_INFO_V1(gatekeeper_unsubscribe);

/*
 * gatekeeper.unsubscribe(token text) RETURNS boolean
 *		Verify token and suppress its recipient for its queue (reason
 *		unsubscribe), recording an unsubscribed event for the latest mail
 *		of that queue sent to it; true when the entry is new.  The HMAC is compared in
 *		constant time; every way a token can be wrong gives the same 22023.
 */
Datum
gatekeeper_unsubscribe(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr unsubscribed_plan = NULL;
	static const char unsubscribed_sql[] =
	"INSERT INTO gatekeeper.event_log (mail_id, queue, recipient, event, detail, source, segment) "
	"SELECT o.id, o.queue, m.recipient, 'unsubscribed', 'one-click unsubscribe', 'token', o.segment "
	"  FROM gatekeeper.mail m "
	"  JOIN gatekeeper.mail_done o ON o.id = m.id AND o.segment = m.segment "
	" WHERE m.recipient = $1 AND o.queue = $2 AND o.state = 'sent' "
	" ORDER BY o.id DESC LIMIT 1 "
	"ON CONFLICT DO NOTHING";
	Oid			argtypes[2] = {TEXTOID, TEXTOID};
	Datum		args[2];
	char	   *token;
	uint8	   *raw;
	int			len = 0;
	int			rlen;
	uint8		mac[TOKEN_MAC_LEN];
	bool		valid;
	bool		result;
	int			ret;

	gatekeeper_require_schema();
	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("token must not be null")));
	token = text_to_cstring(PG_GETARG_TEXT_PP(0));

	SPI_connect();
	raw = base64url_decode(token, &len);
	valid = raw != NULL && len > 2 + TOKEN_MAC_LEN && raw[0] == TOKEN_VERSION;
	rlen = valid ? raw[1] : 0;
	valid = valid && rlen >= 1 && 2 + rlen < len - TOKEN_MAC_LEN;
	if (valid)
	{
		load_secret();
		sign(raw, len - TOKEN_MAC_LEN, mac);
		valid = timingsafe_bcmp(mac, raw + len - TOKEN_MAC_LEN, TOKEN_MAC_LEN) == 0;
	}
	if (!valid)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid unsubscribe token"),
				 errdetail("The token is not one gatekeeper signed in this database, or it was altered or cut short.")));

	args[0] = PointerGetDatum(cstring_to_text_with_len((char *) raw + 2, rlen));
	args[1] = PointerGetDatum(cstring_to_text_with_len((char *) raw + 2 + rlen,
													   len - TOKEN_MAC_LEN - 2 - rlen));
	result = gatekeeper_suppression_add(TextDatumGetCString(args[0]), "unsubscribe",
										TextDatumGetCString(args[1]), "one-click unsubscribe", 0);

	/*
	 * The token names an address and a queue, not a mail: the event is the
	 * latest mail of that queue sent to that address (as the token writes
	 * it, lower-cased), if retention has kept one.
	 */
	ret = SPI_execute_plan(gatekeeper_plan(&unsubscribed_plan, unsubscribed_sql, 2, argtypes),
						   args, NULL, false, 1);
	if (ret != SPI_OK_INSERT)
		elog(ERROR, "recording an unsubscribed event failed: %s",
			 SPI_result_code_string(ret));
	SPI_finish();
	PG_RETURN_BOOL(result);
}
