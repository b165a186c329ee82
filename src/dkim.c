/*-------------------------------------------------------------------------
 *
 * dkim.c
 *		DKIM signing (RFC 6376, RFC 8463) of the messages the background
 *		worker sends.
 *
 * gatekeeper.dkim_key_table names a file in OpenDKIM's KeyTable format:
 * one key a line, "<name> <domain>:<selector>:<key file>", '#' starting a
 * comment, blank lines ignored.  Each key file is a PEM private key, RSA
 * of at least 1024 bits or Ed25519, that only the server's OS user can
 * read (the rule of the relay password file).  The worker loads the table
 * at start and at each reload; a table or key that cannot be used stops
 * delivery, with a log line saying why, rather than letting mail go out
 * unsigned that its sender expects signed.
 *
 * A message whose From domain, or its closest parent domain, has keys is
 * signed with each of them (an RSA and an Ed25519 key of one domain give
 * two signatures, as RFC 8463 suggests), c=relaxed/relaxed, over From
 * (once more than it occurs, so that no From can be added), To, Subject,
 * Date, Message-ID, MIME-Version, Content-Type, and Reply-To,
 * List-Unsubscribe, List-Unsubscribe-Post and Feedback-ID where present.
 * No l= tag: the whole body is signed.
 *
 * The message signed is the built message, CRLF line ends, before SMTP's
 * dot-stuffing (which the relay undoes) and whatever BDAT chunking: what
 * the relay receives is what was signed.  The DKIM-Signature fields are
 * put in front of the message.
 *
 * No key, key file content or passphrase is ever written to the log or
 * to an error.
 *
 * IDENTIFICATION
 *		src/dkim.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <ctype.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/sha.h>

#include "gatekeeper.h"
#include "dkim.h"

#include "utils/memutils.h"

/* bounds on what a key table may hold */
#define DKIM_TABLE_MAX_BYTES	(1024 * 1024)
#define DKIM_MAX_KEYS			1000
#define DKIM_KEY_FILE_MAX_BYTES	(64 * 1024)
#define DKIM_NAME_MAX			253

/* header fields looked at when signing; any further ones are not signed */
#define DKIM_MAX_FIELDS			1000

/* RSA keys shorter than this are refused (RFC 8301 3.2) */
#define DKIM_RSA_MIN_BITS		1024

/* and longer than this: a signature must fit sign_one's buffer */
#define DKIM_RSA_MAX_BITS		8192

/* base64 of a signature is folded at this many characters a line */
#define DKIM_B64_LINE			64

/* One key of the table, loaded. */
typedef struct DkimKey
{
	char	   *name;			/* the table's first column */
	char	   *domain;			/* d=, lower case */
	char	   *selector;		/* s= */
	EVP_PKEY   *pkey;			/* NULL while only checked */
	bool		ed25519;		/* else RSA */
} DkimKey;

/* One header field of the message being signed. */
typedef struct DkimField
{
	const char *start;			/* its name */
	const char *end;			/* past its last CRLF */
	int			namelen;
} DkimField;

/*
 * The header fields signed, in the order h= lists them.  The first seven
 * are listed even when absent (signing their absence); the others only as
 * often as they occur.  From is listed once more than it occurs.
 */
static const char *const signed_fields[] = {
	"From", "To", "Subject", "Date", "Message-ID", "MIME-Version",
	"Content-Type", "Reply-To", "List-Unsubscribe", "List-Unsubscribe-Post",
	"Feedback-ID"
};
#define DKIM_ALWAYS_SIGNED	7

/* the keys the worker signs with, in dkim_cxt */
static MemoryContext dkim_cxt = NULL;
static DkimKey *dkim_keys = NULL;
static int	dkim_nkeys = 0;

/* why the last gatekeeper_dkim_load could not load the table, else "" */
static char dkim_problem[512];

static char *read_table_text(const char *path, char *problem, size_t problemlen);
static int	split_table_line(char *line, int lineno, const char *path, char **name,
							 char **domain, char **selector, char **file,
							 char *problem, size_t problemlen);
static bool read_table(const char *path, bool load, DkimKey **keys, int *nkeys,
					   char *problem, size_t problemlen);
static bool read_key_file(const char *path, DkimKey *key, bool load,
						  char *problem, size_t problemlen);
static int	no_passphrase(char *buf, int size, int rwflag, void *u);
static bool name_ok(const char *s, bool selector);
static void free_keys(DkimKey *keys, int nkeys);
static int	parse_fields(const char *msg, size_t len, DkimField *fields, int maxfields,
						 const char **body);
static void canon_field(StringInfo out, const char *start, const char *end);
static void body_hash(const char *body, size_t len, unsigned char *hash);
static void digest_update(EVP_MD_CTX *ctx, const char *data, size_t len);
static void append_base64(StringInfo out, const unsigned char *data, size_t len, bool fold);
static void sign_one(StringInfo sigs, const DkimKey *key, const char *msg, DkimField *fields,
					 int nfields, const char *bh, time_t now);
static void openssl_failed(const char *what) pg_attribute_noreturn();

/*
 * gatekeeper_dkim_check_table
 *		Whether the key table at path, and every key it names, can be
 *		used; when not, why, in problem.  An empty path is no table.
 */
bool
gatekeeper_dkim_check_table(const char *path, char *problem, size_t problemlen)
{
	DkimKey    *keys = NULL;
	int			nkeys = 0;
	bool		ok;

	if (path == NULL || path[0] == '\0')
		return true;
	ok = read_table(path, false, &keys, &nkeys, problem, problemlen);
	free_keys(keys, nkeys);
	return ok;
}

/*
 * gatekeeper_dkim_load
 *		(Re)load the keys of gatekeeper.dkim_key_table, forgetting those
 *		loaded before.  Returns false, having said why in the log, when the
 *		table or one of its keys cannot be used: then no mail should go.
 */
bool
gatekeeper_dkim_load(void)
{
	const char *path = gatekeeper_dkim_key_table;
	DkimKey    *keys = NULL;
	int			nkeys = 0;
	char		problem[512];
	MemoryContext old;

	if (dkim_cxt == NULL)
		dkim_cxt = AllocSetContextCreate(TopMemoryContext, "gatekeeper DKIM keys",
										 ALLOCSET_SMALL_SIZES);
	free_keys(dkim_keys, dkim_nkeys);
	dkim_keys = NULL;
	dkim_nkeys = 0;
	MemoryContextReset(dkim_cxt);
	dkim_problem[0] = '\0';

	if (path == NULL || path[0] == '\0')
		return true;

	old = MemoryContextSwitchTo(dkim_cxt);
	if (!read_table(path, true, &keys, &nkeys, problem, sizeof(problem)))
	{
		MemoryContextSwitchTo(old);
		free_keys(keys, nkeys);
		MemoryContextReset(dkim_cxt);
		strlcpy(dkim_problem, problem, sizeof(dkim_problem));
		ereport(LOG,
				(errcode(ERRCODE_CONFIG_FILE_ERROR),
				 errmsg("gatekeeper.dkim_key_table cannot be used: %s", problem),
				 errdetail("The gatekeeper worker delivers no mail until it is corrected.")));
		return false;
	}
	MemoryContextSwitchTo(old);
	dkim_keys = keys;
	dkim_nkeys = nkeys;
	return true;
}

/*
 * gatekeeper_dkim_problem
 *		Why the last gatekeeper_dkim_load could not load the key table, or
 *		NULL when it could.
 */
const char *
gatekeeper_dkim_problem(void)
{
	return dkim_problem[0] != '\0' ? dkim_problem : NULL;
}

/*
 * gatekeeper_dkim_sign
 *		Sign the built message (CRLF line ends) with the keys of the From
 *		address's domain, or of its closest parent that has keys, putting
 *		the DKIM-Signature fields in front of it.  Returns the number of
 *		signatures added: 0 when no key applies.
 */
int
gatekeeper_dkim_sign(StringInfo message, const char *from_address)
{
	const char *at;
	char	   *domain;
	const char *candidate;
	int			first = -1;
	int			count = 0;
	DkimField  *fields;
	int			nfields;
	const char *body;
	unsigned char hash[SHA256_DIGEST_LENGTH];
	StringInfoData bh;
	StringInfoData sigs;
	time_t		now;
	int			i;

	if (dkim_nkeys == 0 || from_address == NULL)
		return 0;
	at = strrchr(from_address, '@');
	if (at == NULL || at[1] == '\0')
		return 0;
	domain = pstrdup(at + 1);
	for (i = 0; domain[i]; i++)
		domain[i] = pg_ascii_tolower((unsigned char) domain[i]);
	/* the From domain, then each parent domain, until one has keys */
	for (candidate = domain; candidate != NULL && first < 0;)
	{
		for (i = 0; i < dkim_nkeys; i++)
			if (strcmp(dkim_keys[i].domain, candidate) == 0)
			{
				if (first < 0)
					first = i;
				count++;
			}
		if (first < 0)
		{
			candidate = strchr(candidate, '.');
			if (candidate != NULL)
				candidate++;
			if (candidate != NULL && *candidate == '\0')
				candidate = NULL;
		}
	}
	pfree(domain);
	if (first < 0)
		return 0;

	fields = palloc(sizeof(DkimField) * DKIM_MAX_FIELDS);
	nfields = parse_fields(message->data, message->len, fields, DKIM_MAX_FIELDS, &body);
	body_hash(body, message->data + message->len - body, hash);
	initStringInfo(&bh);
	append_base64(&bh, hash, sizeof(hash), false);

	now = time(NULL);
	initStringInfo(&sigs);
	for (i = first; i < dkim_nkeys; i++)
		if (strcmp(dkim_keys[i].domain, dkim_keys[first].domain) == 0)
			sign_one(&sigs, &dkim_keys[i], message->data, fields, nfields, bh.data, now);

	/* the signatures go in front of the message, moved up in place */
	enlargeStringInfo(message, sigs.len);
	memmove(message->data + sigs.len, message->data, message->len + 1);
	memcpy(message->data, sigs.data, sigs.len);
	message->len += sigs.len;

	pfree(sigs.data);
	pfree(bh.data);
	pfree(fields);
	return count;
}

/*
 * The text of the key table at path (palloc'd, NUL ended), or NULL with
 * the reason in problem: a file that cannot be opened or read, is not a
 * regular file, is larger than DKIM_TABLE_MAX_BYTES or holds a NUL.
 */
static char *
read_table_text(const char *path, char *problem, size_t problemlen)
{
	int			fd;
	struct stat st;
	char	   *data;
	ssize_t		len = 0;

	fd = open(path, O_RDONLY | PG_BINARY | O_CLOEXEC, 0);
	if (fd < 0)
	{
		snprintf(problem, problemlen, "could not open key table \"%s\": %m", path);
		return NULL;
	}
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
	{
		snprintf(problem, problemlen, "key table \"%s\" is not a regular file", path);
		close(fd);
		return NULL;
	}
	if (st.st_size > DKIM_TABLE_MAX_BYTES)
	{
		snprintf(problem, problemlen, "key table \"%s\" is larger than %d bytes",
				 path, DKIM_TABLE_MAX_BYTES);
		close(fd);
		return NULL;
	}
	data = palloc(st.st_size + 1);
	while (len < st.st_size)
	{
		ssize_t		n = read(fd, data + len, st.st_size - len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
		{
			snprintf(problem, problemlen, "could not read key table \"%s\": %m", path);
			close(fd);
			return NULL;
		}
		if (n == 0)
			break;
		len += n;
	}
	close(fd);
	data[len] = '\0';
	if (memchr(data, '\0', len) != NULL)
	{
		snprintf(problem, problemlen, "key table \"%s\" is not a text file", path);
		return NULL;
	}
	return data;
}

/*
 * Split line lineno of the key table at path, its comment cut off,
 * "<name> <domain>:<selector>:<key file>", in place into its fields.
 * Returns 1 for a key, 0 for a blank line, -1 with the reason in problem
 * for a line that is neither.
 */
static int
split_table_line(char *line, int lineno, const char *path, char **name, char **domain,
				 char **selector, char **file, char *problem, size_t problemlen)
{
	char	   *p;
	char	   *value;

	*name = line + strspn(line, " \t\r");
	if (**name == '\0')
		return 0;
	p = *name + strcspn(*name, " \t\r");
	if (*p == '\0')
	{
		snprintf(problem, problemlen,
				 "line %d of key table \"%s\" has a key name but no domain:selector:keyfile",
				 lineno, path);
		return -1;
	}
	*p++ = '\0';
	value = p + strspn(p, " \t\r");
	p = value + strcspn(value, " \t\r");
	if (p[strspn(p, " \t\r")] != '\0' || *value == '\0')
	{
		snprintf(problem, problemlen,
				 "line %d of key table \"%s\" must be \"<name> <domain>:<selector>:<key file>\"",
				 lineno, path);
		return -1;
	}
	*p = '\0';

	*selector = strchr(value, ':');
	*file = *selector ? strchr(*selector + 1, ':') : NULL;
	if (*selector == NULL || *file == NULL)
	{
		snprintf(problem, problemlen,
				 "line %d of key table \"%s\" must be \"<name> <domain>:<selector>:<key file>\"",
				 lineno, path);
		return -1;
	}
	*(*selector)++ = '\0';
	*(*file)++ = '\0';
	*domain = value;
	if (!name_ok(*domain, false))
	{
		snprintf(problem, problemlen,
				 "line %d of key table \"%s\" names no valid domain", lineno, path);
		return -1;
	}
	if (!name_ok(*selector, true))
	{
		snprintf(problem, problemlen,
				 "line %d of key table \"%s\" names no valid selector", lineno, path);
		return -1;
	}

	/* OpenDKIM also takes the key itself here: never echo it */
	if ((*file)[0] != '/')
	{
		snprintf(problem, problemlen,
				 "line %d of key table \"%s\": the third field must be the absolute path of a key file",
				 lineno, path);
		return -1;
	}
	return 1;
}

/*
 * Read the key table at path into *keys (palloc'd in the current memory
 * context), each key file checked, and its key kept when load.  Returns
 * false with the reason in problem at the first line or key that cannot
 * be used.
 */
static bool
read_table(const char *path, bool load, DkimKey **keys, int *nkeys,
		   char *problem, size_t problemlen)
{
	char	   *data;
	char	   *line;
	char	   *next;
	int			lineno = 0;
	int			cap = 8;

	*keys = palloc0(sizeof(DkimKey) * cap);
	*nkeys = 0;
	data = read_table_text(path, problem, problemlen);
	if (data == NULL)
		return false;

	for (line = data; line != NULL; line = next)
	{
		char	   *p;
		char	   *name;
		char	   *domain;
		char	   *selector;
		char	   *file;
		DkimKey    *key;
		int			i;
		int			split;

		lineno++;
		next = strchr(line, '\n');
		if (next != NULL)
			*next++ = '\0';
		if ((p = strchr(line, '#')) != NULL)
			*p = '\0';
		split = split_table_line(line, lineno, path, &name, &domain, &selector, &file,
								 problem, problemlen);
		if (split < 0)
			return false;
		if (split == 0)
			continue;

		for (i = 0; i < *nkeys; i++)
			if (strcmp((*keys)[i].name, name) == 0)
			{
				snprintf(problem, problemlen,
						 "line %d of key table \"%s\" repeats key name \"%s\"",
						 lineno, path, name);
				return false;
			}
		if (*nkeys >= DKIM_MAX_KEYS)
		{
			snprintf(problem, problemlen, "key table \"%s\" has more than %d keys",
					 path, DKIM_MAX_KEYS);
			return false;
		}
		if (*nkeys == cap)
		{
			cap *= 2;
			*keys = repalloc(*keys, sizeof(DkimKey) * cap);
		}
		key = &(*keys)[*nkeys];
		memset(key, 0, sizeof(DkimKey));
		key->name = pstrdup(name);
		key->domain = pstrdup(domain);
		for (p = key->domain; *p; p++)
			*p = pg_ascii_tolower((unsigned char) *p);
		key->selector = pstrdup(selector);
		(*nkeys)++;
		if (!read_key_file(file, key, load, problem, problemlen))
			return false;
	}
	return true;
}

/*
 * A domain (letters, digits, hyphens, dots between labels) or a selector
 * (the same, with underscores: selectors are often dated, "s_2026").
 */
static bool
name_ok(const char *s, bool selector)
{
	size_t		len = strlen(s);
	const char *p;

	if (len == 0 || len > DKIM_NAME_MAX || s[0] == '.' || s[len - 1] == '.' ||
		strstr(s, "..") != NULL)
		return false;
	for (p = s; *p; p++)
		if (!(isalnum((unsigned char) *p) || *p == '-' || *p == '.' ||
			  (selector && *p == '_')))
			return false;
	return true;
}

/*
 * Check the key file at path, as the relay password file is checked, and
 * that it holds an RSA key of at least DKIM_RSA_MIN_BITS bits or an
 * Ed25519 key; keep the key in key->pkey when load.
 */
static bool
read_key_file(const char *path, DkimKey *key, bool load, char *problem, size_t problemlen)
{
	char	   *data;
	size_t		len;
	BIO		   *bio;
	EVP_PKEY   *pkey;
	char		what[64];

	snprintf(what, sizeof(what), "key file of \"%s\"", key->name);
	if (!gatekeeper_read_private_file(path, DKIM_KEY_FILE_MAX_BYTES, &data, &len, what,
									  problem, problemlen))
		return false;

	bio = BIO_new_mem_buf(data, (int) len);
	if (bio == NULL)
	{
		explicit_bzero(data, len);
		openssl_failed("BIO_new_mem_buf");
	}
	pkey = PEM_read_bio_PrivateKey(bio, NULL, no_passphrase, NULL);
	BIO_free(bio);
	explicit_bzero(data, len);
	pfree(data);
	ERR_clear_error();
	if (pkey == NULL)
	{
		snprintf(problem, problemlen,
				 "%s, \"%s\", holds no unencrypted PEM private key", what, path);
		return false;
	}
	if (EVP_PKEY_base_id(pkey) == EVP_PKEY_ED25519)
		key->ed25519 = true;
	else if (EVP_PKEY_base_id(pkey) == EVP_PKEY_RSA)
	{
		if (EVP_PKEY_bits(pkey) < DKIM_RSA_MIN_BITS)
		{
			snprintf(problem, problemlen,
					 "%s, \"%s\", is an RSA key of %d bits: at least %d are needed (2048 recommended)",
					 what, path, EVP_PKEY_bits(pkey), DKIM_RSA_MIN_BITS);
			EVP_PKEY_free(pkey);
			return false;
		}
		if (EVP_PKEY_bits(pkey) > DKIM_RSA_MAX_BITS)
		{
			snprintf(problem, problemlen,
					 "%s, \"%s\", is an RSA key of %d bits: at most %d are supported (2048 recommended)",
					 what, path, EVP_PKEY_bits(pkey), DKIM_RSA_MAX_BITS);
			EVP_PKEY_free(pkey);
			return false;
		}
	}
	else
	{
		snprintf(problem, problemlen,
				 "%s, \"%s\", is neither an RSA nor an Ed25519 key", what, path);
		EVP_PKEY_free(pkey);
		return false;
	}
	if (load)
		key->pkey = pkey;
	else
		EVP_PKEY_free(pkey);
	return true;
}

/*
 * gatekeeper_read_private_file
 *		Read a file that must be private to the server's OS user, with the
 *		rule PostgreSQL applies to its SSL key and gatekeeper to the relay
 *		password file: a regular file owned by that user with no group or
 *		other permissions (0600 or less), or owned by root with at most
 *		u=rw,g=r (0640).  The content is palloc'd; the caller wipes it.
 */
bool
gatekeeper_read_private_file(const char *path, size_t maxbytes, char **data, size_t *len,
							 const char *what, char *problem, size_t problemlen)
{
	int			fd;
	struct stat st;
	size_t		got = 0;

	fd = open(path, O_RDONLY | PG_BINARY | O_CLOEXEC, 0);
	if (fd < 0)
	{
		snprintf(problem, problemlen, "could not open %s, \"%s\": %m", what, path);
		return false;
	}
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
	{
		snprintf(problem, problemlen, "%s, \"%s\", is not a regular file", what, path);
		close(fd);
		return false;
	}
	if (st.st_uid != geteuid() && st.st_uid != 0)
	{
		snprintf(problem, problemlen,
				 "%s, \"%s\", must be owned by the database user or root", what, path);
		close(fd);
		return false;
	}
	if ((st.st_uid == geteuid() && (st.st_mode & (S_IRWXG | S_IRWXO))) ||
		(st.st_uid == 0 && (st.st_mode & (S_IWGRP | S_IXGRP | S_IRWXO))))
	{
		snprintf(problem, problemlen,
				 "%s, \"%s\", has group or world access: it must have permissions u=rw (0600) "
				 "or less if owned by the database user, or u=rw,g=r (0640) or less if owned by root",
				 what, path);
		close(fd);
		return false;
	}
	if ((size_t) st.st_size > maxbytes)
	{
		snprintf(problem, problemlen, "%s, \"%s\", is larger than %zu bytes",
				 what, path, maxbytes);
		close(fd);
		return false;
	}

	*data = palloc(st.st_size + 1);
	while (got < (size_t) st.st_size)
	{
		ssize_t		n = read(fd, *data + got, st.st_size - got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
		{
			snprintf(problem, problemlen, "could not read %s, \"%s\": %m", what, path);
			explicit_bzero(*data, got);
			pfree(*data);
			close(fd);
			return false;
		}
		if (n == 0)
			break;
		got += n;
	}
	close(fd);
	(*data)[got] = '\0';
	*len = got;
	return true;
}

/*
 * OpenSSL's passphrase callback: there is none, so an encrypted key fails
 * to load instead of OpenSSL asking a terminal for one.
 */
static int
no_passphrase(char *buf, int size, int rwflag, void *u)
{
	return 0;
}

/* Free the OpenSSL keys of an array of keys (the rest is palloc'd). */
static void
free_keys(DkimKey *keys, int nkeys)
{
	int			i;

	for (i = 0; i < nkeys; i++)
		if (keys[i].pkey != NULL)
		{
			EVP_PKEY_free(keys[i].pkey);
			keys[i].pkey = NULL;
		}
}

/*
 * Find the header fields of msg: each begins a line with its name and a
 * colon and runs on over lines beginning with a space or tab.  *body is
 * set past the empty line that ends the header (the message's end if
 * none).  Returns the number of fields, at most maxfields (further ones
 * are not signed).
 */
static int
parse_fields(const char *msg, size_t len, DkimField *fields, int maxfields,
			 const char **body)
{
	const char *p = msg;
	const char *end = msg + len;
	int			n = 0;

	while (p < end)
	{
		const char *eol;
		const char *colon;

		if (end - p >= 2 && p[0] == '\r' && p[1] == '\n')
		{
			*body = p + 2;
			return n;
		}
		eol = memchr(p, '\n', end - p);
		eol = eol ? eol + 1 : end;
		while (eol < end && (*eol == ' ' || *eol == '\t'))
		{
			const char *more = memchr(eol, '\n', end - eol);

			eol = more ? more + 1 : end;
		}
		colon = memchr(p, ':', eol - p);
		if (colon != NULL && n < maxfields)
		{
			fields[n].start = p;
			fields[n].end = eol;
			fields[n].namelen = colon - p;
			/* the name without whitespace before the colon */
			while (fields[n].namelen > 0 &&
				   (p[fields[n].namelen - 1] == ' ' || p[fields[n].namelen - 1] == '\t'))
				fields[n].namelen--;
			n++;
		}
		p = eol;
	}
	*body = end;
	return n;
}

/*
 * Append the relaxed canonical form (RFC 6376 3.4.2) of the header field
 * at [start, end): the name in lower case, a colon, the value unfolded,
 * each run of spaces and tabs one space, none at either end; then CRLF.
 */
static void
canon_field(StringInfo out, const char *start, const char *end)
{
	const char *p = start;
	const char *colon = memchr(start, ':', end - start);
	bool		space = false;
	bool		any = false;

	for (; p < colon; p++)
		if (*p != ' ' && *p != '\t')
			appendStringInfoChar(out, pg_ascii_tolower((unsigned char) *p));
	appendStringInfoChar(out, ':');
	for (p = colon + 1; p < end; p++)
	{
		if (*p == '\r' || *p == '\n')
			continue;
		if (*p == ' ' || *p == '\t')
		{
			space = true;
			continue;
		}
		if (space && any)
			appendStringInfoChar(out, ' ');
		space = false;
		any = true;
		appendStringInfoChar(out, *p);
	}
	appendStringInfoString(out, "\r\n");
}

/*
 * The SHA-256 hash of the relaxed canonical body (RFC 6376 3.4.4): each
 * run of spaces and tabs in a line one space, none at a line's end, empty
 * lines at the end dropped, and the last line ended by CRLF.  Streamed
 * through a small buffer: the body may be megabytes.
 */
static void
body_hash(const char *body, size_t len, unsigned char *hash)
{
	EVP_MD_CTX *ctx;
	char		buf[8192];
	size_t		used = 0;
	size_t		empty_lines = 0;	/* empty lines not written yet */
	const char *p = body;
	const char *end = body + len;

#define BODY_PUT(c) \
	do { \
		if (used == sizeof(buf)) { digest_update(ctx, buf, used); used = 0; } \
		buf[used++] = (c); \
	} while (0)

	ctx = EVP_MD_CTX_new();
	if (ctx == NULL || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1)
	{
		EVP_MD_CTX_free(ctx);
		openssl_failed("SHA-256");
	}
	while (p < end)
	{
		const char *eol = p;
		const char *next;
		const char *last;

		/* a line ends at CRLF; a lone CR or LF is part of the line */
		while (eol < end && !(eol[0] == '\r' && eol + 1 < end && eol[1] == '\n'))
			eol++;
		next = eol < end ? eol + 2 : end;

		/* trailing whitespace is dropped */
		last = eol;
		while (last > p && (last[-1] == ' ' || last[-1] == '\t'))
			last--;
		if (last == p)
		{
			empty_lines++;
			p = next;
			continue;
		}
		for (; empty_lines > 0; empty_lines--)
		{
			BODY_PUT('\r');
			BODY_PUT('\n');
		}
		while (p < last)
		{
			if (*p == ' ' || *p == '\t')
			{
				BODY_PUT(' ');
				while (p < last && (*p == ' ' || *p == '\t'))
					p++;
				continue;
			}
			BODY_PUT(*p);
			p++;
		}
		BODY_PUT('\r');
		BODY_PUT('\n');
		p = next;
	}
#undef BODY_PUT
	digest_update(ctx, buf, used);
	if (EVP_DigestFinal_ex(ctx, hash, NULL) != 1)
	{
		EVP_MD_CTX_free(ctx);
		openssl_failed("SHA-256");
	}
	EVP_MD_CTX_free(ctx);
}

/* Feed len octets to a SHA-256 digest. */
static void
digest_update(EVP_MD_CTX *ctx, const char *data, size_t len)
{
	if (EVP_DigestUpdate(ctx, data, len) != 1)
	{
		EVP_MD_CTX_free(ctx);
		openssl_failed("SHA-256");
	}
}

/* Append data as base64, folded with CRLF TAB every DKIM_B64_LINE when fold. */
static void
append_base64(StringInfo out, const unsigned char *data, size_t len, bool fold)
{
	static const char digits[] =
		"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	size_t		i;
	int			col = 0;

	for (i = 0; i < len; i += 3)
	{
		uint32		v = (uint32) data[i] << 16;
		char		q[4];
		int			k;

		if (i + 1 < len)
			v |= (uint32) data[i + 1] << 8;
		if (i + 2 < len)
			v |= data[i + 2];
		q[0] = digits[(v >> 18) & 63];
		q[1] = digits[(v >> 12) & 63];
		q[2] = i + 1 < len ? digits[(v >> 6) & 63] : '=';
		q[3] = i + 2 < len ? digits[v & 63] : '=';
		for (k = 0; k < 4; k++)
		{
			if (fold && col == DKIM_B64_LINE)
			{
				appendStringInfoString(out, "\r\n\t");
				col = 0;
			}
			appendStringInfoChar(out, q[k]);
			col++;
		}
	}
}

/*
 * Append to sigs one DKIM-Signature field for msg made with key: the tags,
 * h= naming the fields signed (each instance taken from the bottom up, RFC
 * 6376 5.4.2), the body hash bh, then b=, the signature of the canonical
 * signed fields and of this field with b= empty.
 */
static void
sign_one(StringInfo sigs, const DkimKey *key, const char *msg, DkimField *fields,
		 int nfields, const char *bh, time_t now)
{
	StringInfoData field;
	StringInfoData data;
	int			linelen;
	int			f;
	EVP_MD_CTX *ctx;
	unsigned char sig[1024];
	size_t		siglen = sizeof(sig);

	initStringInfo(&field);
	initStringInfo(&data);
	appendStringInfo(&field,
					 "DKIM-Signature: v=1; a=%s; c=relaxed/relaxed; d=%s; s=%s;\r\n"
					 "\tt=%lld; h=",
					 key->ed25519 ? "ed25519-sha256" : "rsa-sha256",
					 key->domain, key->selector, (long long) now);
	linelen = field.len - (strrchr(field.data, '\n') - field.data) - 1;

	for (f = 0; f < (int) lengthof(signed_fields); f++)
	{
		const char *name = signed_fields[f];
		int			namelen = strlen(name);
		int			occurs = 0;
		int			listed;
		int			k;
		int			i;

		for (i = 0; i < nfields; i++)
			if (fields[i].namelen == namelen &&
				pg_strncasecmp(fields[i].start, name, namelen) == 0)
				occurs++;
		listed = occurs;
		if (f == 0)
			listed = occurs + 1;
		else if (f < DKIM_ALWAYS_SIGNED && listed == 0)
			listed = 1;

		for (k = 0; k < listed; k++)
		{
			int			seen = 0;

			/* folded after a colon, FWS being allowed there */
			if (field.data[field.len - 1] != '=')
			{
				appendStringInfoChar(&field, ':');
				linelen++;
				if (linelen + namelen > 72)
				{
					appendStringInfoString(&field, "\r\n\t ");
					linelen = 2;
				}
			}
			appendStringInfoString(&field, name);
			linelen += namelen;

			/* the (k+1)-th instance from the bottom, if there is one */
			for (i = nfields - 1; i >= 0; i--)
				if (fields[i].namelen == namelen &&
					pg_strncasecmp(fields[i].start, name, namelen) == 0 &&
					seen++ == k)
				{
					canon_field(&data, fields[i].start, fields[i].end);
					break;
				}
		}
	}
	appendStringInfo(&field, ";\r\n\tbh=%s;\r\n\tb=", bh);

	/* this field, b= empty, canonical, without its CRLF */
	canon_field(&data, field.data, field.data + field.len);
	data.len -= 2;
	data.data[data.len] = '\0';

	ctx = EVP_MD_CTX_new();
	if (ctx == NULL)
		openssl_failed("EVP_MD_CTX_new");
	if (key->ed25519)
	{
		/* RFC 8463: Ed25519 signs the SHA-256 hash of the data */
		unsigned char hash[SHA256_DIGEST_LENGTH];

		if (EVP_Digest(data.data, data.len, hash, NULL, EVP_sha256(), NULL) != 1)
		{
			EVP_MD_CTX_free(ctx);
			openssl_failed("SHA-256");
		}
		if (EVP_DigestSignInit(ctx, NULL, NULL, NULL, key->pkey) != 1 ||
			EVP_DigestSign(ctx, sig, &siglen, hash, sizeof(hash)) != 1)
		{
			EVP_MD_CTX_free(ctx);
			openssl_failed("Ed25519 signing");
		}
	}
	else
	{
		if ((size_t) EVP_PKEY_size(key->pkey) > sizeof(sig))
		{
			EVP_MD_CTX_free(ctx);
			ereport(ERROR,
					(errcode(ERRCODE_CONFIG_FILE_ERROR),
					 errmsg("DKIM key \"%s\" is too large to sign with", key->name),
					 errdetail("Keys of up to %d bits are supported.", DKIM_RSA_MAX_BITS)));
		}
		if (EVP_DigestSignInit(ctx, NULL, EVP_sha256(), NULL, key->pkey) != 1 ||
			EVP_DigestSign(ctx, sig, &siglen, (const unsigned char *) data.data,
						   data.len) != 1)
		{
			EVP_MD_CTX_free(ctx);
			openssl_failed("RSA-SHA256 signing");
		}
	}
	EVP_MD_CTX_free(ctx);

	appendStringInfoString(sigs, field.data);
	append_base64(sigs, sig, siglen, true);
	appendStringInfoString(sigs, "\r\n");
	pfree(field.data);
	pfree(data.data);
}

/* Raise an error for a failed OpenSSL call, with OpenSSL's reason. */
static void
openssl_failed(const char *what)
{
	unsigned long e = ERR_get_error();

	ERR_clear_error();
	ereport(ERROR,
			(errcode(ERRCODE_INTERNAL_ERROR),
			 errmsg("DKIM: %s failed: %s", what,
					e ? ERR_reason_error_string(e) : "no reason given")));
}
