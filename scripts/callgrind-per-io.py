#!/usr/bin/env python3
"""scripts/callgrind-per-io.py - user-space instructions per I/O of a target, nvmfd and SPDK's
nvmf_tgt side by side (BENCHMARKS.md, "Side by side with SPDK"). Deterministic where wall-clock
figures are not: it can run on a busy machine.

Method: the target runs under `valgrind --tool=callgrind` (nvmfd with --poll-us 0, so that
no idle spinning is counted; SPDK always polls, but under callgrind it is the bottleneck by far
and is never idle while I/O is queued), `nvmf perf` drives one case for T1 and then, on a fresh
target, for T2 seconds; instructions per I/O = (Ir(T2) - Ir(T1)) / (I/Os(T2) - I/Os(T1)), so
start-up and shutdown cancel out. Kernel work (the TCP stack, copies to and from sockets) is not
counted by callgrind; the target's syscalls per I/O come from a native run in bench-spdk.py.

  scripts/callgrind-per-io.py [--targets nvmfd,spdk] [--cases rr128-null,...] [--t1 3] [--t2 9]
  environment: NVMFD_SPDK_CG_DIR  an SPDK tree built without AVX-512 (valgrind 3.19 cannot run
                                  -march=native DPDK on this CPU): configure as usual, then set
                                  CONFIG_ARCH?=haswell in mk/config.mk and rebuild
                                  (default /work/spdk/spdk-cg)
               NVMFD_BIN          nvmfd and nvmf (default target/release)
               NVMFD_CG_KEEP=1    keep the callgrind output files (their directory is printed), for
                                  callgrind_annotate per function
"""
import argparse, json, os, re, signal, socket, subprocess, sys, tempfile, time

# Functions that only copy or fill data bytes: glibc's mem*, nvmfd's RAM-disk copies. callgrind
# counts every iteration of a `rep movsb`/`rep stosb` as one instruction, i.e. one per byte, which
# hardware does 32-64 bytes a cycle; so they are reported apart.
COPY_FNS = re.compile(r"__mem(set|cpy|move)\w*|malloc::copy_(in|out)\b")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
bench = __import__("bench-spdk")


def run_one(target, a, case, seconds, tmp):
    port = bench.free_port()
    cfg = os.path.join(tmp, f"cfg-{port}.json")
    json.dump(bench.config(port), open(cfg, "w"))
    out = os.path.join(tmp, f"cg-{target}-{port}.out")
    vg = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
    if target == "nvmfd":
        cmd = vg + [os.path.join(a.bin, "nvmfd"), "-m", "0", "-c", cfg, "--poll-us", "0",
                    "-r", os.path.join(tmp, f"n-{port}.sock")]
    else:
        cmd = vg + [os.path.join(a.spdk_cg, "build/bin/nvmf_tgt"), "--no-huge", "-s", "2560", "-m", "0x1",
                    "-c", cfg, "-r", os.path.join(tmp, f"s-{port}.sock")]
    log = open(os.path.join(tmp, f"{target}-{port}.log"), "w")
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    if not bench.wait_port(port, p, 180):
        p.kill()
        sys.exit(f"{target} under callgrind did not listen; see {log.name}")
    time.sleep(2)
    _, ns, w, bs, qd, mix = bench.CASES[case]
    trid = f"trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:{port} subnqn:{bench.NQN}"
    pc = [os.path.join(a.bin, "nvmf"), "perf", "-r", trid, "--ns", str(ns), "-q", str(qd), "-o", str(bs),
          "-w", w, "-t", str(seconds), "--json", "--no-progress", "--timeout", "60"]
    if mix is not None:
        pc += ["-M", str(mix)]
    r = subprocess.run(pc, capture_output=True, text=True, timeout=seconds + 120)
    if r.returncode != 0:
        p.kill()
        sys.exit(f"perf failed: {r.stdout[-1000:]}{r.stderr[-1000:]}")
    j = json.loads(r.stdout)["total"]
    ios = sum(j[d]["total_ios"] for d in ("read", "write") if d in j)
    p.send_signal(signal.SIGINT)
    try:
        p.wait(timeout=120)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    ir = None
    for line in open(out):
        m = re.match(r"(summary|totals):\s+(\d+)", line)
        if m:
            ir = int(m.group(2))
    # Exclusive counts of the functions that only move or fill data bytes.
    ann = subprocess.run(["callgrind_annotate", "--inclusive=no", "--auto=no", "--threshold=100", out],
                         capture_output=True, text=True).stdout
    data = 0
    for line in ann.splitlines():
        m = re.match(r"\s*([\d,]+)\s+\(.*?\)\s+(.*)", line)
        if m and "=>" not in line and COPY_FNS.search(m.group(2)):
            data += int(m.group(1).replace(",", ""))
    return ir, data, ios


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", default="nvmfd,spdk")
    ap.add_argument("--cases", default="rr128-null,rw128-malloc,seq128k-null")
    ap.add_argument("--t1", type=int, default=3)
    ap.add_argument("--t2", type=int, default=9)
    a = ap.parse_args()
    a.spdk_cg = os.environ.get("NVMFD_SPDK_CG_DIR", "/work/spdk/spdk-cg")
    a.bin = os.environ.get("NVMFD_BIN", "target/release")
    tmp = tempfile.mkdtemp(prefix="cg-per-io-")
    rows = []
    for case in a.cases.split(","):
        for target in a.targets.split(","):
            ir1, d1, io1 = run_one(target, a, case, a.t1, tmp)
            ir2, d2, io2 = run_one(target, a, case, a.t2, tmp)
            per = (ir2 - ir1) / max(1, io2 - io1)
            data = (d2 - d1) / max(1, io2 - io1)
            print(f"{case} {target}: Ir {ir1:,} / {ir2:,}, I/Os {io1:,} / {io2:,} -> {per:,.0f} instructions per "
                  f"I/O, of which {data:,.0f} in data copy/fill functions", flush=True)
            rows.append((case, target, per, data))
    print("\n| case | target | instructions per I/O | of which data copy/fill | the rest |\n|---|---|---|---|---|")
    for case, target, per, data in rows:
        print(f"| {bench.CASES[case][0]} | {target} | {per:,.0f} | {data:,.0f} | **{per - data:,.0f}** |")
    if os.environ.get("NVMFD_CG_KEEP") == "1":
        print(f"callgrind output kept in {tmp}")
    else:
        subprocess.run(["rm", "-rf", tmp])


if __name__ == "__main__":
    main()
