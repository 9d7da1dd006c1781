/*
 * tools/options_doc.c — the docs' tables of settings, printed from
 * base/options.def so that they cannot drift from the code: --flags prints
 * the examples' flags (docs/examples.md holds it between its flags markers;
 * //tests/examples:test_flags_doc compares). Which programs take a flag
 * comes from the examples' place tables.
 */
#include <stdio.h>
#include <string.h>

#include "examples/classify_args.h"
#include "examples/flags.h"
#include "examples/gpt_args.h"
#include "examples/train_args.h"

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

/* s with each '|' escaped, for a Markdown table's cell. */
static void cell(const char *s)
{
	for (; *s; s++)
		fputs(*s == '|' ? "\\|" : (char[]){ *s, 0 }, stdout);
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
	if (argc == 2 && !strcmp(argv[1], "--flags")) {
		print_flags();
		return 0;
	}
	fprintf(stderr, "usage: options_doc --flags   (the examples' flags as a Markdown table)\n");
	return 2;
}
