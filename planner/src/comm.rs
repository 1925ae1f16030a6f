//! Collective communication: where a group's ranks sit, and how long a collective
//! takes on them.
//!
//! Placement follows the rank order (Megatron's default `tp-cp-ep-dp-pp`: TP ranks
//! are consecutive, then CP, then DP, then PP). A group with stride `s` and `n`
//! members puts `domain / s` of them in each NVLink domain when `s < domain`, one
//! per domain otherwise.
//!
//! Time is a latency-bandwidth model using nccl-tests' bus-bandwidth convention
//! (NCCL `doc/PERFORMANCE.md`): an all-reduce of `S` bytes on `n` ranks moves
//! `2(n-1)/n * S` per rank, all-gather and reduce-scatter `(n-1)/n * S` (S the full
//! gathered size), all-to-all `(n-1)/n * S` (S what a rank sends in total).
//! Across domains, the `k` members a domain contributes each drive their own NIC,
//! so the group gets `k` NICs per domain. NCCL picks between a flat ring and a
//! hierarchical (tree / NVLS-tree) all-reduce; we take the faster of the two.
//!
//! The network's bus bandwidth and latency per step for all-reduce, all-gather and
//! reduce-scatter depend on how many domains the group spans where the profile
//! measured them so (`network.by_domains`, [`HardwareProfile::network_collective`]):
//! on AWS EFA both fall off with the node count (Hugging Face's p5 cluster: all-gather
//! bus bandwidth 185, 119 and 69 GB/s at 2, 4 and 8 nodes, the smallest all-reduce
//! 55, 121 and 180 us). Without such points they are the same at every count.

use crate::hardware::HardwareProfile;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Collective {
    AllReduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    SendRecv,
}

/// Where a communication group's members sit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// Members of the group.
    pub size: u64,
    /// Members inside one NVLink domain.
    pub per_domain: u64,
    /// NVLink domains the group spans.
    pub domains: u64,
}

/// Which link limits a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// All members in one NVLink domain.
    Nvlink,
    /// Members in several domains: the network is on the path.
    Network,
    /// Group of one: no communication.
    Local,
}

impl Placement {
    /// Places a group of `size` ranks spaced `stride` apart on domains of `domain` GPUs.
    pub fn new(size: u64, stride: u64, domain: u64) -> Placement {
        let size = size.max(1);
        let stride = stride.max(1);
        let per_domain = if size == 1 || stride >= domain {
            1
        } else {
            (domain / stride).clamp(1, size)
        };
        Placement {
            size,
            per_domain,
            domains: size.div_ceil(per_domain),
        }
    }

    /// A group of `outer.size` copies of `inner`, each copy a whole `inner` span
    /// further on (e.g. ScaleTorch's CP x DP group: CP ranks TP apart, DP copies
    /// TP x CP x PP apart). Members per domain multiply: where the outer stride is
    /// below the domain, whole inner groups share it.
    pub fn nested(inner: Placement, outer: Placement) -> Placement {
        let size = inner.size * outer.size;
        let per_domain = (inner.per_domain * outer.per_domain).clamp(1, size.max(1));
        Placement {
            size,
            per_domain,
            domains: size.div_ceil(per_domain),
        }
    }

    pub fn tier(&self) -> Tier {
        if self.size <= 1 {
            Tier::Local
        } else if self.domains == 1 {
            Tier::Nvlink
        } else {
            Tier::Network
        }
    }
}

/// Steps of latency for a phase over `n` ranks: a ring needs n-1, NCCL's tree and
/// PAT algorithms about 2 log2(n); NCCL uses the latter when latency dominates.
pub fn latency_steps(n: u64) -> f64 {
    let ring = (n - 1) as f64;
    let log = 2.0 * (n as f64).log2().ceil();
    ring.min(log.max(1.0))
}

/// Seconds for one collective of `bytes` on a group placed as `p`.
pub fn collective_secs(hw: &HardwareProfile, c: Collective, bytes: f64, p: Placement) -> f64 {
    if p.size <= 1 || bytes <= 0.0 {
        return 0.0;
    }
    let e = &hw.efficiency;
    let n = p.size as f64;
    let k = p.per_domain as f64;
    let d = p.domains as f64;
    let nvl_ring = hw.node.nvlink_gbytes_per_s * 1e9 * e.nvlink_busbw;
    let nvl_alpha = e.nvlink_latency_us * 1e-6;
    let net_alpha = hw.network.latency_us * 1e-6;
    // Ring and tree collectives across the network, at the group's domain count.
    let (coll_busbw, coll_latency_us) = hw.network_collective(p.domains);
    let coll_alpha = coll_latency_us * 1e-6;
    // Bandwidth the group gets across the network: one NIC per member in a domain.
    let net = hw.network.nic_gbytes_per_s * 1e9 * coll_busbw * k;
    let nvls = if hw.node.nvls {
        Some(hw.node.nvlink_gbytes_per_s * 1e9 * e.nvls_busbw)
    } else {
        None
    };

    match c {
        Collective::SendRecv => {
            if p.domains > 1 {
                bytes / (hw.network.nic_gbytes_per_s * 1e9 * e.network_busbw) + net_alpha
            } else {
                bytes / (hw.node.nvlink_gbytes_per_s * 1e9 * e.nvlink_busbw) + nvl_alpha
            }
        }
        Collective::AllReduce | Collective::AllGather | Collective::ReduceScatter => {
            let phases = if c == Collective::AllReduce { 2.0 } else { 1.0 };
            let factor = phases * (n - 1.0) / n;
            if p.domains == 1 {
                let latency = phases * latency_steps(p.size) * nvl_alpha;
                let ring = factor * bytes / nvl_ring + latency;
                return match (c, nvls) {
                    // NVLS all-reduce: each GPU's link carries its whole buffer into
                    // the switch and the whole result back, plus the 1/n slice it
                    // reduces and multicasts, so no bus bandwidth measured on 8 GPUs
                    // lets it beat (1 + 1/n) S over the link; on 2 GPUs that bound is
                    // below the ring, which NCCL then runs.
                    (Collective::AllReduce, Some(b)) => {
                        let link = hw.node.nvlink_gbytes_per_s * 1e9;
                        let nvls = (factor * bytes / b).max((1.0 + 1.0 / n) * bytes / link);
                        ring.min(nvls + latency)
                    }
                    _ => ring,
                };
            }
            // Flat ring over all n ranks: every NIC carries factor * S / k. NCCL runs
            // all-gather and reduce-scatter as a ring (n - 1 steps of latency), or
            // with PAT's logarithmic steps where each node holds one rank of the
            // group (NCCL 2.23 release notes: PAT for AllGather and ReduceScatter at
            // one GPU per node); it has no tree for them.
            //
            // Every ring step pays the network's step latency, not only the d - 1
            // steps that cross a node as NCCL's tuning model charges them
            // (src/graph/tuning.cc:411-412 at 5067397c). Measured both ways: on
            // Hugging Face's p5 cluster a 256 MiB ring all-gather over 64 nodes takes
            // 24 ms, longer than that cluster's all-reduce of twice the data (16 ms),
            // which a cost per ring step explains and NCCL's form does not; on another
            // p5 cluster (NCCL 2.27.7 with AWS's tuner) 32 MiB all-gathers over 2-16
            // nodes run 1.7-2.2x faster than this form prices them with that
            // profile's figures. The by_domains figures are fitted under this form;
            // changing it means refitting them.
            if c != Collective::AllReduce {
                let steps = if p.per_domain == 1 {
                    latency_steps(p.size)
                } else {
                    (n - 1.0).max(1.0)
                };
                return factor * bytes / net + steps * coll_alpha;
            }
            let ring = factor * bytes / net + phases * latency_steps(p.size) * coll_alpha;
            // Hierarchical (NCCL tree / NVLS-tree): reduce-scatter inside the domain,
            // collective across domains on S/k per member, all-gather inside the
            // domain; NCCL pipelines the phases, so the slower one sets the time.
            let intra = if p.per_domain > 1 {
                phases * (k - 1.0) / k * bytes / nvl_ring
                    + phases * latency_steps(p.per_domain) * nvl_alpha
            } else {
                0.0
            };
            let inter = phases * (d - 1.0) / d * bytes / net
                + phases * latency_steps(p.domains) * coll_alpha;
            ring.min(intra.max(inter))
        }
        Collective::AllToAll => {
            // A rank keeps 1/n of its data, sends (k-1)/n over NVLink and (n-k)/n
            // over its NIC; both run at once.
            let over_nvl = (k - 1.0) / n * bytes / nvl_ring;
            if p.domains == 1 {
                return over_nvl + nvl_alpha * latency_steps(p.size);
            }
            let over_net =
                (n - k) / n * bytes / (hw.network.nic_gbytes_per_s * 1e9 * e.network_busbw);
            over_nvl.max(over_net) + net_alpha * latency_steps(p.size)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::builtin_profile;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol * b.abs()
    }

    #[test]
    fn placement_follows_stride() {
        // TP 8 on 8-GPU nodes: one domain.
        assert_eq!(
            Placement::new(8, 1, 8),
            Placement {
                size: 8,
                per_domain: 8,
                domains: 1
            }
        );
        // DP with TP 8 under it: one member per node.
        assert_eq!(
            Placement::new(16, 8, 8),
            Placement {
                size: 16,
                per_domain: 1,
                domains: 16
            }
        );
        // DP 16 with TP 2: 4 per node over 4 nodes.
        assert_eq!(
            Placement::new(16, 2, 8),
            Placement {
                size: 16,
                per_domain: 4,
                domains: 4
            }
        );
        // NVL72 rack: TP 4 x DP 18 inside one domain of 72.
        assert_eq!(Placement::new(18, 4, 72).tier(), Tier::Nvlink);
        assert_eq!(Placement::new(1, 1, 8).tier(), Tier::Local);
        // ScaleTorch's CP x DP group, TP 2 CP 2 PP 2 DP 4 on 8-GPU nodes: CP pairs
        // {0,2}+8d, so each node holds one pair and the group spans 4 nodes.
        let g = Placement::nested(Placement::new(2, 2, 8), Placement::new(4, 8, 8));
        assert_eq!((g.size, g.per_domain, g.domains), (8, 2, 4));
        // TP 1 CP 2 PP 1 DP 4: CP pairs two apart... DP copies 2 apart, all in one node.
        let g = Placement::nested(Placement::new(2, 1, 8), Placement::new(4, 2, 8));
        assert_eq!((g.size, g.per_domain, g.domains), (8, 8, 1));
    }

    #[test]
    fn all_reduce_on_nvlink_matches_bus_bandwidth() {
        // 8x A100 ring all-reduce of 1 GiB: bus bandwidth 0.78 * 300 GB/s.
        let hw = builtin_profile("a100-80g").unwrap();
        let s = 1u64 << 30;
        let t = collective_secs(
            &hw,
            Collective::AllReduce,
            s as f64,
            Placement::new(8, 1, 8),
        );
        let busbw = 2.0 * 7.0 / 8.0 * s as f64 / t / 1e9;
        assert!(close(busbw, 234.0, 0.01), "busbw {busbw}");
        // H100 uses NVLS for all-reduce: 478.9 GB/s published (Azure ND H100 v5, collectives.csv).
        let hw = builtin_profile("h100-sxm").unwrap();
        let t = collective_secs(
            &hw,
            Collective::AllReduce,
            8.0 * s as f64,
            Placement::new(8, 1, 8),
        );
        let busbw = 2.0 * 7.0 / 8.0 * 8.0 * s as f64 / t / 1e9;
        assert!(close(busbw, 478.9, 0.01), "busbw {busbw}");
    }

    #[test]
    fn hand_computed_collectives() {
        let hw = builtin_profile("h100-sxm").unwrap();
        let nic = 50e9 * 0.9;
        let nvl = 450e9 * 0.81;
        let s = 1e9;
        // Reduce-scatter over 4 GPUs of one node: 3/4 S over the ring bandwidth.
        let t = collective_secs(&hw, Collective::ReduceScatter, s, Placement::new(4, 1, 8));
        assert!(close(t, 0.75 * s / nvl + 3.0 * 1.5e-6, 1e-9), "{t}");
        // All-gather across 4 nodes, one member per node: one NIC, hierarchical with
        // nothing inside the node = ring over 4: 3/4 S / nic.
        let t = collective_secs(&hw, Collective::AllGather, s, Placement::new(4, 8, 8));
        assert!(close(t, 0.75 * s / nic + 3.0 * 5e-6, 1e-9), "{t}");
        // All-reduce over 2 nodes x 8: hierarchical beats the flat ring. The
        // published 2-node H100 figure (338.8 GB/s busbw on 8x200 Gb/s) is what this
        // formula gives for that network: 2*15/16 / (2*1/2 / (8*25*0.9)) = 337.5.
        let p = Placement::new(16, 1, 8);
        let t = collective_secs(&hw, Collective::AllReduce, s, p);
        let intra = 2.0 * 7.0 / 8.0 * s / nvl + 2.0 * 6.0 * 1.5e-6;
        let inter = 2.0 * 0.5 * s / (8.0 * nic) + 2.0 * 1.0 * 5e-6;
        assert!(
            close(t, intra.max(inter), 1e-9),
            "{t} vs {}",
            intra.max(inter)
        );
        // All-to-all over 16 ranks, 8 per node: 8/16 of the data leaves the node.
        let t = collective_secs(&hw, Collective::AllToAll, s, p);
        let expect = (7.0 / 16.0 * s / nvl).max(8.0 / 16.0 * s / nic) + 8.0 * 5e-6;
        assert!(close(t, expect, 1e-9), "{t} vs {expect}");
        // Point-to-point across nodes.
        let t = collective_secs(&hw, Collective::SendRecv, s, Placement::new(2, 64, 8));
        assert!(close(t, s / nic + 5e-6, 1e-9));
        // A group of one costs nothing.
        assert_eq!(
            collective_secs(&hw, Collective::AllReduce, s, Placement::new(1, 1, 8)),
            0.0
        );
    }

    #[test]
    fn network_points_price_collectives_by_the_domains_they_span() {
        let mut hw = builtin_profile("h100-sxm").unwrap();
        hw.network.by_domains = vec![
            crate::hardware::NetworkPoint {
                domains: 2,
                busbw: 0.6,
                latency_us: 20.0,
            },
            crate::hardware::NetworkPoint {
                domains: 4,
                busbw: 0.3,
                latency_us: 30.0,
            },
        ];
        let s = 1e9;
        // All-gather over 2 nodes x 8: a ring of 16 at the 2-domain figures.
        let t = collective_secs(&hw, Collective::AllGather, s, Placement::new(16, 1, 8));
        let expect = 15.0 / 16.0 * s / (50e9 * 0.6 * 8.0) + 15.0 * 20e-6;
        assert!(close(t, expect, 1e-9), "{t} vs {expect}");
        // Over 4 nodes, one member each: the 4-domain figures.
        let t = collective_secs(&hw, Collective::ReduceScatter, s, Placement::new(4, 8, 8));
        let expect = 0.75 * s / (50e9 * 0.3) + 3.0 * 30e-6;
        assert!(close(t, expect, 1e-9), "{t} vs {expect}");
        // All-reduce over 4 nodes x 8: the hierarchical form, its network phase at
        // the 4-domain figures.
        let t = collective_secs(&hw, Collective::AllReduce, s, Placement::new(32, 1, 8));
        let intra = 2.0 * 7.0 / 8.0 * s / (450e9 * 0.81) + 2.0 * 6.0 * 1.5e-6;
        let inter = 2.0 * 0.75 * s / (50e9 * 0.3 * 8.0) + 2.0 * 3.0 * 30e-6;
        assert!(close(t, intra.max(inter), 1e-9), "{t}");
        // All-to-all and point-to-point keep the profile's single figures.
        let plain = builtin_profile("h100-sxm").unwrap();
        for (c, p) in [
            (Collective::AllToAll, Placement::new(16, 1, 8)),
            (Collective::SendRecv, Placement::new(2, 64, 8)),
        ] {
            assert_eq!(
                collective_secs(&hw, c, s, p),
                collective_secs(&plain, c, s, p)
            );
        }
        // Inside one node nothing changes.
        let p = Placement::new(8, 1, 8);
        assert_eq!(
            collective_secs(&hw, Collective::AllGather, s, p),
            collective_secs(&plain, Collective::AllGather, s, p)
        );
    }

    /// The aws-p5-hf profile against the measurements of Hugging Face's p5 cluster it
    /// was built from (all-gather by node count, the smallest all-reduce by node
    /// count, inside one node) and the ones held out (reduce-scatter; all-reduce,
    /// which the model prices as its hierarchical form).
    #[test]
    fn aws_p5_hf_reproduces_its_cluster_measurements() {
        let hw = builtin_profile("aws-p5-hf").unwrap();
        let s = (256u64 << 20) as f64;
        let busbw = |c: Collective, nodes: u64| {
            let n = 8 * nodes;
            let t = collective_secs(&hw, c, s, Placement::new(n, 1, 8));
            let phases = if c == Collective::AllReduce { 2.0 } else { 1.0 };
            phases * (n - 1) as f64 / n as f64 * s / t / 1e9
        };
        let table = [
            // nodes, all-gather, reduce-scatter, all-reduce (GB/s busbw, 256 MB)
            (1, 249.8, 249.7, 436.0),
            (2, 184.6, 181.6, 361.7),
            (4, 119.0, 115.8, 160.1),
            (8, 69.0, 68.6, 99.6),
            (16, 55.0, 54.5, 84.7),
            (32, 28.0, 27.9, 64.9),
        ];
        for (nodes, ag, rs, ar) in table {
            let (m_ag, m_rs, m_ar) = (
                busbw(Collective::AllGather, nodes),
                busbw(Collective::ReduceScatter, nodes),
                busbw(Collective::AllReduce, nodes),
            );
            assert!(
                close(m_ag, ag, 0.01),
                "{nodes} nodes: all-gather {m_ag} vs {ag}"
            );
            assert!(
                close(m_rs, rs, 0.05),
                "{nodes} nodes: reduce-scatter {m_rs} vs {rs}"
            );
            assert!(
                close(m_ar, ar, 0.30),
                "{nodes} nodes: all-reduce {m_ar} vs {ar}"
            );
        }
        // The smallest all-reduce, inside one node and across 2 to 16.
        for (nodes, us) in [(1, 12.91), (2, 55.45), (4, 120.6), (8, 179.9), (16, 234.9)] {
            let t = collective_secs(
                &hw,
                Collective::AllReduce,
                8.0,
                Placement::new(8 * nodes, 1, 8),
            );
            assert!(
                close(t * 1e6, us, 0.01),
                "{nodes} nodes: {} us vs {us}",
                t * 1e6
            );
        }
        // A TP group of 16 across two nodes now costs more than on InfiniBand.
        let ib = builtin_profile("h100-sxm").unwrap();
        let p = Placement::new(16, 1, 8);
        let bytes = 33554432.0;
        assert!(
            collective_secs(&hw, Collective::AllGather, bytes, p)
                > 3.0 * collective_secs(&ib, Collective::AllGather, bytes, p)
        );
    }

    /// NVLS's bus bandwidth, measured on 8 GPUs, would put a 2-GPU all-reduce above
    /// the link; the link's traffic bounds it, and the ring is then faster.
    #[test]
    fn nvls_all_reduce_stays_under_the_link() {
        let hw = builtin_profile("h100-sxm").unwrap();
        let s = 1e9;
        for n in [2u64, 4, 8] {
            let t = collective_secs(&hw, Collective::AllReduce, s, Placement::new(n, 1, 8));
            let algbw = s / t / 1e9;
            assert!(algbw < 450.0, "{n} GPUs: {algbw} GB/s");
        }
        let two = collective_secs(&hw, Collective::AllReduce, s, Placement::new(2, 1, 8));
        let ring = s / (450e9 * 0.81) + 2.0 * 1.5e-6;
        assert!(close(two, ring, 1e-9), "{two} vs {ring}");
    }

    #[test]
    fn published_multi_node_all_reduce_is_bounded() {
        // 4 nodes x 8 B200 (8x400 Gb/s): 381.8 GB/s busbw measured (collectives.csv).
        // The model should land within 25% of it.
        let hw = builtin_profile("b200").unwrap();
        let s = 16.0 * (1u64 << 30) as f64;
        let t = collective_secs(&hw, Collective::AllReduce, s, Placement::new(32, 1, 8));
        let busbw = 2.0 * 31.0 / 32.0 * s / t / 1e9;
        assert!((busbw - 381.8).abs() / 381.8 < 0.25, "busbw {busbw}");
    }
}
