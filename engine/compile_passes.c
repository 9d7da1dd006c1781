/*
 * engine/compile_passes.c — the engine's own compile passes (engine/pass.h):
 * AMP, autodiff, the device, fusions, parameter slots, the memory plan,
 * accumulation, the step list, the backend's plans and arena, and the
 * initial values. The strategies' passes are parallel/'s; the order is
 * parallel/pass_list.c's list.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amp/amp_pass.h"
#include "base/cuda_plugin.h"
#include "base/options.h"
#include "comm/comm.h"
#include "engine/pass.h"
#include "engine/program_internal.h" /* the engine's own passes: steps, formats, support */
#include "graph/ops/ops.h"

/* ------------------------------------------------------------ amp */

/* Casts, half parameters with f32 masters, the loss scale. */
static loom_status amp_run(loom_program *p, loom_pass_ctx *c)
{
	const loom_compile_opts *o = &p->plan.opts;
	char amsg[256] = "";
	loom_status st =
		loom_amp_pass(p->plan.g, &c->loss, &o->amp, !o->inference, amsg, sizeof(amsg));
	if (st != LOOM_OK)
		return loom_program_fail(p, st, "%s", amsg);
	p->plan.loss = c->loss;
	p->plan.scaling = loom_amp_uses_scaling(&o->amp);
	float init = o->amp.static_scale > 0 ? (float)o->amp.static_scale :
		     p->plan.scaling ? (float)o->amp.init_scale : 1.0f;
	if (loom_scaler_init(&p->ts.scaler, init,
			     o->amp.growth_interval > 0 ? o->amp.growth_interval : 2000,
			     p->plan.scaling && !(o->amp.static_scale > 0)) != 0)
		return loom_program_fail(p, LOOM_ERR_INVALID,
					 "amp: loss scale %g / growth interval %d invalid",
					 o->amp.init_scale, o->amp.growth_interval);
	return LOOM_OK;
}

const loom_pass loom_pass_amp = { .name = "amp", .run = amp_run };

/* ------------------------------------------------------------ autodiff */

/* The forward graph ends here; its backward (none for inference) after. */
static loom_status autodiff_run(loom_program *p, loom_pass_ctx *c)
{
	(void)c;
	p->plan.n_fwd = p->plan.g->n;
	loom_status st;
	if (!p->plan.opts.inference && (st = loom_autodiff(p->plan.g, p->plan.loss)) != LOOM_OK)
		return loom_program_fail(p, st, "%s", p->plan.g->err.msg);
	return LOOM_OK;
}

const loom_pass loom_pass_autodiff = { .name = "autodiff", .run = autodiff_run };

/* ------------------------------------------------------------ recompute */

/* loom_compile_opts.recompute, or LOOM_RECOMPUTE=N (0-2) instead. */
static int recompute_level(const loom_compile_opts *o)
{
	long v;
	if (loom_opt_int(LOOM_OPT_RECOMPUTE, &v))
		return (int)v;
	return o->recompute;
}

static int recompute_wanted(const loom_program *p)
{
	return !p->plan.opts.inference && recompute_level(&p->plan.opts) > 0;
}

/* Forward values made again in the backward (graph/recompute.c), after
 * autodiff and the device (whose fusions it asks about), before the
 * fusions and formats, which then see the copies as any backward node. */
static loom_status recompute_run(loom_program *p, loom_pass_ctx *c)
{
	int level = recompute_level(&p->plan.opts);
	if (level > 3)
		return loom_program_fail(p, LOOM_ERR_INVALID,
					 "recompute: level %d; 0 (none), 1 (activations), 2 (and norms) "
					 "or 3 (and attention probabilities)", level);
	if (p->plan.opts.pipeline_stages > 1) {
		loom_log("loom: recompute: not with pipeline stages yet; nothing is made again\n");
		return LOOM_OK;
	}
	int n_fwd = p->plan.n_fwd;
	/* A backend that runs attention as one fused kernel keeps no T x T
	 * matrix: its probabilities are not worth a copy (and a copy would
	 * keep the fusion from matching). */
	const int keep_probs = !p->plan.opts.no_fusion && (p->be->caps & LOOM_BE_FUSES_ATTENTION);
	loom_status st = loom_recompute_pass(p->plan.g, level, keep_probs, &n_fwd, &p->plan.loss,
					     &p->plan.n_recomputed);
	if (st != LOOM_OK)
		return loom_program_fail(p, st, "%s", p->plan.g->err.msg);
	p->plan.n_fwd = n_fwd;
	c->loss = p->plan.loss;
	if (p->plan.n_recomputed == 0)
		loom_log("loom: recompute %d: nothing in this graph to make again (GELU, SiLU%s%s "
			 "outputs read by the backward whose sources it keeps anyway)\n", level,
			 level >= 2 ? ", layer and RMS norm" : "",
			 level >= 3 && !keep_probs ? ", attention probabilities" : "");
	return LOOM_OK;
}

/* Refused for memory under a memory limit: compile again with every
 * activation made again that can be (level 3), where the plan has a
 * backward, no pipeline stages (their cut has its own retry) and
 * LOOM_RECOMPUTE does not decide. */
static int recompute_retry(const loom_program *p, loom_compile_opts *o)
{
	const char *e = loom_opt_env(LOOM_OPT_RECOMPUTE);
	if (!(o->memory_limit_mb > 0) || o->inference || o->pipeline_stages > 1 ||
	    o->recompute >= 3 || (e && *e))
		return 0;
	/* Only a graph with something to make again (a CNN's relus are not). */
	if (!loom_recompute_has_ops(p->plan.g, p->plan.n_fwd, 3))
		return 0;
	loom_log("loom: %s; compiling again with activations made again in the backward "
		 "(recompute 3)\n", p->err.msg);
	o->recompute = 3;
	return 1;
}

const loom_pass loom_pass_recompute = { .name = "recompute", .wanted = recompute_wanted,
					.run = recompute_run, .retry = recompute_retry };

/* ------------------------------------------------------------ device */

const loom_backend *loom_test_backend;

/* Chooses the backend: CUDA when asked or found, else the CPU with one
 * notice when the user left it to us. The CUDA plugin is mapped here, and
 * only when the driver reports a device. */
static loom_status pick_backend(loom_program *p)
{
	char why[2048];
	const loom_cuda_plugin *pl;
	int have_cuda;

	if (loom_test_backend) {
		p->be = loom_test_backend;
		return LOOM_OK;
	}
	if (p->plan.opts.device == LOOM_DEVICE_CPU) {
		p->be = &loom_cpu_backend;
		return LOOM_OK;
	}
	if (p->plan.opts.device != LOOM_DEVICE_AUTO && p->plan.opts.device != LOOM_DEVICE_CUDA)
		return loom_program_fail(p, LOOM_ERR_INVALID, "device: unknown value %d",
					 (int)p->plan.opts.device);
	have_cuda = loom_cuda_probe(why, sizeof why) > 0;
	pl = have_cuda ? loom_cuda_plugin_load(why, sizeof why) : NULL;
	if (pl) {
		p->be = pl->backend();
		return LOOM_OK;
	}
	if (p->plan.opts.device == LOOM_DEVICE_CUDA)
		return loom_program_fail(p, LOOM_ERR_UNSUPPORTED, "device cuda: %s%s",
					 have_cuda ? "" : "no CUDA device is available: ", why);
	static int told;
	if (!told++)
		loom_log(have_cuda ? "loom: a CUDA device was found but %s; running on the CPU\n"
				   : "loom: no CUDA device found, running on the CPU (%s)\n",
			 why);
	p->be = &loom_cpu_backend;
	return LOOM_OK;
}

/* The backend, and what its optimizer cannot do refused. */
static loom_status device_run(loom_program *p, loom_pass_ctx *c)
{
	(void)c;
	const loom_optim_opts *o = &p->plan.opts.optim;
	loom_status st;
	if ((st = pick_backend(p)) != LOOM_OK)
		return st;
	/* amp.fp8's roundings (FP8_QDQ, amp/amp_pass.c): one line, not a
	 * refusal per node from the backend plan. */
	for (int v = 0; v < p->plan.g->n; v++)
		if (p->plan.g->nodes[v].op == LOOM_OP_FP8_QDQ &&
		    !p->be->supports_op(p->be_ctx, LOOM_OP_FP8_QDQ))
			return loom_program_fail(p, LOOM_ERR_UNSUPPORTED,
						 "amp: fp8 is emulated on the CPU only for now: the %s "
						 "backend has no fp8 kernels (use the CPU device, or "
						 "precision bf16)", p->be->name);
	if ((o->clip_grad > 0 || o->decay_matrices_only) && o->kind != LOOM_OPTIM_NONE &&
	    !(p->be->caps & LOOM_BE_CLIPS_GRAD))
		return loom_program_fail(p, LOOM_ERR_UNSUPPORTED,
					 "optimizer: the %s backend's optimizer has no %s yet",
					 p->be->name,
					 o->clip_grad > 0 ? "clip_grad" : "decay_matrices_only");
	return LOOM_OK;
}

const loom_pass loom_pass_device = { .name = "device", .run = device_run };

/* ------------------------------------------------------------ fuse */

/* The planner's fusions the backend has kernels for (none: no_fusion). */
static loom_status fuse_run(loom_program *p, loom_pass_ctx *c)
{
	(void)c;
	unsigned caps = p->plan.opts.no_fusion ? 0 : p->be->caps;
	if (caps & LOOM_BE_FUSES_RELU_POOL)
		loom_fuse_relu_pool(p->plan.g);
	if (caps & LOOM_BE_FUSES_LINEAR_RELU)
		loom_fuse_linear_relu(p->plan.g);
	/* After the pool fusion: a relu that feeds a pool stays the pool's. */
	if (caps & LOOM_BE_FUSES_BN_RELU)
		loom_fuse_bn_relu(p->plan.g);
	if (caps & LOOM_BE_FUSES_ADD_RELU)
		loom_fuse_add_relu(p->plan.g);
	if (caps & LOOM_BE_FUSES_SIBLINGS)
		loom_fuse_siblings(p->plan.g);
	const loom_backend_planning *pn = p->be->planning;
	if (caps & LOOM_BE_FUSES_ATTENTION)
		loom_fuse_attention(p->plan.g, pn ? pn->attn_fusable : NULL);
	if (caps & LOOM_BE_FUSES_CASTS)
		loom_fuse_casts(p->plan.g);
	else if ((caps & LOOM_BE_FUSES_SOME_CASTS) && pn && pn->takes_any_dtype)
		loom_fuse_casts_for(p->plan.g, pn->takes_any_dtype);
	/* After the casts: the dtypes the fused kernel sees are the plan's. */
	if ((caps & LOOM_BE_FUSES_LN_RESIDUAL) && pn && pn->ln_residual_fusable)
		loom_fuse_ln_residual(p->plan.g, pn->ln_residual_fusable);
	if ((caps & LOOM_BE_FUSES_LN_BWD_ACCUM) && pn && pn->ln_bwd_accum_fusable)
		loom_fuse_ln_bwd_accum(p->plan.g, pn->ln_bwd_accum_fusable);
	/* The same question, asked of an embedding's backward. */
	if ((caps & LOOM_BE_FUSES_LN_BWD_ACCUM) && pn && pn->ln_bwd_accum_fusable)
		loom_fuse_emb_bwd_accum(p->plan.g, pn->ln_bwd_accum_fusable);
	return LOOM_OK;
}

const loom_pass loom_pass_fuse = { .name = "fuse", .run = fuse_run };

/* ------------------------------------------------------------ fp8 storage */

/* LOOM_FP8_STORAGE (default on), amp.fp8, and a backend whose products
 * decode fp8 operands; not with pipeline stages, whose transport sends a
 * value in its dtype's bytes. */
static int fp8_storage_wanted(const loom_program *p)
{
	const loom_backend_planning *pn = p->be->planning;
	return p->plan.opts.amp.fp8 && p->plan.opts.pipeline_stages <= 1 && pn && pn->reads_fp8 &&
	       loom_opt_bool(LOOM_OPT_FP8_STORAGE);
}

/* A view of all of x's elements from its start (a product's [rows,
 * features] reshape): its readers read x's bytes. */
static int whole_view(const loom_graph *g, const loom_node *n, loom_value x)
{
	return n->view_off == 0 &&
	       loom_shape_numel(&n->shape) == loom_shape_numel(&g->nodes[x].shape);
}

/* Whether every reader of x reads it as fp8 codes: a node the backend says
 * decodes that source, or a whole view of x whose readers all do. */
static int read_as_fp8(const loom_graph *g, loom_value x,
		       int (*reads_fp8)(const loom_graph *, loom_value, int))
{
	for (int u = x + 1; u < g->n; u++) {
		const loom_node *n = &g->nodes[u];
		for (int i = 0; i < n->nsrc; i++) {
			if (n->src[i] != x)
				continue;
			if (loom_op_is_view(n->op) ? !whole_view(g, n, x) || !read_as_fp8(g, u, reads_fp8) :
						     !reads_fp8(g, u, i))
				return 0;
		}
	}
	return 1;
}

/*
 * Each fp8 rounding (FP8_QDQ through E4M3 or E5M2) that only products
 * read is stored as its fp8 codes, one byte an element, and its scale
 * (a.fp8.store: graph/ops/ops.h): the activations a product keeps for its
 * backward take a quarter (f32) or half (bf16) of the bytes, and the
 * memory plan after this pass counts them so. The readers decode to the
 * bits the rounding writes unstored: the same losses. Not an output, not
 * f64 (the gradient checks keep their own precision).
 */
static loom_status fp8_storage_run(loom_program *p, loom_pass_ctx *c)
{
	(void)c;
	loom_graph *g = p->plan.g;
	for (int v = 0; v < g->n; v++) {
		loom_node *n = &g->nodes[v];
		if (n->op != LOOM_OP_FP8_QDQ || (n->flags & LOOM_NODE_OUTPUT) ||
		    (n->a.fp8.fwd != LOOM_FP8_E4M3 && n->a.fp8.fwd != LOOM_FP8_E5M2) ||
		    n->dtype == LOOM_F64 || g->nodes[n->src[0]].dtype == LOOM_F64)
			continue;
		n->a.fp8.store = read_as_fp8(g, v, p->be->planning->reads_fp8);
	}
	return LOOM_OK;
}

const loom_pass loom_pass_fp8_storage = { .name = "fp8 storage", .wanted = fp8_storage_wanted,
					  .run = fp8_storage_run };

/* ------------------------------------------------------------ slots */

/* Whether an embedding reads v (or a cast of it) as its table. */
static int is_embedding_table(const loom_graph *g, int n_fwd, loom_value v)
{
	for (int u = 0; u < n_fwd; u++) {
		const loom_node *nd = &g->nodes[u];
		if (nd->op != LOOM_OP_EMBEDDING)
			continue;
		loom_value t = nd->src[1];
		while (g->nodes[t].op == LOOM_OP_CAST)
			t = g->nodes[t].src[0];
		if (t == v)
			return 1;
	}
	return 0;
}

/* Parameter slots and their optimizer state (momentum buffers, Adam m/v),
 * in f32 for half models (the master's dtype) and the param's dtype else. */
static loom_status slots_run(loom_program *p, loom_pass_ctx *c)
{
	(void)c;
	loom_graph *g = p->plan.g;
	int n = 0;
	for (int v = 0; v < p->plan.n_fwd; v++)
		if (g->nodes[v].op == LOOM_OP_PARAM && g->nodes[v].grad != LOOM_NONE)
			n++;
	p->plan.params = calloc(n ? n : 1, sizeof(*p->plan.params));
	if (!p->plan.params)
		return loom_program_fail(p, LOOM_ERR_NOMEM, "out of memory for %d parameter slots", n);
	int nstate = p->plan.n_state = loom_optim_state_count(&p->plan.opts.optim);
	size_t off = 0;
	for (int v = 0; v < p->plan.n_fwd; v++) {
		loom_node *nd = &g->nodes[v];
		if (nd->op != LOOM_OP_PARAM || nd->grad == LOOM_NONE)
			continue;
		loom_param_slot *s = &p->plan.params[p->plan.n_params++];
		s->param = v;
		s->grad = nd->grad;
		s->master = nd->master;
		s->numel = loom_shape_numel(&nd->shape);
		s->matrix = nd->shape.ndim >= 2 && !is_embedding_table(g, p->plan.n_fwd, v);
		s->state_dtype = nd->master != LOOM_NONE ? g->nodes[nd->master].dtype :
			       (nd->dtype == LOOM_F64 ? LOOM_F64 : LOOM_F32);
		size_t sz = ((size_t)s->numel * loom_dtype_size(s->state_dtype) + 63) & ~(size_t)63;
		for (int k = 0; k < nstate; k++) {
			s->state_off[k] = off;
			off += sz;
		}
		if (nd->master != LOOM_NONE)
			p->plan.master_bytes += loom_value_bytes(p, nd->master);
	}
	p->plan.state_bytes = off;
	return LOOM_OK;
}

const loom_pass loom_pass_slots = { .name = "slots", .run = slots_run };

/* ------------------------------------------------------------ memory plan */

/* Unless a strategy laid its buckets out with the memory plan already. */
static int memory_plan_wanted(const loom_program *p)
{
	return !p->plan.mp.region;
}

/* The plain memory plan: of the values this rank holds (c->held). */
static loom_status memory_plan_run(loom_program *p, loom_pass_ctx *c)
{
	loom_status st = loom_memplan_build_held(p->plan.g, NULL, NULL, c->held, &p->plan.mp);
	return st != LOOM_OK ? loom_program_fail(p, st, "memory planning: out of memory") : LOOM_OK;
}

const loom_pass loom_pass_memory_plan = {
	.name = "memory plan", .wanted = memory_plan_wanted, .run = memory_plan_run
};

/* ------------------------------------------------------------ accumulation */

static loom_status accumulation_run(loom_program *p, loom_pass_ctx *c)
{
	(void)c;
	loom_status st = loom_accum_plan(&p->plan);
	return st != LOOM_OK ? loom_program_fail(p, st, "gradient accumulation: out of memory")
			     : LOOM_OK;
}

const loom_pass loom_pass_accumulation = { .name = "accumulation", .run = accumulation_run };

/* ------------------------------------------------------------ steps */

/* The step list of a plain (or data-parallel) plan; strategies after
 * this pass rewrite it. */
static loom_status steps_run(loom_program *p, loom_pass_ctx *c)
{
	(void)c;
	loom_status st;
	if ((st = loom_pieces_plain(&p->plan)) != LOOM_OK ||
	    (st = loom_steps_build(&p->plan)) != LOOM_OK)
		return loom_program_fail(p, st, "steps: out of memory");
	return LOOM_OK;
}

const loom_pass loom_pass_steps = { .name = "steps", .run = steps_run };

/* ------------------------------------------------------------ backend prepare */

size_t loom_plan_peak(const loom_plan *pl, size_t extra)
{
	return pl->mp.persist_bytes + pl->mp.bucket_bytes + pl->mp.act_bytes + pl->ws_bytes +
	       loom_plan_state_region_bytes(pl) + extra;
}

/* loom_compile_opts.memory_limit_mb: refused before anything is allocated. */
static loom_status check_memory_limit(loom_program *p)
{
	double limit = p->plan.opts.memory_limit_mb;
	double peak = loom_plan_peak(&p->plan, p->peak_extra) / 1048576.0;
	char rc[80] = "";
	if (p->plan.n_recomputed > 0)
		snprintf(rc, sizeof(rc), ", with %d activations made again (recompute %d)",
			 p->plan.n_recomputed, p->plan.opts.recompute);
	if (limit > 0 && peak > limit)
		return loom_program_fail(p, LOOM_ERR_NOMEM,
					 "the planned peak of %.2f MiB (activations %.2f, persistent "
					 "%.2f, optimizer state %.2f, workspace %.2f%s) exceeds the memory "
					 "limit of %.2f MiB", peak, p->plan.mp.act_bytes / 1048576.0,
					 p->plan.mp.persist_bytes / 1048576.0,
					 p->plan.state_bytes / 1048576.0, p->plan.ws_bytes / 1048576.0, rc,
					 limit);
	return LOOM_OK;
}

loom_status loom_pass_backend_failed(loom_program *p, loom_status st)
{
	char msg[LOOM_ERR_MAX];
	snprintf(msg, sizeof(msg), "%s", p->err.msg);
	return loom_program_fail(p, st, "backend %s: %s", p->be->name, msg);
}

/* The backend's context, what it runs (every node a step runs, asked with
 * its dtypes and shapes), its per-node plans and workspace. */
static loom_status backend_plan_run(loom_program *p, loom_pass_ctx *c)
{
	(void)c;
	const loom_backend *be = p->be;
	loom_status st;

	if ((st = be->init(&p->be_ctx, p->err.msg, sizeof(p->err.msg))) != LOOM_OK)
		return loom_pass_backend_failed(p, st);
	if ((st = loom_exec_check_support(p)) != LOOM_OK)
		return loom_pass_backend_failed(p, st);
	if ((st = be->plan_create(p->be_ctx, &p->plan, &p->plan.ws_bytes)) != LOOM_OK)
		return loom_pass_backend_failed(p, loom_program_backend_fail(p, st));
	return LOOM_OK;
}

const loom_pass loom_pass_backend_plan = { .name = "backend plan", .run = backend_plan_run };

/* The memory limit (every strategy's limit checked before it), then the
 * backend's arena. */
static loom_status backend_alloc_run(loom_program *p, loom_pass_ctx *c)
{
	(void)c;
	loom_status st;
	if ((st = check_memory_limit(p)) != LOOM_OK)
		return loom_pass_backend_failed(p, st);
	if ((st = p->be->alloc(p->be_ctx, &p->plan, &p->ts, &p->arena)) != LOOM_OK)
		return loom_pass_backend_failed(p, loom_program_backend_fail(p, st));
	return LOOM_OK;
}

const loom_pass loom_pass_backend_alloc = { .name = "backend arena", .run = backend_alloc_run };

/* ------------------------------------------------------------ initial values */

/* Whether the group's device communicator max-reduces in stream order
 * (fp8's amaxes at a device's step end, engine/exec.c). */
static int device_max_reduces(loom_program *p)
{
	loom_comm *dev = loom_pg_comm_if(p->plan.opts.pg, LOOM_COMM_DEVICE);
	return dev && dev->i->allreduce_max_ordered && dev->i->allreduce_ordered;
}

/* Where delayed scaling can run: the CPU (the kernels read and write
 * ts.fp8 in host memory) and a device backend that keeps the state on the
 * device (loom_backend_fp8), across ranks where it packs the amaxes
 * (fp8_reduce_begin) and the device communicator has a max. Elsewhere the
 * default falls back to current scaling (*delayed = 0) and asking for
 * delayed is refused, naming the backend. */
static loom_status fp8_delayed_where(loom_program *p, int *delayed)
{
	const loom_amp_opts *o = &p->plan.opts.amp;
	const loom_pg_info *pi = p->plan.opts.pg ? loom_pg_get_info(p->plan.opts.pg) : NULL;
	const int world = pi && pi->world > 1 ? pi->world : 1;
	const char *why = NULL;
	if (p->be->caps & LOOM_BE_HOST_MEMORY)
		return LOOM_OK;
	if (!p->be->fp8)
		why = "its fp8 kernels take each cast's scale from its own amax";
	else if (world > 1 && (!p->be->fp8->fp8_reduce_begin || !device_max_reduces(p)))
		why = "its scales live on the device and its communicator cannot max-reduce "
		      "them across the ranks in stream order";
	/* a device backend defaults to current scaling until a lease
	 * measures both recipes (engine/cuda/README.md) */
	if (!why && o->fp8_scaling == LOOM_FP8_SCALING_DELAYED)
		return LOOM_OK;
	*delayed = 0;
	if (why && o->fp8_scaling == LOOM_FP8_SCALING_DELAYED)
		return loom_program_fail(p, LOOM_ERR_UNSUPPORTED,
					 "amp: fp8 delayed scaling on the %s backend: %s "
					 "(use --fp8-scaling current)",
					 p->be->name, why);
	return LOOM_OK;
}

/* amp.fp8's scaled tensors: each FP8_QDQ node that rounds through a
 * format gets its slot (a.fp8.slot) in the training state's scales, in
 * node order, the same on every rank; scales 1, histories empty. */
static loom_status fp8_tensors(loom_program *p)
{
	loom_graph *g = p->plan.g;
	const loom_amp_opts *o = &p->plan.opts.amp;
	int n = 0;
	for (int v = 0; v < g->n; v++) {
		loom_node *nd = &g->nodes[v];
		if (nd->op == LOOM_OP_FP8_QDQ)
			nd->a.fp8.slot = nd->a.fp8.fwd == LOOM_FP8_E4M3 || nd->a.fp8.fwd == LOOM_FP8_E5M2 ?
						 n++ : -1;
	}
	int delayed = loom_fp8_recipe(o) == LOOM_FP8_SCALING_DELAYED;
	loom_status st = n > 0 && delayed ? fp8_delayed_where(p, &delayed) : LOOM_OK;
	if (st != LOOM_OK)
		return st;
	loom_fp8_state_free(&p->ts.fp8);
	if (loom_fp8_state_init(&p->ts.fp8, n, delayed, loom_fp8_history(o), o->fp8_margin))
		return loom_program_fail(p, LOOM_ERR_NOMEM, "out of memory for fp8 scales");
	for (int v = 0; v < g->n; v++) {
		loom_node *nd = &g->nodes[v];
		if (nd->op == LOOM_OP_FP8_QDQ) {
			nd->a.fp8.history = p->ts.fp8.history_len;
			nd->a.fp8.margin = p->ts.fp8.margin;
		}
		if (nd->op == LOOM_OP_FP8_QDQ && nd->a.fp8.slot >= 0) {
			p->ts.fp8.node[nd->a.fp8.slot] = v;
			loom_fp8_tensor *t = &p->ts.fp8.t[nd->a.fp8.slot];
			t->fmt = nd->a.fp8.fwd;
			t->fmax = t->fmt == LOOM_FP8_E4M3 ? LOOM_E4M3_MAX : LOOM_E5M2_MAX;
		}
	}
	/* a device backend's copy of the state (allocated here; under
	 * current scaling what its casts record for the report) */
	if (p->ts.fp8.n > 0 && p->be->fp8 &&
	    (st = p->be->fp8->fp8_upload(p->be_ctx, &p->ts.fp8)) != LOOM_OK)
		return loom_pass_backend_failed(p, loom_program_backend_fail(p, st));
	return LOOM_OK;
}

/* Writes the initial parameters and buffers (and masters) into the arena,
 * and sets up fp8's scales. */
static loom_status initial_values_run(loom_program *p, loom_pass_ctx *c)
{
	(void)c;
	loom_graph *g = p->plan.g;
	loom_status fst = fp8_tensors(p);
	if (fst != LOOM_OK)
		return fst;
	for (int v = 0; v < p->plan.n_fwd; v++) {
		loom_node *nd = &g->nodes[v];
		/* ZeRO's sharded masters: loom_zero_start; another stage's: none */
		if ((nd->op != LOOM_OP_PARAM && nd->op != LOOM_OP_BUFFER) ||
		    (nd->flags & LOOM_NODE_SHARDED) || !loom_plan_holds(&p->plan, v))
			continue;
		size_t bytes = loom_value_bytes(p, v);
		void *tmp = malloc(bytes ? bytes : 1);
		if (!tmp)
			return loom_program_fail(p, LOOM_ERR_NOMEM, "out of memory initialising '%s'",
						 nd->name);
		loom_init_value(g, v, tmp);
		loom_status st = loom_program_upload(p, loom_value_ptr(p, v), tmp, bytes);
		free(tmp);
		if (st != LOOM_OK) {
			char msg[LOOM_ERR_MAX];
			snprintf(msg, sizeof(msg), "%s", p->err.msg);
			return loom_program_fail(p, st, "initialising '%s': %s", nd->name, msg);
		}
	}
	if (p->plan.state_bytes) {
		void *zero = calloc(1, p->plan.state_bytes);
		if (!zero)
			return loom_program_fail(p, LOOM_ERR_NOMEM, "out of memory for optimizer state");
		loom_status st = loom_program_upload(p, p->arena.state, zero, p->plan.state_bytes);
		free(zero);
		if (st != LOOM_OK) {
			char msg[LOOM_ERR_MAX];
			snprintf(msg, sizeof(msg), "%s", p->err.msg);
			return loom_program_fail(p, st, "optimizer state: %s", msg);
		}
	}
	return LOOM_OK;
}

const loom_pass loom_pass_initial_values = { .name = "initial values", .run = initial_values_run };
