/*
 * tests/fuzz/fuzz_options.c — libFuzzer target for the options table's
 * reader of outside text (base/options.c): every environment override goes
 * through loom_opt_parse against its row (type, choices, range), and the
 * typed readers take the same text from the environment.
 *
 * Input: byte 0 picks the row (modulo the table's size), the rest is the
 * value, NUL-terminated by the harness. The parse must refuse with a message
 * naming the row or accept; an accepted value read through the row's typed
 * reader from the environment must read back as accepted.
 */
#include "fuzz_common.h"

#include <stdint.h>
#include <string.h>

#include "base/options.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
	char text[512], err[512];

	if (n < 1)
		return 0;
	loom_opt id = (loom_opt)(data[0] % LOOM_OPT_COUNT);
	size_t len = n - 1 < sizeof(text) - 1 ? n - 1 : sizeof(text) - 1;
	memcpy(text, data + 1, len);
	text[len] = '\0';
	const loom_opt_row *r = loom_opt_row_get(id);
	err[0] = '\0';
	loom_status st = loom_opt_parse(id, text, err, sizeof(err));
	FUZZ_CHECK(st == LOOM_OK || st == LOOM_ERR_INVALID);
	FUZZ_CHECK(st == LOOM_OK || err[0] != '\0');
	if (st != LOOM_OK || !r->env || strlen(text) != len)
		return 0;
	/* Accepted: the environment's readers agree. */
	FUZZ_CHECK(setenv(r->env, text, 1) == 0);
	long l;
	double d;
	if (r->type == LOOM_OPT_INT)
		FUZZ_CHECK(loom_opt_int(id, &l) == 1 && l >= r->lo && l <= r->hi);
	if (r->type == LOOM_OPT_REAL)
		FUZZ_CHECK(loom_opt_real(id, &d) == 1 && d >= r->lo && d <= r->hi);
	if (r->type == LOOM_OPT_CHOICE)
		FUZZ_CHECK(loom_opt_choice(id) >= 0);
	FUZZ_CHECK(loom_opt_check(id, err, sizeof(err)) == LOOM_OK);
	unsetenv(r->env);
	return 0;
}
