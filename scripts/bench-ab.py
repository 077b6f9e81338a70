#!/usr/bin/env python3
# scripts/bench-ab.py - side-by-side A/B of two builds of nvmfd + nvmf (BENCHMARKS.md, "Adaptive
# polling"): `nvmfd -m 0` with a 1 GiB null bdev, `nvmf perf --cores 1`, 127.0.0.1 only.
#
#   scripts/bench-ab.py [SECONDS [RUNS]]      (default 5 s, 5 rounds; about 5 minutes)
#   OLD=/tmp/old-bin NEW=target/release       directories holding the nvmfd and nvmf binaries
#   ONLY="old|new"                            run only these variants
#   NVMFD_ARGS="--tcp-congestion cubic"       more arguments for every nvmfd (e.g. to avoid BBR's
#                                             bimodal QD128 runs, BENCHMARKS.md "BBR")
#
# Variants: old build; new build (defaults: nvmfd --poll-us 50, perf --poll-us 1000); new build
# with --poll-us 0 on both sides. Cases: 4 KiB randread QD1 and QD128, 128 KiB read QD32. Each
# round runs every variant (a fresh daemon each), the variant order rotated every round. Per
# run: IOPS, MiB/s, mean/p99/p99.9 latency, nvmfd CPU (/proc/PID/stat), perf CPU
# (/usr/bin/time), steal and the CPU used by all other processes (/proc/stat). Raw results go
# to /tmp/ab-results.json; prints one line per run.
import json, os, subprocess, sys, time, socket
T = int(sys.argv[1]) if len(sys.argv) > 1 else 5
RUNS = int(sys.argv[2]) if len(sys.argv) > 2 else 5
NEW = os.environ.get("NEW", "target/release")
OLD = os.environ.get("OLD", "/tmp/old-bin")
VARIANTS = {
  "old": (f"{OLD}/nvmfd", [], f"{OLD}/nvmf", []),
  "new": (f"{NEW}/nvmfd", [], f"{NEW}/nvmf", []),
  "new, --poll-us 0 both": (f"{NEW}/nvmfd", ["--poll-us", "0"], f"{NEW}/nvmf", ["--poll-us", "0"]),
}
CASES = [("4k randread QD1", ["-w","randread","-o","4096","-q","1"]),
         ("4k randread QD128", ["-w","randread","-o","4096","-q","128"]),
         ("128k read QD32", ["-w","read","-o","131072","-q","32"])]
def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p
def ticks(pid):
    f = open(f"/proc/{pid}/stat").read(); f = f[f.rfind(")")+2:].split(); return int(f[11]) + int(f[12])
def cpustat():
    v = list(map(int, open("/proc/stat").readline().split()[1:])); return v
nqn = "nqn.2016-06.io.spdk:ab"
results = {}
# ONLY="old|new": run only these variants (names separated by '|').
vnames = [v for v in VARIANTS if v in os.environ.get("ONLY", "|".join(VARIANTS)).split("|")]
for rnd in range(RUNS):
    order = vnames[rnd % len(vnames):] + vnames[:rnd % len(vnames)]
    for vn in order:
        nvmfd, nargs, nvmf, pargs = VARIANTS[vn]
        port = free_port()
        cfg = {"subsystems": [{"subsystem": "bdev", "config": [{"method": "bdev_null_create", "params": {"name": "Null0", "num_blocks": 2097152, "block_size": 512}}]},
               {"subsystem": "nvmf", "config": [{"method": "nvmf_create_transport", "params": {"trtype": "TCP"}},
               {"method": "nvmf_create_subsystem", "params": {"nqn": nqn, "allow_any_host": True, "serial_number": "AB1"}},
               {"method": "nvmf_subsystem_add_ns", "params": {"nqn": nqn, "namespace": {"bdev_name": "Null0", "nsid": 1}}},
               {"method": "nvmf_subsystem_add_listener", "params": {"nqn": nqn, "listen_address": {"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": str(port)}}}]}]}
        open("/tmp/ab.json", "w").write(json.dumps(cfg))
        d = subprocess.Popen([nvmfd, "-c", "/tmp/ab.json", "-m", "0", "-r", f"/tmp/ab-{port}.sock"] + nargs + os.environ.get("NVMFD_ARGS", "").split(), stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        time.sleep(0.7)
        trid = f"trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:{port} subnqn:{nqn}"
        for cname, cargs in CASES:
            t0 = ticks(d.pid); w0 = time.time(); s0 = cpustat()
            p = subprocess.run(["/usr/bin/time", "-f", "%U %S", nvmf, "perf", "-r", trid, "--ns", "1", "--cores", "1", "-t", str(T), "--json", "--no-progress"] + cargs + pargs, capture_output=True, text=True)
            w1 = time.time(); t1 = ticks(d.pid); s1 = cpustat()
            j = json.loads(p.stdout)
            u, s = map(float, p.stderr.strip().splitlines()[-1].split())
            r = j["total"]["read"]
            tot = [b - a for a, b in zip(s0, s1)]; steal = 100.0 * tot[7] / max(1, sum(tot))
            hz = os.sysconf("SC_CLK_TCK"); busy = sum(tot) - tot[3] - tot[4] - tot[7]
            others = 100.0 * (busy - (t1 - t0) - (u + s) * hz) / hz / (w1 - w0)
            rec = dict(iops=r["iops"], mibs=r["bw_bytes"] / 1048576, mean=r["lat_ns"]["mean"] / 1000,
                       p99=r["clat_ns"]["percentile"]["99.000000"] / 1000, p999=r["clat_ns"]["percentile"]["99.900000"] / 1000,
                       tcpu=100.0 * (t1 - t0) / os.sysconf("SC_CLK_TCK") / (w1 - w0), pcpu=100.0 * (u + s) / (w1 - w0), steal=steal, others=others)
            results.setdefault((cname, vn), []).append(rec)
            print(rnd, vn, cname, {k: round(v, 1) for k, v in rec.items()}, flush=True)
        d.terminate(); d.wait()
json.dump({f"{c}|{v}": r for (c, v), r in results.items()}, open("/tmp/ab-results.json", "w"))
