/*
 * tests/fuzz/fuzz_args.c — libFuzzer target for mnist_ddp's command line
 * (examples/mnist_ddp_args.c). The input is split at NUL bytes into
 * arguments after argv[0]. Whatever they say, the parser returns: run with
 * settings in their documented ranges, help, or a refusal with a message.
 */
#include "fuzz_common.h"

#include <stdint.h>
#include <string.h>

#include "examples/mnist_ddp_args.h"

#define MAX_ARGS 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *buf = malloc(size + 1), *argv[MAX_ARGS + 2], msg[512];
	int argc = 0;
	mnist_ddp_args a;

	FUZZ_CHECK(buf);
	memcpy(buf, data, size);
	buf[size] = 0;
	argv[argc++] = "mnist_ddp";
	for (size_t i = 0; i < size && argc <= MAX_ARGS; i += strlen(buf + i) + 1)
		argv[argc++] = buf + i;
	argv[argc] = NULL;

	switch (mnist_ddp_parse_args(argc, argv, &a, msg, sizeof(msg))) {
	case MNIST_DDP_RUN:
		FUZZ_CHECK(a.epochs >= 1 && a.epochs <= 100000);
		FUZZ_CHECK(a.batch >= 1 && a.batch <= 1 << 20);
		FUZZ_CHECK(a.log_interval >= 1);
		FUZZ_CHECK(a.save_every >= 0 && a.max_steps >= 0 && a.lr_step >= 0);
		FUZZ_CHECK(a.level >= LOOM_O0 && a.level <= LOOM_O3);
		FUZZ_CHECK(a.loss_scale >= 0);
		FUZZ_CHECK(a.keep_bn_fp32 >= -1 && a.keep_bn_fp32 <= 1);
		FUZZ_CHECK(a.data && (!(a.resume || a.save_every) || a.checkpoint));
		break;
	case MNIST_DDP_HELP:
		break;
	case MNIST_DDP_BAD:
		FUZZ_CHECK(msg[0] != 0);
		break;
	default:
		FUZZ_CHECK(!"an unknown status");
	}
	free(buf);
	return 0;
}
