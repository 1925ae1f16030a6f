//! The TCP rendezvous at MASTER_ADDR:MASTER_PORT. Rank 0 listens; every other rank
//! connects (retrying until the timeout), says who it is, which plan it runs (a
//! hash of the plan file) and where it listens for peer connections. Rank 0 checks
//! that the world size and plan agree and that no rank is missing or doubled, then
//! answers everyone with the table of peer addresses and a blob of its own (the
//! CUDA backend puts NCCL unique ids there). Any disagreement ends every rank with
//! the reason; a rank that never arrives is named after the timeout.
//!
//! Every connection first proves it holds the job secret ([`crate::auth`]); one
//! that does not is closed and counted, learns nothing and cannot end the job.
//! Messages are capped at what the world size can need before they are read.

use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::auth::{
    accept_handshake, accept_until, connect_handshake, Accepted, AuthError, JobKey, Refusal,
    Session,
};
pub use crate::error::RendezvousError;

/// Why an authenticated rank's hello could not be read.
enum AuthOrJson {
    Auth(AuthError),
    Json(String),
}

impl std::fmt::Display for AuthOrJson {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AuthOrJson::Auth(e) => e.fmt(f),
            AuthOrJson::Json(e) => f.write_str(e),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchEnv {
    pub rank: u64,
    pub world: u64,
    pub local_rank: u64,
    pub master_addr: String,
    pub master_port: u16,
}

/// Reads the launcher's variables: torchrun (RANK, WORLD_SIZE, LOCAL_RANK), Slurm
/// (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID) or Open MPI (OMPI_COMM_WORLD_RANK,
/// _SIZE, _LOCAL_RANK), first found wins; MASTER_ADDR and MASTER_PORT (default
/// 29500, torchrun's) locate rank 0. `get` looks a variable up.
pub fn launch_env(get: impl Fn(&str) -> Option<String>) -> Result<LaunchEnv, RendezvousError> {
    let families = [
        ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"),
        ("Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
        (
            "Open MPI",
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_RANK",
        ),
    ];
    let num = |name: &str| -> Result<Option<u64>, RendezvousError> {
        match get(name) {
            None => Ok(None),
            Some(v) => v
                .trim()
                .parse::<u64>()
                .map(Some)
                .map_err(|_| RendezvousError::NotInteger {
                    name: name.to_string(),
                    value: v,
                }),
        }
    };
    for (who, r, w, l) in families {
        let (Some(rank), Some(world)) = (num(r)?, num(w)?) else {
            continue;
        };
        if world == 0 || rank >= world {
            return Err(RendezvousError::RankBeyondWorld {
                launcher: who,
                rank,
                world,
            });
        }
        let local_rank = num(l)?.unwrap_or(rank);
        let master_addr = get("MASTER_ADDR").ok_or(RendezvousError::NoMasterAddr {
            launcher: who,
            rank_var: r,
            world_var: w,
        })?;
        let master_port = match get("MASTER_PORT") {
            None => 29500,
            Some(p) => p
                .trim()
                .parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| RendezvousError::BadPort(p.clone()))?,
        };
        return Ok(LaunchEnv {
            rank,
            world,
            local_rank,
            master_addr,
            master_port,
        });
    }
    Err(RendezvousError::NoLauncher)
}

#[derive(Serialize, Deserialize)]
struct Hello {
    rank: u64,
    world: u64,
    plan_hash: String,
    data_port: u16,
}

#[derive(Serialize, Deserialize)]
struct Reply {
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    peers: Vec<SocketAddr>,
    #[serde(default)]
    blob: Vec<u8>,
}

/// Largest world the rendezvous serves (a full TCP mesh beyond this is not a plan
/// this executor can run).
pub const MAX_WORLD: u64 = 1 << 16;
/// Largest blob rank 0 hands out (the CUDA backend's NCCL id is 128 bytes).
pub const MAX_BLOB: usize = 4096;
/// A hello is a few numbers.
const MAX_HELLO: usize = 1024;
const HELLO: &[u8] = b"rendezvous hello";
const REPLY: &[u8] = b"rendezvous reply";

/// The longest reply a rank of a `world`-rank job can need: the peer table and the blob.
fn max_reply(world: u64) -> usize {
    // A socket address in JSON is at most 49 bytes ("[ipv6%scope]:port"), a blob
    // byte at most 4 ("255,").
    1024 + 64 * world as usize + 4 * MAX_BLOB
}

/// What every rank learns at the rendezvous.
#[derive(Debug, Clone)]
pub struct Rendezvous {
    /// Rank q's peer-connection address.
    pub peers: Vec<SocketAddr>,
    /// Rank 0's blob.
    pub blob: Vec<u8>,
}

fn resolve(env: &LaunchEnv) -> Result<SocketAddr, RendezvousError> {
    (env.master_addr.as_str(), env.master_port)
        .to_socket_addrs()
        .map_err(|e| RendezvousError::Resolve {
            addr: env.master_addr.clone(),
            detail: e.to_string(),
        })?
        .next()
        .ok_or_else(|| RendezvousError::NoAddress(env.master_addr.clone()))
}

/// Binds rank 0's rendezvous port. Separate so that "port in use" is its own error.
pub fn bind_root(env: &LaunchEnv) -> Result<TcpListener, RendezvousError> {
    let ip: IpAddr = if resolve(env)?.ip().is_loopback() {
        IpAddr::from([127, 0, 0, 1])
    } else {
        IpAddr::from([0, 0, 0, 0])
    };
    TcpListener::bind((ip, env.master_port)).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AddrInUse {
            RendezvousError::PortInUse(env.master_port)
        } else {
            RendezvousError::Listen {
                port: env.master_port,
                detail: e.to_string(),
            }
        }
    })
}

/// What a rendezvous connection is for: bound into its handshake.
fn context(env: &LaunchEnv) -> Vec<u8> {
    format!("rendezvous world {}", env.world).into_bytes()
}

/// Runs the rendezvous. Rank 0 passes its bound listener and `blob`; the others pass
/// `None`. Every connection proves it holds `key` before anything is exchanged.
pub fn rendezvous(
    env: &LaunchEnv,
    root: Option<TcpListener>,
    key: &JobKey,
    plan_hash: u64,
    data_port: u16,
    timeout: Duration,
    blob: Vec<u8>,
) -> Result<Rendezvous, RendezvousError> {
    if env.world > MAX_WORLD {
        return Err(RendezvousError::WorldTooLarge(env.world));
    }
    if blob.len() > MAX_BLOB {
        return Err(RendezvousError::BlobTooLarge(blob.len()));
    }
    let deadline = Instant::now() + timeout;
    let hash = format!("{plan_hash:016x}");
    match root {
        Some(listener) => root_side(
            env, listener, key, &hash, data_port, deadline, timeout, blob,
        ),
        None => {
            let hello = Hello {
                rank: env.rank,
                world: env.world,
                plan_hash: hash,
                data_port,
            };
            client_side(env, key, &hello, deadline, timeout)
        }
    }
}

fn client_side(
    env: &LaunchEnv,
    key: &JobKey,
    hello: &Hello,
    deadline: Instant,
    timeout: Duration,
) -> Result<Rendezvous, RendezvousError> {
    let addr = resolve(env)?;
    let at = format!("{}:{}", env.master_addr, env.master_port);
    let ctx = context(env);
    // Retry until rank 0 listens and completes the handshake: it may start later,
    // or be busy with other connections.
    let (mut s, session) = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let attempt = TcpStream::connect_timeout(
            &addr,
            left.clamp(Duration::from_millis(1), Duration::from_millis(500)),
        )
        .map_err(|e| e.to_string())
        .and_then(
            |mut s| match connect_handshake(&mut s, key, &ctx, env.rank, deadline) {
                Ok(session) => Ok((s, session)),
                Err(Refusal::BadSecret) => Err(String::new()),
                Err(Refusal::Io(e)) => Err(e),
            },
        );
        match attempt {
            Ok(x) => break x,
            Err(e) if e.is_empty() => return Err(RendezvousError::Credentials { at }),
            Err(e) if Instant::now() >= deadline => {
                return Err(RendezvousError::Unreachable {
                    at,
                    secs: timeout.as_secs(),
                    detail: e,
                })
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    let line = serde_json::to_vec(hello).map_err(|e| RendezvousError::Json(e.to_string()))?;
    session
        .send(&mut s, HELLO, &line, deadline)
        .map_err(RendezvousError::SendHello)?;
    let answer = session
        .recv(&mut s, REPLY, max_reply(env.world), deadline)
        .map_err(|reason| RendezvousError::NoAnswer {
            secs: timeout.as_secs(),
            reason,
        })?;
    let reply: Reply = serde_json::from_slice(&answer)
        .map_err(|e| RendezvousError::MalformedAnswer(e.to_string()))?;
    if let Some(err) = reply.error {
        return Err(RendezvousError::Refused(err));
    }
    if reply.peers.len() as u64 != env.world || reply.blob.len() > MAX_BLOB {
        return Err(RendezvousError::BadReply {
            peers: reply.peers.len(),
            world: env.world,
            blob: reply.blob.len(),
        });
    }
    Ok(Rendezvous {
        peers: reply.peers,
        blob: reply.blob,
    })
}

/// An authenticated rank at rank 0: its connection, session, address and hello.
struct Arrival {
    stream: TcpStream,
    session: Session,
    from: SocketAddr,
    claim: u64,
    hello: Result<Hello, AuthOrJson>,
}

#[allow(clippy::too_many_arguments)]
fn root_side(
    env: &LaunchEnv,
    listener: TcpListener,
    key: &JobKey,
    hash: &str,
    data_port: u16,
    deadline: Instant,
    timeout: Duration,
    blob: Vec<u8>,
) -> Result<Rendezvous, RendezvousError> {
    let world = env.world as usize;
    let mut peers: Vec<Option<SocketAddr>> = vec![None; world];
    let mut conns: Vec<(TcpStream, Session)> = Vec::new();
    let mut my_ip: Option<IpAddr> = None;
    let answer =
        |conns: &mut Vec<(TcpStream, Session)>, reply: &Reply| -> Result<(), RendezvousError> {
            let bytes =
                serde_json::to_vec(reply).map_err(|e| RendezvousError::Answer(e.to_string()))?;
            let d = Instant::now() + Duration::from_secs(5);
            let mut first = Ok(());
            for (c, session) in conns.iter_mut() {
                if let Err(e) = session.send(c, REPLY, &bytes, d) {
                    first = first.and(Err(RendezvousError::Answer(e.to_string())));
                }
            }
            first
        };
    let refuse_all = |conns: &mut Vec<(TcpStream, Session)>, msg: &RendezvousError| {
        let _ = answer(
            conns,
            &Reply {
                error: Some(msg.to_string()),
                peers: vec![],
                blob: vec![],
            },
        );
    };
    let ctx = context(env);
    let hs_key = key.clone();
    let handshake = move |mut s: TcpStream, from: SocketAddr, d: Instant| {
        let (claim, session) = accept_handshake(&mut s, &hs_key, &ctx, d)?;
        // Only an authenticated rank gets this far; its hello is still capped.
        let hello = session
            .recv(&mut s, HELLO, MAX_HELLO, d)
            .map_err(AuthOrJson::Auth)
            .and_then(|b| {
                serde_json::from_slice::<Hello>(&b).map_err(|e| AuthOrJson::Json(e.to_string()))
            });
        Ok(Arrival {
            stream: s,
            session,
            from,
            claim,
            hello,
        })
    };
    let mut arrived = 1;
    let mut failure: Option<RendezvousError> = None;
    let ended = if world > 1 {
        accept_until::<_, RendezvousError, _, _>(&listener, deadline, handshake, |a: Arrival| {
            let Arrival {
                stream,
                session,
                from,
                claim,
                hello,
            } = a;
            conns.push((stream, session));
            let problem = match hello {
                Err(e) => Some(RendezvousError::UnreadableHello {
                    claim,
                    detail: e.to_string(),
                }),
                Ok(h) if h.rank != claim => Some(RendezvousError::WrongClaim {
                    claim,
                    said: h.rank,
                }),
                Ok(h) if h.world != env.world => Some(RendezvousError::WorldMismatch {
                    rank: h.rank,
                    theirs: h.world,
                    ours: env.world,
                }),
                Ok(h) if h.rank == 0 || h.rank >= env.world => Some(RendezvousError::BadRank {
                    rank: h.rank,
                    world: env.world,
                }),
                Ok(h) if peers[h.rank as usize].is_some() => Some(RendezvousError::Twice(h.rank)),
                Ok(h) if h.plan_hash != hash => Some(RendezvousError::PlanMismatch {
                    rank: h.rank,
                    theirs: h.plan_hash,
                    ours: hash.to_string(),
                }),
                Ok(h) => {
                    let c = &conns.last().expect("just pushed").0;
                    my_ip.get_or_insert(c.local_addr().map_err(AuthError::from)?.ip());
                    peers[h.rank as usize] = Some(SocketAddr::new(from.ip(), h.data_port));
                    arrived += 1;
                    None
                }
            };
            if let Some(msg) = problem {
                failure = Some(msg);
                return Ok(true);
            }
            Ok(arrived == world)
        })?
    } else {
        Accepted::Done
    };
    if let Some(e) = failure {
        refuse_all(&mut conns, &e);
        return Err(e);
    }
    if let Accepted::TimedOut { refused } = ended {
        let absent: Vec<u64> = (1..world)
            .filter(|&q| peers[q].is_none())
            .map(|q| q as u64)
            .collect();
        let e = RendezvousError::TimedOut {
            secs: timeout.as_secs(),
            absent,
            world: env.world,
            refused,
        };
        refuse_all(&mut conns, &e);
        return Err(e);
    }
    let ip = my_ip.unwrap_or(IpAddr::from([127, 0, 0, 1]));
    peers[0] = Some(SocketAddr::new(ip, data_port));
    let peers: Vec<SocketAddr> = peers
        .into_iter()
        .map(|p| p.expect("every rank arrived"))
        .collect();
    answer(
        &mut conns,
        &Reply {
            error: None,
            peers: peers.clone(),
            blob: blob.clone(),
        },
    )?;
    Ok(Rendezvous { peers, blob })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(vars: &[(&str, &str)]) -> Result<LaunchEnv, RendezvousError> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        launch_env(|k| m.get(k).cloned())
    }

    #[test]
    fn reads_each_launcher() {
        let e = env(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "3"),
            ("MASTER_ADDR", "node0"),
            ("MASTER_PORT", "6000"),
        ])
        .unwrap();
        assert_eq!(
            (e.rank, e.world, e.local_rank, e.master_port),
            (3, 8, 3, 6000)
        );
        let e = env(&[
            ("SLURM_PROCID", "9"),
            ("SLURM_NTASKS", "16"),
            ("SLURM_LOCALID", "1"),
            ("MASTER_ADDR", "n"),
        ])
        .unwrap();
        assert_eq!(
            (e.rank, e.world, e.local_rank, e.master_port),
            (9, 16, 1, 29500)
        );
        let e = env(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "n"),
        ])
        .unwrap();
        assert_eq!((e.rank, e.world, e.local_rank), (1, 2, 1));
    }

    #[test]
    fn refuses_bad_launcher_values() {
        assert!(env(&[])
            .unwrap_err()
            .to_string()
            .contains("no launcher variables"));
        assert!(
            env(&[("RANK", "8"), ("WORLD_SIZE", "8"), ("MASTER_ADDR", "n")])
                .unwrap_err()
                .to_string()
                .contains("below the world size")
        );
        assert!(env(&[("RANK", "x"), ("WORLD_SIZE", "8")])
            .unwrap_err()
            .to_string()
            .contains("not a non-negative integer"));
        assert!(env(&[("RANK", "0"), ("WORLD_SIZE", "1")])
            .unwrap_err()
            .to_string()
            .contains("MASTER_ADDR"));
        assert!(env(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("MASTER_ADDR", "n"),
            ("MASTER_PORT", "0")
        ])
        .unwrap_err()
        .to_string()
        .contains("port number"));
    }
}
