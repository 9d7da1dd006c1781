/*
 * tests/fuzz/fuzz_args.c — libFuzzer target for the training examples'
 * command line (examples/train_args.c). Byte 0 picks the program (mnist_ddp,
 * cifar_ddp, resnet50_synthetic: their flag groups differ); the rest is split
 * at NUL bytes into arguments after argv[0]. Whatever they say, the parser
 * returns: run with settings in their documented ranges, help, or a refusal
 * with a message.
 */
#include "fuzz_common.h"

#include <stdint.h>
#include <string.h>

#include "examples/train_args.h"

#define MAX_ARGS 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const train_program *progs[] = { &train_mnist_ddp, &train_cifar_ddp,
						&train_resnet50_synthetic, &train_gpt_ddp };
	const train_program *prog;
	char *buf, *argv[MAX_ARGS + 2], msg[512];
	int argc = 0;
	train_args a;

	if (size == 0)
		return 0;
	prog = progs[data[0] % (sizeof(progs) / sizeof(progs[0]))];
	data++;
	size--;
	buf = malloc(size + 1);
	FUZZ_CHECK(buf);
	memcpy(buf, data, size);
	buf[size] = 0;
	argv[argc++] = (char *)prog->name;
	for (size_t i = 0; i < size && argc <= MAX_ARGS; i += strlen(buf + i) + 1)
		argv[argc++] = buf + i;
	argv[argc] = NULL;

	switch (train_parse_args(prog, argc, argv, &a, msg, sizeof(msg))) {
	case TRAIN_RUN:
		FUZZ_CHECK(a.epochs >= 1 && a.epochs <= 100000);
		FUZZ_CHECK(a.batch >= 1 && a.batch <= 1 << 20);
		FUZZ_CHECK(a.log_interval >= 1);
		FUZZ_CHECK(a.save_every >= 0 && a.max_steps >= 0 && a.lr_step >= 0);
		FUZZ_CHECK(a.level >= LOOM_O0 && a.level <= LOOM_O3);
		FUZZ_CHECK(a.loss_scale >= 0);
		FUZZ_CHECK(a.keep_bn_fp32 >= -1 && a.keep_bn_fp32 <= 1);
		FUZZ_CHECK(a.data || !(prog->groups & TRAIN_FLAGS_DATA));
		FUZZ_CHECK(!(a.resume || a.save_every) || a.checkpoint);
		if (prog->groups & TRAIN_FLAGS_RESNET) {
			FUZZ_CHECK(a.depth == 18 || a.depth == 34 || a.depth == 50);
			FUZZ_CHECK(a.depth != 50 || (prog->groups & TRAIN_FLAGS_BENCH));
			FUZZ_CHECK(a.width >= 1 && a.size >= 8);
		}
		FUZZ_CHECK(a.steps >= 0 && a.warmup >= 0);
		FUZZ_CHECK(a.train_images >= 0 && a.test_images >= 0);
		FUZZ_CHECK(a.warmup_epochs >= 0 && (a.warmup_epochs == 0 || a.warmup_epochs < a.epochs));
		FUZZ_CHECK(a.schedule == TRAIN_LR_STEP || a.schedule == TRAIN_LR_COSINE);
		FUZZ_CHECK((unsigned)a.pipe_balance < LOOM_BALANCE_COUNT &&
			   (a.pipeline > 1 || a.pipe_balance == LOOM_BALANCE_TIME));
		break;
	case TRAIN_HELP:
		break;
	case TRAIN_BAD:
		FUZZ_CHECK(msg[0] != 0);
		break;
	default:
		FUZZ_CHECK(!"an unknown status");
	}
	free(buf);
	return 0;
}
