/*
 * tests/graph/test_memplan.c — the memory plan of a compiled ConvNet (batch
 * 100, 28x28), checked against lifetimes recomputed here from the graph: no
 * two activations alive at once share a byte, everything fits its region,
 * persistent values never overlap, reshapes alias their source, reuse beats
 * one buffer per value, and loom_program_info_get agrees with the plan.
 * Then in-place ops (LOOM_OPF_INPLACE): softmax-CE's backward takes over its
 * dying logits, so a GPT's large-vocabulary loss holds one [B*T, V] buffer.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/program_internal.h"
#include "graph/graph_internal.h"
#include "graph/memplan.h"
#include "graph/ops/ops.h"
#include "loom.h"
#include "tests/graph/nets.h"

typedef struct span {
	loom_value v;
	int def, last; /* the nodes that write it and last read it (or an alias) */
	size_t off, size;
} span;

static size_t value_bytes(const loom_graph *g, loom_value v)
{
	return (size_t)loom_shape_numel(&g->nodes[v].shape) * loom_dtype_size(g->nodes[v].dtype);
}

/* Our own idea of which value owns v's storage: reshapes are views. */
static loom_value owner(const loom_graph *g, loom_value v)
{
	while (g->nodes[v].op == LOOM_OP_RESHAPE)
		v = g->nodes[v].src[0];
	return v;
}

static int persistent_kind(const loom_node *n)
{
	return n->op == LOOM_OP_INPUT || n->op == LOOM_OP_PARAM || n->op == LOOM_OP_BUFFER ||
	       (n->flags & (LOOM_NODE_OUTPUT | LOOM_NODE_GRAD));
}

/* Lifetimes of every storage owner in region `region`, from the graph alone. */
static span *spans_of(const loom_graph *g, const loom_memplan *mp, int region, int *count)
{
	int n = g->n;
	int *last = malloc(sizeof(int) * n);
	for (int v = 0; v < n; v++)
		last[v] = v;
	for (int v = 0; v < n; v++)
		for (int i = 0; i < g->nodes[v].nsrc; i++) {
			loom_value o = owner(g, g->nodes[v].src[i]);
			if (last[o] < v)
				last[o] = v;
		}
	span *s = calloc(n, sizeof(*s));
	int k = 0;
	for (int v = 0; v < n; v++) {
		if (owner(g, v) != v || mp->region[v] != region)
			continue;
		/* A sibling (graph/fuse.c) is written when its maker runs. */
		int def = g->nodes[v].made_by != LOOM_NONE ? g->nodes[v].made_by : v;
		s[k++] = (span){ v, def, last[v], mp->offset[v], value_bytes(g, v) };
	}
	free(last);
	*count = k;
	return s;
}

static int overlap(size_t a, size_t an, size_t b, size_t bn)
{
	return an && bn && a < b + bn && b < a + an;
}

/* b is made in place over a (an op flagged LOOM_OPF_INPLACE whose src[0]
 * is a, or a view of a), at a's last read: the one overlap allowed. */
static int in_place_pair(const loom_graph *g, span a, span b)
{
	const loom_node *n = &g->nodes[b.v];
	return (loom_op_defs[n->op]->flags & LOOM_OPF_INPLACE) && n->nsrc > 0 &&
	       owner(g, n->src[0]) == a.v && a.last == b.def && b.def == b.v &&
	       a.off == b.off && a.size == b.size;
}

typedef struct fixture {
	loom_graph *g;
	loom_test_convnet m;
	loom_program *p;
} fixture;

static fixture convnet_at(loom_optim_opts *optim, loom_opt_level level)
{
	fixture f;
	cr_assert_eq(loom_graph_new(&f.g), LOOM_OK);
	f.m = loom_test_convnet_build(f.g, LOOM_F32, 100, 28, 16, 32, 10);
	cr_assert_eq(loom_graph_status(f.g), LOOM_OK, "%s", loom_graph_error(f.g));
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	if (optim)
		o.optim = *optim;
	o.amp.level = level;
	cr_assert_eq(loom_compile(f.g, f.m.loss, &o, &f.p), LOOM_OK, "%s", loom_last_error());
	return f;
}

static fixture convnet(loom_optim_opts *optim)
{
	return convnet_at(optim, LOOM_O0);
}

static void fixture_free(fixture *f)
{
	loom_program_free(f->p);
	loom_graph_free(f->g);
}

static void expect_no_live_overlap(fixture f)
{
	const loom_graph *g = f.p->plan.g;
	int n;
	span *s = spans_of(g, &f.p->plan.mp, LOOM_REGION_ACT, &n);
	cr_assert_geq(n, 15, "only %d activations: is this the ConvNet?", n);
	int reused = 0;
	for (int i = 0; i < n; i++)
		for (int j = i + 1; j < n; j++) {
			int live = s[i].def <= s[j].last && s[j].def <= s[i].last;
			int shared = overlap(s[i].off, s[i].size, s[j].off, s[j].size);
			/* Written in place over a source read for the last time by
			 * the writer: what the plan allows, checked here on its own. */
			if (in_place_pair(g, s[i], s[j]) || in_place_pair(g, s[j], s[i]))
				live = 0;
			cr_assert(!(live && shared),
				  "values %d (%s, nodes %d..%d, bytes %zu+%zu) and %d (%s, nodes "
				  "%d..%d, bytes %zu+%zu) are alive together and overlap",
				  (int)s[i].v, loom_op_defs[g->nodes[s[i].v].op]->name, s[i].def,
				  s[i].last, s[i].off, s[i].size, (int)s[j].v,
				  loom_op_defs[g->nodes[s[j].v].op]->name, s[j].def, s[j].last, s[j].off,
				  s[j].size);
			reused += shared;
		}
	/* The plan is not trivially safe: some bytes do get reused. */
	cr_assert_gt(reused, 0);
	free(s);
	fixture_free(&f);
}

Test(memplan, live_activations_never_share_bytes)
{
	expect_no_live_overlap(convnet(NULL));
}

/* Under O1 the linear runs in half, so its bias gradient (a sibling of the
 * weight gradient, made by the same cuBLASLt call) is a half activation cast
 * to the fp32 gradient later: it must be placed from its maker on. */
Test(memplan, siblings_are_placed_from_their_maker_on)
{
	fixture f = convnet_at(NULL, LOOM_O1);
	const loom_graph *g = f.p->plan.g;
	int act_siblings = 0;
	for (int v = 0; v < g->n; v++)
		if (g->nodes[v].made_by != LOOM_NONE && f.p->plan.mp.region[v] == LOOM_REGION_ACT)
			act_siblings++;
	cr_assert_geq(act_siblings, 1, "no sibling lives in the activation region under O1");
	expect_no_live_overlap(f);
}

Test(memplan, everything_fits_its_region)
{
	fixture f = convnet(NULL);
	const loom_graph *g = f.p->plan.g;
	const loom_memplan *mp = &f.p->plan.mp;
	for (int v = 0; v < g->n; v++) {
		size_t end = mp->offset[v] + value_bytes(g, v);
		size_t cap = mp->region[v] == LOOM_REGION_PERSIST ? mp->persist_bytes : mp->act_bytes;
		cr_assert(mp->region[v] == LOOM_REGION_PERSIST || mp->region[v] == LOOM_REGION_ACT);
		cr_assert_leq(end, cap, "value %d (%s) ends at %zu, its region holds %zu", v,
			      loom_op_defs[g->nodes[v].op]->name, end, cap);
		cr_assert_eq(mp->offset[v] % 64, 0, "value %d is not 64-byte aligned", v);
	}
	fixture_free(&f);
}

Test(memplan, persistent_values_never_overlap)
{
	fixture f = convnet(NULL);
	const loom_graph *g = f.p->plan.g;
	int n;
	span *s = spans_of(g, &f.p->plan.mp, LOOM_REGION_PERSIST, &n);
	for (int i = 0; i < n; i++)
		for (int j = i + 1; j < n; j++)
			cr_assert(!overlap(s[i].off, s[i].size, s[j].off, s[j].size),
				  "persistent values %d and %d overlap", (int)s[i].v, (int)s[j].v);
	/* And every value the user or the optimizer reads after a step is in it. */
	int npersist = 0;
	for (int v = 0; v < g->n; v++)
		if (persistent_kind(&g->nodes[v])) {
			npersist++;
			cr_assert_eq(f.p->plan.mp.region[v], LOOM_REGION_PERSIST, "value %d (%s) is not kept",
				     v, loom_op_defs[g->nodes[v].op]->name);
		}
	/* image, labels, 10 params, 4 buffers, 10 gradients, the loss. */
	cr_assert_geq(npersist, 26);
	free(s);
	fixture_free(&f);
}

Test(memplan, reshape_aliases_its_source)
{
	fixture f = convnet(NULL);
	const loom_graph *g = f.p->plan.g;
	const loom_memplan *mp = &f.p->plan.mp;
	int nreshape = 0;
	for (int v = 0; v < g->n; v++) {
		if (g->nodes[v].op != LOOM_OP_RESHAPE)
			continue;
		nreshape++;
		loom_value src = g->nodes[v].src[0];
		cr_assert_eq(mp->root[v], mp->root[src]);
		cr_assert_eq(mp->root[v], owner(g, v));
		cr_assert_eq(mp->region[v], mp->region[src]);
		cr_assert_eq(mp->offset[v], mp->offset[src]);
		cr_assert_eq(loom_value_ptr(f.p, v), loom_value_ptr(f.p, src));
	}
	/* flatten forward and its gradient backward, plus the views the
	 * relu/pool fusion leaves: each block's relu and relu backward */
	cr_assert_eq(nreshape, 6);
	cr_assert_eq(mp->offset[f.m.flat], mp->offset[f.m.pool2]);
	fixture_free(&f);
}

/* A control: the pairwise check catches a plan that puts two live values
 * on the same bytes (conv1's output moved onto its batch norm's output). */
Test(memplan, overlap_check_catches_a_bad_plan)
{
	fixture f = convnet(NULL);
	loom_memplan *mp = &f.p->plan.mp;
	loom_value bn1 = LOOM_NONE;
	for (int v = f.m.conv1 + 1; v < f.p->plan.n_fwd && bn1 == LOOM_NONE; v++)
		if (f.p->plan.g->nodes[v].op == LOOM_OP_BATCHNORM2D)
			bn1 = v;
	cr_assert_neq(bn1, LOOM_NONE);
	cr_assert_eq(mp->region[f.m.conv1], LOOM_REGION_ACT);
	mp->offset[f.m.conv1] = mp->offset[bn1];
	int n, conflicts = 0;
	span *s = spans_of(f.p->plan.g, mp, LOOM_REGION_ACT, &n);
	for (int i = 0; i < n; i++)
		for (int j = i + 1; j < n; j++)
			conflicts += s[i].def <= s[j].last && s[j].def <= s[i].last &&
				     overlap(s[i].off, s[i].size, s[j].off, s[j].size);
	cr_assert_gt(conflicts, 0);
	free(s);
	fixture_free(&f);
}

Test(memplan, reuse_beats_the_naive_plan)
{
	fixture f = convnet(NULL);
	const loom_graph *g = f.p->plan.g;
	const loom_memplan *mp = &f.p->plan.mp;
	size_t naive = 0, biggest = 0;
	for (int v = 0; v < g->n; v++)
		if (mp->root[v] == v && mp->region[v] == LOOM_REGION_ACT) {
			size_t b = (value_bytes(g, v) + 63) & ~(size_t)63;
			naive += b;
			if (b > biggest)
				biggest = b;
		}
	cr_assert_eq(mp->act_naive_bytes, naive);
	cr_assert_lt(mp->act_bytes, mp->act_naive_bytes, "planned %zu, naive %zu", mp->act_bytes,
		     mp->act_naive_bytes);
	/* conv1's output (100x16x28x28 f32, 5 MB) and its BN output are alive
	 * together, so at least two of the biggest activations coexist. */
	cr_assert_geq(mp->act_bytes, 2 * biggest);
	/* Reuse is real, not a rounding effect: at most two thirds of naive. */
	cr_assert_lt(mp->act_bytes * 3, mp->act_naive_bytes * 2, "planned %zu of naive %zu",
		     mp->act_bytes, mp->act_naive_bytes);
	fixture_free(&f);
}

Test(memplan, program_info_is_consistent)
{
	loom_optim_opts sgd = { .kind = LOOM_OPTIM_SGD, .lr = 0.1, .momentum = 0.9 };
	fixture f = convnet(&sgd);
	loom_program_info info;
	loom_program_info_get(f.p, &info);
	const loom_memplan *mp = &f.p->plan.mp;
	cr_assert_str_eq(info.backend, "cpu");
	cr_assert_eq(info.n_nodes, f.p->plan.g->n);
	cr_assert_eq(info.n_params, 10);
	int64_t elems = 16 * 9 + 16 + 16 + 16 + 32 * 16 * 9 + 32 + 32 + 32 + 10 * 32 * 49 + 10;
	cr_assert_eq(info.n_param_elems, elems);
	cr_assert_eq(info.param_bytes, (size_t)elems * 4);
	cr_assert_eq(info.grad_bytes, (size_t)elems * 4);
	cr_assert_eq(info.master_bytes, 0);
	/* One momentum buffer per parameter, each rounded up to 64 bytes. */
	size_t state = 0;
	for (int i = 0; i < f.p->plan.n_params; i++)
		state += ((size_t)f.p->plan.params[i].numel * 4 + 63) & ~(size_t)63;
	cr_assert_eq(info.optim_state_bytes, state);
	cr_assert_eq(info.activation_bytes, mp->act_bytes);
	cr_assert_eq(info.activation_naive_bytes, mp->act_naive_bytes);
	cr_assert_lt(info.activation_bytes, info.activation_naive_bytes);
	cr_assert_eq(info.arena_bytes,
		     mp->persist_bytes + mp->act_bytes + f.p->plan.ws_bytes + f.p->plan.state_bytes);
	/* The persistent region holds at least params, gradients and the image. */
	cr_assert_geq(mp->persist_bytes, info.param_bytes + info.grad_bytes + 100 * 28 * 28 * 4);
	cr_assert_float_eq(info.loss_scale, 1.0, 0);
	cr_assert_eq(info.skipped_steps, 0);
	fixture_free(&f);

	/* Without momentum there is no optimizer state. */
	loom_optim_opts plain = { .kind = LOOM_OPTIM_SGD, .lr = 0.1 };
	f = convnet(&plain);
	loom_program_info_get(f.p, &info);
	cr_assert_eq(info.optim_state_bytes, 0);
	fixture_free(&f);
}

/* The plan is exercised, not just inspected: a step on the planned arena
 * gives bit for bit the loss and gradients of a program whose forward
 * activations are all marked as outputs, so none of them shares bytes. */
Test(memplan, reuse_does_not_change_results, .timeout = 120)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_test_convnet m = loom_test_convnet_build(g, LOOM_F32, 8, 28, 4, 8, 10);
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.optim.kind = LOOM_OPTIM_NONE;
	loom_program *planned, *flat;
	cr_assert_eq(loom_compile(g, m.loss, &o, &planned), LOOM_OK, "%s", loom_last_error());
	int nfwd = g->n;
	for (int v = 0; v < nfwd; v++)
		loom_mark_output(g, v);
	cr_assert_eq(loom_compile(g, m.loss, &o, &flat), LOOM_OK, "%s", loom_last_error());
	cr_assert_lt(planned->plan.mp.act_bytes, planned->plan.mp.act_naive_bytes);

	float img[8 * 28 * 28];
	int32_t lab[8];
	for (int i = 0; i < 8 * 28 * 28; i++)
		img[i] = (float)((i * 7919) % 101) / 101.0f;
	for (int i = 0; i < 8; i++)
		lab[i] = (i * 3) % 10;
	loom_value ws[3] = { m.conv1_w, m.conv2_w, m.fc_w };
	int64_t wn[3] = { 4 * 9, 8 * 4 * 9, 10 * 8 * 49 };
	double *buf = malloc(sizeof(double) * 4000), *buf2 = malloc(sizeof(double) * 4000);
	for (int k = 0; k < 3; k++) {
		for (int64_t i = 0; i < wn[k]; i++)
			buf[i] = 0.3 * sin(1.3 * i + k);
		loom_write_f64(planned, ws[k], buf, wn[k]);
		loom_write_f64(flat, ws[k], buf, wn[k]);
	}
	loom_program *ps[2] = { planned, flat };
	for (int k = 0; k < 2; k++) {
		cr_assert_eq(loom_set_input(ps[k], "image", img, LOOM_F32, 8 * 28 * 28), LOOM_OK);
		cr_assert_eq(loom_set_input(ps[k], "labels", lab, LOOM_I32, 8), LOOM_OK);
		cr_assert_eq(loom_run(ps[k], LOOM_RUN_GRAD), LOOM_OK, "%s", loom_program_error(ps[k]));
	}
	cr_assert_eq(loom_loss(planned), loom_loss(flat));
	loom_value all[10] = { m.conv1_w, m.conv1_b, m.bn1_g, m.bn1_b, m.conv2_w,
			       m.conv2_b, m.bn2_g, m.bn2_b, m.fc_w, m.fc_b };
	for (int k = 0; k < 10; k++) {
		loom_shape s = loom_value_shape(g, all[k]);
		size_t n = (size_t)loom_shape_numel(&s);
		cr_assert_eq(loom_read_grad_f64(planned, all[k], buf, n), LOOM_OK);
		cr_assert_eq(loom_read_grad_f64(flat, all[k], buf2, n), LOOM_OK);
		cr_assert_eq(memcmp(buf, buf2, n * sizeof(double)), 0, "gradient %d differs", k);
	}
	free(buf);
	free(buf2);
	loom_program_free(planned);
	loom_program_free(flat);
	loom_graph_free(g);
}

/* ---------------------------------------------- the planner on its own */

/* A chain of relus: each value dies at the next node, so two buffers (the
 * one being read, the one being written) are enough however long it is. */
Test(memplan, chain_needs_two_buffers)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	int64_t d[2] = { 16, 16 }; /* 1 KiB in f32 */
	loom_value x = loom_input(g, "x", LOOM_F32, 2, d);
	loom_value h = x;
	for (int i = 0; i < 10; i++)
		h = loom_relu(g, h);
	loom_value loss = loom_sum(g, h);
	(void)loss;
	loom_memplan mp;
	cr_assert_eq(loom_memplan_build(g, &mp), LOOM_OK);
	cr_assert_eq(mp.act_naive_bytes, 10 * 1024 + 64);
	cr_assert_leq(mp.act_bytes, 2 * 1024 + 64, "planned %zu", mp.act_bytes);
	/* A node's output never sits on its own input. */
	for (int v = 2; v <= 10; v++) {
		loom_value s = g->nodes[v].src[0];
		if (mp.region[s] == LOOM_REGION_ACT)
			cr_assert(!overlap(mp.offset[v], 1024, mp.offset[s], 1024),
				  "relu %d writes over its input %d", v, (int)s);
	}
	cr_assert_eq(mp.region[x], LOOM_REGION_PERSIST);
	loom_memplan_free(&mp);
	cr_assert_null(mp.offset);
	loom_graph_free(g);
}

/* A value with a late reader stays alive over everything in between. */
Test(memplan, late_reader_keeps_value_alive)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	int64_t d[1] = { 256 };
	loom_value x = loom_input(g, "x", LOOM_F32, 1, d);
	loom_value a = loom_relu(g, x); /* read again at the very end */
	loom_value h = a;
	for (int i = 0; i < 6; i++)
		h = loom_relu(g, h);
	loom_value y = loom_add(g, h, a);
	loom_memplan mp;
	cr_assert_eq(loom_memplan_build(g, &mp), LOOM_OK);
	for (int v = a + 1; v <= y; v++)
		cr_assert(!overlap(mp.offset[v], 1024, mp.offset[a], 1024),
			  "value %d reuses the bytes of %d, still needed at %d", v, (int)a, (int)y);
	loom_memplan_free(&mp);
	loom_graph_free(g);
}

/* An output marked by the user, or a reshape of it, is persistent. */
Test(memplan, marked_output_and_its_alias_are_kept)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	int64_t d[2] = { 4, 8 }, nd[1] = { 32 };
	loom_value x = loom_input(g, "x", LOOM_F32, 2, d);
	loom_value a = loom_relu(g, x);
	loom_value r = loom_reshape(g, a, 1, nd);
	loom_mark_output(g, r);
	loom_value b = loom_relu(g, loom_relu(g, r));
	(void)b;
	loom_memplan mp;
	cr_assert_eq(loom_memplan_build(g, &mp), LOOM_OK);
	cr_assert_eq(mp.region[a], LOOM_REGION_PERSIST, "the source of a kept view must be kept");
	cr_assert_eq(mp.region[r], LOOM_REGION_PERSIST);
	cr_assert_eq(mp.offset[r], mp.offset[a]);
	cr_assert_eq(mp.region[b], LOOM_REGION_ACT);
	loom_memplan_free(&mp);
	loom_graph_free(g);
}

/* A plan that holds part of the graph (a pipeline stage's): the values
 * outside the mask get no bytes, a view held holds its source, and what
 * is held is placed as in the whole plan's lifetimes (a value read late
 * by an unheld node still stays alive over the held ones in between). */
Test(memplan, held_mask_places_only_the_marked_values)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	int64_t d[1] = { 256 }, rd[2] = { 16, 16 };
	loom_value x = loom_input(g, "x", LOOM_F32, 1, d);
	loom_value a = loom_relu(g, x);
	loom_value b = loom_relu(g, a);
	loom_value c = loom_relu(g, b);
	loom_value r = loom_reshape(g, c, 2, rd);
	loom_value e = loom_relu(g, r);
	loom_value f = loom_add(g, loom_reshape(g, e, 1, d), a);
	(void)f;
	unsigned char *held = calloc((size_t)g->n, 1);
	held[a] = held[b] = held[r] = held[e] = 1; /* not x, not c itself, not f */
	loom_memplan whole, mp;
	cr_assert_eq(loom_memplan_build(g, &whole), LOOM_OK);
	cr_assert_eq(loom_memplan_build_held(g, NULL, NULL, held, &mp), LOOM_OK);
	cr_assert_not_null(mp.held);
	cr_assert(mp.held[c], "the view r is held: its source c must be");
	cr_assert(!mp.held[x] && !mp.held[f]);
	cr_assert_eq(mp.persist_bytes, 0, "x is not held: no persistent bytes");
	cr_assert_eq(mp.act_naive_bytes, 4 * 1024, "a, b, c, e: %zu", mp.act_naive_bytes);
	cr_assert_eq(whole.act_naive_bytes, 5 * 1024);
	cr_assert_leq(mp.act_bytes, whole.act_bytes);
	/* a (read by f at the end) stays alive over b, c and e */
	loom_value live[] = { b, c, e };
	for (int i = 0; i < 3; i++)
		cr_assert(!overlap(mp.offset[live[i]], 1024, mp.offset[a], 1024),
			  "value %d reuses the bytes of %d", (int)live[i], (int)a);
	cr_assert_eq(mp.offset[r], mp.offset[c]);
	loom_memplan_free(&mp);
	cr_assert_null(mp.held);
	loom_memplan_free(&whole);
	free(held);
	loom_graph_free(g);
}

/* ------------------------------------------- the schedule and the regions */

/* Without a pass that reorders, the schedule is node order, each node once,
 * and the region table agrees with the byte counts the engine reads. */
Test(memplan, schedule_is_node_order_and_regions_agree)
{
	fixture f = convnet(NULL);
	const loom_memplan *mp = &f.p->plan.mp;
	cr_assert_eq(mp->nschedule, f.p->plan.g->n);
	for (int i = 0; i < mp->nschedule; i++)
		cr_assert_eq(mp->schedule[i], i);
	cr_assert_eq(mp->regions[LOOM_REGION_ACT].bytes, mp->act_bytes);
	cr_assert_eq(mp->regions[LOOM_REGION_PERSIST].bytes, mp->persist_bytes);
	cr_assert(mp->regions[LOOM_REGION_ACT].reuse);
	cr_assert(!mp->regions[LOOM_REGION_PERSIST].reuse);
	for (int r = 0; r < LOOM_REGION_COUNT; r++)
		cr_assert_not_null(mp->regions[r].name, "region %d has no name", r);
	fixture_free(&f);
}

/* x -> a = relu(x), b = relu(x) (independent), y = add(a, b). Running b
 * before a is a valid order: the plan follows it (a is now written last, so
 * it must not share bytes with b, read at the same step). Running y before
 * a is not: refused. */
Test(memplan, ordered_plan_follows_the_schedule)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	int64_t d[1] = { 256 };
	loom_value x = loom_input(g, "x", LOOM_F32, 1, d);
	loom_value a = loom_relu(g, x);
	loom_value b = loom_relu(g, x);
	loom_value y = loom_add(g, a, b);
	loom_value c = loom_relu(g, y);
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));
	loom_memplan mp;
	loom_value good[5] = { x, b, a, y, c };
	cr_assert_eq(loom_memplan_build_ordered(g, good, &mp), LOOM_OK);
	for (int i = 0; i < 5; i++)
		cr_assert_eq(mp.schedule[i], good[i]);
	cr_assert(!overlap(mp.offset[a], 1024, mp.offset[b], 1024));
	cr_assert(!overlap(mp.offset[y], 1024, mp.offset[a], 1024));
	cr_assert(!overlap(mp.offset[y], 1024, mp.offset[b], 1024));
	loom_memplan_free(&mp);
	loom_value bad[5] = { x, b, y, a, c };
	cr_assert_eq(loom_memplan_build_ordered(g, bad, &mp), LOOM_ERR_INVALID);
	cr_assert_null(mp.schedule, "a refused plan is left empty");
	loom_value twice[5] = { x, a, a, y, c };
	cr_assert_eq(loom_memplan_build_ordered(g, twice, &mp), LOOM_ERR_INVALID);
	loom_graph_free(g);
}

/* ------------------------------------------------------ in-place values */

/* The ConvNet's loss backward writes dlogits over its logits (their last
 * read): same offset, the plan records it, nothing else shares them. */
Test(memplan, softmax_ce_backward_takes_over_its_logits)
{
	fixture f = convnet(NULL);
	const loom_graph *g = f.p->plan.g;
	const loom_memplan *mp = &f.p->plan.mp;
	int found = 0;
	for (int v = 0; v < g->n; v++) {
		if (g->nodes[v].op != LOOM_OP_SOFTMAX_CE_BWD)
			continue;
		found++;
		loom_value lg = owner(g, g->nodes[v].src[0]);
		cr_assert_eq(mp->inplace[v], lg, "dlogits %d took over %d, not the logits %d", v,
			     (int)mp->inplace[v], (int)lg);
		cr_assert_eq(mp->region[v], LOOM_REGION_ACT);
		cr_assert_eq(mp->offset[v], mp->offset[lg]);
		cr_assert_eq(mp->inplace[lg], LOOM_NONE);
	}
	cr_assert_eq(found, 1);
	/* Every other value is written on bytes of its own. */
	int inplace = 0;
	for (int v = 0; v < g->n; v++)
		inplace += mp->inplace[v] != LOOM_NONE;
	cr_assert_eq(inplace, 1);
	fixture_free(&f);
	/* And the pairwise check still holds with the one overlap allowed. */
	expect_no_live_overlap(convnet(NULL));
}

/* z = relu(x) -> softmax-CE -> its backward dz, appended by hand as
 * autodiff would; read_later adds a reader of z after the backward. */
static void ce_by_hand(int read_later)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	int64_t d[2] = { 4, 16 }, nd[1] = { 4 };
	loom_value x = loom_input(g, "x", LOOM_F32, 2, d);
	loom_value y = loom_input(g, "y", LOOM_I32, 1, nd);
	loom_value z = loom_relu(g, x);
	loom_value loss = loom_softmax_cross_entropy(g, z, y);
	loom_value src[3] = { z, y, loom_relu(g, loss) };
	loom_value dz = loom_grad_node(g, LOOM_OP_SOFTMAX_CE_BWD, z, 3, src);
	loom_value after = read_later ? loom_add(g, dz, z) : loom_relu(g, dz);
	(void)after;
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));
	loom_memplan mp;
	cr_assert_eq(loom_memplan_build(g, &mp), LOOM_OK);
	if (read_later) {
		cr_assert_eq(mp.inplace[dz], LOOM_NONE);
		cr_assert(!overlap(mp.offset[dz], 256, mp.offset[z], 256));
	} else {
		cr_assert_eq(mp.inplace[dz], z);
		cr_assert_eq(mp.offset[dz], mp.offset[z]);
	}
	loom_memplan_free(&mp);
	loom_graph_free(g);
}

/* A source read after the in-place op is not dying: the backward writes on
 * bytes of its own; without that reader it takes the source's. */
Test(memplan, a_source_read_later_is_not_taken_over)
{
	ce_by_hand(1);
	ce_by_hand(0);
}

/* dw = relu(x) standing in for the classifier's dW; s = dw + relu(x2)
 * marked as a sum made by adding into its last source (LOOM_NODE_ACCUM,
 * graph/fuse.c's loom_fuse_emb_bwd_accum) and as a parameter's gradient:
 * persistent, so dw is lent s's bytes where it dies at s (read_later: a
 * reader after s keeps dw apart). */
static void lent_by_hand(int read_later)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	int64_t d[2] = { 8, 16 };
	loom_value x = loom_input(g, "x", LOOM_F32, 2, d);
	loom_value x2 = loom_input(g, "x2", LOOM_F32, 2, d);
	loom_value dw = loom_relu(g, x);
	loom_value s = loom_add(g, loom_relu(g, x2), dw);
	g->nodes[s].flags |= LOOM_NODE_ACCUM | LOOM_NODE_GRAD;
	if (read_later)
		(void)loom_relu(g, dw);
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));
	loom_memplan mp;
	cr_assert_eq(loom_memplan_build(g, &mp), LOOM_OK);
	cr_assert_eq(mp.region[s], LOOM_REGION_PERSIST);
	if (read_later) {
		cr_assert_eq(mp.region[dw], LOOM_REGION_ACT);
		cr_assert_eq(mp.inplace[s], LOOM_NONE);
	} else {
		cr_assert_eq(mp.region[dw], LOOM_REGION_PERSIST, "dw is not in the gradient's region");
		cr_assert_eq(mp.offset[dw], mp.offset[s]);
		cr_assert_eq(mp.inplace[s], dw);
		/* only s's bytes: dw takes no persistent bytes of its own */
		cr_assert_eq(mp.persist_bytes, 8 * 16 * sizeof(float) * 3, "%zu persistent bytes",
			     mp.persist_bytes);
	}
	loom_memplan_free(&mp);
	loom_graph_free(g);
}

Test(memplan, a_persistent_sum_lends_its_dying_addend_its_bytes)
{
	lent_by_hand(0);
	lent_by_hand(1);
}

/* h = gelu(x); d = relu(x2) standing in for the product that makes the
 * GELU backward's dy; dh = gelu_bwd(x, d), appended by hand as autodiff
 * would. The backward writes over its dying dy (LOOM_OPF_INPLACE_DY),
 * never over x (read later here, by h's reader); with LOOM_INPLACE_DY=0,
 * or with dy read later, on bytes of its own. */
static void gelu_bwd_by_hand(int dy_off, int read_dy_later)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	int64_t d[2] = { 4, 64 };
	loom_value x = loom_input(g, "x", LOOM_F32, 2, d);
	loom_value x2 = loom_input(g, "x2", LOOM_F32, 2, d);
	loom_value pre = loom_relu(g, x);
	loom_value dy = loom_relu(g, x2);
	loom_value src[2] = { pre, dy };
	loom_value dh = loom_grad_node(g, LOOM_OP_GELU_BWD, pre, 2, src);
	g->nodes[dh].a.ew.tanh = 1;
	loom_value after = loom_add(g, dh, pre);
	if (read_dy_later)
		after = loom_add(g, after, dy);
	(void)after;
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));
	loom_memplan mp;
	if (dy_off)
		setenv("LOOM_INPLACE_DY", "0", 1);
	loom_status st = loom_memplan_build(g, &mp);
	unsetenv("LOOM_INPLACE_DY");
	cr_assert_eq(st, LOOM_OK);
	cr_assert(!overlap(mp.offset[dh], 1024, mp.offset[pre], 1024), "never over x");
	if (dy_off || read_dy_later) {
		cr_assert_eq(mp.inplace[dh], LOOM_NONE, "dy_off %d, dy read later %d", dy_off,
			     read_dy_later);
		cr_assert(!overlap(mp.offset[dh], 1024, mp.offset[dy], 1024));
	} else {
		cr_assert_eq(mp.inplace[dh], dy, "the GELU backward took %d, not its dy %d",
			     (int)mp.inplace[dh], (int)dy);
		cr_assert_eq(mp.offset[dh], mp.offset[dy]);
	}
	loom_memplan_free(&mp);
	loom_graph_free(g);
}

/* A unary backward takes over its dying dy (src[1]), never its x; not
 * when dy is read later or under LOOM_INPLACE_DY=0. */
Test(memplan, unary_backward_takes_over_its_dy)
{
	gelu_bwd_by_hand(0, 0);
	gelu_bwd_by_hand(0, 1);
	gelu_bwd_by_hand(1, 0);
}

/* The tail of a GPT (embedding, layer norm, attention, a linear, the tied
 * output projection over [B, T, C], softmax-CE over [B*T, V]) at B*T = 16. */
static loom_program *gpt_tail(int64_t V, loom_opt_level level, int keep_logits)
{
	loom_graph *g;
	loom_program *p;
	const int64_t B = 2, T = 8, C = 16;
	int64_t bt[2] = { B, T }, flat[1] = { B * T }, td[2] = { V, C }, lg[2] = { B * T, V };
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_value ids = loom_input(g, "ids", LOOM_I32, 2, bt);
	loom_value y = loom_input(g, "y", LOOM_I32, 1, flat);
	loom_value wte = loom_param(g, "wte", LOOM_F32, 2, td, LOOM_INIT_KAIMING_UNIFORM, C);
	loom_value x = loom_layer_layernorm(g, "ln", loom_embedding(g, ids, wte));
	x = loom_causal_self_attention(g, loom_layer_linear(g, "qkv", x, 3 * C, 1), 2);
	x = loom_layer_linear(g, "proj", x, C, 1);
	loom_value logits = loom_linear(g, x, wte, LOOM_NONE);
	loom_value loss = loom_softmax_cross_entropy(g, loom_reshape(g, logits, 2, lg), y);
	if (keep_logits)
		loom_mark_output(g, logits);
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.amp.level = level;
	o.amp.half = LOOM_BF16;
	cr_assert_eq(loom_compile(g, loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	loom_graph_free(g);
	return p;
}

/* The distinct buffers (region, offset) of f32 values [..., V] of rows
 * rows ([B*T, V] or [B, T, V]). */
static int f32_buffers_of(const loom_program *p, int64_t rows, int64_t V)
{
	const loom_graph *g = p->plan.g;
	const loom_memplan *mp = &p->plan.mp;
	size_t off[64];
	int reg[64], k = 0;
	for (int v = 0; v < g->n; v++) {
		const loom_shape *sh = &g->nodes[v].shape;
		if (g->nodes[v].dtype != LOOM_F32 || sh->ndim < 2 || loom_shape_last(sh) != V ||
		    loom_shape_rows(sh) != rows)
			continue;
		int seen = 0;
		for (int i = 0; i < k; i++)
			seen |= off[i] == mp->offset[v] && reg[i] == mp->region[v];
		if (!seen && k < 64) {
			off[k] = mp->offset[v];
			reg[k++] = mp->region[v];
		}
	}
	return k;
}

static void expect_one_logits_buffer(int64_t V, loom_opt_level level)
{
	loom_program *p = gpt_tail(V, level, 0);
	cr_assert_eq(f32_buffers_of(p, 16, V), 1,
		     "V = %lld, O%d: %d f32 [B*T, V] buffers in the plan", (long long)V, (int)level,
		     f32_buffers_of(p, 16, V));
	loom_program_info info;
	loom_program_info_get(p, &info);
	size_t arena = info.arena_bytes;
	loom_program_free(p);
	if (level != LOOM_O0)
		return;
	/* The control (f32 logits, O0): logits kept for the user cannot be
	 * written over, and the same count then finds both buffers; at a
	 * large vocabulary the arena grows by about one of them. */
	p = gpt_tail(V, level, 1);
	cr_assert_eq(f32_buffers_of(p, 16, V), 2);
	loom_program_info_get(p, &info);
	if (V > 10000)
		cr_assert_geq(info.arena_bytes, arena + (size_t)16 * V * 4,
			      "kept logits: arena %zu, in place %zu", info.arena_bytes, arena);
	loom_program_free(p);
}

Test(memplan, gpt_loss_holds_one_logits_buffer_v256)
{
	expect_one_logits_buffer(256, LOOM_O0);
	expect_one_logits_buffer(256, LOOM_O1);
}

Test(memplan, gpt_loss_holds_one_logits_buffer_v50257, .timeout = 120)
{
	expect_one_logits_buffer(50257, LOOM_O0);
	expect_one_logits_buffer(50257, LOOM_O1);
}

/* The offline placement (greedy by size, graph/memplan.c), forced on
 * (LOOM_MEMPLAN_BY_SIZE=1): no two values alive together share bytes, with
 * siblings (O1) and in-place writes; by default the plan is the smaller of
 * it and best fit, never larger than best fit alone (=0). */
Test(memplan, offline_placement_never_shares_live_bytes)
{
	setenv("LOOM_MEMPLAN_BY_SIZE", "1", 1);
	expect_no_live_overlap(convnet(NULL));
	expect_no_live_overlap(convnet_at(NULL, LOOM_O1));
	unsetenv("LOOM_MEMPLAN_BY_SIZE");
}

Test(memplan, offline_placement_is_kept_only_when_smaller)
{
	loom_program_info a, b;
	for (int level = 0; level <= 1; level++) {
		setenv("LOOM_MEMPLAN_BY_SIZE", "0", 1);
		loom_program *p = gpt_tail(256, (loom_opt_level)level, 0);
		loom_program_info_get(p, &a);
		loom_program_free(p);
		unsetenv("LOOM_MEMPLAN_BY_SIZE");
		p = gpt_tail(256, (loom_opt_level)level, 0);
		loom_program_info_get(p, &b);
		loom_program_free(p);
		cr_assert_leq(b.activation_bytes, a.activation_bytes,
			      "O%d: %zu activation bytes planned, best fit alone %zu", level,
			      b.activation_bytes, a.activation_bytes);
	}
}
