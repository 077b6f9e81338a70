//! The `MSG_ZEROCOPY` socket calls: turning it on for a socket, sending
//! with or without it, and reading the kernel's reports of finished calls
//! from the socket's error queue.

use std::io::{self, IoSlice};
use std::os::fd::RawFd;

/// Reports read from one error queue per call (each covers a range of calls).
const DRAIN_BUDGET: usize = 64;

/// `SO_EE_ORIGIN_ZEROCOPY` and `SO_EE_CODE_ZEROCOPY_COPIED` (linux/errqueue.h).
const SO_EE_ORIGIN_ZEROCOPY: u8 = 5;
const SO_EE_CODE_ZEROCOPY_COPIED: u8 = 1;

/// Asks the kernel to accept `MSG_ZEROCOPY` on `fd` (`SO_ZEROCOPY`).
pub fn enable(fd: RawFd) -> io::Result<()> {
    let one: libc::c_int = 1;
    // SAFETY: setsockopt with a pointer to a live c_int and its size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ZEROCOPY,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// How one send call goes out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendKind {
    /// Copied into the socket; `more`: data follows at once (`MSG_MORE`).
    Copy { more: bool },
    /// `MSG_ZEROCOPY`: the kernel sends from the caller's pages, which must
    /// stay untouched until it reports the call done ([`drain`]).
    ZeroCopy,
}

/// One non-blocking `sendmsg` of `iov`: with `MSG_ZEROCOPY` for
/// [`SendKind::ZeroCopy`], with `MSG_MORE` when zero-copy data follows a
/// copied header.
pub fn send(fd: RawFd, iov: &[IoSlice<'_>], kind: SendKind) -> io::Result<usize> {
    let flags = libc::MSG_NOSIGNAL
        | libc::MSG_DONTWAIT
        | match kind {
            SendKind::ZeroCopy => libc::MSG_ZEROCOPY,
            SendKind::Copy { more: true } => libc::MSG_MORE,
            SendKind::Copy { more: false } => 0,
        };
    // SAFETY: a zeroed msghdr pointing at `iov` (IoSlice is ABI-compatible
    // with iovec), alive for the call.
    let n = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
        msg.msg_iovlen = iov.len() as _;
        libc::sendmsg(fd, &msg, flags)
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Reads the zero-copy reports waiting on `fd`'s error queue (at most
/// [`DRAIN_BUDGET`]), calling `report(lo, hi, copied)` for each. Returns
/// how many were read; other errors queued there are skipped.
pub fn drain(fd: RawFd, mut report: impl FnMut(u32, u32, bool)) -> io::Result<usize> {
    let mut n = 0;
    for _ in 0..DRAIN_BUDGET {
        // Room for one cmsg carrying a sock_extended_err (and an address).
        let mut control = [0u64; 16];
        // SAFETY: a zeroed msghdr with no data buffer and a control buffer
        // that lives for the call; the kernel writes at most msg_controllen.
        let (r, msg) = unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = std::mem::size_of_val(&control) as _;
            let r = libc::recvmsg(fd, &mut msg, libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT);
            (r, msg)
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock => Ok(n),
                io::ErrorKind::Interrupted => continue,
                _ => Err(e),
            };
        }
        // SAFETY: walks the control messages the kernel wrote into `msg`.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                let h = &*c;
                let recverr = (h.cmsg_level == libc::SOL_IP && h.cmsg_type == libc::IP_RECVERR)
                    || (h.cmsg_level == libc::SOL_IPV6 && h.cmsg_type == libc::IPV6_RECVERR);
                if recverr
                    && h.cmsg_len as usize
                        >= libc::CMSG_LEN(std::mem::size_of::<libc::sock_extended_err>() as u32)
                            as usize
                {
                    let ee: libc::sock_extended_err =
                        std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                    if ee.ee_errno == 0 && ee.ee_origin == SO_EE_ORIGIN_ZEROCOPY {
                        report(
                            ee.ee_info,
                            ee.ee_data,
                            ee.ee_code & SO_EE_CODE_ZEROCOPY_COPIED != 0,
                        );
                        n += 1;
                    }
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
    }
    Ok(n)
}
