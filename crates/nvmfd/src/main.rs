//! nvmfd entry point: parses the command line, sets up logging (a
//! non-blocking writer: a bounded, lossy queue drained by its own thread, so
//! no reactor ever waits on stderr; flushed at exit), loads and validates the
//! config (or the embedded default), creates the target and applies the host
//! limits, binds the listeners for every reactor, sets up queue placement
//! (`--queue-placement`, with each reactor core's NUMA node), starts the
//! pinned reactor threads (which also serve NVMe/RDMA, `rdma.rs`: RDMA
//! listeners reach reactor 0 once they run) and waits for SIGINT/SIGTERM
//! to shut them down.

mod cli;
mod cpus;
mod gateway;
mod journal;
mod limits;
mod listen;
mod live;
mod metrics;
mod numa;
mod paths;
mod placement;
mod poll_window;
mod rbd_clusters;
mod rdma;
mod reactor;
mod resize;
mod service_manager;
mod supervise;
mod zerocopy;

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use cli::Cli;
use listen::ListenAddr;
use nvmf_config::{TargetConfig, TransportType};
use nvmf_core::target::Target;
use nvmf_tcp::TcpParams;
use reactor::Reactor;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tracing::{error, info, warn};

/// The log thread's guard: dropping it flushes what the thread holds.
static LOG_GUARD: std::sync::Mutex<Option<tracing_appender::non_blocking::WorkerGuard>> =
    std::sync::Mutex::new(None);

/// Exits the process now with `code`, after the log thread wrote what it
/// holds (a plain `process::exit` would lose the last lines).
pub fn exit_now(code: i32) -> ! {
    let g = LOG_GUARD.lock().unwrap_or_else(|e| e.into_inner()).take();
    drop(g);
    std::process::exit(code);
}

fn main() {
    let cli = Cli::parse();
    // Packaging helpers (hidden options): no daemon, no logging.
    if let Some(dir) = &cli.generate_man {
        if let Err(e) = cli::generate_man(dir) {
            eprintln!(
                "nvmfd: error: writing the man page into {}: {e}",
                dir.display()
            );
            std::process::exit(1);
        }
        std::process::exit(0);
    }
    if let Some(shell) = cli.completions {
        cli::print_completions(shell);
        std::process::exit(0);
    }
    *LOG_GUARD.lock().unwrap_or_else(|e| e.into_inner()) =
        Some(init_logging(cli.log_level.as_deref()));
    let res = run(cli);
    // Flush what the log thread still holds before exiting.
    drop(LOG_GUARD.lock().unwrap_or_else(|e| e.into_inner()).take());
    match res {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("nvmfd: error: {e:#}");
            std::process::exit(1);
        }
    }
}

/// Log lines the non-blocking writer queues before it drops new ones
/// (counted by tracing-appender; nothing blocks).
const LOG_QUEUE_LINES: usize = 65_536;

fn init_logging(level: Option<&str>) -> tracing_appender::non_blocking::WorkerGuard {
    use tracing_subscriber::EnvFilter;
    let filter = match level {
        Some(l) => EnvFilter::try_new(l).unwrap_or_else(|e| {
            eprintln!("nvmfd: bad --log-level {l:?} ({e}); using info");
            EnvFilter::new("info")
        }),
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
    };
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(LOG_QUEUE_LINES)
        .thread_name("nvmfd-log")
        .finish(std::io::stderr());
    // Under systemd with the output going to the journal: entries with fields.
    if let Some(path) = journal::socket_path() {
        match journal::layer(path.clone()) {
            Ok(layer) => {
                use tracing_subscriber::layer::SubscriberExt;
                use tracing_subscriber::util::SubscriberInitExt;
                tracing_subscriber::registry()
                    .with(filter)
                    .with(layer)
                    .init();
                return guard;
            }
            Err(e) => eprintln!(
                "nvmfd: cannot log to the journal at {}: {e}; logging to stderr",
                path.display()
            ),
        }
    }
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .init();
    guard
}

fn run(cli: Cli) -> Result<()> {
    info!("nvmfd {} starting", env!("CARGO_PKG_VERSION"));
    let state_file = cli.state.as_ref().map(nvmf_rpc::StateFile::new);
    let restored = match &state_file {
        Some(sf) => sf
            .load()
            .map_err(|e| anyhow!("state file {}: {e}", sf.path().display()))?,
        None => None,
    };
    let from_state = restored.is_some();
    let cfg = match (restored, &cli.config) {
        (Some(cfg), cfg_arg) => {
            let sf = state_file.as_ref().map(|s| s.path().display().to_string());
            match cfg_arg {
                Some(c) => warn!(
                    "state file {} exists: restoring it; -c {} is ignored",
                    sf.unwrap_or_default(),
                    c.display()
                ),
                None => info!(
                    "configuration restored from state file {}",
                    sf.unwrap_or_default()
                ),
            }
            cfg
        }
        (None, Some(path)) => {
            let cfg = nvmf_config::load_file(path).map_err(|e| anyhow!("{e}"))?;
            info!("config loaded from {}", path.display());
            cfg
        }
        (None, None) => {
            let cfg = TargetConfig::embedded_default();
            describe_default(&cfg);
            cfg
        }
    };
    for entry in &cfg.skipped {
        info!("config: skipped {entry} (SPDK-internal tuning, nothing to do in nvmfd)");
    }
    for p in &cfg.ignored_params {
        info!("config: parameter {p} accepted but not used by nvmfd");
    }

    // Reactor cores.
    let allowed = cpus::allowed_cpus().context("reading the CPU affinity mask")?;
    let cores: Vec<usize> = match &cli.cores {
        Some(list) => {
            for c in &list.0 {
                if !allowed.contains(c) {
                    bail!(
                        "--cores: core {c} is not available to this process (allowed: {})",
                        fmt_cores(&allowed)
                    );
                }
            }
            list.0.clone()
        }
        None => allowed.clone(),
    };
    if cores.is_empty() {
        bail!("no core to run a reactor on");
    }

    let tcp = cfg
        .transport(TransportType::Tcp)
        .cloned()
        .unwrap_or_default();
    // Ceph clusters before the bdevs that name them; opening an rbd image
    // here blocks only startup (no reactor runs yet).
    for c in &cfg.rbd_clusters {
        rbd_clusters::register(c).map_err(|e| anyhow!("rbd cluster {}: {e}", c.name))?;
    }
    // A gateway group member starts with every ANA group inaccessible
    // until the group says which ones it owns.
    let group = match &cli.gateway_group {
        Some(name) => {
            let opts = gateway::GroupOptions {
                name: name.clone(),
                id: cli.gateway_id.clone().unwrap_or_default(),
                cluster: cli.group_cluster.clone().unwrap_or_default(),
                pool: cli.group_pool.clone().unwrap_or_default(),
                lease: std::time::Duration::from_millis(cli.group_lease_ms),
                home: cli.gateway_ana_groups.iter().copied().collect(),
                failback_wait: std::time::Duration::from_millis(cli.group_failback_wait_ms),
            };
            let served = gateway::member::served_groups(&cfg, &opts)
                .map_err(|e| anyhow!("--gateway-group {name}: {e}"))?;
            for g in &opts.home {
                if !served.contains_key(g) {
                    bail!("--gateway-ana-groups: ANA group {g} has no namespace here");
                }
            }
            // Before any listener accepts: every group inaccessible here until
            // the group says which ones this member owns.
            nvmf_core::ana::group_ana().manage(nvmf_config::AnaState::Inaccessible);
            Some((opts, served))
        }
        None => None,
    };
    let target = Target::from_config(&cfg).map_err(|e| anyhow!("creating the target: {e}"))?;
    // DH-HMAC-CHAP keys from the keyring's files (docs/AUTH.md).
    let keys = nvmf_core::auth::load_keys(&cfg).map_err(|e| anyhow!("DH-HMAC-CHAP keys: {e}"))?;
    if keys.hosts() > 0 {
        info!("DH-HMAC-CHAP: {} host(s) must authenticate", keys.hosts());
    }
    keys.install(&target);
    // TLS PSKs from the keyring's files and the listeners that require TLS
    // (docs/TLS.md).
    let tls = nvmf_core::tls::load_tls(&cfg).map_err(|e| anyhow!("TLS PSKs: {e}"))?;
    if tls.hosts() > 0 {
        info!("TLS: {} host(s) have a PSK", tls.hosts());
    }
    target.set_tls(Arc::new(tls));
    let tls_ctx = {
        let t = target.clone();
        Arc::new(
            nvmf_tls::server_context(move |identity| {
                let psk = t.tls().lookup(identity);
                if psk.is_empty() {
                    // OpenSSL then reports an unrelated reason (it falls back to
                    // certificates): say what really happened. The identity names
                    // the host and subsystem; it holds no key material.
                    t.refusal_log(|| {
                        tracing::warn!(
                            identity,
                            "TLS: no PSK for this identity (unknown host or subsystem,                              or another key's digest); handshake refused"
                        )
                    });
                }
                psk
            }, match cli.ktls {
                cli::KtlsMode::Auto => nvmf_tls::Ktls::Auto,
                cli::KtlsMode::Off => nvmf_tls::Ktls::Off,
            })
                .map_err(|e| anyhow!("TLS server context: {e}"))?,
        )
    };
    resize::spawn(&target).context("spawning the resize thread")?;
    let mut params = TcpParams::new(target.limits(), tcp.c2h_success);
    params.h2c_timeout = std::time::Duration::from_millis(cli.h2c_timeout_ms);
    params.max_r2t_bytes = cli.max_r2t_bytes;
    let params_copy = params.clone();
    match cli.zerocopy_send {
        cli::ZeroCopySend::Off => info!("zero-copy sends: off"),
        mode => {
            params.zerocopy_threshold = Some(cli.zerocopy_threshold as usize);
            params.zerocopy_always = mode == cli::ZeroCopySend::Always;
            info!(
                "zero-copy sends (MSG_ZEROCOPY) of C2HData payloads from {} bytes{}",
                cli.zerocopy_threshold,
                if params.zerocopy_always {
                    ", kept on where the kernel copies"
                } else {
                    ", off for a connection whose sends the kernel copies (loopback, no scatter-gather)"
                }
            );
        }
    }
    info!(
        "data buffers: {} MiB shared (num_shared_buffers {} x io_unit_size {}), {} KiB retained per slot, \
         {} KiB R2T data per connection, H2CData timeout {} ms",
        params.buffers.budget.limit() >> 20,
        tcp.num_shared_buffers,
        target.limits().io_unit_size,
        params.buffers.retain >> 10,
        params.max_r2t_bytes >> 10,
        cli.h2c_timeout_ms
    );
    target.set_host_limits(nvmf_core::HostLimits {
        max_controllers: cli.max_controllers,
        max_controllers_per_host: cli.max_controllers_per_host,
        max_io_queues_per_host: cli.max_io_queues_per_host,
        max_discovery_controllers: cli.max_discovery_controllers,
        max_unauthenticated_controllers: cli.max_unauthenticated_controllers,
    });
    target.set_discovery_kato_ms(cli.discovery_kato_ms);
    target.set_log_rate(cli.log_rate);
    let conn_limits = limits::ConnLimits::new(cli.max_connections, cli.max_connections_per_host);
    match &cli.tcp_congestion {
        Some(cc) => {
            listen::set_congestion(cc)?;
            info!("TCP congestion control of connections: {cc}");
        }
        None => {
            let cc = listen::default_congestion();
            if cc == "bbr" {
                info!(
                    "the system's TCP congestion control is bbr: it paces every send with a timer on interfaces without an fq qdisc (loopback, most virtual NICs), which can halve small-I/O throughput; --tcp-congestion cubic (or dctcp) avoids it"
                );
            }
        }
    }
    let keepalive = limits::Keepalive::from_cli(
        cli.tcp_keepalive_idle_s,
        cli.tcp_keepalive_interval_s,
        cli.tcp_keepalive_probes,
        cli.tcp_user_timeout_ms,
    );
    info!(
        "limits: connections (TCP and RDMA) {} total / {} per peer address, NVM controllers {} total / {} per host NQN, I/O queues {} per host NQN, discovery controllers {}, unauthenticated controllers {} (0 = unlimited); discovery KATO {} ms; TCP keepalive {:?} idle, {:?} x {}, user timeout {:?}",
        cli.max_connections,
        cli.max_connections_per_host,
        cli.max_controllers,
        cli.max_controllers_per_host,
        cli.max_io_queues_per_host,
        cli.max_discovery_controllers,
        cli.max_unauthenticated_controllers,
        cli.discovery_kato_ms,
        keepalive.idle,
        keepalive.interval,
        keepalive.probes,
        keepalive.user_timeout
    );
    warn_fd_limit(cli.max_connections);

    // Listeners: every reactor gets its own SO_REUSEPORT socket per NVMe/TCP
    // address; NVMe/RDMA listeners belong to reactor 0's RDMA port.
    let (rdma_listeners, tcp_listeners): (Vec<_>, Vec<_>) = cfg
        .listen_addresses()
        .into_iter()
        .partition(|l| l.trtype == nvmf_config::TransportType::Rdma);
    let addrs: Vec<Arc<ListenAddr>> = tcp_listeners
        .into_iter()
        .map(|l| ListenAddr::resolve(l).map(Arc::new))
        .collect::<Result<_>>()?;
    if addrs.is_empty() && rdma_listeners.is_empty() {
        warn!("the config has no listener: nothing will be served");
    }
    for a in &addrs {
        listen::check_free(a.addr).with_context(|| format!("cannot listen on {} (tcp)", a.addr))?;
    }
    let shutdown = Arc::new(AtomicBool::new(false));
    let placement = match cli.queue_placement {
        placement::Policy::Balanced => {
            let nodes: Vec<Option<u32>> = cores.iter().map(|&c| numa::cpu_node(c)).collect();
            info!(
                "queue placement: balanced (I/O queues of a controller spread over the reactors;                  reactor NUMA nodes {})",
                nodes
                    .iter()
                    .map(|n| n.map_or("?".to_string(), |n| n.to_string()))
                    .collect::<Vec<_>>()
                    .join(",")
            );
            Some(placement::Placement::new(nodes))
        }
        placement::Policy::Kernel => {
            info!("queue placement: kernel (each queue stays on the reactor that accepted it)");
            None
        }
    };
    // NVMe/RDMA: every reactor creates its own port on first use.
    let rdma_setup = Arc::new(rdma::RdmaSetup::new(
        target.clone(),
        std::time::Duration::from_millis(cli.h2c_timeout_ms),
        cli.max_r2t_bytes,
        std::time::Duration::from_millis(cli.connect_timeout_ms),
        cfg.transport(TransportType::Rdma)
            .and_then(|t| t.rdma)
            .unwrap_or_default(),
    ));
    // Which hosts keep their gone controllers' counters apart: one choice
    // for every reactor and the gatherer (paths.rs).
    let gone = Arc::new(paths::GoneHosts::default());
    let mut peers = Vec::new();
    let mut reactors = Vec::new();
    let mut wakers = Vec::new();
    let mut handles = Vec::new();
    for (id, &cpu) in cores.iter().enumerate() {
        let (poll, waker) = Reactor::new_poll().context("creating epoll")?;
        let mut listeners = Vec::new();
        for a in &addrs {
            let l = listen::bind_reuseport(a.addr)
                .with_context(|| format!("cannot listen on {} (tcp)", a.addr))?;
            listeners.push(Some((mio::net::TcpListener::from_std(l), a.clone())));
        }
        let (tx, rx) = std::sync::mpsc::channel();
        peers.push(live::ReactorHandle {
            tx: std::sync::Mutex::new(tx.clone()),
            waker: waker.clone(),
        });
        handles.push(live::ReactorHandle {
            tx: std::sync::Mutex::new(tx),
            waker: waker.clone(),
        });
        wakers.push(waker);
        reactors.push(Reactor {
            id,
            cpu: Some(cpu),
            poll,
            listeners,
            target: target.clone(),
            params: params.clone(),
            params_copy: params_copy.clone(),
            draining: Vec::new(),
            shutdown: shutdown.clone(),
            commands: rx,
            closed: reactor::ClosedTotals {
                gone: gone.clone(),
                ..Default::default()
            },
            busy: Default::default(),
            poll_window: std::time::Duration::from_micros(cli.poll_us),
            icreq_timeout: std::time::Duration::from_millis(cli.icreq_timeout_ms),
            connect_timeout: std::time::Duration::from_millis(cli.connect_timeout_ms),
            conn_limits: conn_limits.clone(),
            keepalive,
            log: limits::LogLimiter::new(cli.log_rate),
            placement: placement.clone(),
            peers: Arc::new(Vec::new()),
            nic_nodes: Default::default(),
            tls: tls_ctx.clone(),
            rdma: Some(rdma_setup.clone()),
        });
    }
    // Every reactor can hand a queue to every other one.
    let peers = Arc::new(peers);
    for r in &mut reactors {
        r.peers = peers.clone();
    }

    // NVMe/RDMA listeners go to reactor 0 by message (after the reactors
    // start, below; later ones by RPC).
    let rdma = Arc::new(rdma::RdmaControl::new(peers.clone()));

    // Control plane: its own threads; changes reach reactors by message.
    let live = Arc::new(live::Live::new(
        target.clone(),
        handles,
        cfg.clone(),
        addrs.clone(),
        rdma.clone(),
        gone,
    ));
    if let Some(addr) = cli.metrics {
        metrics::spawn(addr, live.clone(), conn_limits.clone())?;
    }
    let service = Arc::new(nvmf_rpc::RpcService::new(
        cfg.clone(),
        live.clone(),
        state_file.clone(),
    ));
    let group_stop = Arc::new(AtomicBool::new(false));
    let mut group_thread = None;
    if let Some((opts, served)) = group {
        let (h, t) = gateway::member::start(
            opts,
            served,
            service.clone(),
            target.clone(),
            group_stop.clone(),
        )
        .map_err(|e| anyhow!("gateway group: {e}"))?;
        live.set_gateway(h);
        group_thread = Some(t);
    }
    if let Some(sf) = &state_file {
        if !from_state {
            service
                .persist()
                .with_context(|| format!("writing state file {}", sf.path().display()))?;
            info!("configuration saved to state file {}", sf.path().display());
        }
    }
    let svc = service.clone();
    let mut rpc = nvmf_rpc::serve(&cli.rpc_socket, service)
        .with_context(|| format!("RPC socket {}", cli.rpc_socket.display()))?;
    info!("RPC server listening on {}", cli.rpc_socket.display());
    for a in &addrs {
        info!(
            "listening on {} ({})",
            a.addr,
            a.cfg.trtype.as_str().to_ascii_lowercase()
        );
    }
    info!(
        "{} reactor(s) on core(s) {}",
        reactors.len(),
        fmt_cores(&cores)
    );

    // Signals: block the main thread on SIGINT/SIGTERM; SIGHUP reloads.
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ])
    .context("installing signal handlers")?;

    // A reactor that dies (a panic no connection's guard caught) stops
    // the daemon with an error instead of leaving it half dead.
    let death: Arc<std::sync::Mutex<Option<String>>> = Arc::default();
    let mut threads = Vec::new();
    for r in reactors {
        let name = format!("reactor-{}", r.id);
        let (id, shutdown, death) = (r.id, shutdown.clone(), death.clone());
        let t = std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                supervise::run_supervised(
                    id,
                    &shutdown,
                    move || r.run(),
                    |why| {
                        let mut d = death.lock().unwrap_or_else(|e| e.into_inner());
                        d.get_or_insert(why);
                        drop(d);
                        // Wakes the main thread's signal wait.
                        let _ = signal_hook::low_level::raise(signal_hook::consts::SIGTERM);
                    },
                )
            })
            .context("spawning a reactor thread")?;
        threads.push(t);
    }
    for l in &rdma_listeners {
        if let Err(e) = rdma.listen(l) {
            stop_all(&shutdown, &wakers, &mut rpc, threads);
            anyhow::bail!("{e}");
        }
    }

    // Every listener accepts and the RPC socket answers: tell systemd
    // (Type=notify), and keep telling its watchdog while the reactors answer.
    service_manager::ready(&format!(
        "serving: {} listener(s) on {} reactor(s)",
        addrs.len() + rdma_listeners.len(),
        peers.len()
    ));
    let watchdog = service_manager::spawn_watchdog(peers.clone(), shutdown.clone());

    let sig = loop {
        let sig = signals
            .forever()
            .next()
            .unwrap_or(signal_hook::consts::SIGTERM);
        if sig != signal_hook::consts::SIGHUP {
            break sig;
        }
        reload(cli.config.as_deref(), &svc);
    };
    let name = if sig == signal_hook::consts::SIGINT {
        "SIGINT"
    } else {
        "SIGTERM"
    };
    let died = death.lock().unwrap_or_else(|e| e.into_inner()).take();
    match &died {
        None => {
            info!("received {name}, shutting down");
            service_manager::stopping(&format!("stopping ({name})"));
        }
        Some(why) => service_manager::stopping(why),
    }
    // A group member hands its ANA groups over before the reactors stop
    // (their writes drain first).
    group_stop.store(true, Ordering::SeqCst);
    if let Some(t) = group_thread {
        let _ = t.join();
    }
    stop_all(&shutdown, &wakers, &mut rpc, threads);
    if let Some(t) = watchdog {
        let _ = t.join();
    }
    if let Some(why) = died {
        anyhow::bail!("{why}");
    }
    info!("shutdown complete");
    Ok(())
}

/// `systemctl reload` (SIGHUP): the configuration file (`-c`) is read again
/// and applied through `load_config`, the path of an RPC change: what differs
/// is changed live, the rest (connections included) is untouched, and the
/// state file is rewritten. A file that does not parse or apply leaves the
/// running configuration as it is (logged, naming the file and the problem).
fn reload(config: Option<&std::path::Path>, service: &nvmf_rpc::RpcService) {
    service_manager::reloading();
    let result = match config {
        None => Err(
            "nvmfd was started without -c: there is no configuration file to read again"
                .to_string(),
        ),
        Some(p) => std::fs::read_to_string(p)
            .map_err(|e| format!("cannot read {}: {e}", p.display()))
            .and_then(|t| {
                serde_json::from_str::<serde_json::Value>(&t)
                    .map_err(|e| format!("{}: not JSON: {e}", p.display()))
            })
            .and_then(|doc| {
                service
                    .call("load_config", Some(&doc))
                    .map_err(|e| format!("{}: {}", p.display(), e.message))
            }),
    };
    match result {
        Ok(_) => {
            let p = config.map(|p| p.display().to_string()).unwrap_or_default();
            info!("reload (SIGHUP): {p} applied");
            service_manager::ready("serving (configuration file reloaded)");
        }
        Err(e) => {
            error!("reload (SIGHUP) failed, the running configuration is unchanged: {e}");
            service_manager::ready("serving (the last reload failed: see the log)");
        }
    }
}

/// Stops every reactor and the RPC server, and waits for the reactor threads.
fn stop_all(
    shutdown: &AtomicBool,
    wakers: &[Arc<mio::Waker>],
    rpc: &mut nvmf_rpc::RpcServer,
    threads: Vec<std::thread::JoinHandle<()>>,
) {
    shutdown.store(true, Ordering::SeqCst);
    for w in wakers {
        let _ = w.wake();
    }
    rpc.shutdown();
    for t in threads {
        let _ = t.join();
    }
}

/// Says so when the descriptor limit is below what --max-connections allows
/// (accept then fails with EMFILE before the cap is reached).
fn warn_fd_limit(max_connections: usize) {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass; nothing else.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0 {
        return;
    }
    let soft = rl.rlim_cur;
    if max_connections == 0 || soft < max_connections as u64 + 64 {
        warn!(
            "open file limit (ulimit -n) is {soft}: below --max-connections {max_connections} + 64 spare; accepts may fail with EMFILE first"
        );
    }
}

fn describe_default(cfg: &TargetConfig) {
    let what = cfg
        .subsystems
        .first()
        .map(|s| {
            let ns = s
                .namespaces
                .first()
                .and_then(|n| cfg.bdev(&n.bdev_name))
                .map(|b| fmt_size(b.size_bytes()))
                .unwrap_or_else(|| "no".into());
            let at = cfg
                .listen_addresses()
                .first()
                .map(|l| format!("{}:{}", l.traddr, l.trsvcid))
                .unwrap_or_default();
            format!("a {ns} RAM namespace at {at} under {}", s.nqn)
        })
        .unwrap_or_else(|| "nothing".into());
    info!("no config file given (-c): serving the embedded default: {what}");
}

fn fmt_size(b: u64) -> String {
    const G: u64 = 1 << 30;
    const M: u64 = 1 << 20;
    if b.is_multiple_of(G) {
        format!("{} GiB", b / G)
    } else if b.is_multiple_of(M) {
        format!("{} MiB", b / M)
    } else {
        format!("{b} B")
    }
}

fn fmt_cores(c: &[usize]) -> String {
    c.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(",")
}
