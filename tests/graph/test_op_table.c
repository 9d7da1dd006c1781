/*
 * tests/graph/test_op_table.c — walks every op (0..LOOM_OP_COUNT) through
 * a table of columns, each a thing an op of some kind must have: a name, a
 * shape rule if users build it, a gradient rule if it is differentiated
 * (and an explicit none if not), a gradient check. A new column (a CPU
 * kernel, a CUDA kernel or a documented refusal, a CUDA-vs-CPU case) is one
 * row in `columns`.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "graph/graph_internal.h"
#include "graph/ops/ops.h"
#include "tests/graph/gradcheck_cases.h"

/* ------------------------------------------------ which ops need a column */

static int every_op(const loom_op_def *d)
{
	(void)d;
	return 1;
}

/* Users build it through include/loom.h: the builder runs its shape rule. */
static int user_built(const loom_op_def *d)
{
	return d->kind == LOOM_OPK_LEAF || d->kind == LOOM_OPK_FORWARD;
}

/* Autodiff asks it for a gradient. */
static int differentiated(const loom_op_def *d)
{
	return d->kind == LOOM_OPK_FORWARD || d->kind == LOOM_OPK_PASS;
}

static int not_differentiated(const loom_op_def *d)
{
	return !differentiated(d);
}

/* --------------------------------------------------- what an op must have */

static int has_name(const loom_op_def *d, int op)
{
	(void)op;
	return d->name && d->name[0];
}

static int has_shape_rule(const loom_op_def *d, int op)
{
	(void)op;
	return d->shape != NULL;
}

static int has_grad_rule(const loom_op_def *d, int op)
{
	(void)op;
	return d->grad != NULL;
}

/* Leaves and backward ops state by their kind that they take no gradient;
 * a rule there would never run, so it is a mistake. */
static int has_no_grad_rule(const loom_op_def *d, int op)
{
	(void)op;
	return d->grad == NULL;
}

static int has_gradcheck(const loom_op_def *d, int op)
{
	(void)d;
	int n = 0;
#define COUNT_CASE(case_op, name) n += (case_op) == op;
	LOOM_GRADCHECK_CASES(COUNT_CASE)
#undef COUNT_CASE
#define COUNT_UNARY(NAME, low) n += LOOM_OP_##NAME == op;
	LOOM_UNARY_OPS(COUNT_UNARY)
#undef COUNT_UNARY
	return n > 0;
}

/* The attribute member is one of loom_attrs' (the engine reads it). */
static int has_known_attrs(const loom_op_def *d, int op)
{
	(void)op;
	return d->attrs >= LOOM_ATTRS_NONE && d->attrs <= LOOM_ATTRS_FP8;
}

/* Source sets name real sources only. */
static int has_sane_source_sets(const loom_op_def *d, int op)
{
	(void)op;
	unsigned all = (1u << LOOM_MAX_SRC) - 1;
	return !(d->nondiff & ~all) && !(d->amp.keep & ~all);
}

typedef struct op_column {
	const char *what;                           /* "op conv2d has no <what>" */
	int (*applies)(const loom_op_def *d);       /* which ops it concerns */
	int (*has)(const loom_op_def *d, int op);   /* op is fine in it */
} op_column;

/* Every row names its AMP class: a missing .amp would silently follow its
 * inputs into half under O1, where apex keeps e.g. a normalisation fp32. */
static int has_amp_class(const loom_op_def *d, int op)
{
	(void)op;
	return d->amp.cls != LOOM_AMP_UNSET;
}

/* A recomputation level (graph/recompute.c makes the output again from the
 * op's sources) only on a differentiated forward op, and within the
 * levels loom_compile_opts.recompute takes (1-3). */
static int has_sane_recompute(const loom_op_def *d, int op)
{
	(void)op;
	if (d->recompute == 0)
		return 1;
	return d->kind == LOOM_OPK_FORWARD && d->grad && d->recompute >= 1 && d->recompute <= 3;
}

static const op_column columns[] = {
	{ "name", every_op, has_name },
	{ "shape rule (users build it)", user_built, has_shape_rule },
	{ "gradient rule (autodiff differentiates it)", differentiated, has_grad_rule },
	{ "explicit absence of a gradient rule (it is a leaf or a backward op)",
	  not_differentiated, has_no_grad_rule },
	{ "gradient check in tests/graph/gradcheck_cases.h", differentiated, has_gradcheck },
	{ "known attribute member", every_op, has_known_attrs },
	{ "source sets (nondiff, amp.keep) within LOOM_MAX_SRC", every_op,
	  has_sane_source_sets },
	{ "AMP class (.amp.cls: FOLLOW, ALLOW, DENY or FP32)", every_op, has_amp_class },
	{ "recomputation level 0, or 1-3 on a differentiated forward op", every_op,
	  has_sane_recompute },
};

#define NCOLUMNS ((int)(sizeof(columns) / sizeof(columns[0])))

/* What d (standing for op) lacks, as a message; returns how many columns. */
static int lacks(const loom_op_def *d, int op, char *msg, size_t len)
{
	int missing = 0;
	size_t o = 0;
	msg[0] = 0;
	for (int c = 0; c < NCOLUMNS; c++) {
		if (!columns[c].applies(d) || columns[c].has(d, op))
			continue;
		missing++;
		if (o < len)
			o += snprintf(msg + o, len - o, "%s%s", missing > 1 ? "; " : "",
				      columns[c].what);
	}
	return missing;
}

Test(op_table, every_op_has_what_its_kind_needs)
{
	char msg[1024];
	int bad = 0;
	for (int op = 0; op < LOOM_OP_COUNT; op++) {
		const loom_op_def *d = loom_op_defs[op];
		if (!d) {
			cr_log_error("op %d has no row in graph/ops/ops.c", op);
			bad++;
			continue;
		}
		if (lacks(d, op, msg, sizeof(msg))) {
			cr_log_error("op %d (%s) lacks: %s", op, d->name ? d->name : "?", msg);
			bad++;
		}
	}
	cr_assert_eq(bad, 0, "%d ops are incomplete (see the log above)", bad);
}

Test(op_table, names_are_unique)
{
	for (int a = 0; a < LOOM_OP_COUNT; a++)
		for (int b = a + 1; b < LOOM_OP_COUNT; b++)
			cr_assert_str_neq(loom_op_defs[a]->name, loom_op_defs[b]->name,
					  "ops %d and %d are both '%s'", a, b, loom_op_defs[a]->name);
}

/* The walker fails on an op that has nothing: a forward op with no rules,
 * no name and no gradient check (no case names op -1). */
Test(op_table, walker_catches_an_empty_op)
{
	char msg[1024];
	const loom_op_def empty = { .kind = LOOM_OPK_FORWARD };
	cr_assert_eq(lacks(&empty, -1, msg, sizeof(msg)), 5, "%s", msg);
	cr_assert(strstr(msg, "shape rule") && strstr(msg, "gradient check") &&
		  strstr(msg, "AMP class"), "%s", msg);
	const loom_op_def bwd_with_grad = { .name = "x", .kind = LOOM_OPK_BACKWARD,
					    .grad = loom_op_defs[LOOM_OP_RELU]->grad,
					    .amp = { .cls = LOOM_AMP_FOLLOW } };
	cr_assert_eq(lacks(&bwd_with_grad, -1, msg, sizeof(msg)), 1, "%s", msg);
}

/* The queries other code asks of the table agree with it. */
Test(op_table, leaf_and_view_queries)
{
	int leaves = 0, views = 0;
	for (int op = 0; op < LOOM_OP_COUNT; op++) {
		leaves += loom_op_is_leaf((loom_op)op);
		views += loom_op_is_view((loom_op)op);
	}
	cr_assert_eq(leaves, 3, "input, param, buffer");
	cr_assert(loom_op_is_leaf(LOOM_OP_PARAM) && loom_op_is_leaf(LOOM_OP_INPUT) &&
		  loom_op_is_leaf(LOOM_OP_BUFFER));
	cr_assert_eq(views, 1);
	cr_assert(loom_op_is_view(LOOM_OP_RESHAPE));
}
