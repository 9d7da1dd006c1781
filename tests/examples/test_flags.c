/*
 * tests/examples/test_flags.c — the examples' flags from base/options.def
 * (examples/flags.c) as every program takes them: one message for one bad
 * value whatever the program, --help listing every row a program takes,
 * each row's documented default what the programs start from, no flag
 * taken twice by one program, no row that no program takes.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "examples/classify_args.h"
#include "examples/flags.h"
#include "examples/gpt_args.h"
#include "examples/train_args.h"

/* The five programs' structs, holding their defaults. */
typedef struct progs {
	train_args ta[FLAG_PROG_COUNT];
	gpt_cfg gc;
	classify_args ca;
} progs;

static const train_program *const training[] = { &train_mnist_ddp, &train_cifar_ddp,
						 &train_resnet50_synthetic, &train_gpt_ddp,
						 &train_classify };

/* Program p's targets (bit 1 << p), as its parser is given them. */
static size_t targets_of(progs *s, int p, flag_target *t)
{
	s->ta[p] = training[p]->defaults;
	t[0] = train_target(&s->ta[p]);
	if (training[p]->bit == FLAG_PROG_GPT_DDP) {
		s->gc = gpt_cfg_defaults;
		t[1] = gpt_target(&s->gc, NULL);
		return 2;
	}
	if (training[p]->bit == FLAG_PROG_CLASSIFY) {
		s->ca = classify_defaults;
		t[1] = classify_target(&s->ca);
		return 2;
	}
	return 1;
}

/* The message program p gives for argv (NULL-ended, after the name)
 * through its own entry point, or "" when it runs. */
static void message_of(int p, const char **args, char *msg, size_t len)
{
	char *argv[16] = { (char *)training[p]->name };
	int argc = 1;
	progs s;
	flag_target own;

	while (*args)
		argv[argc++] = (char *)*args++;
	argv[argc] = NULL;
	msg[0] = 0;
	if (training[p]->bit == FLAG_PROG_CLASSIFY) {
		classify_parse(argc, argv, &s.ca, stdout, msg, len);
		return;
	}
	s.gc = gpt_cfg_defaults;
	own = gpt_target(&s.gc, NULL);
	train_parse_with(training[p], training[p]->bit == FLAG_PROG_GPT_DDP ? &own : NULL, argc,
			 argv, &s.ta[0], msg, len);
}

Test(flags, every_program_refuses_a_bad_opt_level_in_the_same_words)
{
	const char *args[] = { "--opt-level", "O7", NULL };
	char first[512], msg[512];

	message_of(0, args, first, sizeof(first));
	cr_assert_str_eq(first, "--opt-level must be O0, O1, O2 or O3, got 'O7'");
	for (int p = 1; p < FLAG_PROG_COUNT; p++) {
		message_of(p, args, msg, sizeof(msg));
		cr_assert_str_eq(msg, first, "%s: '%s'", training[p]->name, msg);
	}
}

/* A value row's parser refuses, by its type; NULL: none (a path, a switch). */
static const char *bad_value(int row)
{
	switch (flag_rows[row].type) {
	case OPT_INT: return "1e400";
	case OPT_REAL: return "fast";
	case OPT_CHOICE: return "nonesuch";
	default: return NULL;
	}
}

Test(flags, a_shared_flag_is_refused_in_the_same_words_by_every_program_taking_it)
{
	int checked = 0;

	for (int row = 0; row < FLAG_ROW_COUNT; row++) {
		const char *bad = bad_value(row);
		char first[512] = "", msg[512];
		int takers = 0;
		if (!flag_rows[row].flag || !bad)
			continue;
		for (int p = 0; p < FLAG_PROG_COUNT; p++) {
			progs s;
			flag_target t[2];
			size_t nt = targets_of(&s, p, t);
			if (!flags_place(training[p]->bit, t, nt, row, NULL))
				continue;
			cr_assert_eq(flags_set(training[p]->bit, t, nt, flag_rows[row].flag + 2, bad,
					       msg, sizeof(msg)), -1, "%s %s %s taken",
				     training[p]->name, flag_rows[row].flag, bad);
			cr_assert(strstr(msg, flag_rows[row].flag), "%s: '%s'", training[p]->name,
				  msg);
			if (!takers++)
				snprintf(first, sizeof(first), "%s", msg);
			cr_assert_str_eq(msg, first, "%s %s", training[p]->name, flag_rows[row].flag);
		}
		checked += takers > 1;
	}
	cr_assert_geq(checked, 10, "only %d flags shared", checked);
}

Test(flags, help_lists_every_row_a_program_takes_and_every_row_has_a_program)
{
	unsigned char listed[FLAG_ROW_COUNT] = { 0 };

	for (int p = 0; p < FLAG_PROG_COUNT; p++) {
		progs s;
		flag_target t[2];
		size_t nt = targets_of(&s, p, t), len;
		char *text, line[128];
		FILE *f = open_memstream(&text, &len);
		fputc('\n', f); /* every flag's line then starts after a newline */
		flags_usage(training[p]->bit, t, nt, f);
		fclose(f);
		for (int row = 0; row < FLAG_ROW_COUNT; row++) {
			if (!flag_rows[row].flag ||
			    !flags_place(training[p]->bit, t, nt, row, NULL))
				continue;
			snprintf(line, sizeof(line), "\n  %s%s%s", flag_rows[row].flag,
				 flag_rows[row].type == OPT_BOOL ? "" : " ", flags_arg_name(row));
			cr_assert(strstr(text, line), "%s --help lacks %s", training[p]->name,
				  line + 1);
			listed[row] = 1;
		}
		free(text);
	}
	for (int row = 0; row < FLAG_ROW_COUNT; row++)
		cr_assert(!flag_rows[row].flag || listed[row], "no program takes %s",
			  flag_rows[row].flag);
}

Test(flags, a_rows_default_is_what_every_program_taking_it_starts_from)
{
	char text[256];

	for (int p = 0; p < FLAG_PROG_COUNT; p++) {
		progs s;
		flag_target t[2];
		size_t nt = targets_of(&s, p, t), k;
		for (int row = 0; row < FLAG_ROW_COUNT; row++) {
			const flag_place *pl = flags_place(training[p]->bit, t, nt, row, &k);
			if (!pl || !flag_rows[row].def)
				continue;
			flags_default_text(pl, t[k].base, text, sizeof(text));
			cr_assert_str_eq(text, flag_rows[row].def, "%s %s starts from %s",
					 training[p]->name, flag_rows[row].flag, text);
		}
	}
}

Test(flags, no_program_takes_one_flag_from_two_rows)
{
	for (int p = 0; p < FLAG_PROG_COUNT; p++) {
		progs s;
		flag_target t[2];
		size_t nt = targets_of(&s, p, t);
		for (int a = 0; a < FLAG_ROW_COUNT; a++)
			for (int b = a + 1; b < FLAG_ROW_COUNT; b++)
				cr_assert(!flag_rows[a].flag || !flag_rows[b].flag ||
						  strcmp(flag_rows[a].flag, flag_rows[b].flag) ||
						  !flags_place(training[p]->bit, t, nt, a, NULL) ||
						  !flags_place(training[p]->bit, t, nt, b, NULL),
					  "%s takes %s twice", training[p]->name, flag_rows[a].flag);
	}
}

/* The value reaches the program's struct, through an offset or a setter. */
Test(flags, values_land_in_their_fields)
{
	progs s;
	flag_target t[2];
	size_t nt = targets_of(&s, 3, t); /* gpt_ddp: two structs */
	char msg[256];

	cr_assert_eq(flags_set(FLAG_PROG_GPT_DDP, t, nt, "precision", "fp8", msg, sizeof(msg)), 0);
	cr_assert(s.ta[3].fp8 && s.ta[3].half == LOOM_BF16);
	cr_assert_eq(flags_set(FLAG_PROG_GPT_DDP, t, nt, "layers", "7", msg, sizeof(msg)), 0);
	cr_assert_eq(s.gc.layers, 7);
	cr_assert_eq(flags_set(FLAG_PROG_GPT_DDP, t, nt, "max-steps", "2147483647", msg,
			       sizeof(msg)), 0);
	cr_assert_eq(s.ta[3].max_steps, 2147483647);
	cr_assert_eq(flags_set(FLAG_PROG_GPT_DDP, t, nt, "opt-level", "o2", msg, sizeof(msg)), 0);
	cr_assert_eq(s.ta[3].level, LOOM_O2);
	cr_assert_eq(flags_set(FLAG_PROG_GPT_DDP, t, nt, "peak-flops", "-1", msg, sizeof(msg)), -1);
	cr_assert_str_eq(msg, "--peak-flops expects a number >= 0, got '-1'");
	cr_assert_eq(flags_set(FLAG_PROG_GPT_DDP, t, nt, "depth", "18", msg, sizeof(msg)), -1);
	cr_assert_str_eq(msg, "unknown option '--depth'");
}
