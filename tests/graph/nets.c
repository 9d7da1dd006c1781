/*
 * tests/graph/nets.c — the shared test ConvNet, built from the raw ops (not
 * the layer helpers) so that tests hold a handle on every parameter.
 */
#include <stdio.h>

#include "tests/graph/nets.h"

static loom_value param(loom_graph *g, const char *name, loom_dtype dt, int ndim,
			const int64_t *dims, loom_init init)
{
	return loom_param(g, name, dt, ndim, dims, init, 0);
}

static loom_value bn(loom_graph *g, const char *name, loom_value x, loom_dtype dt, int64_t c,
		     loom_value *gamma, loom_value *beta)
{
	char nm[64];
	int64_t d[1] = { c };
	snprintf(nm, sizeof(nm), "%s.weight", name);
	*gamma = param(g, nm, dt, 1, d, LOOM_INIT_ONES);
	snprintf(nm, sizeof(nm), "%s.bias", name);
	*beta = param(g, nm, dt, 1, d, LOOM_INIT_ZEROS);
	snprintf(nm, sizeof(nm), "%s.running_mean", name);
	loom_value rm = loom_buffer(g, nm, dt, 1, d, LOOM_INIT_ZEROS);
	snprintf(nm, sizeof(nm), "%s.running_var", name);
	loom_value rv = loom_buffer(g, nm, dt, 1, d, LOOM_INIT_ONES);
	return loom_set_name(g, loom_batchnorm2d(g, x, *gamma, *beta, rm, rv, 0.1, 1e-5), name);
}

loom_test_convnet loom_test_convnet_build(loom_graph *g, loom_dtype dt, int n, int hw,
					  int c1, int c2, int classes)
{
	loom_test_convnet m;
	int64_t xd[4] = { n, 1, hw, hw }, ld[1] = { n };
	m.image = loom_input(g, "image", dt, 4, xd);
	m.labels = loom_input(g, "labels", LOOM_I32, 1, ld);

	int64_t w1[4] = { c1, 1, 3, 3 }, b1[1] = { c1 };
	m.conv1_w = param(g, "conv1.weight", dt, 4, w1, LOOM_INIT_ZEROS);
	m.conv1_b = param(g, "conv1.bias", dt, 1, b1, LOOM_INIT_ZEROS);
	m.conv1 = loom_set_name(g, loom_conv2d(g, m.image, m.conv1_w, m.conv1_b, 1, 1), "conv1");
	loom_value h = bn(g, "bn1", m.conv1, dt, c1, &m.bn1_g, &m.bn1_b);
	h = loom_relu(g, h);
	m.pool1 = loom_maxpool2d(g, h, 2, 2, 0);

	int64_t w2[4] = { c2, c1, 3, 3 }, b2[1] = { c2 };
	m.conv2_w = param(g, "conv2.weight", dt, 4, w2, LOOM_INIT_ZEROS);
	m.conv2_b = param(g, "conv2.bias", dt, 1, b2, LOOM_INIT_ZEROS);
	m.conv2 = loom_set_name(g, loom_conv2d(g, m.pool1, m.conv2_w, m.conv2_b, 1, 1), "conv2");
	h = bn(g, "bn2", m.conv2, dt, c2, &m.bn2_g, &m.bn2_b);
	h = loom_relu(g, h);
	m.pool2 = loom_maxpool2d(g, h, 2, 2, 0);
	m.flat = loom_flatten(g, m.pool2);

	int64_t q = hw / 2 / 2;
	int64_t wf[2] = { classes, (int64_t)c2 * q * q }, bf[1] = { classes };
	m.fc_w = param(g, "fc.weight", dt, 2, wf, LOOM_INIT_ZEROS);
	m.fc_b = param(g, "fc.bias", dt, 1, bf, LOOM_INIT_ZEROS);
	m.logits = loom_set_name(g, loom_linear(g, m.flat, m.fc_w, m.fc_b), "fc");
	m.loss = loom_softmax_cross_entropy(g, m.logits, m.labels);
	return m;
}
