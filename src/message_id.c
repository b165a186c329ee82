/*-------------------------------------------------------------------------
 *
 * message_id.c
 *		The Message-ID gatekeeper gives a mail, and the check of one a report
 *		names.
 *
 * A mail that has no Message-ID gets one when it is first claimed (the
 * claim keeps it on the mail, so every attempt carries the same):
 * <id.mac@domain>, the mail's id and the first 100 bits of an HMAC-SHA256
 * of that id under the secret that signs the unsubscribe and VERP tokens
 * (src/unsubscribe.c; the signed data starts with "gatekeeper mid", so
 * that no other token can stand for it), in 20 lower-case base32 letters
 * and digits (RFC 4648, no padding).  The domain is
 * gatekeeper.message_id_domain, else the sender's, else the default
 * sender's, else gatekeeper.invalid.
 *
 * Every recipient knows their own Message-ID, and the mail of one bulk
 * statement has consecutive ids: the form gatekeeper wrote before,
 * <id.created@domain> (created_at in microseconds since 1970, in hex),
 * let any recipient write their neighbours' Message-IDs, and so report
 * their neighbours' mail.  The MAC makes a Message-ID a proof of having
 * received that mail: gatekeeper_message_id_check tells a report's
 * Message-ID of this form with a right MAC (it names its mail), one with
 * a wrong MAC (it names none), and one of the earlier form, which mail
 * sent before the update still carries (no MAC: src/report.c counts its
 * report only where the report names the mail's recipient).  The two
 * forms cannot be taken for one another: the earlier one's hex part has
 * at most 16 digits.
 *
 * IDENTIFICATION
 *		src/message_id.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "executor/spi.h"
#include "fmgr.h"
#include "lib/stringinfo.h"
#include "storage/proc.h"
#include "utils/builtins.h"

#include <openssl/evp.h>

#include "gatekeeper.h"
#include "message_id.h"
#include "unsubscribe.h"

PG_FUNCTION_INFO_V1(gatekeeper_message_id_sql);

/* the HMAC's bytes the MAC's 100 bits are read from */
#define MAC_BYTES			13

/* SHA-256's block: HMAC's pads are this long */
#define SHA256_BLOCK		64

/* the earlier form's hex part: a bigint in hex has at most this many digits */
#define UNSIGNED_HEX_MAX	16

static const char base32_digits[] = "abcdefghijklmnopqrstuvwxyz234567";
static const char message_id_context[16] = "gatekeeper mid";

/*
 * The HMAC key, as SHA-256 states after its inner and outer pad, derived
 * from the secret once per transaction (key_lxid): a Message-ID costs two
 * short digests, not a statement.  Not kept longer, so a claim in any
 * backend signs under the secret its transaction reads.
 */
static EVP_MD_CTX *key_inner = NULL;
static EVP_MD_CTX *key_outer = NULL;
static EVP_MD_CTX *key_work = NULL;
static LocalTransactionId key_lxid = InvalidLocalTransactionId;

static void message_id_key(void);
static void message_id_mac(int64 id, char *out);

/*
 * Derive the HMAC key (key_inner, key_outer) from the database's secret,
 * unless this transaction has.
 */
static void
message_id_key(void)
{
	uint8		key[GATEKEEPER_TOKEN_SECRET_MAX];
	uint8		pad[SHA256_BLOCK];
	int			len;
	int			i;

	if (key_lxid == MyProc->lxid && key_lxid != InvalidLocalTransactionId)
		return;
	if (key_inner == NULL)
		key_inner = EVP_MD_CTX_new();
	if (key_outer == NULL)
		key_outer = EVP_MD_CTX_new();
	if (key_work == NULL)
		key_work = EVP_MD_CTX_new();
	if (key_inner == NULL || key_outer == NULL || key_work == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("out of memory")));
	SPI_connect();
	len = gatekeeper_token_secret(key);
	SPI_finish();
	Assert(len <= SHA256_BLOCK);
	for (i = 0; i < SHA256_BLOCK; i++)
		pad[i] = (i < len ? key[i] : 0) ^ 0x36;
	if (EVP_DigestInit_ex(key_inner, EVP_sha256(), NULL) != 1 ||
		EVP_DigestUpdate(key_inner, pad, SHA256_BLOCK) != 1)
		elog(ERROR, "could not compute HMAC-SHA256");
	for (i = 0; i < SHA256_BLOCK; i++)
		pad[i] = (i < len ? key[i] : 0) ^ 0x5c;
	if (EVP_DigestInit_ex(key_outer, EVP_sha256(), NULL) != 1 ||
		EVP_DigestUpdate(key_outer, pad, SHA256_BLOCK) != 1)
		elog(ERROR, "could not compute HMAC-SHA256");
	explicit_bzero(key, sizeof(key));
	explicit_bzero(pad, sizeof(pad));
	key_lxid = MyProc->lxid;
}

/*
 * The MAC of mail id, GATEKEEPER_MESSAGE_ID_MAC_LEN base32 characters and
 * a NUL, into out.
 */
static void
message_id_mac(int64 id, char *out)
{
	uint8		data[sizeof(message_id_context) + 8];
	uint8		inner[32];
	uint8		full[32];
	unsigned int len;
	uint32		acc = 0;
	int			bits = 0;
	int			o = 0;
	int			i;

	message_id_key();
	memcpy(data, message_id_context, sizeof(message_id_context));
	for (i = 0; i < 8; i++)
		data[sizeof(message_id_context) + i] = (uint8) (((uint64) id) >> (56 - 8 * i));
	if (EVP_MD_CTX_copy_ex(key_work, key_inner) != 1 ||
		EVP_DigestUpdate(key_work, data, sizeof(data)) != 1 ||
		EVP_DigestFinal_ex(key_work, inner, &len) != 1 ||
		EVP_MD_CTX_copy_ex(key_work, key_outer) != 1 ||
		EVP_DigestUpdate(key_work, inner, sizeof(inner)) != 1 ||
		EVP_DigestFinal_ex(key_work, full, &len) != 1)
		elog(ERROR, "could not compute HMAC-SHA256");
	for (i = 0; i < MAC_BYTES && o < GATEKEEPER_MESSAGE_ID_MAC_LEN; i++)
	{
		acc = (acc << 8) | full[i];
		bits += 8;
		while (bits >= 5 && o < GATEKEEPER_MESSAGE_ID_MAC_LEN)
		{
			bits -= 5;
			out[o++] = base32_digits[(acc >> bits) & 31];
		}
	}
	Assert(o == GATEKEEPER_MESSAGE_ID_MAC_LEN);
	out[o] = '\0';
}

/*
 * gatekeeper_message_id
 *		The Message-ID of a mail that has none: see message_id.h.
 */
text *
gatekeeper_message_id(int64 id, Datum sender, bool sender_null,
					  const char *domain_setting, const char *default_sender)
{
	StringInfoData buf;
	const char *domain;
	int			domain_len;
	char		mac[GATEKEEPER_MESSAGE_ID_MAC_LEN + 1];

	if (domain_setting != NULL && domain_setting[0] != '\0')
		domain = domain_setting, domain_len = strlen(domain);
	else
	{
		char	   *from = !sender_null ? TextDatumGetCString(sender) :
			pstrdup(default_sender != NULL ? default_sender : "");

		/* the part after the last '@' (all of it without one), '>' and ' ' off its end */
		domain = strrchr(from, '@');
		domain = domain != NULL ? domain + 1 : from;
		domain_len = strlen(domain);
		while (domain_len > 0 && (domain[domain_len - 1] == '>' || domain[domain_len - 1] == ' '))
			domain_len--;
		if (domain_len == 0)
			domain = "gatekeeper.invalid", domain_len = strlen(domain);
	}
	message_id_mac(id, mac);
	initStringInfo(&buf);
	appendStringInfo(&buf, "<" INT64_FORMAT ".%s@", id, mac);
	appendBinaryStringInfo(&buf, domain, domain_len);
	appendStringInfoChar(&buf, '>');
	return cstring_to_text_with_len(buf.data, buf.len);
}

/*
 * gatekeeper_message_id_check
 *		What a report's Message-ID names: see message_id.h.  The MAC is
 *		compared in constant time.
 */
MessageIdKind
gatekeeper_message_id_check(const char *message_id, int64 *id)
{
	const char *p = message_id;
	const char *part;
	const char *at;
	int64		v = 0;
	int			digits = 0;
	size_t		len;
	size_t		i;
	bool		base32 = true;
	bool		hex = true;

	if (p == NULL || *p != '<')
		return MESSAGE_ID_NONE;
	for (p++; isdigit((unsigned char) *p); p++)
	{
		if (++digits > 18)
			return MESSAGE_ID_NONE;
		v = v * 10 + (*p - '0');
	}
	if (digits == 0 || *p != '.' || (at = strchr(p, '@')) == NULL)
		return MESSAGE_ID_NONE;
	part = p + 1;
	len = at - part;
	for (i = 0; i < len; i++)
	{
		if (strchr(base32_digits, part[i]) == NULL)
			base32 = false;
		if (!isxdigit((unsigned char) part[i]) || isupper((unsigned char) part[i]))
			hex = false;
	}
	if (len == GATEKEEPER_MESSAGE_ID_MAC_LEN && base32)
	{
		char		mac[GATEKEEPER_MESSAGE_ID_MAC_LEN + 1];

		message_id_mac(v, mac);
		if (timingsafe_bcmp(mac, part, GATEKEEPER_MESSAGE_ID_MAC_LEN) != 0)
			return MESSAGE_ID_NONE;
		*id = v;
		return MESSAGE_ID_SIGNED;
	}
	if (len >= 1 && len <= UNSIGNED_HEX_MAX && hex)
	{
		*id = v;
		return MESSAGE_ID_UNSIGNED;
	}
	return MESSAGE_ID_NONE;
}

/*
 * gatekeeper._message_id(id bigint, sender text, domain text,
 *						  default_sender text) RETURNS text
 *		The Message-ID gatekeeper_message_id gives mail id: the claim
 *		statement's (src/claim.c), which the claim's walk computes in C.
 *		domain and default_sender are the settings ('' when unset).
 */
Datum
gatekeeper_message_id_sql(PG_FUNCTION_ARGS)
{
	char	   *domain = PG_ARGISNULL(2) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(2));
	char	   *default_sender = PG_ARGISNULL(3) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(3));

	if (PG_ARGISNULL(0))
		PG_RETURN_NULL();
	PG_RETURN_TEXT_P(gatekeeper_message_id(PG_GETARG_INT64(0), PG_GETARG_DATUM(1),
										   PG_ARGISNULL(1), domain, default_sender));
}
