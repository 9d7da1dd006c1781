/*
 * graph/rowpad.h — the padded vocabulary's plan part: which values of a
 * compiled graph a vocabulary padded to a multiple (llm.c's 50257 ->
 * 50304) lays out with padded rows or columns, so that the classifier's
 * three products run at aligned shapes. The decision: engine/vocab_pad.c
 * (loom_compile_opts.vocab_pad) acts on it (graph/README.md says how).
 */
#ifndef LOOM_GRAPH_ROWPAD_H
#define LOOM_GRAPH_ROWPAD_H

#include <stdint.h>

#include "graph/graph_internal.h"

enum {
	LOOM_ROWPAD_NONE = 0,
	/* [..., V]: each row stored with the padded pitch, the padding
	 * columns zero in the logits and dlogits, excluded from the loss */
	LOOM_ROWPAD_COLS = 1,
	/* [V, ...]: padded rows appended (zero): the classifier's weight, its
	 * half copies, its gradients and their sum */
	LOOM_ROWPAD_ROWS = 2,
};

/*
 * Finds the classifier of g: a SOFTMAX_CE whose logits (through reshapes
 * and casts) a LINEAR makes from a leaf weight [V, C] (through casts),
 * with V not a multiple of `multiple` (> 0). Sets mark[v] (g->n entries,
 * cleared first) for every value that takes the padded layout, *padded
 * to V rounded up; returns V, or 0 when there is none to pad (then no
 * mark is set), -1 when multiple is not positive.
 */
int64_t loom_rowpad_find(const loom_graph *g, int64_t multiple, unsigned char *mark,
			 int64_t *padded);

#endif
