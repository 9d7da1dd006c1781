/*
 * tests/engine/print_text.c — print_text.h's capture (a function of its own
 * file: inlined, gcc takes open_memstream's buffer for a dangling local).
 */
#include <criterion/criterion.h>
#include <stdio.h>

#include "tests/engine/print_text.h"

char *print_text(void (*print)(const loom_program *, FILE *), const loom_program *p)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	cr_assert_not_null(f);
	print(p, f);
	fclose(f);
	return buf;
}
