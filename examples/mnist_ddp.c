/*
 * examples/mnist_ddp.c — trains the classic data-parallel ConvNet (two
 * conv 5x5 + batch norm + relu + max-pool blocks and a linear classifier)
 * on Fashion-MNIST (or any MNIST-format directory), with apex-style mixed
 * precision, checkpoints and resume, data-parallel over processes: started
 * by `--nproc N`, by mpirun or with torchrun's variables, each rank trains
 * on its shard and the plan sums the gradients (comm/, graph/bucket_pass.c).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"
#include "comm/launch.h"
#include "engine/cuda/device.h"
#include "examples/mnist_ddp_args.h"
#include "examples/models.h"
#include "loom.h"
#include "loom_data.h"

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Test-set accuracy and mean loss, in eval mode (running statistics), over
 * every rank's shard: the sums are added across ranks, so each rank gets
 * the figure of one evaluation of the whole set. The sampler pads a shard
 * by repeating images so that all ranks have as many; those rows (position
 * rank + k * world past the end of the set) are not counted. */
static loom_status evaluate(loom_program *p, loom_loader *test, loom_value logits, int b,
			    float *img, int32_t *lab, float *out, loom_comm *c, int rank, int world,
			    int64_t n, double *acc, double *loss)
{
	double correct = 0, seen = 0;
	double lsum = 0;
	for (int64_t i = 0; i < loom_loader_num_batches(test); i++) {
		int count;
		loom_status st = loom_loader_get(test, i, img, lab, &count);
		if (st != LOOM_OK)
			return st;
		/* A final partial batch is padded; padded rows are not counted. */
		for (int r = count; r < b; r++) {
			memset(img + (size_t)r * 784, 0, 784 * sizeof(float));
			lab[r] = 0;
		}
		if ((st = loom_set_input(p, "image", img, LOOM_F32, (size_t)b * 784)) ||
		    (st = loom_set_input(p, "label", lab, LOOM_I32, b)) ||
		    (st = loom_run(p, LOOM_RUN_EVAL)) ||
		    (st = loom_read(p, logits, out, (size_t)b * 10)))
			return st;
		for (int r = 0; r < count; r++) {
			const float *z = out + r * 10;
			if (rank + (i * b + r) * (int64_t)world >= n)
				continue; /* a repeated image padding this shard */
			int arg = 0;
			double mx = z[0], s = 0;
			for (int k = 1; k < 10; k++)
				if (z[k] > z[arg])
					arg = k;
			mx = z[arg];
			for (int k = 0; k < 10; k++)
				s += exp(z[k] - mx);
			lsum += mx + log(s) - z[lab[r]];
			correct += arg == lab[r];
			seen++;
		}
	}
	double sums[3] = { correct, seen, lsum };
	if (world > 1) {
		loom_status st = loom_comm_allreduce(c, sums, 3, LOOM_F64);
		if (st != LOOM_OK)
			return st;
		correct = sums[0], seen = sums[1], lsum = sums[2];
	}
	*acc = seen ? (double)correct / seen : 0;
	*loss = seen ? lsum / seen : 0;
	return LOOM_OK;
}

/*
 * A checkpoint that cannot be written should stop the run before the first
 * epoch's work, not after it: the path must not be a directory, and the
 * directory it names must exist and be writable.
 */
static int check_checkpoint_path(const char *path)
{
	struct stat sb;
	if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
		fprintf(stderr, "mnist_ddp: --checkpoint %s is a directory, expected a file path\n",
			path);
		return -1;
	}
	const char *slash = strrchr(path, '/');
	char dir[4096];
	if (!slash)
		snprintf(dir, sizeof(dir), ".");
	else if ((size_t)(slash - path) >= sizeof(dir)) {
		fprintf(stderr, "mnist_ddp: --checkpoint %s: path too long\n", path);
		return -1;
	} else
		snprintf(dir, sizeof(dir), "%.*s", slash == path ? 1 : (int)(slash - path), path);
	if (stat(dir, &sb) != 0) {
		fprintf(stderr, "mnist_ddp: --checkpoint %s: directory %s: %s\n", path, dir,
			errno == ENOENT ? "does not exist" : strerror(errno));
		return -1;
	}
	if (!S_ISDIR(sb.st_mode)) {
		fprintf(stderr, "mnist_ddp: --checkpoint %s: %s is not a directory\n", path, dir);
		return -1;
	}
	if (access(dir, W_OK | X_OK) != 0) {
		fprintf(stderr, "mnist_ddp: --checkpoint %s: cannot write in directory %s: %s\n",
			path, dir, strerror(errno));
		return -1;
	}
	return 0;
}

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

/*
 * Where training stands, in global samples, beside the checkpoint (PATH
 * + ".cursor", written after it and renamed into place): the epoch and the
 * images all ranks together consumed in it, so that a run resumed at
 * another world size (another global batch) starts where this one stopped.
 */
static void cursor_path(char *buf, size_t len, const char *ckpt)
{
	snprintf(buf, len, "%s.cursor", ckpt);
}

static int cursor_save(const char *ckpt, int64_t epoch, int64_t samples)
{
	char path[4200], tmp[4300];
	cursor_path(path, sizeof(path), ckpt);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	FILE *f = fopen(tmp, "w");
	if (!f)
		return -1;
	int bad = fprintf(f, "epoch %lld samples %lld\n", (long long)epoch, (long long)samples) < 0;
	bad |= fclose(f) != 0;
	return bad || rename(tmp, path) != 0 ? -1 : 0;
}

static int cursor_load(const char *ckpt, int64_t *epoch, int64_t *samples)
{
	char path[4200];
	long long e, n;
	cursor_path(path, sizeof(path), ckpt);
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	int ok = fscanf(f, "epoch %lld samples %lld", &e, &n) == 2 && e >= 0 && n >= 0;
	fclose(f);
	if (!ok)
		return -1;
	*epoch = e;
	*samples = n;
	return 0;
}

int main(int argc, char **argv)
{
	/* --nproc N: this process becomes the launcher of N ranks. */
	int lrc = loom_launch_maybe(&argc, argv);
	if (lrc >= 0)
		return lrc;
	mnist_ddp_args a;
	char msg[512];
	switch (mnist_ddp_parse_args(argc, argv, &a, msg, sizeof(msg))) {
	case MNIST_DDP_RUN: break;
	case MNIST_DDP_HELP: mnist_ddp_usage(stdout); return 0;
	default: fprintf(stderr, "mnist_ddp: %s\n", msg); return 2;
	}
	if (a.checkpoint && check_checkpoint_path(a.checkpoint))
		return 1;

	/* The group: mpirun's, torchrun's variables (the launcher sets them),
	 * or one process. Only rank 0 prints progress; errors go to stderr
	 * from every rank. */
	loom_pg *pg = NULL;
	loom_comm_options co = { .bootstrap = LOOM_COMM_BOOT_AUTO };
	/* Training on a GPU: NCCL on this rank's GPU (LOCAL_RANK's). */
	co.want_device = a.device == LOOM_DEVICE_CUDA ||
			 (a.device == LOOM_DEVICE_AUTO && loom_cuda_available());
	if (loom_pg_init(&co, &pg) != LOOM_OK) {
		fprintf(stderr, "mnist_ddp: %s\n", loom_pg_error(pg));
		loom_pg_free(pg);
		return 1;
	}
	int rank = loom_pg_get_info(pg)->rank, world = loom_pg_get_info(pg)->world;
	loom_comm *host = loom_pg_comm(pg, LOOM_COMM_HOST);
	if (rank > 0 && !freopen("/dev/null", "w", stdout)) {
		fprintf(stderr, "mnist_ddp: rank %d: cannot quiet stdout\n", rank);
		loom_pg_free(pg);
		return 1;
	}

	char err[512];
	loom_dataset train = { 0 }, test = { 0 };
	loom_sampler *train_s = NULL, *test_s = NULL;
	loom_loader *train_l = NULL, *test_l = NULL;
	loom_graph *g = NULL;
	loom_program *p = NULL;
	float *img = NULL, *out = NULL;
	int32_t *lab = NULL;
	int rc = 1;

	if (loom_mnist_load(a.data, "train", &train, err, sizeof(err)) ||
	    loom_mnist_load(a.data, "t10k", &test, err, sizeof(err))) {
		fprintf(stderr, "mnist_ddp: %s\n", err);
		goto out;
	}
	if (check_split(a.data, "train", &train) || check_split(a.data, "t10k", &test))
		goto out;
	/* The graph is built for one batch size, and the loader drops the last
	 * partial batch of an epoch: a training set smaller than one batch
	 * would train on nothing. */
	if (train.n < a.batch) {
		if (train.n == 0)
			fprintf(stderr, "mnist_ddp: the training set in %s is empty: nothing to "
				"train on\n", a.data);
		else
			fprintf(stderr, "mnist_ddp: --batch-size %d is larger than the training set "
				"in %s (%lld images): pass --batch-size %lld or less\n", a.batch,
				a.data, (long long)train.n, (long long)train.n);
		goto out;
	}
	if (test.n == 0)
		printf("the test set in %s is empty: nothing to evaluate, training only\n", a.data);
	/* Each rank reads its shard (DistributedSampler's); the batch size is
	 * per rank, as in DDP. */
	if (loom_sampler_new(train.n, rank, world, 1, a.seed, 0, &train_s, err, sizeof(err)) ||
	    loom_sampler_new(test.n, rank, world, 0, 0, 0, &test_s, err, sizeof(err)) ||
	    loom_loader_new(&train, train_s, a.batch, 1, LOOM_FASHION_MNIST_MEAN,
			    LOOM_FASHION_MNIST_STD, &train_l, err, sizeof(err)) ||
	    loom_loader_new(&test, test_s, a.batch, 0, LOOM_FASHION_MNIST_MEAN,
			    LOOM_FASHION_MNIST_STD, &test_l, err, sizeof(err))) {
		fprintf(stderr, "mnist_ddp: %s\n", err);
		goto out;
	}
	loom_sampler_set_epoch(test_s, 0);

	loom_value logits;
	if (loom_graph_new(&g) != LOOM_OK) {
		fprintf(stderr, "mnist_ddp: out of memory\n");
		goto out;
	}
	loom_graph_set_seed(g, a.seed);
	loom_value loss = loom_model_convnet(g, a.batch, &logits);

	if (a.threads)
		loom_cpu_set_threads(a.threads);
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = a.device;
	o.optim.kind = a.optim;
	o.optim.lr = a.lr;
	o.optim.momentum = a.optim == LOOM_OPTIM_SGD ? a.momentum : 0;
	o.optim.weight_decay = a.weight_decay;
	o.amp.level = a.level;
	o.amp.half = a.half;
	o.amp.static_scale = a.loss_scale;
	o.amp.keep_batchnorm_fp32 = a.keep_bn_fp32;
	o.pg = pg;
	loom_status cst = loom_compile(g, loss, &o, &p);
	if (cst == LOOM_ERR_NOMEM) {
		fprintf(stderr, "mnist_ddp: --batch-size %d needs more memory than there is: %s\n",
			a.batch, loom_last_error());
		goto out;
	} else if (cst != LOOM_OK) {
		fprintf(stderr, "mnist_ddp: %s\n", loom_last_error());
		goto out;
	}
	if (a.dump_graph)
		loom_program_dump(p, stdout);
	if (a.dump_plan && rank == 0) { /* one writer */
		FILE *df = fopen(a.dump_plan, "w");
		if (!df) {
			fprintf(stderr, "mnist_ddp: --dump-plan %s: %s\n", a.dump_plan, strerror(errno));
			goto out;
		}
		loom_program_dump_dot(p, df);
		if (fclose(df) != 0) {
			fprintf(stderr, "mnist_ddp: --dump-plan %s: %s\n", a.dump_plan, strerror(errno));
			goto out;
		}
	}
	loom_program_info info;
	loom_program_info_get(p, &info);
	printf("loom mnist_ddp: %s, %s, opt level O%d%s, %s lr %g, batch %d%s, %d epochs\n",
	       info.backend, a.data, a.level,
	       a.level == LOOM_O0 ? "" : a.half == LOOM_BF16 ? " (bf16)" : " (fp16)",
	       a.optim == LOOM_OPTIM_SGD ? "sgd" : "adamw", a.lr, a.batch,
	       world > 1 ? " per rank" : "", a.epochs);
	if (world > 1)
		printf("data parallel: %d ranks (%s), global batch %d\n", world,
		       loom_comm_bootstrap_name(loom_pg_get_info(pg)->how), a.batch * world);
	if (!strncmp(info.backend, "cpu", 3)) {
		char cpu[128];
		printf("%s\n", loom_cpu_describe(cpu, sizeof(cpu)));
	}
	if (a.memory_report)
		loom_program_memory_report(p, stdout);
	printf("model: %lld parameters; memory planned before step 1: %.2f MiB arena "
	       "(params %.2f, master %.2f, grads %.2f, optimizer %.2f, activations %.2f MiB)\n",
	       (long long)info.n_param_elems, info.arena_bytes / 1048576.0,
	       info.param_bytes / 1048576.0, info.master_bytes / 1048576.0,
	       info.grad_bytes / 1048576.0, info.optim_state_bytes / 1048576.0,
	       info.activation_bytes / 1048576.0);

	int64_t per_epoch = loom_loader_num_batches(train_l);
	int64_t step = 0, first_epoch = 0;
	if (a.resume) {
		if (access(a.checkpoint, F_OK) != 0) {
			printf("resume: %s does not exist yet, starting fresh\n", a.checkpoint);
		} else if (loom_load(p, a.checkpoint) != LOOM_OK) {
			fprintf(stderr, "mnist_ddp: %s\n", loom_program_error(p));
			goto out;
		} else {
			/* Every training run either stepped or was skipped (AMP
			 * overflow): together they count the batches consumed. */
			loom_program_info_get(p, &info);
			step = loom_step_count(p) + info.skipped_steps;
			/* The cursor is in global samples: at another world size
			 * the same images are behind us, in other batches. */
			int64_t ce, cs;
			if (cursor_load(a.checkpoint, &ce, &cs) == 0) {
				first_epoch = ce;
				step = ce * per_epoch + cs / ((int64_t)a.batch * world);
			} else {
				first_epoch = step / per_epoch;
			}
			printf("resumed %s at step %lld (epoch %lld, batch %lld), loss scale %g\n",
			       a.checkpoint, (long long)step, (long long)(first_epoch + 1),
			       (long long)(step - first_epoch * per_epoch), info.loss_scale);
		}
	}

	img = malloc(sizeof(float) * (size_t)a.batch * 784);
	out = malloc(sizeof(float) * (size_t)a.batch * 10);
	lab = malloc(sizeof(int32_t) * (size_t)a.batch);
	if (!img || !out || !lab) {
		fprintf(stderr, "mnist_ddp: out of memory\n");
		goto out;
	}

	int64_t batches_done = step;
	for (int epoch = (int)first_epoch; epoch < a.epochs; epoch++) {
		double lr = a.lr;
		if (a.lr_step > 0)
			lr = a.lr * pow(a.lr_gamma, epoch / a.lr_step);
		loom_set_lr(p, lr);
		loom_sampler_set_epoch(train_s, epoch);
		double t0 = now(), tlog = t0, lsum = 0;
		int64_t correct = 0, seen = 0, since = 0;
		int64_t b_next = 0; /* the batch of this epoch to run next */
		int stop = 0;
		int64_t b0 = epoch == first_epoch ? batches_done - first_epoch * per_epoch : 0;
		if (b0 > per_epoch)
			b0 = per_epoch;
		for (int64_t b = b0; b < per_epoch; b++) {
			int count;
			loom_status st;
			if ((st = loom_loader_get(train_l, b, img, lab, &count)) != LOOM_OK) {
				fprintf(stderr, "mnist_ddp: %s\n", loom_loader_error(train_l));
				goto out;
			}
			if ((st = loom_set_input(p, "image", img, LOOM_F32, (size_t)a.batch * 784)) ||
			    (st = loom_set_input(p, "label", lab, LOOM_I32, a.batch)) ||
			    (st = loom_run(p, LOOM_RUN_TRAIN)) ||
			    (st = loom_read(p, logits, out, (size_t)a.batch * 10))) {
				fprintf(stderr, "mnist_ddp: step %lld: %s\n", (long long)batches_done,
					loom_program_error(p));
				goto out;
			}
			for (int i = 0; i < count; i++) {
				int arg = 0;
				for (int k = 1; k < 10; k++)
					if (out[i * 10 + k] > out[i * 10 + arg])
						arg = k;
				correct += arg == lab[i];
			}
			seen += count;
			lsum += loom_loss(p);
			since++;
			batches_done++;
			if (batches_done % a.log_interval == 0) {
				double t = now();
				loom_program_info_get(p, &info);
				/* Rank 0's loss and accuracy; the batch and the
				 * images/s are global (every rank steps together). */
				printf("epoch %d step %5lld/%lld  loss %.4f  train acc %5.2f%%  batch %d  "
				       "%7.0f img/s  lr %g  loss scale %g  skipped %lld\n",
				       epoch + 1, (long long)(b + 1), (long long)per_epoch, lsum / since,
				       100.0 * correct / seen, a.batch * world,
				       since * a.batch * world / (t - tlog), lr,
				       info.loss_scale, (long long)info.skipped_steps);
				if (info.amp_report && info.amp_report[0])
					printf("amp: first non-finite value from %s\n", info.amp_report);
				fflush(stdout);
				tlog = t;
				lsum = 0;
				since = 0;
			}
			if (a.save_every && batches_done % a.save_every == 0 && b + 1 < per_epoch &&
			    rank == 0) {
				if (loom_save(p, a.checkpoint) != LOOM_OK ||
				    cursor_save(a.checkpoint, epoch, (b + 1) * (int64_t)a.batch * world)) {
					fprintf(stderr, "mnist_ddp: %s\n", loom_program_error(p));
					goto out;
				}
				printf("saved %s (step %lld)\n", a.checkpoint, (long long)batches_done);
			}
			b_next = b + 1;
			if (a.max_steps && batches_done >= a.max_steps) {
				stop = 1;
				break;
			}
		}
		double train_s_el = now() - t0;
		double acc, tloss;
		char test_part[96] = "no test images to evaluate";
		if (test.n > 0) {
			if (evaluate(p, test_l, logits, a.batch, img, lab, out, host, rank, world,
				     test.n, &acc, &tloss)) {
				fprintf(stderr, "mnist_ddp: evaluation: %s%s\n", loom_program_error(p),
					loom_pg_error(pg));
				goto out;
			}
			snprintf(test_part, sizeof(test_part), "test loss %.4f, test accuracy %.2f%%",
				 tloss, 100 * acc);
		}
		loom_program_info_get(p, &info);
		printf("epoch %d done: %s, train %.1f s (%.0f img/s), loss scale %g, "
		       "skipped steps %lld\n",
		       epoch + 1, test_part, train_s_el,
		       seen * (double)world / (train_s_el > 0 ? train_s_el : 1), info.loss_scale,
		       (long long)info.skipped_steps);
		if (a.checkpoint && rank == 0) {
			if (loom_save(p, a.checkpoint) != LOOM_OK ||
			    cursor_save(a.checkpoint, stop && b_next < per_epoch ? epoch : epoch + 1,
					stop && b_next < per_epoch ? b_next * (int64_t)a.batch * world : 0)) {
				fprintf(stderr, "mnist_ddp: %s\n", loom_program_error(p));
				goto out;
			}
			printf("saved %s (step %lld)\n", a.checkpoint, (long long)loom_step_count(p));
		}
		fflush(stdout);
		if (stop)
			break;
	}
	rc = 0;
out:
	free(img);
	free(out);
	free(lab);
	loom_program_free(p);
	loom_graph_free(g);
	loom_loader_free(train_l);
	loom_loader_free(test_l);
	loom_sampler_free(train_s);
	loom_sampler_free(test_s);
	loom_dataset_free(&train);
	loom_dataset_free(&test);
	loom_pg_free(pg);
	return rc;
}
