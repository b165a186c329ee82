/*-------------------------------------------------------------------------
 *
 * address.h
 *		Addresses (src/address.c): bare addresses checked, keyed and
 *		compared; mailboxes with display names, "Name <addr>" in, RFC 5322
 *		From and To fields out.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_ADDRESS_H
#define GATEKEEPER_ADDRESS_H

#include "lib/stringinfo.h"

/*
 * Why address is not a bare mailbox "local@domain" as gatekeeper accepts
 * it, as a full sentence; NULL when it is one.  Raises no error, so that
 * a setting's check hook can use it.
 */
extern const char *gatekeeper_address_problem(const char *address);

/* the same, raising 22023 with "what" (recipient, sender) naming the field */
extern void gatekeeper_check_address(const char *address, const char *what);

/*
 * The key a recipient's passes and suppressions are kept under: the
 * address with ASCII letters lower-cased.
 */
extern char *gatekeeper_recipient_key(const char *recipient);

/* whether a (perhaps NULL) is b, ASCII letters in any case */
extern bool gatekeeper_same_address(const char *a, const char *b);

/* the longest display name, in octets */
#define GATEKEEPER_NAME_MAX		256

/*
 * Split value ("Name <addr>", "\"Name\" <addr>", "<addr>" or "addr") into
 * a display name (NULL when none) and a bare address, both palloc'd.
 * Returns why value is not such a mailbox, as a full sentence, or NULL
 * when it is; raises no error, so that a setting's check hook can use it.
 */
extern const char *gatekeeper_mailbox_problem(const char *value, char **name,
											  char **address);

/* the same, raising 22023 with "what" (sender) naming the field */
extern void gatekeeper_parse_mailbox(const char *value, const char *what,
									 char **name, char **address);

/* raise 22023 unless name is a display name gatekeeper can write */
extern void gatekeeper_check_display_name(const char *name, const char *what);

/*
 * Append the body of a From or To field: the address alone when name is
 * NULL, else "Name" <addr> (a quoted-string, or RFC 2047 encoded-words of
 * at most 75 characters when the name is not ASCII), folded with CRLF and
 * a space.  used is how many columns the field's first line holds already
 * ("From: " is 6).
 */
extern void gatekeeper_format_mailbox(StringInfo buf, const char *name,
									  const char *address, int used);

#endif							/* GATEKEEPER_ADDRESS_H */
