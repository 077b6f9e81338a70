//! CPU affinity: which cores this process may run on (the default reactor
//! set) and pinning the calling thread to one core.

use std::io;

/// The CPUs in this process's affinity mask (what `taskset`/cgroups allow),
/// in ascending order.
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity fills it and we only
    // read it through the libc CPU_ISSET helper.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Err(io::Error::last_os_error());
        }
        let max = 8 * std::mem::size_of::<libc::cpu_set_t>();
        Ok((0..max).filter(|&c| libc::CPU_ISSET(c, &set)).collect())
    }
}

/// Pins the calling thread to `cpu`.
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    if cpu >= 8 * std::mem::size_of::<libc::cpu_set_t>() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "cpu number too large",
        ));
    }
    // SAFETY: as above; pid 0 means the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}
