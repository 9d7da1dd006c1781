/*
 * tests/fuzz/fuzz_gpt_hf.c — libFuzzer target for gpt_ddp's reader of
 * Hugging Face GPT-2's config.json (examples/gpt_hf.c): the input is the
 * file, given to gpt_hf_config_parse as a buffer of exactly its size (ASan
 * sees a read past the end; the text is not NUL-terminated) and, when byte
 * 0 bit 0 is set, to gpt_hf_config_load through a memfd too, which must
 * agree. A parse either succeeds with a model gpt_ddp can build (sizes in
 * range, the width a multiple of the heads, a known GELU, an epsilon in
 * (0, 1)) or fails with a message naming the file and leaves nothing set.
 */
#include "fuzz_common.h"

#include <stdint.h>
#include <string.h>

#include "examples/gpt_hf.h"

static void check(int rc, const gpt_hf_config *c, const char *err)
{
	if (rc != 0) {
		FUZZ_CHECK(rc == -1 && err[0] && strstr(err, "fuzz") == err);
		FUZZ_CHECK(c->n_layer == 0 && c->n_head == 0 && c->activation[0] == 0);
		return;
	}
	FUZZ_CHECK(c->n_layer >= 1 && c->n_layer <= GPT_HF_INT_MAX);
	FUZZ_CHECK(c->n_head >= 1 && c->n_head <= GPT_HF_INT_MAX);
	FUZZ_CHECK(c->n_embd >= 1 && c->n_embd <= GPT_HF_INT_MAX && c->n_embd % c->n_head == 0);
	FUZZ_CHECK(c->vocab_size >= 2 && c->vocab_size <= GPT_HF_INT_MAX);
	FUZZ_CHECK(c->n_positions >= 1 && c->n_positions <= GPT_HF_INT_MAX);
	FUZZ_CHECK(c->layer_norm_epsilon > 0 && c->layer_norm_epsilon < 1);
	FUZZ_CHECK(memchr(c->activation, 0, sizeof(c->activation)));
	if (c->gelu_tanh)
		FUZZ_CHECK(!strcmp(c->activation, "gelu_new") ||
			   !strcmp(c->activation, "gelu_pytorch_tanh"));
	else
		FUZZ_CHECK(!strcmp(c->activation, "gelu"));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char err[512], err2[512], path[64];
	gpt_hf_config c, c2;

	if (size < 1)
		return 0;
	size_t n = size - 1;
	char *b = malloc(n ? n : 1);
	FUZZ_CHECK(b);
	memcpy(b, data + 1, n);
	err[0] = 0;
	int rc = gpt_hf_config_parse(b, n, "fuzz", &c, err, sizeof(err));
	check(rc, &c, err);
	if (data[0] & 1) {
		int fd = fuzz_memfile(b, n, path, sizeof(path));
		err2[0] = 0;
		int rc2 = gpt_hf_config_load(path, &c2, err2, sizeof(err2));
		FUZZ_CHECK(rc2 == rc);
		if (rc == 0)
			FUZZ_CHECK(!memcmp(&c, &c2, sizeof(c)));
		close(fd);
	}
	free(b);
	return 0;
}
