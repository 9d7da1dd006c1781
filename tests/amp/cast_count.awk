# tests/amp/cast_count.awk — reads a --dump-graph plan and prints one line:
# "casts N between_half M unfolded K", where N counts the standalone casts
# on activations (a cast node whose source is not a parameter, input or
# buffer, and that is not a parameter's gradient), M those between two ops
# that compute in half (the cast's producer and one of its kernel readers;
# views looked through; a node marked "(f32 inside)" computes in fp32), K
# the narrowing casts loom_fuse_casts should have folded (their producer a
# kernel that the cast alone reads, not a value kept after the step, making
# no siblings: "(made by P)"). With
# -v list=1 it also prints each counted cast.
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
			nread[u]++; rd[u, nread[u]] = v
		}
	}
	last = v
}
# Does a kernel that computes in half read v (through views)?
function half_reader(v,   k, r) {
	for (k = 1; k <= nread[v]; k++) {
		r = rd[v, k]
		if (op[r] == "reshape") { if (half_reader(r)) return 1 }
		else if (half_op(r)) return 1
	}
	return 0
}
END {
	casts = between = unfolded = 0
	for (v = 0; v <= last; v++) {
		if (op[v] != "cast" || is_leaf(op[s1[v]]) || grad[v]) continue
		casts++
		p = producer(s1[v])
		b = half_op(p) && half_reader(v)
		between += b
		u = is_half(dt[v]) && !is_half(dt[s1[v]]) && !is_leaf(op[p]) && op[p] != "cast" && !kept[p] && !makes[p] &&
		    nread[s1[v]] == 1 && (p == s1[v] || nread[p] == 1)
		unfolded += u
		if (list) printf("cast %d %s <- %d %s %s%s%s\n", v, dt[v], p, op[p], dt[p], b ? " BETWEEN-HALF" : "", u ? " UNFOLDED" : "")
	}
	printf("casts %d between_half %d unfolded %d\n", casts, between, unfolded)
}
