/*
 * examples/cifar_ddp.c — trains ResNet-18 or ResNet-34 (CIFAR stem) on
 * CIFAR-10 as the PyTorch data-parallel tutorials do: SGD with momentum and
 * weight decay, step or cosine learning rate, random crop and flip done on
 * the loader's thread, per-channel normalisation, test accuracy every epoch
 * over all ranks, checkpoints and resume; --synthetic for machines without
 * the data. The loop, the flags and the launchers are examples/train.c's.
 */
#include <stdio.h>
#include <string.h>

#include "examples/models.h"
#include "examples/train.h"
#include "loom.h"
#include "loom_data.h"

/* Where the binary version of CIFAR-10 is published. */
#define CIFAR10_URL "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"

/* The real data, or generated images of its shape; --train-images and
 * --test-images keep the first N of a split. */
static int load(const train_args *a, loom_dataset *train, loom_dataset *test, char *err,
		size_t errlen)
{
	if (a->synthetic) {
		/* As many as CIFAR-10 holds unless fewer are asked for: generating
		 * 60,000 images to keep 500 is wasted start-up. */
		int64_t ntrain = a->train_images ? a->train_images : 50000;
		int64_t ntest = a->test_images ? a->test_images : 10000;
		if (loom_synthetic_load(ntrain, 3, 32, 32, 10, a->seed, train, err, errlen) ||
		    loom_synthetic_load(ntest, 3, 32, 32, 10, a->seed + 1, test, err, errlen))
			return -1;
	} else {
		loom_status st = loom_cifar10_load(a->data, "train", train, err, errlen);
		if (st == LOOM_OK)
			st = loom_cifar10_load(a->data, "test", test, err, errlen);
		if (st == LOOM_ERR_NOT_FOUND) {
			size_t n = strlen(err);
			snprintf(err + n, errlen - n,
				 "\ncifar_ddp: --data %s must hold data_batch_1.bin, data_batch_2.bin, "
				 "data_batch_3.bin, data_batch_4.bin, data_batch_5.bin and "
				 "test_batch.bin: download %s and pass the folder it unpacks to "
				 "(cifar-10-batches-bin), or train on generated images with --synthetic",
				 a->data, CIFAR10_URL);
		}
		if (st != LOOM_OK)
			return -1;
	}
	if (a->train_images && a->train_images < train->n)
		train->n = a->train_images;
	if (a->test_images && a->test_images < test->n)
		test->n = a->test_images;
	return 0;
}

int main(int argc, char **argv)
{
	train_run t;
	int rc = train_start(&t, &train_cifar_ddp, argc, argv);
	if (rc >= 0)
		return rc;
	const train_args *a = &t.a;
	static const float mean[3] = LOOM_CIFAR10_MEAN, std[3] = LOOM_CIFAR10_STD;

	char err[768], what[512];
	train_data d = { 0 };
	loom_dataset *train = &d.train, *test = &d.test;
	loom_graph *g = NULL;
	rc = 1;

	if (load(a, train, test, err, sizeof(err))) {
		fprintf(stderr, "cifar_ddp: %s\n", err);
		goto out;
	}
	/* The graph is built for one batch size and the loader drops the last
	 * partial batch: each rank needs one whole batch of its shard. */
	if (train->n < (int64_t)a->batch * t.world) {
		fprintf(stderr, "cifar_ddp: --batch-size %d at %d rank%s needs %lld training images, "
			"%s has %lld\n", a->batch, t.world, t.world > 1 ? "s" : "",
			(long long)a->batch * t.world, a->synthetic ? "--synthetic" : a->data,
			(long long)train->n);
		goto out;
	}
	if (train_data_shard(&t, &d, 0, 1))
		goto out;
	/* Augmentation only for training; what an image gets depends on (seed,
	 * epoch, image), so any number of ranks sees the same crops. */
	if (loom_loader_set_normalize(d.train_l, mean, std) ||
	    loom_loader_set_normalize(d.test_l, mean, std) ||
	    (a->augment && loom_loader_set_augment(d.train_l, 4, 1, a->seed))) {
		fprintf(stderr, "cifar_ddp: %s\n", loom_loader_error(d.train_l));
		goto out;
	}

	loom_value logits;
	if (!(g = train_graph_new(&t)))
		goto out;
	loom_value loss = loom_model_resnet_width(g, a->depth, train_graph_batch(&t), 32, 10, a->width, &logits);
	snprintf(what, sizeof(what), "ResNet-%d%s on %s (%lld train, %lld test images%s)",
		 a->depth, a->width == 64 ? "" : " (narrow)", a->synthetic ? "synthetic data" : a->data,
		 (long long)train->n, (long long)test->n, a->augment ? ", crop+flip" : "");
	rc = train_compile_fit(&t, &d, g, loss, logits, 10, what);
out:
	train_end(&t);
	loom_graph_free(g);
	train_data_free(&d);
	return rc;
}
