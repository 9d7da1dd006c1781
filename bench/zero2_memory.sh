#!/usr/bin/env bash
# bench/zero2_memory.sh [STEPS] — ZeRO-2 against ZeRO-1 and plain data
# parallelism (default 4 steps per run): bench/zero_stage_memory.sh 2.
exec "$(dirname "$0")/zero_stage_memory.sh" 2 "${1:-4}"
