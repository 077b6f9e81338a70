#!/usr/bin/env python3
"""Helper of scripts/bench.sh (not meant to be run by hand).

  bench-report.py snap FILE           record per-process CPU ticks, /proc/stat, loadavg
  bench-report.py load A B [EXCLUDE [RESULTS.tsv CASE]]
                                      markdown: loadavg, CPU time by whom, top CPU consumers
                                      between two snaps (EXCLUDE: comma-separated pids that
                                      are the benchmark's own long-lived processes; the
                                      clients' CPU comes from RESULTS.tsv rows of CASE)
  bench-report.py table RESULTS.tsv   markdown tables (min / median / max per variant, every
                                      run's value, CPU per I/O, ratios to the references)

RESULTS.tsv columns: case, variant, round, kind (perf|iperf3), json file, wall seconds,
nvmfd CPU seconds (utime+stime delta from /proc/PID/stat), client CPU seconds (user+sys of
the `nvmf perf` process from /usr/bin/time; 0 for iperf3, whose JSON reports its own).
"""
import json
import os
import statistics
import sys
import time

# Reference figures measured by others (SPDK v26.05 nvmf_tgt + spdk_nvme_perf, one core
# each, same machine kind). Not measured by this script.
SPDK_RR128_IOPS = 600_000
SPDK_QD1_MEAN_US = 14.0
SPDK_QD1_P999_US = 76.0
SPDK_SEQ_MIBS = 3.8 * 1024


def snap(path):
    procs = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                s = f.read()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        comm = s[s.index("(") + 1: s.rindex(")")]
        rest = s[s.rindex(")") + 2:].split()
        # rest[0] is field 3 (state); utime = field 14, stime = field 15
        ticks = int(rest[11]) + int(rest[12])
        procs[pid] = [comm, ticks, cmd[:80] or f"[{comm}]"]
    with open("/proc/stat") as f:
        cpu = [int(x) for x in f.readline().split()[1:]]
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    with open(path, "w") as f:
        json.dump({"t": time.time(), "procs": procs, "cpu": cpu, "load": load}, f)


def client_seconds(results, case):
    """CPU seconds of the short-lived clients (nvmf perf, iperf3 -c) of CASE's runs."""
    total = 0.0
    if not results or not os.path.exists(results):
        return None
    for line in open(results):
        f = line.rstrip("\n").split("\t")
        if len(f) < 8 or (case != "all" and f[0] != case):
            continue
        if f[3] == "perf":
            total += float(f[7])
        else:
            try:
                c = json.load(open(f[4]))["end"]["cpu_utilization_percent"]["host_total"]
                total += c / 100.0 * float(f[5])
            except Exception:
                pass
    return total


def load(a_path, b_path, exclude="", results=None, case="all"):
    a = json.load(open(a_path))
    b = json.load(open(b_path))
    excl = set(x for x in exclude.split(",") if x)
    hz = os.sysconf("SC_CLK_TCK")
    dt = max(b["t"] - a["t"], 1e-3)
    ca, cb = a["cpu"], b["cpu"]
    d = [y - x for x, y in zip(ca, cb)]  # user nice system idle iowait irq softirq steal ...
    tot = sum(d[:8])
    steal = d[7] if len(d) > 7 else 0
    idle = d[3] + d[4]
    ncpu = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    busy_cpus = (tot - idle - steal) / hz / dt
    rows = []
    for pid, (comm, ticks, cmd) in b["procs"].items():
        prev = a["procs"].get(pid)
        dd = ticks - (prev[1] if prev and prev[0] == comm else 0)
        if dd > 0:
            rows.append((dd, pid, comm, cmd))
    rows.sort(reverse=True)
    own = sum(x for x, pid, _, _ in rows if pid in excl) / hz / dt
    other = [r for r in rows if r[1] not in excl]
    other_cpus = sum(r[0] for r in other) / hz / dt
    cli = client_seconds(results, case)
    cli_cpus = cli / dt if cli is not None else 0.0
    rest = busy_cpus - own - other_cpus - cli_cpus
    print(f"- loadavg before `{a['load']}`, after `{b['load']}`; interval {dt:.0f} s; "
          f"CPU time used {busy_cpus:.2f} of {ncpu} CPUs (steal {100.0 * steal / max(tot, 1):.1f}%): "
          f"nvmfd{' + iperf3 server' if case in ('seq128', 'all') else ''} {own:.2f}, "
          f"clients (nvmf perf / iperf3 -c) {cli_cpus:.2f}, other running processes "
          f"{other_cpus:.2f}, unattributed {rest:+.2f} (processes that started and exited in the "
          f"interval, e.g. a compiler, and softirq not charged to a process; about ±0.2 is "
          f"noise: the machine totals are tick-sampled, the clients' times are exact)")
    top = other[:5]
    if top:
        print("- top other CPU consumers: " + "; ".join(
            f"`{cmd[:60]}` {100.0 * d / hz / dt:.1f}%" for d, _, _, cmd in top))


def fmt(v, nd=0):
    if v is None:
        return "-"
    if nd == 0:
        return f"{v:,.0f}"
    return f"{v:,.{nd}f}"


def mmm(vals, nd=0):
    vals = [v for v in vals if v is not None]
    if not vals:
        return "-"
    return (f"{fmt(min(vals), nd)} / **{fmt(statistics.median(vals), nd)}** / "
            f"{fmt(max(vals), nd)}")


def runs(vals, nd=0):
    return ", ".join(fmt(v, nd) for v in vals)


def perf_metrics(j, wall, nvmfd_cpu, client_cpu):
    t = j["total"]
    r, w = t["read"], t["write"]
    ios = r["total_ios"] + w["total_ios"]
    rt = max(r.get("runtime", 0), w.get("runtime", 0)) / 1000.0 or wall
    m = {
        "iops": r["iops"] + w["iops"],
        "mibs": (r["bw"] + w["bw"]) / 1024.0,
        "mean_us": ((r["lat_ns"]["mean"] * r["lat_ns"]["N"] + w["lat_ns"]["mean"] * w["lat_ns"]["N"])
                    / max(r["lat_ns"]["N"] + w["lat_ns"]["N"], 1)) / 1000.0,
        "rmean_us": r["lat_ns"]["mean"] / 1000.0 if r["lat_ns"]["N"] else None,
        "wmean_us": w["lat_ns"]["mean"] / 1000.0 if w["lat_ns"]["N"] else None,
        "p99_us": r["clat_ns"]["percentile"]["99.000000"] / 1000.0 if r["clat_ns"]["N"] else None,
        "p999_us": r["clat_ns"]["percentile"]["99.900000"] / 1000.0 if r["clat_ns"]["N"] else None,
        "wp99_us": w["clat_ns"]["percentile"]["99.000000"] / 1000.0 if w["clat_ns"]["N"] else None,
        "ios": ios,
        "errors": t.get("error", 0),
        # CPU over the process's whole life (connect + run + disconnect) / run time
        "tgt_cpu_pct": 100.0 * nvmfd_cpu / rt,
        "cli_cpu_pct": 100.0 * client_cpu / rt,
        "tgt_us_per_io": 1e6 * nvmfd_cpu / ios if ios else None,
        "cli_us_per_io": 1e6 * client_cpu / ios if ios else None,
    }
    return m


def iperf_metrics(j):
    e = j["end"]
    c = e.get("cpu_utilization_percent", {})
    return {
        "mibs": e["sum_received"]["bits_per_second"] / 8 / 1048576,
        "tgt_cpu_pct": c.get("remote_total"),  # server, core 0 (where nvmfd runs)
        "cli_cpu_pct": c.get("host_total"),    # client, core 1 (where nvmf perf runs)
        "retrans": e.get("sum_sent", {}).get("retransmits"),
    }


CASES = {
    "rr128": ("4 KiB random read, QD 128",
              [("IOPS", "iops", 0), ("mean lat µs", "mean_us", 1), ("p99.9 µs", "p999_us", 0),
               ("nvmfd CPU %", "tgt_cpu_pct", 0), ("perf CPU %", "cli_cpu_pct", 0),
               ("nvmfd CPU µs/IO", "tgt_us_per_io", 2), ("perf CPU µs/IO", "cli_us_per_io", 2)]),
    "qd1": ("4 KiB random read, QD 1",
            [("IOPS", "iops", 0), ("mean lat µs", "mean_us", 1), ("p99 µs", "p99_us", 1),
             ("p99.9 µs", "p999_us", 1), ("nvmfd CPU %", "tgt_cpu_pct", 0),
             ("perf CPU %", "cli_cpu_pct", 0), ("nvmfd CPU µs/IO", "tgt_us_per_io", 2)]),
    "seq128": ("128 KiB sequential read, QD 32 (nvmfd) vs iperf3 single stream",
               [("MiB/s", "mibs", 0), ("core-0 CPU % (nvmfd / iperf3 server)", "tgt_cpu_pct", 0),
                ("core-1 CPU % (perf / iperf3 client)", "cli_cpu_pct", 0),
                ("nvmfd CPU µs/IO", "tgt_us_per_io", 1)]),
    "rw": ("4 KiB random read/write 75/25, QD 64",
           [("IOPS (r+w)", "iops", 0), ("read mean µs", "rmean_us", 0),
            ("write mean µs", "wmean_us", 0), ("read p99 µs", "p99_us", 0),
            ("write p99 µs", "wp99_us", 0), ("nvmfd CPU %", "tgt_cpu_pct", 0),
            ("perf CPU %", "cli_cpu_pct", 0), ("nvmfd CPU µs/IO", "tgt_us_per_io", 2)]),
}


def table(path):
    data = {}  # case -> variant -> [metrics per round]
    order = {}
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            case, variant, rnd, kind, jpath, wall, tcpu, ccpu = line.rstrip("\n").split("\t")
            try:
                j = json.load(open(jpath))
                if kind == "perf":
                    m = perf_metrics(j, float(wall), float(tcpu), float(ccpu))
                else:
                    m = iperf_metrics(j)
            except Exception as e:  # a failed run: keep it visible
                m = {"failed": f"{type(e).__name__}: {e}"}
            data.setdefault(case, {}).setdefault(variant, []).append((int(rnd), m))
            order.setdefault(case, [])
            if variant not in order[case]:
                order[case].append(variant)
    med = {}
    for case, (title, cols) in CASES.items():
        if case not in data:
            continue
        print(f"\n### {title}\n")
        print("min / **median** / max over the runs; the per-run values (in run order) below.\n")
        print("| variant | runs | " + " | ".join(c[0] for c in cols) + " |")
        print("|---|---|" + "---|" * len(cols))
        per_run = []
        for v in order[case]:
            ms = [m for _, m in sorted(data[case][v], key=lambda x: x[0])]
            ok = [m for m in ms if "failed" not in m]
            bad = len(ms) - len(ok)
            cells = [mmm([m.get(k) for m in ok], nd) for _, k, nd in cols]
            print(f"| {v} | {len(ok)}{f' (+{bad} failed)' if bad else ''} | " + " | ".join(cells) + " |")
            for _, k, _ in cols:
                vals = [m.get(k) for m in ok if m.get(k) is not None]
                med[(case, v, k)] = statistics.median(vals) if vals else None
            key = cols[0][1]
            per_run.append(f"- {v}: {cols[0][0]} per run: {runs([m.get(key) for m in ok], cols[0][2])}")
            if case == "qd1":
                per_run.append(f"  - p99.9 µs per run: {runs([m.get('p999_us') for m in ok], 1)}")
            errs = sum(m.get("errors", 0) or 0 for m in ok)
            if errs:
                per_run.append(f"  - **{errs} I/O errors reported**")
            for m in ms:
                if "failed" in m:
                    per_run.append(f"  - failed run: {m['failed']}")
        print()
        print("\n".join(per_run))

    def g(case, v, k):
        return med.get((case, v, k))

    print("\n### Ratios (medians)\n")
    x = g("rr128", "null", "iops")
    if x:
        print(f"- 4 KiB randread QD128 null: {x:,.0f} IOPS = {x / SPDK_RR128_IOPS:.2f}× the SPDK "
              f"reference ({SPDK_RR128_IOPS:,} IOPS, measured by others)")
    a, b = g("qd1", "null", "mean_us"), g("qd1", "null", "p999_us")
    if a and b:
        print(f"- QD1 null: mean {a:.1f} µs = {a / SPDK_QD1_MEAN_US:.1f}× SPDK's {SPDK_QD1_MEAN_US:.0f} µs; "
              f"p99.9 {b:.0f} µs = {b / SPDK_QD1_P999_US:.1f}× SPDK's {SPDK_QD1_P999_US:.0f} µs "
              f"(lower is better; reference measured by others)")
    n = g("seq128", "nvmfd null", "mibs")
    for ref in ("iperf3 (default 128 KiB writes)", "iperf3 -l 1M"):
        i = g("seq128", ref, "mibs")
        if n and i:
            print(f"- 128 KiB seq read null: {n:,.0f} MiB/s vs {ref} {i:,.0f} MiB/s: "
                  f"nvmfd/iperf3 = {n / i:.2f}")
    if n:
        print(f"- 128 KiB seq read null vs SPDK reference {SPDK_SEQ_MIBS:,.0f} MiB/s (3.8 GiB/s): "
              f"{n / SPDK_SEQ_MIBS:.2f}×")


def main():
    cmd = sys.argv[1]
    if cmd == "snap":
        snap(sys.argv[2])
    elif cmd == "load":
        load(*sys.argv[2:7])
    elif cmd == "table":
        table(sys.argv[2])
    else:
        sys.exit(f"unknown subcommand {cmd}")


if __name__ == "__main__":
    main()
