/*
 * test_cuda_ops.c — every op on the CUDA backend against the CPU backend on
 * the same fresh random inputs, in f32, f16 and bf16 (one-op graphs compiled
 * twice; outputs and gradients compared by NMSE with a per-dtype bound, the
 * CUDA arena poisoned with NaN so an element no kernel writes fails), and
 * ConvNet and small ResNet training steps under O0, O1 and O2. Both backends
 * must compile the same plan (the relu fusions into pools, linears, batch
 * norms and adds included). Without
 * a GPU every test skips, naming why; with LOOM_REQUIRE_GPU=1 it fails.
 * The bounds are first guesses (engine/cuda/README.md, Status).
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#if LOOM_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "base/cuda_plugin.h"
#include "comm/comm.h"
#include "base/fp8.h"
#include "base/half.h"
#include "engine/cpu/kernels.h"
#include "engine/cuda/device.h"
#include "parallel/parallel.h"
#include "tests/engine/cuda/need_gpu.h"
#include "engine/program_internal.h"
#include "graph/ops/ops.h"
#include "examples/models.h"
#include "tests/engine/fake_async.h"
#include "tests/engine/gpt_parts.h"

/* Every case here compares a CUDA plan with its CPU twin node for node,
 * both NCHW (the NHWC cases, which set cuda_nhwc, compile the CUDA side
 * with formats on and compare values only); the CPU's planner would
 * give a ResNet's activations oneDNN's blocked format, with reorder nodes
 * (5 in ResNet-18's training plan), so the twins are compiled NCHW too,
 * whatever the environment says (under bazel, .bazelrc pins the same; the
 * GPU bundle runs the binary bare). The CPU's formats are
 * tests/engine/cpu:test_formats's subject. */
__attribute__((constructor)) static void cpu_twins_plan_nchw(void)
{
	setenv("LOOM_FORMATS", "nchw", 1);
}
#include "loom.h"
#include "tests/engine/print_text.h"

/* NULL when this machine can run the CUDA backend, else why not. */
static const char *no_gpu(void)
{
	static char why[512];
	return loom_test_no_gpu(why, sizeof(why));
}

#define NEED_GPU() LOOM_NEED_GPU()

static int tf32;

/* TF32 keeps 10 mantissa bits of each product input, as fp16 does. */
static double bound(loom_dtype dt)
{
	if (dt == LOOM_F32 && tf32)
		return 1e-4;
	return dt == LOOM_F32 ? 1e-8 : dt == LOOM_F16 ? 1e-4 : 1e-3;
}

static uint64_t rng_state;
static int own_kernels; /* the plugin's test_own_kernels is on */

/* The CUDA plugin this binary links (//engine/cuda:plugin_static), NULL in
 * a build without the toolkit: its test hooks are reached through it. */
static const loom_cuda_plugin *plugin(void)
{
	return loom_cuda_plugin_load(NULL, 0);
}

static double urand(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return (double)(rng_state >> 11) / (double)(1ull << 53) * 2.0 - 1.0;
}

/* sum (a - ref)^2 / sum ref^2; NaN anywhere gives NaN, which fails. */
static double nmse(const double *a, const double *ref, size_t n)
{
	double num = 0, den = 0;
	for (size_t i = 0; i < n; i++) {
		num += (a[i] - ref[i]) * (a[i] - ref[i]);
		den += ref[i] * ref[i];
	}
	return den > 0 ? num / den : num;
}

/* A one-op case: its parameters (random, compared by gradient), buffers
 * (compared by value after the run) and integer labels. */
typedef struct tcase {
	loom_dtype dt;
	loom_value param[16]; /* the NHWC block holds 8 and the head's r */
	int n_param;
	loom_value buf[4];
	int n_buf;
	int64_t n_labels, classes; /* labels input "labels" when n_labels > 0 */
	int bad_label;
	int fused_pools; /* max-pools the plan must carry a fused relu in */
	int fused_relus; /* batch norms and adds that must carry a fused relu */
	loom_opt_level level; /* AMP level both programs compile with (amp_half) */
	int bn_half;          /* amp.bn_half at O1 */
	int want_bn_cudnn;    /* batch-norm nodes cuDNN must run, -1: any */
	int want_attn_fused;  /* attentions the CUDA plan must fuse (cuDNN SDPA), -1: any */
	int want_nhwc;        /* under cuda_nhwc: values the CUDA plan must hold in NHWC, at least */
	/* Up to 3 notes the CUDA plan's --dump-graph must show (the path a
	 * switch took): for each, a node of op note_op[i] whose backend note
	 * holds note[i] (NULL: none). */
	const char *note[3];
	loom_op note_op[3];
	const char *no_note; /* no node's note may hold it (NULL: no check) */
} tcase;

typedef loom_value (*build_fn)(loom_graph *g, tcase *t);

static loom_value param(loom_graph *g, tcase *t, const char *name, int ndim, int64_t d0,
			int64_t d1, int64_t d2, int64_t d3)
{
	int64_t dims[4] = { d0, d1, d2, d3 };
	loom_value v = loom_param(g, name, t->dt, ndim, dims, LOOM_INIT_ZEROS, 1);
	t->param[t->n_param++] = v;
	return v;
}

static loom_value labels(loom_graph *g, tcase *t, int64_t n, int64_t classes)
{
	t->n_labels = n;
	t->classes = classes;
	return loom_input(g, "labels", LOOM_I32, 1, &n);
}

/* loss = y . r for a random r (one matmul), so that dy is random too. */
static loom_value head(loom_graph *g, tcase *t, loom_value y)
{
	loom_shape s = loom_value_shape(g, y);
	if (s.ndim == 0)
		return y;
	int64_t n = loom_shape_numel(&s), row[2] = { 1, n };
	loom_value r = param(g, t, "head.r", 2, n, 1, 0, 0);
	return loom_sum(g, loom_matmul(g, loom_reshape(g, y, 2, row), r));
}

/* Pools that carry a fused relu (graph/fuse.c), forward and backward. */
static int fused_pools(const loom_program *p)
{
	int n = 0;
	for (int v = 0; v < p->plan.g->n; v++) {
		const loom_node *nd = &p->plan.g->nodes[v];
		if ((nd->op == LOOM_OP_MAXPOOL2D || nd->op == LOOM_OP_MAXPOOL2D_BWD) && nd->a.pool.relu)
			n++;
	}
	return n;
}

/* Batch norms and adds that carry a fused relu (graph/fuse.c). */
static int fused_relus(const loom_program *p)
{
	int n = 0;
	for (int v = 0; v < p->plan.g->n; v++) {
		const loom_node *nd = &p->plan.g->nodes[v];
		n += (nd->op == LOOM_OP_BATCHNORM2D && nd->a.bn.relu) ||
		     (nd->op == LOOM_OP_ADD && nd->a.ew.relu);
	}
	return n;
}

/* The CPU and CUDA programs run the same plan: node for node the same op,
 * dtype and fused relu, so a comparison of values compares kernels. One
 * difference is the casts each folds: the CPU into any producer or its
 * one reader (LOOM_BE_FUSES_CASTS, graph/fuse.c's loom_fuse_casts), CUDA
 * only at the ops its own kernels take any dtype for, but into every
 * reader of a widening cast (LOOM_BE_FUSES_SOME_CASTS, loom_fuse_casts_for
 * with the backend's takes_any_dtype). A cast folded on one side only is a
 * view (reshape) there and a cast on the other; the producer it went into
 * (LOOM_NODE_CAST_FOLDED), and the views between, compute in the cast's
 * dtype there. */
static int cast_folded_on_one_side(const loom_node *cuda, const loom_node *cpu)
{
	if ((cuda->op == LOOM_OP_CAST && cpu->op == LOOM_OP_RESHAPE) ||
	    (cuda->op == LOOM_OP_RESHAPE && cpu->op == LOOM_OP_CAST))
		return 1;
	return cuda->op == cpu->op &&
	       ((cpu->flags & LOOM_NODE_CAST_FOLDED) || (cuda->flags & LOOM_NODE_CAST_FOLDED) ||
		cpu->op == LOOM_OP_RESHAPE);
}

/* Every producer the CUDA plan folded a cast into (LOOM_NODE_CAST_FOLDED)
 * is an op whose CUDA kernel takes any dtype (a library call would write
 * its own dtype whatever the plan says). */
static void expect_cuda_folds_where_taken(const char *what, const loom_program *cuda)
{
	const loom_backend_planning *pn = cuda->be->planning;
	const loom_graph *g = cuda->plan.g;
	for (int v = 0; v < g->n; v++) {
		const loom_node *n = &g->nodes[v];
		if (n->flags & LOOM_NODE_CAST_FOLDED)
			cr_expect(pn && pn->takes_any_dtype && pn->takes_any_dtype((loom_op)n->op),
				  "%s: a cast folded into node %d (op %d), whose CUDA kernel "
				  "does not take any dtype", what, v, (int)n->op);
	}
}

/* The CUDA plan runs half causal attention as cuDNN's SDPA
 * (graph/fuse_attention.c), the CPU's never: the fused nodes, and the
 * backward nodes the fusion left as dead views, differ by design. */
static int attn_fused_on_cuda(const loom_node *cuda, const loom_node *cpu)
{
	if ((cuda->op == LOOM_OP_ATTN_PROBS || cuda->op == LOOM_OP_ATTENTION ||
	     cuda->op == LOOM_OP_ATTN_PROBS_BWD) &&
	    cuda->a.attn.fused)
		return 1;
	return cuda->op == LOOM_OP_RESHAPE &&
	       (cpu->op == LOOM_OP_ATTENTION_BWD_PROBS || cpu->op == LOOM_OP_ATTENTION_BWD_QKV ||
		cpu->op == LOOM_OP_ATTN_PROBS_BWD);
}

/* Fused attentions in p's plan (ATTN_PROBS carrying attrs.attn.fused);
 * why: the backend's --dump-graph note on the first one left unfused. */
static int fused_attentions(const loom_program *p, char *why, size_t len)
{
	int n = 0;
	why[0] = 0;
	for (int v = 0; v < p->plan.g->n; v++) {
		const loom_node *nd = &p->plan.g->nodes[v];
		if (nd->op != LOOM_OP_ATTN_PROBS)
			continue;
		if (nd->a.attn.fused)
			n++;
		else if (!why[0] && p->be->planning->node_note)
			p->be->planning->node_note(p->be_ctx, &p->plan, v, why, len);
	}
	return n;
}

static void expect_same_plan(const char *what, const loom_program *cpu, const loom_program *cuda)
{
	cr_assert_eq(cuda->plan.g->n, cpu->plan.g->n, "%s: cuda plans %d nodes, cpu %d", what, cuda->plan.g->n,
		     cpu->plan.g->n);
	for (int v = 0; v < cpu->plan.g->n; v++) {
		const loom_node *a = &cuda->plan.g->nodes[v], *b = &cpu->plan.g->nodes[v];
		int pool = b->op == LOOM_OP_MAXPOOL2D || b->op == LOOM_OP_MAXPOOL2D_BWD;
		int lin = b->op == LOOM_OP_LINEAR;
		int bn = b->op == LOOM_OP_BATCHNORM2D, add = b->op == LOOM_OP_ADD;
		if ((a->op != b->op || a->dtype != b->dtype) && cast_folded_on_one_side(a, b))
			continue;
		if (attn_fused_on_cuda(a, b))
			continue;
		cr_expect(a->op == b->op && a->dtype == b->dtype &&
				  (!pool || a->a.pool.relu == b->a.pool.relu) &&
				  (!lin || a->a.mm.relu == b->a.mm.relu) &&
				  (!bn || a->a.bn.relu == b->a.bn.relu) &&
				  (!add || a->a.ew.relu == b->a.ew.relu) && a->made_by == b->made_by,
			  "%s: node %d differs: cuda op %d dtype %d, cpu op %d dtype %d", what, v,
			  (int)a->op, (int)a->dtype, (int)b->op, (int)b->dtype);
	}
}

/* Compile with sync_bn (under engine/ddp.c's world-1 hook: the batch norms
 * are marked, nothing is all-reduced). */
static int sync_bn;
/* tf32 (above): compile fp32 products and convolutions on TF32 tensor
 * cores, the default of a plan; every other case asks for exact fp32. */

/* Compile the CUDA program with the planner's formats and LOOM_CUDA_NHWC
 * set to this ("half", "all"; NULL: NCHW like its CPU twin, which is always
 * NCHW). */
static const char *cuda_nhwc;

/* The half type an AMP level compiles with (fp16 unless a case asks for
 * bf16, which takes no loss scale), and amp.bn_half (O1's batch norm in
 * it): both programs alike. */
static loom_dtype amp_half = LOOM_F16;
static int amp_bn_half;
/* Leave loom_compile_opts.vocab_pad at its default (-1: the backend's
 * multiple, CUDA's 128, the CPU's none); every other case asks for none,
 * as the plans before that default were, so that its padding notes and
 * LOOM_CUDA_LT_PAD's copies are the cases' own. */
static int vocab_pad_default;

/* The CPU twin plans the fusions the CUDA plan makes under its switches:
 * the CPU's own switches of the same fusions default to on
 * (LOOM_FUSE_LN_RESIDUAL, LOOM_FUSE_LN_BWD_ACCUM, LOOM_FUSE_EMB_BWD_ACCUM),
 * CUDA's to off until a
 * lease decides them, and the plans must agree node for node. keep[i]
 * gets the CPU switch's value before (NULL: unset), restored by
 * cpu_twin_switches_restore. */
#define CPU_TWIN_VARS 3
static const char *const cpu_twin_vars[CPU_TWIN_VARS][2] = {
	{ "LOOM_FUSE_LN_RESIDUAL", "LOOM_CUDA_LN_RESIDUAL" },
	{ "LOOM_FUSE_LN_BWD_ACCUM", "LOOM_CUDA_LN_BWD_ACCUM" },
	{ "LOOM_FUSE_EMB_BWD_ACCUM", "LOOM_CUDA_EMB_BWD_ACCUM" },
};

static void cpu_twin_switches(char *keep[CPU_TWIN_VARS])
{
	for (int i = 0; i < CPU_TWIN_VARS; i++) {
		const char *was = getenv(cpu_twin_vars[i][0]), *cuda = getenv(cpu_twin_vars[i][1]);
		keep[i] = was ? strdup(was) : NULL;
		setenv(cpu_twin_vars[i][0], cuda && !strcmp(cuda, "1") ? "1" : "0", 1);
	}
}

static void cpu_twin_switches_restore(char *keep[CPU_TWIN_VARS])
{
	for (int i = 0; i < CPU_TWIN_VARS; i++) {
		if (keep[i])
			setenv(cpu_twin_vars[i][0], keep[i], 1);
		else
			unsetenv(cpu_twin_vars[i][0]);
		free(keep[i]);
	}
}

static loom_program *compile_at(loom_graph *g, loom_value loss, loom_device dev,
			       loom_opt_level level)
{
	loom_compile_opts o;
	loom_program *p = NULL;
	int nhwc = cuda_nhwc && dev == LOOM_DEVICE_CUDA;
	loom_compile_opts_default(&o);
	o.no_tf32 = !tf32; /* exact fp32 unless a TF32 case asks */
	o.device = dev;
	o.sync_bn = sync_bn;
	o.amp.level = level;
	o.amp.half = amp_half;
	o.amp.bn_half = level == LOOM_O1 && amp_bn_half;
	if (!vocab_pad_default)
		o.vocab_pad = 0;
	/* A scale of 1: the one-op heads' gradients would overflow fp16 at
	 * the dynamic scaler's 2^16. */
	if (level != LOOM_O0 && amp_half == LOOM_F16)
		o.amp.static_scale = 1.0;
	o.optim.kind = LOOM_OPTIM_NONE;
	if (plugin())
		plugin()->test_poison(dev == LOOM_DEVICE_CUDA);
	if (nhwc) {
		setenv("LOOM_FORMATS", "auto", 1);
		setenv("LOOM_CUDA_NHWC", cuda_nhwc, 1);
	}
	char *keep[CPU_TWIN_VARS] = { NULL, NULL, NULL };
	if (dev == LOOM_DEVICE_CPU)
		cpu_twin_switches(keep);
	loom_status st = loom_compile(g, loss, &o, &p);
	if (dev == LOOM_DEVICE_CPU)
		cpu_twin_switches_restore(keep);
	if (nhwc) {
		setenv("LOOM_FORMATS", "nchw", 1);
		unsetenv("LOOM_CUDA_NHWC");
	}
	if (plugin())
		plugin()->test_poison(0);
	cr_assert_eq(st, LOOM_OK, "compile on %s: %s", dev == LOOM_DEVICE_CUDA ? "cuda" : "cpu",
		     loom_last_error());
	return p;
}

static void read_value(loom_program *p, loom_value v, int grad, double *dst, size_t n)
{
	loom_status st = grad ? loom_read_grad_f64(p, v, dst, n) : loom_read_f64(p, v, dst, n);
	cr_assert_eq(st, LOOM_OK, "%s", loom_program_error(p));
}

static void compare(const char *op, const char *what, loom_dtype dt, loom_program *cuda,
		    loom_program *cpu, loom_value v, int grad, size_t n)
{
	double *a = malloc(n * sizeof(double)), *b = malloc(n * sizeof(double));
	cr_assert(a && b);
	read_value(cuda, v, grad, a, n);
	read_value(cpu, v, grad, b, n);
	double e = nmse(a, b, n);
	cr_expect(e <= bound(dt), "%s %s %s: NMSE %g > %g (cuda[0] %g, cpu[0] %g)", op,
		  loom_dtype_name(dt), what, e, bound(dt), a[0], b[0]);
	free(a);
	free(b);
}

static size_t numel_of(loom_graph *g, loom_value v)
{
	loom_shape s = loom_value_shape(g, v);
	return (size_t)loom_shape_numel(&s);
}

/* Builds the case, runs it on both backends with the same inputs, compares
 * the op's output, the loss, every gradient and every buffer. */
static void run_case(const char *op, build_fn build, loom_dtype dt, loom_run_mode mode,
		     uint64_t seed)
{
	tcase t;
	loom_graph *g;
	memset(&t, 0, sizeof(t));
	t.dt = dt;
	t.want_bn_cudnn = -1;
	t.want_attn_fused = -1;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_value y = build(g, &t);
	loom_value loss = head(g, &t, y);
	loom_mark_output(g, y);
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s: %s", op, loom_graph_error(g));
	/* Under an AMP level the graph is fp32 and runs in the half type. */
	if (t.level != LOOM_O0)
		dt = amp_half;

	amp_bn_half = t.bn_half;
	loom_program *cpu = compile_at(g, loss, LOOM_DEVICE_CPU, t.level);
	loom_program *cuda = compile_at(g, loss, LOOM_DEVICE_CUDA, t.level);
	amp_bn_half = 0;
	loom_program_info info;
	loom_program_info_get(cuda, &info);
	cr_assert(strncmp(info.backend, "cuda", 4) == 0, "%s", info.backend);
	if (cuda_nhwc) {
		/* NHWC values and the reorders at their edges: the plans differ
		 * by those; the values are compared below as always. */
		int nhwc = 0, reorders = 0;
		for (int v = 0; v < cuda->plan.g->n; v++) {
			nhwc += cuda->plan.g->nodes[v].format == LOOM_FORMAT_NHWC;
			reorders += cuda->plan.g->nodes[v].op == LOOM_OP_REORDER;
		}
		cr_expect(nhwc >= t.want_nhwc, "%s %s: %d values NHWC in the cuda plan, want >= %d",
			  op, loom_dtype_name(dt), nhwc, t.want_nhwc);
		cr_expect_eq(reorders, cuda->plan.n_reorders);
	} else {
		expect_same_plan(op, cpu, cuda);
	}
	expect_cuda_folds_where_taken(op, cuda);
	cr_expect_eq(fused_pools(cuda), t.fused_pools, "%s: %d fused pools in the cuda plan, want %d",
		     op, fused_pools(cuda), t.fused_pools);
	cr_expect_eq(fused_relus(cuda), t.fused_relus,
		     "%s: %d batch norms / adds with a fused relu in the cuda plan, want %d", op,
		     fused_relus(cuda), t.fused_relus);
	if (sync_bn) {
		/* Marked on both backends, so both run the split kernels;
		 * cuDNN takes none of them. */
		int marked = 0, bns = 0;
		for (int v = 0; v < cuda->plan.g->n; v++) {
			const loom_node *nd = &cuda->plan.g->nodes[v];
			if (nd->op == LOOM_OP_BATCHNORM2D || nd->op == LOOM_OP_BN_BWD_DATA ||
			    nd->op == LOOM_OP_BN_BWD_GAMMA) {
				bns++;
				marked += nd->a.bn.sync != 0;
			}
		}
		cr_expect(bns > 0 && marked == bns, "%s: %d of %d batch-norm nodes synchronised",
			  op, marked, bns);
		t.want_bn_cudnn = 0;
	}
	if (t.want_attn_fused >= 0) {
		char why[512];
		int nf = fused_attentions(cuda, why, sizeof(why));
		cr_expect_eq(nf, t.want_attn_fused, "%s %s: %d attentions fused (cuDNN SDPA), want %d: %s",
			     op, loom_dtype_name(dt), nf, t.want_attn_fused, why);
	}
	const loom_backend_planning *pn = cuda->be->planning;
	for (int i = 0; i < 3 && t.note[i]; i++) {
		char got[512] = "", note[512];
		int found = 0;
		for (int v = 0; v < cuda->plan.g->n && !found; v++) {
			if (cuda->plan.g->nodes[v].op != t.note_op[i] || !pn || !pn->node_note)
				continue;
			pn->node_note(cuda->be_ctx, &cuda->plan, v, note, sizeof(note));
			found = strstr(note, t.note[i]) != NULL;
			if (!got[0])
				snprintf(got, sizeof(got), "%s", note);
		}
		cr_expect(found, "%s %s: no node of op %d notes \"%s\" (first: \"%s\")", op,
			  loom_dtype_name(dt), (int)t.note_op[i], t.note[i], got);
	}
	for (int v = 0; t.no_note && pn && pn->node_note && v < cuda->plan.g->n; v++) {
		char note[512];
		pn->node_note(cuda->be_ctx, &cuda->plan, v, note, sizeof(note));
		cr_expect(!strstr(note, t.no_note), "%s %s: node %d notes \"%s\"", op,
			  loom_dtype_name(dt), v, note);
	}
	int bn_cudnn, bgrad;
	bn_cudnn = bgrad = 0;
	/* The hooks read the CUDA backend's context (NULL: another backend). */
	const void *cuda_ctx = strcmp(cuda->be->name, "cuda") == 0 ? cuda->be_ctx : NULL;
	if (plugin())
		plugin()->test_library_use(cuda_ctx, &bn_cudnn, &bgrad);
	if (t.want_bn_cudnn >= 0)
		cr_expect_eq(bn_cudnn, own_kernels ? 0 : t.want_bn_cudnn,
			     "%s %s: %d batch-norm nodes on cuDNN, want %d", op, loom_dtype_name(dt),
			     bn_cudnn, own_kernels ? 0 : t.want_bn_cudnn);
	if (own_kernels)
		cr_expect_eq(bgrad, 0, "%s: the BGRADB epilogue ran under own kernels", op);
	const char *bgrad_env = getenv("LOOM_CUDA_BGRAD_EPILOGUE");
	if (bgrad_env && !strcmp(bgrad_env, "0"))
		cr_expect_eq(bgrad, 0, "%s: the BGRADB epilogue ran under LOOM_CUDA_BGRAD_EPILOGUE=0",
			     op);
	/* Under the hook every fallback is taken: half convolutions in f32,
	 * a linear's bias and relu by own kernels after the plain product. */
	int conv_f32, mm_unfused, n_conv = 0, n_fused_linear = 0;
	conv_f32 = mm_unfused = 0;
	if (plugin())
		plugin()->test_fallbacks(cuda_ctx, &conv_f32, &mm_unfused);
	for (int v = 0; v < cuda->plan.g->n; v++) {
		const loom_node *nd = &cuda->plan.g->nodes[v];
		n_conv += nd->op == LOOM_OP_CONV2D || nd->op == LOOM_OP_CONV2D_BWD_DATA ||
			  nd->op == LOOM_OP_CONV2D_BWD_FILTER;
		n_fused_linear += nd->op == LOOM_OP_LINEAR && (nd->nsrc > 2 || nd->a.mm.relu);
	}
	/* (Without the hook a fallback may be taken too, where the library
	 * has no algorithm: nothing to expect there but the CPU's values.) */
	if (dt == LOOM_F32)
		cr_expect_eq(conv_f32, 0, "%s: an f32 convolution took the f32 fallback", op);
	if (own_kernels) {
		cr_expect_eq(conv_f32, dt != LOOM_F32 ? n_conv : 0,
			     "%s %s: %d of %d convolutions in f32", op, loom_dtype_name(dt),
			     conv_f32, n_conv);
		cr_expect_eq(mm_unfused, n_fused_linear,
			     "%s: %d of %d linears with a bias or relu left to own kernels", op,
			     mm_unfused, n_fused_linear);
	}

	rng_state = seed * 0x9e3779b97f4a7c15ull + 1;
	for (int i = 0; i < t.n_param; i++) {
		size_t n = numel_of(g, t.param[i]);
		double *v = malloc(n * sizeof(double));
		cr_assert(v);
		for (size_t k = 0; k < n; k++)
			v[k] = urand();
		cr_assert_eq(loom_write_f64(cpu, t.param[i], v, n), LOOM_OK, "%s: cpu param %d: %s",
			     op, i, loom_program_error(cpu));
		cr_assert_eq(loom_write_f64(cuda, t.param[i], v, n), LOOM_OK, "%s: cuda param %d: %s",
			     op, i, loom_program_error(cuda));
		free(v);
	}
	if (t.n_labels > 0) {
		int32_t *lab = malloc(t.n_labels * sizeof(int32_t));
		cr_assert(lab);
		for (int64_t k = 0; k < t.n_labels; k++)
			lab[k] = (int32_t)((urand() + 1) / 2 * t.classes) % (int32_t)t.classes;
		if (t.bad_label)
			lab[t.n_labels - 1] = (int32_t)t.classes;
		cr_assert_eq(loom_set_input(cpu, "labels", lab, LOOM_I32, t.n_labels), LOOM_OK);
		cr_assert_eq(loom_set_input(cuda, "labels", lab, LOOM_I32, t.n_labels), LOOM_OK);
		free(lab);
	}

	loom_status sc = loom_run(cpu, mode), sg = loom_run(cuda, mode);
	if (t.bad_label) {
		cr_expect_eq(sc, LOOM_ERR_INVALID);
		cr_expect_eq(sg, LOOM_ERR_INVALID, "cuda: %s", loom_program_error(cuda));
		cr_expect(strstr(loom_program_error(cuda), "label") != NULL, "%s",
			  loom_program_error(cuda));
		cr_expect_str_eq(loom_program_error(cuda), loom_program_error(cpu));
		goto out;
	}
	cr_assert_eq(sc, LOOM_OK, "cpu: %s", loom_program_error(cpu));
	cr_assert_eq(sg, LOOM_OK, "cuda: %s", loom_program_error(cuda));

	compare(op, "output", dt, cuda, cpu, y, 0, numel_of(g, y));
	double lc = loom_loss(cpu), lg = loom_loss(cuda);
	/* The loss is a sum of products of random signs, which cancel: under
	 * TF32 (inputs rounded to 10 bits, 2^-11 each) its relative error
	 * reaches a few 1e-3 where the output's NMSE is 1e-6 (the first GPU
	 * run with TF32 on, an H100: 0.268242 against 0.269064). */
	double loss_tol = dt == LOOM_F32 && tf32 ? 1e-2 : 1e-3;
	if (loom_value_dtype(g, loss) == LOOM_F32)
		cr_expect(fabs(lg - lc) <= loss_tol * (fabs(lc) + 1e-3), "%s %s loss: cuda %g cpu %g",
			  op, loom_dtype_name(dt), lg, lc);
	if (mode == LOOM_RUN_GRAD)
		for (int i = 0; i < t.n_param; i++)
			compare(op, "gradient", dt, cuda, cpu, t.param[i], 1,
				numel_of(g, t.param[i]));
	for (int i = 0; i < t.n_buf; i++)
		compare(op, "buffer", dt, cuda, cpu, t.buf[i], 0, numel_of(g, t.buf[i]));
out:
	loom_program_free(cuda);
	loom_program_free(cpu);
	loom_graph_free(g);
}

static void each_dtype(const char *op, build_fn build, loom_run_mode mode)
{
	const loom_dtype dts[3] = { LOOM_F32, LOOM_F16, LOOM_BF16 };
	for (int i = 0; i < 3; i++)
		for (uint64_t seed = 1; seed <= 2; seed++)
			run_case(op, build, dts[i], mode, seed);
}

/* each_dtype with the library fast paths (cuDNN batch norm, the cuBLASLt
 * epilogues, half cuDNN convolutions) and again with every fallback in
 * their place (loom_cuda_test_own_kernels). */
static void use_own_kernels(int on)
{
	own_kernels = on;
	if (plugin())
		plugin()->test_own_kernels(on);
}

static void both_paths(const char *op, build_fn build, loom_run_mode mode)
{
	for (int own = 0; own <= 1; own++) {
		use_own_kernels(own);
		each_dtype(op, build, mode);
	}
	use_own_kernels(0);
}

/* ------------------------------------------------------------ one-op graphs */

static loom_value b_conv_bias(loom_graph *g, tcase *t)
{
	loom_value x = param(g, t, "x", 4, 2, 3, 9, 9);
	loom_value w = param(g, t, "w", 4, 8, 3, 3, 3);
	loom_value b = param(g, t, "b", 1, 8, 0, 0, 0);
	return loom_conv2d(g, x, w, b, 1, 1);
}

static loom_value b_conv_stride(loom_graph *g, tcase *t)
{
	loom_value x = param(g, t, "x", 4, 3, 4, 10, 10);
	loom_value w = param(g, t, "w", 4, 5, 4, 3, 3);
	return loom_conv2d(g, x, w, LOOM_NONE, 2, 0);
}

/* Batch norm of x [n, c, h, w]: cuDNN takes the all-f32 case (forward and,
 * in training, the backward node: 2). */
static loom_value bn_of(loom_graph *g, tcase *t, int64_t n, int64_t c, int64_t h, int64_t w)
{
	loom_value x = param(g, t, "x", 4, n, c, h, w);
	loom_value ga = param(g, t, "gamma", 1, c, 0, 0, 0);
	loom_value be = param(g, t, "beta", 1, c, 0, 0, 0);
	loom_value rm = loom_buffer(g, "rm", t->dt, 1, &c, LOOM_INIT_ZEROS);
	loom_value rv = loom_buffer(g, "rv", t->dt, 1, &c, LOOM_INIT_ONES);
	t->buf[t->n_buf++] = rm;
	t->buf[t->n_buf++] = rv;
	return loom_batchnorm2d(g, x, ga, be, rm, rv, 0.1, 1e-5);
}

static loom_value b_bn(loom_graph *g, tcase *t)
{
	t->want_bn_cudnn = t->dt == LOOM_F32 ? 2 : 0;
	return bn_of(g, t, 4, 6, 5, 5);
}

static loom_value b_bn_big(loom_graph *g, tcase *t)
{
	t->want_bn_cudnn = t->dt == LOOM_F32 ? 2 : 0;
	return bn_of(g, t, 8, 32, 14, 14);
}

/* O2: x in fp16, gamma, beta and the statistics fp32 (keep_batchnorm_fp32),
 * the mix cuDNN takes. */
static loom_value b_bn_o2(loom_graph *g, tcase *t)
{
	t->dt = LOOM_F32;
	t->level = LOOM_O2;
	t->want_bn_cudnn = 2;
	return bn_of(g, t, 6, 12, 9, 9);
}

/* relu(batch norm): graph/fuse.c gives the relu to the batch norm (cuDNN:
 * the relu kernel in place after it; own kernels: before the rounding). */
static loom_value b_bn_relu(loom_graph *g, tcase *t)
{
	t->fused_relus = 1;
	return loom_relu(g, b_bn(g, t));
}

static loom_value b_bn_relu_o2(loom_graph *g, tcase *t)
{
	t->fused_relus = 1;
	return loom_relu(g, b_bn_o2(g, t));
}

static loom_value b_relu(loom_graph *g, tcase *t)
{
	return loom_relu(g, param(g, t, "x", 3, 4, 5, 7, 0));
}

static loom_value b_pool2(loom_graph *g, tcase *t)
{
	return loom_maxpool2d(g, param(g, t, "x", 4, 2, 3, 8, 8), 2, 2, 0);
}

static loom_value b_pool3(loom_graph *g, tcase *t)
{
	return loom_maxpool2d(g, param(g, t, "x", 4, 2, 3, 9, 9), 3, 2, 1);
}

/* Every unary op of graph/unary.h, forward and backward: a row each below. */
#define UNARY_BUILD(NAME, low)                                        \
	static loom_value b_unary_##low(loom_graph *g, tcase *t)      \
	{                                                             \
		return loom_##low(g, param(g, t, "x", 3, 4, 5, 7, 0)); \
	}
LOOM_UNARY_OPS(UNARY_BUILD)
#undef UNARY_BUILD

/* relu -> max-pool: fused into one relu-pool (and its backward). */

static loom_value b_relu_pool2(loom_graph *g, tcase *t)
{
	t->fused_pools = 2;
	return loom_maxpool2d(g, loom_relu(g, param(g, t, "x", 4, 2, 3, 8, 8)), 2, 2, 0);
}

/* ResNet's stem pool: 3x3, stride 2, pad 1, odd input. */
static loom_value b_relu_pool3(loom_graph *g, tcase *t)
{
	t->fused_pools = 2;
	return loom_maxpool2d(g, loom_relu(g, param(g, t, "x", 4, 2, 3, 9, 9)), 3, 2, 1);
}

static loom_value b_gap(loom_graph *g, tcase *t)
{
	return loom_global_avgpool(g, param(g, t, "x", 4, 3, 5, 4, 6));
}

/* Planes longer than a warp, and more planes than one block holds. */
static loom_value b_gap_big(loom_graph *g, tcase *t)
{
	return loom_global_avgpool(g, param(g, t, "x", 4, 4, 9, 33, 35));
}

static loom_value b_linear_bias(loom_graph *g, tcase *t)
{
	loom_value x = param(g, t, "x", 2, 6, 20, 0, 0);
	loom_value w = param(g, t, "w", 2, 12, 20, 0, 0);
	loom_value b = param(g, t, "b", 1, 12, 0, 0, 0);
	return loom_linear(g, x, w, b);
}

/* relu(x w^T + b): graph/fuse.c gives the relu to the linear (cuBLASLt's
 * RELU_BIAS epilogue), and the relu's backward reads the linear's output. */
static loom_value b_linear_bias_relu(loom_graph *g, tcase *t)
{
	return loom_relu(g, b_linear_bias(g, t));
}

static loom_value b_linear_relu(loom_graph *g, tcase *t)
{
	loom_value x = param(g, t, "x", 2, 9, 16, 0, 0);
	loom_value w = param(g, t, "w", 2, 24, 16, 0, 0);
	return loom_relu(g, loom_linear(g, x, w, LOOM_NONE));
}

static loom_value b_linear(loom_graph *g, tcase *t)
{
	loom_value x = param(g, t, "x", 2, 5, 7, 0, 0);
	loom_value w = param(g, t, "w", 2, 3, 7, 0, 0);
	return loom_linear(g, x, w, LOOM_NONE);
}

static loom_value b_matmul(loom_graph *g, tcase *t)
{
	loom_value a = param(g, t, "a", 2, 7, 9, 0, 0);
	loom_value b = param(g, t, "b", 2, 9, 5, 0, 0);
	return loom_matmul(g, a, b);
}

static loom_value b_add(loom_graph *g, tcase *t)
{
	return loom_add(g, param(g, t, "a", 2, 30, 11, 0, 0), param(g, t, "b", 2, 30, 11, 0, 0));
}

/* The residual add + relu of a ResNet block. */
static loom_value b_add_relu(loom_graph *g, tcase *t)
{
	t->fused_relus = 1;
	loom_value a = param(g, t, "a", 4, 2, 5, 6, 7), b = param(g, t, "b", 4, 2, 5, 6, 7);
	return loom_relu(g, loom_add(g, a, b));
}

static loom_value b_sum(loom_graph *g, tcase *t)
{
	return loom_sum(g, param(g, t, "x", 3, 10, 10, 10, 0));
}

static loom_value b_mean(loom_graph *g, tcase *t)
{
	return loom_mean(g, param(g, t, "x", 2, 33, 3, 0, 0));
}

static loom_value b_flatten(loom_graph *g, tcase *t)
{
	return loom_relu(g, loom_flatten(g, param(g, t, "x", 4, 2, 3, 4, 5)));
}

static loom_value b_ce(loom_graph *g, tcase *t)
{
	loom_value x = param(g, t, "logits", 2, 16, 10, 0, 0);
	return loom_softmax_cross_entropy(g, x, labels(g, t, 16, 10));
}

static loom_value b_ce_bad(loom_graph *g, tcase *t)
{
	loom_value y = b_ce(g, t);
	t->bad_label = 1;
	return y;
}

/* The transformer ops (engine/cuda/layernorm.cu, attention.cu and
 * embedding.cu against engine/cpu/layernorm.c, attention.c and
 * embedding.c). */
static loom_value b_embedding(loom_graph *g, tcase *t)
{
	loom_value ids = labels(g, t, 12, 7); /* 12 ids over 7 rows: repeats */
	return loom_embedding(g, ids, param(g, t, "wte", 2, 7, 5, 0, 0));
}

/* 450 rows: the gamma gradient's 15 chunks of 32 rows, the last of 2, and
 * a second block of columns 8 wide (engine/cuda/layernorm.cu). */
static loom_value b_layernorm_rows(loom_graph *g, tcase *t)
{
	loom_value x = param(g, t, "x", 3, 3, 150, 40, 0);
	return loom_layernorm(g, x, param(g, t, "ln.weight", 1, 40, 0, 0, 0),
			      param(g, t, "ln.bias", 1, 40, 0, 0, 0), 1e-5);
}

static loom_value b_gelu_tanh(loom_graph *g, tcase *t)
{
	return loom_gelu_tanh(g, param(g, t, "x", 3, 2, 5, 9, 0));
}

static loom_value b_layernorm(loom_graph *g, tcase *t)
{
	loom_value x = param(g, t, "x", 3, 2, 3, 40, 0);
	return loom_layernorm(g, x, param(g, t, "ln.weight", 1, 40, 0, 0, 0),
			      param(g, t, "ln.bias", 1, 40, 0, 0, 0), 1e-5);
}

static loom_value b_linear_3d(loom_graph *g, tcase *t)
{
	loom_value x = param(g, t, "x", 3, 2, 3, 8, 0);
	return loom_linear(g, x, param(g, t, "fc.weight", 2, 5, 8, 0, 0),
			   param(g, t, "fc.bias", 1, 5, 0, 0, 0));
}

static loom_value b_attention(loom_graph *g, tcase *t)
{
	return loom_causal_self_attention(g, param(g, t, "qkv", 3, 2, 7, 24, 0), 2);
}

/* Sizes where cuBLASLt's strided-batched products have aligned operands
 * and tensor-core algorithms: 4 heads of 32, and GPT-2's heads of 64. */
static loom_value b_attention_hs32(loom_graph *g, tcase *t)
{
	return loom_causal_self_attention(g, param(g, t, "qkv", 3, 2, 64, 3 * 128, 0), 4);
}

static loom_value b_attention_hs64(loom_graph *g, tcase *t)
{
	return loom_causal_self_attention(g, param(g, t, "qkv", 3, 1, 96, 3 * 256, 0), 4);
}

/* ------------------------------------------------------------ fused attention */

/* The shape the sdpa cases build: qkv [sd_b, sd_t, 3 sd_nh sd_hs]. */
static int64_t sd_b, sd_t, sd_nh, sd_hs;

static loom_value b_attention_sdpa(loom_graph *g, tcase *t)
{
	/* Half q, k, v with heads of a multiple of 8: cuDNN's SDPA, unless
	 * the own-kernels hook (or LOOM_CUDA_ATTN=unfused) keeps it unfused. */
	t->want_attn_fused = t->dt != LOOM_F32 && !own_kernels && !getenv("LOOM_CUDA_ATTN");
	return loom_causal_self_attention(g, param(g, t, "qkv", 3, sd_b, sd_t, 3 * sd_nh * sd_hs, 0),
					  (int)sd_nh);
}

static const struct {
	int64_t b, t, nh, hs;
} sdpa_shapes[] = {
	{ 2, 64, 4, 32 },  /* T a multiple of 64 */
	{ 1, 100, 2, 64 }, /* GPT-2's heads; T not a multiple of 64 */
	{ 2, 37, 3, 64 },  /* T below one tile */
	{ 1, 130, 2, 128 },
};

/* The fused attention against the unfused one on the same GPU, forward
 * and backward: y and qkv's gradient, the same random inputs. */
static void sdpa_vs_unfused(loom_dtype dt, uint64_t seed)
{
	tcase t;
	loom_graph *g;
	char why[512], label[96];
	memset(&t, 0, sizeof(t));
	t.dt = dt;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_value y = b_attention_sdpa(g, &t);
	loom_value loss = head(g, &t, y);
	loom_mark_output(g, y);
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));
	snprintf(label, sizeof(label), "sdpa vs unfused %lldx%lld, %lld heads of %lld", (long long)sd_b,
		 (long long)sd_t, (long long)sd_nh, (long long)sd_hs);
	loom_program *fused = compile_at(g, loss, LOOM_DEVICE_CUDA, LOOM_O0);
	setenv("LOOM_CUDA_ATTN", "unfused", 1);
	loom_program *unf = compile_at(g, loss, LOOM_DEVICE_CUDA, LOOM_O0);
	unsetenv("LOOM_CUDA_ATTN");
	int nf = fused_attentions(fused, why, sizeof(why));
	cr_expect_eq(nf, 1, "%s %s: not fused: %s", label, loom_dtype_name(dt), why);
	cr_expect_eq(fused_attentions(unf, why, sizeof(why)), 0, "%s: LOOM_CUDA_ATTN=unfused fused", label);
	cr_expect(strstr(why, "LOOM_CUDA_ATTN=unfused") != NULL, "%s: the note says why: %s", label, why);
	rng_state = seed * 0x9e3779b97f4a7c15ull + 1;
	for (int i = 0; i < t.n_param; i++) {
		size_t n = numel_of(g, t.param[i]);
		double *v = malloc(n * sizeof(double));
		cr_assert(v);
		for (size_t k = 0; k < n; k++)
			v[k] = urand();
		cr_assert_eq(loom_write_f64(fused, t.param[i], v, n), LOOM_OK, "%s", loom_program_error(fused));
		cr_assert_eq(loom_write_f64(unf, t.param[i], v, n), LOOM_OK, "%s", loom_program_error(unf));
		free(v);
	}
	cr_assert_eq(loom_run(fused, LOOM_RUN_GRAD), LOOM_OK, "fused: %s", loom_program_error(fused));
	cr_assert_eq(loom_run(unf, LOOM_RUN_GRAD), LOOM_OK, "unfused: %s", loom_program_error(unf));
	compare(label, "output", dt, fused, unf, y, 0, numel_of(g, y));
	compare(label, "qkv gradient", dt, fused, unf, t.param[0], 1, numel_of(g, t.param[0]));
	loom_program_free(unf);
	loom_program_free(fused);
	loom_graph_free(g);
}

/* The SDPA graphs' tensor and operation descriptors (sdpa_cudnn.cu) each
 * finalize in cuDNN, which checks their attributes, dtypes and shapes with
 * no device: this case runs wherever the plugin is built, GPU or not. The
 * operation graph and its execution plan need a device (the case below). */
Test(cuda_ops, sdpa_graph_descriptors)
{
	if (!plugin() || !plugin()->test_sdpa_descriptors)
		cr_skip_test("built without the CUDA toolkit: no plugin");
	for (size_t i = 0; i < sizeof(sdpa_shapes) / sizeof(sdpa_shapes[0]); i++)
		for (int bf16 = 0; bf16 <= 1; bf16++)
			for (int bwd = 0; bwd <= 1; bwd++) {
				char why[512] = "";
				cr_expect(plugin()->test_sdpa_descriptors(
						  sdpa_shapes[i].b, sdpa_shapes[i].t, sdpa_shapes[i].nh,
						  sdpa_shapes[i].hs, bf16, bwd, why, sizeof(why)),
					  "sdpa %s %s %lldx%lld, %lld heads of %lld: %s",
					  bwd ? "backward" : "forward", bf16 ? "bf16" : "f16",
					  (long long)sdpa_shapes[i].b, (long long)sdpa_shapes[i].t,
					  (long long)sdpa_shapes[i].nh, (long long)sdpa_shapes[i].hs, why);
			}
}

/* cuDNN's SDPA (engine/cuda/sdpa_cudnn.cu) in f16 and bf16, causal, forward
 * and backward, against the CPU's two-node attention and against the CUDA
 * backend's unfused attention, on shapes with T a multiple of 64 and not;
 * the plan must have fused (a refusal fails here, with cuDNN's reason). */
Test(cuda_ops, sdpa_fused_attention)
{
	NEED_GPU();
	const loom_dtype dts[2] = { LOOM_F16, LOOM_BF16 };
	unsetenv("LOOM_CUDA_ATTN");
	for (size_t i = 0; i < sizeof(sdpa_shapes) / sizeof(sdpa_shapes[0]); i++) {
		char name[96];
		sd_b = sdpa_shapes[i].b, sd_t = sdpa_shapes[i].t;
		sd_nh = sdpa_shapes[i].nh, sd_hs = sdpa_shapes[i].hs;
		snprintf(name, sizeof(name), "sdpa attention %lldx%lld, %lld heads of %lld",
			 (long long)sd_b, (long long)sd_t, (long long)sd_nh, (long long)sd_hs);
		for (int d = 0; d < 2; d++) {
			run_case(name, b_attention_sdpa, dts[d], LOOM_RUN_GRAD, 1);
			sdpa_vs_unfused(dts[d], 2);
		}
	}
}

Test(cuda_ops, batchnorm_o2_half_x_fp32_stats)
{
	NEED_GPU();
	for (int own = 0; own <= 1; own++) {
		use_own_kernels(own);
		for (uint64_t seed = 1; seed <= 2; seed++) {
			run_case("batchnorm2d O2", b_bn_o2, LOOM_F32, LOOM_RUN_GRAD, seed);
			run_case("batchnorm2d O2 eval", b_bn_o2, LOOM_F32, LOOM_RUN_EVAL, seed);
			run_case("batchnorm2d+relu O2", b_bn_relu_o2, LOOM_F32, LOOM_RUN_GRAD, seed);
			run_case("batchnorm2d+relu O2 eval", b_bn_relu_o2, LOOM_F32, LOOM_RUN_EVAL,
				 seed);
		}
	}
	use_own_kernels(0);
}

/*
 * bf16 batch norm with fp32 parameters (O2 bf16, and O1 bf16 under
 * amp.bn_half) through cuDNN (its PSEUDO_BFLOAT16 config) under
 * LOOM_CUDA_BN_BF16_CUDNN=1, on the own kernels at 0 (the default):
 * forward, backward and eval, NCHW, then the residual block in NHWC
 * (persistent mode, the Ex calls), against the CPU. All-bf16 parameters
 * never go to cuDNN. Compiled, not yet run.
 */
static int bn_bf16_cudnn;

static loom_value b_bn_o2_bf16(loom_graph *g, tcase *t)
{
	loom_value y = b_bn_o2(g, t);
	t->want_bn_cudnn = bn_bf16_cudnn ? 2 : 0;
	return y;
}

static loom_value b_bn_relu_o2_bf16(loom_graph *g, tcase *t)
{
	t->fused_relus = 1;
	return loom_relu(g, b_bn_o2_bf16(g, t));
}

static loom_value b_nhwc_block_o2(loom_graph *g, tcase *t);
static loom_value b_nhwc_block_o1_bn_half(loom_graph *g, tcase *t);

Test(cuda_ops, batchnorm_bf16_cudnn)
{
	NEED_GPU();
	amp_half = LOOM_BF16;
	for (int on = 0; on <= 1; on++) {
		bn_bf16_cudnn = on;
		setenv("LOOM_CUDA_BN_BF16_CUDNN", on ? "1" : "0", 1);
		for (uint64_t seed = 1; seed <= 2; seed++) {
			run_case("batchnorm2d O2 bf16", b_bn_o2_bf16, LOOM_F32, LOOM_RUN_GRAD, seed);
			run_case("batchnorm2d O2 bf16 eval", b_bn_o2_bf16, LOOM_F32, LOOM_RUN_EVAL,
				 seed);
			run_case("batchnorm2d+relu O2 bf16", b_bn_relu_o2_bf16, LOOM_F32, LOOM_RUN_GRAD,
				 seed);
		}
		run_case("batchnorm2d bf16, bf16 parameters", b_bn, LOOM_BF16, LOOM_RUN_GRAD, 3);
	}
	cuda_nhwc = "half";
	for (uint64_t seed = 1; seed <= 2; seed++) {
		run_case("nhwc block O2 bf16, bn on cudnn", b_nhwc_block_o2, LOOM_F32, LOOM_RUN_GRAD,
			 seed);
		run_case("nhwc block O1 bf16 bn_half, bn on cudnn", b_nhwc_block_o1_bn_half, LOOM_F32,
			 LOOM_RUN_GRAD, seed);
	}
	run_case("nhwc block O2 bf16 eval, bn on cudnn", b_nhwc_block_o2, LOOM_F32, LOOM_RUN_EVAL, 3);
	cuda_nhwc = NULL;
	bn_bf16_cudnn = 0;
	unsetenv("LOOM_CUDA_BN_BF16_CUDNN");
	amp_half = LOOM_F16;
}

/* Synchronised batch norm (sync_bn) at world 1: the split kernels of
 * engine/cuda/bn.cu (per-channel f64 sums into the workspace, then the
 * apply kernels) against the CPU's split path, in every dtype and under O2,
 * forward, backward and eval. Without a second rank no all-reduce runs:
 * the NCCL call between the halves is tested by nothing here. */
static void sync_bn_on(int on)
{
	sync_bn = on;
	loom_ddp_test_sync_one_rank = on;
}

Test(cuda_ops, sync_batchnorm_one_rank)
{
	NEED_GPU();
	sync_bn_on(1);
	each_dtype("sync batchnorm2d", b_bn, LOOM_RUN_GRAD);
	each_dtype("sync batchnorm2d eval", b_bn, LOOM_RUN_EVAL);
	each_dtype("sync batchnorm2d 8x32x14x14", b_bn_big, LOOM_RUN_GRAD);
	each_dtype("sync batchnorm2d+relu", b_bn_relu, LOOM_RUN_GRAD);
	for (uint64_t seed = 1; seed <= 2; seed++) {
		run_case("sync batchnorm2d O2", b_bn_o2, LOOM_F32, LOOM_RUN_GRAD, seed);
		run_case("sync batchnorm2d+relu O2", b_bn_relu_o2, LOOM_F32, LOOM_RUN_GRAD, seed);
	}
	sync_bn_on(0);
}

/* The default fp32 plan: convolutions and products on TF32 tensor cores,
 * within TF32's bound of the CPU's exact fp32; the rest of the suite
 * compiles with no_tf32 and keeps the 1e-8 bound. */
Test(cuda_ops, tf32_products)
{
	NEED_GPU();
	tf32 = 1;
	for (uint64_t seed = 1; seed <= 2; seed++) {
		run_case("tf32 conv2d+bias", b_conv_bias, LOOM_F32, LOOM_RUN_GRAD, seed);
		run_case("tf32 conv2d/2", b_conv_stride, LOOM_F32, LOOM_RUN_GRAD, seed);
		run_case("tf32 linear+bias", b_linear_bias, LOOM_F32, LOOM_RUN_GRAD, seed);
		run_case("tf32 matmul", b_matmul, LOOM_F32, LOOM_RUN_GRAD, seed);
		run_case("tf32 causal self-attention", b_attention, LOOM_F32, LOOM_RUN_GRAD, seed);
	}
	tf32 = 0;
}

/* Lines of text holding both a and b (b NULL: a alone). */
static int lines_with(const char *text, const char *a, const char *b)
{
	int n = 0;
	for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
		const char *e = strchr(l, '\n');
		char line[1024];
		snprintf(line, sizeof(line), "%.*s", (int)(e ? e - l : (long)strlen(l)), l);
		if (strstr(line, a) && (!b || strstr(line, b)))
			n++;
	}
	return n;
}

/* The --dump-graph of the conv+bias case compiled on the GPU with the
 * kernel search on or off. */
static char *conv_dump(int search)
{
	tcase t;
	loom_graph *g;
	loom_program *p;
	loom_compile_opts o;
	char *buf = NULL;
	memset(&t, 0, sizeof(t));
	t.dt = LOOM_F32;
	t.want_bn_cudnn = -1;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_value loss = head(g, &t, b_conv_bias(g, &t));
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CUDA;
	o.optim.kind = LOOM_OPTIM_NONE;
	o.kernel_search = search ? LOOM_KERNEL_SEARCH_ON : LOOM_KERNEL_SEARCH_OFF;
	cr_assert_eq(loom_compile(g, loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	buf = print_text(loom_program_dump, p);
	loom_program_free(p);
	loom_graph_free(g);
	return buf;
}

/* The convolutions' algorithm search (conv_cudnn.cu, cudnnFind*AlgorithmEx
 * at compile time): on (the tests' environment holds LOOM_KERNEL_SEARCH=off,
 * cleared in this case's process), the conv cases against the CPU in every
 * dtype, on TF32 and on the f32 fallback of half convolutions; the measured
 * algorithm of each of the three conv nodes (forward, backward data and
 * filter) in --dump-graph, "measured earlier" on a second compile of the
 * same shapes, and the heuristic's under kernel_search off. */
Test(cuda_ops, conv_algorithm_search)
{
	NEED_GPU();
	unsetenv("LOOM_KERNEL_SEARCH");
	char *first = conv_dump(1), *again = conv_dump(1), *off = conv_dump(0);
	int n = lines_with(first, "cudnn algo", NULL);
	cr_expect_eq(n, 3, "%d conv nodes with a cuDNN algorithm, want 3:\n%s", n, first);
	cr_expect_eq(lines_with(first, "cudnn algo", "(measured"), n, "not all measured:\n%s", first);
	cr_expect_eq(lines_with(again, "cudnn algo", "(measured earlier"), n,
		     "second compile not from the cache:\n%s", again);
	cr_expect_eq(lines_with(off, "cudnn algo", "(heuristic: kernel search off"), n,
		     "search off not heuristic:\n%s", off);
	/* The search takes any algorithm unless deterministic, so a
	 * deterministic compile measures again among its own (another
	 * cache key), then runs against the CPU. */
	setenv("LOOM_DETERMINISTIC", "1", 1);
	char *det = conv_dump(1);
	cr_expect_eq(lines_with(det, "cudnn algo", "(measured"), n, "not all measured:\n%s", det);
	cr_expect_eq(lines_with(det, "cudnn algo", "(measured earlier"), 0,
		     "a deterministic compile took the search's cached choice:\n%s", det);
	both_paths("searched deterministic conv2d+bias", b_conv_bias, LOOM_RUN_GRAD);
	unsetenv("LOOM_DETERMINISTIC");
	free(det);
	free(first);
	free(again);
	free(off);
	both_paths("searched conv2d+bias", b_conv_bias, LOOM_RUN_GRAD);
	both_paths("searched conv2d/2", b_conv_stride, LOOM_RUN_GRAD);
	tf32 = 1;
	for (uint64_t seed = 1; seed <= 2; seed++) {
		run_case("searched tf32 conv2d+bias", b_conv_bias, LOOM_F32, LOOM_RUN_GRAD, seed);
		run_case("searched tf32 conv2d/2", b_conv_stride, LOOM_F32, LOOM_RUN_GRAD, seed);
	}
	tf32 = 0;
}

static void relu_pool_special(int k, int stride, int pad);

/* Batch norm over 4 x 3 x 72 x 72: 20736 values per channel, three chunks
 * of the split kernels (8192, 8192 and a partial 4352). */
static loom_value b_bn_chunks(loom_graph *g, tcase *t)
{
	t->want_bn_cudnn = t->dt == LOOM_F32 ? 2 : 0;
	return bn_of(g, t, 4, 3, 72, 72);
}

static loom_value b_bn_chunks_relu(loom_graph *g, tcase *t)
{
	t->fused_relus = 1;
	return loom_relu(g, b_bn_chunks(g, t));
}

/* The --dump-graph of a training graph built by b, on the GPU. */
static char *dump_of(build_fn b, loom_dtype dt)
{
	tcase t;
	loom_graph *g;
	loom_program *p;
	loom_compile_opts o;
	char *buf = NULL;
	memset(&t, 0, sizeof(t));
	t.dt = dt;
	t.want_bn_cudnn = -1;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_value loss = head(g, &t, b(g, &t));
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CUDA;
	o.optim.kind = LOOM_OPTIM_NONE;
	cr_assert_eq(loom_compile(g, loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	buf = print_text(loom_program_dump, p);
	loom_program_free(p);
	loom_graph_free(g);
	return buf;
}

/* Batch norm (alone, with its fused relu, over several chunks) and max
 * pooling (with and without the fused relu) against the CPU in every
 * dtype and under O2, forward, backward and eval: the defaults (split
 * kernels, saved statistics, saved argmax, cuDNN's Ex forward where it
 * takes NCHW, the relu backward fused into the split batch-norm
 * backward), the own kernels where cuDNN would run (the own-kernels hook),
 * and the split kernels with the relu backward apart
 * (LOOM_CUDA_BN_RELU_BWD=0). The plan's notes (--dump-graph) say which
 * ran. */
Test(cuda_ops, batchnorm_saved_split_and_pool_indices)
{
	NEED_GPU();
	/* The plan: every forward saves and every backward reads. */
	char *on = dump_of(b_bn_chunks_relu, LOOM_BF16);
	cr_expect_eq(lines_with(on, "own split kernels", "saves its statistics"), 1, "%s", on);
	cr_expect_eq(lines_with(on, "reads the saved statistics", "writes dgamma and dbeta"), 1,
		     "%s", on);
	/* relu_bwd is followed by bn_bwd_data, dx is a parameter's gradient:
	 * the relu backward is fused. */
	cr_expect_eq(lines_with(on, "bn_bwd_data", "the relu backward fused"), 1, "%s", on);
	cr_expect_eq(lines_with(on, "relu_bwd", "done by"), 1, "%s", on);
	free(on);
	on = dump_of(b_relu_pool3, LOOM_F16);
	cr_expect_eq(lines_with(on, "saves its argmax", NULL), 1, "%s", on);
	cr_expect_eq(lines_with(on, "reads the saved argmax", NULL), 1, "%s", on);
	free(on);

	for (int k = 0; k < 3; k++) {
		use_own_kernels(k == 1);
		if (k == 2)
			setenv("LOOM_CUDA_BN_RELU_BWD", "0", 1);
		each_dtype("bn paths: batchnorm2d", b_bn, LOOM_RUN_GRAD);
		each_dtype("bn paths: batchnorm2d 3 chunks", b_bn_chunks, LOOM_RUN_GRAD);
		each_dtype("bn paths: batchnorm2d+relu 3 chunks", b_bn_chunks_relu, LOOM_RUN_GRAD);
		each_dtype("bn paths: batchnorm2d eval", b_bn_chunks_relu, LOOM_RUN_EVAL);
		each_dtype("bn paths: maxpool 3/2/1", b_pool3, LOOM_RUN_GRAD);
		each_dtype("bn paths: maxpool 2/2/0", b_pool2, LOOM_RUN_GRAD);
		each_dtype("bn paths: relu+maxpool 3/2/1", b_relu_pool3, LOOM_RUN_GRAD);
		for (uint64_t seed = 1; seed <= 2; seed++) {
			run_case("bn paths: batchnorm2d O2", b_bn_o2, LOOM_F32, LOOM_RUN_GRAD, seed);
			run_case("bn paths: batchnorm2d+relu O2", b_bn_relu_o2, LOOM_F32,
				 LOOM_RUN_GRAD, seed);
		}
		relu_pool_special(2, 2, 0);
		relu_pool_special(3, 2, 1);
	}
	use_own_kernels(0);
	unsetenv("LOOM_CUDA_BN_RELU_BWD");
}

/* Several uploads of an input between runs and back to back (the second
 * wins), of two sizes, each run's loss the sum of the last upload,
 * against the values that were sent. dev: CPU or CUDA. */
static void uploads_in_order(loom_device dev)
{
	const int64_t sizes[2] = { 1000, 300000 };
	for (int si = 0; si < 2; si++) {
		int64_t n = sizes[si];
		loom_graph *g;
		loom_program *p;
		loom_compile_opts o;
		cr_assert_eq(loom_graph_new(&g), LOOM_OK);
		loom_value x = loom_input(g, "x", LOOM_F32, 1, &n);
		loom_value loss = loom_sum(g, x);
		cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));
		loom_compile_opts_default(&o);
		o.device = dev;
		o.inference = 1;
		o.optim.kind = LOOM_OPTIM_NONE;
		cr_assert_eq(loom_compile(g, loss, &o, &p), LOOM_OK, "%s", loom_last_error());
		float *buf = malloc(sizeof(float) * (size_t)n);
		cr_assert(buf);
		for (int k = 1; k <= 5; k++) {
			for (int rep = 0; rep < (k % 2 ? 1 : 3); rep++) {
				/* back to back: k - 1, then k (the one that counts) */
				float val = (float)(rep == (k % 2 ? 0 : 2) ? k : k - 1);
				for (int64_t i = 0; i < n; i++)
					buf[i] = val;
				cr_assert_eq(loom_set_input(p, "x", buf, LOOM_F32, (size_t)n), LOOM_OK,
					     "%s", loom_program_error(p));
			}
			/* The host buffer is reused at once: the upload must have
			 * taken its own copy. */
			for (int64_t i = 0; i < n; i++)
				buf[i] = -1.0f;
			cr_assert_eq(loom_run(p, LOOM_RUN_EVAL), LOOM_OK, "%s", loom_program_error(p));
			cr_expect_eq(loom_loss(p), (double)n * k, "size %lld upload %d: loss %g, want %g",
				     (long long)n, k, loom_loss(p), (double)n * k);
		}
		free(buf);
		loom_program_free(p);
		loom_graph_free(g);
	}
}

/* The check itself, on the CPU (runs everywhere). */
Test(cuda_ops, uploads_in_order_cpu)
{
	uploads_in_order(LOOM_DEVICE_CPU);
}

/* The upload through the pinned halves, on the GPU. */
Test(cuda_ops, uploads_in_order_cuda)
{
	NEED_GPU();
	uploads_in_order(LOOM_DEVICE_CUDA);
}

/* The loss read one step late (LOOM_ASYNC_LOSS=1, read by each loom_run):
 * two programs of one graph with the same values train side by side, one
 * synchronous, one not; after run k the second reports the first's loss
 * of run k - 1, and its scaler and step lag by one as well. */
static void async_loss_late(void)
{
	tcase t;
	loom_graph *g;
	loom_program *p[2];
	loom_compile_opts o;
	memset(&t, 0, sizeof(t));
	t.dt = LOOM_F32;
	t.want_bn_cudnn = -1;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_value loss = head(g, &t, b_bn_relu(g, &t));
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CUDA;
	o.no_tf32 = 1;
	o.optim.kind = LOOM_OPTIM_SGD;
	o.optim.lr = 0.01;
	for (int d = 0; d < 2; d++) {
		cr_assert_eq(loom_compile(g, loss, &o, &p[d]), LOOM_OK, "%s", loom_last_error());
		rng_state = 7;
		for (int i = 0; i < t.n_param; i++) {
			size_t n = numel_of(g, t.param[i]);
			double *v = malloc(n * sizeof(double));
			cr_assert(v);
			for (size_t k = 0; k < n; k++)
				v[k] = urand();
			cr_assert_eq(loom_write_f64(p[d], t.param[i], v, n), LOOM_OK);
			free(v);
		}
	}
	double want[5];
	for (int k = 0; k < 5; k++) {
		unsetenv("LOOM_ASYNC_LOSS");
		cr_assert_eq(loom_run(p[0], LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p[0]));
		want[k] = loom_loss(p[0]);
		setenv("LOOM_ASYNC_LOSS", "1", 1);
		cr_assert_eq(loom_run(p[1], LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p[1]));
		if (k == 0)
			continue;
		cr_expect(fabs(loom_loss(p[1]) - want[k - 1]) <= 1e-6 * (fabs(want[k - 1]) + 1e-6),
			  "run %d: async loss %g, the synchronous run %d's %g", k, loom_loss(p[1]),
			  k - 1, want[k - 1]);
	}
	unsetenv("LOOM_ASYNC_LOSS");
	cr_expect(want[4] != want[0], "the synchronous losses did not change: %g", want[0]);
	loom_program_free(p[1]);
	loom_program_free(p[0]);
	loom_graph_free(g);
}

Test(cuda_ops, async_loss_one_step_late)
{
	NEED_GPU();
	async_loss_late();
}

/* The same with the loss's and the control block's copies as the captured
 * graph's last nodes (LOOM_CUDA_LOSS_NODE=1; runs 2-4 are replays). */
Test(cuda_ops, async_loss_copied_inside_the_graph)
{
	NEED_GPU();
	setenv("LOOM_CUDA_LOSS_NODE", "1", 1);
	async_loss_late();
	unsetenv("LOOM_CUDA_LOSS_NODE");
}

/* Sizes for the 128-bit half kernels: many groups of 8 and a tail of 3. */
static loom_value b_relu_vec(loom_graph *g, tcase *t)
{
	return loom_relu(g, param(g, t, "x", 2, 33, 129, 0, 0));
}

static loom_value b_add_relu_vec(loom_graph *g, tcase *t)
{
	t->fused_relus = 1;
	loom_value a = param(g, t, "a", 2, 33, 129, 0, 0), b = param(g, t, "b", 2, 33, 129, 0, 0);
	return loom_relu(g, loom_add(g, a, b));
}

static loom_value b_gelu_vec(loom_graph *g, tcase *t)
{
	return loom_gelu(g, param(g, t, "x", 2, 33, 129, 0, 0));
}

static loom_value b_gelu_tanh_vec(loom_graph *g, tcase *t)
{
	return loom_gelu_tanh(g, param(g, t, "x", 2, 33, 129, 0, 0));
}

static loom_value b_silu_vec(loom_graph *g, tcase *t)
{
	return loom_silu(g, param(g, t, "x", 2, 33, 129, 0, 0));
}

/* The 128-bit f16/bf16 elementwise kernels (relu and its backward, add with
 * and without the fused relu, the unary ops forward and backward; 4257
 * elements: 532 groups of 8 and a tail of 1) against the CPU, and the
 * scalar kernels they replace (LOOM_CUDA_VEC=0, read when the plan is
 * made) on the same cases. */
Test(cuda_ops, vectorised_half_elementwise)
{
	NEED_GPU();
	const loom_dtype dts[2] = { LOOM_F16, LOOM_BF16 };
	for (int vec = 0; vec <= 1; vec++) {
		setenv("LOOM_CUDA_VEC", vec ? "1" : "0", 1);
		for (int i = 0; i < 2; i++)
			for (uint64_t seed = 1; seed <= 2; seed++) {
				run_case(vec ? "vec relu" : "scalar relu", b_relu_vec, dts[i],
					 LOOM_RUN_GRAD, seed);
				run_case(vec ? "vec add" : "scalar add", b_add, dts[i], LOOM_RUN_GRAD,
					 seed);
				run_case(vec ? "vec add+relu" : "scalar add+relu", b_add_relu_vec,
					 dts[i], LOOM_RUN_GRAD, seed);
				run_case(vec ? "vec gelu" : "scalar gelu", b_gelu_vec, dts[i],
					 LOOM_RUN_GRAD, seed);
				run_case(vec ? "vec gelu tanh" : "scalar gelu tanh", b_gelu_tanh_vec,
					 dts[i], LOOM_RUN_GRAD, seed);
				run_case(vec ? "vec silu" : "scalar silu", b_silu_vec, dts[i],
					 LOOM_RUN_GRAD, seed);
			}
	}
	unsetenv("LOOM_CUDA_VEC");
}

/* A switch of engine/cuda not yet decided by a lease (the products'
 * epilogues and alignment, recomputation): each case in every dtype with
 * the new path (1) and the old one (0), both against the CPU; the
 * variable is read when the plan is made. */
static void both_switch_values(const char *var, const char *op, build_fn build)
{
	char name[128];
	for (int on = 0; on <= 1; on++) {
		setenv(var, on ? "1" : "0", 1);
		snprintf(name, sizeof(name), "%s %s=%d", op, var, on);
		each_dtype(name, build, LOOM_RUN_GRAD);
	}
	unsetenv(var);
}

/* 300 ids over 60 rows (runs of equal ids of every length) and over 700
 * rows (most rows absent: their gradient is zero), 40 columns. */
static loom_value b_embedding_runs(loom_graph *g, tcase *t)
{
	loom_value ids = labels(g, t, 300, 60);
	return loom_embedding(g, ids, param(g, t, "wte", 2, 60, 40, 0, 0));
}

static loom_value b_embedding_sparse(loom_graph *g, tcase *t)
{
	loom_value ids = labels(g, t, 300, 700);
	return loom_embedding(g, ids, param(g, t, "wte", 2, 700, 40, 0, 0));
}

/* The embedding backward bucketed by token (a stable sort of the ids, one
 * block per run: the CPU's additions in its order) against the CPU. */
Test(cuda_ops, embedding_backward_bucketed)
{
	NEED_GPU();
	each_dtype("embedding", b_embedding, LOOM_RUN_GRAD);
	each_dtype("embedding 300 ids / 60", b_embedding_runs, LOOM_RUN_GRAD);
	each_dtype("embedding 300 ids / 700", b_embedding_sparse, LOOM_RUN_GRAD);
}

/* 37 columns: no 128-bit loads (the one-element path of the same kernels);
 * 2 x 300 rows: 19 chunks of 32 rows, the last of 24. */
static loom_value b_layernorm_odd(loom_graph *g, tcase *t)
{
	loom_value x = param(g, t, "x", 3, 2, 300, 37, 0);
	return loom_layernorm(g, x, param(g, t, "ln.weight", 1, 37, 0, 0, 0),
			      param(g, t, "ln.bias", 1, 37, 0, 0, 0), 1e-5);
}

/* 768 columns (GPT-2's), 64 rows: 8-wide groups over 128 threads. */
static loom_value b_layernorm_768(loom_graph *g, tcase *t)
{
	loom_value x = param(g, t, "x", 3, 2, 32, 768, 0);
	return loom_layernorm(g, x, param(g, t, "ln.weight", 1, 768, 0, 0, 0),
			      param(g, t, "ln.bias", 1, 768, 0, 0, 0), 1e-5);
}

/* Layer norm's warp-per-row forward and one-pass backward (dx with its
 * siblings dgamma and dbeta, graph/fuse.c) against the CPU. */
Test(cuda_ops, layernorm_one_pass)
{
	NEED_GPU();
	each_dtype("layernorm 2x3x40", b_layernorm, LOOM_RUN_GRAD);
	each_dtype("layernorm 3x150x40", b_layernorm_rows, LOOM_RUN_GRAD);
	each_dtype("layernorm 2x300x37", b_layernorm_odd, LOOM_RUN_GRAD);
	each_dtype("layernorm 2x32x768", b_layernorm_768, LOOM_RUN_GRAD);
}

/* 1 unless the switch var is "0" (how the backend reads it). */
static int switch_set(const char *var)
{
	const char *e = getenv(var);
	return !(e && !strcmp(e, "0"));
}

/* The fused classifier: logits made by a product,
 * 37 rows of 1000 classes (rows off 16-byte alignment in every dtype: the
 * kernel's scalar head and tail), so that the memory plan puts dlogits
 * on the logits and the forward writes them; the backward does nothing. */
static loom_value b_classifier(loom_graph *g, tcase *t)
{
	loom_value x = param(g, t, "x", 2, 37, 24, 0, 0);
	loom_value logits = loom_linear(g, x, param(g, t, "w", 2, 1000, 24, 0, 0), LOOM_NONE);
	t->note[0] = "fused classifier";
	t->note_op[0] = LOOM_OP_SOFTMAX_CE;
	t->note[1] = "done by";
	t->note_op[1] = LOOM_OP_SOFTMAX_CE_BWD;
	return loom_softmax_cross_entropy(g, logits, labels(g, t, 37, 1000));
}

/* Logits that are a parameter: the gradient has a slot of its own, so the
 * forward saves each row's log-sum-exp and the backward reads it. */
static loom_value b_classifier_saved(loom_graph *g, tcase *t)
{
	loom_value x = param(g, t, "logits", 2, 19, 333, 0, 0);
	t->note[0] = "saves its log-sum-exp";
	t->note_op[0] = LOOM_OP_SOFTMAX_CE;
	t->note[1] = "from the saved";
	t->note_op[1] = LOOM_OP_SOFTMAX_CE_BWD;
	return loom_softmax_cross_entropy(g, x, labels(g, t, 19, 333));
}

static loom_value b_classifier_bad(loom_graph *g, tcase *t)
{
	loom_value y = b_classifier(g, t);
	t->bad_label = 1;
	return y;
}

/* Softmax-CE in one pass, the dlogits written by its forward or from its
 * saved log-sum-exp, in every dtype, against the CPU; a bad label still
 * reported (the forward's flag) with the backward done by the forward. */
Test(cuda_ops, fused_classifier)
{
	NEED_GPU();
	each_dtype("classifier 37x1000", b_classifier, LOOM_RUN_GRAD);
	each_dtype("classifier saved 19x333", b_classifier_saved, LOOM_RUN_GRAD);
	each_dtype("softmax_ce 16x10", b_ce, LOOM_RUN_GRAD);
	run_case("classifier bad label", b_classifier_bad, LOOM_F32, LOOM_RUN_GRAD, 3);
	run_case("classifier bad label", b_classifier_bad, LOOM_BF16, LOOM_RUN_GRAD, 4);
}

/* Layer norm's forward saving mean and rstd for its one-pass backward,
 * against the CPU, on 768 columns (128-bit loads) and 37 (scalar). */
static loom_value b_layernorm_saved(loom_graph *g, tcase *t)
{
	loom_value x = param(g, t, "x", 3, 2, 50, 768, 0);
	t->note[0] = "saves mean and rstd";
	t->note_op[0] = LOOM_OP_LAYERNORM;
	t->note[1] = "reads the saved";
	t->note_op[1] = LOOM_OP_LAYERNORM_BWD_DATA;
	return loom_layernorm(g, x, param(g, t, "ln.weight", 1, 768, 0, 0, 0),
			      param(g, t, "ln.bias", 1, 768, 0, 0, 0), 1e-5);
}

static loom_value b_layernorm_saved_odd(loom_graph *g, tcase *t)
{
	loom_value x = param(g, t, "x", 3, 3, 70, 37, 0);
	t->note[0] = "saves mean and rstd";
	t->note_op[0] = LOOM_OP_LAYERNORM;
	return loom_layernorm(g, x, param(g, t, "ln.weight", 1, 37, 0, 0, 0),
			      param(g, t, "ln.bias", 1, 37, 0, 0, 0), 1e-5);
}

Test(cuda_ops, layernorm_saved_statistics)
{
	NEED_GPU();
	each_dtype("layernorm saved 2x50x768", b_layernorm_saved, LOOM_RUN_GRAD);
	each_dtype("layernorm saved 3x70x37", b_layernorm_saved_odd, LOOM_RUN_GRAD);
}

/* A switch that picks a path by name (LOOM_CUDA_LN_BWD=warp, ...): each
 * case in every dtype with the variable unset (today's path) and set to
 * val, both against the CPU; read when the plan is made. */
static void both_choices(const char *var, const char *val, const char *op, build_fn build)
{
	char name[128];
	for (int on = 0; on <= 1; on++) {
		if (on)
			setenv(var, val, 1);
		else
			unsetenv(var);
		snprintf(name, sizeof(name), "%s %s=%s", op, var, on ? val : "(unset)");
		each_dtype(name, build, LOOM_RUN_GRAD);
	}
	unsetenv(var);
}

static int choice_is(const char *var, const char *val)
{
	const char *e = getenv(var);
	return e && !strcmp(e, val);
}

/* Layer norm over rows x c, its backward's note checked under the warp
 * switch (c up to 1024: the warp kernel; wider: the one-pass kernel). */
static loom_value ln_warp_case(loom_graph *g, tcase *t, int64_t b, int64_t rows, int64_t c)
{
	loom_value x = param(g, t, "x", 3, b, rows, c, 0);
	if (choice_is("LOOM_CUDA_LN_BWD", "warp")) {
		t->note[0] = c <= 1024 ? "warp per row in fp32" : "one pass with dgamma";
		t->note_op[0] = LOOM_OP_LAYERNORM_BWD_DATA;
	}
	return loom_layernorm(g, x, param(g, t, "ln.weight", 1, c, 0, 0, 0),
			      param(g, t, "ln.bias", 1, c, 0, 0, 0), 1e-5);
}

static loom_value b_ln_warp_40(loom_graph *g, tcase *t)
{
	return ln_warp_case(g, t, 2, 3, 40);
}

static loom_value b_ln_warp_rows(loom_graph *g, tcase *t)
{
	return ln_warp_case(g, t, 3, 150, 40);
}

static loom_value b_ln_warp_37(loom_graph *g, tcase *t)
{
	return ln_warp_case(g, t, 2, 300, 37);
}

static loom_value b_ln_warp_768(loom_graph *g, tcase *t)
{
	return ln_warp_case(g, t, 2, 50, 768);
}

static loom_value b_ln_warp_1024(loom_graph *g, tcase *t)
{
	return ln_warp_case(g, t, 1, 40, 1024);
}

static loom_value b_ln_warp_1100(loom_graph *g, tcase *t)
{
	return ln_warp_case(g, t, 1, 9, 1100);
}

/* 2 x 2100 rows: 4200 > LOOM_LN_WARP_PARTS warps, so 3 rows a warp. */
static loom_value b_ln_warp_many(loom_graph *g, tcase *t)
{
	return ln_warp_case(g, t, 2, 2100, 24);
}

/* Two layer norms of one x: neither forward saves its mean and rstd
 * (fuse_plan.cu's plan_saved keeps no slot for twins), so each backward
 * makes them again (in fp32 under LOOM_CUDA_LN_BWD=warp). */
static loom_value b_ln_twins(loom_graph *g, tcase *t)
{
	loom_value x = param(g, t, "x", 3, 2, 50, 768, 0);
	t->note[0] = "recomputes mean and rstd";
	t->note_op[0] = LOOM_OP_LAYERNORM_BWD_DATA;
	loom_value a = loom_layernorm(g, x, param(g, t, "ln1.weight", 1, 768, 0, 0, 0),
				      param(g, t, "ln1.bias", 1, 768, 0, 0, 0), 1e-5);
	loom_value b = loom_layernorm(g, x, param(g, t, "ln2.weight", 1, 768, 0, 0, 0),
				      param(g, t, "ln2.bias", 1, 768, 0, 0, 0), 1e-5);
	return loom_add(g, a, b);
}

/* Layer norm's backward one warp per row in fp32 (LOOM_CUDA_LN_BWD=warp,
 * layernorm.cu) against the CPU (statistics and sums in double) and
 * against today's one-pass kernel: 128-bit rows (40, 768, 1024 columns),
 * scalar rows (37), several rows a warp (4200 rows), and 1100 columns,
 * which keep the one-pass kernel; with the forward's saved mean and rstd
 * and, for twin layer norms of one x, recomputed in fp32. The
 * per-dtype NMSE bounds of every row here (1e-8 fp32, 1e-4 f16, 1e-3
 * bf16) hold: fp32 sums over at most 1024 columns and the parts' fold
 * are far inside them. */
Test(cuda_ops, layernorm_backward_warp)
{
	NEED_GPU();
	both_choices("LOOM_CUDA_LN_BWD", "warp", "layernorm 2x3x40", b_ln_warp_40);
	both_choices("LOOM_CUDA_LN_BWD", "warp", "layernorm 3x150x40", b_ln_warp_rows);
	both_choices("LOOM_CUDA_LN_BWD", "warp", "layernorm 2x300x37", b_ln_warp_37);
	both_choices("LOOM_CUDA_LN_BWD", "warp", "layernorm 2x50x768", b_ln_warp_768);
	both_choices("LOOM_CUDA_LN_BWD", "warp", "layernorm 1x40x1024", b_ln_warp_1024);
	both_choices("LOOM_CUDA_LN_BWD", "warp", "layernorm 1x9x1100", b_ln_warp_1100);
	both_choices("LOOM_CUDA_LN_BWD", "warp", "layernorm 2x2100x24", b_ln_warp_many);
	both_choices("LOOM_CUDA_LN_BWD", "warp", "layernorm twins 2x50x768", b_ln_twins);
}

/* The --dump-graph note of p's first node of op (empty: none). */
static void note_of(loom_program *p, loom_op op, char *buf, size_t len)
{
	const loom_backend_planning *pn = p->be->planning;
	buf[0] = 0;
	for (int v = 0; v < p->plan.g->n && pn && pn->node_note; v++)
		if (p->plan.g->nodes[v].op == op) {
			pn->node_note(p->be_ctx, &p->plan, v, buf, len);
			return;
		}
}

/* The layer-norm backward's path is its plan's: LOOM_CUDA_LN_BWD is a
 * process global each plan sets, and the workspace is sized for the path
 * planned (layernorm.cu's loom_cuda_ln_plan.warp), so a program planned
 * before another program took the other value keeps its own path. The
 * note reads the field the run reads. */
Test(cuda_ops, layernorm_backward_keeps_its_plan)
{
	NEED_GPU();
	tcase t;
	loom_graph *g;
	char na[512], nb[512];
	memset(&t, 0, sizeof(t));
	t.dt = LOOM_F32;
	unsetenv("LOOM_CUDA_LN_BWD");
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_value loss = head(g, &t, b_ln_warp_768(g, &t));
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));
	loom_program *a = compile_at(g, loss, LOOM_DEVICE_CUDA, LOOM_O0);
	setenv("LOOM_CUDA_LN_BWD", "warp", 1);
	loom_program *b = compile_at(g, loss, LOOM_DEVICE_CUDA, LOOM_O0);
	unsetenv("LOOM_CUDA_LN_BWD");
	note_of(a, LOOM_OP_LAYERNORM_BWD_DATA, na, sizeof(na));
	note_of(b, LOOM_OP_LAYERNORM_BWD_DATA, nb, sizeof(nb));
	cr_expect(strstr(na, "one pass with dgamma") != NULL, "planned first: \"%s\"", na);
	cr_expect(strstr(nb, "warp per row in fp32") != NULL, "planned second: \"%s\"", nb);
	loom_program_free(b);
	loom_program_free(a);
	loom_graph_free(g);
}

/* y = ln(s) + s over b x rows x c, s read by the layer norm and by the
 * add after it. residual: s = x + h, a residual stream, so the sum is read
 * by the layer norm, its backward and the next add (under
 * LOOM_CUDA_LN_RESIDUAL=1 the layer norm is made by the add's kernel);
 * else s = x, whose gradient sums the add's (dy) and the norm's dx (under
 * LOOM_CUDA_LN_BWD_ACCUM=1 the norm's backward adds dx into dy itself:
 * graph/fuse.c's loom_fuse_ln_bwd_accum, the sum's ADD a view, the sum
 * written over dy's bytes where dy dies there). */
static loom_value ln_add_case(loom_graph *g, tcase *t, const int64_t d[3], int residual)
{
	loom_value s = param(g, t, "x", 3, d[0], d[1], d[2], 0);
	const char *e = getenv(residual ? "LOOM_CUDA_LN_RESIDUAL" : "LOOM_CUDA_LN_BWD_ACCUM");
	const int on = e && !strcmp(e, "1");
	if (residual) {
		s = loom_add(g, s, param(g, t, "h", 3, d[0], d[1], d[2], 0));
		t->note[0] = on ? "made by its residual add" : "warp per row";
		t->note_op[0] = LOOM_OP_LAYERNORM;
	} else if (on) {
		t->note[0] = "dx added into the residual's gradient";
		t->note_op[0] = LOOM_OP_LAYERNORM_BWD_DATA;
	}
	loom_value y = loom_layernorm(g, s, param(g, t, "ln.weight", 1, d[2], 0, 0, 0),
				      param(g, t, "ln.bias", 1, d[2], 0, 0, 0), 1e-5);
	return loom_add(g, y, s);
}

/* The shape b_ln_residual and b_ln_accum build, set by their test before
 * each case. */
static int64_t ln_add_dims[3];

static loom_value b_ln_residual(loom_graph *g, tcase *t)
{
	return ln_add_case(g, t, ln_add_dims, 1);
}

static loom_value b_ln_accum(loom_graph *g, tcase *t)
{
	return ln_add_case(g, t, ln_add_dims, 0);
}

/* The residual add with its layer norm in one kernel, a warp per row
 * (LOOM_CUDA_LN_RESIDUAL, layernorm.cu) against the CPU and against the
 * two kernels it replaces (=0), in every dtype: 128-bit rows (768) and
 * scalar rows (37). */
Test(cuda_ops, layernorm_residual)
{
	static const int64_t shapes[2][3] = { { 2, 50, 768 }, { 3, 70, 37 } };
	NEED_GPU();
	for (int i = 0; i < 2; i++) {
		char name[64];
		memcpy(ln_add_dims, shapes[i], sizeof(ln_add_dims));
		snprintf(name, sizeof(name), "ln_residual %dx%dx%d", (int)shapes[i][0],
			 (int)shapes[i][1], (int)shapes[i][2]);
		both_switch_values("LOOM_CUDA_LN_RESIDUAL", name, b_ln_residual);
	}
}

/* Layer norm's dx added into the residual's other gradient in the dx
 * kernel's own pass (LOOM_CUDA_LN_BWD_ACCUM, layernorm.cu) against the
 * CPU and against the dx kernel and the add it replaces (=0), in every
 * dtype: 128-bit rows (768), scalar rows (37), each on the one-pass and
 * the warp backward (LOOM_CUDA_LN_BWD), and rows past the one-pass
 * kernel's 2048 (the separate kernels). Compiled, not yet run. */
Test(cuda_ops, layernorm_backward_accum)
{
	static const int64_t shapes[3][3] = { { 2, 50, 768 }, { 3, 70, 37 }, { 1, 9, 2100 } };
	static const char *const bwd[2] = { "legacy", "warp" };
	NEED_GPU();
	for (int i = 0; i < 3; i++)
		for (int k = 0; k < (i < 2 ? 2 : 1); k++) {
			char name[96];
			memcpy(ln_add_dims, shapes[i], sizeof(ln_add_dims));
			snprintf(name, sizeof(name), "ln_bwd_accum %dx%dx%d %s", (int)shapes[i][0],
				 (int)shapes[i][1], (int)shapes[i][2], bwd[k]);
			setenv("LOOM_CUDA_LN_BWD", bwd[k], 1);
			both_switch_values("LOOM_CUDA_LN_BWD_ACCUM", name, b_ln_accum);
		}
	unsetenv("LOOM_CUDA_LN_BWD");
}

/* A linear with a bias over rows x k -> c: under LOOM_CUDA_BGRAD=kernel
 * no product's note may name BGRADB, and the bias gradient comes from the
 * column-sum kernel (elementwise.cu). */
static loom_value bgrad_case(loom_graph *g, tcase *t, int64_t rows, int64_t k, int64_t c)
{
	loom_value x = param(g, t, "x", 2, rows, k, 0, 0);
	if (choice_is("LOOM_CUDA_BGRAD", "kernel"))
		t->no_note = "BGRADB";
	return loom_linear(g, x, param(g, t, "fc.weight", 2, c, k, 0, 0),
			   param(g, t, "fc.bias", 1, c, 0, 0, 0));
}

static loom_value b_bgrad_768(loom_graph *g, tcase *t)
{
	return bgrad_case(g, t, 96, 64, 768);
}

static loom_value b_bgrad_odd(loom_graph *g, tcase *t)
{
	return bgrad_case(g, t, 301, 24, 37);
}

/* 5000 rows: 64 chunks of 79, the last of 23. */
static loom_value b_bgrad_tall(loom_graph *g, tcase *t)
{
	return bgrad_case(g, t, 5000, 16, 40);
}

/* A 3-D linear ([2, 40, 24] seen as 80 rows): the bias gradient of the
 * rows view. */
static loom_value b_bgrad_3d(loom_graph *g, tcase *t)
{
	loom_value x = param(g, t, "x", 3, 2, 40, 24, 0);
	if (choice_is("LOOM_CUDA_BGRAD", "kernel"))
		t->no_note = "BGRADB";
	return loom_linear(g, x, param(g, t, "fc.weight", 2, 33, 24, 0, 0),
			   param(g, t, "fc.bias", 1, 33, 0, 0, 0));
}

/* The bias gradient outside the weight gradient's product
 * (LOOM_CUDA_BGRAD=kernel: the column-sum kernel, no BGRADB) against the
 * CPU and against today's BGRADB epilogue, at 768 columns, 37 (odd), 5000
 * rows (chunked) and a 3-D input, every dtype, the usual NMSE bounds. */
Test(cuda_ops, bias_gradient_kernel)
{
	NEED_GPU();
	both_choices("LOOM_CUDA_BGRAD", "kernel", "linear 96x64->768", b_bgrad_768);
	both_choices("LOOM_CUDA_BGRAD", "kernel", "linear 301x24->37", b_bgrad_odd);
	both_choices("LOOM_CUDA_BGRAD", "kernel", "linear 5000x16->40", b_bgrad_tall);
	both_choices("LOOM_CUDA_BGRAD", "kernel", "linear 2x40x24->33", b_bgrad_3d);
}

/* The GPT's MLP: linear (bias) -> GELU -> linear. With the tanh GELU the
 * first linear computes it in cuBLASLt's GELU_AUX_BIAS epilogue
 * (LOOM_CUDA_GELU_EPILOGUE) and the second's data gradient the GELU
 * backward in DGELU (the memory plan puts that backward over its dy:
 * gpt_fusions_chosen_on_the_plan); the exact GELU never fuses. */
static loom_value mlp(loom_graph *g, tcase *t, int tanh_form)
{
	loom_value x = param(g, t, "x", 3, 2, 33, 64, 0);
	loom_value h = loom_linear(g, x, param(g, t, "fc.weight", 2, 128, 64, 0, 0),
				   param(g, t, "fc.bias", 1, 128, 0, 0, 0));
	h = tanh_form ? loom_gelu_tanh(g, h) : loom_gelu(g, h);
	loom_value w2 = param(g, t, "proj.weight", 2, 64, 128, 0, 0);
	return loom_linear(g, h, w2, param(g, t, "proj.bias", 1, 64, 0, 0, 0));
}

static loom_value b_mlp_tanh(loom_graph *g, tcase *t)
{
	if (switch_set("LOOM_CUDA_GELU_EPILOGUE") && !own_kernels && t->dt != LOOM_F32) {
		t->note[0] = "GELU_AUX";
		t->note_op[0] = LOOM_OP_LINEAR;
		t->note[1] = "the product's GELU epilogue";
		t->note_op[1] = LOOM_OP_GELU;
		t->note[2] = "DGELU";
		t->note_op[2] = LOOM_OP_MATMUL;
	}
	return mlp(g, t, 1);
}

static loom_value b_mlp_erf(loom_graph *g, tcase *t)
{
	t->no_note = "GELU";
	return mlp(g, t, 0);
}

/* In every dtype against the CPU and the own GELU kernels
 * (LOOM_CUDA_GELU_EPILOGUE=0); the epilogues are expected on f16 and bf16
 * (f32 keeps the own kernel); no node of the exact-GELU MLP carries one. */
Test(cuda_ops, gelu_epilogue)
{
	NEED_GPU();
	both_switch_values("LOOM_CUDA_GELU_EPILOGUE", "mlp gelu tanh", b_mlp_tanh);
	both_switch_values("LOOM_CUDA_GELU_EPILOGUE", "mlp gelu erf", b_mlp_erf);
}

/* A GPT block's MLP and classifier in one graph, of dtype dt: linear
 * (bias) -> GELU (tanh_form or exact) -> linear -> a product to 96
 * classes, whose rows (a reshape) go to softmax-CE; the product's output
 * marked an output when logits_out; the
 * second linear's weight a buffer (no weight gradient) when frozen_proj. */
static loom_value gpt_tail(loom_graph *g, loom_dtype dt, int tanh_form, int logits_out,
			   int frozen_proj)
{
	int64_t dx[3] = { 2, 16, 64 }, dw1[2] = { 128, 64 }, db1[1] = { 128 };
	int64_t dw2[2] = { 64, 128 }, db2[1] = { 64 }, dwo[2] = { 96, 64 }, rows[2] = { 32, 64 };
	int64_t nl = 32;
	loom_value x = loom_param(g, "x", dt, 3, dx, LOOM_INIT_ZEROS, 1);
	loom_value h = loom_linear(g, x, loom_param(g, "fc.w", dt, 2, dw1, LOOM_INIT_ZEROS, 1),
				   loom_param(g, "fc.b", dt, 1, db1, LOOM_INIT_ZEROS, 1));
	h = tanh_form ? loom_gelu_tanh(g, h) : loom_gelu(g, h);
	loom_value w2 = frozen_proj ? loom_buffer(g, "proj.w", dt, 2, dw2, LOOM_INIT_ONES) :
				      loom_param(g, "proj.w", dt, 2, dw2, LOOM_INIT_ZEROS, 1);
	loom_value y = loom_linear(g, h, w2, loom_param(g, "proj.b", dt, 1, db2, LOOM_INIT_ZEROS, 1));
	/* As gpt_ddp: the product over [B, T, C], its rows the logits (a view). */
	loom_value logits = loom_linear(g, y, loom_param(g, "head.w", dt, 2, dwo, LOOM_INIT_ZEROS, 1),
					LOOM_NONE);
	if (logits_out)
		loom_mark_output(g, logits);
	rows[1] = 96;
	return loom_softmax_cross_entropy(g, loom_reshape(g, logits, 2, rows),
					  loom_input(g, "labels", LOOM_I32, 1, &nl));
}

/* A GPT-sized linear with a bias over [B, T, C] rows, aligned shapes
 * (every row 16-byte aligned in half): the weight gradient's bias
 * gradient rides BGRADB unless LOOM_CUDA_BGRAD_EPILOGUE=0. */
static loom_value b_linear_gpt(loom_graph *g, tcase *t)
{
	loom_value x = param(g, t, "x", 3, 2, 64, 128, 0);
	return loom_linear(g, x, param(g, t, "fc.weight", 2, 256, 128, 0, 0),
			   param(g, t, "fc.bias", 1, 256, 0, 0, 0));
}

/* A classifier over 67 classes (rows of the logits not 16-byte aligned
 * in any dtype, as GPT-2's 50257): x [2, 8, 32] through a linear to the
 * logits, their rows to softmax-CE; forward, dx and dw all see the odd
 * leading dimension. */
static loom_value b_classifier_odd(loom_graph *g, tcase *t)
{
	const char *pad = getenv("LOOM_CUDA_LT_PAD");
	if (pad && !strcmp(pad, "1")) { /* the logits' rows padded (--dump-graph's note) */
		t->note[0] = "out rows 67 -> 128";
		t->note_op[0] = LOOM_OP_LINEAR;
		t->note[1] = "rows 67 -> 128";
		t->note_op[1] = LOOM_OP_MATMUL;
	}
	loom_value x = param(g, t, "x", 3, 2, 8, 32, 0);
	loom_value lg = loom_linear(g, x, param(g, t, "head.weight", 2, 67, 32, 0, 0), LOOM_NONE);
	int64_t rows[2] = { 16, 67 };
	return loom_softmax_cross_entropy(g, loom_reshape(g, lg, 2, rows), labels(g, t, 16, 67));
}

/* A tied classifier over 67 classes (the embedding's table is the
 * classifier's weight; the labels are the ids too). Under LOOM_VOCAB_PAD
 * its table, gradients and logits are padded to 128 rows (columns). */
static loom_value b_classifier_tied(loom_graph *g, tcase *t)
{
	const char *pad = getenv("LOOM_VOCAB_PAD");
	if (pad && strcmp(pad, "0")) { /* --dump-graph's note on the padded plan */
		t->note[0] = "67 of 128 columns (padded)";
		t->note_op[0] = LOOM_OP_SOFTMAX_CE;
	}
	loom_value ids = labels(g, t, 16, 67);
	loom_value w = param(g, t, "wte", 2, 67, 32, 0, 0);
	loom_value h = loom_add(g, loom_embedding(g, ids, w), param(g, t, "x", 2, 16, 32, 0, 0));
	return loom_softmax_cross_entropy(g, loom_linear(g, h, w, LOOM_NONE), ids);
}

/* A tied classifier over 1000 classes, which the CUDA backend's default
 * pads to 1024 (an eighth or less added; 67 -> 128 would be more). */
static loom_value b_classifier_tied_1000(loom_graph *g, tcase *t)
{
	t->note[0] = "1000 of 1024 columns (padded)";
	t->note_op[0] = LOOM_OP_SOFTMAX_CE;
	loom_value ids = labels(g, t, 16, 1000);
	loom_value w = param(g, t, "wte", 2, 1000, 32, 0, 0);
	loom_value h = loom_add(g, loom_embedding(g, ids, w), param(g, t, "x", 2, 16, 32, 0, 0));
	return loom_softmax_cross_entropy(g, loom_linear(g, h, w, LOOM_NONE), ids);
}

/* The classifier over a padded vocabulary (LOOM_VOCAB_PAD=64: 67 classes
 * laid out as 128; engine/vocab_pad.c): the loss and every gradient (the
 * real rows a user reads) against the CPU's padded plan, in every dtype,
 * with the fused classifier and the two-pass kernels; the tied table and
 * an untied head. */
Test(cuda_ops, padded_vocabulary)
{
	NEED_GPU();
	setenv("LOOM_VOCAB_PAD", "64", 1);
	each_dtype("tied classifier 67 -> 128", b_classifier_tied, LOOM_RUN_GRAD);
	each_dtype("classifier 67 classes padded", b_classifier_odd, LOOM_RUN_GRAD);
	unsetenv("LOOM_VOCAB_PAD");
	/* The CUDA backend's default pads too (128; the CPU twin's none):
	 * the same real rows. */
	vocab_pad_default = 1;
	each_dtype("tied classifier 1000 -> 1024 by default", b_classifier_tied_1000,
		   LOOM_RUN_GRAD);
	vocab_pad_default = 0;
}

/* The tied classifier whose table's two gradients the embedding's
 * backward sums itself under LOOM_CUDA_EMB_BWD_ACCUM=1 (graph/fuse.c's
 * loom_fuse_emb_bwd_accum: the ADD a view, dW placed in the gradient's
 * bytes where their dtypes agree). */
static loom_value b_classifier_tied_accum(loom_graph *g, tcase *t)
{
	const char *e = getenv("LOOM_CUDA_EMB_BWD_ACCUM");
	loom_value y = b_classifier_tied(g, t);
	if (e && !strcmp(e, "1")) {
		t->note[1] = "rows added into the tied table's other gradient";
		t->note_op[1] = LOOM_OP_EMBEDDING_BWD;
	}
	return y;
}

/* The embedding's gradient added into the tied table's other gradient in
 * the bucketed kernel's own pass (LOOM_CUDA_EMB_BWD_ACCUM, embedding.cu)
 * against the CPU (whose twin plans the same fusion) and against the
 * scatter-add and the add it replaces (=0), in every dtype, the
 * vocabulary unpadded (67 rows) and padded (128). Compiled, not yet run. */
Test(cuda_ops, embedding_backward_accum)
{
	NEED_GPU();
	setenv("LOOM_VOCAB_PAD", "0", 1);
	both_switch_values("LOOM_CUDA_EMB_BWD_ACCUM", "tied classifier 67", b_classifier_tied_accum);
	setenv("LOOM_VOCAB_PAD", "64", 1);
	both_switch_values("LOOM_CUDA_EMB_BWD_ACCUM", "tied classifier 67 -> 128",
			   b_classifier_tied_accum);
	unsetenv("LOOM_VOCAB_PAD");
}

/* The products' switches against llm.c's use of cuBLASLt
 * (LOOM_CUDA_BGRAD_EPILOGUE: the bias gradient by BGRADB or the sibling's
 * own channel sum; LOOM_CUDA_LT_ALIGN: the heuristic told the plan's
 * alignment, the pointers checked per call, or 16; LOOM_CUDA_LT_PAD:
 * operands with unaligned rows through padded copies), each value against
 * the CPU in every dtype, forward and backward. */
Test(cuda_ops, products_llmc_switches)
{
	NEED_GPU();
	both_switch_values("LOOM_CUDA_BGRAD_EPILOGUE", "linear gpt 2x64x128 -> 256", b_linear_gpt);
	both_switch_values("LOOM_CUDA_BGRAD_EPILOGUE", "linear bias 6x20 -> 12", b_linear_bias);
	both_switch_values("LOOM_CUDA_LT_ALIGN", "linear gpt 2x64x128 -> 256", b_linear_gpt);
	both_switch_values("LOOM_CUDA_LT_ALIGN", "linear bias relu", b_linear_bias_relu);
	both_switch_values("LOOM_CUDA_LT_ALIGN", "matmul", b_matmul);
	both_switch_values("LOOM_CUDA_LT_ALIGN", "mlp gelu tanh", b_mlp_tanh);
	both_switch_values("LOOM_CUDA_LT_PAD", "linear bias 6x20 -> 12", b_linear_bias);
	both_switch_values("LOOM_CUDA_LT_PAD", "linear bias relu", b_linear_bias_relu);
	both_switch_values("LOOM_CUDA_LT_PAD", "matmul 7x9x5", b_matmul);
	both_switch_values("LOOM_CUDA_LT_PAD", "classifier 67 classes", b_classifier_odd);
	both_switch_values("LOOM_CUDA_LT_PAD", "linear gpt 2x64x128 -> 256", b_linear_gpt);
}

/* The plan-level choices of the GPT fusions (no GPU needed: the plugin's
 * test_gpt_fusions on the plan the CPU compiled, whose memory plan and
 * steps are the same passes'): the classifier's backward done by its
 * forward where dlogits lie on the logits and nothing else reads them;
 * GELU_AUX on c_fc for the tanh GELU in half, never for the exact GELU or
 * in f32. DGELU on c_proj's data gradient for the tanh GELU in half: the
 * memory plan puts the GELU backward's output in place over its dy, that
 * product's output (LOOM_OPF_INPLACE_DY), so the epilogue writes bytes
 * nothing else reads. With LOOM_INPLACE_DY=0 (the plan before) never:
 * c_proj's weight gradient, which runs between that product and the GELU
 * backward, reads the GELU's output, whose bytes the memory plan then
 * gives the GELU backward's output; with c_proj frozen the GELU backward's
 * output takes the bytes of the product's own dying dy only by chance of
 * the best fit. Either way the epilogue may not write them early. */
Test(cuda_ops, gpt_fusions_chosen_on_the_plan)
{
	const loom_cuda_plugin *pl = plugin();
	if (!pl)
		cr_skip_test("needs a build with the CUDA toolkit (the plugin's test hooks)");
	const struct {
		loom_dtype dt;
		int tanh_form, logits_out, frozen, ce, aux, dgelu;
	} rows[] = {
		{ LOOM_BF16, 1, 0, 0, 1, 1, 1 }, { LOOM_F16, 1, 0, 0, 1, 1, 1 },
		{ LOOM_BF16, 1, 0, 1, 1, 1, 1 },
		{ LOOM_BF16, 0, 0, 0, 1, 0, 0 }, { LOOM_F32, 1, 0, 0, 1, 0, 0 },
		{ LOOM_BF16, 1, 1, 0, 0, 1, 1 },
	};
	for (int dy_off = 0; dy_off <= 1; dy_off++)
		for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
			loom_graph *g;
			loom_program *p;
			loom_compile_opts o;
			cr_assert_eq(loom_graph_new(&g), LOOM_OK);
			loom_value loss = gpt_tail(g, rows[i].dt, rows[i].tanh_form,
						   rows[i].logits_out, rows[i].frozen);
			cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));
			loom_compile_opts_default(&o);
			o.device = LOOM_DEVICE_CPU;
			o.optim.kind = LOOM_OPTIM_NONE;
			if (dy_off)
				setenv("LOOM_INPLACE_DY", "0", 1);
			loom_status cst = loom_compile(g, loss, &o, &p);
			unsetenv("LOOM_INPLACE_DY");
			cr_assert_eq(cst, LOOM_OK, "%s", loom_last_error());
			int ce = -1, aux = -1, dgelu = -1;
			const int want_dgelu = dy_off ? 0 : rows[i].dgelu;
			pl->test_gpt_fusions(&p->plan, &ce, &aux, &dgelu);
			cr_expect(ce == rows[i].ce && aux == rows[i].aux && dgelu == want_dgelu,
				  "row %zu (%s, %s GELU%s%s%s): classifier %d, GELU_AUX %d, DGELU %d; "
				  "want %d %d %d",
				  i, loom_dtype_name(rows[i].dt), rows[i].tanh_form ? "tanh" : "exact",
				  rows[i].logits_out ? ", logits an output" : "",
				  rows[i].frozen ? ", c_proj frozen" : "",
				  dy_off ? ", LOOM_INPLACE_DY=0" : "", ce, aux, dgelu, rows[i].ce,
				  rows[i].aux, want_dgelu);
			loom_program_free(p);
			loom_graph_free(g);
		}
}

/* With the GELU made again in the backward (LOOM_RECOMPUTE=1,
 * graph/recompute.c) the copy reads c_fc's output too: the forward's GELU
 * keeps its own kernel (no GELU_AUX), so that the copy, an own kernel,
 * computes the same bits as the value it stands for. Plan-level: runs
 * wherever the plugin builds. Seen failing with the copy counted as a
 * reader of the pre-activation like the GELU backward. */
Test(cuda_ops, gelu_made_again_keeps_its_own_kernel)
{
	const loom_cuda_plugin *pl = plugin();
	if (!pl)
		cr_skip_test("needs a build with the CUDA toolkit (the plugin's test hooks)");
	for (int r = 0; r <= 1; r++) {
		loom_graph *g;
		loom_program *p;
		loom_compile_opts o;
		cr_assert_eq(loom_graph_new(&g), LOOM_OK);
		loom_value loss = gpt_tail(g, LOOM_BF16, 1, 0, 0);
		cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));
		loom_compile_opts_default(&o);
		o.device = LOOM_DEVICE_CPU;
		o.optim.kind = LOOM_OPTIM_NONE;
		o.recompute = r;
		cr_assert_eq(loom_compile(g, loss, &o, &p), LOOM_OK, "%s", loom_last_error());
		int ce = -1, aux = -1, dgelu = -1;
		pl->test_gpt_fusions(&p->plan, &ce, &aux, &dgelu);
		cr_expect_eq(p->plan.n_recomputed > 0, r, "recompute %d: %d values made again", r,
			     p->plan.n_recomputed);
		cr_expect_eq(aux, !r, "recompute %d: GELU_AUX %d", r, aux);
		loom_program_free(p);
		loom_graph_free(g);
	}
}

/* Activations made again in the backward (LOOM_RECOMPUTE, graph/
 * recompute.c) on the GPU against the CPU, in every dtype: GELU (level 1)
 * and layer norm with its O1 cast (level 2), forward and gradients. */
static loom_value b_classifier_o1(loom_graph *g, tcase *t);
Test(cuda_ops, recompute_against_cpu)
{
	NEED_GPU();
	both_switch_values("LOOM_RECOMPUTE", "mlp gelu tanh", b_mlp_tanh);
	both_switch_values("LOOM_RECOMPUTE", "mlp gelu erf", b_mlp_erf);
	setenv("LOOM_RECOMPUTE", "2", 1);
	each_dtype("classifier O1 LOOM_RECOMPUTE=2", b_classifier_o1, LOOM_RUN_GRAD);
	unsetenv("LOOM_RECOMPUTE");
}

/* The GPT's classifier at O1 bf16: layer norm (fp32) into the product
 * (bf16) into softmax cross-entropy (fp32), forward and backward. */
static loom_value b_classifier_o1(loom_graph *g, tcase *t)
{
	t->level = LOOM_O1;
	loom_value x = param(g, t, "x", 3, 2, 8, 32, 0);
	loom_value h = loom_layernorm(g, x, param(g, t, "ln.weight", 1, 32, 0, 0, 0),
				      param(g, t, "ln.bias", 1, 32, 0, 0, 0), 1e-5);
	int64_t rows[2] = { 16, 32 };
	loom_value logits = loom_linear(g, loom_reshape(g, h, 2, rows),
					param(g, t, "lm_head.weight", 2, 64, 32, 0, 0), LOOM_NONE);
	return loom_softmax_cross_entropy(g, logits, labels(g, t, 16, 64));
}

static int casts_in(const loom_graph *g)
{
	int n = 0;
	for (int v = 0; v < g->n; v++)
		n += g->nodes[v].op == LOOM_OP_CAST;
	return n;
}

/* The CUDA plan's cast folding (no GPU needed: the CUDA backend's
 * takes_any_dtype applied to the classifier's O1 bf16 graph as the CPU
 * compiled it unfused): the cast of layer norm's output into the product
 * folds into layer norm, the widened logits go to both cross-entropy
 * nodes as bf16, the gradient's narrowing folds into the cross-entropy
 * backward. */
Test(cuda_ops, cuda_folds_casts_at_its_own_kernels)
{
	const loom_backend *be = plugin() ? plugin()->backend() : NULL;
	if (!be)
		cr_skip_test("needs a build with the CUDA toolkit (the plugin's backend table)");
	cr_assert(be->caps & LOOM_BE_FUSES_SOME_CASTS);
	cr_assert(be->planning->takes_any_dtype);
	tcase t;
	loom_graph *g;
	loom_program *p;
	loom_compile_opts o;
	memset(&t, 0, sizeof(t));
	t.dt = LOOM_F32;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_value loss = b_classifier_o1(g, &t);
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.no_fusion = 1; /* the plan before any fold */
	o.amp.level = LOOM_O1;
	o.amp.half = LOOM_BF16;
	o.optim.kind = LOOM_OPTIM_NONE;
	cr_assert_eq(loom_compile(g, loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	int before = casts_in(p->plan.g);
	int folded = loom_fuse_casts_for(p->plan.g, be->planning->takes_any_dtype);
	int ce_half = 0;
	for (int v = 0; v < p->plan.g->n; v++) {
		const loom_node *n = &p->plan.g->nodes[v];
		if (n->op == LOOM_OP_SOFTMAX_CE || n->op == LOOM_OP_SOFTMAX_CE_BWD)
			ce_half += p->plan.g->nodes[n->src[0]].dtype == LOOM_BF16;
		if (n->flags & LOOM_NODE_CAST_FOLDED)
			cr_expect(be->planning->takes_any_dtype((loom_op)n->op), "node %d op %d", v,
				  (int)n->op);
	}
	cr_expect_geq(folded, 3, "%d of %d casts folded", folded, before);
	cr_expect_eq(casts_in(p->plan.g), before - folded);
	cr_expect_eq(ce_half, 2, "%d cross-entropy nodes read bf16 logits", ce_half);
	loom_program_free(p);
	loom_graph_free(g);
}

/* The same classifier on the GPU with the folding, against the CPU (O1
 * runs in fp16 here: run_case's AMP levels). */
Test(cuda_ops, folded_casts_run_like_the_cpu)
{
	NEED_GPU();
	for (uint64_t seed = 1; seed <= 2; seed++)
		run_case("classifier O1 folded", b_classifier_o1, LOOM_F32, LOOM_RUN_GRAD, seed);
}

/* The strided products' cached heuristic answers (the attention's): the
 * same cases twice in one process (the second run takes every plan from
 * the cache). */
Test(cuda_ops, strided_products_cached)
{
	NEED_GPU();
	for (int twice = 0; twice < 2; twice++) {
		each_dtype("attention 4 heads of 32", b_attention_hs32, LOOM_RUN_GRAD);
		each_dtype("attention 4 heads of 64", b_attention_hs64, LOOM_RUN_GRAD);
	}
}

/* Exact values where the rules matter: ties (first max wins), windows whose
 * max is negative or zero (relu gives 0 and no gradient), and NaN (wins the
 * pool, survives the relu, gets no gradient). f32, so both backends must
 * agree bit for bit up to the sums of overlapping windows. */
static void relu_pool_special(int k, int stride, int pad)
{
	int64_t xd[4] = { 1, 2, 7, 7 }, n = 2 * 7 * 7;
	loom_graph *g;
	loom_program *p[2];
	loom_compile_opts o;
	double x[2 * 7 * 7];
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_value xv = loom_param(g, "x", LOOM_F32, 4, xd, LOOM_INIT_ZEROS, 1);
	loom_value y = loom_maxpool2d(g, loom_relu(g, xv), k, stride, pad);
	loom_shape ys = loom_value_shape(g, y);
	int64_t ny = loom_shape_numel(&ys), row[2] = { 1, ny }, rd[2] = { ny, 1 };
	loom_value r = loom_param(g, "r", LOOM_F32, 2, rd, LOOM_INIT_ONES, 1);
	loom_value loss = loom_sum(g, loom_matmul(g, loom_reshape(g, y, 2, row), r));
	loom_mark_output(g, y);
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));
	for (int64_t i = 0; i < n; i++) /* few distinct values: many ties */
		x[i] = (double)((i * 7) % 5) - 2.0;
	x[3] = NAN;
	x[2 * 7 + 4] = NAN;
	x[49 + 8] = -0.0;
	for (int d = 0; d < 2; d++) {
		loom_compile_opts_default(&o);
		o.no_tf32 = 1; /* exact fp32: compared with the CPU */
		o.device = d ? LOOM_DEVICE_CUDA : LOOM_DEVICE_CPU;
		o.optim.kind = LOOM_OPTIM_NONE;
		cr_assert_eq(loom_compile(g, loss, &o, &p[d]), LOOM_OK, "%s", loom_last_error());
		cr_assert_eq(loom_write_f64(p[d], xv, x, n), LOOM_OK, "%s", loom_program_error(p[d]));
		cr_assert_eq(loom_run(p[d], LOOM_RUN_GRAD), LOOM_OK, "%s", loom_program_error(p[d]));
	}
	expect_same_plan("relu+maxpool special values", p[0], p[1]);
	cr_expect_eq(fused_pools(p[1]), 2);
	double *a = malloc(sizeof(double) * n), *b = malloc(sizeof(double) * n);
	cr_assert(a && b);
	for (int grad = 0; grad < 2; grad++) {
		loom_value v = grad ? xv : y;
		size_t cnt = grad ? (size_t)n : (size_t)ny;
		read_value(p[1], v, grad, a, cnt);
		read_value(p[0], v, grad, b, cnt);
		for (size_t i = 0; i < cnt; i++)
			cr_expect((isnan(a[i]) && isnan(b[i])) || fabs(a[i] - b[i]) <= 1e-6,
				  "k %d: %s[%zu]: cuda %g cpu %g", k, grad ? "dx" : "y", i, a[i], b[i]);
	}
	free(a);
	free(b);
	loom_program_free(p[1]);
	loom_program_free(p[0]);
	loom_graph_free(g);
}

Test(cuda_ops, relu_maxpool_ties_and_nan)
{
	NEED_GPU();
	relu_pool_special(2, 2, 0);
	relu_pool_special(3, 2, 1);
}

Test(cuda_ops, bad_label_fails_the_step_like_the_cpu)
{
	NEED_GPU();
	run_case("softmax_ce bad label", b_ce_bad, LOOM_F32, LOOM_RUN_GRAD, 3);
}

enum { BI_B = 2, BI_T = 8, BI_V = 50, BI_C = 32 };

/* gpt_parts' tied GPT (50 rows) compiled for dev at O0 (AdamW), the
 * vocabulary padded to pad rows (0: not), the embedding's backward adding
 * into the classifier's gradient where accum (LOOM_CUDA_EMB_BWD_ACCUM). */
static loom_program *bad_id_program(const gpt *m, loom_device dev, int pad, int accum)
{
	loom_compile_opts o;
	gpt_adamw_opts(&o, LOOM_O0);
	o.device = dev;
	o.no_tf32 = 1;
	o.vocab_pad = pad;
	setenv("LOOM_CUDA_EMB_BWD_ACCUM", accum ? "1" : "0", 1);
	loom_program *p = NULL;
	loom_status st = loom_compile(m->g, m->loss, &o, &p);
	unsetenv("LOOM_CUDA_EMB_BWD_ACCUM");
	cr_assert_eq(st, LOOM_OK, "%s", loom_last_error());
	return p;
}

/* Every parameter of m read from p as f64 (the f32 values exactly). */
static double **bad_id_params(loom_program *p, const gpt *m)
{
	double **x = calloc((size_t)m->n, sizeof(double *));
	cr_assert(x);
	for (int i = 0; i < m->n; i++) {
		size_t n = (size_t)loom_shape_numel(&m->g->nodes[m->params[i]].shape);
		x[i] = malloc(n * sizeof(double));
		cr_assert(x[i]);
		cr_assert_eq(loom_read_f64(p, m->params[i], x[i], n), LOOM_OK, "%s",
			     loom_program_error(p));
	}
	return x;
}

static void bad_id_params_free(double **x, const gpt *m)
{
	for (int i = 0; i < m->n; i++)
		free(x[i]);
	free(x);
}

/* Batch k (gpt_feed's tokens, positions and targets) into p, then the
 * bad inputs of case bad (-1: none): 0, the id 50 (the vocabulary) at
 * position 3; 1, a position 8 (wpe's rows) at position 0; 2, ids -1 at 3
 * and 52 at 5, that position 8 and a label 50: both embeddings and the
 * loss bad in one step (the first node in step order reported, its first
 * position). */
static void bad_id_feed(loom_program *p, int k, int bad)
{
	int32_t ids[BI_B * BI_T], pos[BI_B * BI_T], tg[BI_B * BI_T];
	for (int j = 0; j < BI_B * BI_T; j++) {
		ids[j] = (j * 7 + k * 13 + 3) % BI_V;
		pos[j] = j % BI_T;
		tg[j] = (j * 11 + k * 5 + 1) % BI_V;
	}
	if (bad == 0 || bad == 2)
		ids[3] = bad == 0 ? BI_V : -1;
	if (bad == 2) {
		ids[5] = BI_V + 2;
		tg[0] = BI_V;
	}
	if (bad >= 1)
		pos[0] = BI_T;
	cr_assert_eq(loom_set_input(p, "ids", ids, LOOM_I32, BI_B * BI_T), LOOM_OK);
	cr_assert_eq(loom_set_input(p, "pos", pos, LOOM_I32, BI_B * BI_T), LOOM_OK);
	cr_assert_eq(loom_set_input(p, "targets", tg, LOOM_I32, BI_B * BI_T), LOOM_OK);
}

/*
 * An embedding id outside the table (engine/cuda/embedding.cu flags it,
 * optim.cu's decision skips the update, the sync after the loss reports
 * it): the tied GPT on CUDA and the CPU, trained one good step, then each
 * bad case of bad_id_feed: both fail with the same message (loom_bad_id),
 * no parameter on the device changes (bit for bit), and the next good
 * step trains on both with the same loss; the vocabulary unpadded and
 * padded (an id in the padding rows is bad too), the embedding's backward
 * alone and adding into the classifier's gradient. Compiled, not yet run.
 */
Test(cuda_ops, bad_id_fails_the_step_like_the_cpu)
{
	NEED_GPU();
	for (int pad = 0; pad <= 64; pad += 64)
		for (int accum = 0; accum <= 1; accum++) {
			gpt m;
			cr_assert_eq(gpt_tied_block(&m, BI_B, BI_T, BI_V, BI_C), LOOM_OK);
			for (loom_value v = 0; v < m.g->n; v++)
				if (m.g->nodes[v].op == LOOM_OP_EMBEDDING)
					loom_set_name(m.g, v, m.g->nodes[v].src[1] == m.wte ?
							      "tok_emb" : "pos_emb");
			loom_program *p[2] = { bad_id_program(&m, LOOM_DEVICE_CPU, pad, accum),
					       bad_id_program(&m, LOOM_DEVICE_CUDA, pad, accum) };
			int k = 0;
			for (int i = 0; i < 2; i++) {
				bad_id_feed(p[i], k, -1);
				cr_assert_eq(loom_run(p[i], LOOM_RUN_TRAIN), LOOM_OK, "%s",
					     loom_program_error(p[i]));
			}
			for (int bad = 0; bad < 3; bad++) {
				double **before = bad_id_params(p[1], &m);
				k++;
				for (int i = 0; i < 2; i++) {
					bad_id_feed(p[i], k, bad);
					cr_expect_eq(loom_run(p[i], LOOM_RUN_TRAIN), LOOM_ERR_INVALID,
						     "pad %d accum %d case %d, %s: the step ran", pad,
						     accum, bad, i ? "cuda" : "cpu");
				}
				cr_expect(strstr(loom_program_error(p[1]), "_emb': id") != NULL,
					  "case %d: %s", bad, loom_program_error(p[1]));
				cr_expect_str_eq(loom_program_error(p[1]), loom_program_error(p[0]),
						 "pad %d accum %d case %d", pad, accum, bad);
				double **after = bad_id_params(p[1], &m);
				for (int i = 0; i < m.n; i++)
					cr_expect(!memcmp(before[i], after[i],
							  sizeof(double) *
								  (size_t)loom_shape_numel(
									  &m.g->nodes[m.params[i]].shape)),
						  "pad %d accum %d case %d: %s changed", pad, accum,
						  bad, m.g->nodes[m.params[i]].name);
				bad_id_params_free(before, &m);
				bad_id_params_free(after, &m);
				/* the flags cleared: the next step trains as the CPU's */
				k++;
				double loss[2];
				for (int i = 0; i < 2; i++) {
					bad_id_feed(p[i], k, -1);
					cr_assert_eq(loom_run(p[i], LOOM_RUN_TRAIN), LOOM_OK,
						     "pad %d accum %d case %d, the next step: %s", pad,
						     accum, bad, loom_program_error(p[i]));
					loss[i] = loom_loss(p[i]);
				}
				cr_expect(fabs(loss[1] - loss[0]) <= 1e-3 * fabs(loss[0]),
					  "pad %d accum %d case %d, the next step's loss: cuda %.9g "
					  "cpu %.9g", pad, accum, bad, loss[1], loss[0]);
			}
			loom_program_free(p[1]);
			loom_program_free(p[0]);
			loom_graph_free(m.g);
		}
}

Test(cuda_ops, f64_graph_is_refused)
{
	NEED_GPU();
	loom_graph *g;
	loom_program *p = NULL;
	loom_compile_opts o;
	int64_t d[1] = { 4 };
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_value x = loom_param(g, "x", LOOM_F64, 1, d, LOOM_INIT_ONES, 1);
	loom_value l = loom_sum(g, loom_relu(g, x));
	loom_compile_opts_default(&o);
	o.no_tf32 = 1; /* exact fp32: compared with the CPU */
	o.device = LOOM_DEVICE_CUDA;
	cr_assert_eq(loom_compile(g, l, &o, &p), LOOM_ERR_UNSUPPORTED);
	cr_assert(strstr(loom_last_error(), "f64") != NULL, "%s", loom_last_error());
	cr_assert_str_eq(loom_program_error(p), loom_last_error());
	loom_program_free(p);
	loom_graph_free(g);
}

/* Runs everywhere, never skips: asking for CUDA where there is none is an
 * error that names the missing device, not a crash; where there is one,
 * the program is the CUDA backend's. */
Test(cuda_ops, cuda_compile_follows_the_device)
{
	loom_graph *g;
	loom_program *p = NULL;
	loom_compile_opts o;
	loom_program_info info;
	int64_t d[1] = { 4 };
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_value x = loom_param(g, "x", LOOM_F32, 1, d, LOOM_INIT_ONES, 1);
	loom_compile_opts_default(&o);
	o.no_tf32 = 1; /* exact fp32: compared with the CPU */
	o.device = LOOM_DEVICE_CUDA;
	loom_status st = loom_compile(g, loom_sum(g, x), &o, &p);
	if (no_gpu()) {
		cr_assert_eq(st, LOOM_ERR_UNSUPPORTED, "%s", loom_last_error());
		cr_assert_not_null(p, "the failed program comes back to explain itself");
		cr_assert_str_eq(loom_program_error(p), loom_last_error());
		cr_assert(strstr(loom_last_error(), "CUDA") || strstr(loom_last_error(), "cuda"),
			  "the message names CUDA: %s", loom_last_error());
	} else {
		cr_assert_eq(st, LOOM_OK, "%s", loom_last_error());
		loom_program_info_get(p, &info);
		cr_assert(strncmp(info.backend, "cuda", 4) == 0, "%s", info.backend);
	}
	loom_program_free(p);
	loom_graph_free(g);
}

/* ------------------------------------------------------------ NCCL at world 1 */

/* A TCP port free now on 127.0.0.1 (the rendezvous listens on it next). */
static int free_port(void)
{
	struct sockaddr_in a;
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0), port;
	cr_assert_geq(fd, 0);
	memset(&a, 0, sizeof(a));
	a.sin_family = AF_INET;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	port = ntohs(a.sin_port);
	close(fd);
	return port;
}

/* A group of one through env:// (RANK 0, WORLD_SIZE 1 on a free port,
 * unless the environment names one) with a device communicator. */
static loom_pg *env_world1_group(void)
{
	char port[16];
	if (!getenv("RANK")) {
		snprintf(port, sizeof(port), "%d", free_port());
		setenv("RANK", "0", 1);
		setenv("WORLD_SIZE", "1", 1);
		setenv("MASTER_ADDR", "127.0.0.1", 1);
		setenv("MASTER_PORT", port, 1);
	}
	loom_comm_options o = { .bootstrap = LOOM_COMM_BOOT_ENV, .timeout_s = 60, .want_device = 1 };
	loom_pg *pg = NULL;
	cr_assert_eq(loom_pg_init(&o, &pg), LOOM_OK, "%s", loom_pg_error(pg));
	cr_assert_eq(loom_pg_get_info(pg)->world, 1);
	return pg;
}

/* Unused where the toolkit is hidden (the NCCL cases need it). */
static __attribute__((unused)) double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

/*
 * torchrun's env:// at world 1 (the variables the GPU bundle sets, else
 * set here): rank 0 makes the NCCL id, meets itself at the rendezvous and
 * opens NCCL on its device; then every device collective on device memory
 * (a sum over one rank is the identity, so the values must come back as
 * they went), and a teardown that finalizes and destroys within its
 * deadline instead of hanging.
 */
Test(cuda_nccl, env_world1_collectives)
{
	NEED_GPU();
#if LOOM_HAVE_CUDA
	loom_pg *pg = env_world1_group();
	cr_assert_geq(loom_pg_get_info(pg)->device, 0);
	loom_comm *c = loom_pg_comm(pg, LOOM_COMM_DEVICE);
	cr_assert_not_null(c, "%s", loom_pg_error(pg));
	cr_assert_str_eq(c->i->name, "nccl");

	enum { N = 4096 };
	static float h[N], back[N];
	float *d = NULL;
	for (int i = 0; i < N; i++)
		h[i] = (float)i - 1000.5f;
	cr_assert_eq(cudaMalloc((void **)&d, sizeof(h)), cudaSuccess);
	cr_assert_eq(cudaMemcpy(d, h, sizeof(h), cudaMemcpyHostToDevice), cudaSuccess);

	cr_assert_eq(loom_comm_broadcast(c, d, sizeof(h), 0), LOOM_OK, "%s", loom_pg_error(pg));
	loom_comm_work *w = NULL;
	cr_assert_eq(loom_comm_allreduce_start(c, d, N, LOOM_F32, NULL, &w), LOOM_OK, "%s",
		     loom_pg_error(pg));
	cr_assert_eq(loom_comm_wait(c, w), LOOM_OK, "%s", loom_pg_error(pg));
	cr_assert_eq(loom_comm_allreduce_ordered(c, d, N, LOOM_F32, NULL), LOOM_OK, "%s",
		     loom_pg_error(pg));
	cr_assert_eq(loom_comm_barrier(c), LOOM_OK, "%s", loom_pg_error(pg));
	cr_assert_eq(cudaMemcpy(back, d, sizeof(back), cudaMemcpyDeviceToHost), cudaSuccess);
	for (int i = 0; i < N; i++)
		cr_assert_eq(back[i], h[i], "element %d: %g after the collectives, was %g", i,
			     back[i], h[i]);

	char send[13] = "rank 0 says", recv[13] = "";
	cr_assert_eq(loom_comm_allgather(c, send, sizeof(send), recv), LOOM_OK, "%s",
		     loom_pg_error(pg));
	cr_assert_str_eq(recv, send);

	cr_assert_eq(cudaFree(d), cudaSuccess);
	double t0 = now_s();
	loom_pg_free(pg);
	cr_assert_lt(now_s() - t0, 35.0, "the teardown took %.1f s", now_s() - t0);
#endif
}

/* ------------------------------------------------------------ ConvNet steps */

typedef struct convnet {
	loom_value w[6]; /* conv w, conv b, bn gamma, bn beta, fc w, fc b */
	loom_value rm, rv, loss;
} convnet;

static loom_graph *convnet_graph(convnet *n)
{
	loom_graph *g;
	int64_t xd[4] = { 8, 3, 12, 12 }, yd[1] = { 8 }, c = 8;
	int64_t cw[4] = { 8, 3, 3, 3 }, fw[2] = { 10, 8 * 6 * 6 }, fb[1] = { 10 };
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_graph_set_seed(g, 7);
	loom_value x = loom_input(g, "x", LOOM_F32, 4, xd);
	loom_value y = loom_input(g, "y", LOOM_I32, 1, yd);
	n->w[0] = loom_param(g, "conv.weight", LOOM_F32, 4, cw, LOOM_INIT_KAIMING_UNIFORM, 27);
	n->w[1] = loom_param(g, "conv.bias", LOOM_F32, 1, &c, LOOM_INIT_UNIFORM_FAN_IN, 27);
	n->w[2] = loom_param(g, "bn.weight", LOOM_F32, 1, &c, LOOM_INIT_ONES, 1);
	n->w[3] = loom_param(g, "bn.bias", LOOM_F32, 1, &c, LOOM_INIT_ZEROS, 1);
	n->rm = loom_buffer(g, "bn.running_mean", LOOM_F32, 1, &c, LOOM_INIT_ZEROS);
	n->rv = loom_buffer(g, "bn.running_var", LOOM_F32, 1, &c, LOOM_INIT_ONES);
	n->w[4] = loom_param(g, "fc.weight", LOOM_F32, 2, fw, LOOM_INIT_KAIMING_UNIFORM, fw[1]);
	n->w[5] = loom_param(g, "fc.bias", LOOM_F32, 1, fb, LOOM_INIT_UNIFORM_FAN_IN, fw[1]);
	loom_value h = loom_conv2d(g, x, n->w[0], n->w[1], 1, 1);
	h = loom_relu(g, loom_batchnorm2d(g, h, n->w[2], n->w[3], n->rm, n->rv, 0.1, 1e-5));
	h = loom_flatten(g, loom_maxpool2d(g, h, 2, 2, 0));
	n->loss = loom_softmax_cross_entropy(g, loom_linear(g, h, n->w[4], n->w[5]), y);
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));
	return g;
}

/* Clipping by global norm and decay on matrices only for convnet_steps
 * (0: off), set on both programs after compiling. */
static double steps_clip;
static int steps_matrices_only;

/* 3 steps on both backends, each of `micro` micro-steps (micro - 1
 * LOOM_RUN_ACCUMULATE, then TRAIN) on fresh batches. */
static void convnet_steps(loom_opt_level level, loom_dtype half, loom_optim_kind kind,
			  double tol, int micro)
{
	convnet n;
	loom_graph *g = convnet_graph(&n);
	loom_program *p[2];
	loom_compile_opts o;
	float x[8 * 3 * 12 * 12];
	int32_t y[8];
	const char *name = level == LOOM_O0 ? "O0" : level == LOOM_O1 ? "O1" : "O2";

	loom_compile_opts_default(&o);
	o.no_tf32 = 1; /* exact fp32: compared with the CPU */
	o.amp.level = level;
	/* A scale of 1: the one-op heads' gradients would overflow fp16 at
	 * the dynamic scaler's 2^16. */
	if (level != LOOM_O0 && half == LOOM_F16) /* bf16 takes no loss scale */
		o.amp.static_scale = 1.0;
	o.amp.half = half;
	o.optim.kind = kind;
	o.optim.lr = kind == LOOM_OPTIM_SGD ? 0.05 : 1e-3;
	o.optim.momentum = kind == LOOM_OPTIM_SGD ? 0.9 : 0;
	/* Under the decay mask, a decay large enough to tell the groups apart. */
	o.optim.weight_decay = steps_matrices_only ? 0.1 : 1e-4;
	o.optim.clip_grad = steps_clip;
	o.optim.decay_matrices_only = steps_matrices_only;
	for (int d = 0; d < 2; d++) {
		o.device = d ? LOOM_DEVICE_CUDA : LOOM_DEVICE_CPU;
		cr_assert_eq(loom_compile(g, n.loss, &o, &p[d]), LOOM_OK, "%s: %s", name,
			     loom_last_error());
	}
	/* The relu before the pool is fused on both backends (one pool and
	 * its backward). */
	expect_same_plan(name, p[0], p[1]);
	cr_expect_eq(fused_pools(p[1]), 2, "%s: cuda plan has %d fused pools", name,
		     fused_pools(p[1]));
	rng_state = 42;
	for (int step = 0; step < 3 * micro; step++) {
		loom_run_mode mode = step % micro == micro - 1 ? LOOM_RUN_TRAIN : LOOM_RUN_ACCUMULATE;
		for (size_t i = 0; i < sizeof(x) / sizeof(x[0]); i++)
			x[i] = (float)urand();
		for (int i = 0; i < 8; i++)
			y[i] = (int32_t)((urand() + 1) * 5) % 10;
		double l[2];
		for (int d = 0; d < 2; d++) {
			cr_assert_eq(loom_set_input(p[d], "x", x, LOOM_F32, sizeof(x) / sizeof(x[0])),
				     LOOM_OK);
			cr_assert_eq(loom_set_input(p[d], "y", y, LOOM_I32, 8), LOOM_OK);
			cr_assert_eq(loom_run(p[d], mode), LOOM_OK, "%s step %d on %s: %s",
				     name, step, d ? "cuda" : "cpu", loom_program_error(p[d]));
			l[d] = loom_loss(p[d]);
		}
		cr_expect(fabs(l[1] - l[0]) <= tol * fabs(l[0]) + 1e-6, "%s step %d: loss cuda %g cpu %g",
			  name, step, l[1], l[0]);
		cr_expect_eq(loom_step_count(p[1]), loom_step_count(p[0]), "%s step %d", name, step);
	}
	loom_program_info ic, ig;
	loom_program_info_get(p[0], &ic);
	loom_program_info_get(p[1], &ig);
	cr_expect_eq(ig.loss_scale, ic.loss_scale, "%s: loss scale cuda %g cpu %g", name,
		     ig.loss_scale, ic.loss_scale);
	cr_expect_eq(ig.skipped_steps, ic.skipped_steps);
	if (steps_clip > 0) {
		/* The norm is the unclipped one; clipping acted (norm above). */
		cr_expect(fabs(ig.grad_norm - ic.grad_norm) <= tol * ic.grad_norm,
			  "%s: grad norm cuda %.9g cpu %.9g", name, ig.grad_norm, ic.grad_norm);
		cr_expect_gt(ic.grad_norm, steps_clip, "%s: the clip never acted", name);
	}
	for (int i = 0; i < 8; i++) {
		loom_value v = i < 6 ? n.w[i] : i == 6 ? n.rm : n.rv;
		size_t cnt = numel_of(g, v);
		double *a = malloc(cnt * sizeof(double)), *b = malloc(cnt * sizeof(double));
		cr_assert(a && b);
		read_value(p[1], v, 0, a, cnt);
		read_value(p[0], v, 0, b, cnt);
		/* The conv bias feeds a training-mode batch norm, which removes any
		 * per-channel shift: its gradient is zero in exact arithmetic, and
		 * each backend's is rounding noise. SGD moves it by lr times that
		 * noise; AdamW normalises the noise to a step of about lr whatever
		 * its size (|m^/sqrt(v^)| <= 1.01 for 3 steps), in a direction
		 * neither backend can be held to. For AdamW the bias (1) and the
		 * running mean it feeds (6) are held to that bound instead: at
		 * most 3 steps of lr each way (6.5 lr); the others to the NMSE. */
		if (kind == LOOM_OPTIM_ADAMW && (i == 1 || i == 6)) {
			double worst = 0;
			for (size_t j = 0; j < cnt; j++)
				worst = fmax(worst, fabs(a[j] - b[j]));
			cr_expect(worst <= 6.5 * o.optim.lr,
				  "%s value %d after 3 steps: |cuda - cpu| %g > 6.5 lr", name, i,
				  worst);
		} else {
			double e = nmse(a, b, cnt);
			cr_expect(e <= tol * tol, "%s value %d after 3 steps: NMSE %g", name, i, e);
		}
		free(a);
		free(b);
	}
	loom_program_free(p[1]);
	loom_program_free(p[0]);
	loom_graph_free(g);
}

Test(cuda_convnet, o0_sgd)
{
	NEED_GPU();
	convnet_steps(LOOM_O0, LOOM_F16, LOOM_OPTIM_SGD, 1e-4, 1);
}

/* Gradient accumulation: 2 micro-steps per step, the sums folded in
 * before the update (the CUDA path compiled but never run where written). */
Test(cuda_convnet, o0_sgd_accumulate)
{
	NEED_GPU();
	convnet_steps(LOOM_O0, LOOM_F16, LOOM_OPTIM_SGD, 1e-4, 2);
}

Test(cuda_convnet, o2_fp16_accumulate)
{
	NEED_GPU();
	convnet_steps(LOOM_O2, LOOM_F16, LOOM_OPTIM_SGD, 3e-2, 2);
}

Test(cuda_convnet, o0_adamw)
{
	NEED_GPU();
	convnet_steps(LOOM_O0, LOOM_F16, LOOM_OPTIM_ADAMW, 1e-4, 1);
}

Test(cuda_convnet, o1_fp16)
{
	NEED_GPU();
	convnet_steps(LOOM_O1, LOOM_F16, LOOM_OPTIM_SGD, 1e-2, 1);
}

Test(cuda_convnet, o2_fp16)
{
	NEED_GPU();
	convnet_steps(LOOM_O2, LOOM_F16, LOOM_OPTIM_SGD, 1e-2, 1);
}

Test(cuda_convnet, o2_bf16_adamw)
{
	NEED_GPU();
	convnet_steps(LOOM_O2, LOOM_BF16, LOOM_OPTIM_ADAMW, 3e-2, 1);
}

/* The device optimizer's clipping (sum of squares per chunk, one block for
 * the norm) and decay mask (conv and fc weights decay, biases and the batch
 * norm's gain do not) against engine/cpu/optim.c. */
static void clip_and_mask(loom_opt_level level, loom_dtype half, loom_optim_kind kind,
			  double tol)
{
	steps_clip = 0.05;
	steps_matrices_only = 1;
	convnet_steps(level, half, kind, tol, 1);
	steps_clip = 0;
	steps_matrices_only = 0;
}

Test(cuda_convnet, o0_adamw_clip_decay_matrices_only)
{
	NEED_GPU();
	clip_and_mask(LOOM_O0, LOOM_F16, LOOM_OPTIM_ADAMW, 1e-4);
}

Test(cuda_convnet, o0_sgd_clip_decay_matrices_only)
{
	NEED_GPU();
	clip_and_mask(LOOM_O0, LOOM_F16, LOOM_OPTIM_SGD, 1e-4);
}

Test(cuda_convnet, o2_bf16_adamw_clip_decay_matrices_only)
{
	NEED_GPU();
	clip_and_mask(LOOM_O2, LOOM_BF16, LOOM_OPTIM_ADAMW, 3e-2);
}

/* AdamW in fp32 (LOOM_CUDA_ADAMW=f32, optim.cu) against the CPU's update
 * in double, through convnet_steps with the tolerances of the double
 * kernel's rows above: O0 (fp32 gradients and weights), O2 bf16 (bf16
 * gradients into fp32 masters), and with clipping and the decay mask. */
Test(cuda_convnet, adamw_f32)
{
	NEED_GPU();
	setenv("LOOM_CUDA_ADAMW", "f32", 1);
	convnet_steps(LOOM_O0, LOOM_F16, LOOM_OPTIM_ADAMW, 1e-4, 1);
	convnet_steps(LOOM_O2, LOOM_BF16, LOOM_OPTIM_ADAMW, 3e-2, 1);
	clip_and_mask(LOOM_O0, LOOM_F16, LOOM_OPTIM_ADAMW, 1e-4);
	clip_and_mask(LOOM_O2, LOOM_BF16, LOOM_OPTIM_ADAMW, 3e-2);
	unsetenv("LOOM_CUDA_ADAMW");
}

/*
 * An MLP whose weights have sizes off the 8-element vectors and across
 * optimizer chunks (4773 = a chunk of 4096 and a tail of 677, 129, 1290,
 * 10): the vector loop, the scalar tail and the chunk loop of the fp32
 * kernel.
 */
static loom_graph *adamw_mlp(loom_value *w, loom_value *loss)
{
	loom_graph *g;
	int64_t xd[2] = { 32, 37 }, yd[1] = { 32 }, w1[2] = { 129, 37 }, b1[1] = { 129 };
	int64_t w2[2] = { 10, 129 }, b2[1] = { 10 };
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_graph_set_seed(g, 11);
	loom_value x = loom_input(g, "x", LOOM_F32, 2, xd);
	loom_value y = loom_input(g, "y", LOOM_I32, 1, yd);
	w[0] = loom_param(g, "fc1.weight", LOOM_F32, 2, w1, LOOM_INIT_KAIMING_UNIFORM, 37);
	w[1] = loom_param(g, "fc1.bias", LOOM_F32, 1, b1, LOOM_INIT_UNIFORM_FAN_IN, 37);
	w[2] = loom_param(g, "fc2.weight", LOOM_F32, 2, w2, LOOM_INIT_KAIMING_UNIFORM, 129);
	w[3] = loom_param(g, "fc2.bias", LOOM_F32, 1, b2, LOOM_INIT_UNIFORM_FAN_IN, 129);
	loom_value h = loom_relu(g, loom_linear(g, x, w[0], w[1]));
	*loss = loom_softmax_cross_entropy(g, loom_linear(g, h, w[2], w[3]), y);
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));
	return g;
}

/* Two AdamW steps of adamw_mlp on CUDA with LOOM_CUDA_ADAMW=val (NULL:
 * unset), the weights after them into out[i] (malloc'd). */
static void adamw_mlp_run(const char *val, loom_opt_level level, double lr, double *out[4],
			  size_t cnt[4])
{
	loom_value w[4], loss;
	loom_graph *g = adamw_mlp(w, &loss);
	loom_compile_opts o;
	loom_program *p;
	float x[32 * 37];
	int32_t y[32];
	if (val)
		setenv("LOOM_CUDA_ADAMW", val, 1);
	else
		unsetenv("LOOM_CUDA_ADAMW");
	loom_compile_opts_default(&o);
	o.no_tf32 = 1;
	o.device = LOOM_DEVICE_CUDA;
	o.amp.level = level;
	o.amp.half = LOOM_BF16;
	o.optim.kind = LOOM_OPTIM_ADAMW;
	o.optim.lr = lr;
	o.optim.weight_decay = 0.1;
	cr_assert_eq(loom_compile(g, loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	rng_state = 5;
	for (int step = 0; step < 2; step++) {
		for (size_t i = 0; i < sizeof(x) / sizeof(x[0]); i++)
			x[i] = (float)urand();
		for (int i = 0; i < 32; i++)
			y[i] = (int32_t)((urand() + 1) * 5) % 10;
		cr_assert_eq(loom_set_input(p, "x", x, LOOM_F32, 32 * 37), LOOM_OK);
		cr_assert_eq(loom_set_input(p, "y", y, LOOM_I32, 32), LOOM_OK);
		cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "step %d: %s", step,
			     loom_program_error(p));
	}
	for (int i = 0; i < 4; i++) {
		cnt[i] = numel_of(g, w[i]);
		out[i] = malloc(cnt[i] * sizeof(double));
		cr_assert(out[i]);
		read_value(p, w[i], 0, out[i], cnt[i]);
	}
	loom_program_free(p);
	loom_graph_free(g);
	unsetenv("LOOM_CUDA_ADAMW");
}

/*
 * The fp32 kernel against the double one on the same device, plan and
 * inputs, so that only the update's arithmetic differs. O0's bound, per
 * weight after two steps: |f32 - f64| <= 2^-21 |w| + 1e-5 lr, i.e. a few
 * fp32 roundings of w (the decay and the step, each stored as fp32 by
 * both kernels) plus the fp32 error of the step itself (|step| <= ~lr,
 * its few operations each within 2^-24). Under O2 the weights read are
 * the bf16 copies, and a master one fp32 bit away may round to the next
 * bf16 value, which also moves the second step's gradients: there each
 * weight is held to one bf16 ulp (2^-7 |w|) plus 1e-2 lr.
 */
static void adamw_f32_vs_double(loom_opt_level level)
{
	const double lr = 1e-3;
	const int o2 = level == LOOM_O2;
	double *a[4], *b[4];
	size_t na[4], nb[4];
	adamw_mlp_run(NULL, level, lr, b, nb);
	adamw_mlp_run("f32", level, lr, a, na);
	for (int i = 0; i < 4; i++) {
		size_t off = 0, first = 0;
		cr_assert_eq(na[i], nb[i]);
		for (size_t j = 0; j < na[i]; j++) {
			double d = fabs(a[i][j] - b[i][j]), w = fabs(b[i][j]);
			double tol = o2 ? ldexp(w, -7) + 1e-2 * lr : ldexp(w, -21) + 1e-5 * lr;
			if (!(d <= tol) && !off++)
				first = j;
		}
		cr_expect_eq(off, 0, "%s weight %d: %zu of %zu off the bound, first [%zu]: f32 "
			     "kernel %.9g, double %.9g", o2 ? "O2" : "O0", i, off, na[i], first,
			     a[i][first], b[i][first]);
		free(a[i]);
		free(b[i]);
	}
}

Test(cuda_convnet, adamw_f32_against_double)
{
	NEED_GPU();
	adamw_f32_vs_double(LOOM_O0);
	adamw_f32_vs_double(LOOM_O2);
}

/* ------------------------------------------------------------ ResNet steps */

/* ------------------------------------------------------------ NHWC */

/*
 * The planner's NHWC on CUDA (engine/cuda/formats.c, LOOM_CUDA_NHWC): each
 * case's CUDA program compiled with formats on, against its CPU twin in
 * NCHW. The op's own output is the user's (NCHW), so every builder chains
 * ops: the values between them are the NHWC ones.
 */

/* conv -> conv: the first's output NHWC; the second reads it NHWC and
 * writes NCHW (the output), so its layout is NCHW with x reordered in its
 * workspace; backward: every mix of layouts (dx of the second NHWC, dy of
 * the first NCHW, the filters KRSC <-> KCRS). */
static loom_value b_nhwc_convs(loom_graph *g, tcase *t)
{
	loom_value x = param(g, t, "x", 4, 2, 8, 9, 9);
	loom_value w1 = param(g, t, "w1", 4, 16, 8, 3, 3);
	loom_value w2 = param(g, t, "w2", 4, 8, 16, 3, 3);
	t->want_nhwc = 2; /* h and its data gradient (each conv reorders a mixed operand in its workspace) */
	loom_value h = loom_conv2d(g, x, w1, LOOM_NONE, 1, 1);
	return loom_conv2d(g, h, w2, LOOM_NONE, 2, 1);
}

/* conv -> relu + 3x3/2 pad-1 max pool (fused) -> conv: the pool and its
 * backward NHWC (pool.cu's NHWC kernels, saved argmax). */
static loom_value b_nhwc_pool(loom_graph *g, tcase *t)
{
	loom_value x = param(g, t, "x", 4, 2, 8, 9, 9);
	loom_value w1 = param(g, t, "w1", 4, 16, 8, 3, 3);
	loom_value w2 = param(g, t, "w2", 4, 8, 16, 1, 1);
	t->want_nhwc = 4;
	t->fused_pools = 2;
	loom_value h = loom_conv2d(g, x, w1, LOOM_NONE, 1, 1);
	h = loom_maxpool2d(g, loom_relu(g, h), 3, 2, 1);
	return loom_conv2d(g, h, w2, LOOM_NONE, 1, 0);
}

/* A residual block at O2 or O1 (the graph f32, run in fp16): conv -> bn +
 * relu -> conv -> bn -> add + relu -> 1x1 conv. Batch norm on cuDNN in
 * NHWC (persistent mode, the Ex forward with its relu), relu and add
 * NHWC, their backward too. */
static loom_value nhwc_block(loom_graph *g, tcase *t, loom_opt_level level)
{
	t->dt = LOOM_F32;
	t->level = level;
	int64_t c = 16;
	loom_value x = param(g, t, "x", 4, 2, 8, 8, 8);
	loom_value w1 = param(g, t, "w1", 4, c, 8, 3, 3);
	loom_value w2 = param(g, t, "w2", 4, c, c, 3, 3);
	loom_value w3 = param(g, t, "w3", 4, 8, c, 1, 1);
	loom_value bn[2];
	loom_value h = loom_conv2d(g, x, w1, LOOM_NONE, 1, 1);
	for (int i = 0; i < 2; i++) {
		char nm[4][16];
		snprintf(nm[0], 16, "g%d", i);
		snprintf(nm[1], 16, "b%d", i);
		snprintf(nm[2], 16, "rm%d", i);
		snprintf(nm[3], 16, "rv%d", i);
		loom_value ga = param(g, t, nm[0], 1, c, 0, 0, 0);
		loom_value be = param(g, t, nm[1], 1, c, 0, 0, 0);
		loom_value rm = loom_buffer(g, nm[2], LOOM_F32, 1, &c, LOOM_INIT_ZEROS);
		loom_value rv = loom_buffer(g, nm[3], LOOM_F32, 1, &c, LOOM_INIT_ONES);
		t->buf[t->n_buf++] = rm;
		t->buf[t->n_buf++] = rv;
		loom_value in = i == 0 ? h : loom_conv2d(g, bn[0], w2, LOOM_NONE, 1, 1);
		bn[i] = loom_batchnorm2d(g, in, ga, be, rm, rv, 0.1, 1e-5);
		if (i == 0)
			bn[0] = loom_relu(g, bn[0]);
	}
	t->fused_relus = 2;   /* the first batch norm's, the add's */
	t->want_bn_cudnn = 4; /* two forwards, two backwards */
	t->want_nhwc = 8;
	loom_value r = loom_relu(g, loom_add(g, bn[1], bn[0]));
	return loom_conv2d(g, r, w3, LOOM_NONE, 1, 0);
}

static loom_value b_nhwc_block_o2(loom_graph *g, tcase *t)
{
	return nhwc_block(g, t, LOOM_O2);
}

static loom_value b_nhwc_block_o1(loom_graph *g, tcase *t)
{
	return nhwc_block(g, t, LOOM_O1);
}

/* O1 under amp.bn_half: the batch norms take the convolutions' half
 * output, their parameters fp32; cuDNN runs them (bf16: under
 * LOOM_CUDA_BN_BF16_CUDNN, which the caller sets). */
static loom_value b_nhwc_block_o1_bn_half(loom_graph *g, tcase *t)
{
	t->bn_half = 1;
	return nhwc_block(g, t, LOOM_O1);
}

/* --dump-graph of build's CUDA program compiled in NHWC (cuda_nhwc). */
static char *nhwc_dump(build_fn build)
{
	tcase t;
	loom_graph *g;
	char *buf = NULL;
	memset(&t, 0, sizeof(t));
	t.dt = LOOM_F16;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_value y = build(g, &t);
	loom_value loss = head(g, &t, y);
	loom_mark_output(g, y);
	loom_program *p = compile_at(g, loss, LOOM_DEVICE_CUDA, t.level);
	buf = print_text(loom_program_dump, p);
	loom_program_free(p);
	loom_graph_free(g);
	return buf;
}

/* Every NHWC case in f16 and bf16 (the convolutions; the blocks run at
 * their AMP level in fp16), training and, for the blocks, eval; the blocks
 * with batch norm + add + relu as one cuDNN call (LOOM_CUDA_BN_ADD, the
 * default: --dump-graph names it on the add) and as three nodes (=0). */
Test(cuda_ops, nhwc_against_cpu)
{
	NEED_GPU();
	const loom_dtype dts[2] = { LOOM_F16, LOOM_BF16 };
	cuda_nhwc = "half";
	for (int i = 0; i < 2; i++)
		for (uint64_t seed = 1; seed <= 2; seed++)
			run_case("nhwc conv -> conv", b_nhwc_convs, dts[i], LOOM_RUN_GRAD, seed);
	for (int i = 0; i < 2; i++)
		run_case("nhwc relu + max pool", b_nhwc_pool, dts[i], LOOM_RUN_GRAD, 5 + i);
	for (int fused = 1; fused >= 0; fused--) {
		setenv("LOOM_CUDA_BN_ADD", fused ? "1" : "0", 1);
		char *text = nhwc_dump(b_nhwc_block_o2);
		cr_expect(!!strstr(text, "BN_ADD_ACTIVATION") == fused,
			  "LOOM_CUDA_BN_ADD=%d: the dump %s BN_ADD_ACTIVATION:\n%s", fused,
			  fused ? "lacks" : "has", text);
		free(text);
		for (uint64_t seed = 1; seed <= 2; seed++) {
			run_case(fused ? "nhwc block O2, bn+add+relu fused" : "nhwc block O2",
				 b_nhwc_block_o2, LOOM_F32, LOOM_RUN_GRAD, seed);
			run_case(fused ? "nhwc block O1, bn+add+relu fused" : "nhwc block O1",
				 b_nhwc_block_o1, LOOM_F32, LOOM_RUN_GRAD, seed);
		}
		run_case("nhwc block O2 eval", b_nhwc_block_o2, LOOM_F32, LOOM_RUN_EVAL, 3);
	}
	unsetenv("LOOM_CUDA_BN_ADD");
	/* fp32 under "all" (exact fp32 math: the CPU's bound) */
	cuda_nhwc = "all";
	run_case("nhwc conv -> conv f32", b_nhwc_convs, LOOM_F32, LOOM_RUN_GRAD, 4);
	cuda_nhwc = NULL;
}

/*
 * NHWC batch norm's backward through cuDNN's Ex call with the forward's
 * reserve (LOOM_CUDA_BN_BWD_EX) and the relu's / add + relu's backward
 * inside it (LOOM_CUDA_BN_BWD_FUSE), on the residual block at O2 and O1
 * against the CPU: mode 0 the legacy backward, 1 the Ex call alone, 2 the
 * Ex call with the fusions; the dump names the path.
 */
static int bn_bwd_mode;

static loom_value bn_bwd_notes(tcase *t, loom_value y)
{
	if (bn_bwd_mode == 0) {
		t->no_note = "backward Ex";
	} else if (bn_bwd_mode == 1) {
		t->note[0] = "backward Ex with the forward's reserve";
		t->note_op[0] = LOOM_OP_BN_BWD_DATA;
		t->no_note = "backward Ex BN_";
	} else {
		t->note[0] = "backward Ex BN_";
		t->note_op[0] = LOOM_OP_BN_BWD_DATA;
		t->note[1] = "cudnn's Ex batch-norm backward";
		t->note_op[1] = LOOM_OP_RELU_BWD;
	}
	return y;
}

static loom_value b_nhwc_block_ex_o2(loom_graph *g, tcase *t)
{
	return bn_bwd_notes(t, nhwc_block(g, t, LOOM_O2));
}

static loom_value b_nhwc_block_ex_o1(loom_graph *g, tcase *t)
{
	return bn_bwd_notes(t, nhwc_block(g, t, LOOM_O1));
}

Test(cuda_ops, nhwc_bn_backward_ex)
{
	NEED_GPU();
	static const char *const ex[3] = { "0", "1", "1" }, *const fuse[3] = { "0", "0", "1" };
	cuda_nhwc = "half";
	for (int m = 0; m < 3; m++) {
		bn_bwd_mode = m;
		setenv("LOOM_CUDA_BN_BWD_EX", ex[m], 1);
		setenv("LOOM_CUDA_BN_BWD_FUSE", fuse[m], 1);
		for (int add = 1; add >= 0; add--) {
			setenv("LOOM_CUDA_BN_ADD", add ? "1" : "0", 1);
			for (uint64_t seed = 1; seed <= 2; seed++) {
				run_case("nhwc block O2, bn backward ex", b_nhwc_block_ex_o2, LOOM_F32,
					 LOOM_RUN_GRAD, seed + 10 * m);
				run_case("nhwc block O1, bn backward ex", b_nhwc_block_ex_o1, LOOM_F32,
					 LOOM_RUN_GRAD, seed + 10 * m);
			}
		}
		run_case("nhwc block O2 eval, bn backward ex", b_nhwc_block_ex_o2, LOOM_F32,
			 LOOM_RUN_EVAL, 3);
	}
	bn_bwd_mode = 0;
	unsetenv("LOOM_CUDA_BN_ADD");
	unsetenv("LOOM_CUDA_BN_BWD_EX");
	unsetenv("LOOM_CUDA_BN_BWD_FUSE");
	cuda_nhwc = NULL;
}

/* The residual block with each filter that two NHWC convolutions read
 * (the second's forward and data gradient) reordered KRSC once a step into
 * the saved region (LOOM_CUDA_CONV_KRSC), or at each call (=0). */
static int krsc_on;

static loom_value b_nhwc_block_krsc(loom_graph *g, tcase *t)
{
	loom_value y = nhwc_block(g, t, LOOM_O2);
	if (krsc_on) {
		t->note[0] = "filter KRSC kept";
		t->note_op[0] = LOOM_OP_CONV2D_BWD_DATA;
	} else {
		t->no_note = "filter KRSC kept";
	}
	return y;
}

Test(cuda_ops, nhwc_filters_krsc)
{
	NEED_GPU();
	cuda_nhwc = "half";
	for (krsc_on = 1; krsc_on >= 0; krsc_on--) {
		setenv("LOOM_CUDA_CONV_KRSC", krsc_on ? "1" : "0", 1);
		for (uint64_t seed = 1; seed <= 2; seed++)
			run_case(krsc_on ? "nhwc block O2, filters KRSC kept" : "nhwc block O2, KRSC per call",
				 b_nhwc_block_krsc, LOOM_F32, LOOM_RUN_GRAD, seed);
		run_case("nhwc block O2 eval, filters KRSC", b_nhwc_block_krsc, LOOM_F32, LOOM_RUN_EVAL, 3);
	}
	krsc_on = 0;
	unsetenv("LOOM_CUDA_CONV_KRSC");
	cuda_nhwc = NULL;
}

/* conv -> relu -> global average pool (the [N, C] output the user's): the
 * pool reads NHWC and its backward writes NHWC (pool.cu's NHWC kernels,
 * LOOM_CUDA_POOL_NHWC), or (=0) NCHW with a reorder each way. */
static loom_value b_nhwc_gap(loom_graph *g, tcase *t)
{
	loom_value x = param(g, t, "x", 4, 2, 8, 7, 7);
	loom_value w = param(g, t, "w", 4, 16, 8, 3, 3);
	t->want_nhwc = 3;
	return loom_global_avgpool(g, loom_relu(g, loom_conv2d(g, x, w, LOOM_NONE, 1, 1)));
}

Test(cuda_ops, nhwc_global_avgpool)
{
	NEED_GPU();
	const loom_dtype dts[2] = { LOOM_F16, LOOM_BF16 };
	cuda_nhwc = "half";
	for (int on = 1; on >= 0; on--) {
		setenv("LOOM_CUDA_POOL_NHWC", on ? "1" : "0", 1);
		for (int i = 0; i < 2; i++)
			for (uint64_t seed = 1; seed <= 2; seed++)
				run_case(on ? "nhwc global avgpool" : "global avgpool NCHW, reordered",
					 b_nhwc_gap, dts[i], LOOM_RUN_GRAD, seed);
	}
	unsetenv("LOOM_CUDA_POOL_NHWC");
	cuda_nhwc = NULL;
}

/*
 * The reorders round-trip exactly: y = relu(conv1x1(x, I)) with x random
 * and the identity filter, in every dtype (f32 under "all", exact math):
 * x goes NCHW -> NHWC in the convolution's workspace, its filter KCRS ->
 * KRSC, and the NHWC result back to NCHW through a REORDER node before the
 * relu (the user's output); y must equal relu(x) bit for bit.
 */
Test(cuda_ops, nhwc_reorders_round_trip)
{
	NEED_GPU();
	const loom_dtype dts[3] = { LOOM_F32, LOOM_F16, LOOM_BF16 };
	enum { N = 3, C = 16, H = 5, W = 7 };
	for (int d = 0; d < 3; d++) {
		tcase t;
		loom_graph *g;
		memset(&t, 0, sizeof(t));
		t.dt = dts[d];
		cr_assert_eq(loom_graph_new(&g), LOOM_OK);
		loom_value x = param(g, &t, "x", 4, N, C, H, W);
		loom_value w = param(g, &t, "w", 4, C, C, 1, 1);
		loom_value a = loom_conv2d(g, x, w, LOOM_NONE, 1, 0);
		loom_value y = loom_relu(g, loom_relu(g, a));
		loom_mark_output(g, y);
		loom_value loss = loom_sum(g, y);
		cuda_nhwc = "all";
		loom_program *p = compile_at(g, loss, LOOM_DEVICE_CUDA, LOOM_O0);
		cuda_nhwc = NULL;
		int reorders = 0, nhwc = 0;
		for (int v = 0; v < p->plan.g->n; v++) {
			reorders += p->plan.g->nodes[v].op == LOOM_OP_REORDER;
			nhwc += p->plan.g->nodes[v].format == LOOM_FORMAT_NHWC;
		}
		cr_expect(reorders >= 1 && nhwc >= 2, "%s: %d reorders, %d NHWC values",
			  loom_dtype_name(dts[d]), reorders, nhwc);
		static double xv[N * C * H * W], wv[C * C], yv[N * C * H * W], xr[N * C * H * W];
		rng_state = 77 + d;
		for (int i = 0; i < N * C * H * W; i++)
			xv[i] = urand() * 4;
		for (int i = 0; i < C * C; i++)
			wv[i] = i / C == i % C;
		cr_assert_eq(loom_write_f64(p, x, xv, N * C * H * W), LOOM_OK);
		cr_assert_eq(loom_write_f64(p, w, wv, C * C), LOOM_OK);
		cr_assert_eq(loom_run(p, LOOM_RUN_EVAL), LOOM_OK, "%s", loom_program_error(p));
		read_value(p, x, 0, xr, N * C * H * W);
		read_value(p, y, 0, yv, N * C * H * W);
		int bad = 0;
		for (int i = 0; i < N * C * H * W; i++)
			bad += yv[i] != (xr[i] > 0 ? xr[i] : 0.0);
		cr_expect_eq(bad, 0, "%s: %d of %d elements differ (y[0] %g, x[0] %g)",
			     loom_dtype_name(dts[d]), bad, N * C * H * W, yv[0], xr[0]);
		loom_program_free(p);
		loom_graph_free(g);
	}
}

/*
 * ResNet-18 with the ImageNet stem on 65x65 images (small enough for the CPU
 * reference): the stem's relu + 3x3/2 pad-1 max-pool runs fused, the head is
 * a global average pool, and residual adds join the blocks. Two training
 * steps on each backend; losses and the fc weights compared.
 */
static void resnet_steps(loom_opt_level level, double tol)
{
	enum { B = 2, S = 65, CLS = 10 };
	loom_graph *g;
	loom_program *p[2];
	loom_compile_opts o;
	static float x[B * 3 * S * S];
	int32_t y[B];
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_graph_set_seed(g, 11);
	loom_value loss = loom_model_resnet(g, 18, B, S, CLS, NULL);
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));

	loom_compile_opts_default(&o);
	o.no_tf32 = 1; /* exact fp32: compared with the CPU */
	o.amp.level = level;
	o.amp.half = amp_half;
	o.amp.bn_half = level == LOOM_O1 && amp_bn_half;
	/* A scale of 1: the one-op heads' gradients would overflow fp16 at
	 * the dynamic scaler's 2^16. */
	if (level != LOOM_O0 && amp_half == LOOM_F16)
		o.amp.static_scale = 1.0;
	o.optim.kind = LOOM_OPTIM_SGD;
	o.optim.lr = 0.01;
	o.optim.momentum = 0.9;
	for (int d = 0; d < 2; d++) {
		o.device = d ? LOOM_DEVICE_CUDA : LOOM_DEVICE_CPU;
		if (d && cuda_nhwc) {
			setenv("LOOM_FORMATS", "auto", 1);
			setenv("LOOM_CUDA_NHWC", cuda_nhwc, 1);
		}
		loom_status cs = loom_compile(g, loss, &o, &p[d]);
		setenv("LOOM_FORMATS", "nchw", 1);
		unsetenv("LOOM_CUDA_NHWC");
		cr_assert_eq(cs, LOOM_OK, "resnet: %s", loom_last_error());
	}
	if (cuda_nhwc) {
		int nhwc = 0;
		for (int v = 0; v < p[1]->plan.g->n; v++)
			nhwc += p[1]->plan.g->nodes[v].format == LOOM_FORMAT_NHWC;
		cr_expect(nhwc > 100 && p[1]->plan.n_reorders > 0 && p[1]->plan.n_reorders <= 8,
			  "resnet-18 NHWC: %d values NHWC, %d reorders", nhwc, p[1]->plan.n_reorders);
	} else {
		expect_same_plan("resnet-18", p[0], p[1]);
	}
	cr_expect_eq(fused_pools(p[1]), 2, "resnet-18: %d fused pools", fused_pools(p[1]));
	rng_state = 5;
	for (int step = 0; step < 2; step++) {
		for (size_t i = 0; i < sizeof(x) / sizeof(x[0]); i++)
			x[i] = (float)urand();
		for (int i = 0; i < B; i++)
			y[i] = (int32_t)((urand() + 1) * 5) % CLS;
		double l[2];
		for (int d = 0; d < 2; d++) {
			cr_assert_eq(loom_set_input(p[d], "image", x, LOOM_F32, sizeof(x) / sizeof(x[0])),
				     LOOM_OK);
			cr_assert_eq(loom_set_input(p[d], "label", y, LOOM_I32, B), LOOM_OK);
			cr_assert_eq(loom_run(p[d], LOOM_RUN_TRAIN), LOOM_OK, "resnet step %d on %s: %s",
				     step, d ? "cuda" : "cpu", loom_program_error(p[d]));
			l[d] = loom_loss(p[d]);
		}
		cr_expect(fabs(l[1] - l[0]) <= tol * fabs(l[0]) + 1e-6,
			  "resnet step %d: loss cuda %g cpu %g", step, l[1], l[0]);
	}
	cr_expect_eq(loom_step_count(p[1]), loom_step_count(p[0]));
	/* The head, by name in the user's graph: the last layer sees every
	 * earlier difference. */
	int checked = 0;
	for (loom_value v = 0; v < g->n; v++) {
		const loom_node *nd = &g->nodes[v];
		if (nd->op != LOOM_OP_PARAM || strncmp(nd->name, "fc.", 3) != 0)
			continue;
		size_t cnt = numel_of(g, v);
		double *a = malloc(cnt * sizeof(double)), *b = malloc(cnt * sizeof(double));
		cr_assert(a && b);
		read_value(p[1], v, 0, a, cnt);
		read_value(p[0], v, 0, b, cnt);
		double e = nmse(a, b, cnt);
		cr_expect(e <= tol * tol, "resnet %s after 2 steps: NMSE %g", nd->name, e);
		free(a);
		free(b);
		checked++;
	}
	cr_expect_eq(checked, 2, "fc.weight and fc.bias");
	loom_program_free(p[1]);
	loom_program_free(p[0]);
	loom_graph_free(g);
}

Test(cuda_resnet, o0_sgd)
{
	NEED_GPU();
	resnet_steps(LOOM_O0, 1e-3);
}

Test(cuda_resnet, o1_fp16)
{
	NEED_GPU();
	resnet_steps(LOOM_O1, 2e-2);
}

/* The same steps with the CUDA plan in NHWC (LOOM_CUDA_NHWC's default for
 * a mixed-precision plan), against the same NCHW CPU twin and bound. */
Test(cuda_resnet, o1_fp16_nhwc)
{
	NEED_GPU();
	cuda_nhwc = "half";
	resnet_steps(LOOM_O1, 2e-2);
	cuda_nhwc = NULL;
}

/* O1 under amp.bn_half (batch norm in the half type, as autocast runs it):
 * fp16 NCHW and NHWC; bf16 with its batch norms on the own kernels and on
 * cuDNN (LOOM_CUDA_BN_BF16_CUDNN), then NHWC on cuDNN; bf16's bound wider
 * (8 bits against fp16's 11). Compiled, not yet run. */
Test(cuda_resnet, o1_bn_half)
{
	NEED_GPU();
	amp_bn_half = 1;
	resnet_steps(LOOM_O1, 2e-2);
	cuda_nhwc = "half";
	resnet_steps(LOOM_O1, 2e-2);
	cuda_nhwc = NULL;
	amp_half = LOOM_BF16;
	for (int on = 0; on <= 1; on++) {
		setenv("LOOM_CUDA_BN_BF16_CUDNN", on ? "1" : "0", 1);
		resnet_steps(LOOM_O1, 5e-2);
	}
	cuda_nhwc = "half";
	resnet_steps(LOOM_O1, 5e-2);
	cuda_nhwc = NULL;
	unsetenv("LOOM_CUDA_BN_BF16_CUDNN");
	amp_half = LOOM_F16;
	amp_bn_half = 0;
}

/* ------------------------------------------------------------ the case table */

/*
 * One row per one-op case, as ggml's test-backend-ops: the graph builder, the
 * run mode, and whether both CUDA paths (cuDNN / cuBLASLt epilogues and the
 * own kernels) are checked or every dtype once. The op walker below reads
 * the same table: an op that no row's compiled plan contains has no
 * CUDA-vs-CPU case. Cases that need more than a row (special values, O2,
 * whole models) are separate tests above.
 */
typedef struct op_case {
	const char *name;
	build_fn build;
	loom_run_mode mode;
	int both_paths; /* else each dtype */
} op_case;

static const op_case cuda_op_cases[] = {
	{ "conv2d+bias", b_conv_bias, LOOM_RUN_GRAD, 1 },
	{ "conv2d/2", b_conv_stride, LOOM_RUN_GRAD, 1 },
	{ "batchnorm2d", b_bn, LOOM_RUN_GRAD, 1 },
	{ "batchnorm2d eval", b_bn, LOOM_RUN_EVAL, 1 },
	{ "batchnorm2d 8x32x14x14", b_bn_big, LOOM_RUN_GRAD, 1 },
	{ "batchnorm2d+relu", b_bn_relu, LOOM_RUN_GRAD, 1 },
	{ "batchnorm2d+relu eval", b_bn_relu, LOOM_RUN_EVAL, 1 },
	{ "relu", b_relu, LOOM_RUN_GRAD, 0 },
#define UNARY_ROW(NAME, low) { #low, b_unary_##low, LOOM_RUN_GRAD, 0 },
	LOOM_UNARY_OPS(UNARY_ROW)
#undef UNARY_ROW
	{ "maxpool2d 2/2", b_pool2, LOOM_RUN_GRAD, 0 },
	{ "maxpool2d 3/2 pad 1", b_pool3, LOOM_RUN_GRAD, 0 },
	{ "relu+maxpool2d 2/2", b_relu_pool2, LOOM_RUN_GRAD, 0 },
	{ "relu+maxpool2d 3/2 pad 1", b_relu_pool3, LOOM_RUN_GRAD, 0 },
	{ "global_avgpool", b_gap, LOOM_RUN_GRAD, 0 },
	{ "global_avgpool 33x35", b_gap_big, LOOM_RUN_GRAD, 0 },
	{ "linear+bias", b_linear_bias, LOOM_RUN_GRAD, 1 },
	{ "linear+bias+relu", b_linear_bias_relu, LOOM_RUN_GRAD, 1 },
	{ "linear+relu", b_linear_relu, LOOM_RUN_GRAD, 1 },
	{ "linear", b_linear, LOOM_RUN_GRAD, 1 },
	{ "matmul", b_matmul, LOOM_RUN_GRAD, 0 },
	{ "add", b_add, LOOM_RUN_GRAD, 0 },
	{ "add+relu", b_add_relu, LOOM_RUN_GRAD, 0 },
	{ "sum", b_sum, LOOM_RUN_GRAD, 0 },
	{ "mean", b_mean, LOOM_RUN_GRAD, 0 },
	{ "flatten+relu", b_flatten, LOOM_RUN_GRAD, 0 },
	{ "softmax_ce", b_ce, LOOM_RUN_GRAD, 0 },
	{ "embedding", b_embedding, LOOM_RUN_GRAD, 0 },
	{ "gelu tanh", b_gelu_tanh, LOOM_RUN_GRAD, 0 },
	{ "layernorm", b_layernorm, LOOM_RUN_GRAD, 0 },
	{ "layernorm_rows", b_layernorm_rows, LOOM_RUN_GRAD, 0 },
	{ "linear [B, T, C]", b_linear_3d, LOOM_RUN_GRAD, 1 },
	{ "causal self-attention", b_attention, LOOM_RUN_GRAD, 1 },
	{ "causal self-attention 2x64, 4 heads of 32", b_attention_hs32, LOOM_RUN_GRAD, 1 },
	{ "causal self-attention 1x96, 4 heads of 64", b_attention_hs64, LOOM_RUN_GRAD, 1 },
};

#define N_CASES (sizeof(cuda_op_cases) / sizeof(cuda_op_cases[0]))

Test(cuda_ops, table)
{
	NEED_GPU();
	for (size_t i = 0; i < N_CASES; i++) {
		const op_case *c = &cuda_op_cases[i];
		if (c->both_paths)
			both_paths(c->name, c->build, c->mode);
		else
			each_dtype(c->name, c->build, c->mode);
	}
}

/* Ops no one-op row can hold as a node, each with the test that covers it. */
static const char *const covered_elsewhere[LOOM_OP_COUNT] = {
	[LOOM_OP_CAST] = "AMP casts: batchnorm_o2_half_x_fp32_stats and the ConvNet O1/O2 steps",
	[LOOM_OP_ALLREDUCE] = "needs a process group of world > 1: tests/ddp (CPU, MPI); NCCL not yet run",
	[LOOM_OP_FP8_QDQ] = "amp.fp8 only: fp8_qdq_matches_cpu, fp8_gemm_matches_cpu (bit for bit), fp8_gemm_fast_accum_matches_cpu, fp8_amax_producer_matches_cpu, fp8_amax_optim_matches_the_pass",
};

/*
 * Walks every op (runs without a GPU): each has a CPU entry; a CUDA entry in
 * a build with CUDA; and a CUDA-vs-CPU case, i.e. some row of the table whose
 * compiled plan (forward, AMP casts and backward) contains it, or a
 * documented reason in covered_elsewhere. Leaves and views have entries that
 * do nothing (loom_cpu_op_nothing, loom_cuda_op_nothing): they pass the entry
 * checks as such, and count as covered by any case that holds them.
 */
Test(cuda_ops, every_op_has_entries_and_a_case)
{
	int seen[LOOM_OP_COUNT] = { 0 };
	for (size_t i = 0; i < N_CASES; i++) {
		tcase t;
		loom_graph *g;
		loom_program *p;
		loom_compile_opts o;
		memset(&t, 0, sizeof(t));
		t.dt = LOOM_F32;
		t.want_bn_cudnn = -1;
		cr_assert_eq(loom_graph_new(&g), LOOM_OK);
		loom_value loss = head(g, &t, cuda_op_cases[i].build(g, &t));
		loom_compile_opts_default(&o);
		o.no_tf32 = 1; /* exact fp32: compared with the CPU */
		o.device = LOOM_DEVICE_CPU;
		o.amp.level = t.level;
		o.optim.kind = LOOM_OPTIM_NONE;
		cr_assert_eq(loom_compile(g, loss, &o, &p), LOOM_OK, "%s: %s",
			     cuda_op_cases[i].name, loom_last_error());
		for (int v = 0; v < p->plan.g->n; v++)
			seen[p->plan.g->nodes[v].op] = 1;
		loom_program_free(p);
		loom_graph_free(g);
	}
	const loom_backend *cuda = plugin() ? plugin()->backend() : NULL;
	for (int op = 0; op < LOOM_OP_COUNT; op++) {
		const char *name = loom_op_defs[op]->name;
		/* A bucket's all-reduce, and ZeRO-3's gather, are collective
		 * steps of the executor (engine/exec.c), never a backend's node
		 * entry. */
		if (op == LOOM_OP_ALLREDUCE || op == LOOM_OP_ALLGATHER) {
			cr_expect(!loom_cpu_backend.supports_op(NULL, (loom_op)op));
			continue;
		}
		/* A reorder between memory formats: the format pass adds one only
		 * where formats are on (the one-op rows compile NCHW); CUDA's
		 * (NCHW <-> NHWC) are covered by nhwc_reorders_round_trip and
		 * nhwc_against_cpu, the CPU's by tests/engine/cpu:test_formats. */
		if (op == LOOM_OP_REORDER) {
			cr_expect(loom_cpu_backend.supports_op(NULL, (loom_op)op), "reorder: no CPU entry");
			if (cuda) {
				cr_expect(cuda->planning && cuda->planning->node_formats,
					  "CUDA: no node_formats");
				cr_expect(cuda->supports_op(NULL, (loom_op)op), "reorder: no CUDA entry");
			}
			continue;
		}
		/* RMS norm has no CUDA kernel yet (engine/cpu/rmsnorm.c only): a
		 * CUDA program refuses it when compiled; its CPU kernels have
		 * tests/graph:test_gradcheck and tests/engine/cpu:test_gpt_bf16. */
		if (op == LOOM_OP_RMSNORM || op == LOOM_OP_RMSNORM_BWD_DATA ||
		    op == LOOM_OP_RMSNORM_BWD_GAMMA) {
			cr_expect(loom_cpu_backend.supports_op(NULL, (loom_op)op), "%s: no CPU entry", name);
			if (cuda)
				cr_expect(!cuda->supports_op(NULL, (loom_op)op),
					  "%s: CUDA runs it now: give it a case", name);
			continue;
		}
		cr_expect(loom_cpu_backend.supports_op(NULL, (loom_op)op), "%s: no CPU entry", name);
		if (cuda)
			cr_expect(cuda->supports_op(NULL, (loom_op)op),
				  "%s: no CUDA entry (or add a documented refusal here)", name);
		cr_expect(seen[op] || covered_elsewhere[op],
			  "%s: no CUDA-vs-CPU case (add a row to cuda_op_cases)", name);
	}
}

/* ------------------------------------------------------------ the step as one graph */

/* The group graph_convnet compiles over (NULL: none): env:// at world 1
 * with LOOM_DDP_WORLD1_BUCKETS=1 gives the step NCCL bucket all-reduces. */
static loom_pg *graph_pg;

/* ConvNet at batch 16, compiled for CUDA with the step as one graph or
 * every step eager (loom_compile_opts.cuda_graph), on cuDNN's
 * deterministic algorithms only (loom_compile_opts.deterministic): with
 * the heuristic free to answer an atomically accumulating filter-gradient
 * algorithm, two eager programs need not agree bit for bit (an H100 run
 * on 2026-11-27 saw the losses of the graph and eager 3e-6 apart from the
 * second step on, where step 0 ran eagerly in both). */
static loom_program *graph_convnet(loom_opt_level level, loom_dtype half, int graph)
{
	loom_graph *g;
	loom_program *p = NULL;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_value loss = loom_model_convnet(g, 16, NULL);
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CUDA;
	o.optim.momentum = 0.9;
	o.amp.level = level;
	o.amp.half = half;
	o.cuda_graph = graph;
	o.deterministic = 1;
	if (graph_pg) {
		o.pg = graph_pg;
		o.bucket_cap_mb = o.first_bucket_mb = 0.05; /* several buckets */
	}
	loom_status st = loom_compile(g, loss, &o, &p);
	loom_graph_free(g);
	cr_assert_eq(st, LOOM_OK, "compile: %s", loom_last_error());
	return p;
}

/* Step s's batch; step `bad` (-1: none) holds values no fp16 holds, so
 * that its gradients overflow and the update is skipped. */
static void graph_batch_fill(int s, int bad, float *img, int32_t *lab)
{
	for (int i = 0; i < 16 * 784; i++)
		img[i] = s == bad ? 1e30f : (float)(((i * 7 + s * 13) % 97) - 48) / 48.0f;
	for (int i = 0; i < 16; i++)
		lab[i] = (i + s) % 10;
}

static void graph_batch(loom_program *p, int s, int bad)
{
	float img[16 * 784];
	int32_t lab[16];
	graph_batch_fill(s, bad, img, lab);
	cr_assert_eq(loom_set_input(p, "image", img, LOOM_F32, 16 * 784), LOOM_OK);
	cr_assert_eq(loom_set_input(p, "label", lab, LOOM_I32, 16), LOOM_OK);
}

static void graph_vs_eager(const char *what, loom_opt_level level, loom_dtype half, int bad)
{
	loom_program *e = graph_convnet(level, half, 0), *q = graph_convnet(level, half, 1);
	loom_backend_counters c0 = { 0 }, c1 = { 0 };
	for (int s = 0; s < 20; s++) {
		double lr = 0.05 * (1.0 - s / 40.0); /* a schedule: every step's rate differs */
		graph_batch(e, s, bad);
		graph_batch(q, s, bad);
		cr_assert_eq(loom_set_lr(e, lr), LOOM_OK);
		cr_assert_eq(loom_set_lr(q, lr), LOOM_OK);
		if (s == 2)
			q->be->timing->counters(q->be_ctx, &c0);
		cr_assert_eq(loom_run(e, LOOM_RUN_TRAIN), LOOM_OK, "%s eager step %d: %s", what, s,
			     loom_program_error(e));
		cr_assert_eq(loom_run(q, LOOM_RUN_TRAIN), LOOM_OK, "%s graph step %d: %s", what, s,
			     loom_program_error(q));
		/* Bit for bit: the same deterministic kernels in the same order,
		 * launched one by one or replayed. */
		double le = loom_loss(e), lq = loom_loss(q);
		cr_assert(le == lq || (isnan(le) && isnan(lq)),
			  "%s step %d: loss %.17g eager, %.17g from the graph", what, s, le, lq);
	}
	q->be->timing->counters(q->be_ctx, &c1);
	cr_assert_eq(q->exec->graph, 1, "%s: the graph was given up: %s", what, q->exec->graph_note);
	cr_assert_eq(c1.captures, 1, "%s: %ld captures", what, c1.captures);
	cr_assert_eq(c1.replays, 18, "%s: %ld replays", what, c1.replays);
	/* With buckets (graph_pg): every collective of the capture's run and
	 * of the 18 replays handed to the watchdog by its progress mark. */
	if (graph_pg) {
		cr_assert_geq(q->plan.buckets.n, 2, "%s: %d buckets", what, q->plan.buckets.n);
		cr_assert_eq(q->exec->n_marked, q->plan.buckets.n, "%s: %d marks", what,
			     q->exec->n_marked);
		cr_assert_eq(q->exec->mark_handed, (uint64_t)(19 * q->exec->n_marked), "%s: %llu by mark",
			     what, (unsigned long long)q->exec->mark_handed);
	}
	/* The replayed steps (2..19): no host synchronisation inside one. */
	cr_assert_eq(c1.syncs_in_step - c0.syncs_in_step, 0, "%s: %ld host syncs inside replayed steps",
		     what, c1.syncs_in_step - c0.syncs_in_step);
	loom_program_info ie, iq;
	loom_program_info_get(e, &ie);
	loom_program_info_get(q, &iq);
	cr_assert_eq(ie.loss_scale, iq.loss_scale, "%s: scale %g eager, %g graph", what,
		     ie.loss_scale, iq.loss_scale);
	if (bad >= 0)
		cr_assert_lt(iq.loss_scale, 65536.0, "%s: the overflow step was not skipped", what);
	const loom_plan *pl = &e->plan;
	for (int sl = 0; sl < pl->n_params; sl++) {
		loom_value v = pl->params[sl].param;
		size_t n = (size_t)pl->params[sl].numel;
		double *a = malloc(sizeof(double) * n), *b = malloc(sizeof(double) * n);
		cr_assert(a && b);
		read_value(e, v, 0, a, n);
		read_value(q, v, 0, b, n);
		size_t off = 0;
		while (off < n && a[off] == b[off])
			off++;
		cr_assert_eq(off, n, "%s: %s[%zu]: %.17g eager, %.17g from the graph", what,
			     pl->g->nodes[v].name, off, off < n ? a[off] : 0.0, off < n ? b[off] : 0.0);
		free(a);
		free(b);
	}
	loom_program_free(e);
	loom_program_free(q);
}

/* The captured step gives the eager step's losses and parameters bit for
 * bit over 20 steps with an lr schedule, one capture, 18 replays and no
 * host wait in them. */
Test(cuda_ops, cuda_graph_step_equals_eager)
{
	NEED_GPU();
	graph_vs_eager("O0", LOOM_O0, LOOM_F16, -1);
	graph_vs_eager("O1 bf16", LOOM_O1, LOOM_BF16, -1);
	graph_vs_eager("O2 fp16, step 7 overflows", LOOM_O2, LOOM_F16, 7);
}

/* NCCL at world 1 (env://) with its bucket all-reduces captured in the
 * step's graph (LOOM_DDP_WORLD1_BUCKETS=1): the captured step against
 * every step eager, as cuda_graph_step_equals_eager, and each replay's
 * all-reduces waited by the watchdog through their progress marks. The
 * GPU suite's nccl_env_world1 row runs it (cuda_nccl/\*). */
Test(cuda_nccl, env_world1_buckets_graph_equals_eager)
{
	NEED_GPU();
	loom_pg *pg = env_world1_group();
	setenv("LOOM_DDP_WORLD1_BUCKETS", "1", 1);
	graph_pg = pg;
	graph_vs_eager("NCCL world 1, O0", LOOM_O0, LOOM_F16, -1);
	graph_vs_eager("NCCL world 1, O2 fp16, step 7 overflows", LOOM_O2, LOOM_F16, 7);
	graph_pg = NULL;
	unsetenv("LOOM_DDP_WORLD1_BUCKETS");
	uint64_t handed, ended;
	loom_comm_watch_counts(loom_pg_comm(pg, LOOM_COMM_DEVICE), &handed, &ended);
	cr_assert_eq(handed, ended);
	loom_pg_free(pg);
}

/* ------------------------------------------------------------ staged inputs, ZeRO's norm kernels */

/* The inputs staged for the graph (LOOM_CUDA_UPLOAD=graph): each step's
 * batch differs, so a replay whose copy node read a stale slot, or a host
 * that overwrote a slot a queued replay still reads, moves the loss; the
 * captured step still equals eager with no host wait inside a replay. */
Test(cuda_ops, cuda_graph_inputs_staged_as_graph_nodes)
{
	NEED_GPU();
	setenv("LOOM_CUDA_UPLOAD", "graph", 1);
	graph_vs_eager("O0, staged inputs", LOOM_O0, LOOM_F16, -1);
	graph_vs_eager("O2 fp16, staged inputs, step 7 overflows", LOOM_O2, LOOM_F16, 7);
	unsetenv("LOOM_CUDA_UPLOAD");
}

/* The loader's path into the staged slot (loom_input_buffer under
 * LOOM_CUDA_UPLOAD=graph): each step's batch written straight into the
 * pinned slot handed out, the next one's while the step before is still
 * queued (the loss read one step late, LOOM_ASYNC_LOSS=1), trains the
 * captured step bit for bit as loom_set_input does, with no input byte
 * copied by the host and no host wait inside a replayed step. */
Test(cuda_ops, cuda_graph_inputs_written_into_the_pinned_slot)
{
	NEED_GPU();
	setenv("LOOM_CUDA_UPLOAD", "graph", 1);
	setenv("LOOM_ASYNC_LOSS", "1", 1);
	loom_program *e = graph_convnet(LOOM_O0, LOOM_F16, 1), *q = graph_convnet(LOOM_O0, LOOM_F16, 1);
	loom_backend_counters c0 = { 0 }, c1 = { 0 };
	loom_program_info i0, i1, ie;
	void *img, *lab;
	cr_assert_eq(loom_input_buffer(q, "image", LOOM_F32, 16 * 784, &img), LOOM_OK, "%s",
		     loom_program_error(q));
	cr_assert_eq(loom_input_buffer(q, "label", LOOM_I32, 16, &lab), LOOM_OK);
#if LOOM_HAVE_CUDA
	struct cudaPointerAttributes at;
	cr_assert_eq(cudaPointerGetAttributes(&at, img), cudaSuccess);
	cr_assert_eq(at.type, cudaMemoryTypeHost, "the image buffer is not the pinned slot");
#endif
	graph_batch_fill(0, -1, img, lab);
	loom_program_info_get(q, &i0);
	for (int s = 0; s < 20; s++) {
		double lr = 0.05 * (1.0 - s / 40.0);
		graph_batch(e, s, -1);
		cr_assert_eq(loom_input_commit(q, "image"), LOOM_OK, "%s", loom_program_error(q));
		cr_assert_eq(loom_input_commit(q, "label"), LOOM_OK);
		cr_assert_eq(loom_set_lr(e, lr), LOOM_OK);
		cr_assert_eq(loom_set_lr(q, lr), LOOM_OK);
		if (s == 2)
			q->be->timing->counters(q->be_ctx, &c0);
		cr_assert_eq(loom_run(e, LOOM_RUN_TRAIN), LOOM_OK, "step %d: %s", s,
			     loom_program_error(e));
		cr_assert_eq(loom_run(q, LOOM_RUN_TRAIN), LOOM_OK, "step %d: %s", s,
			     loom_program_error(q));
		if (s + 1 < 20) {
			cr_assert_eq(loom_input_buffer(q, "image", LOOM_F32, 16 * 784, &img), LOOM_OK,
				     "%s", loom_program_error(q));
			cr_assert_eq(loom_input_buffer(q, "label", LOOM_I32, 16, &lab), LOOM_OK);
			graph_batch_fill(s + 1, -1, img, lab);
		}
		double le = loom_loss(e), lq = loom_loss(q);
		cr_assert(le == lq || (isnan(le) && isnan(lq)),
			  "step %d: loss %.17g through set_input, %.17g written into the slot", s, le,
			  lq);
	}
	q->be->timing->counters(q->be_ctx, &c1);
	loom_program_info_get(q, &i1);
	loom_program_info_get(e, &ie);
	unsetenv("LOOM_ASYNC_LOSS");
	unsetenv("LOOM_CUDA_UPLOAD");
	cr_assert_eq(q->exec->graph, 1, "the graph was given up: %s", q->exec->graph_note);
	cr_assert_eq(c1.replays, 18, "%ld replays", c1.replays);
	cr_assert_eq(c1.syncs_in_step - c0.syncs_in_step, 0, "%ld host syncs inside replayed steps",
		     c1.syncs_in_step - c0.syncs_in_step);
	cr_assert_eq(i1.input_upload_bytes, i0.input_upload_bytes, "%llu input bytes copied by the host",
		     (unsigned long long)(i1.input_upload_bytes - i0.input_upload_bytes));
	cr_assert_geq(ie.input_upload_bytes, 20u * (16 * 784 * 4 + 16 * 4));
	const loom_plan *pl = &e->plan;
	for (int sl = 0; sl < pl->n_params; sl++) {
		size_t n = (size_t)pl->params[sl].numel;
		double *a = malloc(sizeof(double) * n), *b = malloc(sizeof(double) * n);
		cr_assert(a && b);
		read_value(e, pl->params[sl].param, 0, a, n);
		read_value(q, pl->params[sl].param, 0, b, n);
		for (size_t k = 0; k < n; k++)
			cr_assert(a[k] == b[k], "%s[%zu]: %.17g set_input, %.17g via the slot",
				  pl->g->nodes[pl->params[sl].param].name, k, a[k], b[k]);
		free(a);
		free(b);
	}
	loom_program_free(e);
	loom_program_free(q);
}

/* ZeRO's clipping on the device (grad_sumsq_device, grad_sumsq): on one
 * rank the shard is every piece, so the sum of squares its kernels leave
 * is the one the update clipped by (loom_program_info.grad_norm), at O0
 * and under O2's loss scale (unchanged by one clean step). ZeRO itself is
 * off at one rank; the executor's all-reduce of that value runs at two. */
static void zero_norm_matches(const char *what, loom_opt_level level)
{
	loom_graph *g;
	loom_program *q = NULL;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_value loss = loom_model_convnet(g, 16, NULL);
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CUDA;
	o.amp.level = level;
	o.optim.clip_grad = 1e-3; /* binds */
	cr_assert_eq(loom_compile(g, loss, &o, &q), LOOM_OK, "compile: %s", loom_last_error());
	loom_graph_free(g);
	graph_batch(q, 0, -1);
	cr_assert_eq(loom_run(q, LOOM_RUN_TRAIN), LOOM_OK, "%s: %s", what, loom_program_error(q));
	loom_program_info info;
	loom_program_info_get(q, &info);
	cr_assert_gt(info.grad_norm, 1e-3, "%s: the clip does not bind", what);
	cr_assert_not_null(q->be->sharded->grad_sumsq);
	cr_assert_not_null(q->be->sharded->grad_sumsq_device);
	double s = -1;
	cr_assert_eq(q->be->sharded->grad_sumsq(q->be_ctx, &q->plan, &q->arena, &q->ts, 0,
						q->plan.n_pieces, &s),
		     LOOM_OK, "%s: %s", what, q->be->error(q->be_ctx));
	cr_assert(fabs(sqrt(s) - info.grad_norm) <= 1e-12 * info.grad_norm,
		  "%s: the shard kernels' norm %.17g, the update's %.17g", what, sqrt(s),
		  info.grad_norm);
	loom_program_free(q);
}

Test(cuda_ops, zero_norm_kernels_match_the_update)
{
	NEED_GPU();
	zero_norm_matches("O0", LOOM_O0);
	zero_norm_matches("O2 fp16", LOOM_O2);
}

/* ------------------------------------------------------------ fp8 (issue 42) */

/*
 * --precision fp8 on CUDA against the CPU's exact emulation (FP8_QDQ,
 * engine/cpu/fp8_qdq.c): y = x w^T (+ b) at O1 bf16 with fp8, under
 * LOOM_CUDA_FP8_GEMM=0 (the QDQ kernels, bf16 products on the rounded
 * values) and =1 (cuBLASLt's FP8 product where the shape allows).
 * With w the identity, each output and each dx is one product of fp8
 * values (QDQ(x), and the E5M2-rounded dy) and a power of two, whatever
 * the summation order: those are compared bit for bit, so the QDQ kernels'
 * amax, scale and rounding (saturation, values below the smallest
 * subnormal) are the CPU's. Otherwise outputs and gradients are held to
 * NMSE <= 1e-4: both sides round the same fp32-accumulated sums to bf16
 * (2^-9 relative each, an NMSE near 1e-5 at worst), and only the order of
 * the fp32 sums differs.
 */
#define FP8_NMSE 1e-4

typedef struct fp8_case {
	const char *what;
	int64_t m, k;
	int identity, bias;
	int inf;    /* x[0] = inf: amax inf, scale 1, large values saturate at 448 */
	int gemm;   /* LOOM_CUDA_FP8_GEMM */
	int want_fp8_gemm; /* the plan must run a product on cuBLASLt FP8 */
	int64_t lead; /* > 0: x is [lead, m / lead, k], a GPT's [B, T, C] (reshapes in the backward) */
	int want_stored; /* the CUDA plan keeps some roundings as fp8 codes (set by fp8_cases) */
} fp8_case;

/* O1 bf16 with fp8 on dev; sgd_lr > 0: SGD at that rate, else gradients
 * only; scaling: amp.fp8_scaling (history 4 under delayed). */
static loom_program *compile_fp8_as(loom_graph *g, loom_value loss, loom_device dev, int gemm,
				    double sgd_lr, int scaling)
{
	loom_compile_opts o;
	loom_program *p = NULL;
	loom_compile_opts_default(&o);
	o.no_tf32 = 1;
	o.device = dev;
	o.amp.level = LOOM_O1;
	o.amp.half = LOOM_BF16;
	o.amp.fp8 = 1;
	o.amp.fp8_scaling = scaling;
	o.amp.fp8_history = scaling == LOOM_FP8_SCALING_DELAYED ? 4 : 0;
	o.optim.kind = sgd_lr > 0 ? LOOM_OPTIM_SGD : LOOM_OPTIM_NONE;
	o.optim.lr = sgd_lr;
	setenv("LOOM_CUDA_FP8_GEMM", gemm ? "1" : "0", 1);
	loom_status st = loom_compile(g, loss, &o, &p);
	unsetenv("LOOM_CUDA_FP8_GEMM");
	cr_assert_eq(st, LOOM_OK, "fp8 compile on %s: %s", dev == LOOM_DEVICE_CUDA ? "cuda" : "cpu",
		     loom_last_error());
	return p;
}

static loom_program *compile_fp8(loom_graph *g, loom_value loss, loom_device dev, int gemm)
{
	return compile_fp8_as(g, loss, dev, gemm, 0, LOOM_FP8_SCALING_DEFAULT);
}

/* x's values: random in (-4, 4) with the special ones first. E4M3 at
 * scale 1 (x[0] inf) steps by 2^-9 below 2^-6: 2^-10 is a tie (to 0),
 * 3 2^-10 a tie (to 2^-8), 9e-4 rounds to 0, 1e-6 to -0; 440 rounds to
 * 448, 432 is a tie (to 448), 1000 saturates. Without the inf the scale
 * is 2^6 (amax < 7): 1e-7 and 3e-6 fall below half the smallest
 * subnormal, 3 2^-16 is a tie (to 2^-14). */
static void fp8_x_values(const fp8_case *fc, double *x, size_t n)
{
	static const double with_inf[] = { INFINITY, -1000, 500, 440, 432, 416, 448, -448,
					   0x1p-10, 3 * 0x1p-10, 9e-4, 1.5e-3, -1e-6, 0 };
	static const double finite[] = { 6.5, -1e-7, 3e-6, 3 * 0x1p-16, -0x1p-15, 0 };
	for (size_t i = 0; i < n; i++)
		x[i] = urand() * 4;
	const double *sp = fc->inf ? with_inf : finite;
	size_t ns = fc->inf ? sizeof(with_inf) / sizeof(with_inf[0]) : sizeof(finite) / sizeof(finite[0]);
	for (size_t i = 0; i < ns && i < n; i++)
		x[i] = sp[i];
}

/* r (the head, so dy = r): random, a few below E5M2's subnormals at
 * r's scale (2^15 for amax 1: 1e-10 -> 0, 3e-10 -> 2^-16 / 2^15). */
static void fp8_r_values(double *r, size_t n)
{
	static const double sp[] = { 1.0, 1e-6, -1e-10, 2.2e-10, 3e-10, -0.75 };
	for (size_t i = 0; i < n; i++)
		r[i] = urand() * 0.5;
	for (size_t i = 0; i < sizeof(sp) / sizeof(sp[0]) && i < n; i++)
		r[i] = sp[i];
}

static void fp8_write(loom_program *p, loom_value v, const double *x, size_t n)
{
	cr_assert_eq(loom_write_f64(p, v, x, n), LOOM_OK, "%s", loom_program_error(p));
}

/* a and b equal element for element (NaN with NaN, -0 with +0). */
static void fp8_expect_same(const fp8_case *fc, const char *what, const double *a,
			    const double *b, size_t n)
{
	size_t bad = 0, first = 0;
	for (size_t i = 0; i < n; i++)
		if (!(a[i] == b[i] || (isnan(a[i]) && isnan(b[i]))) && !bad++)
			first = i;
	cr_expect_eq(bad, 0, "%s %s: %zu of %zu differ from the CPU's; [%zu] cuda %.9g cpu %.9g",
		     fc->what, what, bad, n, first, a[first], b[first]);
}

static void fp8_compare(const fp8_case *fc, const char *what, loom_program *cuda,
			loom_program *cpu, loom_value v, int grad, size_t n, int exact)
{
	double *a = malloc(n * sizeof(double)), *b = malloc(n * sizeof(double));
	cr_assert(a && b);
	read_value(cuda, v, grad, a, n);
	read_value(cpu, v, grad, b, n);
	if (exact) {
		fp8_expect_same(fc, what, a, b, n);
	} else {
		double e = nmse(a, b, n);
		cr_expect(e <= FP8_NMSE, "%s %s: NMSE %g > %g (cuda[0] %g, cpu[0] %g)", fc->what,
			  what, e, FP8_NMSE, a[0], b[0]);
	}
	free(a);
	free(b);
}

/* Products the CUDA plan runs on cuBLASLt FP8 (their --dump-graph note);
 * fast not NULL: how many of them with fast accumulation. */
static int fp8_gemms(const loom_program *p, int *fast)
{
	const loom_backend_planning *pn = p->be->planning;
	int n = 0;
	if (fast)
		*fast = 0;
	for (int v = 0; v < p->plan.g->n && pn && pn->node_note; v++) {
		const loom_node *nd = &p->plan.g->nodes[v];
		char note[512] = "";
		if (nd->op != LOOM_OP_LINEAR && nd->op != LOOM_OP_MATMUL)
			continue;
		pn->node_note(p->be_ctx, &p->plan, v, note, sizeof(note));
		n += strstr(note, "cuBLASLt FP8") != NULL;
		if (fast)
			*fast += strstr(note, "cuBLASLt FP8") && strstr(note, ", fast accumulation");
	}
	return n;
}

static void fp8_run_case(const fp8_case *fc)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	const int64_t xd2[2] = { fc->m, fc->k }, wd[2] = { fc->k, fc->k }, bd[1] = { fc->k };
	const int64_t xd3[3] = { fc->lead, fc->lead ? fc->m / fc->lead : 0, fc->k };
	const int64_t rd[2] = { fc->m * fc->k, 1 }, row[2] = { 1, fc->m * fc->k };
	loom_value x = loom_param(g, "x", LOOM_F32, fc->lead ? 3 : 2, fc->lead ? xd3 : xd2,
				  LOOM_INIT_ZEROS, 1);
	loom_value w = loom_param(g, "w", LOOM_F32, 2, wd, LOOM_INIT_ZEROS, 1);
	loom_value b = fc->bias ? loom_param(g, "b", LOOM_F32, 1, bd, LOOM_INIT_ZEROS, 1) : LOOM_NONE;
	loom_value r = loom_param(g, "head.r", LOOM_F32, 2, rd, LOOM_INIT_ZEROS, 1);
	loom_value y = loom_linear(g, x, w, b);
	/* The head is the classifier: bf16, so dy is r as it is. */
	loom_value loss = loom_sum(g, loom_matmul(g, loom_reshape(g, y, 2, row), r));
	loom_mark_output(g, y);
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s: %s", fc->what, loom_graph_error(g));

	loom_program *cpu = compile_fp8(g, loss, LOOM_DEVICE_CPU, 0);
	loom_program *cuda = compile_fp8(g, loss, LOOM_DEVICE_CUDA, fc->gemm);
	int nq = 0;
	for (int v = 0; v < cuda->plan.g->n; v++)
		nq += cuda->plan.g->nodes[v].op == LOOM_OP_FP8_QDQ;
	cr_expect_gt(nq, 0, "%s: no FP8_QDQ node in the cuda plan", fc->what);
	int nfast = 0, ng = fp8_gemms(cuda, &nfast);
	/* LOOM_CUDA_FP8_FAST_ACCUM=all (fp8_gemm_fast_accum_matches_cpu): every
	 * FP8 product says so; fwd (from the caller's environment): the
	 * forward's, some; else none. */
	const char *fa = getenv("LOOM_CUDA_FP8_FAST_ACCUM");
	if (!fa || strcmp(fa, "fwd"))
		cr_expect_eq(nfast, fa && !strcmp(fa, "all") ? ng : 0,
			     "%s: %d of %d FP8 products note fast accumulation", fc->what, nfast, ng);
	if (fc->want_fp8_gemm)
		cr_expect_gt(ng, 0, "%s: no product on cuBLASLt FP8 under LOOM_CUDA_FP8_GEMM=1", fc->what);
	else
		cr_expect_eq(ng, 0, "%s: %d products on cuBLASLt FP8", fc->what, ng);
	loom_program_info info;
	loom_program_info_get(cuda, &info);
	if (fc->want_stored)
		cr_expect_gt(info.n_fp8_stored, 0, "%s: no rounding kept as fp8 codes", fc->what);
	else
		cr_expect_eq(info.n_fp8_stored, 0, "%s: %d roundings kept as fp8 codes", fc->what,
			     info.n_fp8_stored);

	const size_t nx = (size_t)(fc->m * fc->k), nw = (size_t)(fc->k * fc->k);
	double *buf = malloc(sizeof(double) * (nx > nw ? nx : nw));
	cr_assert(buf);
	rng_state = (uint64_t)(fc->m * 131 + fc->k) * 0x9e3779b97f4a7c15ull + 1;
	fp8_x_values(fc, buf, nx);
	fp8_write(cpu, x, buf, nx), fp8_write(cuda, x, buf, nx);
	for (size_t i = 0; i < nw; i++)
		buf[i] = fc->identity ? (i / (size_t)fc->k == i % (size_t)fc->k) : urand();
	fp8_write(cpu, w, buf, nw), fp8_write(cuda, w, buf, nw);
	if (fc->bias) {
		for (int64_t i = 0; i < fc->k; i++)
			buf[i] = urand();
		fp8_write(cpu, b, buf, (size_t)fc->k), fp8_write(cuda, b, buf, (size_t)fc->k);
	}
	fp8_r_values(buf, nx);
	fp8_write(cpu, r, buf, nx), fp8_write(cuda, r, buf, nx);
	free(buf);

	cr_assert_eq(loom_run(cpu, LOOM_RUN_GRAD), LOOM_OK, "cpu: %s", loom_program_error(cpu));
	cr_assert_eq(loom_run(cuda, LOOM_RUN_GRAD), LOOM_OK, "cuda: %s", loom_program_error(cuda));
	int exact = fc->identity && !fc->bias;
	fp8_compare(fc, "y", cuda, cpu, y, 0, nx, exact);
	fp8_compare(fc, "dx", cuda, cpu, x, 1, nx, exact);
	fp8_compare(fc, "dw", cuda, cpu, w, 1, nw, 0);
	loom_program_free(cuda);
	loom_program_free(cpu);
	loom_graph_free(g);
}

/* own: the products on their own kernels (loom_cuda_test_own_kernels),
 * so under gemm the roundings the storage pass keeps as codes for the
 * FP8 product (reads_fp8 asks the graph) are decoded into ws for a plain
 * product instead (fp8.cu's loom_cuda_fp8_decode_sources). */
static void fp8_cases_on(int gemm, int own)
{
	/* m, k multiples of 16 take the FP8 product under gemm; 8 rows
	 * (the forward) and 24 columns do not, and stay on the emulation. */
	const fp8_case cases[] = {
		{ "fp8 identity 16x16 inf", 16, 16, 1, 0, 1, gemm, gemm },
		{ "fp8 identity 32x64", 32, 64, 1, 0, 0, gemm, gemm },
		{ "fp8 identity 8x24 inf", 8, 24, 1, 0, 1, gemm, 0 },
		{ "fp8 random 48x32", 48, 32, 0, 0, 0, gemm, gemm },
		{ "fp8 random 32x48 bias", 32, 48, 0, 1, 0, gemm, gemm },
		{ "fp8 identity 2x16x32", 32, 32, 1, 0, 0, gemm, gemm, 2 },
		{ "fp8 random 4x16x64", 64, 64, 0, 0, 0, gemm, gemm, 4 },
	};
	use_own_kernels(own);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		fp8_case fc = cases[i];
		fc.want_stored = fc.want_fp8_gemm;
		fc.want_fp8_gemm &= !own;
		fp8_run_case(&fc);
	}
	use_own_kernels(0);
}

static void fp8_cases(int gemm)
{
	fp8_cases_on(gemm, 0);
}

/* y = gelu(x w1^T) w2^T over [4, 16, 32] rows as a GPT's [B, T, C], so
 * that the backward's products read the QDQ'd values through reshapes,
 * and the loss sum(y r) through the head (the classifier: bf16); v gets
 * x, w1, w2, r. */
static loom_value fp8_block_net(loom_graph *g, loom_value v[4])
{
	const int64_t xd[3] = { 4, 16, 32 }, w1d[2] = { 64, 32 }, w2d[2] = { 32, 64 };
	const int64_t rd[2] = { 4 * 16 * 32, 1 }, row[2] = { 1, 4 * 16 * 32 };
	v[0] = loom_param(g, "x", LOOM_F32, 3, xd, LOOM_INIT_ZEROS, 1);
	v[1] = loom_param(g, "w1", LOOM_F32, 2, w1d, LOOM_INIT_ZEROS, 1);
	v[2] = loom_param(g, "w2", LOOM_F32, 2, w2d, LOOM_INIT_ZEROS, 1);
	v[3] = loom_param(g, "head.r", LOOM_F32, 2, rd, LOOM_INIT_ZEROS, 1);
	loom_value y = loom_linear(g, loom_gelu_tanh(g, loom_linear(g, v[0], v[1], LOOM_NONE)),
				   v[2], LOOM_NONE);
	loom_value loss = loom_sum(g, loom_matmul(g, loom_reshape(g, y, 2, row), v[3]));
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));
	return loss;
}

/* matmul_fp8.cu's rule on a plan (a weak reference: absent in a build
 * without the toolkit). */
extern void loom_cuda_test_fp8_products(const void *plan, int *fp8, int *products)
	__attribute__((weak));

/*
 * Which products LOOM_CUDA_FP8_GEMM=1 takes (no GPU needed: the rule on
 * the plan the CPU compiled): y = gelu(x w1^T) w2^T over [4, 16, 32] rows
 * as a GPT's [B, T, C], so that the backward's products read the QDQ'd
 * values through reshapes; both linears' forward, data and weight
 * gradients (6), not the head's products (the classifier, bf16).
 */
Test(cuda_ops, fp8_gemm_takes_the_block_products)
{
	if (!loom_cuda_test_fp8_products)
		cr_skip_test("needs a build with the CUDA toolkit (matmul_fp8.cu's rule)");
	loom_graph *g;
	loom_program *p = NULL;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_value v[4];
	loom_value loss = fp8_block_net(g, v);
	p = compile_fp8(g, loss, LOOM_DEVICE_CPU, 1);
	int fp8 = -1, products = -1;
	loom_cuda_test_fp8_products(&p->plan, &fp8, &products);
	cr_expect_eq(fp8, 6, "%d of %d products would run on cuBLASLt FP8, want 6", fp8, products);
	loom_program_free(p);
	loom_graph_free(g);
}

/*
 * Under pipeline stages a later micro-batch's forward rewrites a forward
 * QDQ's scale slot before an earlier one's backward reads it, so the
 * backward's products that read one (each linear's data and weight
 * gradients) stay plain and the forward's 2 of the 6 run in FP8: the rule
 * on the block's plan with its pipe set (the rule asks only whether there
 * is one).
 */
Test(cuda_ops, fp8_gemm_pipeline_keeps_backward_plain)
{
	if (!loom_cuda_test_fp8_products)
		cr_skip_test("needs a build with the CUDA toolkit (matmul_fp8.cu's rule)");
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_value v[4];
	loom_value loss = fp8_block_net(g, v);
	loom_program *p = compile_fp8(g, loss, LOOM_DEVICE_CPU, 1);
	struct loom_pipe *was = p->plan.pipe;
	int stage = 0, fp8 = -1, products = -1;
	p->plan.pipe = (struct loom_pipe *)&stage;
	loom_cuda_test_fp8_products(&p->plan, &fp8, &products);
	p->plan.pipe = was;
	cr_expect_eq(fp8, 2, "%d of %d products would run on cuBLASLt FP8 in a pipeline, want 2",
		     fp8, products);
	loom_program_free(p);
	loom_graph_free(g);
}

extern void loom_cuda_test_fp8_fast_products(const void *plan, int *fast, int *fp8)
	__attribute__((weak));

/*
 * Which FP8 products LOOM_CUDA_FP8_FAST_ACCUM gives cuBLASLt's fast
 * accumulation (no GPU needed: the choice matmul_fp8.cu's plan makes, on
 * the block's plan): none unset or off, the forward's 2 of the 6 under
 * fwd (as Transformer Engine: not the data or weight gradients), all 6
 * under all, none for a word that is not one of the row's.
 */
Test(cuda_ops, fp8_fast_accum_takes_the_forward_products)
{
	if (!loom_cuda_test_fp8_fast_products)
		cr_skip_test("needs a build with the CUDA toolkit (matmul_fp8.cu's rule)");
	static const struct {
		const char *env;
		int want;
	} rows[] = { { NULL, 0 }, { "off", 0 }, { "fwd", 2 }, { "all", 6 }, { "forward", 0 } };
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_value v[4];
	loom_value loss = fp8_block_net(g, v);
	loom_program *p = compile_fp8(g, loss, LOOM_DEVICE_CPU, 1);
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		int fast = -1, fp8 = -1;
		if (rows[i].env)
			setenv("LOOM_CUDA_FP8_FAST_ACCUM", rows[i].env, 1);
		else
			unsetenv("LOOM_CUDA_FP8_FAST_ACCUM");
		loom_cuda_test_fp8_fast_products(&p->plan, &fast, &fp8);
		cr_expect_eq(fp8, 6, "%d products on cuBLASLt FP8, want 6", fp8);
		cr_expect_eq(fast, rows[i].want, "LOOM_CUDA_FP8_FAST_ACCUM=%s: %d of %d fast, want %d",
			     rows[i].env ? rows[i].env : "(unset)", fast, fp8, rows[i].want);
	}
	unsetenv("LOOM_CUDA_FP8_FAST_ACCUM");
	loom_program_free(p);
	loom_graph_free(g);
}

/* FP8_QDQ's kernels: the emulation's numbers, bit for bit where exact. */
Test(cuda_ops, fp8_qdq_matches_cpu)
{
	NEED_GPU();
	fp8_cases(0);
}

/* The delayed-scaling row's loss bound, relative: bf16 activations and
 * the device's own summation order (its fp8 values are the CPU's). */
#define FP8_DELAYED_LOSS_REL 2e-2

/* Every scaled tensor's scales on both, through the host view
 * (loom_fp8_tensor_get: a device's copy brought back). */
static void fp8_same_scales(loom_program *cuda, loom_program *cpu, int step)
{
	int n = loom_fp8_tensor_count(cpu);
	cr_assert_eq(loom_fp8_tensor_count(cuda), n, "step %d: scaled tensors", step);
	for (int i = 0; i < n; i++) {
		loom_fp8_tensor_info a, b;
		cr_assert_eq(loom_fp8_tensor_get(cuda, i, &a), LOOM_OK, "%s",
			     loom_program_error(cuda));
		cr_assert_eq(loom_fp8_tensor_get(cpu, i, &b), LOOM_OK, "%s", loom_program_error(cpu));
		cr_expect(a.scale == b.scale && a.next_scale == b.next_scale,
			  "step %d, %s: cuda scale %g next %g, cpu scale %g next %g", step, b.name,
			  a.scale, a.next_scale, b.scale, b.next_scale);
	}
}

/*
 * Delayed scaling with its state on the device (fp8.cu, loom_backend_fp8)
 * against the CPU's: fp8_block_net, SGD,
 * four steps at O1 bf16 + fp8 delayed (history 4; the first step casts by
 * current scaling, the next ones from the device's history). After each
 * step the losses agree within FP8_DELAYED_LOSS_REL and every tensor's
 * scale and next scale equal the CPU's.
 */
Test(cuda_ops, fp8_delayed_trains_as_cpu)
{
	NEED_GPU();
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_value v[4];
	loom_value loss = fp8_block_net(g, v);
	loom_program *p[2] = {
		compile_fp8_as(g, loss, LOOM_DEVICE_CPU, 0, 0.01, LOOM_FP8_SCALING_DELAYED),
		compile_fp8_as(g, loss, LOOM_DEVICE_CUDA, 0, 0.01, LOOM_FP8_SCALING_DELAYED),
	};
	cr_assert(p[1]->ts.fp8.delayed && p[1]->ts.fp8.n > 0, "cuda: delayed scaling");
	double buf[4 * 16 * 32];
	const size_t ns[4] = { 4 * 16 * 32, 64 * 32, 32 * 64, 4 * 16 * 32 };
	rng_state = 0x9e3779b97f4a7c15ull;
	for (int k = 0; k < 4; k++) {
		for (size_t i = 0; i < ns[k]; i++)
			buf[i] = k == 3 ? urand() / 64 : urand();
		fp8_write(p[0], v[k], buf, ns[k]), fp8_write(p[1], v[k], buf, ns[k]);
	}
	for (int step = 0; step < 4; step++) {
		for (int d = 0; d < 2; d++)
			cr_assert_eq(loom_run(p[d], LOOM_RUN_TRAIN), LOOM_OK, "%s step %d: %s",
				     d ? "cuda" : "cpu", step, loom_program_error(p[d]));
		double a = loom_loss(p[1]), b = loom_loss(p[0]);
		cr_expect(fabs(a - b) <= FP8_DELAYED_LOSS_REL * fabs(b) + 1e-6,
			  "step %d: cuda loss %.9g, cpu %.9g", step, a, b);
		fp8_same_scales(p[1], p[0], step);
	}
	loom_program_free(p[1]);
	loom_program_free(p[0]);
	loom_graph_free(g);
}

/* cuBLASLt's FP8 product (LOOM_CUDA_FP8_GEMM=1) against the CPU's QDQ and
 * fp32-accumulated product; its operands kept as fp8 codes where only FP8
 * products read them (FP8 storage, on by default): read in place in the
 * forward, transposed from the codes in the backward. */
Test(cuda_ops, fp8_gemm_matches_cpu)
{
	NEED_GPU();
	fp8_cases(1);
}

/* The same cases with cuBLASLt's fast accumulation on every FP8 product
 * (LOOM_CUDA_FP8_FAST_ACCUM=all, so the backward's too, and each plan's
 * note says so), within the same bounds: the identity cases' sums have
 * one nonzero term (exact in any accumulator), the others' k <= 64 terms
 * of products of fp8 values lose far less than FP8_NMSE. */
Test(cuda_ops, fp8_gemm_fast_accum_matches_cpu)
{
	NEED_GPU();
	setenv("LOOM_CUDA_FP8_FAST_ACCUM", "all", 1);
	fp8_cases(1);
	unsetenv("LOOM_CUDA_FP8_FAST_ACCUM");
}

extern int loom_cuda_test_fp8_casts(int vec, int fmt, const uint16_t *x, int64_t n, int64_t off,
				    float out[3], int64_t *sat, uint16_t *y, unsigned char *q,
				    unsigned char *q2, char *err, size_t errlen) __attribute__((weak));

/* One fp8_casts_vec_matches_cpu row: n random bf16 values at element
 * offset off, a few special ones among them. */
static void fp8_casts_row(int vec, int fmt, int64_t n, int64_t off, int with_inf)
{
	uint16_t *x = malloc((size_t)n * 2), *y = malloc((size_t)n * 2);
	float *xf = malloc((size_t)n * sizeof(float)), *yf = malloc((size_t)n * sizeof(float));
	unsigned char *q = malloc((size_t)n), *q2 = malloc((size_t)n);
	cr_assert(x && y && xf && yf && q && q2);
	rng_state = (uint64_t)(n * 977 + off * 31 + fmt) * 0x9e3779b97f4a7c15ull + 1;
	for (int64_t i = 0; i < n; i++)
		x[i] = loom_f32_to_bf16((float)(urand() * 4));
	/* in the first group of 8 and in the tail: a NaN (never the amax),
	 * 1e-30 (rounds to zero); with_inf: inf (amax inf, scale 1) and
	 * -1000 (saturates). */
	const int64_t at[4] = { 3, n - 1, 5, n - 2 };
	const float sp[4] = { NAN, 1e-30f, with_inf ? INFINITY : 0.5f, with_inf ? -1000.0f : -0.25f };
	for (int i = 0; i < 4; i++)
		if (at[i] >= 0 && at[i] < n)
			x[at[i]] = loom_f32_to_bf16(sp[i]);
	const float fmax = fmt == LOOM_FP8_E4M3 ? LOOM_E4M3_MAX : LOOM_E5M2_MAX;
	float amax = 0;
	for (int64_t i = 0; i < n; i++) {
		xf[i] = loom_bf16_to_f32(x[i]);
		amax = fabsf(xf[i]) > amax ? fabsf(xf[i]) : amax;
	}
	const float scale = loom_fp8_scale(amax, fmax);
	loom_cpu_fp8_qdq_f32(xf, yf, n, fmt);
	float out[3] = { -1, -1, -1 };
	int64_t sat = -1, want_sat = 0, bad_y = 0, bad_q = 0, bad_q2 = 0, first = -1;
	char err[512] = "";
	cr_assert_eq(loom_cuda_test_fp8_casts(vec, fmt, x, n, off, out, &sat, y, q, q2, err,
					      sizeof(err)),
		     0, "fp8 casts vec %d n %lld off %lld: %s", vec, (long long)n, (long long)off, err);
	for (int64_t i = 0; i < n; i++) {
		const uint8_t c = fmt == LOOM_FP8_E4M3 ? loom_f32_to_e4m3(xf[i] * scale) :
							 loom_f32_to_e5m2(xf[i] * scale);
		want_sat += fabsf(xf[i] * scale) > fmax;
		const uint16_t wy = loom_f32_to_bf16(yf[i]);
		/* a NaN as a NaN: the device's conversion has its own payload */
		const int by = y[i] != wy && !(isnan(loom_bf16_to_f32(y[i])) &&
					       isnan(loom_bf16_to_f32(wy)));
		const int bq = q[i] != c, bq2 = q2[i] != c;
		if ((by || bq || bq2) && first < 0)
			first = i;
		bad_y += by, bad_q += bq, bad_q2 += bq2;
	}
	const char *f = fmt == LOOM_FP8_E4M3 ? "E4M3" : "E5M2";
	cr_expect(out[0] == amax && out[2] == amax,
		  "%s vec %d n %lld off %lld: amax %g, recorded %g, cpu %g", f, vec, (long long)n,
		  (long long)off, out[0], out[2], amax);
	cr_expect(out[1] == scale, "%s vec %d n %lld off %lld: scale %g, cpu %g", f, vec,
		  (long long)n, (long long)off, out[1], scale);
	cr_expect_eq(sat, want_sat, "%s vec %d n %lld off %lld: %lld saturated, cpu %lld", f, vec,
		     (long long)n, (long long)off, (long long)sat, (long long)want_sat);
	cr_expect(bad_y == 0 && bad_q == 0 && bad_q2 == 0,
		  "%s vec %d n %lld off %lld: %lld values, %lld codes, %lld stored codes differ "
		  "from the CPU's (first [%lld])",
		  f, vec, (long long)n, (long long)off, (long long)bad_y, (long long)bad_q,
		  (long long)bad_q2, (long long)first);
	free(x), free(y), free(xf), free(yf), free(q), free(q2);
}

/*
 * The FP8 casts' 128-bit paths (LOOM_CUDA_FP8_CAST_VEC=1) and the scalar
 * ones, launcher by launcher, against the CPU bit for bit: current
 * scaling's amax and QDQ, the cast into codes, delayed scaling's recorded
 * cast stored as codes; lengths below, at and around the width of 8 and
 * long ones with a ragged tail, x at offsets that are 16-byte aligned (8
 * elements: the vector path) and not (1, 3: the scalar one), with a NaN,
 * an inf and a saturating value in the first group and in the tail.
 */
Test(cuda_ops, fp8_casts_vec_matches_cpu)
{
	NEED_GPU();
	if (!loom_cuda_test_fp8_casts)
		cr_skip_test("needs a build with the CUDA toolkit (fp8.cu's launchers)");
	static const int64_t ns[] = { 1, 7, 8, 9, 15, 64, 1000, 4099, 65536 + 5 };
	static const int64_t offs[] = { 0, 1, 3, 8 };
	for (int vec = 0; vec <= 1; vec++)
		for (int fmt = 0; fmt < 2; fmt++)
			for (size_t i = 0; i < sizeof(ns) / sizeof(ns[0]); i++)
				for (size_t j = 0; j < sizeof(offs) / sizeof(offs[0]); j++)
					fp8_casts_row(vec, fmt ? LOOM_FP8_E5M2 : LOOM_FP8_E4M3, ns[i],
						      offs[j], (int)(i + j) % 2);
}

extern int64_t loom_cuda_test_fp8_vec_groups(int vec, int64_t n, uintptr_t x, int xdt,
					     uintptr_t y, int ydt, int ycodes) __attribute__((weak));

/*
 * Which casts the 128-bit paths take (no GPU: the launchers' choice on
 * addresses): with the switch, f16 or bf16 x on 16 bytes, codes on 8 or
 * halves on 16 bytes, at least 8 elements: n / 8 groups (the rest the
 * scalar tail); anything else none (the scalar loop does all).
 */
Test(cuda_ops, fp8_cast_vec_takes_aligned_halves)
{
	if (!loom_cuda_test_fp8_vec_groups)
		cr_skip_test("needs a build with the CUDA toolkit (fp8.cu's launchers)");
	static const struct {
		const char *what;
		int vec;
		int64_t n;
		uintptr_t x;
		int xdt;
		uintptr_t y;
		int ydt, codes;
		int64_t want;
	} rows[] = {
		{ "switch off", 0, 64, 0x1000, LOOM_BF16, 0x2000, LOOM_BF16, 1, 0 },
		{ "bf16 to codes", 1, 64, 0x1000, LOOM_BF16, 0x2000, LOOM_BF16, 1, 8 },
		{ "ragged tail", 1, 69, 0x1000, LOOM_BF16, 0x2000, LOOM_BF16, 1, 8 },
		{ "f16 to f16", 1, 24, 0x1010, LOOM_F16, 0x2020, LOOM_F16, 0, 3 },
		{ "codes on 8 bytes", 1, 16, 0x1000, LOOM_BF16, 0x2008, LOOM_BF16, 1, 2 },
		{ "codes on 4 bytes", 1, 16, 0x1000, LOOM_BF16, 0x2004, LOOM_BF16, 1, 0 },
		{ "halves on 8 bytes", 1, 16, 0x1000, LOOM_BF16, 0x2008, LOOM_BF16, 0, 0 },
		{ "x on 2 bytes", 1, 64, 0x1002, LOOM_BF16, 0x2000, LOOM_BF16, 1, 0 },
		{ "x on 8 bytes", 1, 64, 0x1008, LOOM_BF16, 0x2000, LOOM_BF16, 1, 0 },
		{ "f32 x", 1, 64, 0x1000, LOOM_F32, 0x2000, LOOM_BF16, 1, 0 },
		{ "f32 y", 1, 64, 0x1000, LOOM_BF16, 0x2000, LOOM_F32, 0, 0 },
		{ "7 elements", 1, 7, 0x1000, LOOM_BF16, 0x2000, LOOM_BF16, 1, 0 },
	};
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		const int64_t g = loom_cuda_test_fp8_vec_groups(rows[i].vec, rows[i].n, rows[i].x,
								rows[i].xdt, rows[i].y, rows[i].ydt,
								rows[i].codes);
		cr_expect_eq(g, rows[i].want, "%s: %lld groups of 8, want %lld", rows[i].what,
			     (long long)g, (long long)rows[i].want);
	}
}

/* The program rows of fp8_qdq_matches_cpu and fp8_gemm_matches_cpu with
 * the casts' 128-bit paths on (the arena's values are aligned: the
 * vector path with a tail where m k is not a multiple of 8). */
Test(cuda_ops, fp8_cast_vec_programs_match_cpu)
{
	NEED_GPU();
	setenv("LOOM_CUDA_FP8_CAST_VEC", "1", 1);
	fp8_cases(0);
	fp8_cases(1);
	unsetenv("LOOM_CUDA_FP8_CAST_VEC");
}

/* FP8 storage's fallback: the roundings kept as codes for the FP8 product
 * (LOOM_CUDA_FP8_GEMM=1 at compile) read by products that run on their
 * own kernels, decoded first; the emulation's numbers. */
Test(cuda_ops, fp8_storage_decoded_matches_cpu)
{
	NEED_GPU();
	fp8_cases_on(1, 1);
}

/* y = gelu(ln(x) w1^T) w2^T: fp8_block_net with a layer norm (gamma,
 * beta) ahead, so both forward casts read a producer that can give their
 * amax (LOOM_CUDA_FP8_AMAX_PRODUCER); v gets x, w1, w2, r, gamma, beta.
 * deep: y = gelu(ln(x w0^T) w1^T) w2^T, a product ahead of the layer
 * norm, so that the norm's dx is that product's output gradient, rounded
 * through E5M2 (the layer norm's backward gives its amax); v[6] gets w0. */
static loom_value fp8_ln_net(loom_graph *g, loom_value *v, int deep)
{
	const int64_t xd[3] = { 4, 16, 32 }, w0d[2] = { 32, 32 }, w1d[2] = { 64, 32 };
	const int64_t w2d[2] = { 32, 64 }, rd[2] = { 4 * 16 * 32, 1 }, row[2] = { 1, 4 * 16 * 32 };
	const int64_t cd[1] = { 32 };
	v[0] = loom_param(g, "x", LOOM_F32, 3, xd, LOOM_INIT_ZEROS, 1);
	v[1] = loom_param(g, "w1", LOOM_F32, 2, w1d, LOOM_INIT_ZEROS, 1);
	v[2] = loom_param(g, "w2", LOOM_F32, 2, w2d, LOOM_INIT_ZEROS, 1);
	v[3] = loom_param(g, "head.r", LOOM_F32, 2, rd, LOOM_INIT_ZEROS, 1);
	v[4] = loom_param(g, "ln.g", LOOM_F32, 1, cd, LOOM_INIT_ONES, 1);
	v[5] = loom_param(g, "ln.b", LOOM_F32, 1, cd, LOOM_INIT_ZEROS, 1);
	loom_value x = v[0];
	if (deep) {
		v[6] = loom_param(g, "w0", LOOM_F32, 2, w0d, LOOM_INIT_ZEROS, 1);
		x = loom_linear(g, x, v[6], LOOM_NONE);
	}
	loom_value h = loom_layernorm(g, x, v[4], v[5], 1e-5);
	loom_value y = loom_linear(g, loom_gelu_tanh(g, loom_linear(g, h, v[1], LOOM_NONE)), v[2],
				   LOOM_NONE);
	loom_value loss = loom_sum(g, loom_matmul(g, loom_reshape(g, y, 2, row), v[3]));
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));
	return loss;
}

static loom_value fp8_ln_block_net(loom_graph *g, loom_value v[6])
{
	return fp8_ln_net(g, v, 0);
}

static loom_value fp8_deep_net(loom_graph *g, loom_value v[7])
{
	return fp8_ln_net(g, v, 1);
}

/* fp8.cu's producer rule on a plan (a weak reference, as above). */
extern void loom_cuda_test_fp8_amax_producers(const void *plan, int *given, int *qdqs)
	__attribute__((weak));

/* The CPU backend with some of the CUDA backend's planning (the plugin's
 * table): plan_only, its fusions and cast folding too, for a plan that is
 * compiled and never run (no node plans, every node taken), as
 * test_cuda_formats.c's cuda_like; else only its reads_fp8, so the fp8
 * storage pass decides as on CUDA and the CPU runs the plan (its run_node
 * decodes the stored sources). */
static loom_backend fp8_cuda_like;
static loom_backend_planning fp8_cuda_like_planning;

static loom_status fp8_no_node_plans(void *ctx, const loom_plan *plan, size_t *ws_bytes)
{
	(void)ctx;
	(void)plan;
	*ws_bytes = 0;
	return LOOM_OK;
}

static int fp8_every_node(void *ctx, const loom_plan *plan, loom_value v)
{
	(void)ctx;
	(void)plan;
	(void)v;
	return 1;
}

static void fp8_cuda_like_begin(int plan_only)
{
	const loom_backend *cuda = plugin()->backend();
	fp8_cuda_like = loom_cpu_backend;
	fp8_cuda_like.name = "cpu with cuda's planning";
	fp8_cuda_like_planning = *loom_cpu_backend.planning;
	fp8_cuda_like_planning.reads_fp8 = cuda->planning->reads_fp8;
	if (plan_only) {
		fp8_cuda_like.caps = cuda->caps;
		fp8_cuda_like_planning.takes_any_dtype = cuda->planning->takes_any_dtype;
		fp8_cuda_like_planning.ln_residual_fusable = cuda->planning->ln_residual_fusable;
		fp8_cuda_like_planning.attn_fusable = cuda->planning->attn_fusable;
		fp8_cuda_like.plan_create = fp8_no_node_plans;
		fp8_cuda_like.supports_node = fp8_every_node;
	}
	fp8_cuda_like.planning = &fp8_cuda_like_planning;
	loom_test_backend = &fp8_cuda_like;
}

/* How many of the fp8 casts of net's plan, compiled with the CUDA
 * backend's fusions and cast folding at O1 or O2, LOOM_CUDA_FP8_AMAX_PRODUCER's
 * rule lets their producer give the amax (of *qdqs). */
static int fp8_amax_producers_of(loom_value (*net)(loom_graph *, loom_value *), int o2,
				 int *qdqs)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_value v[7];
	loom_value loss = net(g, v);
	loom_compile_opts o;
	loom_program *p = NULL;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.amp.level = o2 ? LOOM_O2 : LOOM_O1;
	o.amp.half = LOOM_BF16;
	o.amp.fp8 = 1;
	o.optim.kind = LOOM_OPTIM_SGD;
	o.optim.lr = 0.01;
	fp8_cuda_like_begin(1);
	loom_status st = loom_compile(g, loss, &o, &p);
	loom_test_backend = NULL;
	cr_assert_eq(st, LOOM_OK, "%s", loom_last_error());
	int given = -1;
	loom_cuda_test_fp8_amax_producers(&p->plan, &given, qdqs);
	loom_program_free(p);
	loom_graph_free(g);
	return given;
}

/* At O1 and O2, want of net's fp8 casts take their producer's amax. */
static void expect_amax_producers(loom_value (*net)(loom_graph *, loom_value *), int want)
{
	if (!loom_cuda_test_fp8_amax_producers || !plugin())
		cr_skip_test("needs a build with the CUDA toolkit (fp8.cu's rule)");
	for (int o2 = 0; o2 < 2; o2++) {
		int qdqs = -1, given = fp8_amax_producers_of(net, o2, &qdqs);
		cr_expect_eq(given, want, "O%d: %d of %d fp8 casts take their producer's amax, "
			     "want %d", o2 ? 2 : 1, given, qdqs, want);
	}
}

/*
 * The backward's E5M2 casts whose producer gives the amax (no GPU needed,
 * as below): on fp8_deep_net, besides the forward's two (the layer
 * norm's and the GELU's outputs), the GELU backward's (the first
 * linear's output gradient) and the layer norm's dx (w0's product's
 * output gradient), at O1 and O2; not the weights' (written by the
 * optimizer) nor the last linear's output gradient (the head's product).
 */
Test(cuda_ops, fp8_amax_producer_takes_backward_casts)
{
	expect_amax_producers(fp8_deep_net, 4);
}

/*
 * Which FP8 casts LOOM_CUDA_FP8_AMAX_PRODUCER=1 lets their producer give
 * the amax (no GPU needed: the rule on the plan compiled with the CUDA
 * backend's fusions and cast folding, at O1 and O2): the layer norm's
 * (at O1 its fp32 output's cast to bf16 folded into it, as CUDA folds it)
 * and the GELU's, which feed the two linears' forward, and the GELU
 * backward's, the first linear's E5M2 output gradient; not the weights'
 * nor the second linear's output gradient (the head's product writes it).
 */
Test(cuda_ops, fp8_amax_producer_takes_ln_and_gelu)
{
	expect_amax_producers(fp8_ln_block_net, 3);
}

/* FP8 casts whose --dump-graph note says who gives the amax ("amax by its
 * producer", "amax by the optimizer"). */
static int fp8_amax_noted(const loom_program *p, const char *by)
{
	const loom_backend_planning *pn = p->be->planning;
	int n = 0;
	for (int v = 0; v < p->plan.g->n && pn && pn->node_note; v++) {
		char note[512] = "";
		if (p->plan.g->nodes[v].op != LOOM_OP_FP8_QDQ)
			continue;
		pn->node_note(p->be_ctx, &p->plan, v, note, sizeof(note));
		n += strstr(note, by) != NULL;
	}
	return n;
}

static int fp8_amax_given(const loom_program *p)
{
	return fp8_amax_noted(p, "amax by its producer");
}

/* fp8_ln_block_net on CUDA with the GELU its own kernel (no epilogue) and
 * LOOM_CUDA_FP8_AMAX_PRODUCER at producer. */
static loom_program *compile_fp8_producer(loom_graph *g, loom_value loss, int producer,
					  int scaling)
{
	setenv("LOOM_CUDA_FP8_AMAX_PRODUCER", producer ? "1" : "0", 1);
	setenv("LOOM_CUDA_GELU_EPILOGUE", "0", 1);
	loom_program *p = compile_fp8_as(g, loss, LOOM_DEVICE_CUDA, 0, 0.01, scaling);
	unsetenv("LOOM_CUDA_GELU_EPILOGUE");
	unsetenv("LOOM_CUDA_FP8_AMAX_PRODUCER");
	return p;
}

/*
 * The amax from the producer (LOOM_CUDA_FP8_AMAX_PRODUCER=1: the layer
 * norm's and the GELU's kernels fill their casts' amax slots, forward and
 * backward, the casts run no amax pass) against the amax pass (=0) and
 * the CPU, under current and delayed scaling, three SGD steps of
 * fp8_ln_block_net (3 casts given: the layer norm's and GELU's outputs,
 * the GELU backward's) and fp8_deep_net (4: and the layer norm's dx):
 * with the switch on the losses are the switch off's bit for bit (the
 * same amax, so the same scales and roundings) and within
 * FP8_DELAYED_LOSS_REL of the CPU's; every tensor's amax and saturated
 * count are the switch off's (both recipes keep them on the device), and
 * under delayed scaling its scales the CPU's.
 */
Test(cuda_ops, fp8_amax_producer_matches_cpu)
{
	NEED_GPU();
	for (int run = 0; run < 4; run++) {
		const int delayed = run & 1, deep = run >> 1, want = deep ? 4 : 3;
		const int scaling = delayed ? LOOM_FP8_SCALING_DELAYED : LOOM_FP8_SCALING_CURRENT;
		loom_graph *g;
		cr_assert_eq(loom_graph_new(&g), LOOM_OK);
		loom_value v[7];
		loom_value loss = deep ? fp8_deep_net(g, v) : fp8_ln_block_net(g, v);
		loom_program *p[3] = {
			compile_fp8_as(g, loss, LOOM_DEVICE_CPU, 0, 0.01, scaling),
			compile_fp8_producer(g, loss, 0, scaling),
			compile_fp8_producer(g, loss, 1, scaling),
		};
		cr_expect_eq(fp8_amax_given(p[1]), 0, "switch off: casts without their amax pass");
		cr_expect_eq(fp8_amax_given(p[2]), want,
			     "switch on: %d casts take the amax from their producer, want %d",
			     fp8_amax_given(p[2]), want);
		double buf[4 * 16 * 32];
		const size_t ns[7] = { 4 * 16 * 32, 64 * 32, 32 * 64, 4 * 16 * 32, 0, 0, 32 * 32 };
		rng_state = 0x9e3779b97f4a7c15ull + (uint64_t)run;
		for (int k = 0; k < 7; k++) {
			if (!ns[k] || (k == 6 && !deep))
				continue;
			for (size_t i = 0; i < ns[k]; i++)
				buf[i] = k == 3 ? urand() / 64 : urand() * (k == 0 ? 3 : 1);
			for (int d = 0; d < 3; d++)
				fp8_write(p[d], v[k], buf, ns[k]);
		}
		const char *what = delayed ? "delayed" : "current";
		for (int step = 0; step < 3; step++) {
			for (int d = 0; d < 3; d++)
				cr_assert_eq(loom_run(p[d], LOOM_RUN_TRAIN), LOOM_OK, "%d step %d: %s", d,
					     step, loom_program_error(p[d]));
			double on = loom_loss(p[2]), off = loom_loss(p[1]), cpu = loom_loss(p[0]);
			cr_expect(on == off, "%s step %d: loss %.9g with the producer's amax, %.9g without",
				  what, step, on, off);
			cr_expect(fabs(on - cpu) <= FP8_DELAYED_LOSS_REL * fabs(cpu) + 1e-6,
				  "%s step %d: cuda loss %.9g, cpu %.9g", what, step, on, cpu);
			for (int i = 0; i < loom_fp8_tensor_count(p[2]); i++) {
				loom_fp8_tensor_info a, b;
				cr_assert_eq(loom_fp8_tensor_get(p[2], i, &a), LOOM_OK);
				cr_assert_eq(loom_fp8_tensor_get(p[1], i, &b), LOOM_OK);
				cr_expect(a.amax == b.amax && a.saturated == b.saturated,
					  "%s step %d, %s: amax %.9g (%lld saturated) by the producer, "
					  "%.9g (%lld) by the pass",
					  what, step, a.name, a.amax, (long long)a.saturated, b.amax,
					  (long long)b.saturated);
			}
			if (delayed)
				fp8_same_scales(p[2], p[0], step);
		}
		for (int d = 0; d < 3; d++)
			loom_program_free(p[d]);
		loom_graph_free(g);
	}
}

/* fp8.cu's optimizer rule on a plan (a weak reference, as above). */
extern void loom_cuda_test_fp8_amax_optim(const void *plan, int *given, int *qdqs)
	__attribute__((weak));

enum { WA_B = 2, WA_T = 8, WA_V = 64, WA_C = 32 };

/* A group of two for compiling a data-parallel or ZeRO plan in one
 * process (tests/engine/fake_async.h): broadcasts leave the buffer,
 * all-gathers repeat this rank's bytes, no collective runs here. */
static loom_status wa_no_allreduce(loom_comm *c, void *buf, size_t count, loom_dtype dt,
				   void *stream, loom_comm_work **out)
{
	(void)buf, (void)count, (void)dt, (void)stream, (void)out;
	return loom_comm_fail(c, LOOM_ERR_UNSUPPORTED, "fake: compile only");
}

static const loom_comm_i wa_iface = {
	.name = "fake",
	.allreduce_start = wa_no_allreduce,
	.wait = fake_comm_wait_free,
	.broadcast = fake_comm_broadcast,
	.allgather = fake_comm_allgather,
	.barrier = fake_comm_barrier,
	.abort = fake_comm_abort,
	.free = fake_comm_free,
};

/*
 * How many of the fp8 casts (of *qdqs) of gpt_parts' GPT (two blocks and
 * an untied head, or tied: one block, the classifier reading wte) at O1
 * or O2, fp8 (all: the classifier's product too) under scaling,
 * LOOM_CUDA_FP8_AMAX_OPTIM's rule gives the optimizer's amax. world 1:
 * compiled with CUDA's planning (its fusions and cast folding; delayed
 * scaling, which that needs a device's fp8 state for, on the CPU); 2:
 * on the CPU as rank 0 of a fake group of two, ZeRO-zero.
 */
static int fp8_amax_optim_of(int tied, int o2, int all, int scaling, int world, int zero,
			     int *qdqs)
{
	gpt m;
	cr_assert_eq(tied ? gpt_tied_block(&m, WA_B, WA_T, WA_V, WA_C) :
			    gpt_two_blocks(&m, WA_B, WA_T, WA_V, WA_C),
		     LOOM_OK);
	loom_compile_opts o;
	gpt_adamw_opts(&o, o2 ? LOOM_O2 : LOOM_O1);
	o.amp.fp8 = 1;
	o.amp.fp8_all_products = all;
	o.amp.fp8_scaling = scaling;
	loom_pg *pg = world > 1 ? fake_group_of_two(30.0, &wa_iface, NULL) : NULL;
	o.pg = pg;
	o.zero_stage = zero;
	if (!pg && scaling != LOOM_FP8_SCALING_DELAYED)
		fp8_cuda_like_begin(1);
	loom_program *p = NULL;
	loom_status st = loom_compile(m.g, m.loss, &o, &p);
	loom_test_backend = NULL;
	cr_assert_eq(st, LOOM_OK, "%s", loom_last_error());
	cr_assert_eq(p->plan.world, world);
	int given = -1;
	loom_cuda_test_fp8_amax_optim(&p->plan, &given, qdqs);
	loom_program_free(p);
	loom_graph_free(m.g);
	if (pg)
		loom_pg_free(pg);
	return given;
}

static void expect_amax_optim(int tied, int all, int scaling, int world, int zero, int want)
{
	if (!loom_cuda_test_fp8_amax_optim || !plugin())
		cr_skip_test("needs a build with the CUDA toolkit (fp8.cu's rule)");
	for (int o2 = 0; o2 < 2; o2++) {
		int qdqs = -1, given = fp8_amax_optim_of(tied, o2, all, scaling, world, zero, &qdqs);
		cr_expect_eq(given, want, "%s GPT at O%d%s, world %d%s: %d of %d fp8 casts take "
			     "the optimizer's amax, want %d", tied ? "tied" : "untied", o2 ? 2 : 1,
			     all ? " (all products)" : "", world, zero ? " ZeRO" : "", given, qdqs,
			     want);
	}
}

/*
 * Which FP8 casts LOOM_CUDA_FP8_AMAX_OPTIM=1 gives the amax of the weight
 * the optimizer wrote (no GPU needed: the rule on the plan), at O1 (the
 * weight's bf16 cast, rounded) and O2 (the bf16 weight the optimizer
 * rounds from its master): the two blocks' four weights each (c_attn,
 * attn_proj, c_fc, mlp_proj), not the classifier's (a bf16 product) nor
 * any activation's or gradient's cast; with every product in fp8, the
 * head's weight too.
 */
Test(cuda_ops, fp8_amax_optim_takes_the_weights)
{
	expect_amax_optim(0, 0, LOOM_FP8_SCALING_CURRENT, 1, 0, 8);
	expect_amax_optim(0, 1, LOOM_FP8_SCALING_CURRENT, 1, 0, 9);
	/* the default recipe is current scaling on a device */
	expect_amax_optim(0, 0, LOOM_FP8_SCALING_DEFAULT, 1, 0, 8);
}

/* The tied table (wte: the embedding's gather and, with every product in
 * fp8, the classifier's cast) is one weight the optimizer writes whole:
 * its cast takes the amax too (5 of the tied GPT's weights; 4 without). */
Test(cuda_ops, fp8_amax_optim_takes_the_tied_table)
{
	expect_amax_optim(1, 0, LOOM_FP8_SCALING_CURRENT, 1, 0, 4);
	expect_amax_optim(1, 1, LOOM_FP8_SCALING_CURRENT, 1, 0, 5);
}

/*
 * Where the rule refuses (each cast its own amax pass): delayed scaling
 * (its cast takes the amax in the same pass), ZeRO (each rank updates
 * its shard of a weight, the rest comes from the other ranks); data
 * parallelism without ZeRO keeps it (every rank updates whole weights
 * from the summed gradients).
 */
Test(cuda_ops, fp8_amax_optim_refuses_zero_and_delayed)
{
	expect_amax_optim(0, 0, LOOM_FP8_SCALING_DELAYED, 1, 0, 0);
	expect_amax_optim(0, 0, LOOM_FP8_SCALING_CURRENT, 2, 0, 8);
	expect_amax_optim(0, 0, LOOM_FP8_SCALING_CURRENT, 2, 1, 0);
	expect_amax_optim(0, 1, LOOM_FP8_SCALING_CURRENT, 2, 1, 0);
}

static int fp8_amax_by_optim(const loom_program *p)
{
	return fp8_amax_noted(p, "amax by the optimizer");
}

/* gpt_two_blocks at O2 fp8 (current scaling) on CUDA with
 * LOOM_CUDA_FP8_AMAX_OPTIM at on. */
static loom_program *compile_fp8_wamax(const gpt *m, int on)
{
	loom_compile_opts o;
	gpt_adamw_opts(&o, LOOM_O2);
	o.device = LOOM_DEVICE_CUDA;
	o.no_tf32 = 1;
	o.amp.fp8 = 1;
	o.amp.fp8_scaling = LOOM_FP8_SCALING_CURRENT;
	setenv("LOOM_CUDA_FP8_AMAX_OPTIM", on ? "1" : "0", 1);
	loom_program *p = NULL;
	loom_status st = loom_compile(m->g, m->loss, &o, &p);
	unsetenv("LOOM_CUDA_FP8_AMAX_OPTIM");
	cr_assert_eq(st, LOOM_OK, "%s", loom_last_error());
	return p;
}

/* One step of both programs on batch k (bad: a label out of range, the
 * step skipped on the device, reported): the same loss bit for bit. */
static void wamax_step(loom_program *p[2], int k, int bad, const char *what)
{
	double loss[2];
	for (int i = 0; i < 2; i++) {
		cr_assert_eq(gpt_feed(p[i], k, WA_B, WA_T, WA_V, 0), LOOM_OK);
		if (bad) {
			int32_t tg[WA_B * WA_T];
			for (int j = 0; j < WA_B * WA_T; j++)
				tg[j] = j % WA_V;
			tg[3] = WA_V + 5;
			cr_assert_eq(loom_set_input(p[i], "targets", tg, LOOM_I32, WA_B * WA_T), LOOM_OK);
		}
		loom_status st = loom_run(p[i], LOOM_RUN_TRAIN);
		if (bad) {
			cr_expect_neq(st, LOOM_OK, "%s: a bad label's step ran", what);
			continue;
		}
		cr_assert_eq(st, LOOM_OK, "%s, program %d: %s", what, i, loom_program_error(p[i]));
		loss[i] = loom_loss(p[i]);
	}
	cr_expect(bad || !memcmp(&loss[0], &loss[1], sizeof(double)),
		  "%s: loss %.17g with the optimizer's amax, %.17g with the pass", what, loss[1],
		  loss[0]);
	/* every cast's amax as it recorded it (the device's state, read back) */
	for (int i = 0; !bad && i < loom_fp8_tensor_count(p[1]); i++) {
		loom_fp8_tensor_info a, b;
		cr_assert_eq(loom_fp8_tensor_get(p[1], i, &a), LOOM_OK);
		cr_assert_eq(loom_fp8_tensor_get(p[0], i, &b), LOOM_OK);
		cr_expect(a.amax == b.amax && a.scale == b.scale,
			  "%s, %s: amax %.9g (scale %g) from the optimizer, %.9g (%g) by the pass",
			  what, a.name, a.amax, a.scale, b.amax, b.scale);
	}
}

/*
 * The weights' amax from the optimizer (LOOM_CUDA_FP8_AMAX_OPTIM=1: the
 * update leaves each weight's amax, its casts run no amax pass) against
 * the pass (=0): gpt_two_blocks at O2 fp8, current scaling, AdamW, the
 * same losses and parameters bit for bit through the first step (no
 * update yet: the pass), a step the device skips (a bad label: the
 * weights and their amaxes as they were), a host write of a weight
 * (doubled: a stale amax would saturate its cast) and a checkpoint's
 * load (older weights), each followed by steps.
 */
Test(cuda_ops, fp8_amax_optim_matches_the_pass)
{
	NEED_GPU();
	gpt m;
	cr_assert_eq(gpt_two_blocks(&m, WA_B, WA_T, WA_V, WA_C), LOOM_OK);
	loom_program *p[2] = { compile_fp8_wamax(&m, 0), compile_fp8_wamax(&m, 1) };
	cr_expect_eq(fp8_amax_by_optim(p[0]), 0, "switch off: no cast takes the optimizer's amax");
	cr_expect_eq(fp8_amax_by_optim(p[1]), 8, "switch on: %d casts take the optimizer's amax, "
		     "want 8", fp8_amax_by_optim(p[1]));
	char ck[2][64];
	for (int i = 0; i < 2; i++)
		snprintf(ck[i], sizeof(ck[i]), "/tmp/loom_wamax_%d_%d.ckpt", (int)getpid(), i);
	int k = 0;
	for (; k < 3; k++)
		wamax_step(p, k, 0, "first steps");
	for (int i = 0; i < 2; i++)
		cr_assert_eq(loom_save(p[i], ck[i]), LOOM_OK, "%s", loom_program_error(p[i]));
	wamax_step(p, k++, 1, "skipped step");
	for (int j = 0; j < 2; j++)
		wamax_step(p, k++, 0, "after the skipped step");
	const loom_value w = m.params[4]; /* an fp8 weight: h0.c_attn.weight [3C, C] */
	const size_t n = (size_t)(3 * WA_C * WA_C);
	const loom_shape ws = loom_value_shape(m.g, w);
	cr_assert_eq(loom_shape_numel(&ws), (int64_t)n);
	double *buf = malloc(n * sizeof(double));
	cr_assert(buf);
	for (int i = 0; i < 2; i++) {
		cr_assert_eq(loom_read_f64(p[i], w, buf, n), LOOM_OK, "%s", loom_program_error(p[i]));
		for (size_t e = 0; e < n; e++)
			buf[e] *= 2;
		fp8_write(p[i], w, buf, n);
	}
	free(buf);
	for (int j = 0; j < 2; j++)
		wamax_step(p, k++, 0, "after a host write");
	for (int i = 0; i < 2; i++) {
		cr_assert_eq(loom_load(p[i], ck[i]), LOOM_OK, "%s", loom_program_error(p[i]));
		unlink(ck[i]);
	}
	for (int j = 0; j < 2; j++)
		wamax_step(p, k++, 0, "after a checkpoint's load");
	cr_expect_eq(gpt_first_param_differs(p[0], p[1], &m), -1,
		     "a parameter differs between the optimizer's amax and the pass");
	for (int i = 0; i < 2; i++)
		loom_program_free(p[i]);
	loom_graph_free(m.g);
}

/* Every scaled tensor of the last step on CUDA and the CPU through the
 * host view (under current scaling the device's per-tensor state, read
 * back): the same scale and saturated count, the amax within
 * FP8_DELAYED_LOSS_REL (bf16 activations in the device's summation
 * order), exactly at step 0 for the weights' roundings (the same
 * values); the report a row per tensor. */
static void fp8_same_report(loom_program *cuda, loom_program *cpu, int step)
{
	const int n = loom_fp8_tensor_count(cpu);
	cr_assert_eq(loom_fp8_tensor_count(cuda), n);
	for (int i = 0; i < n; i++) {
		loom_fp8_tensor_info a, b;
		cr_assert_eq(loom_fp8_tensor_get(cuda, i, &a), LOOM_OK, "%s",
			     loom_program_error(cuda));
		cr_assert_eq(loom_fp8_tensor_get(cpu, i, &b), LOOM_OK);
		const int weight = b.name[0] == 'w' && strstr(b.name, ".e4m3");
		cr_expect(a.scale == b.scale && a.saturated == b.saturated,
			  "step %d, %s: cuda scale %g (%lld saturated), cpu %g (%lld)", step, b.name,
			  a.scale, (long long)a.saturated, b.scale, (long long)b.saturated);
		cr_expect(b.amax > 0 && fabs(a.amax - b.amax) <= FP8_DELAYED_LOSS_REL * b.amax,
			  "step %d, %s: cuda amax %.9g, cpu %.9g", step, b.name, a.amax, b.amax);
		cr_expect(step > 0 || !weight || a.amax == b.amax,
			  "step 0, %s: cuda amax %.9g, cpu %.9g (the same weights)", b.name, a.amax,
			  b.amax);
	}
	char *buf = print_text(loom_amp_report, cuda);
	size_t rows = 0;
	cr_expect(strstr(buf, "fp8, current scaling"), "%s", buf);
	for (const char *at = strstr(buf, "\n  "); at; at = strstr(at + 1, "\n  "))
		rows += at[3] >= '0' && at[3] <= '9'; /* "  <node> <tensor> ..." */
	cr_expect_eq(rows, (size_t)n, "%zu rows for %d tensors\n%s", rows, n, buf);
	free(buf);
}

/*
 * --amp-report under current scaling on CUDA (issue 42 item 6): the casts
 * record each tensor's amax, scale and saturated count into the device's
 * per-tensor state as they cast, read back for the report only. Against
 * the CPU, three SGD steps of fp8_block_net (the amax pass) and of
 * fp8_ln_block_net with LOOM_CUDA_FP8_AMAX_PRODUCER=1 (the amax the
 * layer norm's and GELU's): fp8_same_report after each; then a step of
 * fp8_block_net with x holding inf and 1000 (scale 1: both saturate in
 * E4M3) gives x's rounding the CPU's count, 2.
 */
Test(cuda_ops, fp8_current_report_matches_cpu)
{
	NEED_GPU();
	for (int ln = 0; ln < 2; ln++) {
		loom_graph *g;
		cr_assert_eq(loom_graph_new(&g), LOOM_OK);
		loom_value v[6];
		loom_value loss = ln ? fp8_ln_block_net(g, v) : fp8_block_net(g, v);
		loom_program *p[2] = {
			compile_fp8_as(g, loss, LOOM_DEVICE_CPU, 0, 0.01, LOOM_FP8_SCALING_CURRENT),
			compile_fp8_producer(g, loss, ln, LOOM_FP8_SCALING_CURRENT),
		};
		cr_assert(!p[1]->ts.fp8.delayed && p[1]->ts.fp8.n > 0, "cuda: current scaling");
		double buf[4 * 16 * 32];
		const size_t ns[4] = { 4 * 16 * 32, 64 * 32, 32 * 64, 4 * 16 * 32 };
		rng_state = 0x9e3779b97f4a7c15ull + (uint64_t)ln;
		for (int k = 0; k < 4; k++) {
			for (size_t i = 0; i < ns[k]; i++)
				buf[i] = k == 3 ? urand() / 64 : urand() * (k == 0 ? 3 : 1);
			for (int d = 0; d < 2; d++)
				fp8_write(p[d], v[k], buf, ns[k]);
		}
		for (int step = 0; step < 3; step++) {
			for (int d = 0; d < 2; d++)
				cr_assert_eq(loom_run(p[d], LOOM_RUN_TRAIN), LOOM_OK, "%d step %d: %s", d,
					     step, loom_program_error(p[d]));
			fp8_same_report(p[1], p[0], step);
		}
		if (!ln) {
			for (size_t i = 0; i < ns[0]; i++)
				buf[i] = i == 0 ? INFINITY : i == 1 ? -1000 : urand();
			for (int d = 0; d < 2; d++) {
				fp8_write(p[d], v[0], buf, ns[0]);
				cr_assert_eq(loom_run(p[d], LOOM_RUN_TRAIN), LOOM_OK, "%s",
					     loom_program_error(p[d]));
			}
			int found = 0;
			for (int i = 0; i < loom_fp8_tensor_count(p[0]); i++) {
				loom_fp8_tensor_info a, b;
				cr_assert_eq(loom_fp8_tensor_get(p[1], i, &a), LOOM_OK);
				cr_assert_eq(loom_fp8_tensor_get(p[0], i, &b), LOOM_OK);
				if (strcmp(b.name, "x.e4m3"))
					continue;
				found = 1;
				cr_expect(b.saturated == 2 && a.saturated == 2 && a.scale == 1 &&
						  isinf(a.amax),
					  "x: cuda %lld saturated (scale %g, amax %g), cpu %lld",
					  (long long)a.saturated, a.scale, a.amax,
					  (long long)b.saturated);
			}
			cr_expect(found, "no tensor x.e4m3");
		}
		for (int d = 0; d < 2; d++)
			loom_program_free(p[d]);
		loom_graph_free(g);
	}
}

/* ------------------------------------------------------------ fp8 storage on CUDA */

/* fp8_cuda_like_begin(0): the CPU asking the CUDA backend's reads_fp8. */
static loom_program *compile_fp8_cuda_like(loom_graph *g, loom_value loss, int gemm, int store)
{
	setenv("LOOM_FP8_STORAGE", store ? "1" : "0", 1);
	fp8_cuda_like_begin(0);
	loom_program *p = compile_fp8_as(g, loss, LOOM_DEVICE_CPU, gemm, 0.01,
					 LOOM_FP8_SCALING_CURRENT);
	loom_test_backend = NULL;
	unsetenv("LOOM_FP8_STORAGE");
	return p;
}

/*
 * FP8 storage as the CUDA backend plans it (no GPU needed): with
 * LOOM_CUDA_FP8_GEMM=1 its reads_fp8 says yes to the operands of the
 * products cuBLASLt's FP8 path takes, so fp8_block_net's four E4M3
 * roundings (x, w1, the GELU's output, w2: read by the forward and both
 * gradients' products, all FP8) and its two E5M2 gradient roundings (the
 * linears have no bias, whose gradient would read them) are kept as 1-byte
 * codes, six as the CPU's own plan keeps, and the plan's
 * memory report counts one byte an element: its activations fall by what
 * they save. Off, nothing is stored. Run on the CPU (which decodes stored
 * sources), four SGD steps give the unstored plan's losses to the bit.
 */
Test(cuda_ops, fp8_storage_as_cuda_plans_it)
{
	if (!plugin() || !plugin()->backend()->planning->reads_fp8)
		cr_skip_test("needs a build with the CUDA toolkit (the plugin's reads_fp8)");
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_value v[4];
	loom_value loss = fp8_block_net(g, v);
	loom_program *p[3] = {
		compile_fp8_cuda_like(g, loss, 1, 0),
		compile_fp8_cuda_like(g, loss, 1, 1),
		compile_fp8_cuda_like(g, loss, 0, 1),
	};
	loom_program_info info[3];
	for (int d = 0; d < 3; d++) {
		loom_program_info_get(p[d], &info[d]);
		info[d].backend = NULL;
	}
	cr_expect_eq(info[0].n_fp8_stored, 0, "storage off: %d stored", info[0].n_fp8_stored);
	cr_expect_eq(info[1].n_fp8_stored, 6, "LOOM_CUDA_FP8_GEMM=1: %d stored, want 6",
		     info[1].n_fp8_stored);
	cr_expect_eq(info[2].n_fp8_stored, 0, "LOOM_CUDA_FP8_GEMM=0: %d stored, want 0",
		     info[2].n_fp8_stored);
	cr_expect_gt(info[1].fp8_saved_bytes, 0);
	cr_expect_eq(info[0].activation_naive_bytes - info[1].activation_naive_bytes,
		     info[1].fp8_saved_bytes, "naive activations %zu -> %zu, the stored save %zu",
		     info[0].activation_naive_bytes, info[1].activation_naive_bytes,
		     info[1].fp8_saved_bytes);
	double buf[4 * 16 * 32];
	const size_t ns[4] = { 4 * 16 * 32, 64 * 32, 32 * 64, 4 * 16 * 32 };
	rng_state = 0x9e3779b97f4a7c15ull;
	for (int k = 0; k < 4; k++) {
		for (size_t i = 0; i < ns[k]; i++)
			buf[i] = k == 3 ? urand() / 64 : urand();
		for (int d = 0; d < 2; d++)
			fp8_write(p[d], v[k], buf, ns[k]);
	}
	for (int step = 0; step < 4; step++) {
		for (int d = 0; d < 2; d++)
			cr_assert_eq(loom_run(p[d], LOOM_RUN_TRAIN), LOOM_OK, "%d step %d: %s", d, step,
				     loom_program_error(p[d]));
		cr_expect_eq(loom_loss(p[1]), loom_loss(p[0]), "step %d: stored %.17g, unstored %.17g",
			     step, loom_loss(p[1]), loom_loss(p[0]));
	}
	for (int d = 0; d < 3; d++)
		loom_program_free(p[d]);
	loom_graph_free(g);
}
