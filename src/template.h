/*-------------------------------------------------------------------------
 *
 * template.h
 *		What the rest of gatekeeper uses of template.c: the templates'
 *		language (a logic-less Mustache subset over jsonb), compiled once,
 *		rendered within a bound of output and of work.
 *
 *-------------------------------------------------------------------------
 */
#ifndef GATEKEEPER_TEMPLATE_H
#define GATEKEEPER_TEMPLATE_H

#include "lib/stringinfo.h"
#include "utils/jsonb.h"

/* sections nest at most this deep */
#define GATEKEEPER_TEMPLATE_MAX_DEPTH	16

/* a template's name: 1 to this many octets */
#define GATEKEEPER_TEMPLATE_NAME_MAX	200

/* one compiled template text (a subject, a body, an html part, a header) */
typedef struct GatekeeperTemplate GatekeeperTemplate;

/* how {{x}} writes a value */
typedef enum GatekeeperTemplateMode
{
	GATEKEEPER_TEMPLATE_TEXT,	/* as it is: a text body, a subject, a header */
	GATEKEEPER_TEMPLATE_HTML	/* HTML-escaped ({{{x}}} and {{&x}} are not) */
} GatekeeperTemplateMode;

extern GatekeeperTemplate *gatekeeper_template_compile(const char *source, int len,
													   const char *what);
extern void gatekeeper_template_render(const GatekeeperTemplate *template, Jsonb *data,
									   GatekeeperTemplateMode mode, StringInfo out,
									   Size limit, const char *what);

#endif							/* GATEKEEPER_TEMPLATE_H */
