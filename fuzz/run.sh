#!/bin/sh
# fuzz/run.sh TARGET [SECONDS]: fuzz one target with one AFL++ instance (default 600 s), at the
# lowest CPU priority and under the machine's shared CPU lock, continuing from fuzz/out/TARGET
# when it exists. Findings land in fuzz/out/TARGET/default/crashes.
set -eu
t=$1
secs=${2:-600}
cd "$(dirname "$0")"
mkdir -p out
input="-i seeds/$t"
[ -d "out/$t/default/queue" ] && input="-i -"
# A copy, so a rebuild during the run does not replace the binary under AFL.
cp "target/release/$t" "out/$t.bin"
AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 AFL_NO_AFFINITY=1 AFL_NO_UI=1 \
AFL_AUTORESUME=1 \
  nice -n 19 flock -s /tmp/kvbust-cpu.lock \
  cargo afl fuzz -V "$secs" $input -o "out/$t" "out/$t.bin"
