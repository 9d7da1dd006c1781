/*
 * tests/examples/test_models.c — the reference models: the ResNets have
 * exactly torchvision's parameter counts (so the architecture matches
 * layer for layer), compile with a plan that reuses memory, and train.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

#include "examples/models.h"
#include "loom.h"

static loom_program *compile(loom_graph *g, loom_value loss)
{
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.optim.momentum = 0.9;
	loom_program *p = NULL;
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));
	cr_assert_eq(loom_compile(g, loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	return p;
}

/* sum(p.numel() for p in torchvision.models.resnetNN().parameters()),
 * torchvision 0.14 (1000 classes). */
static void check_count(int depth, int64_t want)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_program *p = compile(g, loom_model_resnet(g, depth, 1, 224, 1000, NULL));
	loom_program_info info;
	loom_program_info_get(p, &info);
	cr_assert_eq(info.n_param_elems, want, "ResNet-%d: %lld parameters, torchvision has %lld",
		     depth, (long long)info.n_param_elems, (long long)want);
	cr_assert_lt(info.activation_bytes, info.activation_naive_bytes / 2,
		     "ResNet-%d: the plan should reuse at least half of the activation memory", depth);
	loom_program_free(p);
	loom_graph_free(g);
}

Test(models, resnet18_matches_torchvision) { check_count(18, 11689512); }
Test(models, resnet34_matches_torchvision) { check_count(34, 21797672); }
Test(models, resnet50_matches_torchvision) { check_count(50, 25557032); }

Test(models, bad_depth_builds_nothing)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	cr_assert_eq(loom_model_resnet(g, 20, 2, 32, 10, NULL), LOOM_NONE);
	loom_graph_free(g);
}

Test(models, resnet18_cifar_learns_a_fixed_batch)
{
	enum { B = 4, S = 32 };
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_program *p = compile(g, loom_model_resnet(g, 18, B, S, 10, NULL));
	float *img = malloc(sizeof(float) * B * 3 * S * S);
	int32_t lab[B] = { 1, 3, 5, 7 };
	srand(3);
	for (int i = 0; i < B * 3 * S * S; i++)
		img[i] = (float)rand() / RAND_MAX * 2 - 1;
	loom_set_input(p, "image", img, LOOM_F32, B * 3 * S * S);
	loom_set_input(p, "label", lab, LOOM_I32, B);
	double first = 0, last = 0;
	for (int s = 0; s < 6; s++) {
		cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
		last = loom_loss(p);
		cr_assert(isfinite(last), "step %d: loss %g", s, last);
		if (s == 0)
			first = last;
	}
	cr_assert_lt(last, first * 0.5, "loss %g -> %g: a memorisable batch was not learned", first,
		     last);
	free(img);
	loom_program_free(p);
	loom_graph_free(g);
}
