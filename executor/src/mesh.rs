//! Point-to-point transport of the CPU backend: one TCP connection between every
//! pair of ranks, a reader thread per connection, and tagged frames.
//!
//! Frames are `[tag: u64 LE][len: u64 LE][payload]`. A receive names the sender and
//! the tag; frames that arrive early wait in an inbox. Any rank's death is seen by
//! every other rank at once: its connections close without the `BYE` frame a rank
//! sends when it finishes cleanly, and every blocked receive fails with a message
//! naming it. A rank that fails on its own sends `ABORT` with its message first.
//! Every receive is bounded by the mesh timeout; nothing waits forever.

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const TAG_ABORT: u64 = u64::MAX;
const TAG_BYE: u64 = u64::MAX - 1;
/// Larger frames are treated as a corrupt stream.
const MAX_FRAME: u64 = 1 << 34;
/// Sent by a connecting rank before its rank number.
const MAGIC: u64 = 0x5345_5854_414e_5431; // "SEXTANT1"

#[derive(Default)]
struct Inbox {
    frames: HashMap<(u64, u64), VecDeque<Vec<u8>>>,
    failure: Option<String>,
    /// Peers that said BYE.
    finished: Vec<bool>,
}

type Shared = Arc<(Mutex<Inbox>, Condvar)>;

/// See [`Mesh::watch`].
#[derive(Clone)]
pub struct MeshWatch(Shared);

impl MeshWatch {
    /// Why the mesh failed, once it has.
    pub fn failure(&self) -> Option<String> {
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

fn fail(shared: &Shared, msg: String) {
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

fn reader_loop(mut stream: TcpStream, peer: u64, shared: Shared) {
    loop {
        let header = read_u64(&mut stream).and_then(|tag| Ok((tag, read_u64(&mut stream)?)));
        let (tag, len) = match header {
            Ok(h) => h,
            Err(_) => {
                if !lock(&shared).finished[peer as usize] {
                    fail(&shared, format!("rank {peer} closed its connection before finishing (it exited, crashed or was killed)"));
                }
                return;
            }
        };
        if len > MAX_FRAME {
            fail(
                &shared,
                format!("corrupt frame from rank {peer} ({len} bytes announced)"),
            );
            return;
        }
        let mut payload = vec![0u8; len as usize];
        if stream.read_exact(&mut payload).is_err() {
            fail(
                &shared,
                format!("rank {peer} closed its connection in the middle of a message"),
            );
            return;
        }
        let mut inbox = lock(&shared);
        match tag {
            TAG_ABORT => {
                let msg = String::from_utf8_lossy(&payload).into_owned();
                if inbox.failure.is_none() {
                    inbox.failure = Some(format!("rank {peer} failed: {msg}"));
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
    pub fn connect(
        rank: u64,
        world: u64,
        listener: TcpListener,
        addrs: &[SocketAddr],
        timeout: Duration,
    ) -> Result<Mesh, String> {
        let deadline = Instant::now() + timeout;
        let mut streams: Vec<Option<TcpStream>> = (0..world).map(|_| None).collect();
        for q in 0..rank {
            let addr = addrs[q as usize];
            let mut stream = loop {
                match TcpStream::connect_timeout(&addr, io_deadline(deadline)) {
                    Ok(s) => break s,
                    Err(e) if Instant::now() >= deadline => {
                        return Err(format!(
                            "could not connect to rank {q} at {addr} within {} s: {e}",
                            timeout.as_secs()
                        ))
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            };
            let mut hello = MAGIC.to_le_bytes().to_vec();
            hello.extend_from_slice(&rank.to_le_bytes());
            stream
                .write_all(&hello)
                .map_err(|e| format!("handshake with rank {q} failed: {e}"))?;
            streams[q as usize] = Some(stream);
        }
        listener.set_nonblocking(true).map_err(|e| e.to_string())?;
        let mut missing = world - rank - 1;
        while missing > 0 {
            match listener.accept() {
                Ok((mut s, from)) => {
                    s.set_nonblocking(false).map_err(|e| e.to_string())?;
                    s.set_read_timeout(Some(io_deadline(deadline)))
                        .map_err(|e| e.to_string())?;
                    let (magic, q) = match (read_u64(&mut s), read_u64(&mut s)) {
                        (Ok(m), Ok(q)) => (m, q),
                        _ => continue,
                    };
                    if magic != MAGIC || q <= rank || q >= world || streams[q as usize].is_some() {
                        return Err(format!("unexpected connection from {from} claiming rank {q}: is another job using this port?"));
                    }
                    s.set_read_timeout(None).map_err(|e| e.to_string())?;
                    streams[q as usize] = Some(s);
                    missing -= 1;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        let absent: Vec<String> = ((rank + 1)..world)
                            .filter(|q| streams[*q as usize].is_none())
                            .map(|q| q.to_string())
                            .collect();
                        return Err(format!(
                            "ranks {} never connected within {} s",
                            absent.join(", "),
                            timeout.as_secs()
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(format!("accepting peer connections failed: {e}")),
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
                    let r = s.try_clone().map_err(|e| e.to_string())?;
                    let sh = shared.clone();
                    readers.push(std::thread::spawn(move || reader_loop(r, q as u64, sh)));
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

    fn write_frame(&self, to: u64, tag: u64, payload: &[u8]) -> Result<(), String> {
        let w = self
            .writers
            .get(to as usize)
            .and_then(|w| w.as_ref())
            .ok_or_else(|| format!("no connection to rank {to}"))?;
        let mut frame = Vec::with_capacity(16 + payload.len());
        frame.extend_from_slice(&tag.to_le_bytes());
        frame.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        frame.extend_from_slice(payload);
        let mut s = w.lock().unwrap_or_else(|p| p.into_inner());
        s.write_all(&frame)
            .map_err(|e| format!("sending to rank {to} failed: {e}"))
    }

    /// Sends `payload` to rank `to` under `tag` (to itself too).
    pub fn send(&self, to: u64, tag: u64, payload: &[u8]) -> Result<(), String> {
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
    pub fn recv(&self, from: u64, tag: u64) -> Result<Vec<u8>, String> {
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
                return Err(format!("rank {from} finished without sending the message this rank waits for (tag {tag:#x}): the ranks disagree on the schedule"));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(format!(
                    "waited {} s for rank {from} (tag {tag:#x}): it is stuck, or the ranks disagree on the plan's schedule",
                    self.timeout.as_secs()
                ));
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
        fail(&self.shared, format!("this rank failed: {message}"));
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
