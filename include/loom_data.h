/*
 * loom_data.h — data input for loom: IDX files (MNIST, Fashion-MNIST, raw or
 * gzip), a rank-aware sampler with torch.utils.data.DistributedSampler
 * semantics, a batch loader that normalises into NCHW floats, and a
 * prefetching wrapper that fills the next batch on a thread of its own.
 *
 * Errors: every call that can fail returns a loom_status. Objects keep the
 * message of their last failure (loom_*_error). Calls without an object
 * (loads, constructors) leave theirs, naming the file or the argument at
 * fault, in loom_last_error() (include/loom.h), and also in the (err,
 * errlen) buffer they take where err is not NULL. Nothing here aborts or
 * exits on a user's mistake.
 */
#ifndef LOOM_DATA_H
#define LOOM_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "loom.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Where the Debian package dataset-fashion-mnist installs the four files. */
#define LOOM_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"

/* Per-channel statistics of the Fashion-MNIST training images (x / 255). */
#define LOOM_FASHION_MNIST_MEAN 0.2860f
#define LOOM_FASHION_MNIST_STD 0.3530f

/* ---------------------------------------------------------------- IDX */

/* The IDX format allows 255 dims; real files use 1 to 4. */
#define LOOM_IDX_MAX_DIMS 8

/* IDX element types (the third byte of the magic number). */
#define LOOM_IDX_UBYTE 0x08

typedef struct loom_idx {
	int type;                         /* LOOM_IDX_UBYTE */
	int ndim;                         /* 1 .. LOOM_IDX_MAX_DIMS */
	int64_t dims[LOOM_IDX_MAX_DIMS];  /* outermost first */
	size_t count;                     /* product of dims */
	uint8_t *data;                    /* count elements, owned */
} loom_idx;

/*
 * Reads an IDX file, raw or gzip-compressed (detected from its content, not
 * its name). Checks the magic number (0x00 0x00 type ndim), that the type is
 * unsigned byte, that every dim is read, and that the payload holds exactly
 * the product of the dims: a short file and trailing bytes are both errors.
 * On success *idx owns its data (loom_idx_free); on failure *idx is empty
 * and err names the file and the fault. LOOM_ERR_NOT_FOUND: no such file;
 * LOOM_ERR_IO: unreadable; LOOM_ERR_FORMAT: malformed; LOOM_ERR_UNSUPPORTED:
 * a valid IDX type other than unsigned byte.
 */
loom_status loom_idx_load(const char *path, loom_idx *idx, char *err,
			  size_t errlen);
/* Frees idx->data and empties *idx. Safe on an empty or zeroed idx. */
void loom_idx_free(loom_idx *idx);

/* ---------------------------------------------------------------- datasets */

/* Images in memory, N x C x H x W bytes, one label per image. A plain struct:
 * tests and synthetic sources may fill one themselves. */
typedef struct loom_dataset {
	int64_t n;        /* images */
	int c, h, w;      /* channels, height, width */
	int classes;      /* labels lie in [0, classes) */
	uint8_t *images;  /* n * c * h * w */
	int32_t *labels;  /* n */
} loom_dataset;

/*
 * Loads the MNIST-format split ("train" or "t10k") from dir, NULL meaning
 * LOOM_FASHION_MNIST_DIR: <split>-images-idx3-ubyte[.gz] (N x H x W) and
 * <split>-labels-idx1-ubyte[.gz] (N), the raw file preferred when both exist.
 * Image and label counts must agree and every label must be below 10.
 * A missing dir is LOOM_ERR_NOT_FOUND with a message that names the
 * Debian package dataset-fashion-mnist. On failure *ds is empty.
 */
loom_status loom_mnist_load(const char *dir, const char *split,
			    loom_dataset *ds, char *err, size_t errlen);
/* Frees what loom_mnist_load allocated and empties *ds. */
void loom_dataset_free(loom_dataset *ds);

/*
 * Loads a CIFAR-10 split from dir, the unpacked binary distribution
 * (cifar-10-batches-bin): "train" reads data_batch_1.bin .. data_batch_5.bin,
 * "test" reads test_batch.bin. Each file holds whole records of 1 label byte
 * (0..9) and 3072 pixel bytes (R, G, B planes of 32x32); the real files hold
 * 10,000 records each, smaller ones are accepted. A missing directory or
 * file, a size that is not a whole number of records, or a label out of
 * range is an error naming the file (and, for a missing one, what to
 * download). ds becomes n x 3 x 32 x 32 with 10 classes; on failure it is
 * empty.
 */
loom_status loom_cifar10_load(const char *dir, const char *split,
			      loom_dataset *ds, char *err, size_t errlen);

/* Per-channel statistics of the CIFAR-10 training images (x / 255). */
#define LOOM_CIFAR10_MEAN { 0.4914f, 0.4822f, 0.4465f }
#define LOOM_CIFAR10_STD { 0.2470f, 0.2435f, 0.2616f }

/*
 * n random images of c x h x w bytes with labels in [0, classes), the same
 * bytes for the same seed on every machine: for benchmarks and smoke runs
 * on machines without the real data (--synthetic).
 */
loom_status loom_synthetic_load(int64_t n, int c, int h, int w, int classes,
				uint64_t seed, loom_dataset *ds, char *err,
				size_t errlen);

/* ---------------------------------------------------------------- sampler */

/*
 * Which indices of a data set of n items rank `rank` of `world` visits in an
 * epoch, as torch.utils.data.DistributedSampler:
 * - shuffle: a permutation of [0, n) that depends only on (seed, epoch);
 *   otherwise 0, 1, ..., n-1.
 * - drop_last = 0: the permutation is padded by repeating its start until
 *   its length divides by world; every rank gets ceil(n / world) indices.
 *   drop_last = 1: the tail is dropped; every rank gets floor(n / world).
 * - rank r takes items r, r + world, r + 2 world, ... of that list.
 */
typedef struct loom_sampler loom_sampler;

/* Creates a sampler at epoch 0. world >= 1, 0 <= rank < world, n >= 0;
 * otherwise LOOM_ERR_INVALID and *out is NULL. */
loom_status loom_sampler_new(int64_t n, int rank, int world, int shuffle,
			     uint64_t seed, int drop_last, loom_sampler **out,
			     char *err, size_t errlen);
void loom_sampler_free(loom_sampler *s);

/* Recomputes this rank's indices for epoch (>= 0). Call it before every
 * epoch, on every rank with the same value, as with DistributedSampler. */
loom_status loom_sampler_set_epoch(loom_sampler *s, int64_t epoch);
int64_t loom_sampler_epoch(const loom_sampler *s);

/* Indices this rank visits per epoch: ceil or floor of n / world. */
int64_t loom_sampler_len(const loom_sampler *s);
/* The size of the data set the sampler was made for. */
int64_t loom_sampler_size(const loom_sampler *s);
/* How many of this rank's indices come before its padding: the first
 * loom_sampler_len_unpadded of loom_sampler_indices are this rank's own
 * share of the n items; the rest (at most one, without drop_last) repeat
 * items other ranks visit, so that every rank has as many. A sum over the
 * ranks (an evaluation's correct count and loss) takes only these, and then
 * counts every item exactly once. */
int64_t loom_sampler_len_unpadded(const loom_sampler *s);
/* This rank's indices for the current epoch, loom_sampler_len of them;
 * valid until the next set_epoch or free. */
const int64_t *loom_sampler_indices(const loom_sampler *s);

const char *loom_sampler_error(const loom_sampler *s);

/* ---------------------------------------------------------------- loader */

/*
 * Cuts the sampler's indices into batches of batch_size and converts each
 * image to floats, (x / 255 - mean) / std, in NCHW. The loader borrows ds
 * and s: both must outlive it, and the sampler's epoch is the loader's.
 */
typedef struct loom_loader loom_loader;

/* s must be built for ds->n items; batch_size >= 1; std > 0. drop_last
 * leaves out the final partial batch. */
loom_status loom_loader_new(const loom_dataset *ds, const loom_sampler *s,
			    int batch_size, int drop_last, float mean,
			    float std, loom_loader **out, char *err,
			    size_t errlen);
void loom_loader_free(loom_loader *l);

/* Per-channel normalisation: channel c becomes (x / 255 - mean[c]) / std[c]
 * (ds->c values each, every std > 0), replacing the loader's single pair. */
loom_status loom_loader_set_normalize(loom_loader *l, const float *mean,
				      const float *std);

/*
 * The standard CIFAR training augmentation: a random crop of the image's own
 * size from the image zero-padded by pad on every side (pad 4 for CIFAR),
 * and a horizontal flip with probability 1/2 when flip. What an item gets is
 * decided by (seed, the sampler's epoch, the item's index in the data set)
 * alone, so runs are reproducible on any number of ranks and threads.
 * pad 0 and flip 0 turn it off (the default).
 */
loom_status loom_loader_set_augment(loom_loader *l, int pad, int flip,
				    uint64_t seed);

/* Batches per epoch (for this rank). */
int64_t loom_loader_num_batches(const loom_loader *l);
int loom_loader_batch_size(const loom_loader *l);
/* Floats per image, c * h * w: images must hold batch_size times that. */
size_t loom_loader_image_elems(const loom_loader *l);

/*
 * Fills batch `batch` (0 <= batch < num_batches) of the current epoch:
 * images with *count * c * h * w floats, labels with *count labels.
 * *count is batch_size except for a final partial batch.
 * LOOM_ERR_INVALID for a batch out of range or a NULL buffer.
 */
loom_status loom_loader_get(loom_loader *l, int64_t batch, float *images,
			    int32_t *labels, int *count);

const char *loom_loader_error(const loom_loader *l);

/* ---------------------------------------------------------------- prefetch */

/*
 * Overlaps loading with compute: a thread fills the next batch of the epoch
 * into one of two buffers while the caller works on the other.
 */
typedef struct loom_prefetch loom_prefetch;

/* Starts the worker thread; it waits for loom_prefetch_start. Borrows l. */
loom_status loom_prefetch_new(loom_loader *l, loom_prefetch **out, char *err,
			      size_t errlen);
/* Stops and joins the worker, then frees. */
void loom_prefetch_free(loom_prefetch *p);

/*
 * The sampler's epoch must not change while the worker may read it: change
 * it only before the first start, after next has reported the end of the
 * epoch, or after loom_prefetch_stop.
 */

/* Begins the sampler's current epoch at batch 0, abandoning any epoch in
 * progress. */
loom_status loom_prefetch_start(loom_prefetch *p);

/* Abandons the epoch in progress and returns once the worker is idle. */
loom_status loom_prefetch_stop(loom_prefetch *p);

/*
 * Hands out the next batch of the epoch, waiting for it if needed. The
 * pointers stay valid until the next call to next, start, stop or free. At the end
 * of the epoch returns LOOM_OK with *count = 0 and NULL pointers. A failure
 * of the loader is returned here, with its message in loom_prefetch_error;
 * LOOM_ERR_STATE when no epoch was started (or it was stopped).
 */
loom_status loom_prefetch_next(loom_prefetch *p, const float **images,
			       const int32_t **labels, int *count);

/*
 * Caller-given buffers: the worker converts each batch straight into the
 * buffers the caller hands over for it (a program's input buffers,
 * loom_input_buffer, which may be the device's pinned staging slot), not
 * into two of its own, so the batch meets no copy on its way to the step.
 * After loom_prefetch_start, loom_prefetch_give hands over the buffers of
 * the epoch's batches in order, images batch_size * image_elems floats and
 * labels batch_size labels; batch k is filled once its buffers are given,
 * and loom_prefetch_next hands back those same pointers. At most two given
 * batches are in use at a time (the one the caller holds and the next):
 * give batch k+1's after next returned batch k. next for a batch without
 * buffers is LOOM_ERR_STATE (it would wait forever); so is give on a
 * prefetcher made by loom_prefetch_new, with no epoch started, past the
 * epoch's last batch, or a third in use. start and stop forget the given
 * buffers not yet handed back by next: they stay the caller's.
 */
loom_status loom_prefetch_new_given(loom_loader *l, loom_prefetch **out, char *err,
				    size_t errlen);
loom_status loom_prefetch_give(loom_prefetch *p, float *images, int32_t *labels);

const char *loom_prefetch_error(const loom_prefetch *p);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_DATA_H */
