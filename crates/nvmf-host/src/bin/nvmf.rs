//! nvmf — command line front end of the user-space NVMe/TCP and NVMe/RDMA initiator:
//! `discover` (the discovery log, as `nvme discover` prints it), `identify`
//! (controller and namespaces), `perf` (load generator, like spdk_nvme_perf /
//! fio), and `rpc` (handed to `nvmf_rpc::cli_main`). No root, no kernel
//! modules, no nvme-cli needed. `connect`, `connect-all` and `doctor` are the exception: they
//! drive and check the Linux kernel host (nvmf_host::kernel_host).

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use nvmf_host::kernel_host::cli as kcli;
use nvmf_host::multipath::{self, Policy};
use nvmf_host::perf::{self, PerfConfig, Workload};
use nvmf_host::{ConnectOptions, Controller, NsIdentifier, TransportId, DISCOVERY_NQN};
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

const MAIN_HELP: &str = "\
Examples:
  # What does the target at 127.0.0.1:4420 export?
  nvmf discover -t tcp -a 127.0.0.1 -s 4420

  # The same over NVMe/RDMA (RoCE, soft-RoCE, InfiniBand; needs rdma-core and an RDMA device)
  nvmf discover -t rdma -a 10.0.0.2 -s 4420

  # Controller and namespace details of one subsystem
  nvmf identify -r 'trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:4420 subnqn:nqn.2024-01.io.nvmfd:default'

  # 4 KiB random reads, queue depth 32, 10 seconds
  nvmf perf -r 'trtype:TCP traddr:127.0.0.1 trsvcid:4420 subnqn:nqn.2024-01.io.nvmfd:default' -q 32 -o 4096 -w randread -t 10

  # Data integrity: write tagged blocks, read them back, exit 1 on any mismatch
  nvmf perf -r '...' -w randrw -o 131072 -t 5 --verify

  # Control a running nvmfd (JSON-RPC, SPDK method names)
  nvmf rpc nvmf_get_subsystems

  # The Linux kernel host: connect (and keep it across reboots), then check the host
  nvmf connect -t tcp -a 10.0.0.1 -n nqn.2016-06.io.spdk:cnode1 --persist
  nvmf doctor

Exit status: 0 success, 1 failure (connection, NVMe error, I/O error, verify mismatch), 2 usage.";

const PERF_HELP: &str = "\
The transport ID (-r) is SPDK's format: space separated key:value pairs
  trtype:TCP adrfam:IPv4 traddr:ADDR trsvcid:PORT subnqn:NQN [hostnqn:NQN] [ns:NSID]
trtype:RDMA (adrfam IPv4 or IPv6) runs every queue over NVMe/RDMA instead: one RC queue pair
per queue, data through Keyed SGLs of one registered region (writes up to the controller's
in-capsule size in the capsule); digests and TLS are NVMe/TCP only.

Workloads (-w): read, write (sequential), randread, randwrite, rw, randrw (mixes; -M = % reads).
Each queue is its own TCP connection (or RDMA queue pair) with -q commands in flight, so
--queues 4 -q 32 keeps 128 commands in flight in all.
Threads: with -c/--cores LIST (e.g. -c 0,1 or -c 0-3), one thread per listed CPU is pinned there
and the queues are spread over them round-robin (queue 1 on the first CPU, queue 2 on the
second, ...); --queues then defaults to one per CPU and may not be fewer. The report sums all
threads (the per-queue lines show each queue's CPU). A CPU this process may not run on is an
error before anything connects. Without -c: one unpinned thread per queue.
Each thread sends all commands it queued in one turn with one sendmsg per queue, reads what a
socket has in one go and busy-polls up to --poll-us without completions before it sleeps in
poll(2): at high queue depth it uses a whole core per thread, by design.
Sequential runs and --verify give every queue its own LBA range.

--verify writes every block with its LBA and a generation tag, checks every read of a block
written in this run, and reads back all written blocks at the end. Mismatches are listed with
their LBA; the exit status is then 1.

Multipath: give -r several times (one subsystem NQN, several addresses or ports), or one -r
naming a discovery service (its address and port, the subsystem's NQN) with --discover-paths.
One controller per path (same host NQN and host ID); each queue is opened on every path and
its commands go to the usable paths of the best ANA class (optimized, else non-optimized,
never inaccessible or lost) by --policy. When a path is lost (connection closed, keep-alive
failure) or answers with a path status, its commands in flight are re-issued on another path
(same LBA, same data; --verify stays exact); the run fails only when no path is left. ANA
state is read at start and on every ANA Change event. --reconnect connects a lost path again
in the background and uses it when it is back. The report adds a per-path table
(and paths[] in the JSON): IOPS, MiB/s, mean/p99 latency, retried, failed over, errors,
state changes, and when the path carried I/O.

Output: IOPS, MiB/s, latency mean/min/max and p50/p90/p99/p99.9/p99.99 (microseconds) per queue
and in total. --json prints fio-style JSON (jobs[].read.iops, .bw in KiB/s, .lat_ns, 
.clat_ns.percentile[\"99.000000\"], ...).

Examples:
  nvmf perf -r 'trtype:TCP traddr:127.0.0.1 trsvcid:4420 subnqn:nqn.2024-01.io.nvmfd:default' -w randread -q 64 -t 10
  nvmf perf -r '...' -w randwrite -o 131072 -q 16 -c 0,1            # 2 threads, 2 queues
  nvmf perf -r '...' -w randread -q 32 -c 0-3 --queues 8             # 4 threads, 2 queues each
  nvmf perf -r '...' -w randrw -M 70 -o 4096 -t 5 --verify --hdr-digest --data-digest
  nvmf perf -r '...' -w read -o 131072 --json > result.json
  nvmf perf -r 'traddr:10.0.0.1 trsvcid:4420 subnqn:NQN' -r 'traddr:10.0.0.2 trsvcid:4420 subnqn:NQN' --verify -w randrw
  nvmf perf -r 'traddr:10.0.0.1 trsvcid:8009 subnqn:NQN' --discover-paths --policy queue-depth";

const TOP_HELP: &str = "\
Reads nvmf_get_path_stats from nvmfd's RPC socket every interval and shows, for the interval:
IOPS, MiB/s, mean and p99 latency (microseconds, capsule received to response queued, p99 from
the target's histogram buckets), commands in flight and errors, per listener, per path (listener,
subsystem, host, controller), per host and per namespace.

Flags: STALLED = commands in flight and none completed in the interval (a dead or hung path);
SLOW = mean or p99 latency over 3x the median of the view's rows with I/O. Flagged rows are red
on a terminal. When stdout is not a terminal (or with --once / --iterations), frames are printed
one after another as plain text.

Examples:
  nvmf top                                  # live, refreshed every second, until Ctrl-C
  nvmf top -s /tmp/nvmfd.sock --once        # one frame (two samples 1 s apart), then exit
  nvmf top --iterations 10 --interval 0.5 > top.log";

const BENCH_HELP: &str = "\
SPEC is a TOML file or a preset name. A spec has [[target]]s, [[workload]]s, and optional
repetitions (default 3), baseline (a target name or cell \"target/workload\") and goal (per client):

  repetitions = 3
  baseline = \"nvmfd\"
  goal = { iops = 10000 }             # or { mibps = 500 }
  engine = \"nvmf-perf\"               # nvmf-perf (default), fio, fio-kernel, spdk-perf
                                      # (and fio_engine, spdk_perf, clients: docs/BENCH.md)

  [[target]]
  name = \"nvmfd\"
  kind = \"nvmfd\"                     # started by the harness from config (relative to the spec)
  config = \"nvmfd.json\"
  addr = \"127.0.0.1\"                 # where it listens (default 127.0.0.1)

  [[target]]
  name = \"other\"
  kind = \"trid\"                      # already running, any vendor
  trid = \"trtype:TCP traddr:10.0.0.2 trsvcid:4420 subnqn:nqn.2016-06.io.spdk:cnode1\"
  nsid = 1                            # any target: the namespace to load (default 1)
  # also kind = \"spdk\" (binary, config = SPDK JSON, cores, rpc_socket) and
  # kind = \"kernel\" (backing, addr, port, nqn): see docs/BENCH.md

  [[workload]]
  name = \"4k-randrw\"                 # default: derived, e.g. randrw-4k-75r-qd64
  rw = \"randrw\"                      # read write randread randwrite rw randrw (default randread)
  mix = 75                            # % reads, rw/randrw only (default 50)
  bs = \"4k\"                          # bytes, k/m suffixes (default 4k)
  qd = 64                             # per queue (default 32)
  queues = 1                          # connections, alias jobs (default 1)
  runtime = 30                        # seconds measured, or \"30s\", \"2m\" (default 10)
  ramp = 5                            # seconds before measuring (default 0)

Presets (targets from --target TRID): quick (4 KiB randread QD32, 5 s, 1 round),
seed-4k-randrw (4 KiB randrw 75/25 QD64), latency (4 KiB randread QD1),
throughput (128 KiB sequential read QD32 x 4 queues); 30 s + 5 s ramp, 3 rounds.

The matrix runs every target x workload cell once per round; targets alternate within a round
and each round starts at another target and workload, so drift hits all alike.

`plan` prints, per target, the interface that routes to it, its NUMA node and CPUs, the CPUs
the initiator would be pinned to (one per queue; free CPUs of the NIC's node first), warnings
(OFF-NODE, BUSY CORE > 50 %, no NUMA information), then the run list and the estimated time.
`run` runs the matrix (see `nvmf bench run --help` and docs/BENCH.md).

Examples:
  nvmf bench plan quick --target 'trtype:TCP traddr:127.0.0.1 trsvcid:4420 subnqn:nqn.2024-01.io.nvmfd:default'
  nvmf bench plan bench.toml";

const BENCH_RUN_HELP: &str = "\
`run` starts each nvmfd target once (its config, a private RPC socket and log in a temp dir,
reactors on the NIC node's CPUs the initiator does not use), runs every cell of the matrix with
`nvmf perf` in process (pinned as `plan` shows), and stops the targets at the end.

Around each measured window (ramp excluded) it reads the CPU time of the target's processes and
of this one (/proc/PID/stat), /proc/stat steal, /proc/loadavg, the target's own I/O counters
(nvmfd: nvmf_get_stats) and, where perf can count, `perf stat` cycles and instructions. Per run:
IOPS, MiB/s (2^20 bytes), Gbit/s (10^9 bits), latency percentiles, CPU us per I/O and cores,
cycles and instructions per I/O; a failed run is recorded and the matrix goes on.

Outputs in --out DIR: bench.json (everything; `bench compare` reads it), bench.csv, bench.md,
bench.html; the summary table is printed at the end.

Ctrl-C stops the current run cleanly, stops the targets and writes the outputs with what was
measured (interrupted = true, exit status 130); a second Ctrl-C exits at once.
Exit status: 0 all runs measured, 1 a run failed or an error, 130 interrupted.

Examples:
  nvmf bench run bench.toml --out results/
  nvmf bench run quick --target 'trtype:TCP traddr:10.0.0.2 trsvcid:4420 subnqn:nqn.2016-06.io.spdk:cnode1'";

const DISCOVER_HELP: &str = "\
Examples:
  nvmf discover -t tcp -a 127.0.0.1 -s 4420
  nvmf discover -t rdma -a 10.0.0.2 -s 4420
  nvmf discover -a 10.0.0.5 -s 8009 --hostnqn nqn.2014-08.org.nvmexpress:uuid:...
  nvmf discover -a 127.0.0.1 --json";

#[derive(Parser)]
#[command(
    name = "nvmf",
    version,
    about = "User-space NVMe over Fabrics (NVMe/TCP, NVMe/RDMA) initiator: discover, identify, perf, rpc",
    long_about = "User-space NVMe over Fabrics (NVMe/TCP, NVMe/RDMA) initiator. Talks to a target directly over \
TCP or RDMA from user space: no root, no kernel modules, no nvme-cli. Use it to see what a target exports \
(discover, identify), to measure it (perf), and to control nvmfd (rpc). The exceptions are connect, \
connect-all and doctor: they connect and check the Linux kernel's NVMe-oF host (root, nvme-tcp).",
    after_help = MAIN_HELP
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Print the discovery log of a target (like `nvme discover`)
    #[command(after_help = DISCOVER_HELP)]
    Discover(DiscoverArgs),
    /// Connect to a subsystem and print Identify Controller / Namespace data
    Identify(IdentifyArgs),
    /// Measure a subsystem: IOPS, bandwidth, latency percentiles (like spdk_nvme_perf)
    #[command(after_help = PERF_HELP)]
    Perf(PerfArgs),
    /// Live per-path view of a running nvmfd: IOPS, MiB/s, latency per listener, path, host, namespace
    #[command(after_help = TOP_HELP)]
    Top(TopArgs),
    /// Benchmark matrices against NVMe-oF targets: `plan` shows what `run` would do, `run` does it, `compare` sets two reports side by side
    #[command(after_help = BENCH_HELP)]
    Bench(BenchArgs),
    /// A gateway group on Ceph as one member sees it: `status`, and `move` an ANA group to another member
    #[command(subcommand, after_help = GW_HELP)]
    Gw(GwCmd),
    /// Connect the Linux kernel host to a subsystem through /dev/nvme-fabrics (like `nvme connect`); --persist for boot
    #[command(after_help = kcli::CONNECT_HELP)]
    Connect(kcli::ConnectArgs),
    /// Connect the Linux kernel host to everything a discovery controller lists (like `nvme connect-all`)
    #[command(after_help = kcli::CONNECT_ALL_HELP)]
    ConnectAll(kcli::ConnectAllArgs),
    /// Check this Linux host's NVMe-oF set-up: modules, multipath, host NQN/ID, paths, MTU, ANA; one finding per line with its fix
    #[command(after_help = kcli::DOCTOR_HELP)]
    Doctor(kcli::DoctorArgs),
    /// For nvmf's udev rule: the properties that name an nvmfd namespace /dev/disk/by-nvmfd/SUBSYSTEM/NAME
    #[command(after_help = kcli::UDEV_NAME_HELP)]
    UdevName(kcli::UdevNameArgs),
    /// Control a running nvmfd over JSON-RPC (arguments are passed through)
    #[command(disable_help_flag = true)]
    Rpc {
        /// Method and its arguments, passed verbatim to the RPC client
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
        args: Vec<String>,
    },
    /// Print a shell completion script: `nvmf completions bash > /etc/bash_completion.d/nvmf`
    Completions {
        /// bash, zsh, fish, elvish or powershell
        shell: clap_complete::Shell,
    },
    /// Packaging: write the man pages (nvmf.1, nvmf-SUBCOMMAND.1) into DIR
    #[command(hide = true)]
    GenerateMan {
        /// Directory to write into (created when missing)
        dir: std::path::PathBuf,
    },
}

#[derive(Args)]
struct BenchArgs {
    #[command(subcommand)]
    cmd: BenchCmd,
}

#[derive(Subcommand)]
enum BenchCmd {
    /// Show the placement of each target and the expanded run list, without running anything
    #[command(after_help = BENCH_HELP)]
    Plan(BenchPlanArgs),
    /// Compare two bench reports (bench.json) cell by cell: A and B side by side, ratio, verdict
    #[command(after_help = BENCH_COMPARE_HELP)]
    Compare(BenchCompareArgs),
    /// Run the matrix: start the targets, measure every cell, write JSON/CSV/Markdown/HTML
    #[command(after_help = BENCH_RUN_HELP)]
    Run(BenchRunArgs),
}

const BENCH_COMPARE_HELP: &str = "\
Cells are matched by id (target/workload); cells in only one report are listed. Per cell:
IOPS, MiB/s, p99 latency, target and initiator CPU per I/O as mean (min-max) over the rounds
for A and B, the ratio B/A, and a verdict (\"B faster\", \"B slower\", \"B lower latency\", ...)
only where the two min-max ranges do not overlap; otherwise \"no clear difference (ranges overlap)\".

Examples:
  nvmf bench compare before/bench.json after/bench.json
  nvmf bench compare a.json b.json --html compare.html";

#[derive(Args)]
struct BenchCompareArgs {
    /// The first report (A): a bench.json written by `nvmf bench run`
    #[arg(value_name = "A.json")]
    a: std::path::PathBuf,
    /// The second report (B), compared with A
    #[arg(value_name = "B.json")]
    b: std::path::PathBuf,
    /// Also write an HTML page with paired bar charts to this file
    #[arg(long, value_name = "OUT.html")]
    html: Option<std::path::PathBuf>,
}

#[derive(Args)]
struct BenchRunArgs {
    /// A spec file (TOML) or a preset: quick, seed-4k-randrw, latency, throughput
    #[arg(value_name = "SPEC")]
    spec: String,
    /// Add a running target by transport ID (repeatable; required with a preset)
    #[arg(long = "target", value_name = "TRID")]
    targets: Vec<String>,
    /// Directory for the outputs (default: nvmf-bench-YYYYMMDD-HHMMSS in the current directory)
    #[arg(long = "out", value_name = "DIR")]
    out: Option<std::path::PathBuf>,
    /// The nvmfd binary for nvmfd targets (default: next to this nvmf, else on PATH)
    #[arg(long = "nvmfd", value_name = "PATH")]
    nvmfd: Option<std::path::PathBuf>,
    /// Pin nothing: neither the initiator's threads nor a started nvmfd's reactors
    #[arg(long = "no-pin")]
    no_pin: bool,
    /// Milliseconds of /proc/stat sampling to find busy cores before placing (0 = skip)
    #[arg(long = "sample-ms", default_value_t = 250, value_name = "MS")]
    sample_ms: u64,
}

#[derive(Args)]
struct BenchPlanArgs {
    /// A spec file (TOML) or a preset: quick, seed-4k-randrw, latency, throughput
    #[arg(value_name = "SPEC")]
    spec: String,
    /// Add a running target by transport ID (repeatable; required with a preset)
    #[arg(long = "target", value_name = "TRID")]
    targets: Vec<String>,
    /// Milliseconds of /proc/stat sampling to find busy cores (0 = skip)
    #[arg(long = "sample-ms", default_value_t = 250, value_name = "MS")]
    sample_ms: u64,
}

const GW_HELP: &str = "\
A gateway group (nvmfd --gateway-group, docs/GATEWAY-GROUPS.md) keeps each ANA group
optimized on one live member, its owner, and inaccessible on the others. Ask any member:

  nvmf gw status -s /run/nvmfd/gw1.sock        members, leases, owners, epoch, fencings
  nvmf gw status --json                         the same as JSON
  nvmf gw move 2 gw3 -s /run/nvmfd/gw1.sock     ANA group 2 goes to gw3 (planned: its owner
                                                drains and hands over; hosts see no error)
";

#[derive(Subcommand)]
enum GwCmd {
    /// Members and their leases, each ANA group's home and owner, the epoch, fencings, counters
    Status {
        /// A member's JSON-RPC socket
        #[arg(short = 's', long = "server", default_value = nvmf_rpc::DEFAULT_RPC_SOCKET, value_name = "PATH")]
        socket: std::path::PathBuf,
        /// Print the member's answer as JSON
        #[arg(long)]
        json: bool,
    },
    /// Move ANA group GROUP to member TO (it becomes its home): planned, without fencing
    Move {
        /// ANA group ID
        group: u32,
        /// The member that should own it
        to: String,
        /// A member's JSON-RPC socket
        #[arg(short = 's', long = "server", default_value = nvmf_rpc::DEFAULT_RPC_SOCKET, value_name = "PATH")]
        socket: std::path::PathBuf,
        /// Seconds to wait until TO owns it (0: do not wait)
        #[arg(long, default_value_t = 30, value_name = "SECONDS")]
        wait: u64,
    },
}

#[derive(Args)]
struct TopArgs {
    /// nvmfd's JSON-RPC socket
    #[arg(short = 's', long = "server", default_value = nvmf_rpc::DEFAULT_RPC_SOCKET, value_name = "PATH")]
    socket: std::path::PathBuf,
    /// Seconds between samples
    #[arg(short = 'i', long, default_value_t = 1.0, value_name = "SECONDS")]
    interval: f64,
    /// Print one frame and exit
    #[arg(long, conflicts_with = "iterations")]
    once: bool,
    /// Print N frames and exit (default: until interrupted)
    #[arg(short = 'n', long, value_name = "N")]
    iterations: Option<u64>,
}

#[derive(Args, Clone)]
struct CommonConn {
    /// Host NQN to present (default: /etc/nvme/hostnqn or one derived from /etc/machine-id)
    #[arg(long, visible_alias = "hostnqn-str", value_name = "NQN")]
    hostnqn: Option<String>,
    /// Request header digests (CRC32C over every PDU header)
    #[arg(long, short = 'g')]
    hdr_digest: bool,
    /// Request data digests (CRC32C over all data)
    #[arg(long, short = 'G')]
    data_digest: bool,
    /// Seconds to wait for the connection and each admin command; in perf, also how long the
    /// final drain waits, and (plus --keep-alive-tmo) how long I/Os in flight may go without any
    /// completion (in the run and the verify read-back) before the run fails naming them
    #[arg(long, default_value_t = 10, value_name = "SECONDS")]
    timeout: u64,
    /// Keep SQ flow control on the I/O queues (by default they ask the target to disable it,
    /// so that a read can complete with its last data PDU instead of a response capsule)
    #[arg(long)]
    sqflow: bool,
    /// Connect with TLS 1.3 using the PSK in FILE (one `NVMeTLSkey-1:xx:...:` key, as `nvme
    /// gen-tls-key` prints it; the file must not be readable by group or others). The target
    /// must know the same key for this host NQN (`nvmf_subsystem_add_host --psk`), e.g.
    /// `nvmf perf -r 'trtype:TCP ... subnqn:NQN' --hostnqn HOSTNQN --tls-key /etc/nvme/tls.key`
    #[arg(long, value_name = "FILE")]
    tls_key: Option<std::path::PathBuf>,
    /// PSK identity to offer with --tls-key: 1 = `NVMe1R0x <hostnqn> <subnqn> <digest>` (what
    /// the Linux host offers), 0 = the older `NVMe0R0x <hostnqn> <subnqn>`
    #[arg(long, value_name = "0|1", default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=1))]
    tls_identity: u8,
    /// With --tls-key: hand each TLS session to the kernel after the handshake (kTLS), so the
    /// kernel builds and opens the records. auto: where the kernel has the `tls` module
    /// (`modprobe tls`), OpenSSL's records otherwise (said once); off: always OpenSSL
    #[arg(long, value_name = "auto|off", default_value = "auto")]
    ktls: nvmf_tls::Ktls,
    /// Zero-copy sends of write data (MSG_ZEROCOPY, as the target's --zerocopy-send): the kernel
    /// sends H2C payloads straight from the I/O buffers, and a write completes once the kernel
    /// reports it no longer reads them. auto: on, and off for a connection whose sends the
    /// kernel copies anyway (loopback); always: never turned off (for measuring); off: copy.
    /// Clear-text NVMe/TCP only
    #[arg(long = "zerocopy-send", value_name = "auto|always|off", default_value = "auto",
          value_parser = ["auto", "always", "off"])]
    zerocopy_send: String,
    /// Smallest write payload sent zero-copy, in bytes
    #[arg(long = "zerocopy-threshold", value_name = "BYTES", default_value_t = 16384,
          value_parser = clap::value_parser!(u32).range(2048..=(16 << 20)))]
    zerocopy_threshold: u32,
}

impl CommonConn {
    fn options(&self, trid: TransportId) -> Result<ConnectOptions> {
        let mut o = ConnectOptions::new(trid);
        if let Some(h) = &self.hostnqn {
            o = o.with_hostnqn(h);
        }
        o = o.with_digests(self.hdr_digest, self.data_digest);
        o.timeout = Duration::from_secs(self.timeout.max(1));
        o.disable_sqflow = !self.sqflow;
        o.zerocopy = match self.zerocopy_send.as_str() {
            "off" => None,
            mode => Some(nvmf_host::ZeroCopySend {
                threshold: self.zerocopy_threshold,
                always: mode == "always",
            }),
        };
        if let Some(path) = &self.tls_key {
            let key = nvmf_host::TlsKey::from_file(&path.to_string_lossy(), self.tls_identity)
                .map_err(|e| anyhow::anyhow!("--tls-key: {e}"))?;
            o.tls = Some(nvmf_host::TlsKey {
                ktls: self.ktls,
                ..key
            });
        }
        Ok(o)
    }
}

#[derive(Args)]
struct DiscoverArgs {
    /// Transport type: tcp or rdma
    #[arg(short = 't', long = "transport", default_value = "tcp")]
    transport: String,
    /// Target address
    #[arg(short = 'a', long = "traddr", value_name = "ADDR")]
    traddr: String,
    /// Target port
    #[arg(
        short = 's',
        long = "trsvcid",
        default_value = "4420",
        value_name = "PORT"
    )]
    trsvcid: String,
    /// Discovery subsystem NQN
    #[arg(short = 'n', long = "nqn", default_value = DISCOVERY_NQN)]
    nqn: String,
    /// Print the log as JSON
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    conn: CommonConn,
}

#[derive(Args)]
struct IdentifyArgs {
    /// Transport ID: 'trtype:TCP|RDMA adrfam:IPv4 traddr:ADDR trsvcid:PORT subnqn:NQN'
    #[arg(short = 'r', long = "trid", value_name = "TRID")]
    trid: String,
    #[command(flatten)]
    conn: CommonConn,
}

#[derive(Args)]
struct PerfArgs {
    /// Transport ID: 'trtype:TCP|RDMA adrfam:IPv4 traddr:ADDR trsvcid:PORT subnqn:NQN'.
    /// Give it several times for several paths to one subsystem (multipath)
    #[arg(short = 'r', long = "trid", value_name = "TRID", required = true)]
    trid: Vec<String>,
    /// The -r address is a discovery service: use every NVMe/TCP path it
    /// lists for the -r subnqn
    #[arg(long = "discover-paths")]
    discover_paths: bool,
    /// Multipath: spread I/O over the usable paths by round-robin, or to the
    /// path with the fewest commands in flight (queue-depth)
    #[arg(long, default_value = "round-robin", value_parser = parse_policy, value_name = "POLICY")]
    policy: Policy,
    /// Multipath: connect a lost path again in the background (backoff 100 ms
    /// to 2 s) and use it when it is back; commands wait up to 30 s for a path
    #[arg(long)]
    reconnect: bool,
    /// Keep Alive Timeout announced at connect, in seconds (Keep Alive sent every half of it; a
    /// path whose Keep Alive fails, after --timeout, is lost). 0 = none
    #[arg(long = "keep-alive-tmo", value_name = "SECONDS", default_value_t = 10)]
    keep_alive_tmo: u64,
    /// I/Os in flight per queue
    #[arg(
        short = 'q',
        long = "queue-depth",
        default_value_t = 32,
        value_name = "QD"
    )]
    queue_depth: u16,
    /// I/O size in bytes (suffixes k, m allowed: 4k, 128k)
    #[arg(short = 'o', long = "io-size", default_value = "4096", value_parser = parse_size, value_name = "BYTES")]
    io_size: u32,
    /// Workload: read, write, randread, randwrite, rw, randrw
    #[arg(short = 'w', long = "workload", default_value = "randread", value_parser = parse_workload)]
    workload: Workload,
    /// Percentage of reads for rw/randrw
    #[arg(short = 'M', long = "rwmixread", default_value_t = 50, value_parser = clap::value_parser!(u32).range(0..=100))]
    read_pct: u32,
    /// Run time in seconds
    #[arg(
        short = 't',
        long = "time",
        default_value_t = 10,
        value_name = "SECONDS"
    )]
    time: u64,
    /// Seconds of load before the measured time (statistics start after it)
    #[arg(long = "ramp", default_value_t = 0, value_name = "SECONDS")]
    ramp: u64,
    /// Number of I/O queues (TCP connections or RDMA queue pairs), each with
    /// -q commands in flight [default: 1, with -c one per listed CPU]
    #[arg(long, value_name = "N")]
    queues: Option<u16>,
    /// CPUs to run on, one pinned thread each, the queues spread over them
    /// round-robin, one report for all: '0,1', '0-3' or '0-1,6'
    #[arg(short = 'c', long = "cores", visible_alias = "cpus", value_parser = parse_cores, value_name = "LIST")]
    cores: Option<CoreList>,
    /// Namespace ID (default: ns: from the transport ID, else 1)
    #[arg(long = "ns", value_name = "NSID")]
    nsid: Option<u32>,
    /// Check data: tagged writes, checked reads, read-back at the end
    #[arg(long)]
    verify: bool,
    /// fio-style JSON output
    #[arg(long)]
    json: bool,
    /// Largest write sent as in-capsule data (0 = always R2T); default: the target's limit
    #[arg(long, value_parser = parse_size, value_name = "BYTES")]
    in_capsule: Option<u32>,
    /// No progress line even on a terminal
    #[arg(long)]
    no_progress: bool,
    /// Busy-poll the sockets for up to US microseconds without a completion
    /// before sleeping in poll(2) (0 = sleep whenever idle, lower CPU use,
    /// higher latency at low queue depth)
    #[arg(long = "poll-us", value_name = "US", default_value_t = perf::DEFAULT_POLL_US)]
    poll_us: u64,
    #[command(flatten)]
    conn: CommonConn,
}

fn parse_size(s: &str) -> std::result::Result<u32, String> {
    let t = s.trim().to_ascii_lowercase();
    let (num, mul) = if let Some(n) = t.strip_suffix("kib").or(t.strip_suffix("k")) {
        (n, 1024u64)
    } else if let Some(n) = t.strip_suffix("mib").or(t.strip_suffix("m")) {
        (n, 1024 * 1024)
    } else {
        (t.as_str(), 1)
    };
    let v: u64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a size (e.g. 4096, 4k, 128k, 1m)"))?;
    u32::try_from(v * mul).map_err(|_| format!("'{s}' is too large"))
}

fn parse_policy(s: &str) -> std::result::Result<Policy, String> {
    Policy::parse(s).ok_or_else(|| format!("'{s}' is not a policy (round-robin, queue-depth)"))
}

fn parse_workload(s: &str) -> std::result::Result<Workload, String> {
    Workload::parse(s).ok_or_else(|| {
        format!("'{s}' is not a workload (read, write, randread, randwrite, rw, randrw)")
    })
}

/// A parsed `--cores` list (a newtype so clap takes it as one value).
#[derive(Clone, Debug)]
struct CoreList(Vec<usize>);

fn parse_cores(s: &str) -> std::result::Result<CoreList, String> {
    let v = nvmf_host::bench::placement::parse_cpulist(s)?;
    if v.is_empty() {
        return Err("empty CPU list (give CPU numbers like 0,1 or a range like 0-3)".into());
    }
    let mut seen = std::collections::BTreeSet::new();
    for &c in &v {
        if !seen.insert(c) {
            return Err(format!("CPU {c} is listed twice (one thread per CPU)"));
        }
    }
    Ok(CoreList(v))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Discover(a) => discover(a),
        Cmd::Identify(a) => identify(a),
        Cmd::Perf(a) => run_perf(a),
        Cmd::Top(a) => top(a),
        Cmd::Gw(c) => gw(c),
        Cmd::Bench(b) => bench(b),
        Cmd::Connect(a) => kcli::connect(a),
        Cmd::ConnectAll(a) => kcli::connect_all(a),
        Cmd::Doctor(a) => kcli::doctor(a),
        Cmd::UdevName(a) => kcli::udev_name(a),
        Cmd::Rpc { args } => {
            let code = nvmf_rpc::cli_main(&args);
            return ExitCode::from(code.clamp(0, 255) as u8);
        }
        Cmd::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(shell, &mut Cli::command(), "nvmf", &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
        Cmd::GenerateMan { dir } => generate_man(&dir),
    };
    match r {
        Ok(code) => code,
        Err(e) => {
            eprintln!("nvmf: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// nvmf.1 and one page per subcommand (nvmf-perf.1, nvmf-gw-status.1, ...), from the clap
/// definition, into `dir`.
fn generate_man(dir: &std::path::Path) -> Result<ExitCode> {
    use clap::CommandFactory;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut cmd = Cli::command();
    cmd.build();
    fn write(cmd: &clap::Command, name: &str, dir: &std::path::Path) -> Result<()> {
        let mut out = Vec::new();
        clap_mangen::Man::new(cmd.clone().name(name.to_string()))
            .render(&mut out)
            .with_context(|| format!("rendering {name}"))?;
        std::fs::write(dir.join(format!("{name}.1")), out)
            .with_context(|| format!("writing {name}.1"))?;
        for sub in cmd
            .get_subcommands()
            .filter(|c| !c.is_hide_set() && c.get_name() != "help")
        {
            write(sub, &format!("{name}-{}", sub.get_name()), dir)?;
        }
        Ok(())
    }
    write(&cmd, "nvmf", dir)?;
    Ok(ExitCode::SUCCESS)
}

fn bench(b: BenchArgs) -> Result<ExitCode> {
    use nvmf_host::bench::{placement::Host, spec::BenchSpec, Plan};
    match b.cmd {
        BenchCmd::Plan(a) => {
            let spec = BenchSpec::load(&a.spec, &a.targets)?;
            let plan = Plan::new(spec, &Host::system(), Duration::from_millis(a.sample_ms));
            print!("{}", plan.render());
            Ok(ExitCode::SUCCESS)
        }
        BenchCmd::Compare(a) => {
            use nvmf_host::bench::{compare, html, output::load_report};
            let ra = load_report(&a.a)?;
            let rb = load_report(&a.b)?;
            let c = compare::compare(
                &ra,
                &rb,
                &a.a.display().to_string(),
                &a.b.display().to_string(),
            );
            let mut text = c.render();
            if let Some(out) = &a.html {
                std::fs::write(out, html::compare_html(&c))
                    .with_context(|| format!("writing {}", out.display()))?;
                text += &format!("\nHTML: {}\n", out.display());
            }
            // A closed pipe (`| head`) is not an error worth a panic.
            let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes());
            Ok(ExitCode::SUCCESS)
        }
        BenchCmd::Run(a) => bench_run(a),
    }
}

/// `nvmf-bench-YYYYMMDD-HHMMSS` (UTC) for a default output directory.
fn default_out_dir() -> std::path::PathBuf {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    // Civil date from days since 1970-01-01 (proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    std::path::PathBuf::from(format!(
        "nvmf-bench-{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    ))
}

fn bench_run(a: BenchRunArgs) -> Result<ExitCode> {
    use nvmf_host::bench::run::{self as brun, Event, RunOptions};
    use nvmf_host::bench::{placement::Host, spec, spec::BenchSpec, Plan};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let bench_spec = BenchSpec::load(&a.spec, &a.targets)?;
    let spec_text = if std::path::Path::new(&a.spec).exists() {
        std::fs::read_to_string(&a.spec).unwrap_or_default()
    } else {
        spec::preset_toml(&a.spec).unwrap_or_default().to_string()
    };
    // Ctrl-C: the first stops the current run cleanly and ends the bench
    // with what was measured; a second one exits at once (status 130).
    let stop = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register_conditional_shutdown(
        signal_hook::consts::SIGINT,
        130,
        Arc::clone(&stop),
    )?;
    signal_hook::flag::register(signal_hook::consts::SIGINT, Arc::clone(&stop))?;
    let plan = Plan::new(
        bench_spec,
        &Host::system(),
        Duration::from_millis(a.sample_ms),
    );
    for (t, p) in plan.spec.targets.iter().zip(&plan.placements) {
        for w in &p.warnings {
            eprintln!("nvmf bench: {}: {w}", t.name);
        }
    }
    let out = a.out.clone().unwrap_or_else(default_out_dir);
    let opts = RunOptions {
        out: out.clone(),
        nvmfd: a.nvmfd.clone(),
        no_pin: a.no_pin,
        engine: Default::default(),
        spec_source: a.spec.clone(),
        spec_text,
        command: std::env::args()
            .map(|x| if x.contains(' ') { format!("'{x}'") } else { x })
            .collect::<Vec<_>>()
            .join(" "),
    };
    let tty = std::io::stdout().is_terminal();
    let bar = tty.then(|| {
        let b = indicatif::ProgressBar::new(plan.runs.len() as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:30} {pos}/{len} runs, ~{msg} left  {prefix}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    });
    let mut on_event = |e: Event<'_>| match e {
        Event::TargetStarting { target } => match &bar {
            Some(b) => b.set_prefix(format!("starting {target}")),
            None => println!("starting target {target}"),
        },
        Event::RunStarting { run, left_s, .. } => {
            if let Some(b) = &bar {
                b.set_message(format!("{}m{:02}s", left_s / 60, left_s % 60));
                b.set_prefix(format!("{} round {}", run.cell, run.round + 1));
            }
        }
        Event::RunDone {
            run,
            total,
            outcome,
        } => {
            let line = match outcome {
                Ok(m) => format!(
                    "[{}/{total}] {} round {}: {:.0} IOPS, {:.2} MiB/s, p99 {:.1} us",
                    run.index + 1,
                    run.cell,
                    run.round + 1,
                    m.iops,
                    m.mibps,
                    m.result.all.p99_us
                ),
                Err(why) => format!(
                    "[{}/{total}] {} round {}: FAILED: {why}",
                    run.index + 1,
                    run.cell,
                    run.round + 1
                ),
            };
            match &bar {
                Some(b) => {
                    b.println(line);
                    b.inc(1);
                }
                None => println!("{line}"),
            }
        }
    };
    let outcome = brun::run(&plan, &opts, &stop, &mut on_event)?;
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    print!("\n{}", brun::text_summary(&outcome.report));
    for f in &outcome.files {
        println!("wrote {}", f.display());
    }
    if outcome.report.interrupted || stop.load(Ordering::Relaxed) {
        return Ok(ExitCode::from(130));
    }
    Ok(if outcome.report.failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn gw(c: GwCmd) -> Result<ExitCode> {
    use std::time::Instant;
    let call = |socket: &std::path::Path, method: &str, params: Option<&serde_json::Value>| {
        let mut client = nvmf_rpc::RpcClient::connect(socket, 0)
            .with_context(|| format!("connecting to {}", socket.display()))?;
        client.set_timeout(Some(Duration::from_secs(10)))?;
        client
            .call(method, params)
            .map_err(|e| anyhow::anyhow!("{method}: {e}"))
    };
    match c {
        GwCmd::Status { socket, json } => {
            let v = call(&socket, "nvmf_gateway_group_status", None)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                print!("{}", nvmf_host::gw::format_status(&v));
            }
            Ok(ExitCode::SUCCESS)
        }
        GwCmd::Move {
            group,
            to,
            socket,
            wait,
        } => {
            let p = serde_json::json!({ "anagrpid": group, "to": to });
            let r = call(&socket, "nvmf_gateway_group_move", Some(&p))?;
            println!(
                "ANA group {group}: home is now {to} (owner was {})",
                r["owner"].as_str().unwrap_or("nobody")
            );
            if wait == 0 {
                return Ok(ExitCode::SUCCESS);
            }
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(wait) {
                let v = call(&socket, "nvmf_gateway_group_status", None)?;
                if nvmf_host::gw::owner_of(&v, group) == Some((to.clone(), true)) {
                    println!(
                        "ANA group {group} is owned by {to} ({} ms)",
                        t0.elapsed().as_millis()
                    );
                    return Ok(ExitCode::SUCCESS);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            bail!("ANA group {group} is not owned by {to} after {wait} s (see nvmf gw status)")
        }
    }
}

fn top(a: TopArgs) -> Result<ExitCode> {
    use nvmf_host::top;
    use std::io::Write;
    use std::time::Instant;
    if !(a.interval.is_finite() && a.interval > 0.0 && a.interval <= 3600.0) {
        bail!("--interval must be between 0 and 3600 seconds");
    }
    let mut client = nvmf_rpc::RpcClient::connect(&a.socket, 0)?;
    client.set_timeout(Some(Duration::from_secs(10)))?;
    let sample = |c: &mut nvmf_rpc::RpcClient| -> Result<top::Sample> {
        let v = c
            .call("nvmf_get_path_stats", None)
            .map_err(|e| anyhow::anyhow!("nvmf_get_path_stats: {e}"))?;
        Ok(top::Sample::from_json(&v))
    };
    let frames = if a.once { Some(1) } else { a.iterations };
    let live = frames.is_none() && std::io::stdout().is_terminal();
    let mut prev = sample(&mut client)?;
    let mut at = Instant::now();
    let mut shown = 0u64;
    let mut out = std::io::stdout().lock();
    while frames.is_none_or(|n| shown < n) {
        std::thread::sleep(Duration::from_secs_f64(a.interval));
        let cur = sample(&mut client)?;
        let now = Instant::now();
        let f = top::frame(&prev, &cur, now.duration_since(at).as_secs_f64());
        let text = top::render(&f, live);
        if live {
            // Home + clear screen, then the frame.
            write!(out, "\x1b[H\x1b[2J{text}")?;
        } else {
            if shown > 0 {
                writeln!(out)?;
            }
            write!(out, "{text}")?;
        }
        out.flush()?;
        prev = cur;
        at = now;
        shown += 1;
    }
    Ok(ExitCode::SUCCESS)
}

fn discover(a: DiscoverArgs) -> Result<ExitCode> {
    let trtype = if a.transport.eq_ignore_ascii_case("tcp") {
        nvmf_host::trid::TrType::Tcp
    } else if a.transport.eq_ignore_ascii_case("rdma") {
        nvmf_host::trid::TrType::Rdma
    } else {
        bail!("transport '{}' is not supported (tcp or rdma)", a.transport);
    };
    let mut trid = TransportId::tcp(&a.traddr, &a.trsvcid, &a.nqn);
    trid.trtype = trtype;
    if a.trsvcid.parse::<u16>().is_err() {
        bail!("port '{}' is not a port number", a.trsvcid);
    }
    trid.hostnqn = a.conn.hostnqn.clone();
    let opts = a.conn.options(trid)?;
    let ctrl = Controller::connect(&opts)
        .with_context(|| format!("connecting to discovery controller at {}", opts.trid))?;
    let log = ctrl.discovery_log().context("reading the discovery log")?;
    if a.json {
        let records: Vec<_> = log
            .entries
            .iter()
            .map(|e| {
                let mut r = serde_json::json!({
                    "trtype": nvmf_host::discovery::trtype_str(e.trtype),
                    "adrfam": nvmf_host::discovery::adrfam_str(e.adrfam),
                    "subtype": nvmf_host::discovery::subtype_str(e.subtype),
                    "treq": nvmf_host::discovery::treq_str(e.treq),
                    "portid": e.portid,
                    "trsvcid": e.trsvcid,
                    "subnqn": e.subnqn,
                    "traddr": e.traddr,
                    "eflags": nvmf_host::discovery::eflags_str(e.eflags),
                    "sectype": nvmf_host::discovery::sectype_str(e.sectype),
                    "cntlid": e.cntlid,
                    "asqsz": e.asqsz,
                });
                if let Some(t) = &e.rdma {
                    use nvmf_host::discovery::{rdma_cms_str, rdma_prtype_str, rdma_qptype_str};
                    r["rdma_prtype"] = rdma_prtype_str(t.prtype).into();
                    r["rdma_qptype"] = rdma_qptype_str(t.qptype).into();
                    r["rdma_cms"] = rdma_cms_str(t.cms).into();
                    r["rdma_pkey"] = t.pkey.get().into();
                }
                r
            })
            .collect();
        let v = serde_json::json!({"genctr": log.genctr, "records": records});
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", nvmf_host::format_nvme_cli(&log));
    }
    Ok(ExitCode::SUCCESS)
}

fn identify(a: IdentifyArgs) -> Result<ExitCode> {
    let trid = TransportId::parse(&a.trid)?;
    let opts = a.conn.options(trid)?;
    let ctrl =
        Controller::connect(&opts).with_context(|| format!("connecting to {}", opts.trid))?;
    let id = ctrl.identify();
    let vs = ctrl.version();
    println!("subnqn:      {}", id.subnqn());
    println!("cntlid:      {}", ctrl.cntlid());
    println!("model:       {}", id.model());
    println!("serial:      {}", id.serial());
    println!("firmware:    {}", id.firmware());
    println!(
        "version:     {}.{}.{}",
        vs >> 16,
        (vs >> 8) & 0xff,
        vs & 0xff
    );
    println!(
        "type:        {}",
        match id.cntrltype {
            1 => "I/O controller",
            2 => "discovery controller",
            3 => "administrative controller",
            _ => "unspecified",
        }
    );
    println!("max queue:   {} (CAP.MQES+1)", ctrl.max_queue_size());
    match ctrl.max_transfer() {
        Some(m) => println!("max xfer:    {m} bytes (MDTS {})", id.mdts),
        None => println!("max xfer:    unlimited (MDTS 0)"),
    }
    println!(
        "in-capsule:  {} bytes (IOCCSZ {})",
        ctrl.in_capsule_size(),
        id.ioccsz.get()
    );
    println!("kas:         {} x 100 ms", id.kas.get());
    println!("maxcmd:      {}", id.maxcmd.get());
    println!("nn:          {}", id.nn.get());
    println!("oncs:        {:#06x}", id.oncs.get());
    println!("sgls:        {:#010x}", id.sgls.get());
    if ctrl.is_discovery() {
        return Ok(ExitCode::SUCCESS);
    }
    for nsid in ctrl.active_namespaces().context("active namespace list")? {
        let ns = ctrl.identify_namespace(nsid)?;
        let bs = ns.block_size();
        let blocks = ns.nsze.get();
        println!(
            "namespace {nsid}: {blocks} blocks of {bs} bytes ({:.2} GiB)",
            (blocks * bs) as f64 / (1u64 << 30) as f64
        );
        if let Some(name) = ns.vendor_name() {
            println!("  name:  {name} (nvmfd)");
        }
        for d in ctrl.ns_descriptors(nsid).unwrap_or_default() {
            match d {
                NsIdentifier::Eui64(v) => println!("  eui64: {}", hex(&v)),
                NsIdentifier::Nguid(v) => println!("  nguid: {}", hex(&v)),
                NsIdentifier::Uuid(v) => {
                    println!("  uuid:  {}", nvmf_host::controller::format_uuid(&v))
                }
                NsIdentifier::Csi(c) => println!("  csi:   {c}"),
                NsIdentifier::Other { nidt, nid } => println!("  type {nidt}: {}", hex(&nid)),
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn run_perf(a: PerfArgs) -> Result<ExitCode> {
    let mut trids = a
        .trid
        .iter()
        .map(|t| TransportId::parse(t))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    multipath::check_same_subsystem(&trids)?;
    let trid = trids[0].clone();
    let nsid = a.nsid.or(trid.nsid).unwrap_or(1);
    let mut opts = a.conn.options(trid.clone())?;
    opts.kato = Duration::from_secs(a.keep_alive_tmo);
    if a.discover_paths {
        if trids.len() > 1 {
            bail!("--discover-paths takes one -r (the discovery service and the subsystem NQN)");
        }
        trids = multipath::discover_paths(&opts, &trid, &trid.subnqn).with_context(|| {
            format!(
                "asking the discovery service at {}:{} for the paths to {}",
                trid.traddr, trid.trsvcid, trid.subnqn
            )
        })?;
    }
    let mut cfg = PerfConfig::new(opts);
    if trids.len() > 1 || a.discover_paths {
        cfg.connect.trid = trids[0].clone();
        cfg.paths = trids;
    }
    cfg.policy = a.policy;
    cfg.reconnect = a.reconnect;
    cfg.nsid = nsid;
    cfg.queue_depth = a.queue_depth;
    cfg.io_size = a.io_size;
    cfg.workload = a.workload;
    cfg.read_pct = a.read_pct;
    cfg.duration = Duration::from_secs(a.time);
    cfg.ramp = Duration::from_secs(a.ramp);
    cfg.queues = match (a.queues, &a.cores) {
        (Some(q), Some(c)) if (q as usize) < c.0.len() => bail!(
            "--queues {q} is fewer than the {} CPUs given with -c: every pinned thread needs at \
             least one queue (omit --queues for one queue per CPU)",
            c.0.len()
        ),
        (Some(q), _) => q,
        (None, Some(c)) => u16::try_from(c.0.len()).unwrap_or(u16::MAX),
        (None, None) => 1,
    };
    cfg.cores = a.cores.map(|c| c.0);
    cfg.verify = a.verify;
    cfg.in_capsule = a.in_capsule;
    cfg.poll = Duration::from_micros(a.poll_us);
    cfg.progress = !a.json && !a.no_progress && std::io::stdout().is_terminal();
    let report = perf::run(&cfg)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&perf::to_json(&report))?);
    } else {
        print!("{}", perf::format_text(&report));
    }
    if report.ok() {
        Ok(ExitCode::SUCCESS)
    } else {
        if a.json {
            eprintln!(
                "nvmf perf: {} errors, {} mismatched blocks",
                report.errors(),
                report.mismatched_blocks()
            );
        }
        Ok(ExitCode::from(1))
    }
}
