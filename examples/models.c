/*
 * examples/models.c — the reference models of models.h.
 */
#include "examples/models.h"

loom_value loom_model_convnet(loom_graph *g, int batch, loom_value *logits)
{
	int64_t xd[4] = { batch, 1, 28, 28 }, yd[1] = { batch };
	loom_value x = loom_input(g, "image", LOOM_F32, 4, xd);
	loom_value y = loom_input(g, "label", LOOM_I32, 1, yd);
	loom_value h = loom_layer_conv2d(g, "conv1", x, 16, 5, 1, 2, 1);
	h = loom_maxpool2d(g, loom_relu(g, loom_layer_batchnorm2d(g, "bn1", h)), 2, 2, 0);
	h = loom_layer_conv2d(g, "conv2", h, 32, 5, 1, 2, 1);
	h = loom_maxpool2d(g, loom_relu(g, loom_layer_batchnorm2d(g, "bn2", h)), 2, 2, 0);
	loom_value z = loom_layer_linear(g, "fc", loom_flatten(g, h), 10, 1);
	loom_mark_output(g, z);
	if (logits)
		*logits = z;
	return loom_softmax_cross_entropy(g, z, y);
}
