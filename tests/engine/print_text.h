/*
 * tests/engine/print_text.h — what one of loom's printers
 * (loom_program_dump, loom_program_memory_report, loom_amp_report) writes
 * of a program, in a string the caller frees: the tests' one capture of
 * a printer's text.
 */
#ifndef LOOM_TESTS_ENGINE_PRINT_TEXT_H
#define LOOM_TESTS_ENGINE_PRINT_TEXT_H

#include <stdio.h>

#include "loom.h"

char *print_text(void (*print)(const loom_program *, FILE *), const loom_program *p);

#endif /* LOOM_TESTS_ENGINE_PRINT_TEXT_H */
