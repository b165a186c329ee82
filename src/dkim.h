/*-------------------------------------------------------------------------
 *
 * dkim.h
 *		DKIM signing (RFC 6376) of built messages, with the keys named in
 *		gatekeeper.dkim_key_table.
 *
 * The background worker loads the key table at start and at each reload
 * (gatekeeper_dkim_load) and signs each message just after it is built
 * (gatekeeper_dkim_sign), so the signature covers the octets that go on
 * the wire.  The setting's check hook uses gatekeeper_dkim_check_table to
 * refuse a table or key that cannot be used when it is set or reloaded.
 *
 * IDENTIFICATION
 *		src/dkim.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_DKIM_H
#define GATEKEEPER_DKIM_H

#include "lib/stringinfo.h"

extern bool gatekeeper_dkim_check_table(const char *path, char *problem, size_t problemlen);
extern bool gatekeeper_dkim_load(void);
extern const char *gatekeeper_dkim_problem(void);
extern int	gatekeeper_dkim_sign(StringInfo message, const char *from_address);
extern bool gatekeeper_read_private_file(const char *path, size_t maxbytes, char **data,
										 size_t *len, const char *what, char *problem,
										 size_t problemlen);

#endif							/* GATEKEEPER_DKIM_H */
