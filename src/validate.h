/*-------------------------------------------------------------------------
 *
 * validate.h
 *		What the rest of gatekeeper uses of validate.c: header and duration
 *		checks.  Each raises an error with a documented SQLSTATE when its
 *		input is malformed; "what" names the field in the error message.
 *		(Addresses are checked in src/address.c.)
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_VALIDATE_H
#define GATEKEEPER_VALIDATE_H

#include "datatype/timestamp.h"
#include "utils/jsonb.h"

extern void gatekeeper_check_header_value(const char *value, const char *what);
extern void gatekeeper_check_header_name(const char *name);
extern int	gatekeeper_check_headers(Jsonb *headers);
extern int	gatekeeper_headers_placeholders(Jsonb *headers);
extern const char *gatekeeper_placeholder_find(const char *s, int len);
extern bool gatekeeper_header_reserved(const char *name);

/*
 * A header value's GATEKEEPER_MESSAGE_ID_PLACEHOLDER becomes the mail's
 * Message-ID at the claim (src/claim.c), header values only.  Enqueue
 * counts each at GATEKEEPER_MESSAGE_ID_MAX octets against
 * gatekeeper.max_message_size (src/mail.c), and the worker's claim counts
 * it the same way against gatekeeper.max_in_flight.  The Message-ID the
 * claim makes is "<" id "." created_at's microseconds in hex "@" domain
 * ">": at most 1 + 20 + 1 + 16 + 1 + 255 + 1 = 295 octets (the domain is
 * gatekeeper.message_id_domain, at most 255 octets, or the sender's, at
 * most 252), which leaves 89 octets for whatever else a Message-ID comes
 * to carry (a MAC); sql/45_placeholder_size.sql checks the longest.
 */
#define GATEKEEPER_MESSAGE_ID_PLACEHOLDER "{message_id}"
#define GATEKEEPER_MESSAGE_ID_MAX	384

/*
 * What src/message.c can always fold into header lines of at most 998
 * octets, and src/validate.c therefore allows: a word written as it is
 * (one in angle brackets) of at most GATEKEEPER_HEADER_WORD_MAX octets,
 * and runs of at most GATEKEEPER_HEADER_SPACE_MAX spaces and tabs.  Any
 * longer word is written as encoded-words, which fold anywhere.
 */
#define GATEKEEPER_HEADER_WORD_MAX	900
#define GATEKEEPER_HEADER_SPACE_MAX	78

/*
 * An interval of a kind ("period", "dedupe_window", "lease", "delay")
 * normalised to microseconds, or 22023 when outside the kind's bounds.
 */
extern Interval *gatekeeper_check_duration(const Interval *value, const char *kind);

#endif							/* GATEKEEPER_VALIDATE_H */
