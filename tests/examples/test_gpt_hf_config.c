/*
 * tests/examples/test_gpt_hf_config.c — examples/gpt_hf.c: GPT2Config's
 * config.json as gpt_ddp's model (sizes, GELU, epsilon, the defaults of
 * absent keys), each refusal naming the file and the key, and where
 * --init-from's weights and config are.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "examples/gpt_hf.h"

#define SIZES "\"n_layer\": 2, \"n_head\": 2, \"n_embd\": 32, \"vocab_size\": 256"

static int parse(const char *text, gpt_hf_config *c, char *err)
{
	err[0] = 0;
	return gpt_hf_config_parse(text, strlen(text), "dir/config.json", c, err, 512);
}

/* The parse fails and its message holds want. */
static void refused(const char *text, const char *want)
{
	gpt_hf_config c;
	char err[512];
	cr_assert_eq(parse(text, &c, err), -1, "accepted: %s", text);
	cr_assert(strstr(err, want), "'%s' lacks '%s'", err, want);
	cr_assert(strstr(err, "dir/config.json"), "'%s' does not name the file", err);
	cr_assert_eq(c.n_layer, 0);
}

Test(gpt_hf_config, gpt2_as_save_pretrained_writes_it)
{
	gpt_hf_config c;
	char err[512];
	cr_assert_eq(parse("{\"activation_function\": \"gelu_new\", \"model_type\": \"gpt2\", " SIZES
			   ", \"n_positions\": 32, \"n_ctx\": 32, \"n_inner\": null, "
			   "\"layer_norm_epsilon\": 1e-05, \"tie_word_embeddings\": true, "
			   "\"scale_attn_weights\": true, \"architectures\": [\"GPT2LMHeadModel\"]}",
			   &c, err), 0, "%s", err);
	cr_assert_eq(c.n_layer, 2);
	cr_assert_eq(c.n_head, 2);
	cr_assert_eq(c.n_embd, 32);
	cr_assert_eq(c.vocab_size, 256);
	cr_assert_eq(c.n_positions, 32);
	cr_assert_eq(c.gelu_tanh, 1);
	cr_assert_str_eq(c.activation, "gelu_new");
	cr_assert_eq(c.layer_norm_epsilon, 1e-5);
}

/* The shape of the Hub's gpt2/config.json: dropouts, token ids, the
 * summary head's keys and a nested task_specific_params, all ignored. */
Test(gpt_hf_config, the_hubs_gpt2_124m)
{
	gpt_hf_config c;
	char err[512];
	cr_assert_eq(parse("{\"activation_function\": \"gelu_new\", \"architectures\": "
			   "[\"GPT2LMHeadModel\"], \"attn_pdrop\": 0.1, \"bos_token_id\": 50256, "
			   "\"embd_pdrop\": 0.1, \"eos_token_id\": 50256, \"initializer_range\": 0.02, "
			   "\"layer_norm_epsilon\": 1e-05, \"model_type\": \"gpt2\", \"n_ctx\": 1024, "
			   "\"n_embd\": 768, \"n_head\": 12, \"n_layer\": 12, \"n_positions\": 1024, "
			   "\"resid_pdrop\": 0.1, \"summary_activation\": null, "
			   "\"summary_first_dropout\": 0.1, \"summary_proj_to_labels\": true, "
			   "\"summary_type\": \"cls_index\", \"summary_use_proj\": true, "
			   "\"task_specific_params\": {\"text-generation\": {\"do_sample\": true, "
			   "\"max_length\": 50}}, \"vocab_size\": 50257}", &c, err), 0, "%s", err);
	cr_assert_eq(c.n_layer, 12);
	cr_assert_eq(c.n_head, 12);
	cr_assert_eq(c.n_embd, 768);
	cr_assert_eq(c.n_positions, 1024);
	cr_assert_eq(c.vocab_size, 50257);
	cr_assert_eq(c.gelu_tanh, 1);
}

Test(gpt_hf_config, absent_keys_take_gpt2configs_defaults)
{
	gpt_hf_config c;
	char err[512];
	/* n_ctx alone (older files); gelu_new and 1e-5 as GPT2Config. */
	cr_assert_eq(parse("{" SIZES ", \"n_ctx\": 1024, \"n_inner\": 128}", &c, err), 0, "%s", err);
	cr_assert_eq(c.n_positions, 1024);
	cr_assert_eq(c.gelu_tanh, 1);
	cr_assert_str_eq(c.activation, "gelu_new");
	cr_assert_eq(c.layer_norm_epsilon, 1e-5);
}

Test(gpt_hf_config, activations)
{
	gpt_hf_config c;
	char err[512];
	cr_assert_eq(parse("{" SIZES ", \"n_positions\": 8, \"activation_function\": \"gelu\"}", &c,
			   err), 0, "%s", err);
	cr_assert_eq(c.gelu_tanh, 0);
	cr_assert_eq(parse("{" SIZES ", \"n_positions\": 8, \"activation_function\": "
			   "\"gelu_pytorch_tanh\", \"layer_norm_epsilon\": 1}", &c, err), -1);
	cr_assert(strstr(err, "layer_norm_epsilon: expected a number > 0 and < 1, got 1"), "%s", err);
	cr_assert_eq(parse("{" SIZES ", \"n_positions\": 8, \"activation_function\": "
			   "\"gelu_pytorch_tanh\", \"layer_norm_epsilon\": 0.001}", &c, err), 0, "%s", err);
	cr_assert_eq(c.gelu_tanh, 1);
	cr_assert_eq(c.layer_norm_epsilon, 0.001);
	refused("{" SIZES ", \"n_positions\": 8, \"activation_function\": \"relu\"}",
		"activation_function \"relu\": gpt_ddp has gelu_new");
	refused("{" SIZES ", \"n_positions\": 8, \"activation_function\": 1}",
		"activation_function: expected a string, got 1");
}

Test(gpt_hf_config, malformed_names_file_and_key)
{
	refused("", "not JSON (line 1, column 0");
	refused("{\"n_layer\": 2,}", "not JSON (line 1");
	refused("[1, 2]", "expected a JSON object");
	refused("{\"n_layer\": 2, \"n_layer\": 3}", "not JSON");
	refused("{\"n_layer\": \"12\", \"n_head\": 2}",
		"n_layer: expected an integer from 1 to 16777216, got \"12\"");
	refused("{\"n_layer\": 12.0}", "n_layer: expected an integer");
	refused("{\"n_layer\": 0}", "n_layer: expected an integer from 1");
	refused("{\"n_layer\": 16777217}", "n_layer: expected an integer from 1 to 16777216");
	refused("{\"n_layer\": 2, \"n_embd\": 32, \"vocab_size\": 256}", "no n_head");
	refused("{\"n_layer\": 2, \"n_head\": 2, \"n_embd\": 32, \"vocab_size\": 1}",
		"vocab_size: expected an integer from 2");
	refused("{" SIZES "}", "no n_positions (nor n_ctx)");
	refused("{" SIZES ", \"n_positions\": 32, \"n_ctx\": 16}", "n_positions 32 and n_ctx 16 disagree");
	refused("{" SIZES ", \"n_positions\": [32]}", "n_positions: expected an integer");
	refused("{\"n_layer\": 2, \"n_head\": 3, \"n_embd\": 32, \"vocab_size\": 256, \"n_positions\": 8}",
		"n_embd 32 is not divisible by n_head 3");
	refused("{" SIZES ", \"n_positions\": 8, \"layer_norm_epsilon\": \"1e-5\"}",
		"layer_norm_epsilon: expected a number");
	refused("{" SIZES ", \"n_positions\": 8, \"tie_word_embeddings\": 1}",
		"tie_word_embeddings: expected true or false, got 1");
}

Test(gpt_hf_config, models_gpt_ddp_does_not_build)
{
	refused("{" SIZES ", \"n_positions\": 8, \"model_type\": \"llama\"}", "model_type \"llama\"");
	refused("{" SIZES ", \"n_positions\": 8, \"n_inner\": 64}", "n_inner 64: gpt_ddp's MLP is 4 n_embd (128)");
	refused("{" SIZES ", \"n_positions\": 8, \"tie_word_embeddings\": false}", "tie_word_embeddings false");
	refused("{" SIZES ", \"n_positions\": 8, \"scale_attn_weights\": false}", "scale_attn_weights false");
	refused("{" SIZES ", \"n_positions\": 8, \"scale_attn_by_inverse_layer_idx\": true}",
		"scale_attn_by_inverse_layer_idx true");
}

Test(gpt_hf_config, load_and_paths)
{
	char dir[] = "/tmp/gpt_hf_config.XXXXXX", w[4096], c[4096], err[512], p[4200];
	gpt_hf_config h;
	cr_assert(mkdtemp(dir));
	/* A folder without the weights, then without the config. */
	cr_assert_eq(gpt_hf_paths(dir, w, sizeof(w), c, sizeof(c), err, sizeof(err)), -1);
	cr_assert(strstr(err, "a folder without model.safetensors"), "%s", err);
	snprintf(p, sizeof(p), "%s/model.safetensors", dir);
	FILE *f = fopen(p, "w");
	cr_assert(f);
	fclose(f);
	cr_assert_eq(gpt_hf_paths(dir, w, sizeof(w), c, sizeof(c), err, sizeof(err)), -1);
	cr_assert(strstr(err, "a folder without config.json"), "%s", err);
	/* The file alone: no config. */
	cr_assert_eq(gpt_hf_paths(p, w, sizeof(w), c, sizeof(c), err, sizeof(err)), 0);
	cr_assert_str_eq(w, p);
	cr_assert_str_eq(c, "");
	snprintf(p, sizeof(p), "%s/config.json", dir);
	cr_assert((f = fopen(p, "w")));
	fprintf(f, "{" SIZES ", \"n_positions\": 16}\n");
	fclose(f);
	/* The folder (a trailing slash too) and the file: both paths. */
	snprintf(p, sizeof(p), "%s/", dir);
	cr_assert_eq(gpt_hf_paths(p, w, sizeof(w), c, sizeof(c), err, sizeof(err)), 1, "%s", err);
	snprintf(p, sizeof(p), "%s/model.safetensors", dir);
	cr_assert_str_eq(w, p);
	cr_assert_eq(gpt_hf_paths(p, w, sizeof(w), c, sizeof(c), err, sizeof(err)), 1, "%s", err);
	cr_assert_str_eq(w, p);
	snprintf(p, sizeof(p), "%s/config.json", dir);
	cr_assert_str_eq(c, p);
	cr_assert_eq(gpt_hf_config_load(c, &h, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(h.n_positions, 16);
	/* Not a regular file; absent. */
	cr_assert_eq(gpt_hf_config_load(dir, &h, err, sizeof(err)), -1);
	cr_assert(strstr(err, "not a regular file"), "%s", err);
	unlink(p);
	cr_assert_eq(gpt_hf_config_load(p, &h, err, sizeof(err)), -1);
	cr_assert(strstr(err, "config.json: No such file"), "%s", err);
	snprintf(p, sizeof(p), "%s/model.safetensors", dir);
	unlink(p);
	rmdir(dir);
}
