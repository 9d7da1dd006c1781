/*
 * engine/program.c — loom_compile and the run-time API of a program: the
 * compile (its arguments checked, the program made, the list of passes of
 * parallel/pass_list.c walked), the per-step executor entry points, and access
 * to values by handle.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/options.h"
#include "amp/amp_pass.h"
#include "comm/comm.h"
#include "base/elem.h"
#include "engine/pass.h"
#include "engine/program_internal.h"
#include "engine/trace.h"
#include "graph/ops/ops.h"

const char *loom_program_error(const loom_program *p)
{
	return p ? p->err.msg : "null program";
}

void loom_compile_opts_default(loom_compile_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->device = LOOM_DEVICE_AUTO;
	o->optim.kind = LOOM_OPTIM_SGD;
	o->optim.lr = 0.01;
	o->optim.beta1 = 0.9;
	o->optim.beta2 = 0.999;
	o->optim.eps = 1e-8;
	o->amp.level = LOOM_O0;
	o->amp.half = LOOM_F16;
	o->amp.init_scale = 65536.0;
	o->amp.growth_interval = 2000;
	o->amp.keep_batchnorm_fp32 = -1;
	o->bucket_cap_mb = 25.0;
	o->first_bucket_mb = 1.0;
	o->cuda_graph = 1;
	o->vocab_pad = -1; /* the backend's multiple (engine/vocab_pad.c) */
}

static loom_status check_optim(const loom_optim_opts *o)
{
	if ((unsigned)o->kind >= LOOM_OPTIM_COUNT)
		return loom_fail(LOOM_ERR_INVALID, "optimizer: unknown kind %d", (int)o->kind);
	if (o->kind == LOOM_OPTIM_NONE)
		return LOOM_OK;
	if (!(o->lr >= 0) || !isfinite(o->lr))
		return loom_fail(LOOM_ERR_INVALID, "optimizer: learning rate %g must be >= 0", o->lr);
	if (!(o->weight_decay >= 0))
		return loom_fail(LOOM_ERR_INVALID, "optimizer: weight decay %g must be >= 0",
				    o->weight_decay);
	if (!(o->clip_grad >= 0) || !isfinite(o->clip_grad))
		return loom_fail(LOOM_ERR_INVALID, "optimizer: clip_grad %g must be >= 0",
				    o->clip_grad);
	if (o->kind == LOOM_OPTIM_SGD) {
		if (!(o->momentum >= 0))
			return loom_fail(LOOM_ERR_INVALID, "sgd: momentum %g must be >= 0", o->momentum);
		if (o->nesterov && (o->momentum <= 0 || o->dampening != 0))
			return loom_fail(LOOM_ERR_INVALID,
					    "sgd: nesterov needs a momentum and zero dampening");
	} else {
		if (!(o->beta1 >= 0 && o->beta1 < 1) || !(o->beta2 >= 0 && o->beta2 < 1))
			return loom_fail(LOOM_ERR_INVALID, "adamw: betas (%g, %g) must be in [0, 1)",
					    o->beta1, o->beta2);
		if (!(o->eps > 0))
			return loom_fail(LOOM_ERR_INVALID, "adamw: eps %g must be > 0", o->eps);
	}
	return LOOM_OK;
}

static uint64_t mix(uint64_t h, uint64_t x)
{
	h ^= x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
	return h;
}

/* --memory-report: this rank's planned peak, before step 1 (everything
 * lives in the one arena, so the peak is its size, plus the accumulation
 * sums a pipeline of several micro-batches allocates at its first step). */
static void memory_report(const loom_program *p)
{
	const loom_plan *pl = &p->plan;
	const loom_pg_info *in = pl->opts.pg ? loom_pg_get_info(pl->opts.pg) : NULL;
	size_t grads = 0, accum = p->peak_extra;
	for (int i = 0; i < pl->n_params; i++)
		if (loom_plan_holds(pl, pl->params[i].grad))
			grads += loom_plan_value_bytes(pl, pl->params[i].grad);
	size_t total = loom_plan_peak(pl, p->peak_extra);
	char where[96] = "";
	const loom_pass *ps = LOOM_PASS_WITH(p, note);
	if (ps)
		ps->note(p, where, sizeof(where));
	loom_log("loom: rank %d%s: planned peak %.2f MiB = persistent %.2f (gradients %.2f) + "
		 "buckets %.2f + activations %.2f + workspace %.2f + optimizer state %.2f + "
		 "ZeRO's shards %.2f + accumulation %.2f\n",
		 in ? in->rank : 0, where, total / 1048576.0, pl->mp.persist_bytes / 1048576.0,
		 grads / 1048576.0, pl->mp.bucket_bytes / 1048576.0, pl->mp.act_bytes / 1048576.0,
		 pl->ws_bytes / 1048576.0, pl->state_bytes / 1048576.0,
		 pl->master_shard_bytes / 1048576.0, accum / 1048576.0);
}

/* The group's world size (1 without a group). */
static int group_world(const loom_pg *pg)
{
	const loom_pg_info *in = pg ? loom_pg_get_info(pg) : NULL;
	return in && in->world > 1 ? in->world : 1;
}

/* What loom_compile refuses before it makes a program: the graph, the
 * loss and the options' values. */
static loom_status check_args(const loom_graph *g, loom_value loss, const loom_compile_opts *o)
{
	loom_status st;
	char lb[96], env[LOOM_ERR_MAX];
	if (loom_opt_check_env(env, sizeof(env)) != LOOM_OK)
		return loom_fail(LOOM_ERR_INVALID, "loom_compile: %s", env);
	if (!g)
		return loom_fail(LOOM_ERR_INVALID, "loom_compile: graph is NULL");
	if (g->err.st != LOOM_OK)
		return loom_fail(g->err.st, "%s", g->err.msg);
	if (loss < 0 || loss >= g->n)
		return loom_fail(LOOM_ERR_INVALID, "loom_compile: the loss (%d) is not a value",
				    (int)loss);
	if (g->nodes[loss].shape.ndim != 0)
		return loom_fail(LOOM_ERR_SHAPE, "loom_compile: the loss %s is not a scalar",
				    loom_node_label(g, loss, lb, sizeof(lb)));
	if ((st = check_optim(&o->optim)) != LOOM_OK)
		return st;
	if ((unsigned)o->device >= LOOM_DEVICE_COUNT)
		return loom_fail(LOOM_ERR_INVALID, "device: unknown value %d", (int)o->device);
	if ((unsigned)o->kernel_search >= LOOM_KERNEL_SEARCH_COUNT)
		return loom_fail(LOOM_ERR_INVALID, "kernel_search: unknown value %d",
				    o->kernel_search);
	if (!(o->kernel_search_ms >= 0))
		return loom_fail(LOOM_ERR_INVALID, "kernel_search_ms %g must be >= 0",
				    o->kernel_search_ms);
	if (o->vocab_pad < -1 || o->vocab_pad > 1048576)
		return loom_fail(LOOM_ERR_INVALID,
				 "vocab_pad %d must be -1 (the backend's), 0 (none) or a multiple "
				 "up to 1048576", o->vocab_pad);
	if (o->inference && group_world(o->pg) > 1)
		return loom_fail(LOOM_ERR_UNSUPPORTED,
				    "loom_compile: a forward-only (inference) plan is for one process");
	return LOOM_OK;
}

/* A program and its executor's state, allocated (and freed) as one. */
typedef struct program_alloc {
	loom_program p; /* first: free(p) frees both */
	loom_exec exec;
} program_alloc;

/* The program the passes fill: the options, the training state's start,
 * the plan's fingerprint and world, its own copy of the graph. */
static loom_status program_new(loom_graph *g, loom_value loss, const loom_compile_opts *o,
			       loom_program **out)
{
	program_alloc *a = calloc(1, sizeof(*a));
	if (!a)
		return loom_fail(LOOM_ERR_NOMEM, "out of memory");
	loom_program *p = &a->p;
	p->exec = &a->exec;
	*out = p;
	p->plan.opts = *o;
	if (o->inference) /* no gradients: nothing to optimize */
		p->plan.opts.optim.kind = LOOM_OPTIM_NONE;
	p->ts.lr = o->optim.lr;
	p->ts.first_nonfinite = LOOM_NONE;
	p->plan.fingerprint = mix(loom_graph_fingerprint(g),
			     (uint64_t)p->plan.opts.optim.kind * 131 + (uint64_t)o->amp.level * 7 +
				     (uint64_t)o->amp.half + (o->inference ? 0x1f00dull : 0) +
				     (o->amp.fp8 ? 0xf8f800ull + (uint64_t)o->amp.fp8_all_products : 0));
	/* fp8's recipe shapes the checkpointed state: a term only under fp8,
	 * so that other plans keep their fingerprints */
	if (o->amp.fp8)
		p->plan.fingerprint = mix(p->plan.fingerprint,
					  ((uint64_t)loom_fp8_recipe(&o->amp) << 40) |
						  ((uint64_t)loom_fp8_history(&o->amp) << 8) |
						  (uint64_t)o->amp.fp8_margin);
	p->plan.world = group_world(o->pg);
	p->plan.loss = loss;
	loom_status st = loom_graph_clone(g, &p->plan.g);
	if (st != LOOM_OK)
		return loom_program_fail(p, st, "out of memory copying the graph");
	p->plan.g->nodes[loss].flags |= LOOM_NODE_OUTPUT;
	return LOOM_OK;
}

const char *loom_test_skip_pass;

static int pass_skipped(const loom_pass *ps)
{
	return loom_test_skip_pass && strcmp(loom_test_skip_pass, ps->name) == 0;
}

/* The compile pipeline: every wanted pass in order, then the start-up of
 * those that ran (the arena holds the initial values by then). */
static loom_status run_passes(loom_program *p, loom_pass_ctx *c)
{
	loom_status st;
	if (loom_n_compile_passes > 64)
		return loom_program_fail(p, LOOM_ERR_STATE, "loom_compile: %d passes, at most 64",
					 loom_n_compile_passes);
	for (int i = 0; i < loom_n_compile_passes; i++) {
		const loom_pass *ps = loom_compile_passes[i];
		if (pass_skipped(ps) || (ps->wanted && !ps->wanted(p)))
			continue;
		if ((st = ps->run(p, c)) != LOOM_OK)
			return st;
		p->passes_ran |= 1ull << i;
	}
	for (int i = 0; i < loom_n_compile_passes; i++)
		if ((p->passes_ran >> i & 1) && loom_compile_passes[i]->start &&
		    (st = loom_compile_passes[i]->start(p)) != LOOM_OK)
			return st;
	return LOOM_OK;
}

const loom_pass *loom_pass_with(const loom_program *p, size_t member)
{
	for (int i = 0; i < loom_n_compile_passes; i++) {
		const loom_pass *ps = loom_compile_passes[i];
		void *fn;
		memcpy(&fn, (const char *)ps + member, sizeof(fn));
		if ((p->passes_ran >> i & 1) && fn)
			return ps;
	}
	return NULL;
}

/* --verbose: what was compiled, and how the arena divides. */
static void compile_log(const loom_program *p)
{
	loom_program_info info;
	loom_program_info_get(p, &info);
	loom_log("loom: compiled %d nodes (%d forward) on %s: arena %.2f MiB "
		"(params %.2f, grads %.2f, optimizer %.2f, activations %.2f of %.2f naive)\n",
		info.n_nodes, p->plan.n_fwd, info.backend, info.arena_bytes / 1048576.0,
		info.param_bytes / 1048576.0, info.grad_bytes / 1048576.0,
		info.optim_state_bytes / 1048576.0, info.activation_bytes / 1048576.0,
		info.activation_naive_bytes / 1048576.0);
}

/* One compile of g; `rebalanced`: pipeline stages cut by memory because
 * the time-balanced cut was over the memory limit (loom_compile). */
static loom_status compile_one(loom_graph *g, loom_value loss, const loom_compile_opts *o,
			       int rebalanced, loom_program **out)
{
	loom_status st;
	loom_compile_opts def;
	/* Failures before a program exists go to the thread's error object
	 * (loom_fail, read by loom_last_error: base/errf.h). */
	loom_error_clear(loom_thread_error());
	if (!out)
		return loom_fail(LOOM_ERR_INVALID, "loom_compile: out is NULL");
	*out = NULL;
	if (!o) {
		loom_compile_opts_default(&def);
		o = &def;
	}
	if ((st = check_args(g, loss, o)) != LOOM_OK)
		return st;
	loom_pass_ctx c = { .loss = loss, .rebalanced = rebalanced };
	if ((st = program_new(g, loss, o, out)) == LOOM_OK)
		st = run_passes(*out, &c);
	free(c.held);
	loom_program *p = *out;
	if (st != LOOM_OK) {
		/* As sqlite3_open: the handle comes back so that its error can
		 * be read; only loom_program_error and loom_program_free take it. */
		if (p)
			loom_fail(st, "%s", p->err.msg);
		return st;
	}
	if (o->memory_report)
		memory_report(p);
	if (o->verbose)
		compile_log(p);
	p->ready = 1;
	return LOOM_OK;
}

loom_status loom_compile(loom_graph *g, loom_value loss, const loom_compile_opts *o,
			 loom_program **out)
{
	loom_status st = compile_one(g, loss, o, 0, out);
	/* Refused for memory: a pass may know a plan that fits (the pipeline's
	 * memory-balanced cut); every rank refused alike, so every rank
	 * compiles again. */
	for (int i = 0; st == LOOM_ERR_NOMEM && o && *out && i < loom_n_compile_passes; i++) {
		loom_compile_opts mo = *o;
		const loom_pass *ps = loom_compile_passes[i];
		if (!ps->retry || !ps->retry(*out, &mo))
			continue;
		loom_program_free(*out);
		*out = NULL;
		return compile_one(g, loss, &mo, 1, out);
	}
	return st;
}

void loom_program_free(loom_program *p)
{
	if (!p)
		return;
	if (p->be && p->be_ctx) {
		if (p->ready)
			loom_exec_drain(p);
		p->be->free(p->be_ctx);
	}
	loom_trace_free(p->ts.trace);
	loom_fp8_state_free(&p->ts.fp8);
	loom_input_buffers_free(p);
	loom_exec_free(p->exec);
	for (int i = 0; i < loom_n_compile_passes; i++)
		if (loom_compile_passes[i]->release)
			loom_compile_passes[i]->release(p);
	free(p->plan.steps);
	free(p->plan.pieces);
	free(p->plan.gathers);
	loom_memplan_free(&p->plan.mp);
	loom_buckets_free(&p->plan.buckets);
	free(p->plan.accum);
	free(p->plan.params);
	loom_graph_free(p->plan.g);
	free(p);
}

static loom_value find_named(const loom_program *p, loom_op op, const char *name)
{
	for (int v = 0; v < p->plan.n_fwd; v++)
		if (p->plan.g->nodes[v].op == op && strcmp(p->plan.g->nodes[v].name, name) == 0)
			return v;
	return LOOM_NONE;
}

loom_status loom_set_input(loom_program *p, const char *name, const void *data, loom_dtype dt,
			   size_t count)
{
	if (!loom_program_usable(p))
		return LOOM_ERR_INVALID;
	if (!name || !data)
		return loom_program_fail(p, LOOM_ERR_INVALID, "set_input: name or data is NULL");
	loom_value v = find_named(p, LOOM_OP_INPUT, name);
	if (v == LOOM_NONE)
		return loom_program_fail(p, LOOM_ERR_NOT_FOUND, "set_input: no input called '%s'", name);
	const loom_node *nd = &p->plan.g->nodes[v];
	char sb[96];
	if (dt != nd->dtype)
		return loom_program_fail(p, LOOM_ERR_DTYPE, "set_input '%s': data is %s, the input is %s",
					 name, loom_dtype_name(dt), loom_dtype_name(nd->dtype));
	if (loom_input_buffer_out(p, v))
		return loom_program_fail(p, LOOM_ERR_STATE,
					 "set_input '%s': its buffer is handed out (loom_input_buffer); "
					 "commit or release it first",
					 name);
	const loom_pass *ps = LOOM_PASS_WITH(p, set_input);
	if (ps) {
		p->input_upload_bytes += count * loom_dtype_size(dt);
		return ps->set_input(p, v, data, count);
	}
	if ((int64_t)count != loom_shape_numel(&nd->shape))
		return loom_program_fail(p, LOOM_ERR_SHAPE,
					 "set_input '%s': %zu elements given, shape %s holds %lld", name,
					 count, loom_shape_str(&nd->shape, sb, sizeof(sb)),
					 (long long)loom_shape_numel(&nd->shape));
	p->input_upload_bytes += loom_value_bytes(p, v);
	return loom_program_upload(p, loom_value_ptr(p, v), data, loom_value_bytes(p, v));
}

/*
 * After the loss scale collapsed, the optimizer turned on per-node checks
 * (p->ts.diagnose); the first run that saw a non-finite value names its op for
 * loom_program_info's amp_report, once, and the checks stop.
 */
static void report_nonfinite(loom_program *p)
{
	if (!p->ts.diagnose || p->ts.first_nonfinite == LOOM_NONE || p->ts.amp_report[0])
		return;
	char lb[96];
	snprintf(p->ts.amp_report, sizeof(p->ts.amp_report), "%s (node %d)",
		 loom_node_label(p->plan.g, p->ts.first_nonfinite, lb, sizeof(lb)), (int)p->ts.first_nonfinite);
	loom_log("loom: loss scale collapsed below 1: %s first produced inf/NaN\n",
		 p->ts.amp_report);
	p->ts.diagnose = 0;
}

/* Walks steps [0, last) (the optimizer's among them or not): the step
 * path, or the diagnosis run that checks every node and may wait. */
static loom_status run_range(loom_program *p, int last, unsigned flags)
{
	if (p->ts.diagnose)
		flags |= LOOM_EXEC_DIAGNOSE;
	return loom_exec_run(p, 0, last, flags);
}

/* The accumulation sums, allocated by the first ACCUMULATE. */
loom_status loom_program_accum_ready(loom_program *p)
{
	if (p->arena.accum)
		return LOOM_OK;
	if (!p->be->accumulate)
		return loom_program_fail(p, LOOM_ERR_UNSUPPORTED,
					 "run: gradient accumulation is not implemented on the %s backend",
					 p->be->name);
	loom_status st = p->be->accumulate->alloc_accum(p->be_ctx, &p->plan, &p->arena);
	return st != LOOM_OK ? loom_program_backend_fail(p, st) : LOOM_OK;
}

/* Rank 0's buffers to every rank (the strategy's eval_sync): the last
 * run's kernels wrote them (on a device they must be done before the
 * broadcast reads them), and the broadcast must be done before the next run
 * reads them. */
static loom_status sync_buffers(loom_program *p)
{
	loom_status st;
	const loom_pass *ps = LOOM_PASS_WITH(p, eval_sync);
	if ((st = loom_exec_synchronize(p)) != LOOM_OK || (ps && (st = ps->eval_sync(p)) != LOOM_OK) ||
	    (st = loom_exec_synchronize(p)) != LOOM_OK)
		return st;
	p->ts.buffers_own = 0;
	return LOOM_OK;
}

static loom_status run_mode(loom_program *p, loom_run_mode mode)
{
	loom_status st;
	if (p->plan.opts.inference && mode != LOOM_RUN_EVAL)
		return loom_program_fail(p, LOOM_ERR_STATE,
					 "run: a forward-only (inference) program runs LOOM_RUN_EVAL "
					 "only, not mode %d", (int)mode);
	/* Each rank updated its buffers from its own batches: evaluate rank
	 * 0's (DDP's broadcast_buffers), the model rank 0 saves. */
	if (mode == LOOM_RUN_EVAL && p->ts.buffers_own && (st = sync_buffers(p)))
		return st;
	if (mode != LOOM_RUN_EVAL && mode < LOOM_RUN_MODE_COUNT && p->plan.world > 1)
		p->ts.buffers_own = 1;
	switch (mode) {
	case LOOM_RUN_EVAL:
		return run_range(p, p->plan.n_fwd_steps, 0);
	case LOOM_RUN_FORWARD:
		return run_range(p, p->plan.n_fwd_steps, LOOM_EXEC_TRAIN);
	case LOOM_RUN_GRAD:
		return run_range(p, p->plan.n_grad_steps, LOOM_EXEC_TRAIN);
	case LOOM_RUN_ACCUMULATE:
		if ((st = loom_program_accum_ready(p)) != LOOM_OK)
			return st;
		st = run_range(p, p->plan.n_grad_steps, LOOM_EXEC_TRAIN | LOOM_EXEC_ACCUMULATE);
		if (st == LOOM_OK)
			p->ts.micro++;
		return st;
	case LOOM_RUN_TRAIN:
		/* The update divides by micro + 1; the sums are spent after it,
		 * skipped or not (or failed half-way: nothing sensible is left). */
		st = run_range(p, p->plan.n_steps,
			       LOOM_EXEC_TRAIN | (p->ts.micro > 0 ? LOOM_EXEC_FOLD : 0));
		p->ts.micro = 0;
		return st;
	default:
		return loom_program_fail(p, LOOM_ERR_INVALID, "run: unknown mode %d", (int)mode);
	}
}

static loom_status run_and_sync(loom_program *p, loom_run_mode mode);

loom_status loom_run(loom_program *p, loom_run_mode mode)
{
	if (!loom_program_usable(p))
		return LOOM_ERR_INVALID;
	loom_error_clear(&p->err);
	loom_trace *tr = p->ts.trace;
	double t0 = tr ? loom_trace_now() : 0;
	int aux = mode == LOOM_RUN_ACCUMULATE ? p->ts.micro + 1 : (int)p->ts.step + 1;
	loom_status st = run_and_sync(p, mode);
	if (tr) {
		/* The run was synchronised: its timers can be read. */
		loom_exec_trace_flush(p);
		loom_trace_add(tr, LOOM_SPAN_RUN, (int)mode, aux, t0, loom_trace_now());
		tr->run++;
	}
	return st;
}

/* LOOM_ASYNC_LOSS=1: the loss and the device's state come back one step
 * late, so that loom_run returns without waiting for its step (a backend
 * with loss_async; one process, no pipeline, no trace, no diagnosis). */
static int async_loss(const loom_program *p)
{
	return loom_opt_bool(LOOM_OPT_ASYNC_LOSS) && p->be->async_loss && !p->plan.pipe &&
	       p->plan.world <= 1 && !p->ts.trace && !p->ts.diagnose;
}

static loom_status run_and_sync(loom_program *p, loom_run_mode mode)
{
	const loom_pass *ps = LOOM_PASS_WITH(p, execute);
	if (ps)
		return ps->execute(p, mode);
	loom_status st = run_mode(p, mode);
	report_nonfinite(p);
	if (st != LOOM_OK)
		return st;
	if (async_loss(p)) {
		st = p->be->async_loss->loss_async(p->be_ctx, &p->plan,
						   loom_value_ptr(p, p->plan.loss),
						   p->plan.g->nodes[p->plan.loss].dtype == LOOM_F64,
						   &p->ts);
		return st == LOOM_OK ? st : loom_program_backend_fail(p, st);
	}
	float l32;
	double l64;
	if (p->plan.g->nodes[p->plan.loss].dtype == LOOM_F64) {
		st = loom_program_download(p, &l64, loom_value_ptr(p, p->plan.loss), sizeof(l64));
		p->ts.last_loss = l64;
	} else {
		st = loom_program_download(p, &l32, loom_value_ptr(p, p->plan.loss), sizeof(l32));
		p->ts.last_loss = l32;
	}
	if (st == LOOM_OK && (st = loom_exec_synchronize(p)) != LOOM_OK)
		return st;
	/* A collapsing scale: watch the next runs node by node and name the
	 * first op that produces inf/NaN. */
	if (loom_scaler_collapsed(&p->ts.scaler) && !p->ts.amp_report[0])
		p->ts.diagnose = 1;
	return st;
}

double loom_loss(loom_program *p)
{
	return p ? p->ts.last_loss : NAN;
}

/*
 * The compiled value behind a user's handle. The AMP pass rewrites the
 * forward graph in order and the only nodes it adds are flagged
 * LOOM_NODE_AMP (casts, O2 masters), so user value v is the v-th forward
 * node without that flag: v itself under O0, a shifted index otherwise.
 */
static loom_value compiled_value(const loom_program *p, loom_value v)
{
	if (v < 0)
		return LOOM_NONE;
	for (int u = 0, k = 0; u < p->plan.n_fwd; u++) {
		if (p->plan.g->nodes[u].flags & (LOOM_NODE_AMP | LOOM_NODE_REORDER))
			continue;
		if (k++ == v)
			return u;
	}
	return LOOM_NONE;
}

/* A value readable after a step: persistent storage. */
static loom_status readable(loom_program *p, loom_value v, size_t count, const char *what)
{
	char sb[96];
	if (v < 0 || v >= p->plan.g->n)
		return loom_program_fail(p, LOOM_ERR_INVALID, "%s: no value %d", what, (int)v);
	if (p->plan.mp.region[v] != LOOM_REGION_PERSIST && p->plan.mp.region[v] != LOOM_REGION_BUCKET)
		return loom_program_fail(p, LOOM_ERR_STATE,
					 "%s: value %d is not kept after a step (mark it with loom_mark_output)",
					 what, (int)v);
	const loom_node *nd = &p->plan.g->nodes[v];
	loom_shape us = loom_node_user_shape(nd); /* a padded vocabulary's: unpadded */
	if ((int64_t)count != loom_shape_numel(&us))
		return loom_program_fail(p, LOOM_ERR_SHAPE, "%s: %zu elements asked, value %d is %s",
					 what, count, (int)v, loom_shape_str(&us, sb, sizeof(sb)));
	return LOOM_OK;
}


/* Downloads v and converts it to f64 (dst) elementwise. */
static loom_status read_as_f64(loom_program *p, loom_value v, double *dst, size_t count)
{
	const loom_node *nd = &p->plan.g->nodes[v];
	size_t bytes = loom_value_bytes(p, v);
	void *tmp = malloc(bytes ? bytes : 1);
	if (!tmp)
		return loom_program_fail(p, LOOM_ERR_NOMEM, "read: out of memory");
	loom_status st = loom_program_download(p, tmp, loom_value_ptr(p, v), bytes);
	for (size_t i = 0; st == LOOM_OK && i < count; i++)
		dst[i] = loom_elem_get(nd->dtype, tmp, loom_node_stored_index(nd, i));
	free(tmp);
	return st;
}

/* v's count values as doubles into d, or as floats into f through a
 * buffer of doubles (one of d and f is NULL): through the pass that reads
 * v if one does, else from the arena. */
static loom_status read_values(loom_program *p, loom_value v, double *d, float *f, size_t count)
{
	if (!loom_program_usable(p) || (!d && !f))
		return LOOM_ERR_INVALID;
	if ((v = compiled_value(p, v)) == LOOM_NONE)
		return loom_program_fail(p, LOOM_ERR_INVALID, "read: not a value of this program");
	const loom_pass *ps = LOOM_PASS_WITH(p, read);
	loom_status st = ps ? LOOM_OK : readable(p, v, count, "read");
	if (st != LOOM_OK)
		return st;
	double *buf = d ? d : malloc(sizeof(double) * (count ? count : 1));
	if (!buf)
		return loom_program_fail(p, LOOM_ERR_NOMEM, "read: out of memory");
	st = ps ? ps->read(p, v, buf, count) : read_as_f64(p, v, buf, count);
	if (f) {
		for (size_t i = 0; st == LOOM_OK && i < count; i++)
			f[i] = (float)buf[i];
		free(buf);
	}
	return st;
}

loom_status loom_read_f64(loom_program *p, loom_value v, double *dst, size_t count)
{
	return read_values(p, v, dst, NULL, count);
}

loom_status loom_read(loom_program *p, loom_value v, float *dst, size_t count)
{
	return read_values(p, v, NULL, dst, count);
}

loom_status loom_read_grad_f64(loom_program *p, loom_value v, double *dst, size_t count)
{
	if (!loom_program_usable(p) || !dst)
		return LOOM_ERR_INVALID;
	loom_value uv = v;
	v = compiled_value(p, v);
	if (v == LOOM_NONE || p->plan.g->nodes[v].op != LOOM_OP_PARAM)
		return loom_program_fail(p, LOOM_ERR_INVALID, "read_grad: value %d is not a parameter",
					 (int)uv);
	loom_value gr = p->plan.g->nodes[v].grad;
	if (gr != LOOM_NONE && !loom_plan_holds(&p->plan, gr))
		return loom_program_fail(p, LOOM_ERR_STATE, "read_grad: parameter '%s' belongs to "
					 "another pipeline stage", p->plan.g->nodes[v].name);
	loom_status st = readable(p, gr, count, "read_grad");
	return st != LOOM_OK ? st : read_as_f64(p, gr, dst, count);
}

loom_status loom_write_f64(loom_program *p, loom_value v, const double *src, size_t count)
{
	if (!loom_program_usable(p) || !src)
		return LOOM_ERR_INVALID;
	loom_value uv = v;
	v = compiled_value(p, v);
	if (v == LOOM_NONE ||
	    (p->plan.g->nodes[v].op != LOOM_OP_PARAM && p->plan.g->nodes[v].op != LOOM_OP_BUFFER))
		return loom_program_fail(p, LOOM_ERR_INVALID,
					 "write: value %d is not a parameter or buffer", (int)uv);
	loom_status st = readable(p, v, count, "write");
	if (st != LOOM_OK)
		return st;
	/* Pipeline stages: every rank writes, the stage that holds v keeps it. */
	if (!loom_plan_holds(&p->plan, v))
		return LOOM_OK;
	const loom_node *nd = &p->plan.g->nodes[v];
	size_t bytes = loom_value_bytes(p, v);
	/* zeroed: a padded vocabulary's padding rows (past count) stay zero */
	void *tmp = calloc(1, bytes ? bytes : 1);
	if (!tmp)
		return loom_program_fail(p, LOOM_ERR_NOMEM, "write: out of memory");
	for (size_t i = 0; i < count; i++)
		loom_elem_set(nd->dtype, tmp, i, src[i]);
	st = loom_value_write_whole(p, v, tmp); /* ZeRO-3: this rank's shards of a parameter */
	free(tmp);
	/* O2: the optimizer updates the fp32 master and copies it over the half
	 * parameter, so the master must hold the written values too. */
	if (st == LOOM_OK && nd->master != LOOM_NONE) {
		size_t full = (size_t)loom_shape_numel(&p->plan.g->nodes[nd->master].shape);
		float *m = calloc(full > count ? full : count ? count : 1, sizeof(float));
		if (!m)
			return loom_program_fail(p, LOOM_ERR_NOMEM, "write: out of memory");
		for (size_t i = 0; i < count; i++)
			m[i] = (float)src[i];
		st = loom_master_write(p, v, m);
		free(m);
	}
	return st;
}

loom_status loom_set_lr(loom_program *p, double lr)
{
	if (!p)
		return LOOM_ERR_INVALID;
	if (!(lr >= 0) || !isfinite(lr))
		return loom_program_fail(p, LOOM_ERR_INVALID, "set_lr: %g must be >= 0", lr);
	p->ts.lr = lr;
	return LOOM_OK;
}

double loom_get_lr(const loom_program *p)
{
	return p ? p->ts.lr : NAN;
}

int64_t loom_step_count(const loom_program *p)
{
	return p ? p->ts.step : 0;
}

/* The values the fp8 storage pass keeps in fp8 (engine/compile_passes.c),
 * as the memory plan counts them (64-byte aligned, graph/memplan.c). */
static void fp8_storage_info(const loom_program *p, loom_program_info *info)
{
	const loom_graph *g = p->plan.g;
	for (int v = 0; v < g->n; v++) {
		const loom_node *n = &g->nodes[v];
		if (!loom_fp8_stored(n) || !loom_plan_holds(&p->plan, v))
			continue;
		int64_t numel = loom_shape_numel(&n->shape);
		size_t kept = (loom_fp8_stored_bytes(numel) + 63) & ~(size_t)63;
		size_t full = ((size_t)numel * loom_dtype_size(n->dtype) + 63) & ~(size_t)63;
		info->n_fp8_stored++;
		info->fp8_stored_bytes += kept;
		info->fp8_saved_bytes += full > kept ? full - kept : 0;
	}
}

void loom_program_info_get(const loom_program *p, loom_program_info *info)
{
	memset(info, 0, sizeof(*info));
	if (!loom_program_usable(p))
		return;
	info->backend = p->be->describe(p->be_ctx);
	info->n_nodes = p->plan.g->n;
	info->n_recomputed = p->plan.n_recomputed;
	info->n_params = p->plan.n_params;
	/* Pipeline stages: the figures of what this rank's stage holds. */
	for (int i = 0; i < p->plan.n_params; i++) {
		const loom_param_slot *s = &p->plan.params[i];
		if (!loom_plan_holds(&p->plan, s->param))
			continue;
		/* a padded vocabulary's table: its real rows (engine/vocab_pad.c) */
		loom_shape us = loom_node_user_shape(&p->plan.g->nodes[s->param]);
		info->n_param_elems += loom_shape_numel(&us);
		info->param_bytes += loom_value_bytes(p, s->param);
		if (loom_plan_holds(&p->plan, s->grad))
			info->grad_bytes += loom_value_bytes(p, s->grad);
	}
	/* A forward-only plan has no slots: its parameters are the graph's. */
	for (int v = 0; p->plan.opts.inference && v < p->plan.n_fwd; v++) {
		const loom_node *nd = &p->plan.g->nodes[v];
		if (nd->op != LOOM_OP_PARAM || (nd->flags & LOOM_NODE_AMP))
			continue;
		loom_shape us = loom_node_user_shape(nd); /* a padded table: its real rows */
		info->n_params++;
		info->n_param_elems += loom_shape_numel(&us);
		info->param_bytes += loom_value_bytes(p, v);
	}
	/* ZeRO-2 and 3: the gradients and parameters as the shards hold them. */
	if (p->shards && p->shards->info)
		p->shards->info(p, info);
	info->master_bytes = p->plan.master_bytes;
	info->optim_state_bytes = p->plan.state_bytes;
	info->activation_bytes = p->plan.mp.act_bytes;
	info->activation_naive_bytes = p->plan.mp.act_naive_bytes;
	fp8_storage_info(p, info);
	info->arena_bytes = p->plan.mp.persist_bytes + p->plan.mp.bucket_bytes + p->plan.mp.act_bytes + p->plan.ws_bytes + loom_plan_state_region_bytes(&p->plan);
	loom_plan_flops(&p->plan, &info->flops_fwd, &info->flops_bwd);
	info->loss_scale = p->ts.scaler.scale;
	info->skipped_steps = p->ts.scaler.skipped_steps;
	info->grad_norm = p->ts.grad_norm;
	info->amp_report = p->ts.amp_report;
	info->graph_note = p->exec->graph < 0 ? p->exec->graph_note : "";
	if (p->be->timing && p->be->timing->counters) {
		loom_backend_counters k = { 0 };
		p->be->timing->counters(p->be_ctx, &k);
		info->graph_captures = k.captures;
		info->graph_replays = k.replays;
		info->host_syncs = k.host_syncs;
		info->syncs_in_step = k.syncs_in_step;
	}
	info->input_upload_bytes = p->input_upload_bytes;
}

void loom_program_dump(const loom_program *p, FILE *out)
{
	char sh[96], lb[96];
	if (!loom_program_usable(p) || !out)
		return;
	fprintf(out, "plan: %d nodes (%d forward), backend %s\n", p->plan.g->n, p->plan.n_fwd,
		p->be->describe(p->be_ctx));
	for (int v = 0; v < p->plan.g->n; v++) {
		const loom_node *n = &p->plan.g->nodes[v];
		fprintf(out, "%4d %-30s %-4s %-18s %c+%-9zu", v, loom_node_label(p->plan.g, v, lb, sizeof(lb)),
			loom_dtype_name(n->dtype), loom_shape_str(&n->shape, sh, sizeof(sh)),
			loom_region_letter(p->plan.mp.region[v]), p->plan.mp.offset[v]);
		for (int i = 0; i < n->nsrc; i++)
			fprintf(out, " %%%d", (int)n->src[i]);
		if (n->flags & LOOM_NODE_AMP)
			fprintf(out, " (amp)");
		if (n->flags & LOOM_NODE_GRAD)
			fprintf(out, " (grad)");
		if (n->op == LOOM_OP_MAXPOOL2D || n->op == LOOM_OP_MAXPOOL2D_BWD)
			if (n->a.pool.relu)
				fprintf(out, " (relu fused)");
		if ((n->op == LOOM_OP_LINEAR && n->a.mm.relu) ||
		    (n->op == LOOM_OP_BATCHNORM2D && n->a.bn.relu) ||
		    (n->op == LOOM_OP_ADD && n->a.ew.relu))
			fprintf(out, " (relu fused)");
		if ((n->op == LOOM_OP_BATCHNORM2D || n->op == LOOM_OP_BN_BWD_DATA ||
		     n->op == LOOM_OP_BN_BWD_GAMMA) && n->a.bn.sync)
			fprintf(out, " (sync)");
		if (n->flags & LOOM_NODE_CAST_FOLDED)
			fprintf(out, " (f32 inside)");
		if (n->flags & LOOM_NODE_ACCUM)
			fprintf(out, " (adds into %%%d)", (int)n->src[n->nsrc - 1]);
		if (n->op == LOOM_OP_REORDER)
			fprintf(out, " [%s -> %s]",
				loom_format_name(p->plan.g->nodes[n->src[0]].format),
				loom_format_name(n->format));
		else if (n->format != LOOM_FORMAT_NCHW)
			fprintf(out, " [%s]", loom_format_name(n->format));
		if (loom_made_earlier(&p->plan, v))
			fprintf(out, " (made by %d)", (int)n->made_by);
		if (p->be->planning && p->be->planning->node_note) {
			char note[320];
			p->be->planning->node_note(p->be_ctx, &p->plan, v, note, sizeof(note));
			if (note[0])
				fprintf(out, " %s", note);
		}
		fprintf(out, "\n");
	}
	loom_program_dump_steps(p, out);
}

void loom_program_dump_steps(const loom_program *p, FILE *out)
{
	static const char *const phase[] = { "forward", "backward", "optimizer" };
	const loom_plan *pl = &p->plan;
	fprintf(out, "steps: %d (forward [0, %d), backward [%d, %d), optimizer [%d, %d))%s\n",
		pl->n_steps, pl->n_fwd_steps, pl->n_fwd_steps, pl->n_grad_steps, pl->n_grad_steps,
		pl->n_steps, pl->zero == 2 ? ", zero 2" : pl->zero ? ", zero 1" : "");
	for (int i = 0; i < pl->n_steps; i++) {
		const loom_step *s = &pl->steps[i];
		fprintf(out, "%4d %-10s %-9s %-7s", i, loom_step_kind_name(s->kind), phase[s->phase],
			s->stream == LOOM_STREAM_COMM ? "comm" : "compute");
		switch (s->kind) {
		case LOOM_STEP_NODE:
			fprintf(out, " node %d %s%s", (int)s->v, loom_op_defs[pl->g->nodes[s->v].op]->name,
				s->noop ? " (nothing to run)" : "");
			break;
		case LOOM_STEP_COLLECTIVE: {
			/* ZeRO-3's gathers are numbered after the buckets */
			int g = s->index - pl->buckets.n, b = g >= 0 ? pl->gathers[g].bucket : s->index;
			fprintf(out, " %s bucket %d (%lld %s)", loom_coll_name(s->coll), b,
				(long long)pl->buckets.b[b].count, loom_dtype_name(pl->buckets.b[b].dtype));
			if (g >= 0)
				fprintf(out, " of parameters into node %d (gather %d)", (int)s->v, g);
			break;
		}
		case LOOM_STEP_WAIT:
			if (s->index >= pl->buckets.n)
				fprintf(out, " for gather %d", s->index - pl->buckets.n);
			break;
		case LOOM_STEP_ACCUM:
			fprintf(out, " segment %d (%lld elements)", s->index,
				(long long)pl->accum[s->index].count);
			break;
		case LOOM_STEP_OPTIM:
			fprintf(out, " pieces [%d, %d) of %d parameters", s->first, s->last, pl->n_params);
			break;
		case LOOM_STEP_COPY:
			fprintf(out, " bucket %d into its parameters", s->index);
			break;
		case LOOM_STEP_SEND:
		case LOOM_STEP_RECV:
			fprintf(out, " value %d of micro-batch %d %s rank %d", (int)s->v, s->micro,
				s->kind == LOOM_STEP_SEND ? "to" : "from", s->peer);
			if (s->kind == LOOM_STEP_RECV && s->post < i)
				fprintf(out, ", posted from step %d", s->post);
			break;
		case LOOM_STEP_MICRO:
			fprintf(out, " micro-batch %d %s, activation slot %d", s->micro,
				s->index == 1 ? "forward ends" : s->index == 2 ? "backward" : "forward",
				s->first);
			break;
		default:
			break;
		}
		fprintf(out, "\n");
	}
}
