//! `--metrics ADDR:PORT`: Prometheus / OpenMetrics text exposition of the
//! per-path counters at `GET /metrics`.
//!
//! Owns the metrics HTTP endpoint: one thread of its own (never a reactor)
//! accepts one connection at a time, reads one request (at most
//! `MAX_REQUEST` bytes, within `IO_TIMEOUT`), parses it with `httparse`,
//! answers and closes. `GET`/`HEAD /metrics` gathers the reactors' path
//! tables through `Live` (the same message + bounded wait as
//! `nvmf_get_stats`, so a scrape never blocks a reactor) and encodes them
//! with `prometheus-client`; any other path is 404, any other method 405,
//! a malformed request 400, an oversized one 431.
//!
//! Series (labels `subsystem`, `listener` = `traddr:trsvcid`, `transport`
//! = `TCP` or `RDMA`, `host` = host NQN, `cntlid`, and `namespace` = NSID
//! where per namespace). A controller's series last as long as it does;
//! then its counts move to `cntlid="closed"` of its host, or of
//! `host="other"` past 64 hosts per listener (`paths::GONE_HOSTS_MAX`), so
//! the exposition stays bounded however often hosts reconnect, and a
//! counter never goes backwards for a label set that is still exposed (a
//! controller ID used again starts a new series from zero, which
//! Prometheus reads as a counter reset). The gauges (`in_flight`,
//! `qpairs`) are not written for `closed` series.
//! `nvmf_path_commands_total`, `nvmf_path_errors_total` (+ `status`),
//! `nvmf_path_in_flight`, `nvmf_path_qpairs`, `nvmf_ns_reads_total`,
//! `nvmf_ns_writes_total`, `nvmf_ns_read_bytes_total`,
//! `nvmf_ns_written_bytes_total`, `nvmf_ns_errors_total`,
//! `nvmf_ns_read_latency_seconds`, `nvmf_ns_write_latency_seconds`
//! (histograms, one bucket per power of two from 1 µs to 34 s). Per
//! reactor with an NVMe/RDMA port (label `reactor`): `nvmf_rdma_qpairs`,
//! `nvmf_rdma_cq_wakeups_total`, `nvmf_rdma_busy_polls_total`,
//! `nvmf_rdma_completions_total`, `nvmf_rdma_polled_completions_total`,
//! `nvmf_rdma_async_events_total`, `nvmf_rdma_srq_unconfirmed_teardowns_total`.
//! Per bdev (label `bdev`): `nvmf_bdev_qos_throttled_total`, Reads and Writes
//! that waited for the bdev's QoS tokens (docs/QOS.md);
//! `nvmf_bdev_compare_and_writes_total` and
//! `nvmf_bdev_compare_and_write_miscompares_total`, fused Compare and
//! Writes that read and compared the bdev's data, and those whose data
//! differed (docs/COMPARE-AND-WRITE.md).
//! Also: `nvmf_ana_state` (per subsystem, listener and ANA group holding a
//! namespace: the NVMe state code) and `nvmf_ana_changes_total`; the caps
//! (`nvmf_connections_open`/`_max`, `nvmf_controllers_active`/`_max`,
//! `nvmf_limit_refusals_total{limit}`); `nvmf_reactor_busy_seconds_total`,
//! `nvmf_reactor_idle_seconds_total`, `nvmf_reactors_unresponsive`; the
//! process's `process_*` (read from /proc/self with `procfs`); the gateway
//! group's `nvmf_group_*`. The alert rules and the Grafana dashboard built
//! on these are in packaging/monitoring/ (docs/MONITORING.md).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nvmf_core::stats::{bucket_upper_ns, Histogram, HIST_BUCKETS};
use nvmf_wire::status::Status;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use tracing::{debug, info, warn};

use crate::limits::{ConnLimits, ConnUsage};
use crate::live::Live;
use crate::paths::{PathKey, PathTable};
use crate::reactor::RdmaSnapshot;

/// Largest request accepted (request line + headers).
pub const MAX_REQUEST: usize = 8192;
/// Read and write time limit of one connection.
pub const IO_TIMEOUT: Duration = Duration::from_secs(2);
/// Content type of the OpenMetrics text format `prometheus-client` writes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Binds `addr` and serves `/metrics` on a thread of its own.
pub fn spawn(addr: SocketAddr, live: Arc<Live>, conns: Arc<ConnLimits>) -> Result<SocketAddr> {
    let l =
        TcpListener::bind(addr).with_context(|| format!("--metrics: cannot listen on {addr}"))?;
    let bound = l.local_addr()?;
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || serve(l, &live, &conns))
        .context("spawning the metrics thread")?;
    info!("metrics (Prometheus) on http://{bound}/metrics");
    Ok(bound)
}

fn serve(l: TcpListener, live: &Live, conns: &ConnLimits) {
    for s in l.incoming() {
        match s {
            Ok(s) => {
                if let Err(e) = handle(s, live, conns) {
                    debug!("metrics connection: {e}");
                }
            }
            Err(e) => {
                warn!("metrics accept: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// What a request asks for.
#[derive(Debug, PartialEq, Eq)]
enum Req {
    Metrics { head: bool },
    NotFound,
    BadMethod,
    Bad,
    TooLarge,
}

/// Reads one request head (bounded in size and time).
fn read_request(s: &mut TcpStream) -> std::io::Result<Req> {
    let deadline = Instant::now() + IO_TIMEOUT;
    let mut buf = vec![0u8; MAX_REQUEST];
    let mut n = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        s.set_read_timeout(Some(left))?;
        if n == buf.len() {
            return Ok(Req::TooLarge);
        }
        let k = s.read(&mut buf[n..])?;
        if k == 0 {
            return Ok(Req::Bad);
        }
        n += k;
        match parse(&buf[..n]) {
            Some(r) => return Ok(r),
            None => continue,
        }
    }
}

/// Parses a request head; None while incomplete.
fn parse(b: &[u8]) -> Option<Req> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut r = httparse::Request::new(&mut headers);
    match r.parse(b) {
        Ok(httparse::Status::Partial) => None,
        Err(httparse::Error::TooManyHeaders) => Some(Req::TooLarge),
        Err(_) => Some(Req::Bad),
        Ok(httparse::Status::Complete(_)) => {
            let path = r.path.unwrap_or("");
            let path = path.split('?').next().unwrap_or("");
            let head = match r.method {
                Some("GET") => false,
                Some("HEAD") => true,
                _ => return Some(Req::BadMethod),
            };
            Some(if path == "/metrics" {
                Req::Metrics { head }
            } else {
                Req::NotFound
            })
        }
    }
}

fn handle(mut s: TcpStream, live: &Live, conns: &ConnLimits) -> std::io::Result<()> {
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    let req = read_request(&mut s)?;
    let (status, ctype, body, head) = match req {
        Req::Metrics { head } => {
            let x = Exposition {
                reactors: live.gather_metrics(),
                bdevs: live.bdev_counters(),
                ana: live.ana_metrics(),
                host_limits: live.host_limit_metrics(),
                connections: conns.usage(),
                process: ProcessMetrics::read(),
            };
            let mut body = encode(&x);
            if let Some(h) = live.gateway() {
                body = with_group(body, h);
            }
            ("200 OK", CONTENT_TYPE, body, head)
        }
        Req::NotFound => (
            "404 Not Found",
            "text/plain",
            "not found: try /metrics\n".into(),
            false,
        ),
        Req::BadMethod => (
            "405 Method Not Allowed",
            "text/plain",
            "GET only\n".into(),
            false,
        ),
        Req::Bad => (
            "400 Bad Request",
            "text/plain",
            "bad request\n".into(),
            false,
        ),
        Req::TooLarge => (
            "431 Request Header Fields Too Large",
            "text/plain",
            "request too large\n".into(),
            false,
        ),
    };
    let allow = if status.starts_with("405") {
        "Allow: GET, HEAD\r\n"
    } else {
        ""
    };
    let hdr = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n",
        body.len()
    );
    s.write_all(hdr.as_bytes())?;
    if !head {
        s.write_all(body.as_bytes())?;
    }
    s.flush()?;
    let _ = s.shutdown(std::net::Shutdown::Write);
    // Read what the client still sends (bounded) so that closing with
    // unread input does not reset the connection before it read the answer.
    s.set_read_timeout(Some(Duration::from_millis(200)))?;
    let mut sink = [0u8; 4096];
    let mut left: usize = 64 * 1024;
    while left > 0 {
        match s.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => left = left.saturating_sub(n),
        }
    }
    Ok(())
}

/// One reactor's time since it started, and its adaptive polling.
#[derive(Debug, Default, Clone, Copy)]
pub struct ReactorTimes {
    pub id: usize,
    pub busy_ns: u64,
    pub idle_ns: u64,
    /// The polling window now (`poll_window.rs`).
    pub poll_window_ns: u64,
    /// Working turns after which it slept at once, holding only backend work.
    pub backend_skips: u64,
    /// Zero-copy send calls, and those the kernel reported it copied.
    pub zc_calls: u64,
    pub zc_copied: u64,
}

/// What the reactors report for one scrape ([`Live::gather_metrics`]).
#[derive(Debug, Default)]
pub struct ReactorMetrics {
    /// Counters by path, all reactors added up.
    pub paths: PathTable,
    /// Each reactor's NVMe/RDMA side, by reactor id.
    pub rdma: Vec<(usize, RdmaSnapshot)>,
    /// Each reactor's time and polling.
    pub times: Vec<ReactorTimes>,
    /// Reactors that did not answer within the RPC wait (hung or
    /// overloaded: their paths are missing from this scrape).
    pub unanswered: usize,
}

/// One subsystem with ANA reporting ([`Live::ana_metrics`]).
#[derive(Debug, Clone, Default)]
pub struct SubsystemAnaMetrics {
    pub subsystem: String,
    /// ANA state changes since the subsystem was created.
    pub changes: u64,
    /// (listener, ANA group, state code) for each group holding a namespace.
    pub states: Vec<(String, u32, u8)>,
}

/// The host caps checked at Connect ([`Live::host_limit_metrics`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct HostLimitMetrics {
    pub limits: nvmf_core::HostLimits,
    pub hits: nvmf_core::LimitHits,
    /// Controllers alive now (NVM and discovery).
    pub controllers: usize,
}

/// Everything one `/metrics` answer shows.
#[derive(Debug, Default)]
pub struct Exposition {
    pub reactors: ReactorMetrics,
    pub bdevs: Vec<BdevCounters>,
    pub ana: Vec<SubsystemAnaMetrics>,
    pub host_limits: HostLimitMetrics,
    pub connections: ConnUsage,
    /// None when /proc could not be read.
    pub process: Option<ProcessMetrics>,
}

/// The exposition (OpenMetrics text, ends with `# EOF`).
pub fn encode(x: &Exposition) -> String {
    let mut reg = Registry::default();
    reg.register_collector(Box::new(Paths(x.reactors.paths.clone())));
    reg.register_collector(Box::new(Rdma(x.reactors.rdma.clone())));
    reg.register_collector(Box::new(Reactors(
        x.reactors.times.clone(),
        x.reactors.unanswered,
    )));
    reg.register_collector(Box::new(Bdevs(x.bdevs.clone())));
    reg.register_collector(Box::new(Ana(x.ana.clone())));
    reg.register_collector(Box::new(Limits(x.host_limits, x.connections)));
    if let Some(p) = x.process {
        reg.register_collector(Box::new(Process(p)));
    }
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &reg);
    out
}

/// The reactors' busy and idle time (as SPDK's `thread_get_stats`) and
/// how many did not answer.
#[derive(Debug)]
struct Reactors(Vec<ReactorTimes>, usize);

impl Collector for Reactors {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        type Get = fn(&ReactorTimes) -> u64;
        let families: [(&str, &str, Get); 2] = [
            (
                "nvmf_reactor_busy_seconds",
                "Wall time of the reactor's loop turns that had work (polling with nothing to do counts as idle)",
                |t| t.busy_ns,
            ),
            (
                "nvmf_reactor_idle_seconds",
                "Wall time the reactor slept or polled with nothing to do",
                |t| t.idle_ns,
            ),
        ];
        for (name, help, get) in families {
            let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
            for t in &self.0 {
                let l: Labels = vec![("reactor", t.id.to_string())];
                m.encode_family(&l)?
                    .encode_counter::<NoLabelSet, _, f64>(&(get(t) as f64 / 1e9), None)?;
            }
        }
        let mut m = enc.encode_descriptor(
            "nvmf_reactor_poll_window_seconds",
            "The reactor's adaptive polling window now (capped by --poll-us; 0: it sleeps as soon as idle)",
            None,
            MetricType::Gauge,
        )?;
        for t in &self.0 {
            let l: Labels = vec![("reactor", t.id.to_string())];
            m.encode_family(&l)?
                .encode_gauge(&(t.poll_window_ns as f64 / 1e9))?;
        }
        for (name, help, get) in [
            (
                "nvmf_tcp_zerocopy_sends",
                "Zero-copy send calls (MSG_ZEROCOPY) of C2HData payloads",
                (|t: &ReactorTimes| t.zc_calls) as Get,
            ),
            (
                "nvmf_tcp_zerocopy_copied",
                "Zero-copy send calls the kernel reported it copied after all (loopback, no scatter-gather)",
                |t: &ReactorTimes| t.zc_copied,
            ),
        ] {
            let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
            for t in &self.0 {
                let l: Labels = vec![("reactor", t.id.to_string())];
                m.encode_family(&l)?
                    .encode_counter::<NoLabelSet, _, f64>(&get(t), None)?;
            }
        }
        let mut m = enc.encode_descriptor(
            "nvmf_reactor_backend_waits",
            "Working turns after which the reactor slept at once because everything it held was executing in backends (which wake it)",
            None,
            MetricType::Counter,
        )?;
        for t in &self.0 {
            let l: Labels = vec![("reactor", t.id.to_string())];
            m.encode_family(&l)?
                .encode_counter::<NoLabelSet, _, f64>(&t.backend_skips, None)?;
        }
        let mut m = enc.encode_descriptor(
            "nvmf_reactors_unresponsive",
            "Reactors that did not answer this scrape within 5 s (their paths are missing from it)",
            None,
            MetricType::Gauge,
        )?;
        m.encode_gauge(&(self.1 as i64))
    }
}

/// ANA: the state of each group holding a namespace through each listener
/// and the changes per subsystem.
#[derive(Debug)]
struct Ana(Vec<SubsystemAnaMetrics>);

impl Collector for Ana {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        if self.0.is_empty() {
            return Ok(());
        }
        let mut m = enc.encode_descriptor(
            "nvmf_ana_state",
            "ANA state of the group through the listener, as the NVMe code: 1 optimized, 2 non-optimized, 3 inaccessible, 4 persistent loss, 15 change",
            None,
            MetricType::Gauge,
        )?;
        for ss in &self.0 {
            for (listener, grp, code) in &ss.states {
                let l: Labels = vec![
                    ("subsystem", ss.subsystem.clone()),
                    ("listener", listener.clone()),
                    ("ana_group", grp.to_string()),
                ];
                m.encode_family(&l)?.encode_gauge(&i64::from(*code))?;
            }
        }
        let mut m = enc.encode_descriptor(
            "nvmf_ana_changes",
            "ANA state changes of the subsystem (the ANA log page's change count, less its start)",
            None,
            MetricType::Counter,
        )?;
        for ss in &self.0 {
            let l: Labels = vec![("subsystem", ss.subsystem.clone())];
            m.encode_family(&l)?
                .encode_counter::<NoLabelSet, _, u64>(&ss.changes, None)?;
        }
        Ok(())
    }
}

/// The caps: usage, maxima (0 = unlimited) and refusals by cap.
#[derive(Debug)]
struct Limits(HostLimitMetrics, ConnUsage);

impl Collector for Limits {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let (h, c) = (&self.0, &self.1);
        let gauges: [(&str, &str, u64); 4] = [
            (
                "nvmf_connections_open",
                "Connections open now (both transports, admitted by the caps)",
                c.open as u64,
            ),
            (
                "nvmf_connections_max",
                "--max-connections (0: unlimited)",
                c.max_total as u64,
            ),
            (
                "nvmf_controllers_active",
                "Controllers alive now (NVM and discovery)",
                h.controllers as u64,
            ),
            (
                "nvmf_controllers_max",
                "--max-controllers (0: unlimited)",
                h.limits.max_controllers as u64,
            ),
        ];
        for (name, help, v) in gauges {
            enc.encode_descriptor(name, help, None, MetricType::Gauge)?
                .encode_gauge(&(v as i64))?;
        }
        let refusals: [(&str, u64); 5] = [
            ("max-connections", c.refused_total),
            ("max-connections-per-host", c.refused_per_ip),
            ("max-controllers", h.hits.controllers),
            ("max-controllers-per-host", h.hits.controllers_per_host),
            ("max-io-queues-per-host", h.hits.io_queues_per_host),
        ];
        let mut m = enc.encode_descriptor(
            "nvmf_limit_refusals",
            "Connections and Connects refused because a cap was reached, by the option that sets it",
            None,
            MetricType::Counter,
        )?;
        for (limit, n) in refusals {
            let l: Labels = vec![("limit", limit.to_string())];
            m.encode_family(&l)?
                .encode_counter::<NoLabelSet, _, u64>(&n, None)?;
        }
        Ok(())
    }
}

/// The process's resource use, read from /proc/self, under the names every
/// Prometheus client library uses (`process_*`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProcessMetrics {
    pub cpu_seconds: f64,
    pub resident_bytes: u64,
    pub virtual_bytes: u64,
    pub open_fds: u64,
    /// None: unlimited.
    pub max_fds: Option<u64>,
    pub start_time_seconds: f64,
    pub threads: u64,
}

impl ProcessMetrics {
    /// Reads /proc/self (None when it cannot be read).
    pub fn read() -> Option<ProcessMetrics> {
        let me = procfs::process::Process::myself().ok()?;
        let st = me.stat().ok()?;
        let tps = procfs::ticks_per_second() as f64;
        let boot = procfs::boot_time_secs().ok()? as f64;
        let max_fds = me
            .limits()
            .ok()
            .and_then(|l| match l.max_open_files.soft_limit {
                procfs::process::LimitValue::Value(v) => Some(v),
                procfs::process::LimitValue::Unlimited => None,
            });
        Some(ProcessMetrics {
            cpu_seconds: (st.utime + st.stime) as f64 / tps,
            resident_bytes: st.rss.saturating_mul(procfs::page_size()),
            virtual_bytes: st.vsize,
            open_fds: me.fd_count().ok()? as u64,
            max_fds,
            start_time_seconds: boot + st.starttime as f64 / tps,
            threads: u64::try_from(st.num_threads).unwrap_or(0),
        })
    }
}

#[derive(Debug)]
struct Process(ProcessMetrics);

impl Collector for Process {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let p = &self.0;
        let mut m = enc.encode_descriptor(
            "process_cpu_seconds",
            "User and system CPU time of the process (seconds)",
            None,
            MetricType::Counter,
        )?;
        m.encode_counter::<NoLabelSet, _, f64>(&p.cpu_seconds, None)?;
        let mut gauges: Vec<(&str, &str, f64)> = vec![
            (
                "process_resident_memory_bytes",
                "Resident memory of the process (bytes)",
                p.resident_bytes as f64,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory of the process (bytes)",
                p.virtual_bytes as f64,
            ),
            (
                "process_open_fds",
                "File descriptors open",
                p.open_fds as f64,
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since the Unix epoch (seconds)",
                p.start_time_seconds,
            ),
            (
                "process_threads",
                "Threads of the process",
                p.threads as f64,
            ),
        ];
        if let Some(max) = p.max_fds {
            gauges.push((
                "process_max_fds",
                "Soft limit of open file descriptors (RLIMIT_NOFILE)",
                max as f64,
            ));
        }
        for (name, help, v) in gauges {
            enc.encode_descriptor(name, help, None, MetricType::Gauge)?
                .encode_gauge(&v)?;
        }
        Ok(())
    }
}

#[derive(Debug)]
struct Paths(PathTable);

/// Each reactor's NVMe/RDMA side, by reactor id.
#[derive(Debug)]
struct Rdma(Vec<(usize, RdmaSnapshot)>);

impl Collector for Rdma {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        if self.0.is_empty() {
            return Ok(());
        }
        type Get = fn(&RdmaSnapshot) -> u64;
        let metrics: [(&str, &str, MetricType, Get); 7] = [
            (
                "nvmf_rdma_qpairs",
                "NVMe/RDMA queue pairs the reactor serves now",
                MetricType::Gauge,
                |r| r.qpairs,
            ),
            (
                "nvmf_rdma_cq_wakeups",
                "Completion-channel events the reactor handled (woken for a CQ)",
                MetricType::Counter,
                |r| r.poll.cq_wakeups,
            ),
            (
                "nvmf_rdma_busy_polls",
                "Busy polls of unarmed CQs (no wake-up)",
                MetricType::Counter,
                |r| r.poll.busy_polls,
            ),
            (
                "nvmf_rdma_completions",
                "Work completions reaped, all ways",
                MetricType::Counter,
                |r| r.poll.completions,
            ),
            (
                "nvmf_rdma_polled_completions",
                "Work completions reaped by busy polls",
                MetricType::Counter,
                |r| r.poll.polled_completions,
            ),
            (
                "nvmf_rdma_async_events",
                "RDMA device asynchronous events read (queue pair errors, last WQE reached, port and device events)",
                MetricType::Counter,
                |r| r.poll.async_events,
            ),
            (
                "nvmf_rdma_srq_unconfirmed_teardowns",
                "Queue pairs on a shared receive queue destroyed without their last-WQE event (a receive buffer may be lost with each)",
                MetricType::Counter,
                |r| r.poll.srq_unconfirmed_teardowns,
            ),
        ];
        for (name, help, ty, get) in metrics {
            let mut m = enc.encode_descriptor(name, help, None, ty)?;
            for (id, r) in &self.0 {
                let l: Labels = vec![("reactor", id.to_string())];
                let mut f = m.encode_family(&l)?;
                match ty {
                    MetricType::Counter => f.encode_counter::<NoLabelSet, _, u64>(&get(r), None)?,
                    _ => f.encode_gauge(&get(r))?,
                }
            }
        }
        Ok(())
    }
}

/// One bdev's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BdevCounters {
    pub name: String,
    /// Reads and Writes that waited for its QoS tokens.
    pub qos_throttled: u64,
    /// Fused Compare and Writes that compared its data, and how many of
    /// them miscompared.
    pub compare_and_writes: u64,
    pub miscompares: u64,
}

/// Counters per bdev.
#[derive(Debug)]
struct Bdevs(Vec<BdevCounters>);

impl Collector for Bdevs {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        if self.0.is_empty() {
            return Ok(());
        }
        type Get = fn(&BdevCounters) -> u64;
        let families: [(&str, &str, Get); 3] = [
            (
                "nvmf_bdev_qos_throttled",
                "Reads and Writes that waited for the bdev's QoS rate limit tokens (bdev_set_qos_limit)",
                |b| b.qos_throttled,
            ),
            (
                "nvmf_bdev_compare_and_writes",
                "Fused Compare and Writes that read and compared the bdev's data",
                |b| b.compare_and_writes,
            ),
            (
                "nvmf_bdev_compare_and_write_miscompares",
                "Fused Compare and Writes whose data differed (Compare Failure, nothing written)",
                |b| b.miscompares,
            ),
        ];
        for (name, help, get) in families {
            let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
            for b in &self.0 {
                let l: Labels = vec![("bdev", b.name.clone())];
                m.encode_family(&l)?
                    .encode_counter::<NoLabelSet, _, u64>(&get(b), None)?;
            }
        }
        Ok(())
    }
}

/// The gateway group's counters (`--gateway-group`), inserted before the
/// exposition's `# EOF`.
pub fn with_group(body: String, h: &crate::gateway::Handle) -> String {
    let mut reg = Registry::default();
    reg.register_collector(Box::new(Group(GroupSnapshot::of(h))));
    let mut more = String::new();
    let _ = prometheus_client::encoding::text::encode(&mut more, &reg);
    let head = body.strip_suffix("# EOF\n").unwrap_or(&body);
    format!("{head}{more}")
}

/// The counters of [`crate::gateway::member::Counters`], read once.
#[derive(Debug, Clone)]
struct GroupSnapshot {
    group: String,
    member: String,
    secs: f64,
    counters: Vec<(&'static str, &'static str, bool, u64)>,
}

impl GroupSnapshot {
    fn of(h: &crate::gateway::Handle) -> GroupSnapshot {
        use std::sync::atomic::Ordering::Relaxed;
        let c = &h.counters;
        let n = c.renewals.load(Relaxed);
        GroupSnapshot {
            group: h.opts.name.clone(),
            member: h.opts.id.clone(),
            secs: 0.0,
            counters: vec![
                ("nvmf_group_lease_renewals", "Lease renewals that succeeded", true, n),
                ("nvmf_group_lease_renewal_failures", "Lease renewals that failed", true, c.renewal_failures.load(Relaxed)),
                ("nvmf_group_lease_renewal_seconds", "Round trips of the successful lease renewals, summed (seconds)", true, 0),
                ("nvmf_group_takeovers", "ANA groups this member took (after fencing their owner when it was alive before)", true, c.takeovers.load(Relaxed)),
                ("nvmf_group_fencings", "Members this member fenced (blocklisted their RADOS client)", true, c.fencings.load(Relaxed)),
                ("nvmf_group_handovers", "ANA groups this member handed over (planned: failback, nvmf gw move)", true, c.handovers.load(Relaxed)),
                ("nvmf_group_self_fences", "Times this member fenced itself (no lease renewal for L - L/5)", true, c.self_fences.load(Relaxed)),
                ("nvmf_group_rados_errors", "RADOS calls of the member that failed (retried)", true, c.rados_errors.load(Relaxed)),
                ("nvmf_group_notifies_received", "Notifies from other members (a changed record or configuration) that woke this member", true, h.notifies()),
                ("nvmf_group_epoch", "Epoch of the group record this member last read", false, c.epoch.load(Relaxed)),
                ("nvmf_group_ana_groups_owned", "ANA groups optimized on this member now", false, c.owned.load(Relaxed)),
                ("nvmf_group_self_fenced", "1 while this member is fenced by itself", false, c.fenced_now.load(Relaxed)),
            ],
        }
        .with_renewal_seconds(c.renewal_us.load(Relaxed))
    }

    fn with_renewal_seconds(mut self, us: u64) -> GroupSnapshot {
        self.counters
            .retain(|c| c.0 != "nvmf_group_lease_renewal_seconds");
        self.secs = us as f64 / 1e6;
        self
    }
}

#[derive(Debug)]
struct Group(GroupSnapshot);

impl Collector for Group {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let g = &self.0;
        let l: Labels = vec![("group", g.group.clone()), ("member", g.member.clone())];
        for (name, help, counter, v) in &g.counters {
            let ty = if *counter {
                MetricType::Counter
            } else {
                MetricType::Gauge
            };
            let mut m = enc.encode_descriptor(name, help, None, ty)?;
            let mut f = m.encode_family(&l)?;
            if *counter {
                f.encode_counter::<NoLabelSet, _, u64>(v, None)?;
            } else {
                f.encode_gauge(&(*v as i64))?;
            }
        }
        let mut m = enc.encode_descriptor(
            "nvmf_group_lease_renewal_seconds",
            "Round trips of the successful lease renewals, summed (seconds)",
            None,
            MetricType::Counter,
        )?;
        m.encode_family(&l)?
            .encode_counter::<NoLabelSet, _, f64>(&g.secs, None)?;
        Ok(())
    }
}

type Labels = Vec<(&'static str, String)>;

fn path_labels(k: &PathKey) -> Labels {
    vec![
        ("subsystem", k.subnqn.clone()),
        ("listener", k.listener.clone()),
        ("transport", k.trtype.to_string()),
        ("host", k.hostnqn.clone()),
        (
            "cntlid",
            if k.is_gone() {
                "closed".to_string()
            } else {
                k.cntlid.to_string()
            },
        ),
    ]
}

fn ns_labels(k: &PathKey, nsid: u32) -> Labels {
    let mut l = path_labels(k);
    l.push(("namespace", nsid.to_string()));
    l
}

/// Our buckets merged at powers of two from 1 µs up, in seconds, as
/// (upper bound, count in that range): the encoder makes them cumulative.
fn prom_buckets(h: &Histogram) -> Vec<(f64, u64)> {
    let mut out = Vec::with_capacity(HIST_BUCKETS / 4 + 2);
    let mut acc = 0;
    for (i, n) in h.buckets().iter().enumerate() {
        acc += n;
        let upper = bucket_upper_ns(i);
        // Octave boundaries only (1024 ns · 2^k); the last bucket is +Inf.
        if upper >= 1024 && upper.is_power_of_two() && i != HIST_BUCKETS - 1 {
            out.push((upper as f64 / 1e9, std::mem::take(&mut acc)));
        }
    }
    out.push((f64::INFINITY, acc));
    out
}

impl Collector for Paths {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let paths = self.0.sorted();
        type Get = fn(&crate::paths::PathStats) -> u64;
        let path_metrics: [(&str, &str, MetricType, Get); 3] = [
            (
                "nvmf_path_commands",
                "Commands received on the path's queues (admin and I/O)",
                MetricType::Counter,
                |p| p.stats.commands,
            ),
            (
                "nvmf_path_in_flight",
                "Commands received and not yet answered on the path's I/O queues",
                MetricType::Gauge,
                |p| p.in_flight,
            ),
            (
                "nvmf_path_qpairs",
                "Queue pairs of the path open now",
                MetricType::Gauge,
                |p| p.qpairs,
            ),
        ];
        for (name, help, ty, get) in path_metrics {
            let mut m = enc.encode_descriptor(name, help, None, ty)?;
            for (k, p) in &paths {
                // Gone controllers have no queue and nothing in flight.
                if !matches!(ty, MetricType::Counter) && k.is_gone() {
                    continue;
                }
                let l = path_labels(k);
                let mut f = m.encode_family(&l)?;
                match ty {
                    MetricType::Counter => f.encode_counter::<NoLabelSet, _, u64>(&get(p), None)?,
                    _ => f.encode_gauge(&get(p))?,
                }
            }
        }
        {
            let mut m = enc.encode_descriptor(
                "nvmf_path_errors",
                "Commands answered with an error status, by status",
                None,
                MetricType::Counter,
            )?;
            for (k, p) in &paths {
                let t = &p.stats.errors_by_status;
                let mut by: Vec<(String, u64)> = t
                    .iter()
                    .map(|(sct, sc, n)| {
                        let st = Status {
                            sct,
                            sc,
                            dnr: false,
                            more: false,
                        };
                        (format!("{} (sct {sct:#x} sc {sc:#x})", st.name()), n)
                    })
                    .collect();
                if t.other != 0 {
                    by.push(("other".into(), t.other));
                }
                for (status, n) in by {
                    let mut l = path_labels(k);
                    l.push(("status", status));
                    m.encode_family(&l)?
                        .encode_counter::<NoLabelSet, _, u64>(&n, None)?;
                }
            }
        }
        type NsGet = fn(&nvmf_core::stats::NsStats) -> u64;
        let ns_counters: [(&str, &str, NsGet); 5] = [
            ("nvmf_ns_reads", "Read commands", |n| n.reads),
            ("nvmf_ns_writes", "Write commands", |n| n.writes),
            (
                "nvmf_ns_read_bytes",
                "Bytes returned by successful reads",
                |n| n.bytes_read,
            ),
            (
                "nvmf_ns_written_bytes",
                "Bytes stored by successful writes",
                |n| n.bytes_written,
            ),
            (
                "nvmf_ns_errors",
                "Reads and writes answered with an error status",
                |n| n.errors,
            ),
        ];
        for (name, help, get) in ns_counters {
            let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (k, p) in &paths {
                for n in p.ns.iter() {
                    m.encode_family(&ns_labels(k, n.nsid))?
                        .encode_counter::<NoLabelSet, _, u64>(&get(n), None)?;
                }
            }
        }
        type HistGet = fn(&nvmf_core::stats::NsStats) -> &Histogram;
        let hists: [(&str, &str, HistGet); 2] = [
            (
                "nvmf_ns_read_latency_seconds",
                "Read latency, capsule received to response queued",
                |n| &n.read_latency,
            ),
            (
                "nvmf_ns_write_latency_seconds",
                "Write latency, capsule received to response queued (includes the R2T data transfer)",
                |n| &n.write_latency,
            ),
        ];
        for (name, help, get) in hists {
            let mut m = enc.encode_descriptor(name, help, None, MetricType::Histogram)?;
            for (k, p) in &paths {
                for n in p.ns.iter() {
                    let h = get(n);
                    m.encode_family(&ns_labels(k, n.nsid))?
                        .encode_histogram::<NoLabelSet>(
                            h.sum_ns() as f64 / 1e9,
                            h.count(),
                            &prom_buckets(h),
                            None,
                        )?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_paths(paths: PathTable) -> Exposition {
        Exposition {
            reactors: ReactorMetrics {
                paths,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn reactors_ana_limits_and_the_process_are_exposed() {
        let x = Exposition {
            reactors: ReactorMetrics {
                times: vec![
                    ReactorTimes {
                        id: 0,
                        busy_ns: 1_500_000_000,
                        idle_ns: 500_000_000,
                        poll_window_ns: 50_000,
                        backend_skips: 0,
                        zc_calls: 7,
                        zc_copied: 5,
                    },
                    ReactorTimes {
                        id: 1,
                        busy_ns: 0,
                        idle_ns: 2_000_000_000,
                        poll_window_ns: 0,
                        backend_skips: 12,
                        zc_calls: 0,
                        zc_copied: 0,
                    },
                ],
                unanswered: 1,
                ..Default::default()
            },
            ana: vec![SubsystemAnaMetrics {
                subsystem: "nqn.s".into(),
                changes: 3,
                states: vec![
                    ("10.0.0.1:4420".into(), 1, 1),
                    ("10.0.0.2:4420".into(), 1, 3),
                ],
            }],
            host_limits: HostLimitMetrics {
                limits: nvmf_core::HostLimits {
                    max_controllers: 64,
                    ..Default::default()
                },
                hits: nvmf_core::LimitHits {
                    controllers: 2,
                    controllers_per_host: 0,
                    io_queues_per_host: 5,
                },
                controllers: 7,
            },
            connections: ConnUsage {
                open: 9,
                max_total: 4096,
                max_per_ip: 512,
                refused_total: 0,
                refused_per_ip: 4,
            },
            process: ProcessMetrics::read(),
            ..Default::default()
        };
        let body = encode(&x);
        let has = |line: &str| body.lines().any(|l| l == line);
        for line in [
            r#"nvmf_reactor_busy_seconds_total{reactor="0"} 1.5"#,
            r#"nvmf_reactor_idle_seconds_total{reactor="1"} 2.0"#,
            r#"nvmf_reactor_poll_window_seconds{reactor="0"} 0.00005"#,
            r#"nvmf_reactor_backend_waits_total{reactor="1"} 12"#,
            r#"nvmf_tcp_zerocopy_sends_total{reactor="0"} 7"#,
            r#"nvmf_tcp_zerocopy_copied_total{reactor="0"} 5"#,
            "nvmf_reactors_unresponsive 1",
            r#"nvmf_ana_state{subsystem="nqn.s",listener="10.0.0.2:4420",ana_group="1"} 3"#,
            r#"nvmf_ana_changes_total{subsystem="nqn.s"} 3"#,
            "nvmf_connections_open 9",
            "nvmf_connections_max 4096",
            "nvmf_controllers_active 7",
            "nvmf_controllers_max 64",
            r#"nvmf_limit_refusals_total{limit="max-connections-per-host"} 4"#,
            r#"nvmf_limit_refusals_total{limit="max-controllers"} 2"#,
            r#"nvmf_limit_refusals_total{limit="max-io-queues-per-host"} 5"#,
        ] {
            assert!(has(line), "missing {line}:\n{body}");
        }
        // this test process's own figures, read from /proc
        let p = x.process.expect("/proc/self is readable");
        assert!(
            p.resident_bytes > 1 << 20 && p.open_fds >= 3 && p.threads >= 1,
            "{p:?}"
        );
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(
            p.start_time_seconds > now - 3600.0 && p.start_time_seconds <= now + 2.0,
            "{p:?}"
        );
        assert!(body.contains("process_cpu_seconds_total "), "{body}");
        assert!(body.contains("process_resident_memory_bytes "), "{body}");
        assert!(body.trim_end().ends_with("# EOF"), "{body}");
    }

    #[test]
    fn requests_are_classified() {
        assert_eq!(
            parse(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Some(Req::Metrics { head: false })
        );
        assert_eq!(
            parse(b"HEAD /metrics?x=1 HTTP/1.0\r\n\r\n"),
            Some(Req::Metrics { head: true })
        );
        assert_eq!(parse(b"GET / HTTP/1.1\r\n\r\n"), Some(Req::NotFound));
        assert_eq!(
            parse(b"POST /metrics HTTP/1.1\r\n\r\n"),
            Some(Req::BadMethod)
        );
        assert_eq!(parse(b"GET /metrics HTTP/1.1\r\n"), None);
        assert_eq!(parse(b"\x01\x02 garbage\r\n\r\n"), Some(Req::Bad));
    }

    #[test]
    fn qos_throttled_commands_are_exposed_per_bdev() {
        let t = PathTable::default();
        let b = |name: &str, q, c, m| BdevCounters {
            name: name.into(),
            qos_throttled: q,
            compare_and_writes: c,
            miscompares: m,
        };
        let out = encode(&Exposition {
            bdevs: vec![b("Malloc0", 42, 7, 2), b("Malloc1", 0, 0, 0)],
            ..with_paths(t.clone())
        });
        assert!(
            out.contains("nvmf_bdev_qos_throttled_total{bdev=\"Malloc0\"} 42"),
            "{out}"
        );
        assert!(
            out.contains("nvmf_bdev_qos_throttled_total{bdev=\"Malloc1\"} 0"),
            "{out}"
        );
        assert!(
            out.contains("nvmf_bdev_compare_and_writes_total{bdev=\"Malloc0\"} 7"),
            "{out}"
        );
        assert!(
            out.contains("nvmf_bdev_compare_and_write_miscompares_total{bdev=\"Malloc0\"} 2"),
            "{out}"
        );
        assert!(
            !encode(&with_paths(t)).contains("qos"),
            "none without bdevs"
        );
    }

    #[test]
    fn rdma_queues_and_poll_counters_are_exposed() {
        use crate::paths::PathStats;
        let mut t = PathTable::default();
        let key = PathKey {
            subnqn: "nqn.s".into(),
            listener: "10.0.0.1:4420".into(),
            trtype: "RDMA",
            hostnqn: "nqn.h".into(),
            cntlid: 3,
        };
        let mut p = PathStats {
            qpairs: 2,
            ..Default::default()
        };
        p.stats.commands = 11;
        t.paths.insert(key, p);
        let r = RdmaSnapshot {
            poll: nvmf_rdma::PollStats {
                cq_wakeups: 7,
                busy_polls: 8,
                completions: 9,
                polled_completions: 4,
                ..Default::default()
            },
            qpairs: 2,
            ..Default::default()
        };
        let mut x = with_paths(t.clone());
        x.reactors.rdma = vec![(1, r)];
        let body = encode(&x);
        let has = |line: &str| body.lines().any(|l| l == line);
        assert!(
            has(
                r#"nvmf_path_qpairs{subsystem="nqn.s",listener="10.0.0.1:4420",transport="RDMA",host="nqn.h",cntlid="3"} 2"#
            ),
            "{body}"
        );
        assert!(has(
            r#"nvmf_path_commands_total{subsystem="nqn.s",listener="10.0.0.1:4420",transport="RDMA",host="nqn.h",cntlid="3"} 11"#
        ));
        assert!(has(r#"nvmf_rdma_qpairs{reactor="1"} 2"#), "{body}");
        assert!(has(r#"nvmf_rdma_cq_wakeups_total{reactor="1"} 7"#));
        assert!(has(r#"nvmf_rdma_busy_polls_total{reactor="1"} 8"#));
        assert!(has(r#"nvmf_rdma_completions_total{reactor="1"} 9"#));
        assert!(has(r#"nvmf_rdma_polled_completions_total{reactor="1"} 4"#));
        // no RDMA port anywhere: no RDMA series
        assert!(!encode(&with_paths(t)).contains("nvmf_rdma_"));
    }

    #[test]
    fn prometheus_buckets_are_powers_of_two() {
        let mut h = Histogram::default();
        h.record(1500); // (1024, 2048]
        h.record(3_000_000);
        let b = prom_buckets(&h);
        assert_eq!(b[0], (1024e-9, 0));
        assert_eq!(b[1], (2048e-9, 1));
        assert_eq!(b.iter().map(|x| x.1).sum::<u64>(), 2);
        assert!(b.windows(2).all(|w| w[0].0 < w[1].0));
        assert_eq!(b.last().unwrap(), &(f64::INFINITY, 0));
    }
}
