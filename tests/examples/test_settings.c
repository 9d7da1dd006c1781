/*
 * tests/examples/test_settings.c — the start-up settings check of
 * examples/train.c against the flags' rows (base/options.def): every flag
 * train_args holds is either compared across ranks (train_settings) or
 * free to differ (its row's agree is 0), and each compared flag, changed alone,
 * changes exactly its own setting, named by the flag. The cases come from
 * the two tables, so a flag added to the parser is tested here at once.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "examples/flags.h"
#include "examples/train.h"

/* A flag whose row in base/options.def lets ranks differ (agree 0). */
static int is_free(const char *flag)
{
	train_args a;
	flag_target t = train_target(&a);
	int row = flags_row(~0u, &t, 1, flag);

	cr_assert_geq(row, 0, "--%s is no row of base/options.def", flag);
	return !flag_rows[row].agree;
}

/* The settings list's entry named name, or -1. */
static int find(const loom_comm_setting *s, size_t n, const char *name)
{
	for (size_t i = 0; i < n; i++)
		if (!strcmp(s[i].name, name))
			return (int)i;
	return -1;
}

/* Values tried in turn until one parses and changes the flag's setting;
 * NULL: the flag takes no value. */
static const char *const tries[] = { "2", "3", "34", "0.5", "O2", "bf16", "cuda", "adamw",
				     "cosine", "gpipe", "memory", "true", "false", "off", "1", "x,y",
				     "delayed" };

/* Each compared flag, set alone on top of cifar_ddp's defaults (every group
 * but the benchmark's), differs from the defaults in its own setting and
 * no other: the check would refuse it naming the flag. */
Test(settings, every_compared_flag_changed_alone_is_named)
{
	const train_program *prog = &train_cifar_ddp;
	loom_comm_setting base[TRAIN_SETTINGS_MAX], s[TRAIN_SETTINGS_MAX];
	size_t nb = train_settings(prog, &prog->defaults, base), compared = 0;
	cr_assert_leq(nb, TRAIN_SETTINGS_MAX);
	for (size_t f = 0; train_flag_name(f); f++) {
		const char *flag = train_flag_name(f);
		char name[64], msg[256], why[512] = "";
		snprintf(name, sizeof(name), "--%s", flag);
		if (is_free(flag)) {
			cr_assert_eq(find(base, nb, name), -1, "%s is free to differ and compared", name);
			continue;
		}
		int at = find(base, nb, name);
		cr_assert_geq(at, 0, "%s is neither compared across ranks (train_settings) nor "
			      "free to differ (agree 0 in base/options.def)", name);
		int named = 0;
		for (size_t k = 0; k < sizeof(tries) / sizeof(tries[0]) && !named; k++) {
			train_args a = prog->defaults;
			if (train_set_value(prog, flag, tries[k], &a, msg, sizeof(msg))) {
				snprintf(why + strlen(why), sizeof(why) - strlen(why), " '%s': %s;",
					 tries[k], msg);
				continue;
			}
			size_t n = train_settings(prog, &a, s);
			cr_assert_eq(n, nb, "%s %s: %zu settings, %zu with the defaults", name,
				     tries[k], n, nb);
			int differ = 0, first = -1;
			for (size_t i = 0; i < n; i++) {
				cr_assert_str_eq(s[i].name, base[i].name);
				if (strcmp(s[i].value, base[i].value)) {
					differ++;
					first = first < 0 ? (int)i : first;
				}
			}
			if (!differ)
				continue; /* the default's value: try the next */
			cr_assert_eq(differ, 1, "%s %s changes %d settings", name, tries[k], differ);
			cr_assert_str_eq(s[first].name, name, "%s %s is compared as '%s'", name,
					 tries[k], s[first].name);
			named = 1;
		}
		cr_assert(named, "%s: no value tried changed its setting (%s): add one to tries[]",
			  name, why);
		compared++;
	}
	/* And the other way: every setting is a flag of the table, but two. */
	for (size_t i = 0; i < nb; i++) {
		int flag = 0;
		for (size_t f = 0; train_flag_name(f); f++)
			flag |= !strcmp(base[i].name + 2, train_flag_name(f)) &&
				!strncmp(base[i].name, "--", 2);
		cr_assert(flag || !strcmp(base[i].name, "program") ||
				  !strcmp(base[i].name, "decay on matrices only"),
			  "setting '%s' is no flag of train_args.c", base[i].name);
	}
	cr_assert_eq(compared + 2, nb, "%zu flags compared, %zu settings", compared, nb);
}

/* The two the mutation run found untested, by name. */
Test(settings, micro_batches_and_lr_schedule_are_compared)
{
	loom_comm_setting s[TRAIN_SETTINGS_MAX];
	size_t n = train_settings(&train_cifar_ddp, &train_cifar_ddp.defaults, s);
	cr_assert_geq(find(s, n, "--micro-batches"), 0);
	cr_assert_geq(find(s, n, "--lr-schedule"), 0);
}
