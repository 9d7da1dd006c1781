/*
 * examples/gpt_hf.h — Hugging Face GPT-2's config.json (GPT2Config) as
 * gpt_ddp's model: the sizes, the GELU and the layer norm's epsilon, read
 * with jansson; and where --init-from's weights and config are (a folder,
 * or a file with config.json beside it). Plain C over files, no engine
 * calls, so tests/fuzz can drive the parser alone. Errors come back as a
 * message naming the file and the key at fault.
 */
#ifndef LOOM_EXAMPLES_GPT_HF_H
#define LOOM_EXAMPLES_GPT_HF_H

#include <stddef.h>

/* The largest size a config may give (as gpt_ddp's flags: 2^24). */
#define GPT_HF_INT_MAX (1 << 24)
/* A config.json larger than this is refused unread (GPT-2's is 1 KiB). */
#define GPT_HF_CONFIG_MAX (1 << 20)

/* What of GPT2Config gpt_ddp's model follows. */
typedef struct gpt_hf_config {
	int n_layer, n_head, n_embd, vocab_size;
	int n_positions;           /* n_positions, else n_ctx (older files) */
	int gelu_tanh;             /* activation_function: gelu_new or gelu_pytorch_tanh 1, gelu 0 */
	char activation[32];       /* its value as the file spells it */
	double layer_norm_epsilon; /* GPT2Config's default 1e-5 when absent */
} gpt_hf_config;

/*
 * Parses config.json's text (len bytes, not NUL-terminated; name is the
 * path the messages give). Required: n_layer, n_head, n_embd, vocab_size
 * (integers from 1, vocab_size from 2, up to GPT_HF_INT_MAX) and
 * n_positions or n_ctx (equal when both are there); n_embd a multiple of
 * n_head. Optional, GPT2Config's defaults when absent: activation_function
 * ("gelu_new", the default, and "gelu_pytorch_tanh" are the tanh GELU,
 * "gelu" the exact one; any other is refused naming it),
 * layer_norm_epsilon (a number > 0 and < 1). Refused as a model gpt_ddp
 * does not build: model_type other than "gpt2", n_inner other than null or
 * 4 n_embd, scale_attn_weights false, scale_attn_by_inverse_layer_idx true,
 * tie_word_embeddings false. Other keys are ignored. 0, or -1 with err
 * ("PATH: n_layer: expected an integer from 1 to 16777216, got \"12\"").
 */
int gpt_hf_config_parse(const char *text, size_t len, const char *name, gpt_hf_config *out,
			char *err, size_t errlen);

/* The same from a file (a regular file of at most GPT_HF_CONFIG_MAX bytes). */
int gpt_hf_config_load(const char *path, gpt_hf_config *out, char *err, size_t errlen);

/*
 * --init-from ARG's files: ARG a folder: ARG/model.safetensors (which must
 * exist) and ARG/config.json (which must too: a folder is Hugging Face's
 * save_pretrained layout); ARG anything else: ARG itself and config.json in
 * its folder, if there. Writes the paths into weights and config. 1: a
 * config.json to read; 0: none (config is ""); -1 with err.
 */
int gpt_hf_paths(const char *arg, char *weights, size_t wlen, char *config, size_t clen,
		 char *err, size_t errlen);

#endif /* LOOM_EXAMPLES_GPT_HF_H */
