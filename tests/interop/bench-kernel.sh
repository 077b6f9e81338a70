# Guest side of crates/nvmf-interop/tests/bench_kernel_target.rs: `nvmf bench run` sets up the
# Linux kernel target (nvmet) through configfs inside this guest, measures it over 127.0.0.1
# with the nvmf-perf engine, and tears it down. Prints the configfs state after each run
# ("configfs-after NAME: subsystems=[...] ports=[...]") for the host to check; the outputs of
# the good run land in /job/bench (the host reads bench.json there).
# Env: PORT (nvmet port inside the guest). /job/nvmf is the host's `nvmf` binary.
exec 2>&1
set -u
PORT=${PORT:?PORT not set}
NQN=nqn.2024-01.io.nvmfd:bench-kernel

configfs_state() {  # name
  echo "configfs-after $1: subsystems=[$(ls /sys/kernel/config/nvmet/subsystems 2>&1 | tr '\n' ' ')] ports=[$(ls /sys/kernel/config/nvmet/ports 2>&1 | tr '\n' ' ')]"
}

modprobe brd rd_nr=1 rd_size=65536 || { echo "FAIL: modprobe brd"; exit 1; }
[ -b /dev/ram0 ] || { echo "FAIL: no /dev/ram0"; exit 1; }
echo "uname-r: $(uname -r)"

spec() {  # backing
  cat <<SPEC
repetitions = 1
engine = "nvmf-perf"

[[target]]
name = "linux"
kind = "kernel"
backing = "$1"
addr = "127.0.0.1"
port = $PORT
nqn = "$NQN"

[[workload]]
name = "4k-randrw"
rw = "randrw"
bs = "4k"
qd = 8
runtime = 2
ramp = 1
SPEC
}

spec /dev/ram0 > /tmp/good.toml
echo "== run good"
timeout 120 /job/nvmf bench run /tmp/good.toml --out /job/bench --sample-ms 0
echo "exit-good: $?"
configfs_state good

spec /dev/no-such-device > /tmp/bad.toml
echo "== run missing-backing"
timeout 60 /job/nvmf bench run /tmp/bad.toml --out /tmp/bench-bad --sample-ms 0
echo "exit-bad: $?"
configfs_state bad
exit 0
