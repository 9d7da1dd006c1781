/*
 * examples/models.c — the reference models of models.h.
 */
#include "examples/models.h"

#define LOOM_NAME_BUF 48

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

const loom_name_map loom_convnet_torch_names[LOOM_CONVNET_TORCH_NAMES] = {
	{ .loom = "conv1.", .file = "layer1.0." },
	{ .loom = "bn1.", .file = "layer1.1." },
	{ .loom = "conv2.", .file = "layer2.0." },
	{ .loom = "bn2.", .file = "layer2.1." },
};

void loom_convnet_weights_opts(loom_weights_opts *o)
{
	loom_weights_opts_default(o);
	o->names = loom_convnet_torch_names;
	o->n_names = LOOM_CONVNET_TORCH_NAMES;
}

#include <stdio.h>

/* conv (no bias) + batch norm [+ relu], named prefix.convK / prefix.bnK. */
static loom_value conv_bn(loom_graph *g, const char *prefix, int k, loom_value x, int out,
			  int kernel, int stride, int relu)
{
	char cn[LOOM_NAME_BUF], bn[LOOM_NAME_BUF];
	snprintf(cn, sizeof(cn), "%s.conv%d", prefix, k);
	snprintf(bn, sizeof(bn), "%s.bn%d", prefix, k);
	loom_value h = loom_layer_conv2d(g, cn, x, out, kernel, stride, kernel / 2, 0);
	h = loom_layer_batchnorm2d(g, bn, h);
	return relu ? loom_relu(g, h) : h;
}

static int64_t channels(loom_graph *g, loom_value x)
{
	return loom_value_shape(g, x).dims[1];
}

/* The shortcut: x itself, or a strided 1x1 conv + batch norm to match. */
static loom_value shortcut(loom_graph *g, const char *prefix, loom_value x, int out, int stride)
{
	char cn[LOOM_NAME_BUF], bn[LOOM_NAME_BUF];
	if (stride == 1 && channels(g, x) == out)
		return x;
	snprintf(cn, sizeof(cn), "%s.downsample.0", prefix);
	snprintf(bn, sizeof(bn), "%s.downsample.1", prefix);
	loom_value h = loom_layer_conv2d(g, cn, x, out, 1, stride, 0, 0);
	return loom_layer_batchnorm2d(g, bn, h);
}

static loom_value basic_block(loom_graph *g, const char *prefix, loom_value x, int width,
			      int stride)
{
	loom_value h = conv_bn(g, prefix, 1, x, width, 3, stride, 1);
	h = conv_bn(g, prefix, 2, h, width, 3, 1, 0);
	return loom_relu(g, loom_add(g, h, shortcut(g, prefix, x, width, stride)));
}

static loom_value bottleneck(loom_graph *g, const char *prefix, loom_value x, int width,
			     int stride)
{
	loom_value h = conv_bn(g, prefix, 1, x, width, 1, 1, 1);
	h = conv_bn(g, prefix, 2, h, width, 3, stride, 1);
	h = conv_bn(g, prefix, 3, h, 4 * width, 1, 1, 0);
	return loom_relu(g, loom_add(g, h, shortcut(g, prefix, x, 4 * width, stride)));
}

loom_value loom_model_resnet(loom_graph *g, int depth, int batch, int size, int classes,
			     loom_value *logits)
{
	return loom_model_resnet_width(g, depth, batch, size, classes, 64, logits);
}

loom_value loom_model_resnet_width(loom_graph *g, int depth, int batch, int size, int classes,
				   int base, loom_value *logits)
{
	static const int blocks18[4] = { 2, 2, 2, 2 }, blocks34[4] = { 3, 4, 6, 3 };
	const int *blocks = depth == 18 ? blocks18 : blocks34;
	int bottlenecks = depth == 50;
	int64_t xd[4] = { batch, 3, size, size }, yd[1] = { batch };
	if ((depth != 18 && depth != 34 && depth != 50) || base < 1)
		return LOOM_NONE;
	loom_value x = loom_input(g, "image", LOOM_F32, 4, xd);
	loom_value y = loom_input(g, "label", LOOM_I32, 1, yd);
	loom_value h;
	if (size <= 64) {
		h = loom_layer_conv2d(g, "conv1", x, base, 3, 1, 1, 0);
		h = loom_relu(g, loom_layer_batchnorm2d(g, "bn1", h));
	} else {
		h = loom_layer_conv2d(g, "conv1", x, base, 7, 2, 3, 0);
		h = loom_relu(g, loom_layer_batchnorm2d(g, "bn1", h));
		h = loom_maxpool2d(g, h, 3, 2, 1);
	}
	for (int stage = 0; stage < 4; stage++) {
		int width = base << stage;
		for (int b = 0; b < blocks[stage]; b++) {
			char prefix[LOOM_NAME_BUF];
			snprintf(prefix, sizeof(prefix), "layer%d.%d", stage + 1, b);
			int stride = (b == 0 && stage > 0) ? 2 : 1;
			h = bottlenecks ? bottleneck(g, prefix, h, width, stride) :
					  basic_block(g, prefix, h, width, stride);
		}
	}
	loom_value z = loom_layer_linear(g, "fc", loom_global_avgpool(g, h), classes, 1);
	loom_mark_output(g, z);
	if (logits)
		*logits = z;
	return loom_softmax_cross_entropy(g, z, y);
}
