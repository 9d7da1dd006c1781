/*
 * examples/gpt_args.c — where gpt_ddp's own flags (rows of
 * base/options.def) go in gpt_cfg, and its defaults.
 */
#include "examples/gpt_args.h"

const gpt_cfg gpt_cfg_defaults = {
	.layers = 4, .heads = 4, .embd = 128, .context = 128, .sample = 200,
	.temperature = 0.8, .top_k = 40, .val_interval = 50, .val_batches = 4,
	.warmup_steps = 20, .dtype = LOOM_F32, .ln_eps = 1e-5,
};

const int gpt_set_rows[GPT_SET_COUNT] = { FLAG_LAYERS, FLAG_HEADS, FLAG_EMBD,
					  FLAG_CONTEXT, FLAG_VOCAB, FLAG_GELU };

#define GPT FLAG_PROG_GPT_DDP
#define AT(field) FLAG_AT(gpt_cfg, field)

static const flag_place gpt_places[] = {
	{ FLAG_TOKENS, GPT, AT(tokens) },
	{ FLAG_VAL_TOKENS, GPT, AT(val_tokens) },
	{ FLAG_LAYERS, GPT, AT(layers) },
	{ FLAG_HEADS, GPT, AT(heads) },
	{ FLAG_EMBD, GPT, AT(embd) },
	{ FLAG_CONTEXT, GPT, AT(context) },
	{ FLAG_PRESET, GPT, AT(preset), .values = (const int[]){ 1, 2, 3 } },
	{ FLAG_VOCAB, GPT, AT(vocab) },
	{ FLAG_GELU, GPT, AT(gelu_tanh) },
	{ FLAG_DTYPE, GPT, AT(dtype), .values = (const int[]){ LOOM_F32, LOOM_F64 } },
	{ FLAG_INIT, GPT, AT(init_file) },
	{ FLAG_SEQUENTIAL, GPT, AT(sequential) },
	{ FLAG_WARMUP_STEPS, GPT, AT(warmup_steps) },
	{ FLAG_CONSTANT_LR, GPT, AT(constant_lr) },
	{ FLAG_VAL_INTERVAL, GPT, AT(val_interval) },
	{ FLAG_VAL_BATCHES, GPT, AT(val_batches) },
	{ FLAG_SAMPLE, GPT, AT(sample) },
	{ FLAG_TEMPERATURE, GPT, AT(temperature) },
	{ FLAG_TOP_K, GPT, AT(top_k) },
	{ FLAG_EXPORT_FORMAT, GPT, AT(export_hf) },
	{ FLAG_LOSS_FILE, GPT, AT(loss_file) },
	{ FLAG_WRITE_LLMC, GPT, AT(llmc_out) },
	{ FLAG_WRITE_LOGITS, GPT, AT(logits_out) },
};

flag_target gpt_target(gpt_cfg *c, unsigned char *given)
{
	return (flag_target){ gpt_places, sizeof(gpt_places) / sizeof(gpt_places[0]), c, given };
}
