/*
 * examples/models.h — reference models built on the public API, shared by
 * the examples, the benchmarks and the end-to-end tests so that they all
 * train the very same graph.
 */
#ifndef LOOM_EXAMPLES_MODELS_H
#define LOOM_EXAMPLES_MODELS_H

#include "loom.h"

/*
 * The classic data-parallel ConvNet for 28x28 single-channel images:
 * conv 5x5 16ch + batch norm + relu + max-pool 2, conv 5x5 32ch + batch norm
 * + relu + max-pool 2, linear 1568 -> 10. Inputs "image" [batch, 1, 28, 28]
 * f32 and "label" [batch] i32. Returns the mean cross-entropy loss; *logits
 * (marked as an output) gets the [batch, 10] scores. On bad input the graph
 * holds the error and LOOM_NONE is returned.
 */
loom_value loom_model_convnet(loom_graph *g, int batch, loom_value *logits);

#endif /* LOOM_EXAMPLES_MODELS_H */
