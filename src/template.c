/*-------------------------------------------------------------------------
 *
 * template.c
 *		The templates' language: a logic-less Mustache subset, compiled once
 *		into a flat list of nodes and rendered over jsonb data.
 *
 * What it takes (the Mustache specification's interpolation, sections,
 * inverted and comments modules): {{name}} and dotted {{a.b}}, written
 * HTML-escaped in html mode and as they are otherwise; {{{name}}} and
 * {{&name}} unescaped; {{.}} the current element; sections {{#x}}..{{/x}}
 * over arrays (once per element, the element atop the context), objects
 * (pushed on the context) and other true values; inverted sections
 * {{^x}}..{{/x}}; comments {{! ...}}.  false, null and the empty array are
 * false; everything else, the empty string and 0 included, is true (the
 * specification's lists and truthiness, as Ruby's and mustache.java read
 * them).  A name that resolves to nothing renders empty.  Section tags and
 * comments alone on their line take the line with them ("standalone").
 *
 * What it refuses, as a template that does not parse: partials ({{>x}}),
 * delimiter changes ({{=x y=}}), inheritance ({{<x}}, {{$x}}), an unclosed
 * tag or section, a closing tag that closes nothing or another section,
 * sections nested deeper than GATEKEEPER_TEMPLATE_MAX_DEPTH, and names
 * with spaces or empty parts.  There are no lambdas: data is JSON.
 *
 * Rendering is bounded: its output by the caller's limit (the remainder
 * of gatekeeper.max_message_size), its work by a count of steps, so that
 * nested sections over large arrays that write nothing still end.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "template.h"

#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "utils/jsonb.h"
#include "utils/numeric.h"

/* what a node of a compiled template does */
typedef enum TemplateNodeKind
{
	NODE_TEXT,					/* write text */
	NODE_VALUE,					/* {{x}}: write a value, escaped in html */
	NODE_RAW,					/* {{{x}}}, {{&x}}: write a value as it is */
	NODE_SECTION,				/* {{#x}}: the nodes up to end, per element */
	NODE_INVERTED				/* {{^x}}: the nodes up to end, when x is false */
} TemplateNodeKind;

/* a name: its parts, split at dots ("." has none) */
typedef struct TemplateName
{
	int			nparts;
	bool		scoped;			/* a leading dot: the current element only */
	const char **parts;
	int		   *lens;
} TemplateName;

typedef struct TemplateNode
{
	TemplateNodeKind kind;
	const char *text;			/* NODE_TEXT: into the template's source */
	int			len;
	TemplateName name;			/* the others */
	int			end;			/* sections: the first node after the section */
} TemplateNode;

struct GatekeeperTemplate
{
	char	   *source;			/* the template's own copy */
	int			nnodes;
	TemplateNode *nodes;
};

/* a section open while compiling */
typedef struct OpenSection
{
	int			node;			/* its node */
	int			at;				/* its tag's offset, for errors */
	const char *name;			/* its tag's name, as written */
	int			len;
} OpenSection;

/* the state of one rendering */
typedef struct RenderState
{
	const GatekeeperTemplate *template;
	GatekeeperTemplateMode mode;
	StringInfo	out;
	int			base;			/* out->len when the rendering began */
	Size		limit;			/* what it may add to out */
	int64		steps;			/* nodes visited */
	int64		max_steps;
	const char *what;
	int			depth;			/* contexts on the stack */
	JsonbValue	stack[GATEKEEPER_TEMPLATE_MAX_DEPTH + 1];
} RenderState;

/*
 * Work a rendering may do beyond one step per octet of its limit: enough
 * for any template that writes what it visits, a bound for one that
 * visits without writing (empty sections nested over large arrays).
 */
#define RENDER_EXTRA_STEPS	1000000

static void parse_error(const char *source, int at, const char *what,
						const char *reason) pg_attribute_noreturn();
static void parse_name(const char *source, int at, const char *what,
					   const char *name, int len, TemplateName *result);
static bool standalone(const char *source, int len, int start, int end,
					   int *line_start, int *next);
static const char *find(const char *source, int len, int from, const char *s);
static void add_text(GatekeeperTemplate *t, int from, int to);
static void trim_blanks(const char **name, int *len);
static char read_tag(const char *s, int len, int start, const char *what,
					 int *content, int *content_end, int *end);
static void close_section(GatekeeperTemplate *t, OpenSection *open, int *depth, int start,
						  int content, int content_end, const char *what);
static void add_tag_node(GatekeeperTemplate *t, OpenSection *open, int *depth, char sigil,
						 int start, int content, int content_end, const char *what);
static void render_nodes(RenderState *st, int from, int to);
static bool resolve(RenderState *st, const TemplateName *name, JsonbValue *result);
static bool truthy(const JsonbValue *v);
static void write_value(RenderState *st, const JsonbValue *v, bool escape);
static void check_size(RenderState *st, Size more);
static void step(RenderState *st);

/*
 * parse_error
 *		Refuse a template that does not parse (22023), with the line and
 *		column (in characters) of the offending tag.
 */
static void
parse_error(const char *source, int at, const char *what, const char *reason)
{
	int			line = 1;
	int			column = 1;
	int			i;

	for (i = 0; i < at; i++)
	{
		unsigned char c = (unsigned char) source[i];

		if (c == '\n')
		{
			line++;
			column = 1;
		}
		else if ((c & 0xc0) != 0x80)
			column++;
	}
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("%s does not parse", what),
			 errdetail("%s at line %d, column %d (octet %d).", reason, line, column, at + 1)));
}

/*
 * find
 *		The first occurrence of s at or after from in the len octets of
 *		source, or NULL.
 */
static const char *
find(const char *source, int len, int from, const char *s)
{
	int			slen = strlen(s);
	int			i;

	for (i = from; i + slen <= len; i++)
	{
		if (source[i] == s[0] && memcmp(source + i, s, slen) == 0)
			return source + i;
	}
	return NULL;
}

/*
 * standalone
 *		Is the tag at [start, end) alone on its line but for spaces and tabs?
 *		Then *line_start is where its line begins and *next where the next
 *		line does (after "\n" or "\r\n", or the template's end).
 */
static bool
standalone(const char *source, int len, int start, int end, int *line_start, int *next)
{
	int			ls = start;
	int			le = end;

	while (ls > 0 && (source[ls - 1] == ' ' || source[ls - 1] == '\t'))
		ls--;
	if (ls > 0 && source[ls - 1] != '\n')
		return false;
	while (le < len && (source[le] == ' ' || source[le] == '\t'))
		le++;
	if (le == len)
		*next = le;
	else if (source[le] == '\n')
		*next = le + 1;
	else if (source[le] == '\r' && le + 1 < len && source[le + 1] == '\n')
		*next = le + 2;
	else
		return false;
	*line_start = ls;
	return true;
}

/*
 * parse_name
 *		A tag's name, trimmed: "." or parts separated by dots, none empty,
 *		with no space inside; a leading dot scopes it to the current element.
 */
static void
parse_name(const char *source, int at, const char *what, const char *name, int len,
		   TemplateName *result)
{
	int			i;
	int			start;

	while (len > 0 && (*name == ' ' || *name == '\t' || *name == '\r' || *name == '\n'))
		name++, len--;
	while (len > 0 && (name[len - 1] == ' ' || name[len - 1] == '\t' ||
					   name[len - 1] == '\r' || name[len - 1] == '\n'))
		len--;
	if (len == 0)
		parse_error(source, at, what, "A tag names nothing");
	for (i = 0; i < len; i++)
	{
		if (name[i] == ' ' || name[i] == '\t' || name[i] == '\r' || name[i] == '\n')
			parse_error(source, at, what, "A name holds a space");
		if (name[i] == '{' || name[i] == '}')
			parse_error(source, at, what, "A name holds a brace");
	}

	memset(result, 0, sizeof(TemplateName));
	if (len == 1 && name[0] == '.')
		return;
	if (name[0] == '.')
	{
		result->scoped = true;
		name++, len--;
	}
	result->parts = palloc(sizeof(char *) * (len / 2 + 1));
	result->lens = palloc(sizeof(int) * (len / 2 + 1));
	start = 0;
	for (i = 0; i <= len; i++)
	{
		if (i == len || name[i] == '.')
		{
			if (i == start)
				parse_error(source, at, what, "A name has an empty part");
			result->parts[result->nparts] = name + start;
			result->lens[result->nparts] = i - start;
			result->nparts++;
			start = i + 1;
		}
	}
}

/*
 * add_text
 *		Append a text node for the source's octets from up to to (the
 *		caller has made room for it).
 */
static void
add_text(GatekeeperTemplate *t, int from, int to)
{
	TemplateNode *node = &t->nodes[t->nnodes++];

	memset(node, 0, sizeof(TemplateNode));
	node->kind = NODE_TEXT;
	node->text = t->source + from;
	node->len = to - from;
}

/*
 * trim_blanks
 *		Trim spaces and tabs off both ends of the *len octets at *name.
 */
static void
trim_blanks(const char **name, int *len)
{
	while (*len > 0 && (**name == ' ' || **name == '\t'))
		(*name)++, (*len)--;
	while (*len > 0 && ((*name)[*len - 1] == ' ' || (*name)[*len - 1] == '\t'))
		(*len)--;
}

/*
 * read_tag
 *		The tag whose "{{" is at start: returns its sigil ('\0' for none),
 *		and sets where its content begins and ends and where the tag ends.
 *		22023 for a tag not closed, and for partials, delimiter changes and
 *		inheritance, which are not supported.
 */
static char
read_tag(const char *s, int len, int start, const char *what,
		 int *content, int *content_end, int *end)
{
	char		sigil = start + 2 < len ? s[start + 2] : '\0';
	const char *close;

	*content = start + 2;
	if (sigil == '{')
	{
		close = find(s, len, start + 3, "}}}");
		if (close == NULL)
			parse_error(s, start, what, "A {{{ tag is not closed by }}}");
		*content = start + 3;
		*content_end = close - s;
		*end = *content_end + 3;
		return sigil;
	}
	if (sigil == '!' || sigil == '#' || sigil == '^' || sigil == '/' || sigil == '&')
		(*content)++;
	else if (sigil == '>')
		parse_error(s, start, what, "Partials ({{>name}}) are not supported");
	else if (sigil == '=')
		parse_error(s, start, what, "Delimiter changes ({{=...=}}) are not supported");
	else if (sigil == '<' || sigil == '$')
		parse_error(s, start, what, "Template inheritance ({{<name}}, {{$name}}) is not supported");
	close = find(s, len, *content, "}}");
	if (close == NULL)
		parse_error(s, start, what, "A {{ tag is not closed by }}");
	*content_end = close - s;
	*end = *content_end + 2;
	return sigil;
}

/*
 * close_section
 *		A closing tag at start, naming the source's octets from content up
 *		to content_end: it must close the innermost open section, whose
 *		node then ends here.
 */
static void
close_section(GatekeeperTemplate *t, OpenSection *open, int *depth, int start,
			  int content, int content_end, const char *what)
{
	const char *s = t->source;
	const char *name = s + content;
	int			nlen = content_end - content;
	OpenSection *o;

	trim_blanks(&name, &nlen);
	if (*depth == 0)
		parse_error(s, start, what, "A closing tag closes no section");
	o = &open[*depth - 1];
	if (nlen != o->len || memcmp(name, o->name, nlen) != 0)
		parse_error(s, start, what, psprintf("A closing tag \"%.*s\" closes section \"%.*s\"",
											 Min(nlen, 100), name, Min(o->len, 100), o->name));
	t->nodes[o->node].end = t->nnodes;
	(*depth)--;
}

/*
 * add_tag_node
 *		Append the node of the tag at start with sigil, naming the source's
 *		octets from content up to content_end: a value, a raw value, or a
 *		section (plain or inverted), which opens at depth (the caller has
 *		made room for it).
 */
static void
add_tag_node(GatekeeperTemplate *t, OpenSection *open, int *depth, char sigil,
			 int start, int content, int content_end, const char *what)
{
	const char *s = t->source;
	TemplateNode *node = &t->nodes[t->nnodes];
	OpenSection *o;

	memset(node, 0, sizeof(TemplateNode));
	parse_name(s, start, what, s + content, content_end - content, &node->name);
	switch (sigil)
	{
		case '#':
		case '^':
			if (*depth == GATEKEEPER_TEMPLATE_MAX_DEPTH)
				parse_error(s, start, what,
							psprintf("Sections nest deeper than %d", GATEKEEPER_TEMPLATE_MAX_DEPTH));
			node->kind = sigil == '#' ? NODE_SECTION : NODE_INVERTED;
			o = &open[*depth];
			o->node = t->nnodes;
			o->at = start;
			o->name = s + content;
			o->len = content_end - content;
			trim_blanks(&o->name, &o->len);
			(*depth)++;
			break;
		case '{':
		case '&':
			node->kind = NODE_RAW;
			break;
		default:
			node->kind = NODE_VALUE;
			break;
	}
	t->nnodes++;
}

/*
 * gatekeeper_template_compile
 *		Compile the len octets at source, naming it "what" in errors (22023
 *		with the position when it does not parse).  The result and its copy
 *		of the source are allocated in CurrentMemoryContext.
 */
GatekeeperTemplate *
gatekeeper_template_compile(const char *source, int len, const char *what)
{
	GatekeeperTemplate *t = palloc0(sizeof(GatekeeperTemplate));
	OpenSection open[GATEKEEPER_TEMPLATE_MAX_DEPTH];
	int			depth = 0;
	int			capacity = 16;
	int			text_start = 0;
	const char *s;

	t->source = palloc(len + 1);
	memcpy(t->source, source, len);
	t->source[len] = '\0';
	s = t->source;
	t->nodes = palloc(sizeof(TemplateNode) * capacity);

	for (;;)
	{
		const char *open_tag = find(s, len, text_start, "{{");
		int			start;
		int			end;
		int			content;
		int			content_end;
		char		sigil;
		int			text_end;
		int			next;

		/* room for a text node and a tag's */
		if (t->nnodes + 2 > capacity)
		{
			capacity *= 2;
			t->nodes = repalloc(t->nodes, sizeof(TemplateNode) * capacity);
		}
		if (open_tag == NULL)
		{
			if (text_start < len)
				add_text(t, text_start, len);
			break;
		}
		start = open_tag - s;
		sigil = read_tag(s, len, start, what, &content, &content_end, &end);

		/* the text before the tag, and where the next begins */
		text_end = start;
		next = end;
		if (sigil == '!' || sigil == '#' || sigil == '^' || sigil == '/')
		{
			int			line_start;
			int			line_next;

			if (standalone(s, len, start, end, &line_start, &line_next))
			{
				text_end = line_start;
				next = line_next;
			}
		}
		if (text_end > text_start)
			add_text(t, text_start, text_end);
		text_start = next;
		if (sigil == '!')
			continue;
		if (sigil == '/')
			close_section(t, open, &depth, start, content, content_end, what);
		else
			add_tag_node(t, open, &depth, sigil, start, content, content_end, what);
	}

	if (depth > 0)
		parse_error(s, open[depth - 1].at, what,
					psprintf("Section \"%.*s\" is not closed",
							 Min(open[depth - 1].len, 100), open[depth - 1].name));
	return t;
}

/*
 * check_size
 *		Refuse output that more octets would take beyond the rendering's
 *		limit (54000).
 */
static void
check_size(RenderState *st, Size more)
{
	if ((Size) (st->out->len - st->base) + more > st->limit)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("rendered %s is larger than gatekeeper.max_message_size", st->what),
				 errdetail("It would exceed the %zu octets left of the mail's limit.", st->limit)));
}

/*
 * step
 *		Count one step of a rendering (a node visited, an element iterated
 *		over), refusing one that takes too many (54000).
 */
static void
step(RenderState *st)
{
	if (++st->steps > st->max_steps)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("rendering %s takes too many steps", st->what),
				 errdetail("It visited template parts and array elements more than " INT64_FORMAT " times.",
						   st->max_steps)));
	if ((st->steps & 4095) == 0)
		CHECK_FOR_INTERRUPTS();
}

/*
 * truthy
 *		Does a section over v render?  false, null and [] do not.
 */
static bool
truthy(const JsonbValue *v)
{
	switch (v->type)
	{
		case jbvNull:
			return false;
		case jbvBool:
			return v->val.boolean;
		case jbvBinary:
			if (JsonContainerIsArray(v->val.binary.data))
				return JsonContainerSize(v->val.binary.data) > 0;
			return true;
		default:
			return true;
	}
}

/*
 * resolve
 *		The value a name stands for, looked up as Mustache does: the first
 *		part in the contexts from the top of the stack down (the top only
 *		when scoped), every further part in the value before it.  False when
 *		it stands for nothing.
 */
static bool
resolve(RenderState *st, const TemplateName *name, JsonbValue *result)
{
	JsonbValue	v;
	int			level;
	int			i;
	bool		found = false;

	if (st->depth == 0)
		return false;
	if (name->nparts == 0)
	{
		*result = st->stack[st->depth - 1];
		return true;
	}
	for (level = st->depth - 1; level >= 0; level--)
	{
		const JsonbValue *c = &st->stack[level];

		if (c->type == jbvBinary && JsonContainerIsObject(c->val.binary.data) &&
			getKeyJsonValueFromContainer(c->val.binary.data, name->parts[0],
										 name->lens[0], &v) != NULL)
		{
			found = true;
			break;
		}
		if (name->scoped)
			break;
	}
	if (!found)
		return false;
	for (i = 1; i < name->nparts; i++)
	{
		JsonbValue	next;

		if (v.type != jbvBinary || !JsonContainerIsObject(v.val.binary.data) ||
			getKeyJsonValueFromContainer(v.val.binary.data, name->parts[i],
										 name->lens[i], &next) == NULL)
			return false;
		v = next;
	}
	*result = v;
	return true;
}

/*
 * write_value
 *		Write a value: a string as it is, a number in its shortest form
 *		(1.210 as 1.21), true and false, null as nothing, an array or object
 *		as JSON; HTML-escaped when escape is set.
 */
static void
write_value(RenderState *st, const JsonbValue *v, bool escape)
{
	const char *s;
	int			len;
	int			i;
	int			start;

	switch (v->type)
	{
		case jbvNull:
			return;
		case jbvString:
			s = v->val.string.val;
			len = v->val.string.len;
			break;
		case jbvNumeric:
			s = numeric_normalize(v->val.numeric);
			len = strlen(s);
			break;
		case jbvBool:
			s = v->val.boolean ? "true" : "false";
			len = strlen(s);
			break;
		case jbvBinary:
			s = JsonbToCString(NULL, v->val.binary.data, v->val.binary.len);
			len = strlen(s);
			break;
		default:
			elog(ERROR, "unexpected jsonb value type %d", (int) v->type);
	}

	check_size(st, len);
	if (!escape)
	{
		appendBinaryStringInfo(st->out, s, len);
		return;
	}

	/* the runs between characters to escape are appended whole */
	start = 0;
	for (i = 0; i < len; i++)
	{
		const char *entity;

		switch (s[i])
		{
			case '&':
				entity = "&amp;";
				break;
			case '<':
				entity = "&lt;";
				break;
			case '>':
				entity = "&gt;";
				break;
			case '"':
				entity = "&quot;";
				break;
			case '\'':
				entity = "&#39;";
				break;
			default:
				continue;
		}
		appendBinaryStringInfo(st->out, s + start, i - start);
		appendStringInfoString(st->out, entity);
		start = i + 1;
	}
	appendBinaryStringInfo(st->out, s + start, len - start);
	check_size(st, 0);
}

/*
 * render_nodes
 *		Render the nodes [from, to) of the template.
 */
static void
render_nodes(RenderState *st, int from, int to)
{
	int			i;

	for (i = from; i < to; i++)
	{
		const TemplateNode *node = &st->template->nodes[i];
		JsonbValue	v;
		bool		found;

		step(st);
		switch (node->kind)
		{
			case NODE_TEXT:
				check_size(st, node->len);
				appendBinaryStringInfo(st->out, node->text, node->len);
				break;
			case NODE_VALUE:
			case NODE_RAW:
				if (resolve(st, &node->name, &v))
					write_value(st, &v, node->kind == NODE_VALUE &&
								st->mode == GATEKEEPER_TEMPLATE_HTML);
				break;
			case NODE_INVERTED:
				found = resolve(st, &node->name, &v);
				if (!found || !truthy(&v))
					render_nodes(st, i + 1, node->end);
				i = node->end - 1;
				break;
			case NODE_SECTION:
				found = resolve(st, &node->name, &v);
				if (found && truthy(&v))
				{
					if (v.type == jbvBinary && JsonContainerIsArray(v.val.binary.data))
					{
						JsonbContainer *array = v.val.binary.data;
						uint32		n = JsonContainerSize(array);
						uint32		k;

						for (k = 0; k < n; k++)
						{
							JsonbValue *element;

							step(st);
							element = getIthJsonbValueFromContainer(array, k);
							st->stack[st->depth++] = *element;
							render_nodes(st, i + 1, node->end);
							st->depth--;
							pfree(element);
						}
					}
					else
					{
						st->stack[st->depth++] = v;
						render_nodes(st, i + 1, node->end);
						st->depth--;
					}
				}
				i = node->end - 1;
				break;
		}
	}
}

/*
 * gatekeeper_template_render
 *		Append the template rendered over data (a JSON object, or NULL: no
 *		name resolves) to out, which may not grow by more than limit octets
 *		(54000, naming "what").
 */
void
gatekeeper_template_render(const GatekeeperTemplate *template, Jsonb *data,
						   GatekeeperTemplateMode mode, StringInfo out, Size limit,
						   const char *what)
{
	RenderState st;

	st.template = template;
	st.mode = mode;
	st.out = out;
	st.base = out->len;
	st.limit = limit;
	st.steps = 0;
	st.max_steps = (int64) limit + RENDER_EXTRA_STEPS;
	st.what = what;
	st.depth = 0;
	if (data != NULL)
	{
		st.stack[0].type = jbvBinary;
		st.stack[0].val.binary.data = &data->root;
		st.stack[0].val.binary.len = VARSIZE(data) - VARHDRSZ;
		st.depth = 1;
	}
	render_nodes(&st, 0, template->nnodes);
}
