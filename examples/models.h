/*
 * examples/models.h — reference models built on the public API, shared by
 * the examples, the benchmarks and the end-to-end tests so that they all
 * train the very same graph.
 */
#ifndef LOOM_EXAMPLES_MODELS_H
#define LOOM_EXAMPLES_MODELS_H

#include "loom.h"
#include "loom_io.h"

/*
 * The classic data-parallel ConvNet for 28x28 single-channel images:
 * conv 5x5 16ch + batch norm + relu + max-pool 2, conv 5x5 32ch + batch norm
 * + relu + max-pool 2, linear 1568 -> 10. Inputs "image" [batch, 1, 28, 28]
 * f32 and "label" [batch] i32. Returns the mean cross-entropy loss; *logits
 * (marked as an output) gets the [batch, 10] scores. On bad input the graph
 * holds the error and LOOM_NONE is returned.
 */
loom_value loom_model_convnet(loom_graph *g, int batch, loom_value *logits);

/*
 * The ConvNet's names as PyTorch's state_dict has them for the same model
 * written with nn.Sequential (the tutorial's: layer1 = Sequential(Conv2d,
 * BatchNorm2d, ReLU, MaxPool2d), layer2 the same, fc): conv1 is layer1.0,
 * bn1 layer1.1, conv2 layer2.0, bn2 layer2.1; fc is fc. loom keeps its own
 * names inside (each initial value is drawn from its name's stream, and the
 * committed goldens hold those values); loom_weights_opts.names takes this.
 */
#define LOOM_CONVNET_TORCH_NAMES 4
extern const loom_name_map loom_convnet_torch_names[LOOM_CONVNET_TORCH_NAMES];

/* loom_weights_opts_default with the ConvNet's PyTorch names. */
void loom_convnet_weights_opts(loom_weights_opts *o);

/*
 * ResNet (He et al. 2015, torchvision's layout, v1.5: a bottleneck's stride
 * sits on its 3x3 conv). depth 18 or 34: basic blocks; 50: bottlenecks.
 * Inputs "image" [batch, 3, size, size] f32 and "label" [batch] i32.
 * size <= 64: the CIFAR stem (3x3 conv, stride 1, no max-pool), as ResNets on
 * 32x32 images are usually built; larger: the ImageNet stem (7x7/2 conv,
 * 3x3/2 max-pool). Convolutions have no bias (batch norm follows each).
 * Returns the cross-entropy loss; *logits gets [batch, classes]. Another
 * depth returns LOOM_NONE and builds nothing.
 */
loom_value loom_model_resnet(loom_graph *g, int depth, int batch, int size, int classes,
			     loom_value *logits);

/* The same with `base` channels in the first stage instead of 64 (each later
 * stage doubles them): narrow ResNets train the same code paths in a
 * fraction of the time, for smoke tests. base < 1 returns LOOM_NONE. */
loom_value loom_model_resnet_width(loom_graph *g, int depth, int batch, int size, int classes,
				   int base, loom_value *logits);

#endif /* LOOM_EXAMPLES_MODELS_H */
