//! The TCP rendezvous at MASTER_ADDR:MASTER_PORT. Rank 0 listens; every other rank
//! connects (retrying until the timeout), says who it is, which plan it runs (a
//! hash of the plan file) and where it listens for peer connections. Rank 0 checks
//! that the world size and plan agree and that no rank is missing or doubled, then
//! answers everyone with the table of peer addresses and a blob of its own (the
//! CUDA backend puts NCCL unique ids there). Any disagreement ends every rank with
//! the reason; a rank that never arrives is named after the timeout.

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

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
pub fn launch_env(get: impl Fn(&str) -> Option<String>) -> Result<LaunchEnv, String> {
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
    let num = |name: &str| -> Result<Option<u64>, String> {
        match get(name) {
            None => Ok(None),
            Some(v) => v
                .trim()
                .parse::<u64>()
                .map(Some)
                .map_err(|_| format!("{name}={v:?} is not a non-negative integer")),
        }
    };
    for (who, r, w, l) in families {
        let (Some(rank), Some(world)) = (num(r)?, num(w)?) else {
            continue;
        };
        if world == 0 || rank >= world {
            return Err(format!("{who} says rank {rank} of world size {world}: the rank must be below the world size"));
        }
        let local_rank = num(l)?.unwrap_or(rank);
        let master_addr = get("MASTER_ADDR").ok_or_else(|| {
            format!("{r}/{w} are set ({who}) but MASTER_ADDR is not: set it to rank 0's host name or address")
        })?;
        let master_port = match get("MASTER_PORT") {
            None => 29500,
            Some(p) => p
                .trim()
                .parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| format!("MASTER_PORT={p:?} is not a port number (1-65535)"))?,
        };
        return Ok(LaunchEnv {
            rank,
            world,
            local_rank,
            master_addr,
            master_port,
        });
    }
    Err("no launcher variables found (RANK/WORLD_SIZE from torchrun, SLURM_PROCID/SLURM_NTASKS, or OMPI_COMM_WORLD_RANK/SIZE): start under torchrun, srun or mpirun, or use --ranks N to start local ranks".into())
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

/// What every rank learns at the rendezvous.
#[derive(Debug, Clone)]
pub struct Rendezvous {
    /// Rank q's peer-connection address.
    pub peers: Vec<SocketAddr>,
    /// Rank 0's blob.
    pub blob: Vec<u8>,
}

fn resolve(env: &LaunchEnv) -> Result<SocketAddr, String> {
    (env.master_addr.as_str(), env.master_port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve MASTER_ADDR {:?}: {e}", env.master_addr))?
        .next()
        .ok_or_else(|| format!("MASTER_ADDR {:?} resolves to no address", env.master_addr))
}

fn send_line<T: Serialize>(s: &mut TcpStream, v: &T) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(v).map_err(std::io::Error::other)?;
    line.push(b'\n');
    s.write_all(&line)
}

fn read_line(s: &TcpStream, timeout: Duration) -> Result<String, String> {
    s.set_read_timeout(Some(timeout.max(Duration::from_millis(1))))
        .map_err(|e| e.to_string())?;
    let mut line = String::new();
    BufReader::new(s).take_line(&mut line)?;
    Ok(line)
}

trait TakeLine {
    fn take_line(self, line: &mut String) -> Result<(), String>;
}
impl<R: std::io::Read> TakeLine for BufReader<R> {
    fn take_line(mut self, line: &mut String) -> Result<(), String> {
        match self.read_line(line) {
            Ok(0) => Err("connection closed".into()),
            Ok(_) if line.len() > 1 << 20 => Err("message too long".into()),
            Ok(_) => Ok(()),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// Binds rank 0's rendezvous port. Separate so that "port in use" is its own error.
pub fn bind_root(env: &LaunchEnv) -> Result<TcpListener, String> {
    let ip: IpAddr = if resolve(env)?.ip().is_loopback() {
        IpAddr::from([127, 0, 0, 1])
    } else {
        IpAddr::from([0, 0, 0, 0])
    };
    TcpListener::bind((ip, env.master_port)).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AddrInUse {
            format!("MASTER_PORT {} is already in use on this host (another job or a leftover process): choose a free port", env.master_port)
        } else {
            format!("cannot listen on MASTER_PORT {}: {e}", env.master_port)
        }
    })
}

/// Runs the rendezvous. Rank 0 passes its bound listener and `blob`; the others pass `None`.
pub fn rendezvous(
    env: &LaunchEnv,
    root: Option<TcpListener>,
    plan_hash: u64,
    data_port: u16,
    timeout: Duration,
    blob: Vec<u8>,
) -> Result<Rendezvous, String> {
    let deadline = Instant::now() + timeout;
    let hash = format!("{plan_hash:016x}");
    match root {
        Some(listener) => root_side(env, listener, &hash, data_port, deadline, timeout, blob),
        None => {
            let addr = resolve(env)?;
            let mut s = loop {
                match TcpStream::connect_timeout(&addr, Duration::from_millis(500)) {
                    Ok(s) => break s,
                    Err(e) if Instant::now() >= deadline => {
                        return Err(format!(
                            "rendezvous: could not reach rank 0 at {}:{} within {} s: {e}",
                            env.master_addr,
                            env.master_port,
                            timeout.as_secs()
                        ))
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            };
            send_line(
                &mut s,
                &Hello {
                    rank: env.rank,
                    world: env.world,
                    plan_hash: hash,
                    data_port,
                },
            )
            .map_err(|e| format!("rendezvous: {e}"))?;
            let line =
                read_line(&s, deadline.saturating_duration_since(Instant::now())).map_err(|e| {
                    format!(
                        "rendezvous: no answer from rank 0 within {} s ({e})",
                        timeout.as_secs()
                    )
                })?;
            let reply: Reply = serde_json::from_str(&line)
                .map_err(|e| format!("rendezvous: malformed answer from rank 0: {e}"))?;
            if let Some(err) = reply.error {
                return Err(format!("rendezvous refused by rank 0: {err}"));
            }
            if reply.peers.len() as u64 != env.world {
                return Err(format!(
                    "rendezvous: rank 0 sent {} peer addresses for world size {}",
                    reply.peers.len(),
                    env.world
                ));
            }
            Ok(Rendezvous {
                peers: reply.peers,
                blob: reply.blob,
            })
        }
    }
}

fn root_side(
    env: &LaunchEnv,
    listener: TcpListener,
    hash: &str,
    data_port: u16,
    deadline: Instant,
    timeout: Duration,
    blob: Vec<u8>,
) -> Result<Rendezvous, String> {
    let world = env.world as usize;
    let mut peers: Vec<Option<SocketAddr>> = vec![None; world];
    let mut conns: Vec<TcpStream> = Vec::new();
    let mut my_ip: Option<IpAddr> = None;
    let refuse_all = |conns: &mut Vec<TcpStream>, msg: &str| {
        for c in conns.iter_mut() {
            let _ = send_line(
                c,
                &Reply {
                    error: Some(msg.to_string()),
                    peers: vec![],
                    blob: vec![],
                },
            );
        }
    };
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let mut arrived = 1;
    while arrived < world {
        match listener.accept() {
            Ok((s, from)) => {
                s.set_nonblocking(false).map_err(|e| e.to_string())?;
                let Ok(line) = read_line(&s, Duration::from_secs(5).min(timeout)) else {
                    continue;
                };
                let Ok(h) = serde_json::from_str::<Hello>(&line) else {
                    continue;
                };
                let problem = if h.world != env.world {
                    Some(format!(
                        "rank {} was started with world size {} but rank 0 with {}",
                        h.rank, h.world, env.world
                    ))
                } else if h.rank == 0 || h.rank >= env.world {
                    Some(format!("a process claims rank {} (world size {}): two launches share MASTER_PORT, or the ranks are numbered wrongly", h.rank, env.world))
                } else if peers[h.rank as usize].is_some() {
                    Some(format!("rank {} arrived twice: two launches share MASTER_PORT, or the ranks are numbered wrongly", h.rank))
                } else if h.plan_hash != hash {
                    Some(format!("rank {} runs a different plan file (hash {}) from rank 0 ({hash}): give every rank the same plan", h.rank, h.plan_hash))
                } else {
                    None
                };
                conns.push(s);
                if let Some(msg) = problem {
                    refuse_all(&mut conns, &msg);
                    return Err(format!("rendezvous: {msg}"));
                }
                let c = conns.last().expect("just pushed");
                my_ip.get_or_insert(c.local_addr().map_err(|e| e.to_string())?.ip());
                peers[h.rank as usize] = Some(SocketAddr::new(from.ip(), h.data_port));
                arrived += 1;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let absent: Vec<String> = (1..world)
                        .filter(|&q| peers[q].is_none())
                        .map(|q| q.to_string())
                        .collect();
                    let msg = format!(
                        "rendezvous timed out after {} s: rank{} {} of world size {} never arrived",
                        timeout.as_secs(),
                        if absent.len() > 1 { "s" } else { "" },
                        absent.join(", "),
                        env.world
                    );
                    refuse_all(&mut conns, &msg);
                    return Err(msg);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(format!("rendezvous: accept failed: {e}")),
        }
    }
    let ip = my_ip.unwrap_or(IpAddr::from([127, 0, 0, 1]));
    peers[0] = Some(SocketAddr::new(ip, data_port));
    let peers: Vec<SocketAddr> = peers
        .into_iter()
        .map(|p| p.expect("every rank arrived"))
        .collect();
    for c in conns.iter_mut() {
        send_line(
            c,
            &Reply {
                error: None,
                peers: peers.clone(),
                blob: blob.clone(),
            },
        )
        .map_err(|e| format!("rendezvous: answering a rank failed: {e}"))?;
    }
    Ok(Rendezvous { peers, blob })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(vars: &[(&str, &str)]) -> Result<LaunchEnv, String> {
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
        assert!(env(&[]).unwrap_err().contains("no launcher variables"));
        assert!(
            env(&[("RANK", "8"), ("WORLD_SIZE", "8"), ("MASTER_ADDR", "n")])
                .unwrap_err()
                .contains("below the world size")
        );
        assert!(env(&[("RANK", "x"), ("WORLD_SIZE", "8")])
            .unwrap_err()
            .contains("not a non-negative integer"));
        assert!(env(&[("RANK", "0"), ("WORLD_SIZE", "1")])
            .unwrap_err()
            .contains("MASTER_ADDR"));
        assert!(env(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("MASTER_ADDR", "n"),
            ("MASTER_PORT", "0")
        ])
        .unwrap_err()
        .contains("port number"));
    }
}
