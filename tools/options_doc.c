/*
 * tools/options_doc.c — prints the options table (base/options.def) as
 * Markdown, so the docs are made from the rows and cannot drift from them:
 * --env the environment's settings (docs/settings.md;
 * tests/base:test_settings_doc), --flags the examples' flags with the
 * programs that take each, from the examples' place tables
 * (docs/examples.md; tests/examples:test_flags_doc).
 */
#include <stdio.h>
#include <string.h>

#include "base/options.h"
#include "examples/classify_args.h"
#include "examples/flags.h"
#include "examples/gpt_args.h"
#include "examples/train_args.h"

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

/* The environment's rows. */
static void print_env(void)
{
	printf("| variable | accepts | default | read by | what it does |\n");
	printf("| --- | --- | --- | --- | --- |\n");
	for (int i = 0; i < LOOM_OPT_COUNT; i++) {
		const loom_opt_row *r = loom_opt_row_get((loom_opt)i);
		const char *name = r->env;
		if (!name)
			continue;
		printf("| `%s` | ", name);
		accepts(r);
		printf(" | %s | %s | ", r->def ? r->def : "-", r->layer);
		cell(r->doc);
		printf("%s |\n", r->agree ? " (every rank the same)" : "");
	}
}

static const char *const prog_names[FLAG_PROG_COUNT] = {
	"mnist_ddp", "cifar_ddp", "resnet50_synthetic", "gpt_ddp", "classify",
};

#define TRAINING (FLAG_PROG_MNIST_DDP | FLAG_PROG_CIFAR_DDP | FLAG_PROG_RESNET50_SYNTHETIC | \
		  FLAG_PROG_GPT_DDP)

/* The programs' bits that take row, over every place table. */
static unsigned programs_of(int row, const flag_target *t, size_t nt)
{
	unsigned m = 0;

	for (size_t k = 0; k < nt; k++)
		for (size_t i = 0; i < t[k].n; i++)
			if (t[k].places[i].row == row)
				m |= t[k].places[i].programs;
	return m;
}

static void programs_cell(unsigned m)
{
	const char *sep = "";

	if ((m & TRAINING) == TRAINING) {
		fputs("training", stdout);
		m &= ~TRAINING;
		sep = ", ";
	}
	for (int p = 0; p < FLAG_PROG_COUNT; p++)
		if (m & (1u << p)) {
			printf("%s%s", sep, prog_names[p]);
			sep = ", ";
		}
}

static void print_flags(void)
{
	train_args ta = train_mnist_ddp.defaults;
	gpt_cfg gc = gpt_cfg_defaults;
	classify_args ca = classify_defaults;
	const flag_target t[] = { train_target(&ta), gpt_target(&gc, NULL), classify_target(&ca) };

	printf("| flag | value | default | programs | ranks agree | meaning |\n"
	       "| --- | --- | --- | --- | --- | --- |\n");
	for (int row = 0; row < FLAG_ROW_COUNT; row++) {
		const flag_info *r = &flag_rows[row];
		if (!r->flag)
			continue;
		printf("| `%s` | ", r->flag);
		if (r->type != OPT_BOOL) {
			fputs("`", stdout);
			cell(flags_arg_name(row));
			fputs("`", stdout);
		}
		printf(" | %s | ", r->def ? r->def : "");
		programs_cell(programs_of(row, t, sizeof(t) / sizeof(t[0])));
		printf(" | %s | ", r->agree ? "yes" : "");
		cell(r->doc);
		if (r->env)
			printf(" (environment: `%s`)", r->env);
		printf(" |\n");
	}
}

int main(int argc, char **argv)
{
	if (argc == 2 && !strcmp(argv[1], "--env")) {
		print_env();
		return 0;
	}
	if (argc == 2 && !strcmp(argv[1], "--flags")) {
		print_flags();
		return 0;
	}
	fprintf(stderr, "usage: options_doc --env|--flags   (the environment's settings or the examples' flags as a Markdown table)\n");
	return 2;
}
