/*
 * tests/graph/nets.h — the small models the graph suites share, so that the
 * gradient check, the autodiff checks and the memory-plan checks all look at
 * the same ConvNet.
 */
#ifndef LOOM_TESTS_GRAPH_NETS_H
#define LOOM_TESTS_GRAPH_NETS_H

#include "loom.h"

/* What loom_test_convnet built: the loss and every leaf a test may touch. */
typedef struct loom_test_convnet {
	loom_value image, labels;
	loom_value conv1_w, conv1_b, bn1_g, bn1_b;
	loom_value conv2_w, conv2_b, bn2_g, bn2_b;
	loom_value fc_w, fc_b;
	loom_value conv1, pool1, conv2, pool2, flat, logits, loss;
} loom_test_convnet;

/*
 * conv(c1, 3x3 pad 1) - bn - relu - maxpool 2 - conv(c2, 3x3 pad 1) - bn - relu -
 * maxpool 2 - flatten - linear(classes) - softmax cross-entropy, on an input
 * "image" [n, 1, hw, hw] and "labels" [n]. Parameters start zero-initialised
 * except batch-norm scales (ones); tests write their own values.
 */
loom_test_convnet loom_test_convnet_build(loom_graph *g, loom_dtype dt, int n, int hw,
					  int c1, int c2, int classes);

#endif /* LOOM_TESTS_GRAPH_NETS_H */
