//! The receive buffers of a shared receive queue (SRQ), as a sans-I/O pool:
//! no verbs call in it.
//!
//! Owns [`RecvPool`]: one contiguous allocation of `count` capsule buffers
//! (SQE + in-capsule data each; the caller registers it once) and the state
//! of each buffer: idle (waiting to be posted), posted on the SRQ, or held by
//! the queue whose receive completion named it. Every queue pair of a device
//! takes its receives from that device's pool; a receive completion carries
//! the buffer's `wr_id`, and the queue that got it parses the capsule in
//! place ([`crate::RdmaQueue::on_shared_recv`]) and gives the buffer back at
//! once. Given-back buffers are reposted in batches
//! ([`RecvPool::take_posts`]: one `ibv_post_srq_recv` per reactor turn).
//!
//! The state per buffer is what keeps the SRQ sound: a completion for a
//! buffer that is not posted (a stale or duplicate `wr_id`) is refused, a
//! buffer given back twice is reposted once, and a buffer whose completion
//! never reached a queue (its queue pair died first) comes back when the
//! caller drains the dying queue pair's completions and gives them back.

/// `wr_id` kind of a shared receive buffer (high 32 bits; the low 32 bits
/// are the buffer index). Distinct from every kind a queue uses for its own
/// work requests.
pub const WR_SHARED_RECV: u64 = 6 << 32;
const WR_KIND: u64 = 0xffff_ffff << 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Idle,
    Posted,
    Held,
}

/// A receive buffer to post: `len` bytes at `offset` in the pool's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvPost {
    pub wr_id: u64,
    pub offset: usize,
    pub len: u32,
}

/// The buffers of one shared receive queue (see the module documentation).
pub struct RecvPool {
    mem: Vec<u8>,
    capsule_len: usize,
    state: Vec<State>,
    /// Idle buffers waiting to be posted, oldest first.
    idle: Vec<u32>,
    posted: usize,
    held: usize,
}

impl RecvPool {
    /// `count` buffers of `capsule_len` bytes (64 + in-capsule data size),
    /// all idle: the first [`take_posts`](RecvPool::take_posts) posts them.
    pub fn new(count: u32, capsule_len: usize) -> RecvPool {
        let count = count.max(1);
        RecvPool {
            mem: vec![0; count as usize * capsule_len],
            capsule_len,
            state: vec![State::Idle; count as usize],
            idle: (0..count).collect(),
            posted: 0,
            held: 0,
        }
    }

    /// Whether `wr_id` names a shared receive buffer (of any pool).
    pub fn owns(wr_id: u64) -> bool {
        wr_id & WR_KIND == WR_SHARED_RECV
    }

    /// Buffers in the pool.
    pub fn count(&self) -> usize {
        self.state.len()
    }

    /// Bytes of one buffer.
    pub fn capsule_len(&self) -> usize {
        self.capsule_len
    }

    /// Buffers posted on the SRQ now (as far as the pool knows).
    pub fn posted(&self) -> usize {
        self.posted
    }

    /// Buffers a queue holds now (completed, not given back).
    pub fn held(&self) -> usize {
        self.held
    }

    /// Buffers waiting to be (re)posted.
    pub fn idle(&self) -> usize {
        self.idle.len()
    }

    /// The whole allocation (one registration).
    pub fn memory(&mut self) -> &mut [u8] {
        &mut self.mem
    }

    /// Moves every idle buffer to `into` (to be posted as one list) and
    /// counts them as posted. If the post fails part-way, give the ones not
    /// posted back with [`not_posted`](RecvPool::not_posted).
    pub fn take_posts(&mut self, into: &mut Vec<RecvPost>) {
        for i in self.idle.drain(..) {
            self.state[i as usize] = State::Posted;
            self.posted += 1;
            into.push(RecvPost {
                wr_id: WR_SHARED_RECV | u64::from(i),
                offset: i as usize * self.capsule_len,
                len: self.capsule_len as u32,
            });
        }
    }

    /// Buffers of a failed post that the device did not take: idle again.
    pub fn not_posted(&mut self, posts: &[RecvPost]) {
        for p in posts {
            if let Some(i) = self.index(p.wr_id) {
                if self.state[i as usize] == State::Posted {
                    self.state[i as usize] = State::Idle;
                    self.posted -= 1;
                    self.idle.push(i);
                }
            }
        }
    }

    fn index(&self, wr_id: u64) -> Option<u32> {
        let i = (wr_id & !WR_KIND) as u32;
        (Self::owns(wr_id) && (i as usize) < self.state.len()).then_some(i)
    }

    /// A receive completion named `wr_id`: the buffer is now held by the
    /// queue it arrived on. `None` (nothing changes) when `wr_id` is not a
    /// posted buffer of this pool: a stale or duplicate completion.
    pub fn complete(&mut self, wr_id: u64) -> Option<u32> {
        let i = self.index(wr_id)?;
        let s = &mut self.state[i as usize];
        if *s != State::Posted {
            return None;
        }
        *s = State::Held;
        self.posted -= 1;
        self.held += 1;
        Some(i)
    }

    /// The first `len` bytes of held buffer `i` (empty if `i` is not held).
    pub fn capsule(&mut self, i: u32, len: usize) -> &mut [u8] {
        if self.state.get(i as usize) != Some(&State::Held) {
            return &mut [];
        }
        let at = i as usize * self.capsule_len;
        let len = len.min(self.capsule_len);
        &mut self.mem[at..at + len]
    }

    /// The queue is done with held buffer `i`: idle, reposted with the next
    /// batch. A buffer not held is left alone (never posted twice).
    pub fn give_back(&mut self, i: u32) {
        if self.state.get(i as usize) == Some(&State::Held) {
            self.state[i as usize] = State::Idle;
            self.held -= 1;
            self.idle.push(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_is_posted_held_and_reposted_once() {
        let mut p = RecvPool::new(4, 128);
        let mut posts = Vec::new();
        p.take_posts(&mut posts);
        assert_eq!(posts.len(), 4);
        assert_eq!(posts[1].offset, 128);
        assert_eq!(p.posted(), 4);
        let i = p.complete(posts[2].wr_id).expect("posted");
        assert_eq!(p.complete(posts[2].wr_id), None, "a duplicate is refused");
        assert_eq!(p.capsule(i, 1000).len(), 128);
        p.give_back(i);
        p.give_back(i);
        assert_eq!(p.idle(), 1, "given back twice, reposted once");
        posts.clear();
        p.take_posts(&mut posts);
        assert_eq!(posts.len(), 1);
        assert_eq!(p.posted(), 4);
        assert_eq!(p.complete(7), None, "not a shared receive");
        assert_eq!(p.complete(WR_SHARED_RECV | 99), None, "out of range");
        p.not_posted(&posts);
        assert_eq!((p.posted(), p.idle()), (3, 1));
    }
}
