/*-------------------------------------------------------------------------
 *
 * message_id.h
 *		The Message-ID gatekeeper gives a mail, keyed so that no recipient
 *		can compute another mail's, and the check of one a report names
 *		(src/message_id.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_MESSAGE_ID_H
#define GATEKEEPER_MESSAGE_ID_H

/* the MAC's characters in a generated Message-ID: 100 bits in base32 */
#define GATEKEEPER_MESSAGE_ID_MAC_LEN	20

/*
 * The Message-ID of mail id, <id.mac@domain>: the domain domain_setting
 * (gatekeeper.message_id_domain) when not empty, else sender's (a text
 * Datum, unless sender_null), else default_sender's, else
 * gatekeeper.invalid.  The MAC is keyed with the database's secret: call
 * inside a transaction with a snapshot, as a role that may read the
 * secret (SPI is connected here when the secret must be read).
 */
extern text *gatekeeper_message_id(int64 id, Datum sender, bool sender_null,
								   const char *domain_setting, const char *default_sender);

/* what a Message-ID a report names says of the mail it names */
typedef enum MessageIdKind
{
	MESSAGE_ID_NONE,			/* no mail: not gatekeeper's form, or a wrong MAC */
	MESSAGE_ID_SIGNED,			/* <id.mac@domain> with this database's MAC */
	MESSAGE_ID_UNSIGNED			/* gatekeeper's earlier <id.hex@domain>: no MAC */
} MessageIdKind;

/*
 * What message_id (with its angle brackets) names: *id is the mail's when
 * it is not MESSAGE_ID_NONE.  Neither kind says the mail was sent with
 * that Message-ID: the caller compares it with the mail's.  Reads the
 * secret as gatekeeper_message_id does.
 */
extern MessageIdKind gatekeeper_message_id_check(const char *message_id, int64 *id);

#endif							/* GATEKEEPER_MESSAGE_ID_H */
