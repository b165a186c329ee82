/*-------------------------------------------------------------------------
 *
 * template_funcs.h
 *		What the claim uses of template_funcs.c: a templated mail's
 *		content, rendered from its template version and data, and its
 *		headers, the mail's own over the template's.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_TEMPLATE_FUNCS_H
#define GATEKEEPER_TEMPLATE_FUNCS_H

#include "datatype/timestamp.h"
#include "utils/jsonb.h"

/* a templated mail's content, rendered */
typedef struct GatekeeperRenderedMail
{
	text	   *subject;
	text	   *body;
	text	   *html;			/* NULL: none */
	Jsonb	   *headers;		/* NULL: none */
} GatekeeperRenderedMail;

extern char *gatekeeper_template_render_claimed(const char *name, bool version_null,
												int32 version, TimestampTz created_at,
												Jsonb *data, GatekeeperRenderedMail *out,
												MemoryContext into);
extern Jsonb *gatekeeper_template_headers_merge(Jsonb *rendered, Jsonb *own);

#endif							/* GATEKEEPER_TEMPLATE_FUNCS_H */
