//! bench/cpu.rs — CPU accounting for `nvmf bench run`: the readers of
//! `/proc/PID/stat` (utime + stime of a process, all its threads, exited
//! ones included), `/proc/stat` (all-CPU totals and steal) and
//! `/proc/loadavg`, under an injectable root so the unit tests use fake
//! trees; and `perf stat` around the measured window (cycles and
//! instructions of a set of processes, when the machine can count them).

use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where to read `/proc` from, and its clock tick.
#[derive(Debug, Clone)]
pub struct Proc {
    root: PathBuf,
    /// Clock ticks per second of `/proc/PID/stat` times (USER_HZ).
    hz: f64,
}

/// All-CPU totals of one `/proc/stat` sample, in clock ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatTotals {
    /// user + nice + system + idle + iowait + irq + softirq + steal.
    pub total: u64,
    pub steal: u64,
}

impl Proc {
    /// The running system.
    pub fn system() -> Proc {
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        Proc {
            root: PathBuf::from("/"),
            hz: if hz > 0 { hz as f64 } else { 100.0 },
        }
    }

    /// A fake tree under `root` with `hz` ticks per second.
    pub fn at(root: impl Into<PathBuf>, hz: f64) -> Proc {
        Proc {
            root: root.into(),
            hz,
        }
    }

    fn read(&self, rel: &str) -> Option<String> {
        std::fs::read_to_string(self.root.join(rel)).ok()
    }

    /// utime + stime of process `pid` (`self` for this process), seconds.
    pub fn process_cpu_s(&self, pid: &str) -> Option<f64> {
        let s = self.read(&format!("proc/{pid}/stat"))?;
        // The command name may hold spaces and ')': fields start after the last ')'.
        let rest = &s[s.rfind(')')? + 1..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        // rest[0] is field 3 (state); utime is field 14, stime field 15.
        let utime: u64 = f.get(11)?.parse().ok()?;
        let stime: u64 = f.get(12)?.parse().ok()?;
        Some((utime + stime) as f64 / self.hz)
    }

    /// CPU seconds of this process.
    pub fn self_cpu_s(&self) -> Option<f64> {
        self.process_cpu_s("self")
    }

    /// Sum over `pids` (None when the list is empty or one is unreadable).
    pub fn pids_cpu_s(&self, pids: &[u32]) -> Option<f64> {
        if pids.is_empty() {
            return None;
        }
        pids.iter()
            .map(|p| self.process_cpu_s(&p.to_string()))
            .sum()
    }

    /// The aggregate `cpu` line of `/proc/stat`.
    pub fn stat_totals(&self) -> Option<StatTotals> {
        let s = self.read("proc/stat")?;
        let line = s.lines().find(|l| l.starts_with("cpu "))?;
        let v: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(|x| x.parse().ok())
            .collect::<Option<_>>()?;
        if v.len() < 4 {
            return None;
        }
        // guest and guest_nice are already inside user and nice.
        Some(StatTotals {
            total: v.iter().take(8).sum(),
            steal: v.get(7).copied().unwrap_or(0),
        })
    }

    /// 1-minute load average.
    pub fn load1(&self) -> Option<f64> {
        self.read("proc/loadavg")?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    }
}

/// Share of CPU time stolen by the hypervisor between two samples, percent.
pub fn steal_pct(a: StatTotals, b: StatTotals) -> Option<f64> {
    let dt = b.total.checked_sub(a.total)?;
    let ds = b.steal.checked_sub(a.steal)?;
    (dt > 0).then(|| ds as f64 * 100.0 / dt as f64)
}

/// Cycles and instructions counted by `perf stat` (None: not counted).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub cycles: Option<u64>,
    pub instructions: Option<u64>,
}

/// Parse `perf stat -x,` output (`value,unit,event,...` per line;
/// `<not supported>` / `<not counted>` as the value when it could not
/// count). Returns the counts, or why nothing was counted.
pub fn parse_perf_csv(text: &str) -> Result<Counts, String> {
    let mut c = Counts::default();
    let mut why = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(',').collect();
        if f.len() < 3 {
            continue;
        }
        let event = f[2].split(':').next().unwrap_or("").trim();
        let slot = match event {
            "cycles" | "cpu-cycles" => &mut c.cycles,
            "instructions" => &mut c.instructions,
            _ => continue,
        };
        match f[0].trim().parse::<u64>() {
            Ok(v) => *slot = Some(v),
            Err(_) => why.push(format!("{event}: {}", f[0].trim())),
        }
    }
    if c.cycles.is_none() && c.instructions.is_none() {
        if why.is_empty() {
            let t = text.trim();
            return Err(if t.is_empty() {
                "perf stat printed nothing".into()
            } else {
                format!("perf stat: {}", t.lines().last().unwrap_or(t))
            });
        }
        return Err(format!("perf stat: {}", why.join(", ")));
    }
    Ok(c)
}

/// `perf stat -x, -e cycles,instructions -p PIDS`, running over a window.
pub struct PerfStat {
    child: Child,
}

/// The `perf` binary used (`$NVMF_BENCH_PERF`, default `perf` on PATH).
fn perf_bin() -> String {
    std::env::var("NVMF_BENCH_PERF").unwrap_or_else(|_| "perf".into())
}

impl PerfStat {
    /// Start counting `pids` (until `finish`).
    pub fn start(pids: &[u32]) -> Result<PerfStat, String> {
        if pids.is_empty() {
            return Err("no process to count".into());
        }
        let list: Vec<String> = pids.iter().map(u32::to_string).collect();
        let child = Command::new(perf_bin())
            .args(["stat", "-x,", "-e", "cycles,instructions", "-p"])
            .arg(list.join(","))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run perf: {e}"))?;
        Ok(PerfStat { child })
    }

    /// Stop counting (SIGINT, as perf expects) and read the counts.
    pub fn finish(mut self) -> Result<Counts, String> {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGINT) };
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    return Err("perf stat did not stop within 5 s".into());
                }
            }
        }
        let mut s = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut s);
        }
        parse_perf_csv(&s)
    }
}

impl Drop for PerfStat {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(files: &[(&str, &str)]) -> PathBuf {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let root = std::env::temp_dir().join(format!(
            "nvmf-bench-cpu-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&root);
        for (p, text) in files {
            let p = root.join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        root
    }

    #[test]
    fn process_times_from_proc_pid_stat() {
        // A command name with a space and a ')' must not shift the fields.
        let stat =
            "4242 (nvmfd x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 1000 0 0";
        let root = tree(&[
            ("proc/4242/stat", stat),
            ("proc/7/stat", "7 (a) R 1 7 7 0 -1 0 0 0 0 0 100 100 0 0"),
            (
                "proc/self/stat",
                "9 (nvmf) R 1 9 9 0 -1 0 0 0 0 0 30 20 0 0",
            ),
        ]);
        let p = Proc::at(&root, 100.0);
        assert_eq!(p.process_cpu_s("4242"), Some(3.0));
        assert_eq!(p.self_cpu_s(), Some(0.5));
        assert_eq!(p.pids_cpu_s(&[4242, 7]), Some(5.0));
        assert_eq!(p.pids_cpu_s(&[4242, 8]), None, "a missing pid");
        assert_eq!(p.pids_cpu_s(&[]), None);
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn steal_and_load_from_proc_stat_and_loadavg() {
        let a = "cpu  100 0 50 800 10 0 0 40 0 0\ncpu0 50 0 25 400 5 0 0 20 0 0\n";
        let b = "cpu  150 0 60 900 10 0 0 80 0 0\ncpu0 75 0 30 450 5 0 0 40 0 0\n";
        let ra = tree(&[
            ("proc/stat", a),
            ("proc/loadavg", "1.25 0.50 0.10 2/300 999\n"),
        ]);
        let rb = tree(&[("proc/stat", b)]);
        let (pa, pb) = (Proc::at(&ra, 100.0), Proc::at(&rb, 100.0));
        let (sa, sb) = (pa.stat_totals().unwrap(), pb.stat_totals().unwrap());
        assert_eq!(
            sa,
            StatTotals {
                total: 1000,
                steal: 40
            }
        );
        assert_eq!(sb.total, 1200);
        // 40 of 200 ticks stolen.
        assert_eq!(steal_pct(sa, sb), Some(20.0));
        assert_eq!(steal_pct(sa, sa), None);
        assert_eq!(pa.load1(), Some(1.25));
        assert_eq!(pb.load1(), None);
        std::fs::remove_dir_all(ra).unwrap();
        std::fs::remove_dir_all(rb).unwrap();
    }

    #[test]
    fn perf_csv_counts_or_the_reason() {
        let ok = "1234567,,cycles,1000,100.00,,\n2345678,,instructions,1000,100.00,1.90,insn per cycle\n";
        assert_eq!(
            parse_perf_csv(ok),
            Ok(Counts {
                cycles: Some(1234567),
                instructions: Some(2345678)
            })
        );
        let no = "<not supported>,,cycles,0,100.00,,\n<not supported>,,instructions,0,100.00,,\n";
        let e = parse_perf_csv(no).unwrap_err();
        assert!(e.contains("cycles: <not supported>"), "{e}");
        assert!(parse_perf_csv("").unwrap_err().contains("nothing"));
    }
}
