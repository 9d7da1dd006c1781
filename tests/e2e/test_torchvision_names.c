/*
 * tests/e2e/test_torchvision_names.c — loom's ResNet-18 and ResNet-50
 * (ImageNet stem, 1000 classes) export exactly torchvision's state_dict:
 * the same names, dtypes and shapes as the committed lists
 * (tests/e2e/golden/resnet*_torchvision_keys.txt, written by
 * tools/torchvision_to_safetensors.py --keys), no more, no fewer, so that a
 * converted torchvision checkpoint loads strictly and loom's export goes
 * into torchvision's model. No Python runs.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/safetensors.h"
#include "examples/models.h"
#include "loom.h"
#include "loom_io.h"

static void compare(int depth, const char *keys)
{
	loom_graph *g;
	loom_program *p;
	loom_value logits;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_value loss = loom_model_resnet(g, depth, 1, 224, 1000, &logits);
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.inference = 1;
	cr_assert_eq(loom_compile(g, loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	loom_graph_free(g);
	char path[4096];
	const char *base = getenv("TEST_TMPDIR");
	snprintf(path, sizeof(path), "%s/resnet%d-XXXXXX", base && base[0] ? base : "/tmp", depth);
	int fd = mkstemp(path);
	cr_assert(fd >= 0, "%s", strerror(errno));
	close(fd);
	cr_assert_eq(loom_export_safetensors(p, path, NULL), LOOM_OK, "%s", loom_program_error(p));
	loom_program_free(p);

	char err[512];
	loom_st_file *f = NULL;
	cr_assert_eq(loom_st_read(path, &f, err, sizeof(err)), LOOM_OK, "%s", err);
	unlink(path);
	FILE *k = fopen(keys, "r");
	cr_assert_not_null(k, "%s: %s", keys, strerror(errno));
	char line[512];
	int n = 0;
	while (fgets(line, sizeof(line), k)) {
		char *save, *name = strtok_r(line, " \n", &save), *dt = strtok_r(NULL, " \n", &save);
		cr_assert(name && dt, "%s: a line without a name and dtype", keys);
		const loom_st_tensor *t = loom_st_find(f, name);
		cr_expect_not_null(t, "loom's ResNet-%d has no '%s'", depth, name);
		n++;
		if (!t)
			continue;
		cr_expect_str_eq(loom_st_dtype_name(t->dtype), dt, "%s", name);
		int nd = 0;
		for (char *d = strtok_r(NULL, " \n", &save); d; d = strtok_r(NULL, " \n", &save), nd++)
			cr_expect(nd < t->ndim && t->dims[nd] == atoll(d),
				  "%s: dim %d is %lld in loom, %s in torchvision", name, nd,
				  nd < t->ndim ? (long long)t->dims[nd] : -1LL, d);
		cr_expect_eq(nd, t->ndim, "%s: %d dims in loom, %d in torchvision", name, t->ndim, nd);
	}
	fclose(k);
	cr_expect_eq(loom_st_count(f), n, "loom exports %d tensors, torchvision's state_dict has %d",
		     loom_st_count(f), n);
	loom_st_free(f);
}

Test(torchvision_names, resnet18) { compare(18, "tests/e2e/golden/resnet18_torchvision_keys.txt"); }
Test(torchvision_names, resnet50) { compare(50, "tests/e2e/golden/resnet50_torchvision_keys.txt"); }
