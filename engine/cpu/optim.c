/*
 * engine/cpu/optim.c — SGD (momentum, dampening, nesterov, weight decay) and
 * AdamW with torch.optim's semantics, fused with mixed precision's
 * bookkeeping: one pass checks every gradient for inf/NaN, the loss scaler
 * decides, and a second pass unscales each gradient as it updates the fp32
 * value (the O2 master, or the parameter itself) and rounds half copies.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/elem.h"
#include "engine/cpu/optim.h"
#include "engine/cpu/team.h"

#define CHUNK 2048

/* f32, the common case, as its own loop: the per-element dtype switch kept
 * these loops scalar (3-4% of a ResNet-50 step in perf). Same conversions. */
static void load(loom_dtype dt, const void *src, int64_t off, int64_t n, double *dst)
{
	if (dt == LOOM_F32) {
		const float *s = (const float *)src + off;
		for (int64_t i = 0; i < n; i++)
			dst[i] = s[i];
		return;
	}
	for (int64_t i = 0; i < n; i++)
		dst[i] = loom_elem_get(dt, src, off + i);
}

static void store(loom_dtype dt, void *dst, int64_t off, int64_t n, const double *src)
{
	if (dt == LOOM_F32) {
		float *d = (float *)dst + off;
		for (int64_t i = 0; i < n; i++)
			d[i] = (float)src[i];
		return;
	}
	for (int64_t i = 0; i < n; i++)
		loom_elem_set(dt, dst, off + i, src[i]);
}

/* Pieces [first, last): every gradient element finite? */
int loom_optim_grads_finite_host(const loom_plan *pl, const loom_arena *a, int first, int last)
{
	int ok = 1;
	for (int k = first; k < last && ok; k++) {
		const loom_optim_piece *pc = &pl->pieces[k];
		const loom_param_slot *sl = &pl->params[pc->slot];
		const loom_node *gn = &pl->g->nodes[sl->grad];
		const void *g = loom_arena_ptr(a, pl, sl->grad);
		int64_t lo = pc->off, hi = pc->off + pc->n;
		switch (gn->dtype) {
		case LOOM_F32:
			for (int64_t i = lo; i < hi; i++)
				ok &= isfinite(((const float *)g)[i]);
			break;
		case LOOM_F64:
			for (int64_t i = lo; i < hi; i++)
				ok &= isfinite(((const double *)g)[i]);
			break;
		case LOOM_F16: /* exponent all ones: inf or NaN */
			for (int64_t i = lo; i < hi; i++)
				ok &= (((const uint16_t *)g)[i] & 0x7c00) != 0x7c00;
			break;
		default:
			for (int64_t i = lo; i < hi; i++)
				ok &= (((const uint16_t *)g)[i] & 0x7f80) != 0x7f80;
			break;
		}
	}
	return ok;
}

double loom_optim_grad_sumsq_host(const loom_plan *pl, const loom_arena *a, double inv, int first,
				  int last)
{
	double total = 0;
	for (int k = first; k < last; k++) {
		const loom_optim_piece *pc = &pl->pieces[k];
		const loom_param_slot *sl = &pl->params[pc->slot];
		loom_dtype dt = pl->g->nodes[sl->grad].dtype;
		const void *g = loom_arena_ptr(a, pl, sl->grad);
		double part = 0;
		#pragma omp parallel for reduction(+ : part) if (pc->n > 65536) schedule(static)
		for (int64_t i = pc->off; i < pc->off + pc->n; i++) {
			double x = loom_elem_get(dt, g, i) * inv;
			part += x * x;
		}
		total += part;
	}
	return total;
}

/* One chunk of torch.optim.SGD / AdamW on w (fp32 or fp64 values). The
 * options are read into locals first: through o, every store to w or the
 * state might change them (both are doubles), which kept these loops scalar;
 * whether SGD has momentum is decided outside the loop. Elementwise only, so SIMD gives the same bits (BUILD compiles this
 * file with -fno-math-errno: sqrt's errno would keep the AdamW loop scalar). */
static void update_chunk(const loom_optim_opts *o, double lr, int64_t t, double *restrict w,
			 const double *restrict g, double *restrict s0, double *restrict s1,
			 int64_t n, double wd)
{
	if (o->kind == LOOM_OPTIM_SGD) {
		const double mom = o->momentum, damp = 1 - o->dampening;
		if (!(mom > 0)) {
#pragma omp simd
			for (int64_t i = 0; i < n; i++)
				w[i] -= lr * (g[i] + wd * w[i]);
			return;
		}
		const int first = t == 1, nesterov = o->nesterov;
#pragma omp simd
		for (int64_t i = 0; i < n; i++) {
			double d = g[i] + wd * w[i];
			s0[i] = first ? d : mom * s0[i] + damp * d;
			d = nesterov ? d + mom * s0[i] : s0[i];
			w[i] -= lr * d;
		}
		return;
	}
	const double b1 = o->beta1, b2 = o->beta2, eps = o->eps;
	const double bc1 = 1 - pow(b1, (double)t), sbc2 = sqrt(1 - pow(b2, (double)t));
	const double decay = 1 - lr * wd, step = lr / bc1;
#pragma omp simd
	for (int64_t i = 0; i < n; i++) {
		w[i] *= decay;
		s0[i] = b1 * s0[i] + (1 - b1) * g[i];
		s1[i] = b2 * s1[i] + (1 - b2) * g[i] * g[i];
		double denom = sqrt(s1[i]) / sbc2 + eps;
		w[i] -= step * s0[i] / denom;
	}
}

/* One piece's update, split over loom's team by chunks. */
typedef struct piece_job {
	const loom_optim_opts *o;
	const loom_optim_piece *pc;
	const loom_param_slot *sl;
	const loom_node *pn, *gn;
	void *param, *master, *w_src, *st0, *st1, *pack;
	const void *grad;
	loom_dtype wdt;
	int64_t t;
	int64_t w_base; /* w_src's element off is at off + w_base (ZeRO's shard master) */
	double lr, wd, inv_scale;
} piece_job;

static void piece_chunks(void *arg, int64_t lo, int64_t hi)
{
	const piece_job *j = arg;
	const loom_optim_piece *pc = j->pc;
	const loom_param_slot *sl = j->sl;
	for (int64_t c = lo; c < hi; c++) {
		double w[CHUNK], g[CHUNK], s0[CHUNK], s1[CHUNK];
		int64_t k = c * CHUNK;
		int64_t n = pc->n - k < CHUNK ? pc->n - k : CHUNK, off = pc->off + k;
		load(j->wdt, j->w_src, off + j->w_base, n, w);
		load(j->gn->dtype, j->grad, off, n, g);
		for (int64_t i = 0; i < n; i++)
			g[i] *= j->inv_scale;
		if (j->st0)
			load(sl->state_dtype, j->st0, k, n, s0);
		if (j->st1)
			load(sl->state_dtype, j->st1, k, n, s1);
		update_chunk(j->o, j->lr, j->t, w, g, s0, s1, n, j->wd);
		store(j->wdt, j->w_src, off + j->w_base, n, w);
		if (j->master && j->param)
			store(j->pn->dtype, j->param, off, n, w);
		if (j->pack)
			store(j->pn->dtype, j->pack, k, n, w);
		if (j->st0)
			store(sl->state_dtype, j->st0, k, n, s0);
		if (j->st1)
			store(sl->state_dtype, j->st1, k, n, s1);
	}
}

/* One piece: elements [off, off + n) of its slot. The state (and, ZeRO,
 * the packed copy of the parameter in the bucket and the master shard) is
 * the piece's own, from element 0; values, gradients and whole masters are
 * the slot's, from off. */
static void update_piece(const loom_plan *pl, const loom_arena *a, const loom_train_state *ts,
			 const loom_optim_piece *pc, double inv_scale)
{
	piece_job j = { .o = &pl->opts.optim, .pc = pc, .sl = &pl->params[pc->slot],
			.inv_scale = inv_scale };
	const loom_param_slot *sl = j.sl;
	j.pn = &pl->g->nodes[sl->param];
	j.gn = &pl->g->nodes[sl->grad];
	/* ZeRO-3: the parameter is its shards (the master's, or the packed
	 * half copy), whole only while gathered. */
	j.param = (j.pn->flags & LOOM_NODE_SHARDED) ? NULL : loom_arena_ptr(a, pl, sl->param);
	j.grad = loom_arena_ptr(a, pl, sl->grad);
	j.master = pc->shard_master ? a->state + pc->master_off :
		   sl->master != LOOM_NONE ? loom_arena_ptr(a, pl, sl->master) : NULL;
	j.wdt = j.master ? LOOM_F32 : j.pn->dtype;
	j.w_src = j.master ? j.master : j.param;
	j.w_base = pc->shard_master ? -pc->off : 0;
	j.st0 = pl->n_state > 0 ? a->state + pc->state_off[0] : NULL;
	j.st1 = pl->n_state > 1 ? a->state + pc->state_off[1] : NULL;
	j.pack = pc->pack ? a->bucket + pc->pack_off : NULL;
	j.t = ts->step + 1;
	j.lr = ts->lr;
	j.wd = j.o->decay_matrices_only && !sl->matrix ? 0 : j.o->weight_decay;
	loom_cpu_team_for((pc->n + CHUNK - 1) / CHUNK,
			  pc->n > 4 * CHUNK ? loom_cpu_team_threads() : 1, piece_chunks, &j);
}

static void pack_unchanged(const loom_plan *pl, const loom_arena *a, const loom_optim_piece *pc)
{
	const loom_param_slot *sl = &pl->params[pc->slot];
	/* ZeRO-3: the pack is the parameter's own shard, unchanged already */
	if (!pc->pack || (pl->g->nodes[sl->param].flags & LOOM_NODE_SHARDED))
		return;
	size_t esz = loom_dtype_size(pl->g->nodes[sl->param].dtype);
	memcpy(a->bucket + pc->pack_off,
	       (const unsigned char *)loom_arena_ptr(a, pl, sl->param) + (size_t)pc->off * esz,
	       (size_t)pc->n * esz);
}

loom_status loom_optim_step_host(const loom_plan *pl, const loom_arena *a, loom_train_state *ts,
				 int first, int last, int finite)
{
	/* The scale the gradients were multiplied by, before the update below
	 * may grow it: unscaling by the new one would halve this step.
	 * Data parallel: the buckets hold the sum over the ranks; averaging is
	 * folded into the unscale. An overflow on any rank is an inf/NaN in
	 * every rank's sum, so every rank skips the same steps (ZeRO: the
	 * executor reduced the shards' verdicts into finite). Gradient
	 * accumulation: the sum over micro + 1 micro-steps, averaged the same
	 * way; an overflow in any of them is in the sum too. */
	double inv = loom_grad_unscale(pl, ts);
	if (pl->scaling) {
		if (finite < 0)
			finite = loom_optim_grads_finite_host(pl, a, first, last);
		if (!loom_scaler_update(&ts->scaler, !finite)) {
			/* Skipped: the all-gather still needs this shard's
			 * parameters where the gradients were (ZeRO). */
			for (int k = first; k < last; k++)
				pack_unchanged(pl, a, &pl->pieces[k]);
			return LOOM_OK;
		}
	}
	/* Clipping (torch's clip_grad_norm_) folded into the unscale. Over
	 * every piece; ZeRO's pieces are one shard's, and the executor has
	 * put the norm over every shard in ts->grad_norm. */
	double clip = pl->opts.optim.clip_grad;
	if (clip > 0) {
		if (!pl->zero)
			ts->grad_norm = sqrt(loom_optim_grad_sumsq_host(pl, a, inv, first, last));
		double coef = clip / (ts->grad_norm + 1e-6);
		if (coef < 1)
			inv *= coef;
	}
	for (int k = first; k < last; k++)
		update_piece(pl, a, ts, &pl->pieces[k], inv);
	ts->step++;
	return LOOM_OK;
}
