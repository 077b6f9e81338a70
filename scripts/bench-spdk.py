#!/usr/bin/env python3
"""scripts/bench-spdk.py - nvmfd side by side with SPDK's nvmf_tgt (BENCHMARKS.md, "Side by side
with SPDK"). A benchmark, not a test: it prints figures and asserts nothing about them.

Both targets load the same SPDK-shaped JSON config (a 1 GiB null bdev as namespace 1, a 1 GiB
malloc bdev as namespace 2, TCP transport with SPDK's defaults, one subsystem on 127.0.0.1). The
target runs on core TARGET_CORE, the initiator on INIT_CORE. Every run gets a freshly started
target; within a round the targets alternate and their order flips every round, so a drift of the
machine shows in both alike.

  scripts/bench-spdk.py [--seconds 5] [--rounds 3] [--initiators spdk,nvmf] [--cases all|a,b]
                        [--out DIR] [--nvmfd-args '...'] [--label NAME]
  environment: NVMFD_SPDK_DIR  a built SPDK tree (default /work/spdk/spdk): build/bin/nvmf_tgt and
                               build/bin/spdk_nvme_perf are used
               NVMFD_BIN       directory with nvmfd and nvmf (default target/release)
               NVMFD_OLD_BIN   directory with an earlier nvmfd, run as target "old" (before/after
                               tables: --targets old,nvmfd,spdk); the initiator nvmf stays NVMFD_BIN's

Cases (issue 8): 4 KiB randread QD128 (null), 4 KiB randread QD1 (null), 4 KiB randwrite QD128
(malloc), 128 KiB sequential read QD32 (null), 4 KiB randrw 75/25 QD64 (malloc).

Per run it records IOPS, MiB/s, mean/p99/p99.9 latency (as the initiator reports them), the
target's and the initiator's CPU (utime+stime from /proc/PID/stat, per I/O and in % of a core),
its busy time (thread_get_stats over its RPC socket: SPDK counts pollers that did work,
nvmfd loop turns that had work; wall time, so only meaningful on a quiet machine), and the CPU
that every other process on the machine used during the run (/proc/stat minus the two), so a
disturbed run shows. SPDK needs hugepages: the script mounts hugetlbfs on
/dev/hugepages and reserves 2048 x 2 MiB when it runs as root and they are missing.
Raw results: DIR/results.json; the summary table (markdown) goes to stdout and DIR/summary.md.
"""
import argparse, json, os, re, signal, socket, statistics, subprocess, sys, tempfile, time

CASES = {
    "rr128-null": ("4 KiB randread QD128, null", 1, "randread", 4096, 128, None),
    "rr1-null": ("4 KiB randread QD1, null", 1, "randread", 4096, 1, None),
    "rw128-malloc": ("4 KiB randwrite QD128, malloc", 2, "randwrite", 4096, 128, None),
    "seq128k-null": ("128 KiB seq read QD32, null", 1, "read", 131072, 32, None),
    "mix64-malloc": ("4 KiB randrw 75/25 QD64, malloc", 2, "randrw", 4096, 64, 75),
}
NQN = "nqn.2016-06.io.spdk:sbs"
NAMES = {"nvmfd": "nvmfd", "old": "nvmfd (before)", "spdk": "SPDK nvmf_tgt"}
HZ = os.sysconf("SC_CLK_TCK")


def config(port):
    tgt = [{"method": "nvmf_create_transport", "params": {"trtype": "TCP"}},
           {"method": "nvmf_create_subsystem",
            "params": {"nqn": NQN, "allow_any_host": True, "serial_number": "SBS00000001"}},
           {"method": "nvmf_subsystem_add_ns", "params": {"nqn": NQN, "namespace": {"bdev_name": "Null0", "nsid": 1}}},
           {"method": "nvmf_subsystem_add_ns", "params": {"nqn": NQN, "namespace": {"bdev_name": "Malloc0", "nsid": 2}}},
           {"method": "nvmf_subsystem_add_listener",
            "params": {"nqn": NQN, "listen_address": {"trtype": "TCP", "adrfam": "IPv4",
                                                      "traddr": "127.0.0.1", "trsvcid": str(port)}}}]
    bdev = [{"method": "bdev_null_create", "params": {"name": "Null0", "num_blocks": 2097152, "block_size": 512}},
            {"method": "bdev_malloc_create", "params": {"name": "Malloc0", "num_blocks": 2097152, "block_size": 512}}]
    return {"subsystems": [{"subsystem": "bdev", "config": bdev}, {"subsystem": "nvmf", "config": tgt}]}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def ticks(pid):
    try:
        f = open(f"/proc/{pid}/stat").read()
    except OSError:
        return 0
    f = f[f.rfind(")") + 2:].split()
    return int(f[11]) + int(f[12])


def cpustat():
    return list(map(int, open("/proc/stat").readline().split()[1:]))


def busy_seconds(sock_path):
    """Busy seconds of all the target's threads (SPDK's thread_get_stats, which nvmfd answers
    too: busy = time in loop turns that had work), or NaN."""
    try:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(5)
        s.connect(sock_path)
        s.sendall(json.dumps({"jsonrpc": "2.0", "method": "thread_get_stats", "id": 1}).encode())
        buf = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
            try:
                r = json.loads(buf)["result"]
                break
            except ValueError:
                continue
        s.close()
        return sum(t["busy"] for t in r["threads"]) / r["tick_rate"]
    except (OSError, KeyError, ValueError):
        return float("nan")


def wait_port(port, proc, deadline_s):
    end = time.time() + deadline_s
    while time.time() < end:
        if proc.poll() is not None:
            return False
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return True
        except OSError:
            time.sleep(0.1)
    return False


def ensure_hugepages():
    if not os.path.ismount("/dev/hugepages") and os.geteuid() == 0:
        os.makedirs("/dev/hugepages", exist_ok=True)
        subprocess.run(["mount", "-t", "hugetlbfs", "nodev", "/dev/hugepages"], check=False)
    try:
        n = int(open("/proc/sys/vm/nr_hugepages").read())
        if n < 2048 and os.geteuid() == 0:
            open("/proc/sys/vm/nr_hugepages", "w").write("2048")
    except OSError:
        pass


def rpc_path(kind, port, tmp):
    return os.path.join(tmp, f"{'spdk' if kind == 'spdk' else 'nvmfd'}-{port}.sock")


def start_target(kind, a, cfg_path, port, tmp):
    log = open(os.path.join(tmp, f"{kind}-{port}.log"), "w")
    if kind in ("nvmfd", "old"):
        cmd = [os.path.join(a.old_bin if kind == "old" else a.bin, "nvmfd"), "-c", cfg_path, "-m", str(a.target_core),
               "-r", rpc_path(kind, port, tmp)] + a.nvmfd_args.split()
    else:
        cmd = [os.path.join(a.spdk, "build/bin/nvmf_tgt"), "-m", hex(1 << a.target_core), "-c", cfg_path,
               "-r", rpc_path(kind, port, tmp)]
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    if not wait_port(port, p, 60):
        stop(p)
        sys.exit(f"{kind} did not listen on 127.0.0.1:{port}; see {log.name}")
    time.sleep(0.5)  # SPDK: listener up before the last config calls finish
    return p


def stop(p):
    if p.poll() is None:
        p.send_signal(signal.SIGINT)
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def run_initiator(init, a, port, case):
    _, ns, w, bs, qd, mix = CASES[case]
    trid = f"trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:{port} subnqn:{NQN}"
    if init == "spdk":
        cmd = [os.path.join(a.spdk, "build/bin/spdk_nvme_perf"), "-r", f"{trid} ns:{ns}", "-q", str(qd),
               "-o", str(bs), "-w", w, "-t", str(a.seconds), "-c", hex(1 << a.init_core), "-L"]
        if mix is not None:
            cmd += ["-M", str(mix)]
    else:
        cmd = [os.path.join(a.bin, "nvmf"), "perf", "-r", trid, "--ns", str(ns), "-q", str(qd), "-o", str(bs),
               "-w", w, "-t", str(a.seconds), "--cores", str(a.init_core), "--json", "--no-progress"]
        if mix is not None:
            cmd += ["-M", str(mix)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # Sample the initiator's CPU just before it exits (it is reaped by communicate()).
    try:
        out, _ = p.communicate(timeout=a.seconds + 60)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
        return None, f"initiator timed out: {' '.join(cmd)}\n{out[-2000:]}"
    if p.returncode != 0:
        return None, f"initiator exit {p.returncode}: {' '.join(cmd)}\n{out[-2000:]}"
    return parse(init, out), None


def parse(init, out):
    if init == "nvmf":
        j = json.loads(out)
        r, wr = j["total"]["read"], j["total"].get("write", {})
        iops = r["iops"] + (wr.get("iops", 0) if wr else 0)
        mibs = (r["bw_bytes"] + (wr.get("bw_bytes", 0) if wr else 0)) / 1048576
        src = r if r["iops"] > 0 else wr
        return dict(iops=iops, mibs=mibs, mean=src["lat_ns"]["mean"] / 1000,
                    p99=src["clat_ns"]["percentile"]["99.000000"] / 1000,
                    p999=src["clat_ns"]["percentile"]["99.900000"] / 1000)
    m = re.search(r"^Total\s*:\s*([\d.]+)\s+([\d.]+)\s+([\d.]+)", out, re.M)
    if not m:
        raise ValueError("no Total line in spdk_nvme_perf output:\n" + out[-2000:])
    rec = dict(iops=float(m.group(1)), mibs=float(m.group(2)), mean=float(m.group(3)))
    for key, pct in (("p99", "99.00000"), ("p999", "99.90000")):
        mm = re.search(r"^\s*" + re.escape(pct) + r"%\s*:\s*([\d.]+)us", out, re.M)
        rec[key] = float(mm.group(1)) if mm else float("nan")
    return rec


def fmt(v, unit=""):
    if v != v:
        return "-"
    if v >= 10000:
        return f"{v:,.0f}{unit}"
    return f"{v:,.1f}{unit}" if v >= 10 else f"{v:,.2f}{unit}"


def med(vals):
    vals = [v for v in vals if v == v]
    if not vals:
        return float("nan"), float("nan"), float("nan")
    return statistics.median(vals), min(vals), max(vals)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--initiators", default="spdk,nvmf")
    ap.add_argument("--cases", default="all")
    ap.add_argument("--targets", default="nvmfd,spdk")
    ap.add_argument("--target-core", type=int, default=0)
    ap.add_argument("--init-core", type=int, default=1)
    ap.add_argument("--nvmfd-args", default="")
    ap.add_argument("--label", default="")
    ap.add_argument("--congestion", default=None,
                    help="set net.ipv4.tcp_congestion_control to this for the whole run (root; restored at "
                         "the end), for targets and initiators alike: BBR (a common default) paces every "
                         "send with a timer on loopback, see BENCHMARKS.md")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    a.spdk = os.environ.get("NVMFD_SPDK_DIR", "/work/spdk/spdk")
    a.bin = os.environ.get("NVMFD_BIN", "target/release")
    a.old_bin = os.environ.get("NVMFD_OLD_BIN", "/tmp/old-bin")
    for f in (os.path.join(a.spdk, "build/bin/nvmf_tgt"), os.path.join(a.spdk, "build/bin/spdk_nvme_perf"),
              os.path.join(a.bin, "nvmfd"), os.path.join(a.bin, "nvmf")):
        if not os.access(f, os.X_OK):
            sys.exit(f"missing {f} (set NVMFD_SPDK_DIR / NVMFD_BIN; build nvmfd with "
                     "`cargo build --release -p nvmfd -p nvmf-host`)")
    cases = list(CASES) if a.cases == "all" else a.cases.split(",")
    inits = a.initiators.split(",")
    targets = a.targets.split(",")
    ensure_hugepages()
    cc_path = "/proc/sys/net/ipv4/tcp_congestion_control"
    cc_before = open(cc_path).read().strip()
    if a.congestion:
        open(cc_path, "w").write(a.congestion)
    try:
        run_all(a, cases, inits, targets)
    finally:
        if a.congestion:
            open(cc_path, "w").write(cc_before)


def run_all(a, cases, inits, targets):
    cc = open("/proc/sys/net/ipv4/tcp_congestion_control").read().strip()
    out_dir = a.out or tempfile.mkdtemp(prefix="bench-spdk-")
    os.makedirs(out_dir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="bench-spdk-run-")
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}  load: {open('/proc/loadavg').read().strip()}"
          f"  tcp_congestion_control: {cc}", flush=True)
    results = {}
    for rnd in range(a.rounds):
        for case in cases:
            for init in inits:
                k = rnd % len(targets)
                order = targets[k:] + targets[:k]
                for tgt in order:
                    port = free_port()
                    cfg_path = os.path.join(tmp, f"cfg-{port}.json")
                    json.dump(config(port), open(cfg_path, "w"))
                    tp = start_target(tgt, a, cfg_path, port, tmp)
                    b0 = busy_seconds(rpc_path(tgt, port, tmp))
                    t0, s0, w0 = ticks(tp.pid), cpustat(), time.time()
                    c0 = os.times()
                    rec, err = run_initiator(init, a, port, case)
                    c1 = os.times()
                    t1, s1, w1 = ticks(tp.pid), cpustat(), time.time()
                    b1 = busy_seconds(rpc_path(tgt, port, tmp))
                    stop(tp)
                    if err:
                        print(f"round {rnd} {case} {init} -> {tgt}: FAILED: {err}", flush=True)
                        continue
                    icpu = (c1.children_user + c1.children_system) - (c0.children_user + c0.children_system)
                    tot = [b - x for x, b in zip(s0, s1)]
                    busy = sum(tot) - tot[3] - tot[4] - tot[7]
                    tcpu = (t1 - t0) / HZ
                    ios = rec["iops"] * a.seconds
                    rec.update(tcpu_pct=100 * tcpu / (w1 - w0), icpu_pct=100 * icpu / a.seconds,
                               tcpu_us_io=1e6 * tcpu / max(ios, 1),
                               tbusy_us_io=1e6 * (b1 - b0) / max(ios, 1),
                               others_pct=100 * (busy / HZ - tcpu - icpu) / (w1 - w0),
                               steal_pct=100 * tot[7] / max(1, sum(tot)))
                    results.setdefault(f"{case}|{init}|{tgt}", []).append(rec)
                    print(f"round {rnd} {case:13} {init:5} -> {tgt:6} " +
                          " ".join(f"{k}={fmt(v)}" for k, v in rec.items()), flush=True)
    json.dump(results, open(os.path.join(out_dir, "results.json"), "w"), indent=1)
    lines = [f"Side by side {a.label} ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}): "
             f"{a.rounds} rounds x {a.seconds} s, target on core {a.target_core}, initiator on core "
             f"{a.init_core}; TCP congestion control {cc}; median (min-max). CPU = utime+stime of the target per I/O (both targets "
             "poll while I/O flows, so this is ~1/IOPS when the target is saturated); busy = the target's "
             "busy time from thread_get_stats (SPDK: pollers that did work; nvmfd: loop turns with "
             "work) per I/O.", "",
             "| case | initiator | metric | " + " | ".join(NAMES[t] for t in targets) + " | " +
             " | ".join(f"{NAMES[t]}/SPDK" for t in targets if t != "spdk") + " |",
             "|---|---|---|" + "---|" * (2 * len(targets) - ("spdk" in targets))]
    for case in cases:
        for init in inits:
            metrics = [("IOPS", "iops")] if CASES[case][4] > 1 else [("IOPS", "iops"), ("mean µs", "mean"),
                                                                     ("p99 µs", "p99"), ("p99.9 µs", "p999")]
            if case.startswith("seq"):
                metrics = [("MiB/s", "mibs")]
            metrics.append(("target CPU µs/IO", "tcpu_us_io"))
            metrics.append(("target busy µs/IO", "tbusy_us_io"))
            for label, k in metrics:
                meds = {t: med([r[k] for r in results.get(f"{case}|{init}|{t}", [])]) for t in targets}
                cells = [f"**{fmt(m)}** ({fmt(lo)}-{fmt(hi)})" for m, lo, hi in meds.values()]
                sm = meds.get("spdk", (float("nan"),))[0]
                ratios = [f"{meds[t][0] / sm:.2f}" if sm == sm and sm else "-" for t in targets if t != "spdk"]
                lines.append(f"| {CASES[case][0]} | {'spdk_nvme_perf' if init == 'spdk' else 'nvmf perf'} | {label} | "
                             + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    others = [r["others_pct"] for rs in results.values() for r in rs]
    steal = [r["steal_pct"] for rs in results.values() for r in rs]
    if others:
        lines += ["", f"Other processes during the runs: max {max(others):.1f}% of a CPU (median "
                      f"{statistics.median(others):.1f}%); steal max {max(steal):.1f}%."]
    text = "\n".join(lines)
    print(text)
    open(os.path.join(out_dir, "summary.md"), "w").write(text + "\n")
    print(f"# raw results: {out_dir}/results.json", file=sys.stderr)


if __name__ == "__main__":
    main()
