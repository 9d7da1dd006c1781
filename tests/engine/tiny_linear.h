/*
 * tests/engine/tiny_linear.h — the smallest trained program the engine's
 * tests ask things of: x [5, 4] -> linear "fc" 4->3 -> cross-entropy
 * against y [5], compiled on the CPU (fc.weight is value 2).
 */
#ifndef LOOM_TESTS_ENGINE_TINY_LINEAR_H
#define LOOM_TESTS_ENGINE_TINY_LINEAR_H

#include "loom.h"

/* Compiled at AMP level `level`; a failure fails the calling test. */
loom_program *tiny_linear_compile(loom_opt_level level);

#endif /* LOOM_TESTS_ENGINE_TINY_LINEAR_H */
