/*
 * examples/gpt_ddp.c — trains a GPT-2-style transformer with loom: pre-norm
 * blocks (layer norm, causal self-attention over a fused qkv, projection,
 * residual; layer norm, GELU MLP of 4C, residual), learned positions, a
 * final layer norm and the output projection tied to the token embedding.
 * Text is read byte by byte (vocabulary 256; default: the fortunes of the
 * Debian package `fortunes`), or llm.c token shards with --tokens (a file,
 * a folder or a glob, memory-mapped: no rank holds a copy); the last tenth
 * (or --val-tokens) is held out for the validation loss. AdamW with weight decay on
 * matrices only, a linear warm-up then cosine decay, gradient clipping by
 * global norm, data parallel, opt levels, checkpoints: the start-up, the
 * launcher, the flags and the loop (train_drive) are examples/train.c's; the
 * model, its batches, validation and sampling are here.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "base/options.h"
#include "base/splitmix.h"
#include "comm/launch.h"
#include "examples/gpt_args.h"
#include "examples/gpt_data.h"
#include "examples/gpt_hf.h"
#include "examples/outputs.h"
#include "examples/peak.h"
#include "examples/train.h"
#include "loom.h"

/* The flags that set the GPT_SET_ settings (examples/gpt_args.h). */
static const char *const gpt_set_flags[GPT_SET_COUNT] = { "--layers", "--heads", "--embd",
							  "--context", "--vocab", "--gelu" };

/* Hugging Face's GPT-2 (GPT2LMHeadModel, modeling_gpt2.py): the names are
 * loom's; GPT2Model's files drop "transformer."; the four projections are
 * Conv1D ([in, out]); attn.bias and attn.masked_bias are the causal mask
 * (buffers of older versions), lm_head.weight is wte's (tied). */
static const loom_name_map gpt_hf_names[] = {
	{ .loom = "transformer.", .file = "transformer." },
	{ .loom = "transformer.", .file = "" },
};
static const char *const gpt_hf_conv1d[] = { "attn.c_attn.weight", "attn.c_proj.weight",
					     "mlp.c_fc.weight", "mlp.c_proj.weight" };
static const char *const gpt_hf_ignore[] = { "attn.bias", "attn.masked_bias", "lm_head.weight" };
/* A file's n_positions may exceed --context: its first rows of wpe. */
static const char *const gpt_hf_rows[] = { "wpe.weight" };
/* The length of one of these arrays, from the array itself. */
#define GPT_COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* Records which GPT_SET_ settings a flag gave (given: flags_parse's). */
static void gpt_given(gpt_cfg *c, const unsigned char *given)
{
	for (int k = 0; k < GPT_SET_COUNT; k++)
		if (given[gpt_set_rows[k]])
			c->set_by[k] = gpt_set_flags[k];
}

/* --preset: GPT-2 124M (gpt2), 350M (gpt2-medium) or 774M (gpt2-large), as
 * OpenAI's and Hugging Face's configs have them (context 1024, vocabulary
 * 50257, tanh GELU), under the flags given. c->preset is the choice's index
 * plus one (gpt_args.c's values). */
static void gpt_preset(gpt_cfg *c)
{
	static const char *const by[] = { "--preset gpt2", "--preset gpt2-medium",
					  "--preset gpt2-large" };
	static const int v[][GPT_SET_COUNT] = {
		{ 12, 12, 768, 1024, 50257, 1 },
		{ 24, 16, 1024, 1024, 50257, 1 },
		{ 36, 20, 1280, 1024, 50257, 1 },
	};
	int *field[GPT_SET_COUNT] = { &c->layers, &c->heads, &c->embd, &c->context, &c->vocab,
				      &c->gelu_tanh };
	int i = c->preset - 1;
	for (int k = 0; k < GPT_SET_COUNT; k++)
		if (!c->set_by[k]) {
			*field[k] = v[i][k];
			c->set_by[k] = by[i];
		}
}

/* ------------------------------------------------------------------ model */

/* The values one step reads and writes. */
typedef struct gpt_model {
	loom_value loss;
	/* The last layer norm's output [b, T, C] and the tied table [V, C]: the
	 * sampler's logits, made on the host for the one position it needs (the
	 * [b * T, V] logits are not kept: the loss's backward writes their
	 * gradient over them, so one such buffer is all the plan holds). */
	loom_value hidden, wte;
	loom_value *matrices; /* weights that take decay and the scaled init */
	int n_matrices;
	loom_value *params;   /* every parameter, in creation order */
	int n_params;
} gpt_model;

static loom_dtype model_dtype = LOOM_F32;

static loom_value param(loom_graph *g, gpt_model *m, const char *name, int ndim, int64_t d0,
			int64_t d1, loom_init init)
{
	int64_t d[2] = { d0, d1 };
	loom_value v = loom_param(g, name, model_dtype, ndim, d, init, 0);
	if (v != LOOM_NONE)
		m->params[m->n_params++] = v;
	return v;
}

static loom_value linear(loom_graph *g, gpt_model *m, const char *name, loom_value x, int out,
			 int in)
{
	char wn[64], bn[64];
	snprintf(wn, sizeof(wn), "%s.weight", name);
	snprintf(bn, sizeof(bn), "%s.bias", name);
	/* Weight then bias, in this order (the --init file's). */
	loom_value w = param(g, m, wn, 2, out, in, LOOM_INIT_ZEROS);
	loom_value b = param(g, m, bn, 1, out, 0, LOOM_INIT_ZEROS);
	m->matrices[m->n_matrices++] = w;
	return loom_linear(g, x, w, b);
}

static loom_value layernorm(loom_graph *g, gpt_model *m, const char *name, loom_value x, int c,
			    double eps)
{
	char wn[64], bn[64];
	snprintf(wn, sizeof(wn), "%s.weight", name);
	snprintf(bn, sizeof(bn), "%s.bias", name);
	loom_value w = param(g, m, wn, 1, c, 0, LOOM_INIT_ONES);
	loom_value b = param(g, m, bn, 1, c, 0, LOOM_INIT_ZEROS);
	return loom_layernorm(g, x, w, b, eps);
}

/*
 * GPT-2 (nanoGPT's model.py, no dropout) for batch b: inputs "ids" and
 * "pos" [b, T] and "targets" [b * T]; parameters named as its state dict.
 */
static int gpt_build(loom_graph *g, const gpt_cfg *c, int b, gpt_model *m)
{
	const int64_t T = c->context, C = c->embd, V = c->vocab;
	int64_t bt[2] = { b, T }, flat[1] = { b * T }, lg[2] = { b * T, V };
	char name[64];
	model_dtype = c->dtype;
	m->params = calloc(4 + 12 * (size_t)c->layers + 4, sizeof(loom_value));
	m->matrices = calloc(4 * (size_t)c->layers + 1, sizeof(loom_value));
	if (!m->params || !m->matrices)
		return -1;
	loom_value ids = loom_input(g, "ids", LOOM_I32, 2, bt);
	loom_value pos = loom_input(g, "pos", LOOM_I32, 2, bt);
	loom_value targets = loom_input(g, "targets", LOOM_I32, 1, flat);
	loom_value wte = param(g, m, "transformer.wte.weight", 2, V, C, LOOM_INIT_ZEROS);
	loom_value wpe = param(g, m, "transformer.wpe.weight", 2, T, C, LOOM_INIT_ZEROS);
	loom_value x = loom_add(g, loom_embedding(g, ids, wte), loom_embedding(g, pos, wpe));
	for (int l = 0; l < c->layers; l++) {
#define NAME(what) (snprintf(name, sizeof(name), "transformer.h.%d.%s", l, what), name)
		loom_value h = layernorm(g, m, NAME("ln_1"), x, (int)C, c->ln_eps);
		h = linear(g, m, NAME("attn.c_attn"), h, (int)(3 * C), (int)C);
		h = loom_causal_self_attention(g, h, c->heads);
		x = loom_add(g, x, linear(g, m, NAME("attn.c_proj"), h, (int)C, (int)C));
		h = layernorm(g, m, NAME("ln_2"), x, (int)C, c->ln_eps);
		h = linear(g, m, NAME("mlp.c_fc"), h, (int)(4 * C), (int)C);
		h = c->gelu_tanh ? loom_gelu_tanh(g, h) : loom_gelu(g, h);
		x = loom_add(g, x, linear(g, m, NAME("mlp.c_proj"), h, (int)C, (int)(4 * C)));
#undef NAME
	}
	x = layernorm(g, m, "transformer.ln_f", x, (int)C, c->ln_eps);
	loom_value logits = loom_linear(g, x, wte, LOOM_NONE); /* tied: lm_head = wte */
	m->loss = loom_softmax_cross_entropy(g, loom_reshape(g, logits, 2, lg), targets);
	m->hidden = x;
	m->wte = wte;
	loom_mark_output(g, x);
	return loom_graph_status(g) == LOOM_OK ? 0 : -1;
}

static void gpt_model_free(gpt_model *m)
{
	free(m->params);
	free(m->matrices);
}

/* Box-Muller over splitmix64: N(0, 1) draws from a seed. */
static double normal(uint64_t *s)
{
	double u1 = ((loom_splitmix64(s) >> 11) + 1) * 0x1.0p-53,
	       u2 = (loom_splitmix64(s) >> 11) * 0x1.0p-53;
	return sqrt(-2 * log(u1)) * cos(2 * M_PI * u2);
}

/* GPT-2's initialisation (nanoGPT's _init_weights): N(0, 0.02) for the
 * embeddings and matrices, 0.02 / sqrt(2 L) for the residual projections,
 * biases 0, layer norms 1 (their initialisers). Every rank draws the same.
 * Or --init FILE: every parameter in creation order, f64. */
static int gpt_init(train_run *t, const gpt_cfg *c, loom_graph *g, const gpt_model *m)
{
	size_t cap = 0;
	double *buf = NULL;
	uint64_t s = t->a.seed * 0x2545f4914f6cdd1dull + 1;
	FILE *f = NULL;
	int rc = -1;
	if (c->init_file && !(f = fopen(c->init_file, "rb"))) {
		fprintf(stderr, "gpt_ddp: --init %s: %s\n", c->init_file, strerror(errno));
		return -1;
	}
	for (int i = 0; i < m->n_params; i++) {
		loom_value v = m->params[i];
		loom_shape sh = loom_value_shape(g, v);
		size_t n = (size_t)loom_shape_numel(&sh);
		if (n > cap) {
			double *nb = realloc(buf, n * sizeof(double));
			if (!nb)
				goto out;
			buf = nb;
			cap = n;
		}
		if (f) {
			if (fread(buf, sizeof(double), n, f) != n) {
				fprintf(stderr, "gpt_ddp: --init %s: too short for the model\n",
					c->init_file);
				goto out;
			}
		} else if (sh.ndim == 2) {
			int proj = 0;
			for (int k = 0; k < m->n_matrices; k++)
				proj |= m->matrices[k] == v && (k % 4 == 1 || k % 4 == 3);
			double sd = proj ? 0.02 / sqrt(2.0 * c->layers) : 0.02;
			for (size_t k = 0; k < n; k++)
				buf[k] = sd * normal(&s);
		} else {
			continue; /* layer norms and biases keep their initialisers */
		}
		if (loom_write_f64(t->p, v, buf, n) != LOOM_OK) {
			fprintf(stderr, "gpt_ddp: %s\n", loom_program_error(t->p));
			goto out;
		}
	}
	if (f && fgetc(f) != EOF) {
		fprintf(stderr, "gpt_ddp: --init %s: longer than the model's parameters\n",
			c->init_file);
		goto out;
	}
	rc = 0;
out:
	if (f)
		fclose(f);
	free(buf);
	return rc;
}

/*
 * The initial model as an llm.c checkpoint (train_gpt2.c's
 * gpt2_build_from_checkpoint): 256 int32 (magic 20240326, version 3, maxT,
 * V, L, NH, C, padded V), then f32 tensors each over all layers: wte
 * (padded rows 0), wpe, ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w,
 * ln2b, fcw, fcb, fcprojw, fcprojb, lnfw, lnfb. Weights [out, in] as loom's.
 */
static int write_llmc(train_run *t, const gpt_cfg *c, loom_graph *g, const gpt_model *m)
{
	const int L = c->layers, C = c->embd, Vp = (c->vocab + 127) / 128 * 128;
	int32_t head[256] = { 20240326, 3, c->context, c->vocab, L, c->heads, C, Vp };
	FILE *f = fopen(c->llmc_out, "wb");
	double *buf = NULL;
	float *out = NULL;
	size_t cap = 0;
	int bad = !f || fwrite(head, sizeof(head), 1, f) != 1;
	/* Which of a layer's 12 parameters each llm.c tensor is, in its order
	 * (-1, -2: wte, wpe; 12, 13: ln_f weight and bias, once). */
	static const int order[16] = { -1, -2, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13 };
	for (int k = 0; k < 16 && !bad; k++) {
		int layers = order[k] >= 0 && order[k] < 12 ? L : 1;
		for (int l = 0; l < layers && !bad; l++) {
			loom_value v = order[k] == -1 ? m->params[0] :
				       order[k] == -2 ? m->params[1] :
				       order[k] >= 12 ? m->params[2 + 12 * L + order[k] - 12] :
							m->params[2 + 12 * l + order[k]];
			loom_shape sh = loom_value_shape(g, v);
			size_t n = (size_t)loom_shape_numel(&sh), pad = order[k] == -1 ?
					   (size_t)(Vp - c->vocab) * C : 0;
			if (n + pad > cap) {
				cap = n + pad;
				double *nb = realloc(buf, cap * sizeof(double));
				float *no = realloc(out, cap * sizeof(float));
				buf = nb ? nb : buf;
				out = no ? no : out;
				if (!nb || !no) {
					bad = 1;
					break;
				}
			}
			bad = loom_read_f64(t->p, v, buf, n) != LOOM_OK;
			for (size_t i = 0; i < n + pad; i++)
				out[i] = i < n ? (float)buf[i] : 0.0f;
			bad |= fwrite(out, sizeof(float), n + pad, f) != n + pad;
		}
	}
	if (f && fclose(f) != 0)
		bad = 1;
	free(buf);
	free(out);
	if (bad)
		fprintf(stderr, "gpt_ddp: --write-llmc %s: %s\n", c->llmc_out,
			f ? "write failed" : strerror(errno));
	else
		printf("wrote the initial model to %s (llm.c checkpoint, V %d padded to %d)\n",
		       c->llmc_out, c->vocab, Vp);
	return bad ? -1 : 0;
}

/* What train_compile's init hook needs: it runs before --init-from. */
typedef struct gpt_init_ctx {
	const gpt_cfg *c;
	loom_graph *g;
	const gpt_model *m;
} gpt_init_ctx;

static int gpt_init_hook(train_run *t, void *ctx)
{
	const gpt_init_ctx *k = ctx;
	return gpt_init(t, k->c, k->g, k->m);
}

/* ------------------------------------------------------------------ data */

/* The corpus: text's ids held, or llm.c shards mapped; the training and
 * held-out spans of them (the held-out tenth is a span, not a copy). */
typedef struct gpt_data {
	gpt_tokens text;
	gpt_shards shards, val_shards;
	gpt_span train, val;
	int vocab; /* largest id + 1 (256 for text); 0: shards not scanned (--vocab given) */
} gpt_data;

/* One batch: rows start at the given offsets of the corpus. */
typedef struct gpt_batch {
	int32_t *ids, *pos, *targets;
} gpt_batch;

/* Why the last batch could not be made ("": it could; feed_error). */
static char data_err[1200];

/* Each row the T + 1 tokens from its start (ids the first T, targets the
 * last T), converted from the corpus for this batch only, every id checked
 * below vocab. 0, or -1 with data_err. */
static int fill_batch(const gpt_span *d, int vocab, const int64_t *starts, int b, int T,
		      gpt_batch *o)
{
	for (int r = 0; r < b; r++) {
		int32_t *ids = o->ids + (size_t)r * T, *tg = o->targets + (size_t)r * T;
		if (gpt_span_read(d, starts[r], T, vocab, ids, data_err, sizeof(data_err)) ||
		    gpt_span_read(d, starts[r] + T, 1, vocab, tg + T - 1, data_err, sizeof(data_err)))
			return -1;
		memcpy(tg, ids + 1, sizeof(int32_t) * (size_t)(T - 1));
		for (int k = 0; k < T; k++)
			o->pos[r * T + k] = k;
	}
	return 0;
}

/* What stopped feed_batch: the data's fault, or the program's. */
static const char *feed_error(const loom_program *p)
{
	return data_err[0] ? data_err : loom_program_error(p);
}

static loom_status run_batch(loom_program *p, const gpt_batch *bt, size_t n, loom_run_mode mode)
{
	loom_status st;
	if ((st = loom_set_input(p, "ids", bt->ids, LOOM_I32, n)) ||
	    (st = loom_set_input(p, "pos", bt->pos, LOOM_I32, n)) ||
	    (st = loom_set_input(p, "targets", bt->targets, LOOM_I32, n)))
		return st;
	return loom_run(p, mode);
}

/* Windows `starts` of d as one batch, run in mode: written straight into
 * the program's input buffers (loom_input_buffer: the pinned slot where the
 * CUDA backend stages inputs), or, with LOOM_INPUT_BUFFER=0 in the
 * environment, into bt and copied by loom_set_input (as examples/train.c).
 * A failure is said by feed_error. */
static loom_status feed_batch(loom_program *p, const gpt_span *d, int vocab, const int64_t *starts,
			      int b, int T, gpt_batch *bt, loom_run_mode mode)
{
	static const char *const names[3] = { "ids", "pos", "targets" };
	size_t n = (size_t)b * T;
	data_err[0] = 0;
	if (!loom_opt_bool(LOOM_OPT_INPUT_BUFFER)) {
		if (fill_batch(d, vocab, starts, b, T, bt))
			return LOOM_ERR_FORMAT;
		return run_batch(p, bt, n, mode);
	}
	void *buf[3];
	loom_status st = LOOM_OK;
	int k;
	for (k = 0; k < 3 && st == LOOM_OK; k++)
		st = loom_input_buffer(p, names[k], LOOM_I32, n, &buf[k]);
	if (st != LOOM_OK) {
		while (--k > 0)
			(void)loom_input_release(p, names[k - 1]);
		return st;
	}
	gpt_batch direct = { .ids = buf[0], .pos = buf[1], .targets = buf[2] };
	if (fill_batch(d, vocab, starts, b, T, &direct))
		st = LOOM_ERR_FORMAT;
	for (k = 0; k < 3 && st == LOOM_OK; k++)
		st = loom_input_commit(p, names[k]);
	for (; k < 3; k++)
		(void)loom_input_release(p, names[k]);
	return st != LOOM_OK ? st : loom_run(p, mode);
}

/* The mean loss over the first val_batches batches of each rank's share of
 * the held-out windows, averaged over the ranks. */
static int validate(train_run *t, const gpt_cfg *c, const gpt_span *val, gpt_batch *bt,
		    double *loss)
{
	const int b = t->a.batch, T = c->context;
	int64_t windows = (val->n - 1) / T, starts[4096];
	double sums[2] = { 0, 0 };
	for (int k = 0; k < c->val_batches; k++) {
		for (int r = 0; r < b; r++)
			starts[r] = ((((int64_t)k * t->world + t->rank) * b + r) % windows) * T;
		if (feed_batch(t->p, val, c->vocab, starts, b, T, bt, LOOM_RUN_EVAL) != LOOM_OK) {
			fprintf(stderr, "gpt_ddp: validation: %s\n", feed_error(t->p));
			return -1;
		}
		sums[0] += loom_loss(t->p);
		sums[1]++;
	}
	if (t->world > 1 && loom_comm_allreduce(t->host, sums, 2, LOOM_F64) != LOOM_OK) {
		fprintf(stderr, "gpt_ddp: validation: the ranks' sums did not arrive\n");
		return -1;
	}
	*loss = sums[0] / sums[1];
	return 0;
}

/* Generates c->sample bytes after a prompt from the held-out text, from
 * row 0 of the batch (a causal model: what follows a position does not
 * change its logits). Every rank runs it (EVAL runs are collective after
 * training); rank 0 prints. */
static int sample(train_run *t, const gpt_cfg *c, const gpt_model *m, const gpt_span *val,
		  gpt_batch *bt)
{
	const int b = t->a.batch, T = c->context, V = c->vocab;
	int len = T / 4 < 16 ? (T < 16 ? T : 16) : T / 4;
	uint64_t s = t->a.seed + 12345;
	int32_t *text = malloc(sizeof(int32_t) * (size_t)(len + c->sample));
	const int C = c->embd;
	float *hidden = malloc(sizeof(float) * (size_t)b * T * C);
	float *wte = malloc(sizeof(float) * (size_t)V * C);
	float *z = malloc(sizeof(float) * (size_t)V);
	double *prob = malloc(sizeof(double) * (size_t)V);
	int rc = -1;
	if (!text || !hidden || !wte || !z || !prob)
		goto out;
	if (loom_read(t->p, m->wte, wte, (size_t)V * C) != LOOM_OK) {
		fprintf(stderr, "gpt_ddp: sampling: %s\n", loom_program_error(t->p));
		goto out;
	}
	if (gpt_span_read(val, 0, len, V, text, data_err, sizeof(data_err))) {
		fprintf(stderr, "gpt_ddp: sampling: %s\n", data_err);
		goto out;
	}
	memset(bt->ids, 0, sizeof(int32_t) * (size_t)b * T);
	for (int k = 0; k < b * T; k++)
		bt->pos[k] = k % T;
	for (int n = 0; n < c->sample; n++) {
		int total = len + n, from = total > T ? total - T : 0, here = total - from;
		memcpy(bt->ids, text + from, sizeof(int32_t) * (size_t)here);
		memcpy(bt->targets, bt->ids, sizeof(int32_t) * (size_t)b * T);
		if (run_batch(t->p, bt, (size_t)b * T, LOOM_RUN_EVAL) != LOOM_OK ||
		    loom_read(t->p, m->hidden, hidden, (size_t)b * T * C) != LOOM_OK) {
			fprintf(stderr, "gpt_ddp: sampling: %s\n", loom_program_error(t->p));
			goto out;
		}
		const float *h = hidden + (size_t)(here - 1) * C;
		for (int k = 0; k < V; k++) {
			double dot = 0;
			for (int j = 0; j < C; j++)
				dot += (double)h[j] * wte[(size_t)k * C + j];
			z[k] = (float)dot;
		}
		int best = 0;
		for (int k = 1; k < V; k++)
			best = z[k] > z[best] ? k : best;
		int pick = best;
		if (c->temperature > 0) {
			/* top-k: the k-th largest logit is the cut. */
			float cut = -INFINITY;
			if (c->top_k > 0 && c->top_k < V) {
				for (int k = 0; k < V; k++) {
					int above = 0;
					for (int j = 0; j < V && above < c->top_k; j++)
						above += z[j] > z[k];
					if (above < c->top_k && z[k] > cut && above == c->top_k - 1)
						cut = z[k];
				}
			}
			double sum = 0, u;
			for (int k = 0; k < V; k++)
				sum += prob[k] = z[k] >= cut ? exp((z[k] - z[best]) / c->temperature) : 0;
			u = (loom_splitmix64(&s) >> 11) * 0x1.0p-53 * sum;
			for (pick = 0; pick < V - 1 && (u -= prob[pick]) > 0; pick++)
				;
		}
		text[total] = pick;
	}
	printf("sample (%s, %d bytes after a held-out prompt of %d, the cut marked |):\n---\n",
	       c->temperature > 0 ? "temperature" : "greedy", c->sample, len);
	for (int k = 0; k < len + c->sample; k++) {
		if (k == len)
			putchar('|');
		putchar(text[k]);
	}
	printf("\n---\n");
	rc = 0;
out:
	free(text);
	free(hidden);
	free(wte);
	free(z);
	free(prob);
	return rc;
}

/*
 * The logits of the training data's first window (row 0 of a batch of it)
 * in EVAL mode, [T, V] f64 little-endian: the last layer norm's output
 * times the tied table, on the host in double, as sample() makes them.
 * For comparisons with another engine from the same weights.
 */
static int write_logits(train_run *t, const gpt_cfg *c, const gpt_model *m,
			const gpt_span *train, gpt_batch *bt)
{
	const int b = t->a.batch, T = c->context, C = c->embd, V = c->vocab;
	int64_t starts[4096] = { 0 };
	double *h = malloc(sizeof(double) * (size_t)b * T * C);
	double *w = malloc(sizeof(double) * (size_t)V * C);
	double *z = malloc(sizeof(double) * (size_t)V);
	FILE *f = NULL;
	int rc = -1;
	if (!h || !w || !z) {
		fprintf(stderr, "gpt_ddp: --write-logits: out of memory\n");
		goto out;
	}
	if (feed_batch(t->p, train, V, starts, b, T, bt, LOOM_RUN_EVAL) != LOOM_OK ||
	    loom_read_f64(t->p, m->hidden, h, (size_t)b * T * C) != LOOM_OK ||
	    loom_read_f64(t->p, m->wte, w, (size_t)V * C) != LOOM_OK) {
		fprintf(stderr, "gpt_ddp: --write-logits: %s\n", feed_error(t->p));
		goto out;
	}
	if (t->rank != 0) {
		rc = 0;
		goto out;
	}
	if (!(f = fopen(c->logits_out, "wb"))) {
		fprintf(stderr, "gpt_ddp: --write-logits %s: %s\n", c->logits_out, strerror(errno));
		goto out;
	}
	for (int p = 0; p < T; p++) {
		for (int k = 0; k < V; k++) {
			double dot = 0;
			for (int j = 0; j < C; j++)
				dot += h[(size_t)p * C + j] * w[(size_t)k * C + j];
			z[k] = dot;
		}
		if (fwrite(z, sizeof(double), (size_t)V, f) != (size_t)V)
			break;
	}
	int bad = ferror(f);
	if (fclose(f) != 0 || bad) {
		fprintf(stderr, "gpt_ddp: --write-logits %s: %s\n", c->logits_out, strerror(errno));
		f = NULL;
		goto out;
	}
	f = NULL;
	printf("wrote the logits of the first window to %s ([%d, %d] f64)\n", c->logits_out, T, V);
	rc = 0;
out:
	free(h);
	free(w);
	free(z);
	return rc;
}

/* A linear warm-up over warmup steps, then cosine to a tenth (nanoGPT). */
static double lr_at(const train_args *a, const gpt_cfg *c, int64_t step, int64_t total)
{
	if (c->constant_lr)
		return a->lr;
	if (step < c->warmup_steps)
		return a->lr * (step + 1) / c->warmup_steps;
	double r = total > c->warmup_steps ?
			   (double)(step - c->warmup_steps) / (double)(total - c->warmup_steps) :
			   1;
	double lo = a->lr * 0.1;
	return lo + 0.5 * (1 + cos(M_PI * (r > 1 ? 1 : r))) * (a->lr - lo);
}

/* Shards spec (--tokens or --val-tokens) mapped into *sh, as a span. */
static int open_shards(const char *spec, gpt_shards *sh, gpt_span *span)
{
	char err[1024];
	if (gpt_shards_open(spec, sh, err, sizeof(err))) {
		fprintf(stderr, "gpt_ddp: %s\n", err);
		return -1;
	}
	*span = (gpt_span){ .shards = sh, .n = sh->n };
	return 0;
}

/* The corpus: --tokens mapped (no copy on any rank), or --data's text read
 * into ids (one copy per rank: its bound counts the host_ranks ranks of
 * this host); --val-tokens, or the last tenth as a span of the same. */
static int load_data(const gpt_cfg *c, const train_args *a, int host_ranks, gpt_data *d)
{
	char err[1024];
	if (c->tokens) {
		if (open_shards(c->tokens, &d->shards, &d->train))
			return -1;
	} else if (gpt_text_load_shared(a->data, host_ranks, &d->text, err, sizeof(err))) {
		fprintf(stderr, "gpt_ddp: %s\n", err);
		if (!strcmp(a->data, train_gpt_ddp.defaults.data))
			fprintf(stderr, "gpt_ddp: the default text is the Debian package fortunes "
					"(apt-get install fortunes), or pass --data FILE\n");
		return -1;
	} else {
		d->train = (gpt_span){ .ids = d->text.ids, .n = d->text.n };
		d->vocab = d->text.vocab;
	}
	if (c->val_tokens) {
		if (open_shards(c->val_tokens, &d->val_shards, &d->val))
			return -1;
	} else { /* the last tenth held out */
		int64_t cut = d->train.n - d->train.n / 10;
		d->val = d->train;
		d->val.from = d->train.from + cut;
		d->val.n = d->train.n - cut;
		d->train.n = cut;
	}
	/* Without --vocab, the shards' largest id sets it (one pass over them);
	 * with it, each batch's ids are checked as they are converted. */
	if (!c->vocab) {
		int v = d->shards.count ? gpt_shards_max_id(&d->shards) + 1 : 0;
		int w = d->val_shards.count ? gpt_shards_max_id(&d->val_shards) + 1 : 0;
		d->vocab = d->vocab > v ? d->vocab : v;
		d->vocab = d->vocab > w ? d->vocab : w;
	}
	return 0;
}

static void gpt_data_free(gpt_data *d)
{
	gpt_tokens_free(&d->text);
	gpt_shards_close(&d->shards);
	gpt_shards_close(&d->val_shards);
}

/* The data's part of the start-up line: where, how held, how many. */
static void describe_data(const gpt_cfg *c, const train_args *a, const gpt_data *d, int none,
			  char *buf, size_t len)
{
	if (none) {
		snprintf(buf, len, "no data (dry run)");
		return;
	}
	char val[1200] = "";
	if (c->val_tokens)
		snprintf(val, sizeof(val), ", held out: %s (%d shard%s)", c->val_tokens,
			 d->val_shards.count, d->val_shards.count == 1 ? "" : "s");
	if (c->tokens)
		snprintf(buf, len, "%s (%d shard%s, mapped%s; %lld train, %lld held-out tokens)",
			 c->tokens, d->shards.count, d->shards.count == 1 ? "" : "s", val,
			 (long long)d->train.n, (long long)d->val.n);
	else
		snprintf(buf, len, "%s (%lld train, %lld held-out tokens%s)", a->data,
			 (long long)d->train.n, (long long)d->val.n, val);
}

/* ------------------------------------------------------------------ task */

/* The GPT on examples/train.c's driver: windows of the corpus as batches. */
typedef struct gpt_task {
	const gpt_cfg *c;
	const gpt_model *m;
	const gpt_span *train, *val;
	gpt_batch *bt;
	loom_sampler *sampler;
	int64_t windows, per_epoch;
	FILE *lossf;
	double flops_tok, peak;
} gpt_task;

static int gpt_epoch_begin(train_run *t, void *ctx, int64_t epoch)
{
	gpt_task *k = ctx;
	(void)t;
	loom_sampler_set_epoch(k->sampler, epoch);
	return 0;
}

/* Step b: --accumulate micro-batches of B windows (the sampler's, or in
 * corpus order under --sequential), the last one updating. */
static int gpt_step(train_run *t, void *ctx, int64_t epoch, int64_t b, int run, int update,
		    train_tally *ty)
{
	gpt_task *k = ctx;
	const train_args *a = &t->a;
	const int B = a->batch, T = k->c->context;
	const int64_t *idx = loom_sampler_indices(k->sampler);
	int64_t starts[4096];
	double sum = 0;
	(void)update;
	if (!run)
		return 0;
	for (int micro = 0; micro < a->accumulate; micro++) {
		for (int r = 0; r < B; r++) {
			int64_t w = (b * a->accumulate + micro) * B + r;
			starts[r] = (k->c->sequential ? (w * t->world + t->rank) % k->windows : idx[w]) * T;
		}
		if (feed_batch(t->p, k->train, k->c->vocab, starts, B, T, k->bt,
			       micro + 1 < a->accumulate ? LOOM_RUN_ACCUMULATE : LOOM_RUN_TRAIN) !=
		    LOOM_OK) {
			fprintf(stderr, "gpt_ddp: step %lld: %s\n",
				(long long)(epoch * k->per_epoch + b + 1), feed_error(t->p));
			return -1;
		}
		sum += loom_loss(t->p);
		if (k->lossf)
			fprintf(k->lossf, "%lld %.17g\n", (long long)(epoch * k->per_epoch + b + 1),
				loom_loss(t->p));
	}
	ty->loss += sum / a->accumulate;
	return 0;
}

static double gpt_lr(train_run *t, void *ctx, int64_t epoch, int64_t b, int64_t step,
		     int64_t last)
{
	const gpt_task *k = ctx;
	(void)epoch;
	(void)b;
	return lr_at(&t->a, k->c, step, last);
}

/* Tokens/s, ms per step, MFU and the gradient norm: nanoGPT's line. */
static void gpt_progress(train_run *t, void *ctx, const train_progress *pr)
{
	const gpt_task *k = ctx;
	const train_tally *ty = pr->tally;
	loom_program_info info;
	double dt = pr->secs > 0 ? pr->secs : 1e-9;
	double tok = (double)ty->steps * t->a.accumulate * t->a.batch * k->c->context * t->world;
	loom_program_info_get(t->p, &info);
	printf("step %5lld/%lld  loss %.4f  %.0f tok/s  %.1f ms/step  MFU %.1f%%  lr %.3g"
	       "  grad norm %.3g%s\n",
	       (long long)pr->done, (long long)pr->last, ty->loss / ty->steps, tok / dt,
	       1e3 * dt / (ty->steps ? ty->steps : 1),
	       k->peak > 0 ? 100 * tok / dt * k->flops_tok / t->world / k->peak : 0,
	       loom_get_lr(t->p), info.grad_norm, info.skipped_steps ? "  (skipped steps)" : "");
}

/* The validation loss, said with its step. */
static int gpt_validate_line(train_run *t, gpt_task *k, int64_t done, double *loss)
{
	if (validate(t, k->c, k->val, k->bt, loss))
		return -1;
	printf("step %5lld: validation loss %.7f\n", (long long)done, *loss);
	return 0;
}

static int gpt_evaluate(train_run *t, void *ctx, int64_t done, double *loss, double *acc)
{
	*acc = NAN;
	return gpt_validate_line(t, ctx, done, loss);
}

/* --val-interval: a validation between epochs' ends (the driver
 * evaluates at those). */
static int gpt_after_step(train_run *t, void *ctx, int64_t done, int epoch_end)
{
	gpt_task *k = ctx;
	double loss;
	if (epoch_end || !k->c->val_interval || done % k->c->val_interval)
		return 0;
	return gpt_validate_line(t, k, done, &loss);
}

static int gpt_finish(train_run *t, void *ctx)
{
	gpt_task *k = ctx;
	if (k->c->sample > 0 && k->c->vocab == 256)
		return sample(t, k->c, k->m, k->val, k->bt);
	return 0;
}

/* A setting of c a config.json gives too: its value as the flag writes it. */
static void gpt_setting_text(const gpt_cfg *c, int k, char *buf, size_t len)
{
	const int v[GPT_SET_COUNT] = { c->layers, c->heads, c->embd, c->context, c->vocab, 0 };
	if (k == GPT_SET_GELU)
		snprintf(buf, len, "%s", c->gelu_tanh ? "tanh" : "erf");
	else
		snprintf(buf, len, "%d", v[k]);
}

/* Setting k against config.json's key (value val): 0 if no flag or preset
 * gave it or they agree, else 1 after naming both. */
static int gpt_conflict(const gpt_cfg *c, int k, int agree, const char *key, const char *val,
			const char *path)
{
	char have[32];
	if (!c->set_by[k] || agree)
		return 0;
	gpt_setting_text(c, k, have, sizeof(have));
	if (c->set_by[k] == gpt_set_flags[k])
		fprintf(stderr, "gpt_ddp: %s %s conflicts with config.json %s %s (%s)\n",
			gpt_set_flags[k], have, key, val, path);
	else
		fprintf(stderr, "gpt_ddp: %s (%s %s) conflicts with config.json %s %s (%s)\n",
			c->set_by[k], gpt_set_flags[k], have, key, val, path);
	return 1;
}

/*
 * --init-from DIR (Hugging Face's folder) or FILE with config.json beside
 * it: the weights' path into weights (what train_compile then reads), the
 * model's shape, GELU and layer norms' epsilon from the config. A setting
 * a flag (or --preset) gave must agree: the same value, or a --context no
 * longer than n_positions (wpe's first rows). No config.json beside FILE:
 * c is left as the flags made it. -1 to go on, else the exit status after
 * saying why (2: a flag disagrees; 1: the folder or config is at fault).
 */
static int gpt_init_from_hf(const char *arg, gpt_cfg *c, char *weights, size_t wlen, int say)
{
	char config[4096], err[1024], val[GPT_SET_COUNT][48];
	gpt_hf_config h;
	int rc = gpt_hf_paths(arg, weights, wlen, config, sizeof(config), err, sizeof(err));
	if (rc == 1)
		rc = gpt_hf_config_load(config, &h, err, sizeof(err)) ? -1 : 1;
	if (rc < 0) {
		fprintf(stderr, "gpt_ddp: --init-from: %s\n", err);
		return 1;
	}
	if (rc == 0)
		return -1;
	const int want[GPT_SET_COUNT] = { h.n_layer, h.n_head, h.n_embd, h.n_positions, h.vocab_size };
	for (int k = 0; k < GPT_SET_GELU; k++)
		snprintf(val[k], sizeof(val[k]), "%d%s", want[k],
			 k == GPT_SET_CONTEXT ? " (the longest context)" : "");
	int bad = gpt_conflict(c, GPT_SET_LAYERS, c->layers == h.n_layer, "n_layer", val[0], config);
	bad |= gpt_conflict(c, GPT_SET_HEADS, c->heads == h.n_head, "n_head", val[1], config);
	bad |= gpt_conflict(c, GPT_SET_EMBD, c->embd == h.n_embd, "n_embd", val[2], config);
	bad |= gpt_conflict(c, GPT_SET_CONTEXT, c->context <= h.n_positions, "n_positions", val[3],
			    config);
	bad |= gpt_conflict(c, GPT_SET_VOCAB, c->vocab == h.vocab_size, "vocab_size", val[4], config);
	bad |= gpt_conflict(c, GPT_SET_GELU, c->gelu_tanh == h.gelu_tanh, "activation_function",
			    h.activation, config);
	if (bad)
		return 2;
	c->layers = h.n_layer, c->heads = h.n_head, c->embd = h.n_embd, c->vocab = h.vocab_size;
	if (!c->set_by[GPT_SET_CONTEXT])
		c->context = h.n_positions;
	c->gelu_tanh = h.gelu_tanh;
	c->ln_eps = h.layer_norm_epsilon;
	c->hf_config = 1;
	if (say)
		printf("model from %s: %d layers, %d heads, %d wide, n_positions %d, vocabulary %d, "
		       "%s (--gelu %s), layer norm epsilon %g\n", config, h.n_layer, h.n_head,
		       h.n_embd, h.n_positions, h.vocab_size, h.activation,
		       h.gelu_tanh ? "tanh" : "erf", h.layer_norm_epsilon);
	return -1;
}

/* --export-format hf: config.json beside the exported file, GPT2Config's
 * fields for this model (Hugging Face's from_pretrained reads both from
 * one folder, the weights as model.safetensors). 0 or -1 after saying why. */
static int write_hf_config(const train_run *t, const gpt_cfg *c)
{
	const char *path = t->a.export_path, *slash = strrchr(path, '/');
	char cfg[4200], eps[32];
	/* The shortest of %.15g and %.17g that reads back as the epsilon. */
	snprintf(eps, sizeof(eps), "%.15g", c->ln_eps);
	if (strtod(eps, NULL) != c->ln_eps)
		snprintf(eps, sizeof(eps), "%.17g", c->ln_eps);
	if (slash)
		snprintf(cfg, sizeof(cfg), "%.*s/config.json", (int)(slash - path), path);
	else
		snprintf(cfg, sizeof(cfg), "config.json");
	FILE *f = fopen(cfg, "w");
	if (!f) {
		fprintf(stderr, "gpt_ddp: --export-format hf: %s: %s\n", cfg, strerror(errno));
		return -1;
	}
	fprintf(f,
		"{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n"
		"  \"vocab_size\": %d,\n  \"n_positions\": %d,\n  \"n_ctx\": %d,\n  \"n_embd\": %d,\n"
		"  \"n_layer\": %d,\n  \"n_head\": %d,\n  \"n_inner\": null,\n"
		"  \"activation_function\": \"%s\",\n  \"layer_norm_epsilon\": %s,\n"
		"  \"resid_pdrop\": 0.0,\n  \"embd_pdrop\": 0.0,\n  \"attn_pdrop\": 0.0,\n"
		"  \"initializer_range\": 0.02,\n  \"scale_attn_weights\": true,\n"
		"  \"tie_word_embeddings\": true,\n  \"bos_token_id\": null,\n  \"eos_token_id\": null,\n"
		"  \"torch_dtype\": \"%s\"\n}\n",
		c->vocab, c->context, c->context, c->embd, c->layers, c->heads,
		c->gelu_tanh ? "gelu_new" : "gelu", eps, c->dtype == LOOM_F64 ? "float64" : "float32");
	if (fclose(f) != 0) {
		fprintf(stderr, "gpt_ddp: --export-format hf: %s: %s\n", cfg, strerror(errno));
		return -1;
	}
	printf("wrote %s (GPT2Config: GPT2LMHeadModel.from_pretrained loads the folder%s)\n", cfg,
	       strcmp(slash ? slash + 1 : path, "model.safetensors") ?
		       "; it looks for model.safetensors" : "");
	return 0;
}

/* This rank's peak resident set (getrusage's ru_maxrss: private memory
 * and the mapped shards' pages it touched, which the page cache shares
 * with the host's other ranks), said so that a run's memory can be read
 * back (tests/examples/test_gpt_shards.sh). */
static void print_peak_rss(const train_run *t, const gpt_data *d)
{
	struct rusage ru;
	if (getrusage(RUSAGE_SELF, &ru) != 0)
		return;
	/* The other ranks' stdout is /dev/null (train_start): theirs on stderr. */
	fprintf(t->grank == 0 ? stdout : stderr, "rank %d: peak RSS %.1f MiB (ru_maxrss; data %s)\n",
		t->grank, ru.ru_maxrss / 1024.0,
		d->shards.count ? "mapped" : d->text.ids ? "held as ids" : "not read");
}

/*
 * What start-up checks once the flags are read: --export-format against
 * --export, the model from --init-from's config.json, the heads against
 * the width, this program's own outputs (before any data is read or step
 * taken). -1 to go on, else main's exit status after saying why.
 */
static int gpt_check_start(train_run *t, gpt_cfg *c, char *weights, size_t wlen)
{
	const train_args *a = &t->a;
	int rc;

	if (c->export_hf && !a->export_path) {
		fprintf(stderr, "gpt_ddp: --export-format hf applies to --export FILE\n");
		return 2;
	}
	/* A Hugging Face folder, or config.json beside the file: the model's
	 * shape from it, the weights' file what train_compile reads. */
	if (a->init_from &&
	    (rc = gpt_init_from_hf(a->init_from, c, weights, wlen, t->rank == 0)) >= 0)
		return rc;
	if (a->init_from)
		t->a.init_from = weights;
	if (c->embd % c->heads) {
		fprintf(stderr, "gpt_ddp: --embd %d is not divisible by --heads %d\n", c->embd,
			c->heads);
		return 2;
	}
	const char *const out_flags[] = { "--loss-file", "--write-llmc", "--write-logits" };
	const char *const out_paths[] = { c->loss_file, c->llmc_out, c->logits_out };
	return train_check_program_outputs(t, out_flags, out_paths, 3) ? 1 : -1;
}

/* The flags (this program's and the shared ones, one parser), the group,
 * the model's shape; weights receives --init-from's file. -1 to go on
 * (t started), else main's exit status. */
static int gpt_start(train_run *t, gpt_cfg *c, char *weights, size_t wlen, int argc, char **argv)
{
	unsigned char given[FLAG_ROW_COUNT] = { 0 };
	flag_target own;
	char wd[512];
	int rc;

	*c = gpt_cfg_defaults;
	own = gpt_target(c, given);
	/* Relative paths are the user's under `bazel run` too; then --nproc:
	 * the workers get every flag, this program's too. */
	if (train_enter_user_dir(wd, sizeof(wd))) {
		fprintf(stderr, "gpt_ddp: %s\n", wd);
		return 2;
	}
	if ((rc = loom_launch_maybe(&argc, argv)) >= 0)
		return rc;
	if ((rc = train_start_with(t, &train_gpt_ddp, &own, argc, argv)) >= 0)
		return rc;
	gpt_given(c, given);
	if (c->preset)
		gpt_preset(c);
	if ((rc = gpt_check_start(t, c, weights, wlen)) >= 0)
		train_end(t);
	return rc;
}

/* The data, against the model and the batch (quick: --dry-run of a preset
 * reads none). 0, or -1 after saying why. */
static int gpt_load(train_run *t, gpt_cfg *c, int quick, gpt_data *d, int64_t *windows)
{
	const train_args *a = &t->a;
	const int B = a->batch, T = c->context;

	if (B > 4096) {
		fprintf(stderr, "gpt_ddp: --batch-size %d: at most 4096 sequences per rank\n", B);
		return -1;
	}
	if (!quick && load_data(c, a, loom_pg_get_info(t->pg)->local_world, d))
		return -1;
	if (!c->vocab)
		c->vocab = d->vocab;
	if (!a->dry_run && d->vocab > c->vocab) {
		fprintf(stderr, "gpt_ddp: the data has ids up to %d, %s %d is too small\n",
			d->vocab - 1, c->hf_config ? "config.json's vocab_size" : "--vocab", c->vocab);
		return -1;
	}
	*windows = d->train.n > T ? (d->train.n - 1) / T : 0;
	if (!a->dry_run && (*windows < (int64_t)B * t->world || (d->val.n - 1) / T < B)) {
		fprintf(stderr, "gpt_ddp: %lld training and %lld held-out tokens are too few for "
			"--batch-size %d x %d rank(s) of --context %d\n", (long long)d->train.n,
			(long long)d->val.n, B, t->world, T);
		return -1;
	}
	return 0;
}

/* The graph, Hugging Face's names, the initial values, compiled: 0, 1
 * after --dry-run, -1 after saying why. */
static int gpt_compile(train_run *t, gpt_cfg *c, const gpt_data *d, int quick, loom_graph **g,
		       gpt_model *m)
{
	const train_args *a = &t->a;
	char what[3000], data[2600], sched[96], size[96];

	if (loom_graph_new(g) != LOOM_OK || gpt_build(*g, c, a->batch, m)) {
		fprintf(stderr, "gpt_ddp: %s\n", *g ? loom_graph_error(*g) : "out of memory");
		return -1;
	}
	loom_graph_set_seed(*g, a->seed);
	describe_data(c, a, d, quick, data, sizeof(data));
	snprintf(what, sizeof(what),
		 "GPT %d layers, %d heads, %d wide, context %d, vocabulary %d, %s GELU, on %s, "
		 "clip %g",
		 c->layers, c->heads, c->embd, c->context, c->vocab, c->gelu_tanh ? "tanh" : "erf",
		 data, a->clip_grad);
	/* Hugging Face's GPT-2 files in (recognised) and out (--export-format hf). */
	t->names = gpt_hf_names;
	t->n_names = GPT_COUNT(gpt_hf_names);
	t->conv1d = gpt_hf_conv1d;
	t->n_conv1d = GPT_COUNT(gpt_hf_conv1d);
	t->conv1d_export = c->export_hf;
	t->ignore = gpt_hf_ignore;
	t->n_ignore = GPT_COUNT(gpt_hf_ignore);
	t->first_rows = gpt_hf_rows;
	t->n_first_rows = GPT_COUNT(gpt_hf_rows);
	/* GPT-2's initial values (or --init), then --init-from over them. */
	gpt_init_ctx ic = { c, *g, m };
	t->init = gpt_init_hook;
	t->init_ctx = &ic;
	if (c->constant_lr)
		snprintf(sched, sizeof(sched), "constant");
	else
		snprintf(sched, sizeof(sched), "%d warm-up steps, cosine to a tenth", c->warmup_steps);
	t->schedule_text = sched;
	snprintf(size, sizeof(size), "--context %d at --batch-size %d", c->context, a->batch);
	t->size_text = size;
	int rc = train_compile(t, *g, m->loss, LOOM_NONE, c->vocab, what);
	/* train_compile alone reads these: none outlives this function */
	t->init = NULL;
	t->init_ctx = NULL;
	t->schedule_text = t->size_text = NULL;
	return rc;
}

/* The batches' buffers and this rank's sampler: 0, or -1 after saying why. */
static int gpt_batches(train_run *t, const gpt_cfg *c, int64_t windows, gpt_batch *bt,
		       loom_sampler **sampler)
{
	const train_args *a = &t->a;
	size_t n = (size_t)a->batch * c->context;
	char err[512];

	bt->ids = malloc(sizeof(int32_t) * n);
	bt->pos = malloc(sizeof(int32_t) * n);
	bt->targets = malloc(sizeof(int32_t) * n);
	if (!bt->ids || !bt->pos || !bt->targets ||
	    loom_sampler_new(windows, t->rank, t->world, 1, a->seed, 1, sampler, err,
			     sizeof(err))) {
		fprintf(stderr, "gpt_ddp: %s\n", bt->ids ? err : "out of memory");
		return -1;
	}
	return 0;
}

/* The training loop over the compiled program: 0, or -1 after saying why. */
static int gpt_train(train_run *t, gpt_cfg *c, const gpt_model *m, gpt_data *d, gpt_batch *bt,
		     loom_sampler *sampler, int64_t windows, FILE **lossf)
{
	const train_args *a = &t->a;
	const int B = a->batch;
	/* MFU as nanoGPT estimates it: 6 N + 12 L C T FLOPs per token. */
	loom_program_info info;
	loom_program_info_get(t->p, &info);
	gpt_task k = { .c = c, .m = m, .train = &d->train, .val = &d->val, .bt = bt,
		       .sampler = sampler, .windows = windows,
		       .per_epoch = loom_sampler_len(sampler) / B / a->accumulate };
	k.flops_tok = 6.0 * info.n_param_elems + 12.0 * c->layers * c->embd * c->context;
	k.peak = a->peak_flops > 0 ? a->peak_flops :
				     train_peak_flops(a->device, a->level, a->half, !a->no_tf32);
	char how[64];
	printf("MFU against %.1f GFLOP/s (%s), %.1f MFLOP per token\n", k.peak / 1e9,
	       train_peak_how(how, sizeof(how), a->peak_flops, a->device, a->level, a->half),
	       k.flops_tok / 1e6);

	if (c->loss_file && t->rank == 0 && !(*lossf = fopen(c->loss_file, "w"))) {
		fprintf(stderr, "gpt_ddp: --loss-file %s: %s\n", c->loss_file, strerror(errno));
		return -1;
	}
	k.lossf = *lossf;
	/* A step runs --accumulate windows of B per rank. */
	train_task task = {
		.ctx = &k,
		.per_epoch = k.per_epoch,
		.samples_per_step = (int64_t)B * t->world * a->accumulate,
		.accumulates_itself = 1,
		.unit = "seq",
		.log_last = 1,
		.epoch_begin = gpt_epoch_begin,
		.step = gpt_step,
		.evaluate = gpt_evaluate,
		.after_step = gpt_after_step,
		.lr = gpt_lr,
		.progress = gpt_progress,
		.finish = gpt_finish,
	};
	if (train_drive(t, &task))
		return -1;
	if (c->export_hf && a->export_path && t->rank == 0 && write_hf_config(t, c))
		return -1;
	return 0;
}

/* After compiling: --write-llmc or --write-logits and stop, or train. */
static int gpt_run(train_run *t, gpt_cfg *c, gpt_model *m, loom_graph *g, gpt_data *d,
		   gpt_batch *bt, loom_sampler **sampler, int64_t windows, FILE **lossf)
{
	const train_args *a = &t->a;

	if (t->init_report.transposed && !c->gelu_tanh && !c->hf_config)
		printf("note: %s is in Hugging Face's GPT-2 layout; GPT-2's GELU is the tanh form "
		       "(--gelu tanh), this model's the exact one\n", a->init_from);
	if (c->llmc_out)
		return t->rank == 0 && write_llmc(t, c, g, m) ? 1 : 0;
	if (gpt_batches(t, c, windows, bt, sampler))
		return 1;
	if (c->logits_out)
		return write_logits(t, c, m, &d->train, bt) ? 1 : 0;
	return gpt_train(t, c, m, d, bt, *sampler, windows, lossf) ? 1 : 0;
}

int main(int argc, char **argv)
{
	gpt_cfg c;
	train_run t;
	char init_weights[4096];
	int rc = gpt_start(&t, &c, init_weights, sizeof(init_weights), argc, argv);
	if (rc >= 0)
		return rc;
	const train_args *a = &t.a;
	gpt_data d = { 0 };
	gpt_model m = { 0 };
	gpt_batch bt = { 0 };
	loom_graph *g = NULL;
	loom_sampler *sampler = NULL;
	FILE *lossf = NULL;
	int64_t windows = 0;
	/* GPT-2's size compiled with --dry-run needs no data */
	int quick = a->dry_run && c.vocab == 50257;

	rc = 1;
	if (gpt_load(&t, &c, quick, &d, &windows))
		goto out;
	switch (gpt_compile(&t, &c, &d, quick, &g, &m)) {
	case 0: break;
	case 1: rc = 0; goto out; /* --dry-run */
	default: goto out;
	}
	rc = gpt_run(&t, &c, &m, g, &d, &bt, &sampler, windows, &lossf);
out:
	if (lossf && fclose(lossf) != 0) {
		fprintf(stderr, "gpt_ddp: --loss-file %s: %s\n", c.loss_file, strerror(errno));
		rc = 1;
	}
	free(bt.ids);
	free(bt.pos);
	free(bt.targets);
	loom_sampler_free(sampler);
	if (rc == 0 && (d.train.n || a->dry_run))
		print_peak_rss(&t, &d);
	train_end(&t);
	loom_graph_free(g);
	gpt_model_free(&m);
	gpt_data_free(&d);
	return rc;
}
