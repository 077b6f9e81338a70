#!/usr/bin/env python3
"""scripts/callgrind-initiator.py - user-space instructions per I/O of the *initiator*: `nvmf perf`
and, for comparison, SPDK's spdk_nvme_perf (issue 27, "a cheaper initiator"), and fio with the
nvmf fio engine (`fio`, and `fio-old`: an earlier build of the engine, for before/after). The counterpart of
callgrind-per-io.py, which measures the target. Deterministic where wall-clock figures are not:
it can run on a busy machine.

Method: a native nvmfd (--poll-us 0, so it sleeps when idle) serves the config of
bench-spdk.py (a null bdev as namespace 1, a malloc bdev as namespace 2); the initiator runs
under `valgrind --tool=callgrind` for T1 and then, against a fresh target, for T2 seconds;
instructions per I/O = (Ir(T2) - Ir(T1)) / (I/Os(T2) - I/Os(T1)), so start-up and shutdown
cancel out. The same difference gives heap calls (malloc, calloc, realloc, free, ...) per I/O,
counted from callgrind's call counts. Under callgrind the initiator is the bottleneck by far,
so the time it spends polling an empty socket is small (it is counted: it is what it costs).
Kernel work (the TCP stack, copies to and from sockets) is not counted; --strace adds
syscalls per I/O from a native `strace -c -f` run (T1 seconds; strace slows the initiator, so
batching is about as good as it gets then, not worse).

spdk_nvme_perf prints IOPS, not I/Os: its I/Os are IOPS x T (it divides by its measured time,
which is T to within a poll), so its figure is a little less exact than nvmf's.

  scripts/callgrind-initiator.py [--initiators nvmf,spdk] [--cases rr128-null,rw128-malloc]
                                 [--t1 2] [--t2 6] [--strace] [--nvmf-args '--poll-us 0']
  environment: NVMFD_BIN       nvmfd and nvmf (default target/release)
               NVMFD_SPDK_DIR  an SPDK tree with build/bin/spdk_nvme_perf (default
                               /work/spdk-build; valgrind 3.19 runs it there, its hot path has
                               no AVX-512; if yours does not, build one with CONFIG_ARCH=haswell)
               NVMF_FIO_ENGINE  the engine for `fio` (default target/nvmf-fio/libnvmf_fio.so)
               NVMF_FIO_ENGINE_OLD  the engine for `fio-old`
               NVMFD_CG_KEEP=1 keep the callgrind output files (their directory is printed),
                               for callgrind_annotate per function
Cases are bench-spdk.py's (rr128-null, rr1-null, rw128-malloc, seq128k-null, mix64-malloc).
"""
import argparse, json, os, re, signal, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
bench = __import__("bench-spdk")

HEAP_FNS = re.compile(r"^(malloc|calloc|realloc|free|memalign|posix_memalign|aligned_alloc|"
                      r"__libc_malloc|__libc_free|__libc_calloc|__libc_realloc)$")


def start_target(a, tmp):
    port = bench.free_port()
    cfg = os.path.join(tmp, f"cfg-{port}.json")
    json.dump(bench.config(port), open(cfg, "w"))
    log = open(os.path.join(tmp, f"nvmfd-{port}.log"), "w")
    p = subprocess.Popen([os.path.join(a.bin, "nvmfd"), "-m", "0", "-c", cfg, "--poll-us", "0",
                          "-r", os.path.join(tmp, f"n-{port}.sock")],
                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    if not bench.wait_port(port, p, 60):
        bench.stop(p)
        sys.exit(f"nvmfd did not listen; see {log.name}")
    return p, port


def initiator_cmd(init, a, case, port, seconds):
    _, ns, w, bs, qd, mix = bench.CASES[case]
    trid = f"trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:{port} subnqn:{bench.NQN}"
    if init in ("fio", "fio-old"):
        engine = a.fio_engine if init == "fio" else a.fio_engine_old
        if not engine or not os.path.isfile(engine):
            sys.exit(f"{init}: no fio engine at {engine!r} (scripts/build-fio-engine.sh; NVMF_FIO_ENGINE_OLD)")
        fname = f"trtype=tcp traddr=127.0.0.1 trsvcid={port} subnqn={bench.NQN.replace(':', chr(92) + ':')} ns={ns}"
        cmd = ["fio", "--name=cg", f"--ioengine=external:{engine}", f"--filename={fname}", f"--rw={w}",
               f"--bs={bs}", f"--iodepth={qd}", "--time_based", f"--runtime={seconds}",
               "--iodepth_batch_submit=0", "--output-format=json", "--thread"]
        if mix is not None:
            cmd.append(f"--rwmixread={mix}")
        return cmd
    if init == "spdk":
        cmd = [os.path.join(a.spdk, "build/bin/spdk_nvme_perf"), "-r", f"{trid} ns:{ns}", "-q", str(qd),
               "-o", str(bs), "-w", w, "-t", str(seconds), "--no-huge", "-s", "512"]
    else:
        cmd = [os.path.join(a.bin, "nvmf"), "perf", "-r", trid, "--ns", str(ns), "-q", str(qd), "-o", str(bs),
               "-w", w, "-t", str(seconds), "--json", "--no-progress", "--timeout", "60"] + a.nvmf_args.split()
    if mix is not None:
        cmd += ["-M", str(mix)]
    return cmd


def fio_json(out):
    i = out.find("{")
    if i < 0:
        sys.exit("no JSON in fio's output:\n" + out[-2000:])
    return json.loads(out[i:])


def count_ios(init, out, seconds):
    if init.startswith("fio"):
        j = fio_json(out)["jobs"][0]
        return j["read"]["total_ios"] + j["write"]["total_ios"]
    if init == "nvmf":
        j = json.loads(out)["total"]
        return sum(j[d]["total_ios"] for d in ("read", "write") if d in j)
    m = re.search(r"^Total\s*:\s*([\d.]+)", out, re.M)
    if not m:
        sys.exit("no Total line in spdk_nvme_perf's output:\n" + out[-2000:])
    return round(float(m.group(1)) * seconds)


def heap_calls(path):
    """Calls into the allocator, from the call counts of a callgrind output file."""
    names, total, cur_cfn = {}, 0, None
    for line in open(path, errors="replace"):
        if not line.startswith(("fn=", "cfn=", "calls=")):
            continue
        if line.startswith("cfn="):
            m = re.match(r"cfn=\((\d+)\)(?: (.*))?", line.strip())
            if m:
                if m.group(2):
                    names[m.group(1)] = m.group(2)
                cur_cfn = names.get(m.group(1), "")
            else:
                cur_cfn = line[4:].strip()
        elif line.startswith("fn="):
            m = re.match(r"fn=\((\d+)\)(?: (.*))?", line.strip())
            if m and m.group(2):
                names[m.group(1)] = m.group(2)
        elif line.startswith("calls=") and cur_cfn is not None:
            if HEAP_FNS.match(cur_cfn):
                total += int(line[6:].split()[0])
            cur_cfn = None
    return total


def per_function(path):
    """Exclusive instructions per function (callgrind_annotate, file:function lines)."""
    ann = subprocess.run(["callgrind_annotate", "--inclusive=no", "--auto=no", "--threshold=100", path],
                         capture_output=True, text=True).stdout
    fns = {}
    for line in ann.splitlines():
        m = re.match(r"\s*([\d,]+)\s+\(.*?\)\s+(.*)", line)
        if m and "PROGRAM TOTALS" not in line:
            name = re.sub(r"\s*\[[^]]*\]$", "", m.group(2))
            name = name.split(":", 1)[1] if ":" in name else name
            fns[name] = fns.get(name, 0) + int(m.group(1).replace(",", ""))
    return fns


def run_cg(init, a, case, seconds, tmp):
    p, port = start_target(a, tmp)
    out = os.path.join(tmp, f"cg-{init}-{case}-{seconds}s.out")
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"] + \
        initiator_cmd(init, a, case, port, seconds)
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 300)
    finally:
        bench.stop(p)
    if r.returncode != 0:
        sys.exit(f"{init} failed under callgrind: {r.stdout[-1500:]}{r.stderr[-1500:]}")
    ios = count_ios(init, r.stdout, seconds)
    ir = None
    for line in open(out, errors="replace"):
        m = re.match(r"(summary|totals):\s+(\d+)", line)
        if m:
            ir = int(m.group(2))
    return ir, heap_calls(out), ios, out


def run_strace(init, a, case, seconds, tmp):
    p, port = start_target(a, tmp)
    sfile = os.path.join(tmp, f"strace-{init}-{case}.txt")
    cmd = ["strace", "-c", "-f", "-o", sfile] + initiator_cmd(init, a, case, port, seconds)
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
    finally:
        bench.stop(p)
    if r.returncode != 0:
        sys.exit(f"{init} failed under strace: {r.stdout[-1500:]}{r.stderr[-1500:]}")
    ios = count_ios(init, r.stdout, seconds)
    calls = {}
    for line in open(sfile):
        f = line.split()
        # % time, seconds, usecs/call, calls, [errors], syscall
        if len(f) >= 5 and f[0][0].isdigit() and f[-1] != "total":
            calls[f[-1]] = int(f[3])
    return ios, calls


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--initiators", default="nvmf,spdk")
    ap.add_argument("--cases", default="rr128-null,rw128-malloc")
    ap.add_argument("--t1", type=int, default=2)
    ap.add_argument("--t2", type=int, default=6)
    ap.add_argument("--strace", action="store_true", help="also count syscalls per I/O (native run of T1 s)")
    ap.add_argument("--nvmf-args", default="", help="extra arguments for nvmf perf")
    ap.add_argument("--top", type=int, default=0, metavar="N",
                    help="also print the N functions with the most instructions per I/O (T2 minus T1)")
    a = ap.parse_args()
    a.spdk = os.environ.get("NVMFD_SPDK_DIR", "/work/spdk-build")
    a.bin = os.environ.get("NVMFD_BIN", "target/release")
    a.fio_engine = os.environ.get("NVMF_FIO_ENGINE", "target/nvmf-fio/libnvmf_fio.so")
    a.fio_engine_old = os.environ.get("NVMF_FIO_ENGINE_OLD")
    tmp = tempfile.mkdtemp(prefix="cg-initiator-")
    rows = []
    for case in a.cases.split(","):
        for init in a.initiators.split(","):
            ir1, h1, io1, f1 = run_cg(init, a, case, a.t1, tmp)
            ir2, h2, io2, f2 = run_cg(init, a, case, a.t2, tmp)
            dio = max(1, io2 - io1)
            if a.top:
                p1, p2 = per_function(f1), per_function(f2)
                diff = sorted(((p2.get(k, 0) - p1.get(k, 0)) / dio, k) for k in p2)
                for v, k in reversed(diff[-a.top:]):
                    print(f"    {v:8.1f}  {k[:150]}")
            per, heap = (ir2 - ir1) / dio, (h2 - h1) / dio
            print(f"{case} {init}: Ir {ir1:,} / {ir2:,}, I/Os {io1:,} / {io2:,} -> {per:,.0f} instructions "
                  f"per I/O, {heap:.3f} heap calls per I/O", flush=True)
            sc = None
            if a.strace:
                ios, calls = run_strace(init, a, case, a.t1, tmp)
                sc = (sum(calls.values()) / max(1, ios),
                      ", ".join(f"{k} {v / max(1, ios):.3f}" for k, v in
                                sorted(calls.items(), key=lambda kv: -kv[1])[:5]))
                print(f"{case} {init}: {ios:,} I/Os natively under strace, {sc[0]:.3f} syscalls per I/O ({sc[1]})",
                      flush=True)
            rows.append((case, init, per, heap, sc))
    print("\n| case | initiator | instructions per I/O | heap calls per I/O | syscalls per I/O | top syscalls per I/O |")
    print("|---|---|---|---|---|---|")
    for case, init, per, heap, sc in rows:
        print(f"| {bench.CASES[case][0]} | {init} | **{per:,.0f}** | {heap:.3f} | "
              f"{'-' if sc is None else f'{sc[0]:.3f}'} | {'-' if sc is None else sc[1]} |")
    if os.environ.get("NVMFD_CG_KEEP") == "1":
        print(f"callgrind output kept in {tmp}")
    else:
        subprocess.run(["rm", "-rf", tmp])


if __name__ == "__main__":
    main()
