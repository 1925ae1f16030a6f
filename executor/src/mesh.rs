//! Point-to-point transport of the CPU backend: one TCP connection between every
//! pair of ranks, a reader thread per connection, and tagged frames.
//!
//! Frames are `[tag: u64 LE][len: u64 LE][payload]`. A receive names the sender and
//! the tag; frames that arrive early wait in an inbox. Any rank's death is seen by
//! every other rank at once: its connections close without the `BYE` frame a rank
//! sends when it finishes cleanly, and every blocked receive fails with a message
//! naming it. A rank that fails on its own sends `ABORT` with its message first.
//! Every receive is bounded by the mesh timeout; nothing waits forever.
//!
//! Each connection starts with the job-secret handshake of [`crate::auth`], bound to
//! the accepting rank; a frame longer than the plan can need (the caller's
//! `max_frame`) fails the mesh from its header, before anything is allocated.

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::auth::{accept_handshake, accept_until, connect_handshake, Accepted, JobKey, Refusal};
pub use crate::error::MeshError;

const TAG_ABORT: u64 = u64::MAX;
const TAG_BYE: u64 = u64::MAX - 1;

#[derive(Default)]
struct Inbox {
    frames: HashMap<(u64, u64), VecDeque<Vec<u8>>>,
    failure: Option<MeshError>,
    /// Peers that said BYE.
    finished: Vec<bool>,
}

type Shared = Arc<(Mutex<Inbox>, Condvar)>;

/// See [`Mesh::watch`].
#[derive(Clone)]
pub struct MeshWatch(Shared);

impl MeshWatch {
    /// Why the mesh failed, once it has.
    pub fn failure(&self) -> Option<MeshError> {
        lock(&self.0).failure.clone()
    }
}

pub struct Mesh {
    rank: u64,
    world: u64,
    writers: Vec<Option<Mutex<TcpStream>>>,
    shared: Shared,
    timeout: Duration,
    readers: Vec<JoinHandle<()>>,
}

fn lock(shared: &Shared) -> std::sync::MutexGuard<'_, Inbox> {
    shared.0.lock().unwrap_or_else(|p| p.into_inner())
}

fn fail(shared: &Shared, msg: MeshError) {
    let mut inbox = lock(shared);
    if inbox.failure.is_none() {
        inbox.failure = Some(msg);
    }
    shared.1.notify_all();
}

fn read_u64(s: &mut TcpStream) -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    s.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

fn reader_loop(mut stream: TcpStream, peer: u64, shared: Shared, max_frame: u64) {
    loop {
        let header = read_u64(&mut stream).and_then(|tag| Ok((tag, read_u64(&mut stream)?)));
        let (tag, len) = match header {
            Ok(h) => h,
            Err(_) => {
                if !lock(&shared).finished[peer as usize] {
                    fail(&shared, MeshError::PeerClosed(peer));
                }
                return;
            }
        };
        if len > max_frame {
            fail(
                &shared,
                MeshError::PeerOversized {
                    peer,
                    len,
                    max_frame,
                },
            );
            return;
        }
        let mut payload = vec![0u8; len as usize];
        if stream.read_exact(&mut payload).is_err() {
            fail(&shared, MeshError::PeerCut(peer));
            return;
        }
        let mut inbox = lock(&shared);
        match tag {
            TAG_ABORT => {
                let message = String::from_utf8_lossy(&payload).into_owned();
                if inbox.failure.is_none() {
                    inbox.failure = Some(MeshError::PeerFailed { peer, message });
                }
            }
            TAG_BYE => inbox.finished[peer as usize] = true,
            _ => inbox
                .frames
                .entry((peer, tag))
                .or_default()
                .push_back(payload),
        }
        shared.1.notify_all();
    }
}

fn io_deadline(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
}

impl Mesh {
    /// Connects to every other rank: to each lower rank at its address, and accepts
    /// from each higher one on `listener`. `addrs[q]` is rank q's listening address.
    /// Every connection proves it holds `key`; frames longer than `max_frame` bytes
    /// fail the mesh.
    pub fn connect(
        rank: u64,
        world: u64,
        listener: TcpListener,
        addrs: &[SocketAddr],
        timeout: Duration,
        key: &JobKey,
        max_frame: u64,
    ) -> Result<Mesh, MeshError> {
        if rank >= world || addrs.len() as u64 != world {
            return Err(MeshError::BadWorld {
                rank,
                world,
                addrs: addrs.len(),
            });
        }
        let deadline = Instant::now() + timeout;
        let mut streams: Vec<Option<TcpStream>> = (0..world).map(|_| None).collect();
        for q in 0..rank {
            let addr = addrs[q as usize];
            let ctx = format!("mesh {q}").into_bytes();
            let stream = loop {
                let attempt = TcpStream::connect_timeout(&addr, io_deadline(deadline))
                    .map_err(|e| e.to_string())
                    .and_then(
                        |mut s| match connect_handshake(&mut s, key, &ctx, rank, deadline) {
                            Ok(_) => Ok(s),
                            Err(Refusal::BadSecret) => Err(String::new()),
                            Err(Refusal::Io(e)) => Err(e),
                        },
                    );
                match attempt {
                    Ok(s) => break s,
                    Err(e) if e.is_empty() => return Err(MeshError::Credentials { peer: q, addr }),
                    Err(e) if Instant::now() >= deadline => {
                        return Err(MeshError::Unreachable {
                            peer: q,
                            addr,
                            secs: timeout.as_secs(),
                            detail: e,
                        })
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            };
            streams[q as usize] = Some(stream);
        }
        if rank + 1 < world {
            let ctx = format!("mesh {rank}").into_bytes();
            let k = key.clone();
            let handshake = move |mut s: TcpStream, _from: SocketAddr, d: Instant| {
                let (q, _) = accept_handshake(&mut s, &k, &ctx, d)?;
                Ok((s, q))
            };
            let mut missing = world - rank - 1;
            let ended = accept_until::<_, MeshError, _, _>(
                &listener,
                deadline,
                handshake,
                |(s, q): (TcpStream, u64)| {
                    if q <= rank || q >= world || streams[q as usize].is_some() {
                        return Err(MeshError::BadClaim { claim: q, world });
                    }
                    streams[q as usize] = Some(s);
                    missing -= 1;
                    Ok(missing == 0)
                },
            )?;
            if let Accepted::TimedOut { refused } = ended {
                let absent: Vec<u64> = ((rank + 1)..world)
                    .filter(|q| streams[*q as usize].is_none())
                    .collect();
                return Err(MeshError::NeverConnected {
                    absent,
                    secs: timeout.as_secs(),
                    refused,
                });
            }
        }
        let shared: Shared = Arc::new((
            Mutex::new(Inbox {
                finished: vec![false; world as usize],
                ..Inbox::default()
            }),
            Condvar::new(),
        ));
        let mut writers = Vec::with_capacity(world as usize);
        let mut readers = Vec::new();
        for (q, s) in streams.into_iter().enumerate() {
            match s {
                Some(s) => {
                    s.set_nodelay(true).ok();
                    s.set_read_timeout(None)?;
                    s.set_write_timeout(None)?;
                    let r = s.try_clone()?;
                    let sh = shared.clone();
                    let reader = std::thread::Builder::new()
                        .name(format!("sextant-from-{q}"))
                        .spawn(move || reader_loop(r, q as u64, sh, max_frame))
                        .map_err(|e| MeshError::ReaderThread {
                            peer: q as u64,
                            detail: e.to_string(),
                            threads: world - 1,
                        })?;
                    readers.push(reader);
                    writers.push(Some(Mutex::new(s)));
                }
                None => writers.push(None),
            }
        }
        Ok(Mesh {
            rank,
            world,
            writers,
            shared,
            timeout,
            readers,
        })
    }

    pub fn rank(&self) -> u64 {
        self.rank
    }
    pub fn world(&self) -> u64 {
        self.world
    }
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    fn write_frame(&self, to: u64, tag: u64, payload: &[u8]) -> Result<(), MeshError> {
        let w = self
            .writers
            .get(to as usize)
            .and_then(|w| w.as_ref())
            .ok_or(MeshError::NoConnection(to))?;
        let mut frame = Vec::with_capacity(16 + payload.len());
        frame.extend_from_slice(&tag.to_le_bytes());
        frame.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        frame.extend_from_slice(payload);
        let mut s = w.lock().unwrap_or_else(|p| p.into_inner());
        s.write_all(&frame).map_err(|e| MeshError::Send {
            to,
            detail: e.to_string(),
        })
    }

    /// Sends `payload` to rank `to` under `tag` (to itself too).
    pub fn send(&self, to: u64, tag: u64, payload: &[u8]) -> Result<(), MeshError> {
        if let Some(f) = lock(&self.shared).failure.clone() {
            return Err(f);
        }
        if to == self.rank {
            let mut inbox = lock(&self.shared);
            inbox
                .frames
                .entry((to, tag))
                .or_default()
                .push_back(payload.to_vec());
            self.shared.1.notify_all();
            return Ok(());
        }
        self.write_frame(to, tag, payload)
    }

    /// Waits for the frame `tag` from rank `from`, at most the mesh timeout.
    pub fn recv(&self, from: u64, tag: u64) -> Result<Vec<u8>, MeshError> {
        let deadline = Instant::now() + self.timeout;
        let mut inbox = lock(&self.shared);
        loop {
            if let Some(q) = inbox.frames.get_mut(&(from, tag)) {
                if let Some(p) = q.pop_front() {
                    if q.is_empty() {
                        inbox.frames.remove(&(from, tag));
                    }
                    return Ok(p);
                }
            }
            if let Some(f) = &inbox.failure {
                return Err(f.clone());
            }
            if inbox.finished[from as usize] {
                return Err(MeshError::Unsent { from, tag });
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(MeshError::Waited {
                    secs: self.timeout.as_secs(),
                    from,
                    tag,
                });
            }
            inbox = self
                .shared
                .1
                .wait_timeout(inbox, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Tells every peer this rank failed (best effort), so that they stop at once.
    pub fn abort(&self, message: &str) {
        fail(&self.shared, MeshError::ThisRankFailed(message.to_string()));
        for q in 0..self.world {
            if q != self.rank {
                let _ = self.write_frame(q, TAG_ABORT, message.as_bytes());
            }
        }
    }

    /// A handle another thread can poll for this mesh's failure (a peer that died
    /// or aborted), for a watchdog while this thread waits on something else.
    pub fn watch(&self) -> MeshWatch {
        MeshWatch(self.shared.clone())
    }

    /// Frames that arrived and were never received: sends no receive matched.
    pub fn unmatched(&self) -> Vec<(u64, u64, usize)> {
        let inbox = lock(&self.shared);
        let mut v: Vec<(u64, u64, usize)> = inbox
            .frames
            .iter()
            .map(|(&(from, tag), q)| (from, tag, q.len()))
            .collect();
        v.sort_unstable();
        v
    }

    /// Ends cleanly: says BYE to every peer and closes the connections.
    pub fn finish(mut self) {
        for q in 0..self.world {
            if q != self.rank {
                let _ = self.write_frame(q, TAG_BYE, &[]);
            }
        }
        for w in self.writers.iter().flatten() {
            let s = w.lock().unwrap_or_else(|p| p.into_inner());
            let _ = s.shutdown(std::net::Shutdown::Write);
        }
        // Reader threads end when each peer closes its side.
        let deadline = Instant::now() + self.timeout;
        for h in self.readers.drain(..) {
            while !h.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::connect_handshake;

    fn key(s: &str) -> JobKey {
        JobKey::new(s).unwrap()
    }

    /// Rank 0 of a 2-rank mesh on a thread; the test plays rank 1 by hand.
    fn rank0(max_frame: u64) -> (SocketAddr, std::thread::JoinHandle<Result<Mesh, MeshError>>) {
        let l = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let addr = l.local_addr().unwrap();
        let k = key("the-right-secret-0123");
        let t = std::thread::spawn(move || {
            Mesh::connect(
                0,
                2,
                l,
                &[addr, addr],
                Duration::from_secs(10),
                &k,
                max_frame,
            )
        });
        (addr, t)
    }

    #[test]
    fn a_stranger_is_refused_and_the_rank_still_joins() {
        let (addr, t) = rank0(1 << 20);
        let d = Instant::now() + Duration::from_secs(5);
        let mut stranger = TcpStream::connect(addr).unwrap();
        let r = connect_handshake(
            &mut stranger,
            &key("a-wrong-secret-012345"),
            b"mesh 0",
            1,
            d,
        );
        assert!(matches!(r, Err(Refusal::BadSecret)));
        let mut me = TcpStream::connect(addr).unwrap();
        connect_handshake(&mut me, &key("the-right-secret-0123"), b"mesh 0", 1, d)
            .expect("the real rank joins");
        let mesh = t.join().unwrap().expect("mesh connects");
        assert!(mesh.watch().failure().is_none());
    }

    #[test]
    fn a_frame_longer_than_the_plan_can_need_is_refused_from_its_header() {
        let (addr, t) = rank0(1 << 20);
        let d = Instant::now() + Duration::from_secs(5);
        let mut me = TcpStream::connect(addr).unwrap();
        connect_handshake(&mut me, &key("the-right-secret-0123"), b"mesh 0", 1, d).unwrap();
        let mesh = t.join().unwrap().unwrap();
        // 1 GiB announced (under the old fixed 16 GiB cap), nothing sent after it.
        let mut header = 5u64.to_le_bytes().to_vec();
        header.extend_from_slice(&(1u64 << 30).to_le_bytes());
        me.write_all(&header).unwrap();
        let t0 = Instant::now();
        let e = mesh.recv(1, 5).unwrap_err();
        assert!(
            e.to_string().contains(
                "announced a message of 1073741824 bytes, more than this plan can need (1048576)"
            ),
            "{e}"
        );
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    }
}
