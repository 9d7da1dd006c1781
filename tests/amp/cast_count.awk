# tests/amp/cast_count.awk — reads a --dump-graph plan and prints one line:
# "casts N between_half M unfolded K unexplained U", where N counts the standalone casts
# on activations (a cast node whose source is not a parameter, input or
# buffer, and that is not a parameter's gradient), M those between two ops
# that compute in half (the cast's producer and one of its kernel readers;
# views and casts looked through; a node marked "(f32 inside)" computes in fp32), K
# the narrowing casts loom_fuse_casts should have folded (their producer a
# kernel that the cast alone reads, not a value kept after the step, making
# no siblings: "(made by P)"). With
# -v list=1 it also prints each counted cast. Each cast is explained by its
# fp32 side (a narrowing cast's producer, a widening cast's kernel readers):
# "deny" (an op AMP keeps in fp32 and its backward: layer norm, batch norm,
# pooling's reductions), "param" (a reduction making a parameter's fp32
# gradient, "(grad)"), "loss" (the loss, its backward and the reductions
# over it) or "follow" (an op that follows its sources' precision, in fp32
# because one of its sources is fp32 and no cast: the GPT's residual stream
# and its gradient, the ConvNet's pooling after batch norm); a cast whose fp32 side holds
# anything else is "unexplained", counted as U on the last line's
# "unexplained U".
function is_dtype(s) { return s == "f32" || s == "bf16" || s == "f16" || s == "f64" || s == "i32" }
function is_half(d) { return d == "bf16" || d == "f16" }
function is_leaf(o) { return o == "param" || o == "input" || o == "buffer" }
function half_op(v) { return is_half(dt[v]) && !is_leaf(op[v]) && op[v] != "cast" && !f32in[v] }
function producer(v) { while (op[v] == "reshape") v = s1[v]; return v }
/^steps:/ { done = 1 }
!done && /^ *[0-9]+ [a-z_0-9]+ / {
	v = $1 + 0; op[v] = $2; n = 0; dt[v] = ""
	f32in[v] = index($0, "(f32 inside)") > 0
	grad[v] = index($0, "(grad)") > 0
	if (match($0, /\(made by [0-9]+\)/)) makes[substr($0, RSTART + 9, RLENGTH - 10) + 0] = 1
	kept[v] = 0
	for (i = 3; i <= NF; i++) {
		if (dt[v] == "" && is_dtype($i)) dt[v] = $i
		else if ($i ~ /^P\+/) kept[v] = 1
		else if ($i ~ /^%[0-9]+$/) {
			u = substr($i, 2) + 0; n++
			if (n == 1) s1[v] = u
			srcs[v, n] = u; ns[v] = n
			nread[u]++; rd[u, nread[u]] = v
		}
	}
	last = v
}
function side_class(v,   o) {
	o = op[v]
	if (grad[v]) return "param"
	if (o ~ /^(layernorm|layernorm_bwd_data|layernorm_bwd_gamma|batchnorm2d|bn_bwd_data|bn_bwd_gamma|global_avgpool|global_avgpool_bwd)$/) return "deny"
	if (o ~ /^(softmax_cross_entropy|softmax_ce_bwd|sum|broadcast|grad_seed)$/) return "loss"
	if (dt[v] == "f32" && f32_by_source(v)) return "follow"
	return ""
}
# Has v an fp32 source (through views) that is no cast?
function f32_by_source(v,   k, u) {
	for (k = 1; k <= ns[v]; k++) {
		u = srcs[v, k]
		while (op[u] == "reshape") u = s1[u]
		if (dt[u] == "f32" && op[u] != "cast") return 1
	}
	return 0
}
# The classes of v's kernel readers (through views), "" if one is none.
function reader_classes(v,   k, r, c, all, below) {
	all = "-"
	for (k = 1; k <= nread[v]; k++) {
		r = rd[v, k]
		if (op[r] == "reshape" || op[r] == "cast") { below = reader_classes(r); if (below == "") return ""; c = below }
		else { c = side_class(r); if (c == "") return "" }
		if (index(all, c) == 0) all = all == "-" ? c : all "," c
	}
	return all
}
# The kernel that computed v, through views and casts.
function compute_src(v) { while (op[v] == "reshape" || op[v] == "cast") v = s1[v]; return v }
# Does a kernel that computes in half read v (through views and casts: a
# round trip bf16 -> f32 -> bf16 is between half ops too)?
function half_reader(v,   k, r) {
	for (k = 1; k <= nread[v]; k++) {
		r = rd[v, k]
		if (op[r] == "reshape" || op[r] == "cast") { if (half_reader(r)) return 1 }
		else if (half_op(r)) return 1
	}
	return 0
}
END {
	casts = between = unfolded = unexplained = 0
	for (v = 0; v <= last; v++) {
		if (op[v] != "cast" || is_leaf(op[s1[v]]) || grad[v]) continue
		casts++
		p = producer(s1[v])
		b = half_op(compute_src(s1[v])) && half_reader(v)
		between += b
		u = is_half(dt[v]) && !is_half(dt[s1[v]]) && !is_leaf(op[p]) && op[p] != "cast" && !kept[p] && !makes[p] &&
		    nread[s1[v]] == 1 && (p == s1[v] || nread[p] == 1)
		unfolded += u
		cls = is_half(dt[v]) ? side_class(p) : reader_classes(v)
		unexplained += cls == ""
		if (list) printf("cast %d %s <- %d %s %s [%s]%s%s%s\n", v, dt[v], p, op[p], dt[p], cls == "" ? "?" : cls,
		    b ? " BETWEEN-HALF" : "", u ? " UNFOLDED" : "", cls == "" ? " UNEXPLAINED" : "")
	}
	printf("casts %d between_half %d unfolded %d unexplained %d\n", casts, between, unfolded, unexplained)
}
