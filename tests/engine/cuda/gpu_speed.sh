#!/usr/bin/env bash
# tests/engine/cuda/gpu_speed.sh — the GPU suite's speed table: one line per
# configuration, loom's and PyTorch's, read from the speed rows' logs.
# usage: gpu_speed.sh SPEED, where each line of SPEED is
#   label <TAB> kind <TAB> log
# kinds:
#   loom_img   resnet50_synthetic: its "total: X img/s" line and "MFU Y%" line
#   torch_img  bench/torch_gpu.py: one line per JSON object of the log
#              ("mode", "layout", "img_per_s"), the label followed by the mode
#   loom_tok   gpt_ddp: the last "step ... X tok/s ... MFU Y%" line
#   torch_tok  bench/torch_gpt.py: its "... X tok/s" line (and the MFU of its
#              "torch mfu:" line, --nanogpt's)
#   llmc_tok   llm.c's train_gpt2cu: the last "step ... | Y% bf16 MFU | X tok/s" line
#   loom_table bench_convnet: each level's row of its table, the median
#              step's img/s (the third column) and MFU (the last), the label
#              followed by the level
# A log without its figure gives "-" and the log's last line, never a
# made-up number. Always exits 0: the verdicts are gpu_summary.sh's.
set -u
speed=${1:?usage: gpu_speed.sh SPEED}

last_line() {
	grep -av '^\s*$' "$1" 2>/dev/null | tail -n 1 | cut -c1-80
}

line() { # label figure unit mfu note
	printf '%-44s %10s %-6s %6s  %s\n' "$1" "$2" "$3" "$4" "$5"
}

line configuration rate unit MFU note
line -------------------------------------------- ---------- ------ ------ ----
while IFS=$'\t' read -r label kind log; do
	[ -z "$label" ] && continue
	if [ ! -s "$log" ]; then
		line "$label" - - - "no log (not run: absent or out of time)"
		continue
	fi
	case $kind in
	loom_img)
		r=$(grep -ao 'total: [0-9.]* img/s' "$log" | tail -n 1 | sed 's/total: \([0-9.]*\) img\/s/\1/')
		m=$(grep -a '^MFU [0-9.]*%' "$log" | tail -n 1 | sed 's/^MFU \([0-9.]*\)%.*/\1/')
		if [ -n "$r" ]; then
			line "$label" "$r" img/s "${m:+$m%}" ""
		else
			line "$label" - img/s - "$(last_line "$log")"
		fi
		;;
	torch_img)
		n=0
		while read -r j; do
			mode=$(sed -n 's/.*"mode": *"\([^"]*\)".*/\1/p' <<<"$j")
			r=$(sed -n 's/.*"img_per_s": *\([0-9.]*\).*/\1/p' <<<"$j")
			skip=$(sed -n 's/.*"skipped": *"\([^"]*\)".*/\1/p' <<<"$j")
			[ -z "$mode" ] && continue
			n=$((n + 1))
			if [ -n "$r" ]; then
				line "$label $mode" "$(printf '%.1f' "$r")" img/s - ""
			else
				line "$label $mode" - img/s - "${skip:-no img_per_s}"
			fi
		done < <(grep -a '^{' "$log")
		[ $n -eq 0 ] && line "$label" - img/s - "$(last_line "$log")"
		;;
	loom_tok)
		l=$(grep -a 'tok/s' "$log" | grep -a '^step' | tail -n 1)
		r=$(sed -n 's/.* \([0-9][0-9.]*\) tok\/s.*/\1/p' <<<"$l")
		m=$(sed -n 's/.*MFU \([0-9.]*\)%.*/\1/p' <<<"$l")
		if [ -n "$r" ]; then
			line "$label" "$r" tok/s "${m:+$m%}" "last logged step"
		else
			line "$label" - tok/s - "$(last_line "$log")"
		fi
		;;
	torch_tok)
		r=$(grep -a '^torch ' "$log" | grep -ao '[0-9][0-9.]* tok/s' | head -n 1 | sed 's/ tok\/s//')
		m=$(grep -a '^torch mfu:' "$log" | sed -n 's/.*MFU \([0-9.]*\)%.*/\1/p' | head -n 1)
		[ -n "$m" ] && m=$m%
		if [ -n "$r" ]; then
			line "$label" "$r" tok/s "${m:--}" ""
		else
			line "$label" - tok/s - "$(last_line "$log")"
		fi
		;;
	llmc_tok)
		l=$(grep -a '^step.*tok/s' "$log" | tail -n 1)
		r=$(sed -n 's/.* \([0-9][0-9.]*\) tok\/s.*/\1/p' <<<"$l")
		m=$(sed -n 's/.* \([0-9.]*\)% bf16 MFU.*/\1/p' <<<"$l")
		if [ -n "$r" ]; then
			line "$label" "$r" tok/s "${m:+$m%}" "llm.c's own MFU and smoothed tok/s"
		else
			line "$label" - tok/s - "$(last_line "$log")"
		fi
		;;
	loom_table)
		n=0
		while IFS='|' read -r -a f; do
			lvl=$(echo ${f[1]:-})
			med=$(echo ${f[3]:-})
			m=$(echo ${f[14]:-})
			[[ $lvl == O[0-3]* ]] || continue
			n=$((n + 1))
			line "$label $lvl" "$med" img/s "${m:+$m%}" "median step"
		done < <(grep -a '^| O[0-3]' "$log")
		[ $n -eq 0 ] && line "$label" - img/s - "$(last_line "$log")"
		;;
	*)
		line "$label" - - - "unknown kind $kind"
		;;
	esac
done <"$speed"
exit 0
