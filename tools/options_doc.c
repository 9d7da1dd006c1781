/*
 * tools/options_doc.c — prints the options table (base/options.def) as
 * Markdown, so the docs are made from the rows and cannot drift from them:
 * --env the environment's settings, --flags the examples' flags.
 * tests/base:test_settings_doc compares docs/settings.md with its output.
 */
#include <stdio.h>
#include <string.h>

#include "base/options.h"

/* s with every '|' escaped, which would end a Markdown table cell. */
static void cell(const char *s)
{
	for (; s && *s; s++) {
		if (*s == '|')
			fputc('\\', stdout);
		fputc(*s, stdout);
	}
}

/* What a row accepts, in words: "0 or 1", "integer, 0 to 3", "off, on". */
static void accepts(const loom_opt_row *r)
{
	switch (r->type) {
	case LOOM_OPT_BOOL:
		fputs("0 or 1", stdout);
		break;
	case LOOM_OPT_INT:
		printf("integer, %.15g to %.15g", r->lo, r->hi);
		break;
	case LOOM_OPT_REAL:
		printf("number, %.15g to %.15g", r->lo, r->hi);
		break;
	case LOOM_OPT_CHOICE:
		for (const char *p = r->choices; *p; p++) {
			if (*p == '|')
				fputs(", ", stdout);
			else
				fputc(*p, stdout);
		}
		break;
	case LOOM_OPT_STR:
		fputs("text", stdout);
		break;
	case LOOM_OPT_PATH:
		fputs("path", stdout);
		break;
	}
}

/* One table: the rows with an env (env != 0) or with a flag. */
static void table(int env)
{
	printf("| %s | accepts | default | read by | what it does |\n",
	       env ? "variable" : "flag");
	printf("| --- | --- | --- | --- | --- |\n");
	for (int i = 0; i < LOOM_OPT_COUNT; i++) {
		const loom_opt_row *r = loom_opt_row_get((loom_opt)i);
		const char *name = env ? r->env : r->flag;
		if (!name)
			continue;
		printf("| `%s` | ", name);
		accepts(r);
		printf(" | %s | %s | ", r->def ? r->def : "-", r->layer);
		cell(r->doc);
		printf("%s |\n", r->agree ? " (every rank the same)" : "");
	}
}

int main(int argc, char **argv)
{
	if (argc != 2 || (strcmp(argv[1], "--env") && strcmp(argv[1], "--flags"))) {
		fprintf(stderr, "usage: %s --env|--flags\n", argv[0]);
		return 2;
	}
	table(!strcmp(argv[1], "--env"));
	return 0;
}
