#!/usr/bin/env bash
# bench/zero3_memory.sh [STEPS] — ZeRO-3 against ZeRO-2 and plain data
# parallelism (default 3 steps per run): bench/zero_stage_memory.sh 3.
exec "$(dirname "$0")/zero_stage_memory.sh" 3 "${1:-3}"
