/*
 * engine/program.c — loom_compile and the run-time API of a program: the
 * compile pipeline (clone, AMP pass, autodiff, memory plan, backend), the
 * per-step executor entry points, and access to values by handle.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amp/amp_pass.h"
#include "comm/comm.h"
#include "parallel/parallel.h"
#include "parallel/pipeline.h"
#include "engine/elem.h"
#include "base/cuda_plugin.h"
#include "engine/program_internal.h"
#include "engine/trace.h"
#include "graph/ops/ops.h"

static __thread char last_error[512];

const char *loom_last_error(void)
{
	return last_error;
}

static loom_status compile_fail(loom_status st, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static loom_status compile_fail(loom_status st, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(last_error, sizeof(last_error), fmt, ap);
	va_end(ap);
	return st;
}

const char *loom_program_error(const loom_program *p)
{
	return p ? p->err : "null program";
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
}

static loom_status check_optim(const loom_optim_opts *o)
{
	if ((unsigned)o->kind >= LOOM_OPTIM_COUNT)
		return compile_fail(LOOM_ERR_INVALID, "optimizer: unknown kind %d", (int)o->kind);
	if (o->kind == LOOM_OPTIM_NONE)
		return LOOM_OK;
	if (!(o->lr >= 0) || !isfinite(o->lr))
		return compile_fail(LOOM_ERR_INVALID, "optimizer: learning rate %g must be >= 0", o->lr);
	if (!(o->weight_decay >= 0))
		return compile_fail(LOOM_ERR_INVALID, "optimizer: weight decay %g must be >= 0",
				    o->weight_decay);
	if (!(o->clip_grad >= 0) || !isfinite(o->clip_grad))
		return compile_fail(LOOM_ERR_INVALID, "optimizer: clip_grad %g must be >= 0",
				    o->clip_grad);
	if (o->kind == LOOM_OPTIM_SGD) {
		if (!(o->momentum >= 0))
			return compile_fail(LOOM_ERR_INVALID, "sgd: momentum %g must be >= 0", o->momentum);
		if (o->nesterov && (o->momentum <= 0 || o->dampening != 0))
			return compile_fail(LOOM_ERR_INVALID,
					    "sgd: nesterov needs a momentum and zero dampening");
	} else {
		if (!(o->beta1 >= 0 && o->beta1 < 1) || !(o->beta2 >= 0 && o->beta2 < 1))
			return compile_fail(LOOM_ERR_INVALID, "adamw: betas (%g, %g) must be in [0, 1)",
					    o->beta1, o->beta2);
		if (!(o->eps > 0))
			return compile_fail(LOOM_ERR_INVALID, "adamw: eps %g must be > 0", o->eps);
	}
	return LOOM_OK;
}

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
		return compile_fail(LOOM_ERR_INVALID, "device: unknown value %d",
				    (int)p->plan.opts.device);
	have_cuda = loom_cuda_probe(why, sizeof why) > 0;
	pl = have_cuda ? loom_cuda_plugin_load(why, sizeof why) : NULL;
	if (pl) {
		p->be = pl->backend();
		return LOOM_OK;
	}
	if (p->plan.opts.device == LOOM_DEVICE_CUDA)
		return compile_fail(LOOM_ERR_UNSUPPORTED, "device cuda: %s%s",
				    have_cuda ? "" : "no CUDA device is available: ", why);
	static int told;
	if (!told++)
		loom_log(have_cuda ? "loom: a CUDA device was found but %s; running on the CPU\n"
				   : "loom: no CUDA device found, running on the CPU (%s)\n",
			 why);
	p->be = &loom_cpu_backend;
	return LOOM_OK;
}

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
static loom_status make_slots(loom_program *p)
{
	loom_graph *g = p->plan.g;
	int n = 0;
	for (int v = 0; v < p->plan.n_fwd; v++)
		if (g->nodes[v].op == LOOM_OP_PARAM && g->nodes[v].grad != LOOM_NONE)
			n++;
	p->plan.params = calloc(n ? n : 1, sizeof(*p->plan.params));
	if (!p->plan.params)
		return compile_fail(LOOM_ERR_NOMEM, "out of memory for %d parameter slots", n);
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

/* Writes the initial parameters and buffers (and masters) into the arena. */
static loom_status init_values(loom_program *p)
{
	loom_graph *g = p->plan.g;
	for (int v = 0; v < p->plan.n_fwd; v++) {
		loom_node *nd = &g->nodes[v];
		/* ZeRO's sharded masters: loom_zero_start; another stage's: none */
		if ((nd->op != LOOM_OP_PARAM && nd->op != LOOM_OP_BUFFER) ||
		    (nd->flags & LOOM_NODE_SHARDED) || !loom_plan_holds(&p->plan, v))
			continue;
		size_t bytes = loom_value_bytes(p, v);
		void *tmp = malloc(bytes ? bytes : 1);
		if (!tmp)
			return compile_fail(LOOM_ERR_NOMEM, "out of memory initialising '%s'", nd->name);
		loom_init_value(g, v, tmp);
		loom_status st = loom_program_upload(p, loom_value_ptr(p, v), tmp, bytes);
		free(tmp);
		if (st != LOOM_OK)
			return compile_fail(st, "initialising '%s': %s", nd->name, p->err);
	}
	if (p->plan.state_bytes) {
		void *zero = calloc(1, p->plan.state_bytes);
		if (!zero)
			return compile_fail(LOOM_ERR_NOMEM, "out of memory for optimizer state");
		loom_status st = loom_program_upload(p, p->arena.state, zero, p->plan.state_bytes);
		free(zero);
		if (st != LOOM_OK)
			return compile_fail(st, "optimizer state: %s", p->err);
	}
	return LOOM_OK;
}

/* This rank's planned peak: the arena, and the accumulation sums a
 * pipeline of several micro-batches allocates at its first step. */
static size_t planned_peak(const loom_plan *pl)
{
	size_t accum = pl->pipe && pl->pipe->micro > 1 ? pl->accum_bytes : 0;
	return pl->mp.persist_bytes + pl->mp.bucket_bytes + pl->mp.act_bytes + pl->ws_bytes +
	       pl->state_bytes + accum;
}

/* loom_compile_opts.memory_limit_mb: refused before anything is allocated.
 * Pipeline stages first: every rank checks every stage, so that all refuse
 * together (and may try another cut together, loom_compile). */
static loom_status check_memory_limit(loom_program *p)
{
	double limit = p->plan.opts.memory_limit_mb;
	double peak = planned_peak(&p->plan) / 1048576.0;
	if (p->plan.pipe) {
		char msg[400];
		loom_status st = loom_pipeline_limit(p, msg, sizeof(msg));
		if (st != LOOM_OK)
			return loom_program_fail(p, st, "%s", msg);
	}
	if (limit > 0 && peak > limit)
		return loom_program_fail(p, LOOM_ERR_NOMEM,
					 "the planned peak of %.2f MiB (activations %.2f, persistent "
					 "%.2f, optimizer state %.2f, workspace %.2f) exceeds the memory "
					 "limit of %.2f MiB", peak, p->plan.mp.act_bytes / 1048576.0,
					 p->plan.mp.persist_bytes / 1048576.0,
					 p->plan.state_bytes / 1048576.0, p->plan.ws_bytes / 1048576.0, limit);
	return LOOM_OK;
}

/* The backend's context, what it runs (every node a step runs, asked with
 * its dtypes and shapes), its per-node plans, then its arena. */
static loom_status backend_prepare(loom_program *p)
{
	const loom_backend *be = p->be;
	loom_status st;

	if ((st = be->init(&p->be_ctx, p->err, sizeof(p->err))) != LOOM_OK)
		return st;
	if ((st = loom_exec_check_support(p)) != LOOM_OK)
		return st;
	if ((st = be->plan_create(p->be_ctx, &p->plan, &p->plan.ws_bytes)) != LOOM_OK)
		return loom_program_backend_fail(p, st);
	if ((st = check_memory_limit(p)) != LOOM_OK)
		return st;
	if ((st = be->alloc(p->be_ctx, &p->plan, &p->ts, &p->arena)) != LOOM_OK)
		return loom_program_backend_fail(p, st);
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
	size_t grads = 0, accum = pl->pipe && pl->pipe->micro > 1 ? pl->accum_bytes : 0;
	for (int i = 0; i < pl->n_params; i++)
		if (loom_plan_holds(pl, pl->params[i].grad))
			grads += loom_plan_value_bytes(pl, pl->params[i].grad);
	size_t total = planned_peak(pl);
	char where[64] = "";
	if (pl->pipe)
		snprintf(where, sizeof(where), " (stage %d, %d activation slots of %.2f MiB)",
			 pl->pipe->stage, pl->pipe->slots, pl->pipe->slot_bytes / 1048576.0);
	loom_log("loom: rank %d%s: planned peak %.2f MiB = persistent %.2f (gradients %.2f) + "
		 "buckets %.2f + activations %.2f + workspace %.2f + optimizer state %.2f + "
		 "accumulation %.2f\n",
		 in ? in->rank : 0, where, total / 1048576.0, pl->mp.persist_bytes / 1048576.0,
		 grads / 1048576.0, pl->mp.bucket_bytes / 1048576.0, pl->mp.act_bytes / 1048576.0,
		 pl->ws_bytes / 1048576.0, pl->state_bytes / 1048576.0, accum / 1048576.0);
}

/* One compile of g; `rebalanced`: pipeline stages cut by memory because
 * the time-balanced cut was over the memory limit (loom_compile). */
static loom_status compile_one(loom_graph *g, loom_value loss, const loom_compile_opts *o,
			       int rebalanced, loom_program **out)
{
	loom_status st;
	char lb[96];
	last_error[0] = 0;
	if (!out)
		return compile_fail(LOOM_ERR_INVALID, "loom_compile: out is NULL");
	*out = NULL;
	if (!g)
		return compile_fail(LOOM_ERR_INVALID, "loom_compile: graph is NULL");
	if (g->err != LOOM_OK)
		return compile_fail(g->err, "%s", g->errmsg);
	if (loss < 0 || loss >= g->n)
		return compile_fail(LOOM_ERR_INVALID, "loom_compile: the loss (%d) is not a value",
				    (int)loss);
	if (g->nodes[loss].shape.ndim != 0)
		return compile_fail(LOOM_ERR_SHAPE, "loom_compile: the loss %s is not a scalar",
				    loom_node_label(g, loss, lb, sizeof(lb)));
	loom_compile_opts def;
	if (!o) {
		loom_compile_opts_default(&def);
		o = &def;
	}
	if ((st = check_optim(&o->optim)) != LOOM_OK)
		return st;
	if ((unsigned)o->device >= LOOM_DEVICE_COUNT)
		return compile_fail(LOOM_ERR_INVALID, "device: unknown value %d", (int)o->device);
	if ((unsigned)o->kernel_search >= LOOM_KERNEL_SEARCH_COUNT)
		return compile_fail(LOOM_ERR_INVALID, "kernel_search: unknown value %d",
				    o->kernel_search);
	if (!(o->kernel_search_ms >= 0))
		return compile_fail(LOOM_ERR_INVALID, "kernel_search_ms %g must be >= 0",
				    o->kernel_search_ms);

	if (o->inference && loom_ddp_world(o) > 1)
		return compile_fail(LOOM_ERR_UNSUPPORTED,
				    "loom_compile: a forward-only (inference) plan is for one process");

	loom_program *p = calloc(1, sizeof(*p));
	if (!p)
		return compile_fail(LOOM_ERR_NOMEM, "out of memory");
	p->plan.opts = *o;
	if (o->inference) /* no gradients: nothing to optimize */
		p->plan.opts.optim.kind = LOOM_OPTIM_NONE;
	p->ts.lr = o->optim.lr;
	p->ts.first_nonfinite = LOOM_NONE;
	p->plan.fingerprint = mix(loom_graph_fingerprint(g),
			     (uint64_t)p->plan.opts.optim.kind * 131 + (uint64_t)o->amp.level * 7 +
				     (uint64_t)o->amp.half + (o->inference ? 0x1f00dull : 0));
	if ((st = loom_graph_clone(g, &p->plan.g)) != LOOM_OK) {
		compile_fail(st, "out of memory copying the graph");
		goto out_fail;
	}
	p->plan.g->nodes[loss].flags |= LOOM_NODE_OUTPUT;

	/* AMP: casts, half parameters with f32 masters, the loss scale. */
	char amsg[256] = "";
	if ((st = loom_amp_pass(p->plan.g, &loss, &o->amp, !o->inference, amsg, sizeof(amsg))) !=
	    LOOM_OK) {
		compile_fail(st, "%s", amsg);
		goto out_fail;
	}
	p->plan.loss = loss;
	p->plan.scaling = loom_amp_uses_scaling(&o->amp);
	float init = o->amp.static_scale > 0 ? (float)o->amp.static_scale :
		     p->plan.scaling ? (float)o->amp.init_scale : 1.0f;
	if (loom_scaler_init(&p->ts.scaler, init, o->amp.growth_interval > 0 ? o->amp.growth_interval : 2000,
			     p->plan.scaling && !(o->amp.static_scale > 0)) != 0) {
		compile_fail(LOOM_ERR_INVALID, "amp: loss scale %g / growth interval %d invalid",
			     o->amp.init_scale, o->amp.growth_interval);
		st = LOOM_ERR_INVALID;
		goto out_fail;
	}

	p->plan.n_fwd = p->plan.g->n;
	if (!o->inference && (st = loom_autodiff(p->plan.g, p->plan.loss)) != LOOM_OK) {
		compile_fail(st, "%s", p->plan.g->errmsg);
		goto out_fail;
	}
	if ((st = pick_backend(p)) != LOOM_OK)
		goto out_fail;
	if ((o->optim.clip_grad > 0 || o->optim.decay_matrices_only) &&
	    p->plan.opts.optim.kind != LOOM_OPTIM_NONE && !(p->be->caps & LOOM_BE_CLIPS_GRAD)) {
		st = compile_fail(LOOM_ERR_UNSUPPORTED,
				  "optimizer: the %s backend's optimizer has no %s yet",
				  p->be->name, o->optim.clip_grad > 0 ? "clip_grad" : "decay_matrices_only");
		goto out_fail;
	}
	if (o->optim.clip_grad > 0 && o->pipeline_stages > 1) {
		st = compile_fail(LOOM_ERR_UNSUPPORTED,
				  "optimizer: clip_grad is not supported with pipeline stages yet (each "
				  "stage holds its own gradients; the norm needs their sum)");
		goto out_fail;
	}
	/* Planner passes, then the memory plan of what remains. */
	unsigned caps = o->no_fusion ? 0 : p->be->caps;
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
	if (caps & LOOM_BE_FUSES_ATTENTION)
		loom_fuse_attention(p->plan.g, p->be->attn_fusable);
	if (caps & LOOM_BE_FUSES_CASTS)
		loom_fuse_casts(p->plan.g);
	if ((st = make_slots(p)) != LOOM_OK)
		goto out_fail;
	/* Data parallelism: gradient buckets and their all-reduces, then the
	 * memory plan that lays the buckets out; else the plain plan. */
	p->plan.world = loom_ddp_world(o);
	if (o->pipeline_stages > 1) {
		/* Pipeline stages: the world is stages x replicas; the data
		 * parallelism is among a stage's replicas. */
		char pmsg[256];
		if ((st = loom_pipeline_check(o, p->plan.world, pmsg, sizeof(pmsg))) != LOOM_OK) {
			compile_fail(st, "%s", pmsg);
			goto out_fail;
		}
		p->plan.world /= o->pipeline_stages;
		if ((st = loom_pipeline_assign(p, pmsg, sizeof(pmsg))) != LOOM_OK) {
			compile_fail(st, "%s", pmsg);
			goto out_fail;
		}
		p->plan.pipe->rebalanced = rebalanced;
	}
	if (p->plan.world > 1) {
		char dmsg[256];
		if ((st = loom_ddp_plan(p, dmsg, sizeof(dmsg))) != LOOM_OK) {
			compile_fail(st, "%s", dmsg);
			goto out_fail;
		}
	} else {
		if (o->sync_bn && loom_ddp_test_sync_one_rank)
			loom_ddp_mark_sync_bn(p->plan.g);
		/* Pipeline stages: the values this rank's stage touches only. */
		unsigned char *held = NULL;
		if ((st = loom_pipeline_held(&p->plan, &held)) == LOOM_OK)
			st = loom_memplan_build_held(p->plan.g, NULL, NULL, held, &p->plan.mp);
		free(held);
		if (st != LOOM_OK) {
			compile_fail(st, "memory planning: out of memory");
			goto out_fail;
		}
	}
	if ((st = loom_accum_plan(&p->plan)) != LOOM_OK) {
		compile_fail(st, "gradient accumulation: out of memory");
		goto out_fail;
	}
	/* The step list, then the strategy passes that rewrite it. */
	if ((st = loom_pieces_plain(&p->plan)) != LOOM_OK ||
	    (st = loom_steps_build(&p->plan)) != LOOM_OK) {
		compile_fail(st, "steps: out of memory");
		goto out_fail;
	}
	if (p->plan.zero) {
		char zmsg[256];
		if ((st = loom_zero_plan(&p->plan, p->be, zmsg, sizeof(zmsg))) != LOOM_OK) {
			compile_fail(st, "%s", zmsg);
			goto out_fail;
		}
	}
	if (o->pipeline_stages > 1) {
		char pmsg[256];
		if ((st = loom_pipeline_plan(p, pmsg, sizeof(pmsg))) != LOOM_OK) {
			compile_fail(st, "%s", pmsg);
			goto out_fail;
		}
	}
	if ((st = backend_prepare(p)) != LOOM_OK) {
		compile_fail(st, "backend %s: %s", p->be->name, p->err);
		goto out_fail;
	}
	if ((st = init_values(p)) != LOOM_OK)
		goto out_fail;
	if (p->plan.world > 1 && !p->plan.pipe &&
	    ((st = loom_ddp_start(p)) != LOOM_OK || (st = loom_exec_synchronize(p)) != LOOM_OK)) {
		compile_fail(st, "%s", p->err);
		goto out_fail;
	}
	if (p->plan.pipe) {
		p->plan.pipe->act_base = p->arena.act;
		if ((st = loom_pipeline_start(p)) != LOOM_OK) {
			compile_fail(st, "%s", p->err);
			goto out_fail;
		}
	}
	if (o->memory_report)
		memory_report(p);
	if (o->verbose) {
		loom_program_info info;
		loom_program_info_get(p, &info);
		loom_log("loom: compiled %d nodes (%d forward) on %s: arena %.2f MiB "
			"(params %.2f, grads %.2f, optimizer %.2f, activations %.2f of %.2f naive)\n",
			info.n_nodes, p->plan.n_fwd, info.backend, info.arena_bytes / 1048576.0,
			info.param_bytes / 1048576.0, info.grad_bytes / 1048576.0,
			info.optim_state_bytes / 1048576.0, info.activation_bytes / 1048576.0,
			info.activation_naive_bytes / 1048576.0);
	}
	p->ready = 1;
	*out = p;
	return LOOM_OK;

out_fail:
	/* As sqlite3_open: the handle comes back so that its error can be
	 * read; only loom_program_error and loom_program_free take it. */
	snprintf(p->err, sizeof(p->err), "%s", last_error);
	*out = p;
	return st;
}

loom_status loom_compile(loom_graph *g, loom_value loss, const loom_compile_opts *o,
			 loom_program **out)
{
	loom_status st = compile_one(g, loss, o, 0, out);
	/* Pipeline stages over the memory limit on a time-balanced cut: the
	 * memory-balanced cut before refusing. Every rank refused the same
	 * stage (loom_pipeline_limit), so every rank compiles again. */
	if (st == LOOM_ERR_NOMEM && o && *out && loom_pipeline_may_rebalance(&(*out)->plan)) {
		loom_compile_opts mo = *o;
		mo.pipeline_balance = LOOM_BALANCE_MEMORY;
		loom_program_free(*out);
		*out = NULL;
		st = compile_one(g, loss, &mo, 1, out);
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
	loom_exec_free(&p->exec);
	loom_pipeline_free(p->plan.pipe);
	free(p->plan.steps);
	free(p->plan.pieces);
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
	if (p->plan.pipe)
		return loom_pipeline_set_input(p, v, data, count);
	if ((int64_t)count != loom_shape_numel(&nd->shape))
		return loom_program_fail(p, LOOM_ERR_SHAPE,
					 "set_input '%s': %zu elements given, shape %s holds %lld", name,
					 count, loom_shape_str(&nd->shape, sb, sizeof(sb)),
					 (long long)loom_shape_numel(&nd->shape));
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
	if (!p->be->alloc_accum)
		return loom_program_fail(p, LOOM_ERR_UNSUPPORTED,
					 "run: gradient accumulation is not implemented on the %s backend",
					 p->be->name);
	loom_status st = p->be->alloc_accum(p->be_ctx, &p->plan, &p->arena);
	return st != LOOM_OK ? loom_program_backend_fail(p, st) : LOOM_OK;
}

/* Rank 0's buffers to every rank: the last run's kernels wrote them (on a
 * device they must be done before the broadcast reads them), and the
 * broadcast must be done before the next run reads them. */
static loom_status sync_buffers(loom_program *p)
{
	loom_status st;
	if ((st = loom_exec_synchronize(p)) != LOOM_OK || (st = loom_ddp_broadcast_buffers(p)) != LOOM_OK ||
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
	p->err[0] = 0;
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

static loom_status run_and_sync(loom_program *p, loom_run_mode mode)
{
	if (p->plan.pipe) {
		loom_status pst = loom_pipeline_run(p, mode);
		/* the activation region as compiled, for whatever reads it next */
		p->arena.act = p->plan.pipe->act_base;
		return pst;
	}
	loom_status st = run_mode(p, mode);
	report_nonfinite(p);
	if (st != LOOM_OK)
		return st;
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
		if (p->plan.g->nodes[u].flags & LOOM_NODE_AMP)
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
	if ((int64_t)count != loom_shape_numel(&nd->shape))
		return loom_program_fail(p, LOOM_ERR_SHAPE, "%s: %zu elements asked, value %d is %s",
					 what, count, (int)v, loom_shape_str(&nd->shape, sb, sizeof(sb)));
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
		dst[i] = loom_elem_get(nd->dtype, tmp, i);
	free(tmp);
	return st;
}

loom_status loom_read_f64(loom_program *p, loom_value v, double *dst, size_t count)
{
	if (!loom_program_usable(p) || !dst)
		return LOOM_ERR_INVALID;
	if ((v = compiled_value(p, v)) == LOOM_NONE)
		return loom_program_fail(p, LOOM_ERR_INVALID, "read: not a value of this program");
	if (p->plan.pipe)
		return loom_pipeline_read(p, v, dst, count);
	loom_status st = readable(p, v, count, "read");
	return st != LOOM_OK ? st : read_as_f64(p, v, dst, count);
}

loom_status loom_read(loom_program *p, loom_value v, float *dst, size_t count)
{
	if (!loom_program_usable(p) || !dst)
		return LOOM_ERR_INVALID;
	if ((v = compiled_value(p, v)) == LOOM_NONE)
		return loom_program_fail(p, LOOM_ERR_INVALID, "read: not a value of this program");
	loom_status st = p->plan.pipe ? LOOM_OK : readable(p, v, count, "read");
	if (st != LOOM_OK)
		return st;
	double *tmp = malloc(sizeof(double) * (count ? count : 1));
	if (!tmp)
		return loom_program_fail(p, LOOM_ERR_NOMEM, "read: out of memory");
	st = p->plan.pipe ? loom_pipeline_read(p, v, tmp, count) : read_as_f64(p, v, tmp, count);
	for (size_t i = 0; st == LOOM_OK && i < count; i++)
		dst[i] = (float)tmp[i];
	free(tmp);
	return st;
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
	void *tmp = malloc(bytes ? bytes : 1);
	if (!tmp)
		return loom_program_fail(p, LOOM_ERR_NOMEM, "write: out of memory");
	for (size_t i = 0; i < count; i++)
		loom_elem_set(nd->dtype, tmp, i, src[i]);
	st = loom_program_upload(p, loom_value_ptr(p, v), tmp, bytes);
	free(tmp);
	/* O2: the optimizer updates the fp32 master and copies it over the half
	 * parameter, so the master must hold the written values too. */
	if (st == LOOM_OK && nd->master != LOOM_NONE) {
		float *m = malloc(sizeof(float) * (count ? count : 1));
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

void loom_program_info_get(const loom_program *p, loom_program_info *info)
{
	memset(info, 0, sizeof(*info));
	if (!loom_program_usable(p))
		return;
	info->backend = p->be->describe(p->be_ctx);
	info->n_nodes = p->plan.g->n;
	info->n_params = p->plan.n_params;
	/* Pipeline stages: the figures of what this rank's stage holds. */
	for (int i = 0; i < p->plan.n_params; i++) {
		const loom_param_slot *s = &p->plan.params[i];
		if (!loom_plan_holds(&p->plan, s->param))
			continue;
		info->n_param_elems += s->numel;
		info->param_bytes += loom_value_bytes(p, s->param);
		if (loom_plan_holds(&p->plan, s->grad))
			info->grad_bytes += loom_value_bytes(p, s->grad);
	}
	/* A forward-only plan has no slots: its parameters are the graph's. */
	for (int v = 0; p->plan.opts.inference && v < p->plan.n_fwd; v++) {
		const loom_node *nd = &p->plan.g->nodes[v];
		if (nd->op != LOOM_OP_PARAM || (nd->flags & LOOM_NODE_AMP))
			continue;
		info->n_params++;
		info->n_param_elems += loom_shape_numel(&nd->shape);
		info->param_bytes += loom_value_bytes(p, v);
	}
	info->master_bytes = p->plan.master_bytes;
	info->optim_state_bytes = p->plan.state_bytes;
	info->activation_bytes = p->plan.mp.act_bytes;
	info->activation_naive_bytes = p->plan.mp.act_naive_bytes;
	info->arena_bytes = p->plan.mp.persist_bytes + p->plan.mp.bucket_bytes + p->plan.mp.act_bytes + p->plan.ws_bytes + loom_plan_state_region_bytes(&p->plan);
	loom_plan_flops(&p->plan, &info->flops_fwd, &info->flops_bwd);
	info->loss_scale = p->ts.scaler.scale;
	info->skipped_steps = p->ts.scaler.skipped_steps;
	info->grad_norm = p->ts.grad_norm;
	info->amp_report = p->ts.amp_report;
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
		if (loom_made_earlier(&p->plan, v))
			fprintf(out, " (made by %d)", (int)n->made_by);
		if (p->be->node_note) {
			char note[320];
			p->be->node_note(p->be_ctx, &p->plan, v, note, sizeof(note));
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
		pl->n_steps, pl->zero ? ", zero 1" : "");
	for (int i = 0; i < pl->n_steps; i++) {
		const loom_step *s = &pl->steps[i];
		fprintf(out, "%4d %-10s %-9s %-7s", i, loom_step_kind_name(s->kind), phase[s->phase],
			s->stream == LOOM_STREAM_COMM ? "comm" : "compute");
		switch (s->kind) {
		case LOOM_STEP_NODE:
			fprintf(out, " node %d %s%s", (int)s->v, loom_op_defs[pl->g->nodes[s->v].op]->name,
				s->noop ? " (nothing to run)" : "");
			break;
		case LOOM_STEP_COLLECTIVE:
			fprintf(out, " %s bucket %d (%lld %s)", loom_coll_name(s->coll), s->index,
				(long long)pl->buckets.b[s->index].count,
				loom_dtype_name(pl->buckets.b[s->index].dtype));
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
