-- Templates (issue 48; SPEC "Templates"): the language, a logic-less
-- Mustache subset rendered over jsonb, checked against cases written from
-- the Mustache specification's interpolation, sections, inverted and
-- comments modules (v1.3: the cases within the subset; our own data and
-- wording), then what gatekeeper adds: the parts of a mail (text body as
-- it is, html escaped, subject and headers checked as enqueue checks
-- them), parse errors with their position, the bounds, and the SQL API
-- (create_template, alter_template, drop_template, render, templates).
SET client_min_messages = warning;
\set VERBOSITY terse

\i sql/error_of_detail.inc

-- source rendered over data as an html part, where {{x}} is HTML-escaped
-- as the specification's cases expect; each source becomes a template of
-- its own, named for its hash
CREATE FUNCTION pg_temp.mu(source text, data jsonb) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
	n text := 'mu_' || md5(source);
BEGIN
	IF NOT EXISTS (SELECT FROM gatekeeper.template t WHERE t.name = n) THEN
		PERFORM gatekeeper.create_template(n, 'subject', 'body', source);
	END IF;
	RETURN (SELECT r.html FROM gatekeeper.render(n, data) r);
END
$$;

CREATE TEMP TABLE mustache_case (
	n serial,
	module text,
	name text,
	template text,
	data jsonb,
	expected text
);

-- interpolation
INSERT INTO mustache_case (module, name, template, data, expected) VALUES
('interpolation', 'no tags', E'Hi from {Mustache}!\n', '{}', E'Hi from {Mustache}!\n'),
('interpolation', 'basic', E'Hello, {{who}}!\n', '{"who": "world"}', E'Hello, world!\n'),
('interpolation', 'html escaping', 'Escaped: {{bad}}', '{"bad": "& \" < >"}', 'Escaped: &amp; &quot; &lt; &gt;'),
('interpolation', 'triple mustache', 'As is: {{{bad}}}', '{"bad": "& \" < >"}', 'As is: & " < >'),
('interpolation', 'ampersand', 'As is: {{&bad}}', '{"bad": "& \" < >"}', 'As is: & " < >'),
('interpolation', 'integer', '"{{kmh}} km/h"', '{"kmh": 120}', '"120 km/h"'),
('interpolation', 'integer, triple', '"{{{kmh}}} km/h"', '{"kmh": 120}', '"120 km/h"'),
('interpolation', 'integer, ampersand', '"{{&kmh}} km/h"', '{"kmh": 120}', '"120 km/h"'),
('interpolation', 'decimal', '"{{volts}} V"', '{"volts": 2.350}', '"2.35 V"'),
('interpolation', 'decimal, triple', '"{{{volts}}} V"', '{"volts": 2.350}', '"2.35 V"'),
('interpolation', 'decimal, ampersand', '"{{&volts}} V"', '{"volts": 2.350}', '"2.35 V"'),
('interpolation', 'context miss', 'I ({{nothing}}) am empty', '{}', 'I () am empty'),
('interpolation', 'context miss, triple', 'I ({{{nothing}}}) am empty', '{}', 'I () am empty'),
('interpolation', 'context miss, ampersand', 'I ({{&nothing}}) am empty', '{}', 'I () am empty'),
('interpolation', 'dotted', '"{{user.name}}" == "{{#user}}{{name}}{{/user}}"', '{"user": {"name": "Ada"}}', '"Ada" == "Ada"'),
('interpolation', 'dotted, triple', '"{{{user.name}}}" == "{{#user}}{{{name}}}{{/user}}"', '{"user": {"name": "Ada"}}', '"Ada" == "Ada"'),
('interpolation', 'dotted, ampersand', '"{{&user.name}}" == "{{#user}}{{&name}}{{/user}}"', '{"user": {"name": "Ada"}}', '"Ada" == "Ada"'),
('interpolation', 'dotted, any depth', '{{p.q.r.s.t.name}}', '{"p": {"q": {"r": {"s": {"t": {"name": "deep"}}}}}}', 'deep'),
('interpolation', 'dotted, broken chain', '"{{p.q.r}}"', '{"p": {}}', '""'),
('interpolation', 'dotted, broken chain resolution', '"{{p.q.r.name}}"', '{"p": {"q": {}}, "r": {"name": "other"}}', '""'),
('interpolation', 'dotted, initial resolution', '{{#p}}{{q.r.name}}{{/p}}', '{"p": {"q": {"r": {"name": "inner"}}}, "q": {"r": {"name": "outer"}}}', 'inner'),
('interpolation', 'dotted, leading dot', '{{#p}}{{.name}}{{/p}}{{#q}}{{.name}}{{/q}}', '{"p": {}, "q": {"name": "Q"}, "name": "top"}', 'Q'),
('interpolation', 'dotted, context precedence', '{{#p}}{{q.r}}{{/p}}', '{"p": {"q": {}}, "q": {"r": "wrong"}}', ''),
('interpolation', 'surrounding whitespace', '| {{s}} |', '{"s": "---"}', '| --- |'),
('interpolation', 'surrounding whitespace, triple', '| {{{s}}} |', '{"s": "---"}', '| --- |'),
('interpolation', 'surrounding whitespace, ampersand', '| {{&s}} |', '{"s": "---"}', '| --- |'),
('interpolation', 'standalone', E'  {{s}}\n', '{"s": "---"}', E'  ---\n'),
('interpolation', 'standalone, triple', E'  {{{s}}}\n', '{"s": "---"}', E'  ---\n'),
('interpolation', 'standalone, ampersand', E'  {{&s}}\n', '{"s": "---"}', E'  ---\n'),
('interpolation', 'padding', '|{{ s }}|', '{"s": "---"}', '|---|'),
('interpolation', 'padding, triple', '|{{{ s }}}|', '{"s": "---"}', '|---|'),
('interpolation', 'padding, ampersand', '|{{& s }}|', '{"s": "---"}', '|---|');

-- sections
INSERT INTO mustache_case (module, name, template, data, expected) VALUES
('sections', 'truthy', '"{{#yes}}shown{{/yes}}"', '{"yes": true}', '"shown"'),
('sections', 'falsey', '"{{#no}}hidden{{/no}}"', '{"no": false}', '""'),
('sections', 'null is falsey', '"{{#nil}}hidden{{/nil}}"', '{"nil": null}', '""'),
('sections', 'context', '"{{#ctx}}Hi {{name}}.{{/ctx}}"', '{"ctx": {"name": "Bo"}}', '"Hi Bo."'),
('sections', 'parent contexts', '"{{#sec}}{{a}}, {{b}}, {{c.d}}{{/sec}}"', '{"a": "x", "b": "wrong", "sec": {"b": "y"}, "c": {"d": "z"}}', '"x, y, z"'),
('sections', 'variable test', '"{{#v}}{{.}} is {{v}}{{/v}}"', '{"v": "it"}', '"it is it"'),
('sections', 'list contexts', '{{#tops}}{{#mids}}{{tn.lo}}{{mn}}.{{#bots}}{{tn.up}}{{mn}}{{bn}}.{{/bots}}{{/mids}}{{/tops}}',
 '{"tops": [{"tn": {"up": "A", "lo": "a"}, "mids": [{"mn": "1", "bots": [{"bn": "x"}, {"bn": "y"}]}]}]}', 'a1.A1x.A1y.'),
('sections', 'deeply nested contexts', E'{{#a}}\n{{one}}\n{{#b}}\n{{one}}{{two}}{{one}}\n{{#c}}\n{{one}}{{two}}{{three}}{{two}}{{one}}\n{{/c}}\n{{one}}{{two}}{{one}}\n{{/b}}\n{{one}}\n{{/a}}\n',
 '{"a": {"one": 1}, "b": {"two": 2}, "c": {"three": 3}}', E'1\n121\n12321\n121\n1\n'),
('sections', 'list', '"{{#l}}{{i}}{{/l}}"', '{"l": [{"i": 1}, {"i": 2}, {"i": 3}]}', '"123"'),
('sections', 'empty list', '"{{#l}}hidden{{/l}}"', '{"l": []}', '""'),
('sections', 'strings are not lists', '"{{#s}}once{{/s}}"', '{"s": "123"}', '"once"'),
('sections', 'doubled', E'{{#t}}\n* first\n{{/t}}\n* {{two}}\n{{#t}}\n* third\n{{/t}}\n', '{"t": true, "two": "second"}', E'* first\n* second\n* third\n'),
('sections', 'nested, truthy', '| A {{#t}}B {{#t}}C{{/t}} D{{/t}} E |', '{"t": true}', '| A B C D E |'),
('sections', 'nested, falsey', '| A {{#t}}B {{#t}}C{{/t}} D{{/t}} E |', '{"t": false}', '| A  E |'),
('sections', 'context miss', '[{{#missing}}found{{/missing}}]', '{}', '[]'),
('sections', 'implicit iterator, string', '"{{#l}}({{.}}){{/l}}"', '{"l": ["a", "b", "c"]}', '"(a)(b)(c)"'),
('sections', 'implicit iterator, integer', '"{{#l}}({{.}}){{/l}}"', '{"l": [1, 2, 3]}', '"(1)(2)(3)"'),
('sections', 'implicit iterator, decimal', '"{{#l}}({{.}}){{/l}}"', '{"l": [1.10, 2.20, 3.30]}', '"(1.1)(2.2)(3.3)"'),
('sections', 'implicit iterator, array', '"{{#l}}({{#.}}{{.}}{{/.}}){{/l}}"', '{"l": [[1, 2, 3], ["a", "b", "c"]]}', '"(123)(abc)"'),
('sections', 'dotted, truthy', '"{{#a.b.c}}here{{/a.b.c}}"', '{"a": {"b": {"c": true}}}', '"here"'),
('sections', 'dotted, falsey', '"{{#a.b.c}}here{{/a.b.c}}"', '{"a": {"b": {"c": false}}}', '""'),
('sections', 'dotted, broken chain', '"{{#a.b.c}}here{{/a.b.c}}"', '{"a": {}}', '""'),
('sections', 'surrounding whitespace', E' | {{#t}}\t|\t{{/t}} | \n', '{"t": true}', E' | \t|\t | \n'),
('sections', 'internal whitespace', E' | {{#t}} {{! keep }}\n {{/t}} | \n', '{"t": true}', E' |  \n  | \n'),
('sections', 'indented inline', E' {{#t}}YES{{/t}}\n {{#t}}GOOD{{/t}}\n', '{"t": true}', E' YES\n GOOD\n'),
('sections', 'standalone lines', E'| This\n{{#t}}\n|\n{{/t}}\n| line\n', '{"t": true}', E'| This\n|\n| line\n'),
('sections', 'indented standalone lines', E'| This\n  {{#t}}\n|\n  {{/t}}\n| line\n', '{"t": true}', E'| This\n|\n| line\n'),
('sections', 'standalone line endings', E'|\r\n{{#t}}\r\n{{/t}}\r\n|', '{"t": true}', E'|\r\n|'),
('sections', 'standalone without previous line', E'  {{#t}}\n#{{/t}}\n/', '{"t": true}', E'#\n/'),
('sections', 'standalone without newline', E'#{{#t}}\n/\n  {{/t}}', '{"t": true}', E'#\n/\n'),
('sections', 'padding', '|{{# t }}={{/ t }}|', '{"t": true}', '|=|');

-- inverted
INSERT INTO mustache_case (module, name, template, data, expected) VALUES
('inverted', 'falsey', '"{{^f}}shown{{/f}}"', '{"f": false}', '"shown"'),
('inverted', 'null', '"{{^f}}shown{{/f}}"', '{"f": null}', '"shown"'),
('inverted', 'truthy', '"{{^t}}hidden{{/t}}"', '{"t": true}', '""'),
('inverted', 'truthy string', '"{{^s}}hidden{{/s}}"', '{"s": "there"}', '""'),
('inverted', 'context', '"{{^ctx}}Hi {{name}}.{{/ctx}}"', '{"ctx": {"name": "Bo"}}', '""'),
('inverted', 'list', '"{{^l}}{{i}}{{/l}}"', '{"l": [{"i": 1}, {"i": 2}]}', '""'),
('inverted', 'empty list', '"{{^l}}none{{/l}}"', '{"l": []}', '"none"'),
('inverted', 'doubled', E'{{^f}}\n* first\n{{/f}}\n* {{two}}\n{{^f}}\n* third\n{{/f}}\n', '{"f": false, "two": "second"}', E'* first\n* second\n* third\n'),
('inverted', 'nested, falsey', '| A {{^f}}B {{^f}}C{{/f}} D{{/f}} E |', '{"f": false}', '| A B C D E |'),
('inverted', 'nested, truthy', '| A {{^f}}B {{^f}}C{{/f}} D{{/f}} E |', '{"f": true}', '| A  E |'),
('inverted', 'context miss', '[{{^missing}}not found{{/missing}}]', '{}', '[not found]'),
('inverted', 'dotted, truthy', '"{{^a.b.c}}not here{{/a.b.c}}"', '{"a": {"b": {"c": true}}}', '""'),
('inverted', 'dotted, falsey', '"{{^a.b.c}}not here{{/a.b.c}}"', '{"a": {"b": {"c": false}}}', '"not here"'),
('inverted', 'dotted, broken chain', '"{{^a.b.c}}not here{{/a.b.c}}"', '{"a": {}}', '"not here"'),
('inverted', 'surrounding whitespace', E' | {{^f}}\t|\t{{/f}} | \n', '{"f": false}', E' | \t|\t | \n'),
('inverted', 'internal whitespace', E' | {{^f}} {{! keep }}\n {{/f}} | \n', '{"f": false}', E' |  \n  | \n'),
('inverted', 'indented inline', E' {{^f}}NO{{/f}}\n {{^f}}WAY{{/f}}\n', '{"f": false}', E' NO\n WAY\n'),
('inverted', 'standalone lines', E'| This\n{{^f}}\n|\n{{/f}}\n| line\n', '{"f": false}', E'| This\n|\n| line\n'),
('inverted', 'indented standalone lines', E'| This\n  {{^f}}\n|\n  {{/f}}\n| line\n', '{"f": false}', E'| This\n|\n| line\n'),
('inverted', 'standalone line endings', E'|\r\n{{^f}}\r\n{{/f}}\r\n|', '{"f": false}', E'|\r\n|'),
('inverted', 'standalone without previous line', E'  {{^f}}\n^{{/f}}\n/', '{"f": false}', E'^\n/'),
('inverted', 'standalone without newline', E'^{{^f}}\n/\n  {{/f}}', '{"f": false}', E'^\n/\n'),
('inverted', 'padding', '|{{^ f }}={{/ f }}|', '{"f": false}', '|=|');

-- comments
INSERT INTO mustache_case (module, name, template, data, expected) VALUES
('comments', 'inline', '12345{{! a comment }}67890', '{}', '1234567890'),
('comments', 'multiline', E'12345{{!\n  over\n  lines\n}}67890\n', '{}', E'1234567890\n'),
('comments', 'standalone', E'Begin.\n{{! a comment }}\nEnd.\n', '{}', E'Begin.\nEnd.\n'),
('comments', 'indented standalone', E'Begin.\n  {{! indented }}\nEnd.\n', '{}', E'Begin.\nEnd.\n'),
('comments', 'standalone line endings', E'|\r\n{{! standalone }}\r\n|', '{}', E'|\r\n|'),
('comments', 'standalone without previous line', E'  {{! still standalone }}\n!', '{}', '!'),
('comments', 'standalone without newline', E'!\n  {{! still standalone }}', '{}', E'!\n'),
('comments', 'multiline standalone', E'Begin.\n{{!\nsomething\n}}\nEnd.\n', '{}', E'Begin.\nEnd.\n'),
('comments', 'indented multiline standalone', E'Begin.\n  {{!\n    something\n  }}\nEnd.\n', '{}', E'Begin.\nEnd.\n'),
('comments', 'indented inline', E'  12 {{! 34 }}\n', '{}', E'  12 \n'),
('comments', 'surrounding whitespace', '12345 {{! a comment }} 67890', '{}', '12345  67890');

-- every case: its rendering (as JSON, its line ends visible) and whether
-- it is the specification's
SELECT c.module, c.name, to_json(pg_temp.mu(c.template, c.data)) AS rendered,
	   pg_temp.mu(c.template, c.data) IS NOT DISTINCT FROM c.expected AS as_spec
  FROM mustache_case c ORDER BY c.n;
SELECT module, count(*) AS cases,
	   count(*) FILTER (WHERE pg_temp.mu(template, data) IS NOT DISTINCT FROM expected) AS as_spec
  FROM mustache_case GROUP BY module ORDER BY module;

-- what gatekeeper decides where the specification leaves it open: "" and 0
-- are true, {} is true, objects and arrays interpolate as JSON, booleans
-- as words, null as nothing; ' is escaped in html too
SELECT to_json(pg_temp.mu('{{#e}}empty string{{/e}}|{{#z}}zero{{/z}}|{{#o}}object{{/o}}|{{^o}}no object{{/o}}', '{"e": "", "z": 0, "o": {}}')) AS truthiness;
SELECT to_json(pg_temp.mu('{{{o}}} {{{a}}} {{t}} {{f}} [{{n}}]', '{"o": {"k": [1, "x"]}, "a": [1, 2], "t": true, "f": false, "n": null}')) AS values;
SELECT to_json(pg_temp.mu('{{q}}', $${"q": "it's"}$$)) AS apostrophe;
-- NULL data: nothing resolves
SELECT to_json(pg_temp.mu('[{{a}}]{{^a}}none{{/a}}', NULL)) AS null_data;

-- a mail's parts: the text body as it is, the html escaped, the subject
-- and header values as text, checked as enqueue checks them
SELECT gatekeeper.create_template('welcome', 'Bienvenue, {{first_name}} & co',
	E'Hello {{first_name}},\n{{#products}}\n- {{name}}: {{price}} EUR\n{{/products}}\n{{^products}}\nNothing for you.\n{{/products}}\nBye <{{first_name}}>\n',
	E'<p>Hello {{first_name}}</p>\n<ul>\n{{#products}}\n  <li>{{name}}</li>\n{{/products}}\n</ul>\n',
	'{"Reply-To": "{{agent.email}}", "X-Campaign": "spring {{first_name}}"}') AS version;
SELECT to_json(r.subject) AS subject, to_json(r.body) AS body, to_json(r.html) AS html, r.headers
  FROM gatekeeper.render('welcome', '{"first_name": "Zoë <&>", "agent": {"email": "help@shop.example"},
	"products": [{"name": "Tea <green>", "price": 4.50}, {"name": "Cup", "price": 12}]}') r;
SELECT to_json(r.body) AS body, r.headers
  FROM gatekeeper.render('welcome', '{"first_name": "Jo", "products": []}') r;
-- a rendered subject or header value with a line break or a control
-- character is refused, as enqueue refuses it
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.render('welcome', '{"first_name": "x\r\nBcc: all@example.com"}')$$) AS subject_crlf;
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.render('welcome', '{"first_name": "x", "agent": {"email": "a@b.example\nBcc: c@d.example"}}')$$) AS header_lf;
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.render('welcome', '{"first_name": "x\u0007"}')$$) AS subject_control;
-- data must be an object
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.render('welcome', '[1, 2]')$$) AS data_array;
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.render('welcome', '"x"')$$) AS data_scalar;

-- templates that do not parse: 22023 with the position
SELECT t AS template, pg_temp.error_of(format('SELECT gatekeeper.create_template(%L, %L, %L)', 'bad', 's', t)) AS error
  FROM (VALUES
		('Hello {{name'),
		(E'line one\n  {{{name}} three'),
		(E'{{#a}}\n{{#b}}\n{{/a}}\n{{/b}}'),
		('{{#a}} never closed'),
		('text {{/a}}'),
		('{{> partial}}'),
		('{{=<% %>=}}'),
		('{{<parent}}{{/parent}}'),
		('{{$block}}{{/block}}'),
		('{{}}'),
		('{{first name}}'),
		('{{a..b}}'),
		('{{a.}}'),
		(E'é\n  ça {{!unclosed comment')) v(t);
SELECT pg_temp.error_of($$SELECT gatekeeper.create_template('bad', 'Hi {{#x}}', 'body')$$) AS subject_unclosed;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_template('bad', 's', 'b', '<p>{{/x}}')$$) AS html_stray_close;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_template('bad', 's', 'b', NULL, '{"X-A": "{{y"}')$$) AS header_unclosed;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_template('bad', E'a\nb', 'b')$$) AS subject_line_break;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_template('bad', 's', 'b', NULL, '{"From": "x"}')$$) AS header_reserved;
-- sections nest at most 16 deep
SELECT pg_temp.error_of(format('SELECT gatekeeper.create_template(%L, %L, %L)', 'deep16', 's',
	repeat('{{#a}}', 16) || '{{x}}' || repeat('{{/a}}', 16))) AS depth_16;
SELECT pg_temp.error_of(format('SELECT gatekeeper.create_template(%L, %L, %L)', 'deep17', 's',
	repeat('{{#a}}', 17) || '{{x}}' || repeat('{{/a}}', 17))) AS depth_17;
SELECT to_json(r.body) AS body_16_deep FROM gatekeeper.render('deep16', '{"a": {"x": 1}}') r;
SELECT name, version FROM gatekeeper.template WHERE name LIKE 'bad%' OR name LIKE 'deep%' ORDER BY name;

-- rendering is bounded: output within gatekeeper.max_message_size (10MB
-- here), and the work of sections that write nothing
SELECT gatekeeper.create_template('big', 's', repeat('x', 1000) || '{{#l}}' || repeat('y', 1000) || '{{/l}}');
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.render('big', jsonb_build_object('l', (SELECT jsonb_agg(i) FROM generate_series(1, 20000) i)))$$) AS too_large;
SELECT length(r.body) AS fits FROM gatekeeper.render('big', jsonb_build_object('l', (SELECT jsonb_agg(i) FROM generate_series(1, 9000) i))) r;
SELECT gatekeeper.create_template('busy', 's', repeat('{{#l}}', 5) || repeat('{{/l}}', 5));
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.render('busy', jsonb_build_object('l', (SELECT jsonb_agg(i) FROM generate_series(1, 100) i)))$$) AS too_busy;

-- the SQL API: versions, a preview of each, drop
SELECT pg_temp.error_of($$SELECT gatekeeper.create_template('welcome', 's', 'b')$$) AS exists;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_template(NULL, 's', 'b')$$) AS null_name;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_template('x', NULL, 'b')$$) AS null_subject;
SELECT pg_temp.error_of($$SELECT gatekeeper.create_template('', 's', 'b')$$) AS empty_name;
SELECT pg_temp.error_of(format('SELECT gatekeeper.create_template(%L, %L, %L)', repeat('n', 201), 's', 'b')) AS long_name;
SELECT gatekeeper.alter_template('welcome', subject => 'Hi {{first_name}}') AS version;
SELECT gatekeeper.alter_template('welcome', html => '') AS version;
SELECT gatekeeper.alter_template('welcome', headers => '{}', body => 'Only {{first_name}}') AS version;
SELECT pg_temp.error_of($$SELECT gatekeeper.alter_template('welcome', body => '{{#x}}')$$) AS bad_version;
SELECT pg_temp.error_of($$SELECT gatekeeper.alter_template('nothing', body => 'b')$$) AS missing;
SELECT name, version, subject, html IS NOT NULL AS html, headers IS NOT NULL AS headers
  FROM gatekeeper.template WHERE name = 'welcome' ORDER BY version;
SELECT v AS version, r.subject, to_json(r.body) AS body, r.html IS NOT NULL AS html, r.headers
  FROM generate_series(1, 4) v, gatekeeper.render('welcome', '{"first_name": "Jo"}', v) r ORDER BY v;
SELECT r.subject AS latest FROM gatekeeper.render('welcome', '{"first_name": "Jo"}') r;
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.render('welcome', '{}', 9)$$) AS no_version;
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.render('nothing', '{}')$$) AS no_template;
SELECT pg_temp.error_of($$SELECT * FROM gatekeeper.render(NULL, '{}')$$) AS null_template;
SELECT name, version, in_use FROM gatekeeper.templates WHERE name IN ('welcome', 'big') ORDER BY name, version;
SELECT gatekeeper.drop_template('welcome');
SELECT count(*) AS welcome_versions FROM gatekeeper.template WHERE name = 'welcome';
SELECT pg_temp.error_of($$SELECT gatekeeper.drop_template('welcome')$$) AS dropped;
-- a name made again starts at version 1, with its new parts (the
-- compiled form this session kept of the old version 1 is not used)
SELECT gatekeeper.create_template('welcome', 'Again {{first_name}}', 'new body');
SELECT r.subject, r.body FROM gatekeeper.render('welcome', '{"first_name": "Jo"}') r;

-- nothing for PUBLIC
SELECT p.proname, has_function_privilege('public', p.oid, 'EXECUTE') AS public_execute
  FROM pg_proc p WHERE p.pronamespace = 'gatekeeper'::regnamespace
   AND p.proname IN ('create_template', 'alter_template', 'drop_template', 'render',
					 '_template_check')
 ORDER BY p.proname;
SELECT has_table_privilege('public', 'gatekeeper.template', 'SELECT') AS public_table,
	   has_table_privilege('public', 'gatekeeper.templates', 'SELECT') AS public_view;
