/*
 * examples/gpt_hf.c — Hugging Face GPT-2's config.json read for gpt_ddp
 * (gpt_hf.h): GPT2Config's keys that size and shape the model, checked one
 * by one so that a message names the file, the key and the value.
 */
#include "examples/gpt_hf.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

static int say(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return -1;
}

/* A JSON value as the message quotes it: compact, at most 60 characters. */
static void quote(const json_t *v, char *buf, size_t len)
{
	char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
	if (!s) {
		snprintf(buf, len, "(a value)");
		return;
	}
	if (strlen(s) > 60)
		snprintf(buf, len, "%.57s...", s);
	else
		snprintf(buf, len, "%s", s);
	free(s);
}

/* Key k of o, an integer from lo to GPT_HF_INT_MAX. 1 read, 0 absent, -1. */
static int get_int(const json_t *o, const char *name, const char *k, int lo, int *out, char *err,
		   size_t errlen)
{
	const json_t *v = json_object_get(o, k);
	char q[64];
	if (!v)
		return 0;
	if (!json_is_integer(v) || json_integer_value(v) < lo ||
	    json_integer_value(v) > GPT_HF_INT_MAX) {
		quote(v, q, sizeof(q));
		return say(err, errlen, "%s: %s: expected an integer from %d to %d, got %s", name,
			   k, lo, GPT_HF_INT_MAX, q);
	}
	*out = (int)json_integer_value(v);
	return 1;
}

static int need_int(const json_t *o, const char *name, const char *k, int lo, int *out, char *err,
		    size_t errlen)
{
	int rc = get_int(o, name, k, lo, out, err, errlen);
	if (rc == 0)
		return say(err, errlen, "%s: no %s (GPT2Config's sizes: n_layer, n_head, n_embd, "
			   "vocab_size, n_positions)", name, k);
	return rc < 0 ? -1 : 0;
}

/* Key k of o, a boolean that must be `want` for the model gpt_ddp builds
 * (absent: GPT2Config's default, which is). */
static int want_bool(const json_t *o, const char *name, const char *k, int want, const char *why,
		     char *err, size_t errlen)
{
	const json_t *v = json_object_get(o, k);
	char q[64];
	if (!v)
		return 0;
	if (!json_is_boolean(v)) {
		quote(v, q, sizeof(q));
		return say(err, errlen, "%s: %s: expected true or false, got %s", name, k, q);
	}
	if (json_is_true(v) != want)
		return say(err, errlen, "%s: %s %s: gpt_ddp's GPT-2 %s", name, k,
			   want ? "false" : "true", why);
	return 0;
}

/* activation_function: GPT2Config's default is gelu_new. */
static int get_activation(const json_t *o, const char *name, gpt_hf_config *c, char *err,
			  size_t errlen)
{
	const json_t *v = json_object_get(o, "activation_function");
	char q[64];
	const char *s = "gelu_new";
	if (v && !json_is_string(v)) {
		quote(v, q, sizeof(q));
		return say(err, errlen, "%s: activation_function: expected a string, got %s", name, q);
	}
	if (v)
		s = json_string_value(v);
	if (!strcmp(s, "gelu_new") || !strcmp(s, "gelu_pytorch_tanh"))
		c->gelu_tanh = 1;
	else if (!strcmp(s, "gelu"))
		c->gelu_tanh = 0;
	else {
		quote(v, q, sizeof(q));
		return say(err, errlen, "%s: activation_function %s: gpt_ddp has gelu_new and "
			   "gelu_pytorch_tanh (--gelu tanh) and gelu (--gelu erf)", name, q);
	}
	snprintf(c->activation, sizeof(c->activation), "%s", s);
	return 0;
}

/* What GPT2Config may say that gpt_ddp's model is not. */
static int check_unsupported(const json_t *o, const char *name, const gpt_hf_config *c,
			     char *err, size_t errlen)
{
	const json_t *v = json_object_get(o, "model_type");
	char q[64];
	if (v && (!json_is_string(v) || strcmp(json_string_value(v), "gpt2"))) {
		quote(v, q, sizeof(q));
		return say(err, errlen, "%s: model_type %s: gpt_ddp reads GPT-2 (\"gpt2\")", name, q);
	}
	v = json_object_get(o, "n_inner");
	if (v && !json_is_null(v) &&
	    (!json_is_integer(v) || json_integer_value(v) != 4 * (json_int_t)c->n_embd)) {
		quote(v, q, sizeof(q));
		return say(err, errlen, "%s: n_inner %s: gpt_ddp's MLP is 4 n_embd (%lld) wide "
			   "(null)", name, q, 4 * (long long)c->n_embd);
	}
	if (want_bool(o, name, "scale_attn_weights", 1, "scales attention by 1/sqrt(head size)",
		      err, errlen) ||
	    want_bool(o, name, "scale_attn_by_inverse_layer_idx", 0,
		      "does not scale attention by layer", err, errlen) ||
	    want_bool(o, name, "tie_word_embeddings", 1, "ties lm_head to wte", err, errlen))
		return -1;
	return 0;
}

static int parse_object(const json_t *o, const char *name, gpt_hf_config *c, char *err,
			size_t errlen)
{
	int pos = 0, ctx = 0, rc;
	if (need_int(o, name, "n_layer", 1, &c->n_layer, err, errlen) ||
	    need_int(o, name, "n_head", 1, &c->n_head, err, errlen) ||
	    need_int(o, name, "n_embd", 1, &c->n_embd, err, errlen) ||
	    need_int(o, name, "vocab_size", 2, &c->vocab_size, err, errlen))
		return -1;
	if ((rc = get_int(o, name, "n_positions", 1, &pos, err, errlen)) < 0)
		return -1;
	int has_pos = rc;
	if ((rc = get_int(o, name, "n_ctx", 1, &ctx, err, errlen)) < 0)
		return -1;
	if (!has_pos && !rc)
		return say(err, errlen, "%s: no n_positions (nor n_ctx): the context", name);
	if (has_pos && rc && pos != ctx)
		return say(err, errlen, "%s: n_positions %d and n_ctx %d disagree", name, pos, ctx);
	c->n_positions = has_pos ? pos : ctx;
	if (c->n_embd % c->n_head)
		return say(err, errlen, "%s: n_embd %d is not divisible by n_head %d", name,
			   c->n_embd, c->n_head);
	if (get_activation(o, name, c, err, errlen))
		return -1;
	const json_t *v = json_object_get(o, "layer_norm_epsilon");
	c->layer_norm_epsilon = 1e-5;
	if (v) {
		double e = json_is_number(v) ? json_number_value(v) : -1;
		if (!(e > 0 && e < 1)) {
			char q[64];
			quote(v, q, sizeof(q));
			return say(err, errlen, "%s: layer_norm_epsilon: expected a number > 0 and "
				   "< 1, got %s", name, q);
		}
		c->layer_norm_epsilon = e;
	}
	return check_unsupported(o, name, c, err, errlen);
}

int gpt_hf_config_parse(const char *text, size_t len, const char *name, gpt_hf_config *out,
			char *err, size_t errlen)
{
	json_error_t je;
	gpt_hf_config c = { 0 };
	memset(out, 0, sizeof(*out));
	json_t *o = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
	if (!o)
		return say(err, errlen, "%s: not JSON (line %d, column %d: %s)", name, je.line,
			   je.column, je.text);
	int rc = json_is_object(o) ? parse_object(o, name, &c, err, errlen) :
				     say(err, errlen, "%s: expected a JSON object (GPT2Config)", name);
	json_decref(o);
	if (rc == 0)
		*out = c;
	return rc;
}

int gpt_hf_config_load(const char *path, gpt_hf_config *out, char *err, size_t errlen)
{
	struct stat st;
	char *buf = NULL;
	int rc = -1;
	memset(out, 0, sizeof(*out));
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return say(err, errlen, "%s: %s", path, strerror(errno));
	if (fstat(fd, &st) != 0) {
		say(err, errlen, "%s: %s", path, strerror(errno));
		goto out_close;
	}
	if (!S_ISREG(st.st_mode) || st.st_size > GPT_HF_CONFIG_MAX) {
		say(err, errlen, "%s: %s", path, S_ISREG(st.st_mode) ?
			"larger than 1 MiB: no GPT2Config" : "not a regular file");
		goto out_close;
	}
	size_t n = (size_t)st.st_size, got = 0;
	if (!(buf = malloc(n ? n : 1))) {
		say(err, errlen, "%s: out of memory", path);
		goto out_close;
	}
	while (got < n) {
		ssize_t r = read(fd, buf + got, n - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			say(err, errlen, "%s: %s", path, r < 0 ? strerror(errno) : "shorter than its size");
			goto out_free_buf;
		}
		got += (size_t)r;
	}
	rc = gpt_hf_config_parse(buf, n, path, out, err, errlen);
out_free_buf:
	free(buf);
out_close:
	close(fd);
	return rc;
}

int gpt_hf_paths(const char *arg, char *weights, size_t wlen, char *config, size_t clen,
		 char *err, size_t errlen)
{
	struct stat st;
	config[0] = 0;
	if (stat(arg, &st) == 0 && S_ISDIR(st.st_mode)) {
		size_t n = strlen(arg);
		while (n > 1 && arg[n - 1] == '/')
			n--;
		if ((size_t)snprintf(weights, wlen, "%.*s/model.safetensors", (int)n, arg) >= wlen ||
		    (size_t)snprintf(config, clen, "%.*s/config.json", (int)n, arg) >= clen)
			return say(err, errlen, "%s: the path is too long", arg);
		if (access(weights, F_OK) != 0)
			return say(err, errlen, "%s: a folder without model.safetensors (Hugging "
				   "Face's save_pretrained layout)", arg);
		if (access(config, F_OK) != 0)
			return say(err, errlen, "%s: a folder without config.json (Hugging Face's "
				   "save_pretrained layout)", arg);
		return 1;
	}
	if ((size_t)snprintf(weights, wlen, "%s", arg) >= wlen)
		return say(err, errlen, "%s: the path is too long", arg);
	const char *slash = strrchr(arg, '/');
	int n = slash ? (int)(slash - arg) : 0;
	if ((size_t)snprintf(config, clen, "%.*s%sconfig.json", n, arg,
			     slash ? "/" : "") >= clen)
		return say(err, errlen, "%s: the path is too long", arg);
	if (access(config, F_OK) != 0) {
		config[0] = 0;
		return 0;
	}
	return 1;
}
