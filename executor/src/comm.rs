//! Collectives of one communication group over the [`Mesh`]: ring reduce-scatter
//! and all-gather (and all-reduce as the two in sequence, as NCCL's ring does),
//! pairwise all-to-all with per-peer sizes, and a barrier. Results are bit-identical
//! on every member: each chunk is reduced on one rank and copied around.
//!
//! Tags: group kind (8 bits) | the group's collective sequence number (36 bits) |
//! message index within the collective (20 bits). Members call collectives in the
//! same order, so the sequence numbers agree; a rank that calls a different
//! collective shows up as a receive that never matches, which times out.

use std::cell::Cell;

use sextant_planner::ranks::GroupKind;

pub use crate::error::CommError;
use crate::mesh::Mesh;

/// Group kinds, numbered for tags. `Pp` is used by the pipeline's point-to-point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Tp = 1,
    Cp,
    DpCp,
    Pp,
    Ep,
    Edp,
    World,
    Etp,
}

impl Kind {
    /// The rank map's group kind this communicator is (none for the world).
    pub fn group(self) -> Option<GroupKind> {
        match self {
            Kind::Tp => Some(GroupKind::Tp),
            Kind::Cp => Some(GroupKind::Cp),
            Kind::DpCp => Some(GroupKind::DpCp),
            Kind::Pp => Some(GroupKind::Pp),
            Kind::Ep => Some(GroupKind::Ep),
            Kind::Edp => Some(GroupKind::Edp),
            Kind::World => None,
            Kind::Etp => Some(GroupKind::Etp),
        }
    }

    pub fn label(self) -> &'static str {
        self.group().map_or("world", GroupKind::name)
    }
}

pub fn to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn from_bytes(b: &[u8]) -> Result<Vec<f32>, CommError> {
    if !b.len().is_multiple_of(4) {
        return Err(CommError::Bytes(b.len()));
    }
    Ok(b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// One communicator: the ordered member ranks and this rank's index among them.
#[derive(Debug)]
pub struct Group {
    pub kind: Kind,
    pub members: Vec<u64>,
    pub me: usize,
    seq: Cell<u64>,
}

/// Equal-as-possible split of `len` into `n` ranges.
fn bounds(len: usize, n: usize, i: usize) -> (usize, usize) {
    (len * i / n, len * (i + 1) / n)
}

impl Group {
    pub fn new(kind: Kind, members: Vec<u64>, rank: u64) -> Result<Group, CommError> {
        let Some(me) = members.iter().position(|&r| r == rank) else {
            return Err(CommError::NotMember {
                rank,
                group: kind.label(),
                members,
            });
        };
        Ok(Group {
            kind,
            members,
            me,
            seq: Cell::new(0),
        })
    }

    pub fn size(&self) -> usize {
        self.members.len()
    }

    fn next_tag(&self) -> u64 {
        let s = self.seq.get();
        self.seq.set(s + 1);
        ((self.kind as u64) << 56) | ((s & ((1 << 36) - 1)) << 20)
    }

    fn peer(&self, offset: isize) -> u64 {
        let n = self.size() as isize;
        self.members[((self.me as isize + offset).rem_euclid(n)) as usize]
    }

    /// Ring reduce-scatter over `data` split into `size()` near-equal chunks;
    /// returns the summed chunk `me`.
    pub fn reduce_scatter(&self, mesh: &Mesh, data: &[f32]) -> Result<Vec<f32>, CommError> {
        let n = self.size();
        let tag = self.next_tag();
        let mut acc = data.to_vec();
        let (next, prev) = (self.peer(1), self.peer(-1));
        for s in 0..n.saturating_sub(1) {
            let send = (self.me + 2 * n - s - 1) % n;
            let recv = (self.me + 2 * n - s - 2) % n;
            let (a, b) = bounds(data.len(), n, send);
            mesh.send(next, tag | s as u64, &to_bytes(&acc[a..b]))?;
            let got = from_bytes(&mesh.recv(prev, tag | s as u64)?)?;
            let (a, b) = bounds(data.len(), n, recv);
            if got.len() != b - a {
                return Err(CommError::Count {
                    group: self.kind.label(),
                    op: "reduce-scatter",
                    from: prev,
                    got: got.len(),
                    expected: b - a,
                });
            }
            for (x, y) in acc[a..b].iter_mut().zip(got) {
                *x += y;
            }
        }
        let (a, b) = bounds(data.len(), n, self.me);
        Ok(acc[a..b].to_vec())
    }

    /// Ring all-gather in place: on entry `out` holds this member's near-equal chunk
    /// (the split [`Group::reduce_scatter`] uses); on return, every chunk.
    pub fn all_gather_chunks(&self, mesh: &Mesh, out: &mut [f32]) -> Result<(), CommError> {
        let n = self.size();
        let tag = self.next_tag();
        let (next, prev) = (self.peer(1), self.peer(-1));
        for s in 0..n.saturating_sub(1) {
            let send = (self.me + n - s) % n;
            let recv = (self.me + 2 * n - s - 1) % n;
            let (a, b) = bounds(out.len(), n, send);
            mesh.send(next, tag | s as u64, &to_bytes(&out[a..b]))?;
            let got = from_bytes(&mesh.recv(prev, tag | s as u64)?)?;
            let (a, b) = bounds(out.len(), n, recv);
            if got.len() != b - a {
                return Err(CommError::Count {
                    group: self.kind.label(),
                    op: "all-gather",
                    from: prev,
                    got: got.len(),
                    expected: b - a,
                });
            }
            out[a..b].copy_from_slice(&got);
        }
        Ok(())
    }

    /// All-gather of equal-sized pieces, concatenated in member order.
    pub fn all_gather(&self, mesh: &Mesh, mine: &[f32]) -> Result<Vec<f32>, CommError> {
        let n = self.size();
        let mut out = vec![0.0; mine.len() * n];
        out[self.me * mine.len()..(self.me + 1) * mine.len()].copy_from_slice(mine);
        self.all_gather_chunks(mesh, &mut out)?;
        Ok(out)
    }

    /// Sum over the group, in place (reduce-scatter then all-gather).
    pub fn all_reduce(&self, mesh: &Mesh, data: &mut [f32]) -> Result<(), CommError> {
        if self.size() == 1 {
            return Ok(());
        }
        let mine = self.reduce_scatter(mesh, data)?;
        let (a, b) = bounds(data.len(), self.size(), self.me);
        data[a..b].copy_from_slice(&mine);
        self.all_gather_chunks(mesh, data)
    }

    /// Each member sends `parts[j]` to member j (any sizes); returns what each sent here.
    pub fn all_to_all(
        &self,
        mesh: &Mesh,
        mut parts: Vec<Vec<f32>>,
    ) -> Result<Vec<Vec<f32>>, CommError> {
        let n = self.size();
        if parts.len() != n {
            return Err(CommError::Parts {
                group: self.kind.label(),
                needs: n,
                got: parts.len(),
            });
        }
        let tag = self.next_tag();
        for (j, p) in parts.iter().enumerate() {
            if j != self.me {
                mesh.send(self.members[j], tag, &to_bytes(p))?;
            }
        }
        let mut out = Vec::with_capacity(n);
        for (j, part) in parts.iter_mut().enumerate() {
            if j == self.me {
                out.push(std::mem::take(part));
            } else {
                out.push(from_bytes(&mesh.recv(self.members[j], tag)?)?);
            }
        }
        Ok(out)
    }

    pub fn barrier(&self, mesh: &Mesh) -> Result<(), CommError> {
        let mut one = vec![1.0f32; self.size()];
        self.all_reduce(mesh, &mut one)?;
        if one.iter().any(|&x| x != self.size() as f32) {
            return Err(CommError::Barrier {
                group: self.kind.label(),
                sum: one,
                size: self.size(),
            });
        }
        Ok(())
    }
}
