/*
 * examples/mnist_ddp.c — trains the classic data-parallel ConvNet (two
 * conv 5x5 + batch norm + relu + max-pool blocks and a linear classifier)
 * on Fashion-MNIST (or any MNIST-format directory), with apex-style mixed
 * precision, checkpoints and resume, data-parallel over processes: started
 * by `--nproc N`, by mpirun or with torchrun's variables, each rank trains
 * on its shard and the plan sums the gradients (comm/, graph/bucket_pass.c).
 * The loop, the flags and the reports are examples/train.c's.
 */
#include <stdio.h>
#include <string.h>

#include "examples/models.h"
#include "examples/train.h"
#include "loom.h"
#include "loom_data.h"

/* The ConvNet takes 28x28 images; name the split and the file when a split
 * holds another size. */
static int check_split(const char *dir, const char *split, const loom_dataset *ds)
{
	if (ds->h == 28 && ds->w == 28)
		return 0;
	fprintf(stderr, "mnist_ddp: %s/%s-images-idx3-ubyte: the %s images are %dx%d, the "
		"ConvNet expects 28x28\n", dir, split, strcmp(split, "train") ? "test" : "training",
		ds->h, ds->w);
	return -1;
}

int main(int argc, char **argv)
{
	train_run t;
	int rc = train_start(&t, &train_mnist_ddp, argc, argv);
	if (rc >= 0)
		return rc;
	const train_args *a = &t.a;

	char err[512];
	train_data d = { 0 };
	loom_dataset *train = &d.train, *test = &d.test;
	loom_graph *g = NULL;
	rc = 1;

	if (loom_mnist_load(a->data, "train", train, err, sizeof(err)) ||
	    loom_mnist_load(a->data, "t10k", test, err, sizeof(err))) {
		fprintf(stderr, "mnist_ddp: %s\n", err);
		goto out;
	}
	if (check_split(a->data, "train", train) || check_split(a->data, "t10k", test))
		goto out;
	/* The graph is built for one batch size, and the loader drops the last
	 * partial batch of an epoch: a training set smaller than one batch
	 * would train on nothing. */
	if (train->n < a->batch) {
		if (train->n == 0)
			fprintf(stderr, "mnist_ddp: the training set in %s is empty: nothing to "
				"train on\n", a->data);
		else
			fprintf(stderr, "mnist_ddp: --batch-size %d is larger than the training set "
				"in %s (%lld images): pass --batch-size %lld or less\n", a->batch,
				a->data, (long long)train->n, (long long)train->n);
		goto out;
	}
	if (test->n == 0)
		printf("the test set in %s is empty: nothing to evaluate, training only\n", a->data);
	if (train_data_shard(&t, &d, LOOM_FASHION_MNIST_MEAN, LOOM_FASHION_MNIST_STD))
		goto out;

	loom_value logits;
	if (!(g = train_graph_new(&t)))
		goto out;
	loom_value loss = loom_model_convnet(g, train_graph_batch(&t), &logits);
	t.names = loom_convnet_torch_names; /* --init-from, --export: PyTorch's names */
	t.n_names = LOOM_CONVNET_TORCH_NAMES;
	rc = train_compile_fit(&t, &d, g, loss, logits, 10, a->data);
out:
	train_end(&t);
	loom_graph_free(g);
	train_data_free(&d);
	return rc;
}
