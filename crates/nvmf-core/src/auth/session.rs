//! One queue's DH-HMAC-CHAP transaction (target side), driven by the
//! queue pair with the bytes of each Authentication Send and for each
//! Authentication Receive:
//!
//! Negotiate (host sends AUTH_Negotiate; we pick the strongest digest and
//! DH group both sides allow) → Challenge (we return C1, S1 and our DH
//! public value) → Reply (host sends R1, optionally C2/S2, its DH value; we
//! check R1) → Success1 (we return it, with R2 when the host asked us to
//! authenticate) → [Success2 from the host when bidirectional] → done.
//!
//! The two modular exponentiations of an FFDHE group (our key pair at
//! Negotiate, the shared secret at Reply) cost milliseconds to tens of
//! milliseconds (ffdhe8192), so they never run on a reactor: `send` hands
//! them out as [`Step::Offload`] work (the queue pair runs it on the
//! `nvmfd-auth` thread, `pool.rs`, and completes the Send when it is done) and the
//! result waits in the session's mailbox for the next Receive, which
//! finishes the (cheap) HMAC work.
//!
//! A bad message or response moves to Failure1: the Send still completes
//! successfully, the next Receive returns AUTH_Failure1 and the queue is
//! closed after it (as the spec and SPDK's target do). A host's
//! AUTH_Failure2 (it did not accept our R2) fails the queue too.

use nvmf_wire::auth::{
    self as w, dhgroup_len, hash_len, HostMsg, AUTHID_DHCHAP, DHGROUP_FFDHE2048, DHGROUP_FFDHE3072,
    DHGROUP_FFDHE4096, DHGROUP_FFDHE6144, DHGROUP_FFDHE8192, DHGROUP_NULL,
    FAILURE_DHGROUP_UNUSABLE, FAILURE_FAILED, FAILURE_HASH_UNUSABLE, FAILURE_INCORRECT_PAYLOAD,
    FAILURE_INCORRECT_PROTOCOL_MESSAGE, FAILURE_PROTOCOL_UNUSABLE, FAILURE_SCC_MISMATCH,
    HASH_SHA256, HASH_SHA384, HASH_SHA512,
};

use super::chap::{ct_eq, response, ResponseInput, Side};
use super::ffdhe::DhKey;
use super::{AuthError, AuthPolicy, HostKeys};
use std::sync::{Arc, Mutex};

/// Strongest first (as SPDK's target picks).
const DIGESTS: [u8; 3] = [HASH_SHA512, HASH_SHA384, HASH_SHA256];
const DHGROUPS: [u8; 6] = [
    DHGROUP_FFDHE8192,
    DHGROUP_FFDHE6144,
    DHGROUP_FFDHE4096,
    DHGROUP_FFDHE3072,
    DHGROUP_FFDHE2048,
    DHGROUP_NULL,
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Waiting for AUTH_Negotiate.
    Negotiate,
    /// Negotiated; the next Receive returns the challenge.
    Challenge,
    /// Challenge sent; waiting for the host's Reply.
    Reply,
    /// Reply received; its check waits for the shared secret (mailbox):
    /// the next Receive finishes it and returns Success1 or Failure1.
    Verify,
    /// Reply accepted; the next Receive returns Success1.
    Success1,
    /// Success1 with R2 sent; waiting for the host's Success2.
    Success2,
    /// The next Receive returns AUTH_Failure1 with this reason.
    Failure1(u8),
    /// Authenticated.
    Done,
    /// Failed for good: the queue closes.
    Failed,
}

/// Result of offloaded DH work.
enum DhOutput {
    Key(DhKey),
    Secret(Vec<u8>),
}

type Mailbox = Arc<Mutex<Option<Result<DhOutput, AuthError>>>>;

/// Work to run off the reactor; it leaves its result in the session's
/// mailbox.
pub(crate) type Work = Box<dyn FnOnce() + Send>;

/// A Reply waiting for its shared secret.
struct PendingReply {
    response: Vec<u8>,
    host_challenge: Option<(u32, Vec<u8>)>,
}

/// What the queue pair does after a message.
pub(crate) enum Step {
    /// Run this off the reactor, then complete the command.
    Offload(Work),
    /// Keep going.
    Continue,
    /// The host is authenticated on this queue.
    Authenticated,
    /// Authentication failed: close the queue once the answer is out.
    Failed(&'static str),
}

/// Who is authenticating where.
pub(crate) struct Peer<'a> {
    pub policy: AuthPolicy,
    pub hostnqn: &'a str,
    pub subnqn: &'a str,
    /// The host's keys now (looked up for each Reply, so a rotation over
    /// RPC takes effect at the next (re-)authentication).
    pub keys: Option<HostKeys>,
}

pub(crate) struct Session {
    state: State,
    t_id: u16,
    hash_id: u8,
    dhgroup: u8,
    seqnum: u32,
    challenge: Vec<u8>,
    dh: Option<DhKey>,
    /// R2, when the host asked the controller to authenticate.
    ctrl_response: Option<Vec<u8>>,
    mailbox: Mailbox,
    reply: Option<PendingReply>,
    /// Why the transaction failed (logged by the queue pair).
    pub failure: &'static str,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("state", &self.state)
            .field("t_id", &self.t_id)
            .field("hash_id", &self.hash_id)
            .field("dhgroup", &self.dhgroup)
            .finish_non_exhaustive()
    }
}

fn random_bytes(buf: &mut [u8]) -> bool {
    getrandom::fill(buf).is_ok()
}

impl Session {
    pub fn new() -> Session {
        Session {
            state: State::Negotiate,
            t_id: 0,
            hash_id: 0,
            dhgroup: 0,
            seqnum: 0,
            challenge: Vec::new(),
            dh: None,
            ctrl_response: None,
            mailbox: Arc::new(Mutex::new(None)),
            reply: None,
            failure: "",
        }
    }

    /// Negotiated digest and DH group (for logs).
    pub fn negotiated(&self) -> (u8, u8) {
        (self.hash_id, self.dhgroup)
    }

    fn fail(&mut self, reason: u8, why: &'static str) -> Step {
        self.state = State::Failure1(reason);
        self.failure = why;
        self.dh = None;
        Step::Continue
    }

    /// An Authentication Send carrying `msg`.
    pub fn send(&mut self, peer: &Peer<'_>, msg: &[u8]) -> Step {
        let parsed = match w::parse_host_msg(msg) {
            Ok(m) => m,
            Err(e) => {
                return self.fail(
                    e.reason(),
                    if e.reason() == FAILURE_INCORRECT_PROTOCOL_MESSAGE {
                        "unexpected authentication message"
                    } else {
                        "malformed authentication message"
                    },
                )
            }
        };
        match parsed {
            HostMsg::Negotiate {
                t_id,
                sc_c,
                descriptors,
            } => {
                if !matches!(self.state, State::Negotiate | State::Done) {
                    return self.fail(FAILURE_INCORRECT_PROTOCOL_MESSAGE, "Negotiate out of order");
                }
                // A new transaction (re-authentication starts here too).
                *self = Session::new();
                self.t_id = t_id;
                if sc_c != 0 {
                    return self.fail(
                        FAILURE_SCC_MISMATCH,
                        "secure channel concatenation requested",
                    );
                }
                let Some(d) = descriptors.iter().find(|d| d.authid == AUTHID_DHCHAP) else {
                    return self.fail(FAILURE_PROTOCOL_UNUSABLE, "host offers no DH-HMAC-CHAP");
                };
                let Some(&h) = DIGESTS
                    .iter()
                    .find(|&&h| peer.policy.digests & (1 << h) != 0 && d.hashes().contains(&h))
                else {
                    return self.fail(FAILURE_HASH_UNUSABLE, "no digest both sides allow");
                };
                let Some(&g) = DHGROUPS
                    .iter()
                    .find(|&&g| peer.policy.dhgroups & (1 << g) != 0 && d.dhgroups().contains(&g))
                else {
                    return self.fail(FAILURE_DHGROUP_UNUSABLE, "no DH group both sides allow");
                };
                self.hash_id = h;
                self.dhgroup = g;
                self.state = State::Challenge;
                if g == DHGROUP_NULL {
                    return Step::Continue;
                }
                let mailbox = self.mailbox.clone();
                Step::Offload(Box::new(move || {
                    let r = DhKey::generate(g).map(DhOutput::Key);
                    *mailbox.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
                }))
            }
            HostMsg::Reply {
                t_id,
                hl,
                host_challenge,
                response: r1,
                dh_value,
            } => {
                if self.state != State::Reply {
                    return self.fail(FAILURE_INCORRECT_PROTOCOL_MESSAGE, "Reply out of order");
                }
                if t_id != self.t_id || usize::from(hl) != hash_len(self.hash_id) {
                    return self.fail(
                        FAILURE_INCORRECT_PAYLOAD,
                        "Reply does not match the transaction",
                    );
                }
                let reply = PendingReply {
                    response: r1.to_vec(),
                    host_challenge: host_challenge.map(|(s2, c2)| (s2, c2.to_vec())),
                };
                let Some(dh) = self.dh.take() else {
                    if !dh_value.is_empty() {
                        return self
                            .fail(FAILURE_INCORRECT_PAYLOAD, "DH value with the null group");
                    }
                    return match self.verify(peer, &reply, None) {
                        Ok(()) => Step::Continue,
                        Err((reason, why)) => self.fail(reason, why),
                    };
                };
                if dh_value.len() != dhgroup_len(self.dhgroup) {
                    return self.fail(FAILURE_INCORRECT_PAYLOAD, "DH value of the wrong size");
                }
                self.reply = Some(reply);
                self.state = State::Verify;
                let mailbox = self.mailbox.clone();
                let peer_value = dh_value.to_vec();
                Step::Offload(Box::new(move || {
                    let r = dh.shared_secret(&peer_value).map(DhOutput::Secret);
                    *mailbox.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
                }))
            }
            HostMsg::Success2 { t_id } => {
                if self.state != State::Success2 {
                    return self.fail(FAILURE_INCORRECT_PROTOCOL_MESSAGE, "Success2 out of order");
                }
                if t_id != self.t_id {
                    return self.fail(
                        FAILURE_INCORRECT_PAYLOAD,
                        "Success2 does not match the transaction",
                    );
                }
                self.state = State::Done;
                Step::Authenticated
            }
            HostMsg::Failure2 { .. } => {
                self.state = State::Failed;
                self.failure = "host refused the controller's response (controller key mismatch)";
                Step::Failed(self.failure)
            }
        }
    }

    fn take_mailbox(&mut self) -> Option<Result<DhOutput, AuthError>> {
        self.mailbox
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// Check the host's response (and compute ours when asked) with the
    /// shared secret, if any. Cheap: HMACs only.
    fn verify(
        &mut self,
        peer: &Peer<'_>,
        reply: &PendingReply,
        shared: Option<&[u8]>,
    ) -> Result<(), (u8, &'static str)> {
        let Some(keys) = &peer.keys else {
            return Err((FAILURE_FAILED, "no DH-HMAC-CHAP key for this host"));
        };
        let key = keys.key.transform(peer.hostnqn);
        let input = ResponseInput {
            hash_id: self.hash_id,
            transformed_key: &key,
            challenge: &self.challenge,
            seqnum: self.seqnum,
            t_id: self.t_id,
            sc_c: 0,
            hostnqn: peer.hostnqn,
            subnqn: peer.subnqn,
            shared_secret: shared,
        };
        let ok = response(Side::Host, &input).is_ok_and(|want| ct_eq(&want, &reply.response));
        if !ok {
            return Err((FAILURE_FAILED, "wrong response (host key mismatch)"));
        }
        if let Some((s2, c2)) = &reply.host_challenge {
            let Some(ck) = &keys.ctrlr_key else {
                return Err((
                    FAILURE_FAILED,
                    "host asks the controller to authenticate but it has no controller key",
                ));
            };
            let ckey = ck.transform(peer.subnqn);
            let input = ResponseInput {
                transformed_key: &ckey,
                challenge: c2,
                seqnum: *s2,
                ..input
            };
            match response(Side::Controller, &input) {
                Ok(r2) => self.ctrl_response = Some(r2),
                Err(_) => return Err((FAILURE_FAILED, "controller response")),
            }
        }
        self.state = State::Success1;
        Ok(())
    }

    /// An Authentication Receive: the message is appended to `out`.
    pub fn recv(&mut self, peer: &Peer<'_>, out: &mut Vec<u8>) -> Step {
        if self.state == State::Verify {
            let reply = self.reply.take();
            let shared = match self.take_mailbox() {
                Some(Ok(DhOutput::Secret(k))) => k,
                Some(Ok(DhOutput::Key(_))) | None => {
                    return self.recv_failure(
                        out,
                        FAILURE_INCORRECT_PROTOCOL_MESSAGE,
                        "Authentication Receive before the Reply completed",
                    )
                }
                Some(Err(_)) => return self.recv_failure(out, FAILURE_FAILED, "invalid DH value"),
            };
            let Some(reply) = reply else {
                return self.recv_failure(out, FAILURE_FAILED, "lost reply");
            };
            if let Err((reason, why)) = self.verify(peer, &reply, Some(&shared)) {
                return self.recv_failure(out, reason, why);
            }
        }
        match self.state {
            State::Challenge => {
                let hl = hash_len(self.hash_id);
                self.challenge = vec![0; hl];
                let mut s = [0u8; 4];
                if !random_bytes(&mut self.challenge) || !random_bytes(&mut s) {
                    return self.recv_failure(out, FAILURE_FAILED, "no randomness");
                }
                self.seqnum = u32::from_le_bytes(s).max(1);
                if self.dhgroup != DHGROUP_NULL {
                    match self.take_mailbox() {
                        Some(Ok(DhOutput::Key(k))) => self.dh = Some(k),
                        None => {
                            return self.recv_failure(
                                out,
                                FAILURE_INCORRECT_PROTOCOL_MESSAGE,
                                "Authentication Receive before the Negotiate completed",
                            )
                        }
                        _ => return self.recv_failure(out, FAILURE_FAILED, "DH key generation"),
                    }
                }
                let dhv = self.dh.as_ref().map_or(&[][..], |k| k.public());
                w::encode_challenge(
                    out,
                    self.t_id,
                    self.hash_id,
                    self.dhgroup,
                    self.seqnum,
                    &self.challenge,
                    dhv,
                );
                self.state = State::Reply;
                Step::Continue
            }
            State::Success1 => {
                let hl = hash_len(self.hash_id) as u8;
                let r2 = self.ctrl_response.take();
                w::encode_success1(out, self.t_id, hl, r2.as_deref());
                if r2.is_some() {
                    self.state = State::Success2;
                    Step::Continue
                } else {
                    self.state = State::Done;
                    Step::Authenticated
                }
            }
            State::Failure1(reason) => {
                let why = self.failure;
                self.recv_failure(out, reason, why)
            }
            _ => self.recv_failure(
                out,
                FAILURE_INCORRECT_PROTOCOL_MESSAGE,
                "Authentication Receive out of order",
            ),
        }
    }

    fn recv_failure(&mut self, out: &mut Vec<u8>, reason: u8, why: &'static str) -> Step {
        w::encode_failure1(out, self.t_id, reason);
        self.state = State::Failed;
        self.failure = why;
        Step::Failed(why)
    }
}
