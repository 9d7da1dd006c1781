#include <stdio.h>
#include <stdlib.h>
#include "loom.h"
int main(void) {
	loom_graph *g; loom_graph_new(&g);
	int64_t xd[4] = {8, 1, 28, 28}, yd[1] = {8};
	loom_value x = loom_input(g, "image", LOOM_F32, 4, xd);
	loom_value y = loom_input(g, "label", LOOM_I32, 1, yd);
	loom_value h = loom_layer_conv2d(g, "conv1", x, 16, 5, 1, 2, 1);
	h = loom_layer_batchnorm2d(g, "bn1", h); h = loom_relu(g, h); h = loom_maxpool2d(g, h, 2, 2, 0);
	h = loom_layer_conv2d(g, "conv2", h, 32, 5, 1, 2, 1);
	h = loom_layer_batchnorm2d(g, "bn2", h); h = loom_relu(g, h); h = loom_maxpool2d(g, h, 2, 2, 0);
	h = loom_flatten(g, h);
	loom_value logits = loom_layer_linear(g, "fc", h, 10, 1);
	loom_value loss = loom_softmax_cross_entropy(g, logits, y);
	if (loom_graph_status(g)) { printf("graph: %s\n", loom_graph_error(g)); return 1; }
	loom_compile_opts o; loom_compile_opts_default(&o); o.verbose = 1; o.optim.momentum = 0.9;
	const char *lvl = getenv("LVL"); if (lvl) o.amp.level = atoi(lvl);
	loom_program *p;
	if (loom_compile(g, loss, &o, &p)) { printf("compile: %s\n", loom_last_error()); return 1; }
	if (lvl) loom_graph_dump(g, stdout);
	float *img = malloc(sizeof(float) * 8 * 784); int32_t lab[8];
	srand(1); for (int i = 0; i < 8*784; i++) img[i] = rand() / (float)RAND_MAX;
	for (int i = 0; i < 8; i++) lab[i] = i % 10;
	loom_set_input(p, "image", img, LOOM_F32, 8*784); loom_set_input(p, "label", lab, LOOM_I32, 8);
	for (int s = 0; s < 20; s++) {
		if (loom_run(p, LOOM_RUN_TRAIN)) { printf("run: %s\n", loom_program_error(p)); return 1; }
		loom_program_info info; loom_program_info_get(p, &info);
		printf("step %d loss %.5f scale %g\n", s, loom_loss(p), info.loss_scale);
	}
	loom_program_free(p); loom_graph_free(g);
	return 0;
}
