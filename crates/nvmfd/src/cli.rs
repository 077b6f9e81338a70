//! Command line of the `nvmfd` daemon: the clap definition and the parser of
//! the `-m/--cores` core list (SPDK-style lists, ranges and hex masks).

use clap::{CommandFactory, Parser};
use std::path::{Path, PathBuf};

const AFTER_HELP: &str = "\
EXAMPLES:
  nvmfd
      Serve a 1 GiB RAM namespace (nqn.2024-01.io.nvmfd:default, NSID 1) and the
      discovery service on 127.0.0.1:4420, one reactor per online core.
  nvmfd -c nvmf.json -m 0-3
      Serve what nvmf.json describes (the JSON that SPDK's `save_config` writes:
      bdev_malloc_create, nvmf_create_transport, nvmf_create_subsystem,
      nvmf_subsystem_add_ns / add_host / add_listener, ...) on cores 0 to 3.
  nvmfd -m 0x1 --log-level debug
      One reactor on core 0, verbose logging.
  nvmfd -m 0-3 --queue-placement kernel
      Leave each queue on the reactor the kernel's SO_REUSEPORT hash picked
      (default: balanced, the I/O queues of each controller spread evenly).
  nvmfd -m 0 --poll-us 200
      Busy-poll up to 200 us after each burst of work before sleeping (lower
      latency at low queue depth; --poll-us 0 sleeps as soon as idle).

CONNECTING FROM A LINUX HOST (nvme-cli):
  nvme discover -t tcp -a 127.0.0.1 -s 4420
  nvme connect  -t tcp -a 127.0.0.1 -s 4420 -n nqn.2024-01.io.nvmfd:default
  (add --hdr-digest --data-digest to use CRC32C digests)

CONTROL PLANE (JSON-RPC, SPDK method names):
  nvmfd -r /tmp/nvmfd.sock --state /var/lib/nvmfd/state.json
  nvmf rpc -s /tmp/nvmfd.sock bdev_malloc_create -b Malloc0 64 512
  nvmf rpc -s /tmp/nvmfd.sock nvmf_subsystem_add_ns nqn.2016-06.io.spdk:cnode1 Malloc0

LIMITS AND LIVENESS (defaults in brackets; 0 = unlimited / off):
  --max-connections [4096], --max-connections-per-host [512]: connections
      (NVMe/TCP and NVMe/RDMA together) in total and per peer IP address; over
      the cap a TCP connection is closed at once (RST), an RDMA connect request
      rejected before any queue pair is set up, and a rate-limited line names
      the peer.
  --max-controllers [1024], --max-controllers-per-host [64],
  --max-io-queues-per-host [2048]: NVM controllers and I/O queues, checked at
      Fabrics Connect (per host NQN); over the cap the Connect fails with
      Connect Controller Busy (retryable). A host that must authenticate
      (DH-HMAC-CHAP) counts once it has.
  --max-discovery-controllers [256], --max-unauthenticated-controllers [128]:
      discovery controllers, and NVM controllers whose host has not
      authenticated yet, each in a pool of their own; a full pool evicts its
      oldest, so floods of either never lock a real host out.
  --discovery-kato-ms [120000]: keep-alive timeout of discovery controllers
      whose host asks for none; discovery controllers are always reaped.
  --tcp-keepalive-idle-s [30], --tcp-keepalive-interval-s [5],
  --tcp-keepalive-probes [4], --tcp-user-timeout-ms [idle+interval*probes]:
      a peer that vanished without FIN/RST is detected and its controller
      torn down in bounded time, also with keep-alive (KATO) 0.
  --tcp-congestion [system default]: congestion control of the connections;
      cubic or dctcp avoid BBR's per-send pacing timer on loopback and in VMs.
  --log-rate [20]: per-connection log lines (accept, close) per second and
      reactor, and refused-Connect / bad-CC lines per second; the rest are counted in
      one \"suppressed\" line.

OBSERVABILITY:
  nvmfd --metrics 127.0.0.1:9498
      Prometheus text at http://127.0.0.1:9498/metrics (off unless given):
      commands, bytes, errors by status, in-flight and latency histograms
      per subsystem, listener, host NQN, controller ID and namespace.
  nvmf rpc nvmf_get_path_stats; nvmf top -s /var/tmp/spdk.sock

SYSTEMD (packaging/nvmfd.service, docs/OPERATIONS.md):
  Type=notify: READY=1 once the RPC socket and every listener accept; STATUS=
  counts controllers and I/O queues; with WatchdogSec=, WATCHDOG=1 only while
  every reactor answers a ping (a stuck reactor gets nvmfd restarted);
  STOPPING=1 on SIGTERM. SIGHUP (systemctl reload) reads the -c file again and
  applies what differs live, as load_config would; a file that does not parse
  or apply changes nothing (logged).

A config error (it names the method, the parameter and the problem) stops
nvmfd before it serves anything. SIGINT/SIGTERM shut it down cleanly (exit 0).
A --state file written by a newer nvmfd (a downgrade) is refused at start.";

/// nvmfd: a user-space NVMe over Fabrics (NVMe/TCP) target.
#[derive(Debug, Parser)]
#[command(name = "nvmfd", version, about, long_about = None, after_help = AFTER_HELP)]
pub struct Cli {
    /// JSON config file in SPDK `save_config` form. Without it nvmfd serves its
    /// embedded default: a 1 GiB RAM namespace on 127.0.0.1:4420.
    #[arg(short = 'c', long = "config", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Packaging: write the man page nvmfd.8 into DIR and exit.
    #[arg(long = "generate-man", value_name = "DIR", hide = true)]
    pub generate_man: Option<PathBuf>,

    /// Packaging: print the completion script for SHELL (bash, zsh, fish, ...) and exit.
    #[arg(long = "completions", value_name = "SHELL", hide = true)]
    pub completions: Option<clap_complete::Shell>,

    /// Cores to run reactors on (one pinned thread each): a list "0,1", ranges
    /// "0-3,6", SPDK brackets "[0,1]" or a hex mask "0x3". Default: every core
    /// this process may run on.
    #[arg(short = 'm', long = "cores", value_name = "CORES", value_parser = parse_core_list)]
    pub cores: Option<CoreList>,

    /// Unix socket of the SPDK-compatible JSON-RPC server (`nvmf rpc -s PATH`,
    /// SPDK's scripts/rpc.py -s PATH). A stale socket file is replaced; one a
    /// live server answers on is an error.
    #[arg(short = 'r', long = "rpc-socket", value_name = "PATH",
          default_value = nvmf_rpc::DEFAULT_RPC_SOCKET)]
    pub rpc_socket: PathBuf,

    /// State file: the configuration is saved there (crash-safe) after every
    /// successful state-changing RPC. If FILE exists at startup, nvmfd
    /// restores exactly that configuration and ignores -c (with a log line);
    /// otherwise it starts from -c (or the embedded default) and writes FILE.
    #[arg(long = "state", value_name = "FILE")]
    pub state: Option<PathBuf>,

    /// Log filter: error, warn, info, debug, trace, or a tracing directive such
    /// as "nvmfd=debug,nvmf_tcp=trace". Overrides RUST_LOG when given.
    #[arg(long = "log-level", value_name = "LEVEL")]
    pub log_level: Option<String>,

    /// Longest busy-poll window in microseconds: after a loop turn that did
    /// work, a reactor keeps checking its sockets without sleeping
    /// (epoll_wait with a zero timeout) before it blocks in the kernel
    /// again. Cuts the wake-up latency of a loaded reactor (QD 1). Adaptive:
    /// a reactor whose commands all wait on backends (RBD, files) does not
    /// poll, and the window shrinks while the gaps between events are
    /// longer than this cap; an idle reactor sleeps and uses no CPU.
    /// 0 = never poll.
    #[arg(long = "poll-us", value_name = "US", default_value_t = DEFAULT_POLL_US,
          value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    pub poll_us: u64,

    /// Zero-copy sends of read data (MSG_ZEROCOPY, SPDK's
    /// enable_zerocopy_send_server): the kernel sends C2HData payloads
    /// straight from the request buffers instead of copying them into the
    /// socket. auto: on, and off for a connection whose sends the kernel
    /// reports it copies anyway (loopback, a NIC without scatter-gather);
    /// always: never turned off (for measuring); off: always copy.
    /// Clear-text NVMe/TCP only.
    #[arg(long = "zerocopy-send", value_name = "MODE", value_enum, default_value_t = ZeroCopySend::Auto)]
    pub zerocopy_send: ZeroCopySend,

    /// Kernel TLS (SPDK's enable_ktls): after the TLS handshake, hand the
    /// session's keys to the kernel so that it builds and opens the records
    /// (no user-space copy or record per call). auto: where the kernel has
    /// the `tls` module (`modprobe tls`), OpenSSL's records otherwise (said
    /// once in the log); off: always OpenSSL. A host that sends a TLS
    /// KeyUpdate on a kernel TLS connection is disconnected (the kernel
    /// cannot take new receive keys); use off for such hosts.
    #[arg(long = "ktls", value_name = "MODE", value_enum, default_value_t = KtlsMode::Auto)]
    pub ktls: KtlsMode,

    /// Smallest C2HData payload sent zero-copy, in bytes (SPDK's
    /// zerocopy_threshold): below it, copying is cheaper than the kernel's
    /// completion report.
    #[arg(long = "zerocopy-threshold", value_name = "BYTES", default_value_t = DEFAULT_ZEROCOPY_THRESHOLD,
          value_parser = clap::value_parser!(u32).range(512..=(16 << 20)))]
    pub zerocopy_threshold: u32,

    /// Close a TCP connection that sends no ICReq within this many
    /// milliseconds of being accepted (0 = never).
    #[arg(long = "icreq-timeout-ms", value_name = "MS", default_value_t = crate::reactor::ICREQ_TIMEOUT.as_millis() as u64)]
    pub icreq_timeout_ms: u64,

    /// Close a connection whose queue is not connected to a controller
    /// (Fabrics Connect) within this many milliseconds of being accepted
    /// (0 = never).
    #[arg(long = "connect-timeout-ms", value_name = "MS", default_value_t = crate::reactor::CONNECT_TIMEOUT.as_millis() as u64)]
    pub connect_timeout_ms: u64,

    /// Most connections (NVMe/TCP and NVMe/RDMA) open at once, all hosts
    /// together (0 = unlimited). A TCP connection over the cap is closed at
    /// once, an RDMA connect request rejected.
    #[arg(long = "max-connections", value_name = "N", default_value_t = crate::limits::DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,

    /// Most connections (TCP and RDMA) open at once from one peer IP address (0 =
    /// unlimited). Hosts behind one NAT address share this budget.
    #[arg(long = "max-connections-per-host", value_name = "N", default_value_t = crate::limits::DEFAULT_MAX_CONNECTIONS_PER_HOST)]
    pub max_connections_per_host: usize,

    /// Most NVM controllers alive at once, all hosts together (0 =
    /// unlimited; discovery controllers and those whose host has not
    /// authenticated yet have pools of their own). A Connect over the cap
    /// gets Connect Controller Busy.
    #[arg(long = "max-controllers", value_name = "N", default_value_t = nvmf_core::target::DEFAULT_MAX_CONTROLLERS)]
    pub max_controllers: usize,

    /// Most discovery controllers alive at once (0 = unlimited); when full,
    /// the oldest is evicted to make room.
    #[arg(long = "max-discovery-controllers", value_name = "N", default_value_t = nvmf_core::target::DEFAULT_MAX_DISCOVERY_CONTROLLERS)]
    pub max_discovery_controllers: usize,

    /// Most NVM controllers whose host must still authenticate
    /// (DH-HMAC-CHAP) alive at once (0 = unlimited); when full, the oldest
    /// is evicted to make room. They count against --max-controllers and
    /// --max-controllers-per-host once the host has authenticated.
    #[arg(long = "max-unauthenticated-controllers", value_name = "N", default_value_t = nvmf_core::target::DEFAULT_MAX_UNAUTHENTICATED_CONTROLLERS)]
    pub max_unauthenticated_controllers: usize,

    /// Most controllers alive at once for one host NQN (0 = unlimited).
    #[arg(long = "max-controllers-per-host", value_name = "N", default_value_t = nvmf_core::target::DEFAULT_MAX_CONTROLLERS_PER_HOST)]
    pub max_controllers_per_host: usize,

    /// Most I/O queues connected at once for one host NQN, all its
    /// controllers together (0 = unlimited). The per-controller limit is
    /// the transport's max_qpairs_per_ctrlr.
    #[arg(long = "max-io-queues-per-host", value_name = "N", default_value_t = nvmf_core::target::DEFAULT_MAX_IO_QUEUES_PER_HOST)]
    pub max_io_queues_per_host: usize,

    /// Keep-alive timeout in milliseconds of a discovery controller whose
    /// host asks for none (Connect KATO 0 or Set Features Keep Alive Timer
    /// 0), so discovery controllers are always reaped (as nvmet does).
    #[arg(long = "discovery-kato-ms", value_name = "MS", default_value_t = nvmf_core::target::DEFAULT_DISCOVERY_KATO_MS,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub discovery_kato_ms: u32,

    /// TCP keepalive of every accepted connection: seconds without traffic
    /// before the first probe (0 = no keepalive probes).
    #[arg(long = "tcp-keepalive-idle-s", value_name = "S", default_value_t = crate::limits::DEFAULT_KEEPALIVE_IDLE_S,
          value_parser = clap::value_parser!(u64).range(0..=32767))]
    pub tcp_keepalive_idle_s: u64,

    /// Seconds between unanswered TCP keepalive probes.
    #[arg(long = "tcp-keepalive-interval-s", value_name = "S", default_value_t = crate::limits::DEFAULT_KEEPALIVE_INTERVAL_S,
          value_parser = clap::value_parser!(u64).range(1..=32767))]
    pub tcp_keepalive_interval_s: u64,

    /// Unanswered TCP keepalive probes before the connection is dropped.
    #[arg(long = "tcp-keepalive-probes", value_name = "N", default_value_t = crate::limits::DEFAULT_KEEPALIVE_PROBES,
          value_parser = clap::value_parser!(u32).range(1..=127))]
    pub tcp_keepalive_probes: u32,

    /// TCP_USER_TIMEOUT in milliseconds: how long sent data or keepalive
    /// probes may stay unacknowledged before the connection is dropped.
    /// Default: idle + interval × probes; 0 = not set (kernel default).
    #[arg(long = "tcp-user-timeout-ms", value_name = "MS")]
    pub tcp_user_timeout_ms: Option<u64>,

    /// TCP congestion control of nvmfd's connections (set on the listen
    /// sockets, inherited by every accepted one), e.g. cubic or dctcp.
    /// Default: the system's (/proc/sys/net/ipv4/tcp_congestion_control).
    /// BBR paces every send with a timer when the interface has no fq qdisc
    /// (loopback, most virtual NICs): in a VM each timer costs an exit, and
    /// 4 KiB QD128 throughput on loopback halves in about half the runs
    /// (BENCHMARKS.md); nvmfd logs a hint at start when the default is bbr.
    #[arg(long = "tcp-congestion", value_name = "NAME")]
    pub tcp_congestion: Option<String>,

    /// Serve Prometheus / OpenMetrics text at http://ADDR:PORT/metrics
    /// (per-path counters and latency histograms; its own thread). Off
    /// unless given.
    #[arg(long = "metrics", value_name = "ADDR:PORT")]
    pub metrics: Option<std::net::SocketAddr>,

    /// Per-connection log lines (accepted, closed, refused) each reactor
    /// writes per second at most, and lines about refused Connects (over a limit,
    /// unknown subsystem, host not allowed) and unsupported CC values the
    /// whole target writes per
    /// second at most; the rest are counted and reported in one
    /// "suppressed N similar ... messages" line (0 = no limit). Controller
    /// teardowns are always logged.
    #[arg(long = "log-rate", value_name = "N", default_value_t = crate::limits::DEFAULT_LOG_RATE)]
    pub log_rate: u32,

    /// Close a connection when the data of an R2T it was sent has not all
    /// arrived (H2CData) within this many milliseconds: a host that never
    /// sends the data it announced cannot pin its buffers (0 = never).
    #[arg(long = "h2c-timeout-ms", value_name = "MS", default_value_t = nvmf_tcp::H2C_TIMEOUT.as_millis() as u64)]
    pub h2c_timeout_ms: u64,

    /// Outstanding R2T data per connection in bytes: a write whose R2T would
    /// go beyond it waits until earlier transfers finish (one R2T is always
    /// allowed). Total slot buffer memory is bounded separately by the
    /// transport's num_shared_buffers × io_unit_size.
    #[arg(long = "max-r2t-bytes", value_name = "BYTES", default_value_t = nvmf_tcp::MAX_R2T_BYTES,
          value_parser = clap::value_parser!(u32).range(4096..))]
    pub max_r2t_bytes: u32,

    /// Which reactor serves each I/O queue. balanced: right after its
    /// Fabrics Connect, an I/O queue moves to the reactor holding the
    /// fewest queues of its controller (round-robin, starting at the least
    /// loaded reactor; reactors on the NUMA node of the network device
    /// preferred), so one controller's queues spread evenly. kernel: a
    /// queue stays on the reactor whose SO_REUSEPORT listener accepted it
    /// (the kernel's connection hash decides). Admin queues always stay.
    #[arg(long = "queue-placement", value_name = "POLICY", value_enum,
          default_value_t = crate::placement::Policy::Balanced)]
    pub queue_placement: crate::placement::Policy,

    /// Join the gateway group NAME on Ceph (docs/GATEWAY-GROUPS.md): every
    /// ANA group is optimized on the one live member that owns it and
    /// inaccessible on the others; a member whose lease lapses fences
    /// itself, and a survivor blocklists it before taking its groups.
    /// Needs --gateway-id, --group-cluster and --group-pool; every
    /// namespace must be an RBD image of that cluster in a subsystem with
    /// ANA reporting.
    #[arg(long = "gateway-group", value_name = "NAME", requires_all = ["gateway_id", "group_cluster", "group_pool"])]
    pub gateway_group: Option<String>,

    /// This member's ID in the group: stable across restarts (its lease is
    /// named after it), unique in the group.
    #[arg(long = "gateway-id", value_name = "ID", requires = "gateway_group")]
    pub gateway_id: Option<String>,

    /// The registered Ceph cluster (bdev_rbd_register_cluster name) the
    /// group uses: its RADOS client is what a survivor blocklists, so every
    /// RBD namespace must use it.
    #[arg(
        long = "group-cluster",
        value_name = "CLUSTER",
        requires = "gateway_group"
    )]
    pub group_cluster: Option<String>,

    /// The pool holding the group's record and leases.
    #[arg(long = "group-pool", value_name = "POOL", requires = "gateway_group")]
    pub group_pool: Option<String>,

    /// The lease duration L in milliseconds: renewed every L/3, a member
    /// fences itself after L - L/5 without a renewal, survivors take over
    /// after L. A failover pauses I/O for about L.
    #[arg(long = "group-lease-ms", value_name = "MS", default_value_t = 15_000,
          value_parser = clap::value_parser!(u64).range(1_500..=600_000))]
    pub group_lease_ms: u64,

    /// How long, at most, a failback (or rebalancing) waits for hosts, in
    /// milliseconds. The member that owns a group hands it to the returning
    /// home only once every host connected to the group here has connected
    /// there too: a host whose controller has not reconnected yet would
    /// otherwise have no optimized path and wait. A host that never comes
    /// (it was moved or retired) holds the group back this long. The
    /// default covers twice the Linux host's default reconnect delay.
    #[arg(long = "group-failback-wait-ms", value_name = "MS", default_value_t = 20_000,
          value_parser = clap::value_parser!(u64).range(0..=3_600_000))]
    pub group_failback_wait_ms: u64,

    /// ANA groups whose home is this member (e.g. 1,2): it owns them while
    /// alive and gets them back after a failure (failback). Recorded when a
    /// group first gets a home; `nvmf gw move` changes it later.
    #[arg(
        long = "gateway-ana-groups",
        value_name = "LIST",
        value_delimiter = ',',
        requires = "gateway_group"
    )]
    pub gateway_ana_groups: Vec<u32>,
}

/// Default of `--zerocopy-threshold`.
pub const DEFAULT_ZEROCOPY_THRESHOLD: u32 = 16384;

/// `--zerocopy-send`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ZeroCopySend {
    Auto,
    Always,
    Off,
}

/// `--ktls`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KtlsMode {
    Auto,
    Off,
}

/// Default of `--poll-us`.
pub const DEFAULT_POLL_US: u64 = 50;

/// A sorted, deduplicated list of CPU numbers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreList(pub Vec<usize>);

/// Largest CPU number accepted (the kernel's cpu_set_t holds 1024).
const MAX_CPU: usize = 1023;

/// Parses `0,1`, `0-3`, `[0-1,4]` or a hex mask `0x3`.
pub fn parse_core_list(s: &str) -> Result<CoreList, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err("empty core list".into());
    }
    let mut cores = Vec::new();
    if let Some(hex) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        if hex.is_empty() || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(format!(
                "{s:?}: a core mask is hex digits after 0x, e.g. 0x3"
            ));
        }
        // Walk the mask digit by digit from the least significant end so masks
        // wider than 128 bits work too.
        for (i, c) in hex.chars().rev().enumerate() {
            let v = c.to_digit(16).unwrap_or(0);
            for bit in 0..4 {
                if v & (1 << bit) != 0 {
                    let cpu = i * 4 + bit;
                    if cpu > MAX_CPU {
                        return Err(format!("{s:?}: core {cpu} is above {MAX_CPU}"));
                    }
                    cores.push(cpu);
                }
            }
        }
        if cores.is_empty() {
            return Err(format!("{s:?}: the mask selects no core"));
        }
        return Ok(CoreList(cores));
    }
    let inner = t
        .strip_prefix('[')
        .and_then(|x| x.strip_suffix(']'))
        .unwrap_or(t);
    for part in inner.split(',') {
        let part = part.trim();
        if part.is_empty() {
            return Err(format!("{s:?}: empty entry in core list"));
        }
        let num = |x: &str| -> Result<usize, String> {
            let n: usize = x
                .trim()
                .parse()
                .map_err(|_| format!("{s:?}: {x:?} is not a core number"))?;
            if n > MAX_CPU {
                return Err(format!("{s:?}: core {n} is above {MAX_CPU}"));
            }
            Ok(n)
        };
        if let Some((a, b)) = part.split_once('-') {
            let (a, b) = (num(a)?, num(b)?);
            if a > b {
                return Err(format!("{s:?}: range {a}-{b} runs backwards"));
            }
            cores.extend(a..=b);
        } else {
            cores.push(num(part)?);
        }
    }
    cores.sort_unstable();
    cores.dedup();
    Ok(CoreList(cores))
}

/// Writes nvmfd.8 (from this clap definition) into `dir`.
pub fn generate_man(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let cmd = Cli::command();
    let mut out = Vec::new();
    clap_mangen::Man::new(cmd).section("8").render(&mut out)?;
    std::fs::write(dir.join("nvmfd.8"), out)
}

/// Prints the completion script of `shell` for nvmfd.
pub fn print_completions(shell: clap_complete::Shell) {
    let mut cmd = Cli::command();
    clap_complete::generate(shell, &mut cmd, "nvmfd", &mut std::io::stdout());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_lists() {
        assert_eq!(parse_core_list("0,1").unwrap().0, vec![0, 1]);
        assert_eq!(parse_core_list("0-3").unwrap().0, vec![0, 1, 2, 3]);
        assert_eq!(parse_core_list("[2,0-1]").unwrap().0, vec![0, 1, 2]);
        assert_eq!(parse_core_list("0x3").unwrap().0, vec![0, 1]);
        assert_eq!(parse_core_list("0x10").unwrap().0, vec![4]);
        assert_eq!(parse_core_list("1,1").unwrap().0, vec![1]);
        assert!(parse_core_list("").is_err());
        assert!(parse_core_list("0x0").is_err());
        assert!(parse_core_list("3-1").is_err());
        assert!(parse_core_list("a").is_err());
        assert!(parse_core_list("0,,1").is_err());
        assert!(parse_core_list("5000").is_err());
    }

    #[test]
    fn cli_parses() {
        let c = Cli::try_parse_from(["nvmfd", "-c", "x.json", "-m", "0x3", "--log-level", "debug"])
            .unwrap();
        assert_eq!(c.cores.unwrap().0, vec![0, 1]);
        assert_eq!(c.config.unwrap().to_str(), Some("x.json"));
        assert_eq!(c.poll_us, DEFAULT_POLL_US);
        let c = Cli::try_parse_from(["nvmfd", "--poll-us", "0"]).unwrap();
        assert_eq!(c.poll_us, 0);
        assert!(Cli::try_parse_from(["nvmfd", "--poll-us", "-1"]).is_err());
        let c = Cli::try_parse_from(["nvmfd"]).unwrap();
        assert_eq!(c.max_connections, 4096);
        assert_eq!(c.max_connections_per_host, 512);
        assert_eq!(c.max_controllers_per_host, 64);
        assert_eq!(c.discovery_kato_ms, 120_000);
        assert_eq!(c.tcp_user_timeout_ms, None);
        assert_eq!(c.tcp_congestion, None);
        let c = Cli::try_parse_from(["nvmfd", "--tcp-congestion", "cubic"]).unwrap();
        assert_eq!(c.tcp_congestion.as_deref(), Some("cubic"));
        assert!(Cli::try_parse_from(["nvmfd", "--discovery-kato-ms", "0"]).is_err());
        use crate::placement::Policy;
        assert_eq!(c.queue_placement, Policy::Balanced);
        let c = Cli::try_parse_from(["nvmfd", "--queue-placement", "kernel"]).unwrap();
        assert_eq!(c.queue_placement, Policy::Kernel);
        assert!(Cli::try_parse_from(["nvmfd", "--queue-placement", "random"]).is_err());
        Cli::command_debug_assert();
    }

    impl Cli {
        fn command_debug_assert() {
            use clap::CommandFactory;
            Cli::command().debug_assert();
        }
    }
}
