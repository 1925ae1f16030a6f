//! Who may join a job. Every TCP connection of a job (rendezvous and mesh) starts
//! with a handshake in which both ends prove they hold the job's secret: each sends
//! a fresh random nonce, the connecting side answers with HMAC-SHA256 over both
//! nonces and its claimed rank, and the accepting side answers with its own HMAC.
//! Nothing about the job is sent before that. A plan hash, a job id or a port is
//! not a secret (anyone who can read the plan or list processes knows them); the
//! secret comes from the launcher (`SEXTANT_JOB_SECRET`, read by the CLI).
//!
//! Accepting is done off the listening thread, one short-lived thread per pending
//! connection with its own deadline, so idle or slow connections neither stretch
//! the caller's deadline nor hold up the ranks behind them.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use sha2::Sha256;

pub use crate::error::AuthError;

/// The environment variable that carries the job secret to every rank.
pub const SECRET_VAR: &str = "SEXTANT_JOB_SECRET";
/// Shortest secret accepted, in bytes.
pub const MIN_SECRET_LEN: usize = 16;
const MAGIC: [u8; 8] = *b"SXTAUTH1";
const NONCE: usize = 32;
const TAG: usize = 32;
/// Longest a single handshake may take, whatever the caller's deadline.
const HANDSHAKE_SECS: u64 = 5;
/// Handshakes in progress at once; further connections are closed at once.
const MAX_PENDING: usize = 128;

/// The job secret, as an HMAC key. Its `Debug` output does not show it.
#[derive(Clone)]
pub struct JobKey(Arc<[u8]>);

impl std::fmt::Debug for JobKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JobKey(..)")
    }
}

impl JobKey {
    /// A key from the secret's text, refused when shorter than [`MIN_SECRET_LEN`].
    pub fn new(secret: &str) -> Result<JobKey, AuthError> {
        let s = secret.trim();
        if s.len() < MIN_SECRET_LEN {
            return Err(AuthError::ShortSecret { len: s.len() });
        }
        Ok(JobKey(Arc::from(s.as_bytes())))
    }

    /// A fresh random secret (64 hex digits) for a launcher to hand to its ranks.
    pub fn generate() -> Result<String, AuthError> {
        let mut b = [0u8; 32];
        getrandom::fill(&mut b).map_err(|e| AuthError::NoRandom {
            what: "the job secret",
            detail: e.to_string(),
        })?;
        Ok(b.iter().map(|x| format!("{x:02x}")).collect())
    }

    fn mac(&self, parts: &[&[u8]]) -> Hmac<Sha256> {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes any key");
        for p in parts {
            m.update(&(p.len() as u64).to_le_bytes());
            m.update(p);
        }
        m
    }

    fn tag(&self, parts: &[&[u8]]) -> [u8; TAG] {
        self.mac(parts).finalize().into_bytes().into()
    }

    /// Constant-time comparison of `tag` with the HMAC of `parts`.
    fn verify(&self, parts: &[&[u8]], tag: &[u8]) -> bool {
        self.mac(parts).verify_slice(tag).is_ok()
    }
}

fn nonce() -> Result<[u8; NONCE], AuthError> {
    let mut n = [0u8; NONCE];
    getrandom::fill(&mut n).map_err(|e| AuthError::NoRandom {
        what: "a nonce",
        detail: e.to_string(),
    })?;
    Ok(n)
}

/// Why a handshake did not complete.
#[derive(Debug)]
pub enum Refusal {
    /// The other side does not hold the secret (or is not a Sextant rank).
    BadSecret,
    /// The connection closed, stalled past its deadline or broke.
    Io(String),
}

fn io(e: std::io::Error) -> Refusal {
    Refusal::Io(e.to_string())
}

/// Reads exactly `buf.len()` bytes, giving up at `deadline` however slowly they trickle.
pub fn read_exact_by(s: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> std::io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "deadline passed",
            ));
        }
        s.set_read_timeout(Some(left))?;
        match s.read(&mut buf[got..]) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn write_by(s: &mut TcpStream, bytes: &[u8], deadline: Instant) -> std::io::Result<()> {
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    s.set_write_timeout(Some(left))?;
    s.write_all(bytes)
}

/// An authenticated connection's nonces: later messages on it are tagged with them.
#[derive(Clone)]
pub struct Session {
    key: JobKey,
    ctx: Vec<u8>,
    accept_nonce: [u8; NONCE],
    connect_nonce: [u8; NONCE],
}

/// The accepting side: sends a nonce, checks the connecting side's proof for
/// `ctx` (what the connection is for, e.g. the acceptor's rank), answers with its
/// own. Returns the claimed rank. A bad proof gets one refusal byte.
pub fn accept_handshake(
    s: &mut TcpStream,
    key: &JobKey,
    ctx: &[u8],
    deadline: Instant,
) -> Result<(u64, Session), Refusal> {
    let na = nonce().map_err(|e| Refusal::Io(e.to_string()))?;
    let mut hello = MAGIC.to_vec();
    hello.extend_from_slice(&na);
    write_by(s, &hello, deadline).map_err(io)?;
    let mut m = [0u8; 8 + NONCE + 8 + TAG];
    read_exact_by(s, &mut m, deadline).map_err(io)?;
    let (magic, rest) = m.split_at(8);
    let (nc, rest) = rest.split_at(NONCE);
    let (claim, tag) = rest.split_at(8);
    if magic != MAGIC || !key.verify(&[b"connect", ctx, &na, nc, claim], tag) {
        let _ = write_by(s, &[1], deadline);
        return Err(Refusal::BadSecret);
    }
    let mut reply = vec![0u8];
    reply.extend_from_slice(&key.tag(&[b"accept", ctx, &na, nc, claim]));
    write_by(s, &reply, deadline).map_err(io)?;
    let connect_nonce: [u8; NONCE] = nc.try_into().expect("32 bytes");
    Ok((
        u64::from_le_bytes(claim.try_into().expect("8 bytes")),
        Session {
            key: key.clone(),
            ctx: ctx.to_vec(),
            accept_nonce: na,
            connect_nonce,
        },
    ))
}

/// The connecting side of [`accept_handshake`], claiming rank `claim`.
pub fn connect_handshake(
    s: &mut TcpStream,
    key: &JobKey,
    ctx: &[u8],
    claim: u64,
    deadline: Instant,
) -> Result<Session, Refusal> {
    let mut h = [0u8; 8 + NONCE];
    read_exact_by(s, &mut h, deadline).map_err(io)?;
    if h[..8] != MAGIC {
        return Err(Refusal::BadSecret);
    }
    let na: [u8; NONCE] = h[8..].try_into().expect("32 bytes");
    let nc = nonce().map_err(|e| Refusal::Io(e.to_string()))?;
    let claim = claim.to_le_bytes();
    let mut m = MAGIC.to_vec();
    m.extend_from_slice(&nc);
    m.extend_from_slice(&claim);
    m.extend_from_slice(&key.tag(&[b"connect", ctx, &na, &nc, &claim]));
    write_by(s, &m, deadline).map_err(io)?;
    let mut status = [0u8; 1];
    read_exact_by(s, &mut status, deadline).map_err(io)?;
    if status[0] != 0 {
        return Err(Refusal::BadSecret);
    }
    let mut tag = [0u8; TAG];
    read_exact_by(s, &mut tag, deadline).map_err(io)?;
    if !key.verify(&[b"accept", ctx, &na, &nc, &claim], &tag) {
        return Err(Refusal::BadSecret);
    }
    Ok(Session {
        key: key.clone(),
        ctx: ctx.to_vec(),
        accept_nonce: na,
        connect_nonce: nc,
    })
}

impl Session {
    /// Sends one tagged message: `[len: u32 LE][payload][HMAC]`.
    pub fn send(
        &self,
        s: &mut TcpStream,
        dir: &[u8],
        payload: &[u8],
        deadline: Instant,
    ) -> Result<(), AuthError> {
        let len = u32::try_from(payload.len()).map_err(|_| AuthError::MessageTooLong)?;
        let mut m = len.to_le_bytes().to_vec();
        m.extend_from_slice(payload);
        m.extend_from_slice(&self.tag_of(dir, payload));
        Ok(write_by(s, &m, deadline)?)
    }

    /// Receives one tagged message of at most `max_len` bytes: a longer one is
    /// refused from its length alone, before anything is allocated for it.
    pub fn recv(
        &self,
        s: &mut TcpStream,
        dir: &[u8],
        max_len: usize,
        deadline: Instant,
    ) -> Result<Vec<u8>, AuthError> {
        let mut l = [0u8; 4];
        read_exact_by(s, &mut l, deadline)?;
        let len = u32::from_le_bytes(l) as usize;
        if len > max_len {
            return Err(AuthError::Oversized { len, max_len });
        }
        let mut payload = vec![0u8; len];
        read_exact_by(s, &mut payload, deadline)?;
        let mut tag = [0u8; TAG];
        read_exact_by(s, &mut tag, deadline)?;
        let parts: [&[u8]; 5] = [
            dir,
            &self.ctx,
            &self.accept_nonce,
            &self.connect_nonce,
            &payload,
        ];
        if !self.key.verify(&parts, &tag) {
            return Err(AuthError::BadTag);
        }
        Ok(payload)
    }

    fn tag_of(&self, dir: &[u8], payload: &[u8]) -> [u8; TAG] {
        self.key.tag(&[
            dir,
            &self.ctx,
            &self.accept_nonce,
            &self.connect_nonce,
            payload,
        ])
    }
}

/// How an accept loop ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Accepted {
    /// `on_ok` said it had everything.
    Done,
    /// The deadline passed first; `refused` connections failed the secret check.
    TimedOut { refused: u64 },
}

/// Accepts connections on `listener` until `on_ok` returns `Ok(true)` or `deadline`
/// passes, whichever is first, whatever the traffic. Each connection is handed to
/// `handshake` on its own thread (bounded by the deadline and a few seconds);
/// connections it refuses are closed and counted, successes go to `on_ok` on this
/// thread. An error from `on_ok` ends the loop with it; the loop's own errors are
/// [`AuthError`]s converted into the caller's error type `E`.
pub fn accept_until<T, E, H, F>(
    listener: &TcpListener,
    deadline: Instant,
    handshake: H,
    mut on_ok: F,
) -> Result<Accepted, E>
where
    T: Send + 'static,
    E: From<AuthError>,
    H: Fn(TcpStream, SocketAddr, Instant) -> Result<T, Refusal> + Send + Sync + 'static,
    F: FnMut(T) -> Result<bool, E>,
{
    let handshake = Arc::new(handshake);
    let (tx, rx) = mpsc::channel::<Result<T, Refusal>>();
    listener.set_nonblocking(true).map_err(AuthError::from)?;
    let mut pending = 0usize;
    let mut refused = 0u64;
    loop {
        // Take every connection waiting, then wait briefly for handshakes to end.
        loop {
            match listener.accept() {
                Ok((s, from)) => {
                    if pending >= MAX_PENDING {
                        continue; // dropped: closed at once
                    }
                    if s.set_nonblocking(false).is_err() {
                        continue;
                    }
                    let (h, tx) = (handshake.clone(), tx.clone());
                    let own = deadline.min(Instant::now() + Duration::from_secs(HANDSHAKE_SECS));
                    std::thread::Builder::new()
                        .name("sextant-accept".into())
                        .spawn(move || {
                            let _ = tx.send(h(s, from, own));
                        })
                        .map_err(|e| AuthError::AcceptThread(e.to_string()))?;
                    pending += 1;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionAborted => {}
                Err(e) => return Err(AuthError::Accept(e.to_string()).into()),
            }
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(Accepted::TimedOut { refused });
        }
        match rx.recv_timeout((deadline - now).min(Duration::from_millis(5))) {
            Ok(r) => {
                pending -= 1;
                match r {
                    Ok(v) => {
                        if on_ok(v)? {
                            return Ok(Accepted::Done);
                        }
                    }
                    Err(Refusal::BadSecret) => refused += 1,
                    Err(Refusal::Io(_)) => {}
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => unreachable!("this loop holds a sender"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        (l.accept().unwrap().0, c)
    }

    #[test]
    fn both_sides_prove_the_secret() {
        let key = JobKey::new("0123456789abcdef-right").unwrap();
        let wrong = JobKey::new("0123456789abcdef-wrong").unwrap();
        for (server, client, ok) in [(&key, &key, true), (&key, &wrong, false)] {
            let (mut a, mut c) = pair();
            let d = Instant::now() + Duration::from_secs(5);
            let (sk, ck) = (server.clone(), client.clone());
            let t = std::thread::spawn(move || accept_handshake(&mut a, &sk, b"x", d).map(|r| r.0));
            let cr = connect_handshake(&mut c, &ck, b"x", 7, d);
            let ar = t.join().unwrap();
            assert_eq!(cr.is_ok(), ok);
            assert_eq!(ar.is_ok(), ok);
            if ok {
                assert_eq!(ar.unwrap(), 7);
            } else {
                assert!(matches!(ar, Err(Refusal::BadSecret)));
                assert!(matches!(cr, Err(Refusal::BadSecret)));
            }
        }
        // A different purpose (context) does not verify either.
        let (mut a, mut c) = pair();
        let d = Instant::now() + Duration::from_secs(5);
        let k2 = key.clone();
        let t = std::thread::spawn(move || accept_handshake(&mut a, &k2, b"mesh 0", d).is_ok());
        assert!(connect_handshake(&mut c, &key, b"mesh 1", 1, d).is_err());
        assert!(!t.join().unwrap());
    }

    #[test]
    fn short_secrets_are_refused_and_generated_ones_are_fresh() {
        assert!(JobKey::new("short")
            .unwrap_err()
            .to_string()
            .contains("at least 16"));
        let (a, b) = (JobKey::generate().unwrap(), JobKey::generate().unwrap());
        assert_ne!(a, b);
        assert_eq!(a.len(), 64);
        assert!(JobKey::new(&a).is_ok());
        assert_eq!(format!("{:?}", JobKey::new(&a).unwrap()), "JobKey(..)");
    }

    #[test]
    fn an_oversized_message_is_refused_from_its_length() {
        let key = JobKey::new("0123456789abcdef").unwrap();
        let (mut a, mut c) = pair();
        let d = Instant::now() + Duration::from_secs(5);
        let k2 = key.clone();
        let t = std::thread::spawn(move || {
            let (_, s) = accept_handshake(&mut a, &k2, b"x", d).unwrap();
            s.recv(&mut a, b"hello", 4096, d)
        });
        connect_handshake(&mut c, &key, b"x", 1, d).unwrap();
        // Announces 4 GiB - 1 and sends nothing more: refused at once, not awaited.
        c.write_all(&u32::MAX.to_le_bytes()).unwrap();
        let t0 = Instant::now();
        let e = t.join().unwrap().unwrap_err();
        assert_eq!(
            e,
            AuthError::Oversized {
                len: u32::MAX as usize,
                max_len: 4096
            }
        );
        assert!(e.to_string().contains("more than the 4096"), "{e}");
        assert!(t0.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn idle_connections_do_not_stretch_the_deadline() {
        let key = JobKey::new("0123456789abcdef").unwrap();
        let l = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let addr = l.local_addr().unwrap();
        let idle: Vec<TcpStream> = (0..10).map(|_| TcpStream::connect(addr).unwrap()).collect();
        let t0 = Instant::now();
        let r = accept_until(
            &l,
            t0 + Duration::from_millis(800),
            move |mut s, _, d| accept_handshake(&mut s, &key, b"x", d),
            |_| Ok::<_, AuthError>(true),
        )
        .unwrap();
        assert_eq!(r, Accepted::TimedOut { refused: 0 });
        assert!(
            t0.elapsed() < Duration::from_millis(1300),
            "{:?}",
            t0.elapsed()
        );
        drop(idle);
    }
}
