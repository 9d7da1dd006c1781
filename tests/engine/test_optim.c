/*
 * tests/engine/test_optim.c — SGD (momentum, dampening, nesterov, weight
 * decay) and AdamW against torch.optim: a linear layer 4->3 with
 * cross-entropy, three steps on fixed batches, every parameter compared
 * after every step with goldens produced by PyTorch 1.13.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <string.h>

#include "loom.h"

/*
 * The goldens below were printed by this script (torch 1.13.1, CPU):
 *
 *   import torch
 *   torch.set_default_dtype(torch.float64)
 *   def X(k): return torch.tensor([[((i*4+j+3*k)%7-3)/4.0 for j in range(4)] for i in range(5)])
 *   def Y(k): return torch.tensor([(i+k)%3 for i in range(5)])
 *   W0 = torch.tensor([[(((o*4+i)*3)%11-5)/16.0 for i in range(4)] for o in range(3)])
 *   B0 = torch.tensor([(o-1)/8.0 for o in range(3)])
 *   def run(make, lrs):
 *       m = torch.nn.Linear(4, 3)
 *       with torch.no_grad(): m.weight.copy_(W0); m.bias.copy_(B0)
 *       opt = make(m.parameters())
 *       out = []
 *       for k, lr in enumerate(lrs):
 *           for g in opt.param_groups: g['lr'] = lr
 *           opt.zero_grad()
 *           loss = torch.nn.functional.cross_entropy(m(X(k)), Y(k))
 *           loss.backward(); opt.step()
 *           out.append(torch.cat([m.weight.flatten(), m.bias]).tolist())
 *       return out
 *   cfgs = {
 *    'sgd_plain': (lambda ps: torch.optim.SGD(ps, lr=0.1), [0.1]*3),
 *    'sgd_momentum': (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9,
 *                     dampening=0.1, weight_decay=0.01), [0.1]*3),
 *    'sgd_nesterov': (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9,
 *                     nesterov=True, weight_decay=0.01), [0.1]*3),
 *    'adamw': (lambda ps: torch.optim.AdamW(ps, lr=0.01, betas=(0.9,0.999),
 *              eps=1e-8, weight_decay=0.1), [0.01]*3),
 *    'adamw_set_lr': (lambda ps: torch.optim.AdamW(ps, lr=0.01, betas=(0.8,0.99),
 *                     eps=1e-6, weight_decay=0.0), [0.01,0.01,0.05]),
 *   }
 *   for name,(mk,lrs) in cfgs.items():
 *       for row in run(mk, lrs): print(", ".join("%.17g" % v for v in row))
 *
 * Each row: weight [3][4] row-major, then bias [3], after that step.
 */
static const double golden_sgd_plain[3][15] = {
	{ -0.31148559101139367, -0.12116614902458066, 0.043027724640831516, 0.24104080411447465, -0.24379046548925842, -0.054324447419491273, 0.14519761917872781, 0.30880005782443343, -0.19472394349934791, -0.012009403555928068, 0.1867746561804407, -0.29984086193890802, -0.11372223205274803, 0.0078640722790686447, 0.10585815977367939 },
	{ -0.30209586750077277, -0.11403579021793778, 0.057143567100864434, 0.22570640596720221, -0.24955199254091442, -0.058315026014841051, 0.15314475902698066, 0.32803468980067196, -0.1983521399583128, -0.015149183767221169, 0.16471167387215493, -0.30374109576787411, -0.12275969086866005, 0.014947866104293533, 0.10781182476436652 },
	{ -0.30964078291538671, -0.10870926140374639, 0.065140211012304688, 0.24436477657013864, -0.26194880730166165, -0.063276343662370602, 0.14476790593639319, 0.32575236929395002, -0.17841040978295164, -0.015514394933883003, 0.16509188305130215, -0.32011714586408857, -0.11207923047966459, 0.0012857243320618481, 0.11079350614760274 },
};
static const double golden_sgd_momentum[3][15] = {
	{ -0.31117309101139368, -0.12104114902458066, 0.042965224640831516, 0.24079080411447465, -0.24354046548925842, -0.054261947419491273, 0.1450726191787278, 0.30848755782443338, -0.19453644349934793, -0.012009403555928068, 0.18658715618044069, -0.29952836193890803, -0.11359723205274803, 0.0078640722790686447, 0.10573315977367939 },
	{ -0.30124901245428343, -0.11095390351233461, 0.038049004628908055, 0.21848669096265139, -0.24269408440456003, -0.050391640634530215, 0.17015994588101294, 0.32191240009820288, -0.20395757814115656, -0.025629624603135174, 0.16574138699007901, -0.29109886606085422, -0.11137035173220479, 0.021309100080119346, 0.09006125165208545 },
	{ -0.29884761854537439, -0.096855390427673133, 0.040843422718808038, 0.21507813589000527, -0.25294431092147091, -0.05145925619058575, 0.1848589539698767, 0.33172671187564778, -0.19422124242565475, -0.038188646354866115, 0.14730420925756527, -0.29813379046815303, -0.09993341974988415, 0.020869655499759301, 0.07906376425012486 },
};
static const double golden_sgd_nesterov[3][15] = {
	{ -0.30997887292164794, -0.11747818314670326, 0.02538392681757988, 0.23250252781750183, -0.23772688442959103, -0.046847700097033415, 0.1631379764395828, 0.30487635986642347, -0.20086924264876105, -0.022817866756263329, 0.1857655967428373, -0.28785388768392528, -0.10333474090022127, 0.014941737330230426, 0.08839300356999083 },
	{ -0.29053349852646421, -0.10072537852206315, 0.036596810011864565, 0.19576660711997401, -0.2431779996250992, -0.048018106262096898, 0.193857001850023, 0.33777350789331922, -0.21283370934843659, -0.037892817090839956, 0.14281879188811245, -0.28469171251329317, -0.11173692873239563, 0.034094365952009147, 0.077642562780386476 },
	{ -0.29587255680571151, -0.081644773154714245, 0.049017796361791696, 0.21225311547612954, -0.2661324087742577, -0.055209655006411319, 0.19746697162512439, 0.34521925969666251, -0.18196871027578079, -0.049138990802811935, 0.12550206994095894, -0.309481149887542, -0.090822821522793792, 0.017713481750775199, 0.073109339772018569 },
};
static const double golden_adamw[3][15] = {
	{ -0.30218750985794712, -0.11487500260834276, 0.052437500513550644, 0.23975000111617148, -0.23975000161042642, -0.052437501223158767, 0.13487499950489218, 0.30218750270274419, -0.1973124986157147, -0.0099999991673192495, 0.17731251378654639, -0.30218750078994316, -0.1148750008867002, 0.009999998728394353, 0.11487500052241578 },
	{ -0.29376297293943798, -0.10502842352425037, 0.051294075072226455, 0.22970634689256361, -0.23966905683333609, -0.049622300921276855, 0.1437120116792662, 0.30793064496200795, -0.20641203340778494, -0.018343450113163316, 0.1694773279861389, -0.2976876969298764, -0.11411473527817614, 0.019953649120125112, 0.10876868179079835 },
	{ -0.29259875603883634, -0.09512551532607974, 0.052457485382261838, 0.22886776707065593, -0.24478936246850758, -0.050757775696010227, 0.14774424792233237, 0.3115842835772733, -0.20294597016105492, -0.024968530728710026, 0.16350325513547007, -0.30034292460124251, -0.10981169734943959, 0.01963471960479601, 0.10508415695293306 },
};
static const double golden_adamw_set_lr[3][15] = {
	{ -0.30250098569851153, -0.11500026082753964, 0.052500051354802971, 0.24000011161591411, -0.24000016104007382, -0.05250012231439511, 0.13499995048945918, 0.30250027026718956, -0.19749986157336952, -0.0099999167326113581, 0.17750137846649602, -0.30250007899369574, -0.1150000886692418, 0.0099998728410359648, 0.11500005224130826 },
	{ -0.29403125755183829, -0.10511403508896922, 0.051986105954904598, 0.23005873650093703, -0.24074251293598872, -0.050285878489438718, 0.14375411420011799, 0.30901562458478288, -0.20662149486330203, -0.01807431175013521, 0.16946210788824784, -0.2988097911324446, -0.11493296575054716, 0.019937704210325875, 0.10944350752808733 },
	{ -0.29245839711826793, -0.055743588508464274, 0.061434539239563817, 0.23088750073492154, -0.27155150637803716, -0.060262052957264056, 0.16054317577561963, 0.32866009085706255, -0.18600279768839523, -0.048367566900161932, 0.14096478788559644, -0.31811863978490412, -0.093667006984936949, 0.014068980225118599, 0.095089520746936634 },
};

typedef struct model {
	loom_program *p;
	loom_value w, b;
} model;

static double x_at(int k, int i, int j)
{
	return ((i * 4 + j + 3 * k) % 7 - 3) / 4.0;
}

/* The batch of step k, as the script's X(k) and Y(k). */
static void feed(model *m, loom_dtype dt, int k)
{
	double x64[20];
	float x32[20];
	int32_t y[5];
	for (int i = 0; i < 5; i++) {
		for (int j = 0; j < 4; j++) {
			x64[i * 4 + j] = x_at(k, i, j);
			x32[i * 4 + j] = (float)x_at(k, i, j);
		}
		y[i] = (i + k) % 3;
	}
	cr_assert_eq(loom_set_input(m->p, "x", dt == LOOM_F64 ? (void *)x64 : (void *)x32, dt, 20),
		     LOOM_OK, "%s", loom_program_error(m->p));
	cr_assert_eq(loom_set_input(m->p, "y", y, LOOM_I32, 5), LOOM_OK, "%s",
		     loom_program_error(m->p));
}

static model build(loom_dtype dt, const loom_optim_opts *optim)
{
	loom_graph *g;
	model m = { 0 };
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	int64_t xd[2] = { 5, 4 }, yd[1] = { 5 };
	loom_value x = loom_input(g, "x", dt, 2, xd);
	loom_value y = loom_input(g, "y", LOOM_I32, 1, yd);
	loom_value h = loom_layer_linear(g, "fc", x, 3, 1);
	loom_value loss = loom_softmax_cross_entropy(g, h, y);
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));
	/* fc.weight and fc.bias are the first parameters after the inputs. */
	m.w = 2;
	m.b = 3;
	cr_assert_eq(loom_value_shape(g, m.w).dims[0], 3);
	cr_assert_eq(loom_value_shape(g, m.b).ndim, 1);

	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.optim = *optim;
	cr_assert_eq(loom_compile(g, loss, &o, &m.p), LOOM_OK, "%s", loom_last_error());
	loom_graph_free(g);

	double w0[12], b0[3];
	for (int oc = 0; oc < 3; oc++) {
		for (int i = 0; i < 4; i++)
			w0[oc * 4 + i] = (((oc * 4 + i) * 3) % 11 - 5) / 16.0;
		b0[oc] = (oc - 1) / 8.0;
	}
	cr_assert_eq(loom_write_f64(m.p, m.w, w0, 12), LOOM_OK);
	cr_assert_eq(loom_write_f64(m.p, m.b, b0, 3), LOOM_OK);
	return m;
}

static void check_step(model *m, const double want[15], double rtol, const char *what, int k)
{
	double got[15];
	cr_assert_eq(loom_read_f64(m->p, m->w, got, 12), LOOM_OK);
	cr_assert_eq(loom_read_f64(m->p, m->b, got + 12, 3), LOOM_OK);
	for (int i = 0; i < 15; i++) {
		double err = fabs(got[i] - want[i]);
		cr_assert(err <= rtol * fabs(want[i]) + rtol * 1e-3,
			  "%s step %d value %d: loom %.17g, torch %.17g (err %.3g)", what, k + 1, i,
			  got[i], want[i], err);
	}
}

/* Trains three steps (with lrs[k] at step k) and compares each step. */
static void run_case(loom_dtype dt, const loom_optim_opts *optim, const double lrs[3],
		     const double want[3][15], double rtol, const char *what)
{
	model m = build(dt, optim);
	for (int k = 0; k < 3; k++) {
		cr_assert_eq(loom_set_lr(m.p, lrs[k]), LOOM_OK);
		cr_assert_eq(loom_get_lr(m.p), lrs[k]);
		feed(&m, dt, k);
		cr_assert_eq(loom_run(m.p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(m.p));
		cr_assert_eq(loom_step_count(m.p), k + 1);
		check_step(&m, want[k], rtol, what, k);
	}
	loom_program_free(m.p);
}

static loom_optim_opts sgd(double lr, double mom, double damp, int nesterov, double wd)
{
	loom_optim_opts o = { .kind = LOOM_OPTIM_SGD, .lr = lr, .momentum = mom,
			      .dampening = damp, .nesterov = nesterov, .weight_decay = wd };
	return o;
}

static loom_optim_opts adamw(double lr, double b1, double b2, double eps, double wd)
{
	loom_optim_opts o = { .kind = LOOM_OPTIM_ADAMW, .lr = lr, .beta1 = b1, .beta2 = b2,
			      .eps = eps, .weight_decay = wd };
	return o;
}

static const double lr01[3] = { 0.1, 0.1, 0.1 };
static const double lr001[3] = { 0.01, 0.01, 0.01 };
static const double lr_changed[3] = { 0.01, 0.01, 0.05 };

Test(optim, sgd_plain_f64)
{
	loom_optim_opts o = sgd(0.1, 0, 0, 0, 0);
	run_case(LOOM_F64, &o, lr01, golden_sgd_plain, 1e-10, "sgd");
}

Test(optim, sgd_momentum_dampening_weight_decay_f64)
{
	loom_optim_opts o = sgd(0.1, 0.9, 0.1, 0, 0.01);
	run_case(LOOM_F64, &o, lr01, golden_sgd_momentum, 1e-10, "sgd momentum");
}

Test(optim, sgd_nesterov_f64)
{
	loom_optim_opts o = sgd(0.1, 0.9, 0, 1, 0.01);
	run_case(LOOM_F64, &o, lr01, golden_sgd_nesterov, 1e-10, "sgd nesterov");
}

Test(optim, adamw_f64)
{
	loom_optim_opts o = adamw(0.01, 0.9, 0.999, 1e-8, 0.1);
	run_case(LOOM_F64, &o, lr001, golden_adamw, 1e-10, "adamw");
}

/* loom_set_lr between steps takes effect at the next step, as changing
 * param_groups' lr does in torch. */
Test(optim, adamw_set_lr_f64)
{
	loom_optim_opts o = adamw(0.01, 0.8, 0.99, 1e-6, 0);
	run_case(LOOM_F64, &o, lr_changed, golden_adamw_set_lr, 1e-10, "adamw set_lr");
}

/* The same goldens in f32 (f32 kernels, f32 optimizer state). */
Test(optim, sgd_momentum_f32)
{
	loom_optim_opts o = sgd(0.1, 0.9, 0.1, 0, 0.01);
	run_case(LOOM_F32, &o, lr01, golden_sgd_momentum, 2e-6, "sgd momentum f32");
}

Test(optim, sgd_nesterov_f32)
{
	loom_optim_opts o = sgd(0.1, 0.9, 0, 1, 0.01);
	run_case(LOOM_F32, &o, lr01, golden_sgd_nesterov, 2e-6, "sgd nesterov f32");
}

Test(optim, adamw_f32)
{
	loom_optim_opts o = adamw(0.01, 0.9, 0.999, 1e-8, 0.1);
	run_case(LOOM_F32, &o, lr001, golden_adamw, 2e-6, "adamw f32");
}

/* Not calling set_lr keeps the compiled one; a changed lr is refused when
 * it is not a finite number >= 0 and the old one stays. */
Test(optim, set_lr_validates_and_keeps_old)
{
	loom_optim_opts o = sgd(0.1, 0, 0, 0, 0);
	model m = build(LOOM_F64, &o);
	cr_assert_eq(loom_get_lr(m.p), 0.1);
	cr_assert_eq(loom_set_lr(m.p, -1), LOOM_ERR_INVALID);
	cr_assert_eq(loom_set_lr(m.p, NAN), LOOM_ERR_INVALID);
	cr_assert_eq(loom_get_lr(m.p), 0.1);
	cr_assert_neq(strstr(loom_program_error(m.p), "set_lr"), NULL, "%s",
		      loom_program_error(m.p));
	for (int k = 0; k < 3; k++) {
		feed(&m, LOOM_F64, k);
		cr_assert_eq(loom_run(m.p, LOOM_RUN_TRAIN), LOOM_OK);
		check_step(&m, golden_sgd_plain[k], 1e-10, "sgd default lr", k);
	}
	loom_program_free(m.p);
}

/* lr 0 leaves the weights unchanged; the step still counts. */
Test(optim, lr_zero_is_a_counted_no_op)
{
	loom_optim_opts o = sgd(0.1, 0.9, 0, 0, 0);
	model m = build(LOOM_F64, &o);
	double before[12], after[12];
	cr_assert_eq(loom_read_f64(m.p, m.w, before, 12), LOOM_OK);
	cr_assert_eq(loom_set_lr(m.p, 0), LOOM_OK);
	feed(&m, LOOM_F64, 0);
	cr_assert_eq(loom_run(m.p, LOOM_RUN_TRAIN), LOOM_OK);
	cr_assert_eq(loom_read_f64(m.p, m.w, after, 12), LOOM_OK);
	cr_assert_arr_eq(before, after, sizeof(before));
	cr_assert_eq(loom_step_count(m.p), 1);
	loom_program_free(m.p);
}

/* GRAD, FORWARD and EVAL runs never step the optimizer. */
Test(optim, only_train_runs_count_steps)
{
	loom_optim_opts o = sgd(0.1, 0, 0, 0, 0);
	model m = build(LOOM_F64, &o);
	double before[12], after[12];
	cr_assert_eq(loom_read_f64(m.p, m.w, before, 12), LOOM_OK);
	feed(&m, LOOM_F64, 0);
	cr_assert_eq(loom_run(m.p, LOOM_RUN_GRAD), LOOM_OK);
	cr_assert_eq(loom_run(m.p, LOOM_RUN_FORWARD), LOOM_OK);
	cr_assert_eq(loom_run(m.p, LOOM_RUN_EVAL), LOOM_OK);
	cr_assert_eq(loom_step_count(m.p), 0);
	cr_assert_eq(loom_read_f64(m.p, m.w, after, 12), LOOM_OK);
	cr_assert_arr_eq(before, after, sizeof(before));
	cr_assert_eq(loom_run(m.p, LOOM_RUN_TRAIN), LOOM_OK);
	cr_assert_eq(loom_step_count(m.p), 1);
	check_step(&m, golden_sgd_plain[0], 1e-10, "sgd after grad runs", 0);
	loom_program_free(m.p);
}

Test(optim, bad_options_refused)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	int64_t xd[2] = { 5, 4 }, yd[1] = { 5 };
	loom_value x = loom_input(g, "x", LOOM_F64, 2, xd);
	loom_value y = loom_input(g, "y", LOOM_I32, 1, yd);
	loom_value loss = loom_softmax_cross_entropy(g, loom_layer_linear(g, "fc", x, 3, 1), y);
	struct {
		loom_optim_opts o;
		const char *msg;
	} bad[] = {
		{ sgd(-0.1, 0, 0, 0, 0), "learning rate" },
		{ sgd(0.1, 0, 0, 1, 0), "nesterov" },
		{ sgd(0.1, 0.9, 0.1, 1, 0), "nesterov" },
		{ sgd(0.1, 0, 0, 0, -1), "weight decay" },
		{ adamw(0.1, 1.0, 0.999, 1e-8, 0), "betas" },
		{ adamw(0.1, 0.9, 0.999, 0, 0), "eps" },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		loom_compile_opts o;
		loom_compile_opts_default(&o);
		o.device = LOOM_DEVICE_CPU;
		o.optim = bad[i].o;
		loom_program *p = (loom_program *)1;
		cr_assert_eq(loom_compile(g, loss, &o, &p), LOOM_ERR_INVALID, "case %zu", i);
		cr_assert_null(p);
		cr_assert_neq(strstr(loom_last_error(), bad[i].msg), NULL, "case %zu: '%s'", i,
			      loom_last_error());
	}
	loom_graph_free(g);
}

/* ------------------------------------------------------------ clipping */

/* The gradient of the model at its start (GRAD run, step 0's batch). */
static double grads_and_norm(model *m, double g[15])
{
	feed(m, LOOM_F64, 0);
	cr_assert_eq(loom_run(m->p, LOOM_RUN_GRAD), LOOM_OK, "%s", loom_program_error(m->p));
	cr_assert_eq(loom_read_grad_f64(m->p, m->w, g, 12), LOOM_OK);
	cr_assert_eq(loom_read_grad_f64(m->p, m->b, g + 12, 3), LOOM_OK);
	double s = 0;
	for (int i = 0; i < 15; i++)
		s += g[i] * g[i];
	return sqrt(s);
}

/* One SGD step (lr 0.1) with clipping at max_norm: every parameter moves by
 * -lr g min(1, max_norm / (norm + 1e-6)), torch's clip_grad_norm_. */
static void check_clip(double max_norm_of_norm, int decay_matrices_only)
{
	loom_optim_opts o = sgd(0.1, 0, 0, 0, 0.05);
	model m = build(LOOM_F64, &o);
	double g[15], before[15], after[15];
	double norm = grads_and_norm(&m, g);
	double max_norm = max_norm_of_norm * norm;
	cr_assert_eq(loom_read_f64(m.p, m.w, before, 12), LOOM_OK);
	cr_assert_eq(loom_read_f64(m.p, m.b, before + 12, 3), LOOM_OK);
	cr_assert_eq(loom_set_clip_grad(m.p, max_norm), LOOM_OK, "%s", loom_program_error(m.p));
	cr_assert_eq(loom_set_decay_matrices_only(m.p, decay_matrices_only), LOOM_OK);
	feed(&m, LOOM_F64, 0);
	cr_assert_eq(loom_run(m.p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(m.p));
	cr_assert_eq(loom_read_f64(m.p, m.w, after, 12), LOOM_OK);
	cr_assert_eq(loom_read_f64(m.p, m.b, after + 12, 3), LOOM_OK);
	double coef = max_norm / (norm + 1e-6);
	coef = coef < 1 ? coef : 1;
	for (int i = 0; i < 15; i++) {
		double wd = decay_matrices_only && i >= 12 ? 0 : 0.05;
		double want = before[i] - 0.1 * (g[i] * coef + wd * before[i]);
		cr_assert(fabs(after[i] - want) <= 1e-14, "value %d: %.17g, want %.17g (coef %g)", i,
			  after[i], want, coef);
	}
	loom_program_info info;
	loom_program_info_get(m.p, &info);
	cr_assert(fabs(info.grad_norm - norm) <= 1e-14 * norm, "norm %.17g, want %.17g",
		  info.grad_norm, norm);
	loom_program_free(m.p);
}

Test(optim, clip_grad_scales_down_like_torch)
{
	check_clip(0.25, 0);
}

Test(optim, clip_grad_above_the_norm_changes_nothing)
{
	check_clip(10, 0);
}

/* Biases (1 dim) take no weight decay; the matrix does. */
Test(optim, decay_matrices_only)
{
	check_clip(0.5, 1);
}

/*
 * Which parameters decay, one by one: a table E [6, 4] read by an embedding
 * and tied to an output projection, a layer norm (gain, bias), a matrix W
 * [3, 4] with its bias, the tied projection's bias. Both products end in a
 * relu of values far below zero (biases -100), so every gradient is 0 and
 * one AdamW step (lr 0.1, decay 0.5) moves only what decays: W by the
 * factor 1 - 0.05, bit for bit; E, the norm and the biases not at all.
 */
Test(optim, decay_matrices_only_leaves_embeddings_biases_and_norms)
{
	loom_graph *g;
	loom_program *p;
	int64_t idd[2] = { 2, 3 }, ed[2] = { 6, 4 }, wd[2] = { 3, 4 }, bd[1] = { 3 }, b2d[1] = { 6 };
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_value ids = loom_input(g, "ids", LOOM_I32, 2, idd);
	loom_value e = loom_param(g, "E", LOOM_F64, 2, ed, LOOM_INIT_ZEROS, 0);
	loom_value gain = loom_param(g, "ln.g", LOOM_F64, 1, ed + 1, LOOM_INIT_ONES, 0);
	loom_value beta = loom_param(g, "ln.b", LOOM_F64, 1, ed + 1, LOOM_INIT_ZEROS, 0);
	loom_value w = loom_param(g, "W", LOOM_F64, 2, wd, LOOM_INIT_ZEROS, 0);
	loom_value b = loom_param(g, "W.b", LOOM_F64, 1, bd, LOOM_INIT_ZEROS, 0);
	loom_value b2 = loom_param(g, "head.b", LOOM_F64, 1, b2d, LOOM_INIT_ZEROS, 0);
	loom_value h = loom_layernorm(g, loom_embedding(g, ids, e), gain, beta, 1e-5);
	loom_value y = loom_sum(g, loom_relu(g, loom_linear(g, h, w, b)));
	loom_value y2 = loom_sum(g, loom_relu(g, loom_linear(g, h, e, b2))); /* tied */
	loom_value loss = loom_add(g, y, y2);
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.optim = adamw(0.1, 0.9, 0.999, 1e-8, 0.5);
	cr_assert_eq(loom_compile(g, loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	cr_assert_eq(loom_set_decay_matrices_only(p, 1), LOOM_OK, "%s", loom_program_error(p));
	loom_value all[6] = { e, gain, beta, w, b, b2 };
	const char *names[6] = { "E (embedding, tied)", "ln.g", "ln.b", "W", "W.b", "head.b" };
	int64_t n[6] = { 24, 4, 4, 12, 3, 6 };
	double before[6][24], after[24];
	for (int k = 0; k < 6; k++) {
		for (int i = 0; i < n[k]; i++)
			before[k][i] = k == 4 || k == 5 ? -100 : 0.25 * sin(1.7 * i + k) + (k == 1);
		cr_assert_eq(loom_write_f64(p, all[k], before[k], n[k]), LOOM_OK);
	}
	int32_t idv[6] = { 0, 5, 2, 2, 4, 1 };
	cr_assert_eq(loom_set_input(p, "ids", idv, LOOM_I32, 6), LOOM_OK);
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(loom_loss(p), 0.0, "the relus are not all off: loss %g", loom_loss(p));
	for (int k = 0; k < 6; k++) {
		cr_assert_eq(loom_read_f64(p, all[k], after, n[k]), LOOM_OK);
		for (int i = 0; i < n[k]; i++) {
			double want = k == 3 ? before[k][i] * (1 - 0.1 * 0.5) : before[k][i];
			cr_assert_eq(after[i], want, "%s[%d]: %.17g, want %.17g (%s)", names[k], i,
				     after[i], want, k == 3 ? "decayed" : "untouched");
		}
	}
	loom_program_free(p);
	loom_graph_free(g);
}

Test(optim, clip_grad_refuses_bad_values)
{
	loom_optim_opts o = sgd(0.1, 0, 0, 0, 0);
	model m = build(LOOM_F64, &o);
	cr_assert_eq(loom_set_clip_grad(m.p, -1), LOOM_ERR_INVALID);
	cr_assert(strstr(loom_program_error(m.p), "set_clip_grad"));
	cr_assert_eq(loom_set_clip_grad(m.p, NAN), LOOM_ERR_INVALID);
	cr_assert_eq(loom_set_clip_grad(NULL, 1), LOOM_ERR_INVALID);
	loom_program_free(m.p);
}

/* A step skipped for an overflow (fp16 gradients at a 2^40 scale) changes
 * nothing: no parameter, no norm taken. */
Test(optim, clip_grad_leaves_skipped_steps_alone)
{
	loom_graph *g;
	loom_program *p;
	int64_t xd[2] = { 5, 4 }, yd[1] = { 5 };
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_value x = loom_input(g, "x", LOOM_F32, 2, xd);
	loom_value y = loom_input(g, "y", LOOM_I32, 1, yd);
	loom_value loss = loom_softmax_cross_entropy(g, loom_layer_linear(g, "fc", x, 3, 1), y);
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.optim = sgd(0.1, 0, 0, 0, 0);
	o.amp.level = LOOM_O1;
	o.amp.init_scale = 1099511627776.0;
	cr_assert_eq(loom_compile(g, loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	loom_graph_free(g);
	cr_assert_eq(loom_set_clip_grad(p, 0.01), LOOM_OK);
	float xv[20];
	int32_t yv[5] = { 0, 1, 2, 0, 1 };
	for (int i = 0; i < 20; i++)
		xv[i] = (float)(i % 7) - 3;
	cr_assert_eq(loom_set_input(p, "x", xv, LOOM_F32, 20), LOOM_OK);
	cr_assert_eq(loom_set_input(p, "y", yv, LOOM_I32, 5), LOOM_OK);
	double w0[12], w1[12];
	cr_assert_eq(loom_read_f64(p, 2, w0, 12), LOOM_OK);
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(loom_read_f64(p, 2, w1, 12), LOOM_OK);
	loom_program_info info;
	loom_program_info_get(p, &info);
	cr_assert_eq(info.skipped_steps, 1, "the 2^40 scale did not overflow");
	cr_assert_eq(loom_step_count(p), 0);
	cr_assert_eq(info.grad_norm, 0);
	cr_assert_eq(memcmp(w0, w1, sizeof(w0)), 0);
	loom_program_free(p);
}
