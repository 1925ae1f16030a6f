//! Rank layout: which global rank holds which coordinates, and the members of each
//! communication group, constructed the way Megatron-Core's `RankGenerator` does
//! (`megatron/core/parallel_state.py`).
//!
//! An order string such as `tp-cp-ep-dp-pp` lists the parallel dimensions from the
//! fastest-varying (consecutive ranks) to the slowest. Dimension `i` has stride
//! `prod(size[0..i])`. A group over a set of dimensions (e.g. `tp`, or `dp-cp`)
//! holds the ranks that agree on every other dimension; groups are numbered by the
//! coordinates of the other dimensions, fastest first, and members by the
//! coordinates of the group's dimensions, fastest first.
//!
//! Dense layers use sizes (tp, cp, ep = 1, dp, pp). Expert layers re-divide the same
//! ranks as (etp, cp = 1, ep, edp, pp) in the same order, where
//! `edp = tp * cp * dp / (ep * etp)`.

use serde::{Deserialize, Serialize};

use crate::config::ParallelConfig;

/// The rank orders Megatron-Core supports.
pub const ORDERS: &[&str] = &["tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp"];

/// ScaleTorch's order: its `ProcessGroupManager` views the world as a grid
/// `[DP, PP, CP, EP, TP]` (scaletorch/parallel/process_group.py), TP fastest.
pub const SCALETORCH_ORDER: &str = "tp-ep-cp-pp-dp";

/// Sizes of the five named dimensions in a given order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grid {
    names: Vec<&'static str>,
    sizes: Vec<u64>,
}

fn dim_name(s: &str) -> Option<&'static str> {
    ["tp", "cp", "ep", "dp", "pp"].into_iter().find(|n| *n == s)
}

impl Grid {
    /// `order` must name tp, cp, ep, dp and pp once each.
    pub fn new(
        order: &str,
        tp: u64,
        cp: u64,
        ep: u64,
        dp: u64,
        pp: u64,
    ) -> Result<Grid, RankOrderError> {
        let names: Vec<&'static str> = order
            .split('-')
            .map(|s| {
                dim_name(s).ok_or_else(|| RankOrderError::UnknownDimension {
                    order: order.to_string(),
                    dim: s.to_string(),
                })
            })
            .collect::<Result<_, _>>()?;
        let mut sorted = names.clone();
        sorted.sort_unstable();
        if sorted != ["cp", "dp", "ep", "pp", "tp"] {
            return Err(RankOrderError::NotEachOnce(order.to_string()));
        }
        let size_of = |n: &str| match n {
            "tp" => tp,
            "cp" => cp,
            "ep" => ep,
            "dp" => dp,
            _ => pp,
        };
        let sizes = names.iter().map(|n| size_of(n)).collect();
        Ok(Grid { names, sizes })
    }

    pub fn world(&self) -> u64 {
        self.sizes.iter().product()
    }

    fn strides(&self) -> Vec<u64> {
        let mut s = Vec::with_capacity(self.sizes.len());
        let mut acc = 1;
        for &n in &self.sizes {
            s.push(acc);
            acc *= n;
        }
        s
    }

    /// The coordinate of `rank` along dimension `name`.
    pub fn coord(&self, rank: u64, name: &str) -> u64 {
        let strides = self.strides();
        let i = self
            .names
            .iter()
            .position(|n| *n == name)
            .expect("known dimension");
        (rank / strides[i]) % self.sizes[i]
    }

    /// All groups over the dimensions in `token` (e.g. "tp" or "dp-cp"), each a
    /// list of ranks, in Megatron-Core's order.
    pub fn groups(&self, token: &str) -> Vec<Vec<u64>> {
        let wanted: Vec<&str> = token.split('-').collect();
        let strides = self.strides();
        let (mut in_shape, mut in_stride, mut out_shape, mut out_stride) =
            (vec![], vec![], vec![], vec![]);
        for (i, n) in self.names.iter().enumerate() {
            if wanted.contains(n) {
                in_shape.push(self.sizes[i]);
                in_stride.push(strides[i]);
            } else {
                out_shape.push(self.sizes[i]);
                out_stride.push(strides[i]);
            }
        }
        let group_size: u64 = in_shape.iter().product();
        let groups = self.world() / group_size;
        (0..groups)
            .map(|g| {
                let base = place(g, &out_shape, &out_stride);
                (0..group_size)
                    .map(|r| base + place(r, &in_shape, &in_stride))
                    .collect()
            })
            .collect()
    }
}

/// Decomposes `index` over `shape` (fastest first) and dots it with `stride`.
fn place(mut index: u64, shape: &[u64], stride: &[u64]) -> u64 {
    let mut out = 0;
    for (&n, &s) in shape.iter().zip(stride) {
        out += (index % n) * s;
        index /= n;
    }
    out
}

/// One rank's place and groups.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankEntry {
    pub rank: u64,
    pub node: u64,
    pub local_gpu: u64,
    pub tp: u64,
    pub cp: u64,
    pub dp: u64,
    pub pp: u64,
    /// Expert-layer coordinates.
    pub ep: u64,
    pub etp: u64,
    pub edp: u64,
    /// Index into [`RankMap::groups`] of each kind, in the order of [`GroupKind::ALL`].
    pub group_index: Vec<usize>,
}

impl RankEntry {
    /// Which of the groups of `kind` this rank is in (an index into
    /// [`RankMap::groups_of`]).
    pub fn group_index_of(&self, kind: GroupKind) -> usize {
        self.group_index[kind.index()]
    }
}

/// The kinds of group in a rank map: dense TP, CP, DP, DP x CP (gradient
/// reduction), PP; expert EP, ETP, EDP. Files and printed text name them by
/// [`GroupKind::name`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GroupKind {
    Tp,
    Cp,
    Dp,
    DpCp,
    Pp,
    Ep,
    Etp,
    Edp,
}

impl GroupKind {
    /// Every kind, in the order a rank map holds them.
    pub const ALL: [GroupKind; 8] = [
        GroupKind::Tp,
        GroupKind::Cp,
        GroupKind::Dp,
        GroupKind::DpCp,
        GroupKind::Pp,
        GroupKind::Ep,
        GroupKind::Etp,
        GroupKind::Edp,
    ];

    /// The kind's name in files and printed text.
    pub fn name(self) -> &'static str {
        match self {
            GroupKind::Tp => "tp",
            GroupKind::Cp => "cp",
            GroupKind::Dp => "dp",
            GroupKind::DpCp => "dp_cp",
            GroupKind::Pp => "pp",
            GroupKind::Ep => "ep",
            GroupKind::Etp => "etp",
            GroupKind::Edp => "edp",
        }
    }

    /// The kind's position in [`GroupKind::ALL`] (and in a rank map's groups).
    pub fn index(self) -> usize {
        self as usize
    }

    /// The kind called `name` ([`GroupKind::name`]).
    pub fn from_name(name: &str) -> Option<GroupKind> {
        GroupKind::ALL.into_iter().find(|k| k.name() == name)
    }
}

impl std::fmt::Display for GroupKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is no [`GroupKind`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown group kind '{0}' (expected tp, cp, dp, dp_cp, pp, ep, etp, edp)")]
pub struct UnknownGroupKind(pub String);

impl std::str::FromStr for GroupKind {
    type Err = UnknownGroupKind;
    fn from_str(s: &str) -> Result<GroupKind, UnknownGroupKind> {
        GroupKind::from_name(s).ok_or_else(|| UnknownGroupKind(s.to_string()))
    }
}

impl Serialize for GroupKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for GroupKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<GroupKind, D::Error> {
        let name = String::deserialize(d)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankMap {
    pub order: String,
    pub world_size: u64,
    pub gpus_per_node: u64,
    /// For each kind, in the order of [`GroupKind::ALL`], every group's member ranks.
    pub groups: Vec<(GroupKind, Vec<Vec<u64>>)>,
    pub ranks: Vec<RankEntry>,
}

impl RankMap {
    /// Every group of `kind`, each a list of member ranks.
    pub fn groups_of(&self, kind: GroupKind) -> &[Vec<u64>] {
        &self.groups[kind.index()].1
    }

    /// The members of `rank`'s group of `kind`.
    pub fn group_of(&self, rank: u64, kind: GroupKind) -> &[u64] {
        &self.groups_of(kind)[self.ranks[rank as usize].group_index_of(kind)]
    }
}

/// Why a rank order or a configuration's expert layout gives no rank map
/// ([`Grid::new`], [`rank_map`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RankOrderError {
    #[error("rank order '{order}': unknown dimension '{dim}' (expected tp, cp, ep, dp, pp)")]
    UnknownDimension { order: String, dim: String },
    #[error("rank order '{0}' must name each of tp, cp, ep, dp, pp exactly once")]
    NotEachOnce(String),
    #[error("rank order '{0}' is neither one Megatron-Core supports ({orders}) nor ScaleTorch's ({SCALETORCH_ORDER})", orders = ORDERS.join(", "))]
    Unsupported(String),
    /// `dense` is tp x cp x dp.
    #[error("expert layout ep {ep} x etp {etp} does not tile tp x cp x dp = {dense}")]
    ExpertTiling { ep: u64, etp: u64, dense: u64 },
}

/// Whether `order` is one Megatron-Core builds or ScaleTorch's grid.
pub fn check_order(order: &str) -> Result<(), RankOrderError> {
    if ORDERS.contains(&order) || order == SCALETORCH_ORDER {
        Ok(())
    } else {
        Err(RankOrderError::Unsupported(order.to_string()))
    }
}

/// Builds the rank map of a configuration.
pub fn rank_map(
    cfg: &ParallelConfig,
    order: &str,
    gpus_per_node: u64,
) -> Result<RankMap, RankOrderError> {
    check_order(order)?;
    let dense = Grid::new(order, cfg.tp, cfg.cp, 1, cfg.dp, cfg.pp)?;
    let edp = cfg.edp();
    let expert = Grid::new(order, cfg.etp, 1, cfg.ep, edp, cfg.pp)?;
    if expert.world() != dense.world() {
        return Err(RankOrderError::ExpertTiling {
            ep: cfg.ep,
            etp: cfg.etp,
            dense: cfg.tp * cfg.cp * cfg.dp,
        });
    }
    let world = dense.world();
    let groups: Vec<(GroupKind, Vec<Vec<u64>>)> = GroupKind::ALL
        .into_iter()
        .map(|kind| {
            let members = match kind {
                GroupKind::Tp => dense.groups("tp"),
                GroupKind::Cp => dense.groups("cp"),
                GroupKind::Dp => dense.groups("dp"),
                GroupKind::DpCp => dense.groups("dp-cp"),
                GroupKind::Pp => dense.groups("pp"),
                GroupKind::Ep => expert.groups("ep"),
                GroupKind::Etp => expert.groups("tp"),
                GroupKind::Edp => expert.groups("dp"),
            };
            (kind, members)
        })
        .collect();
    // rank -> group index, per kind.
    let mut index = vec![vec![0usize; world as usize]; groups.len()];
    for (k, (_, gs)) in groups.iter().enumerate() {
        for (gi, g) in gs.iter().enumerate() {
            for &r in g {
                index[k][r as usize] = gi;
            }
        }
    }
    let ranks = (0..world)
        .map(|r| RankEntry {
            rank: r,
            node: r / gpus_per_node,
            local_gpu: r % gpus_per_node,
            tp: dense.coord(r, "tp"),
            cp: dense.coord(r, "cp"),
            dp: dense.coord(r, "dp"),
            pp: dense.coord(r, "pp"),
            ep: expert.coord(r, "ep"),
            etp: expert.coord(r, "tp"),
            edp: expert.coord(r, "dp"),
            group_index: index.iter().map(|ix| ix[r as usize]).collect(),
        })
        .collect();
    Ok(RankMap {
        order: order.to_string(),
        world_size: world,
        gpus_per_node,
        groups,
        ranks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Dispatcher, Layout, Overlap, Recompute, Zero};
    use GroupKind as G;

    fn cfg(tp: u64, cp: u64, dp: u64, pp: u64, ep: u64, etp: u64) -> ParallelConfig {
        ParallelConfig {
            tp,
            pp,
            vpp: 1,
            cp,
            ep,
            etp,
            dp,
            sp: tp > 1,
            mbs: 1,
            zero: Zero::DistOpt,
            recompute: Recompute::None,
            layout: Layout::Even,
            overlap: Overlap::default(),
            bf16_grads: false,
            bf16_moments: false,
            recompute_modules: Default::default(),
            moe_dispatcher: Dispatcher::AllToAll,
            schedule: crate::schedule::Schedule::OneFOneB,
        }
    }

    fn group(m: &RankMap, kind: GroupKind) -> &Vec<Vec<u64>> {
        &m.groups.iter().find(|(k, _)| *k == kind).unwrap().1
    }

    /// The kinds keep the names and the order the rank map's files have always
    /// had; a name parses back to its kind, anything else is refused.
    #[test]
    fn group_kinds_keep_their_names_and_order() {
        let names: Vec<&str> = GroupKind::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(names, ["tp", "cp", "dp", "dp_cp", "pp", "ep", "etp", "edp"]);
        for (i, k) in GroupKind::ALL.into_iter().enumerate() {
            assert_eq!(k.index(), i);
            assert_eq!(k.name().parse::<GroupKind>(), Ok(k));
            assert_eq!(k.to_string(), k.name());
            assert_eq!(
                serde_json::to_string(&k).unwrap(),
                format!("\"{}\"", k.name())
            );
        }
        assert!("dp-cp".parse::<GroupKind>().is_err());
        assert!(serde_json::from_str::<GroupKind>("\"world\"").is_err());
        let m = rank_map(&cfg(2, 1, 2, 2, 1, 1), "tp-cp-ep-dp-pp", 8).unwrap();
        let kinds: Vec<GroupKind> = m.groups.iter().map(|(k, _)| *k).collect();
        assert_eq!(kinds, GroupKind::ALL);
        let json = serde_json::to_string(&m).unwrap();
        assert!(json.contains(r#""groups":[["tp",[[0,1],"#), "{json}");
        assert_eq!(serde_json::from_str::<RankMap>(&json).unwrap(), m);
    }

    /// Megatron-Core's docstring example for `initialize_model_parallel`: 16 GPUs,
    /// TP 2, PP 4, DP 2 (order tp-cp-ep-dp-pp): TP groups [0,1] [2,3] ..., DP groups
    /// [0,2] [1,3] [4,6] ..., PP groups [0,4,8,12] [1,5,9,13] ...
    #[test]
    fn megatron_docstring_example() {
        let m = rank_map(&cfg(2, 1, 2, 4, 1, 1), "tp-cp-ep-dp-pp", 8).unwrap();
        assert_eq!(group(&m, G::Tp)[..3], [vec![0, 1], vec![2, 3], vec![4, 5]]);
        assert_eq!(
            group(&m, G::Dp)[..4],
            [vec![0, 2], vec![1, 3], vec![4, 6], vec![5, 7]]
        );
        assert_eq!(
            group(&m, G::Pp)[..2],
            [vec![0, 4, 8, 12], vec![1, 5, 9, 13]]
        );
        // PP groups span both nodes of 8: ranks 0 and 8 are on different nodes.
        assert_eq!((m.ranks[0].node, m.ranks[8].node), (0, 1));
    }

    /// tp-cp-ep-pp-dp: PP varies before DP, so PP groups are close together and DP
    /// groups far apart.
    #[test]
    fn pp_before_dp_order() {
        let m = rank_map(&cfg(2, 1, 2, 4, 1, 1), "tp-cp-ep-pp-dp", 8).unwrap();
        assert_eq!(group(&m, G::Pp)[..2], [vec![0, 2, 4, 6], vec![1, 3, 5, 7]]);
        assert_eq!(group(&m, G::Dp)[..2], [vec![0, 8], vec![1, 9]]);
        // DP groups now cross nodes; PP groups stay inside one.
        assert!(group(&m, G::Dp)
            .iter()
            .all(|g| m.ranks[g[0] as usize].node != m.ranks[g[1] as usize].node));
        assert!(group(&m, G::Pp).iter().all(|g| g
            .iter()
            .all(|&r| m.ranks[r as usize].node == m.ranks[g[0] as usize].node)));
    }

    /// Megatron-Core's own functions on world 16, TP 2, PP 2, DP 4 (8 GPUs per node,
    /// so DP or PP groups cross nodes), for both orders it supports.
    #[test]
    fn megatron_worked_example_both_orders() {
        let c = cfg(2, 1, 4, 2, 1, 1);
        let m = rank_map(&c, "tp-cp-ep-dp-pp", 8).unwrap();
        assert_eq!(group(&m, G::Tp)[7], vec![14, 15]);
        assert_eq!(
            group(&m, G::Dp),
            &vec![
                vec![0, 2, 4, 6],
                vec![1, 3, 5, 7],
                vec![8, 10, 12, 14],
                vec![9, 11, 13, 15]
            ]
        );
        assert_eq!(group(&m, G::Pp)[..2], [vec![0, 8], vec![1, 9]]);
        assert_eq!(group(&m, G::Pp)[7], vec![7, 15]);
        assert_ne!(m.ranks[0].node, m.ranks[8].node, "PP groups span nodes");
        let m = rank_map(&c, "tp-cp-ep-pp-dp", 8).unwrap();
        assert_eq!(
            group(&m, G::Dp),
            &vec![
                vec![0, 4, 8, 12],
                vec![1, 5, 9, 13],
                vec![2, 6, 10, 14],
                vec![3, 7, 11, 15]
            ]
        );
        assert_eq!(
            group(&m, G::Pp),
            &vec![
                vec![0, 2],
                vec![1, 3],
                vec![4, 6],
                vec![5, 7],
                vec![8, 10],
                vec![9, 11],
                vec![12, 14],
                vec![13, 15]
            ]
        );
        assert_ne!(m.ranks[0].node, m.ranks[8].node, "DP groups span nodes");
    }

    #[test]
    fn every_rank_in_exactly_one_group_of_each_kind() {
        for order in ORDERS {
            let c = cfg(2, 2, 4, 2, 4, 1);
            let m = rank_map(&c, order, 8).unwrap();
            assert_eq!(m.world_size, 32);
            for (kind, gs) in &m.groups {
                let mut seen = [0u32; 32];
                for g in gs {
                    for &r in g {
                        seen[r as usize] += 1;
                    }
                }
                assert!(seen.iter().all(|&n| n == 1), "{order} {kind}");
            }
            // Coordinates are consistent with group membership.
            for e in &m.ranks {
                let tp_group = &group(&m, G::Tp)[e.group_index_of(G::Tp)];
                assert_eq!(tp_group[e.tp as usize], e.rank);
            }
            assert_eq!(group(&m, G::DpCp)[0].len(), 8);
            assert_eq!(group(&m, G::Ep)[0].len(), 4);
            assert_eq!(group(&m, G::Edp)[0].len(), 4);
        }
    }

    #[test]
    fn expert_groups_redivide_the_dense_ranks() {
        // tp 2, cp 1, dp 8 -> 16 ranks per stage; ep 8, etp 1 -> edp 2.
        let m = rank_map(&cfg(2, 1, 8, 1, 8, 1), "tp-cp-ep-dp-pp", 8).unwrap();
        assert_eq!(group(&m, G::Ep)[0], vec![0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(group(&m, G::Edp)[0], vec![0, 8]);
        assert!(rank_map(&cfg(2, 1, 8, 1, 8, 1), "pp-dp-tp-cp-ep", 8).is_err());
    }

    /// ScaleTorch's `ProcessGroupManager`, transcribed: `torch.arange(world).view(dp,
    /// pp, cp, ep, tp)`, each rank's coordinates by repeated division (TP first),
    /// and each group the grid slice that varies one dimension. Every rank map in
    /// ScaleTorch's order must agree with it, coordinates and groups.
    #[test]
    fn scaletorch_order_matches_its_process_group_manager() {
        for (tp, cp, pp, dp) in [
            (2, 1, 2, 16),
            (1, 2, 4, 2),
            (4, 2, 2, 2),
            (8, 1, 1, 4),
            (2, 4, 3, 2),
        ] {
            let ep = 1;
            let m = rank_map(&cfg(tp, cp, dp, pp, 1, 1), SCALETORCH_ORDER, 8).unwrap();
            let world = tp * cp * pp * dp * ep;
            assert_eq!(m.world_size, world);
            let at = |d: u64, p: u64, c: u64, e: u64, t: u64| {
                (((d * pp + p) * cp + c) * ep + e) * tp + t
            };
            for r in 0..world {
                let mut rem = r;
                let t = rem % tp;
                rem /= tp;
                let e = rem % ep;
                rem /= ep;
                let c = rem % cp;
                rem /= cp;
                let p = rem % pp;
                let d = rem / pp;
                let got = &m.ranks[r as usize];
                assert_eq!(
                    (got.tp, got.cp, got.pp, got.dp),
                    (t, c, p, d),
                    "rank {r} of tp {tp} cp {cp} pp {pp} dp {dp}"
                );
                let group = |kind: GroupKind| m.group_of(r, kind).to_vec();
                assert_eq!(
                    group(G::Tp),
                    (0..tp).map(|x| at(d, p, c, e, x)).collect::<Vec<_>>()
                );
                assert_eq!(
                    group(G::Cp),
                    (0..cp).map(|x| at(d, p, x, e, t)).collect::<Vec<_>>()
                );
                assert_eq!(
                    group(G::Pp),
                    (0..pp).map(|x| at(d, x, c, e, t)).collect::<Vec<_>>()
                );
                assert_eq!(
                    group(G::Dp),
                    (0..dp).map(|x| at(x, p, c, e, t)).collect::<Vec<_>>()
                );
                // cp_dp_group: grid[:, p, :, e, t].flatten(), DP outer, CP inner.
                let mut cp_dp: Vec<u64> = (0..dp)
                    .flat_map(|x| (0..cp).map(move |y| (x, y)))
                    .map(|(x, y)| at(x, p, y, e, t))
                    .collect();
                let mut mine = group(G::DpCp);
                cp_dp.sort_unstable();
                mine.sort_unstable();
                assert_eq!(mine, cp_dp);
            }
        }
    }
}
