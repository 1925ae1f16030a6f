//! The routed-expert layer: top-k routing with frozen gates, the tokens' all-to-all
//! over EP, expert tensor parallelism over ETP, and its backward.

use super::{gather_rows, gemm, CommKind, Dims, LayerParams, MoeSaved, Shard, WJob, R};
use crate::tensor::Mat;

/// The rows of `x` this rank routes: its SP shard, or its 1/tp slice of replicated rows.
pub(super) fn moe_slice(s: &Shard, x: &Mat) -> (usize, usize) {
    if s.sp || s.tp_n() == 1 {
        (0, x.rows)
    } else {
        let n = x.rows / s.tp_n();
        (s.tp.me * n, (s.tp.me + 1) * n)
    }
}

pub(super) fn moe_forward(s: &Shard, d: &Dims, p: &LayerParams, x: &Mat) -> R<(Mat, MoeSaved)> {
    let (a, b) = moe_slice(s, x);
    let xs = x.rows_range(a, b);
    let logits = gemm(s, "router", &xs, false, &p.router, false);
    let routes: Vec<Vec<(usize, f32)>> = (0..xs.rows)
        .map(|t| top_k(logits.row(t), d.top_k))
        .collect();
    let per = d.experts / s.ep.size();
    // Dispatch: to each EP member, rows grouped by its local expert, in token order.
    let mut counts = vec![vec![0usize; per]; s.ep.size()];
    let mut parts: Vec<Vec<f32>> = vec![Vec::new(); s.ep.size()];
    for (owner, (part, count)) in parts.iter_mut().zip(counts.iter_mut()).enumerate() {
        for (le, n) in count.iter_mut().enumerate() {
            for (t, r) in routes.iter().enumerate() {
                if r.iter().any(|&(e, _)| e == owner * per + le) {
                    part.extend_from_slice(xs.row(t));
                    *n += 1;
                }
            }
        }
        part.extend(count.iter().map(|&c| c as f32));
    }
    let got = ep_all_to_all(s, parts)?;
    let mut recv_counts = Vec::new();
    let mut bodies = Vec::new();
    for g in &got {
        let (body, tail) = g.split_at(g.len() - per);
        recv_counts.push(tail.iter().map(|&c| c as usize).collect::<Vec<usize>>());
        bodies.push(body);
    }
    let mine = by_expert(&bodies, &recv_counts, d.hidden)?;
    // Expert TP: every member of the group computes its FFN columns for the rows
    // all of them received, then the partial outputs are summed back to owners.
    let (gathered, etp_counts) = etp_gather(s, &mine, d.hidden)?;
    let mut rows = Vec::new();
    let mut partial: Vec<Mat> = Vec::new();
    for (le, xr) in gathered.into_iter().enumerate() {
        let (w1, w2) = &p.experts[le];
        let h = gemm(s, "moe_experts", &xr, false, w1, false);
        let mut act = h.clone();
        act.data.iter_mut().for_each(|z| *z = super::silu(*z));
        partial.push(gemm(s, "moe_experts", &act, false, w2, false));
        rows.push((xr, h));
    }
    let outs = etp_reduce_scatter(s, &partial, &etp_counts, d.hidden)?;
    // Combine: send each member its rows back, in the order it sent them.
    let back = split_back(&outs, &recv_counts, d.hidden);
    let returned = ep_all_to_all(s, back)?;
    let mut y = Mat::zeros(xs.rows, d.hidden);
    for (owner, ret) in returned.iter().enumerate() {
        let mut i = 0;
        for le in 0..per {
            for (t, r) in routes.iter().enumerate() {
                if let Some(&(_, g)) = r.iter().find(|&&(e, _)| e == owner * per + le) {
                    for (yy, v) in y
                        .row_mut(t)
                        .iter_mut()
                        .zip(&ret[i * d.hidden..(i + 1) * d.hidden])
                    {
                        *yy += g * v;
                    }
                    i += 1;
                }
            }
        }
    }
    let y = if s.sp || s.tp_n() == 1 {
        y
    } else {
        gather_rows(s, s.tp, CommKind::Tp, &y)?
    };
    Ok((
        y,
        MoeSaved {
            routes,
            rows,
            counts: recv_counts,
            etp_counts,
        },
    ))
}

/// Expert-TP all-gather of each local expert's rows: per expert, the rows of every
/// group member in member order, and how many each member gave (`[member][expert]`).
/// Row counts differ between members, so it runs as an all-to-all of the same
/// parts, each closed by its counts.
pub(super) fn etp_gather(s: &Shard, mine: &[Mat], hidden: usize) -> R<(Vec<Mat>, Vec<Vec<usize>>)> {
    let n = s.etp.size();
    if n == 1 {
        return Ok((mine.to_vec(), vec![mine.iter().map(|m| m.rows).collect()]));
    }
    let mut part: Vec<f32> = mine.iter().flat_map(|m| m.data.iter().copied()).collect();
    part.extend(mine.iter().map(|m| m.rows as f32));
    let t = s.rec.start();
    let got = s.etp.all_to_all(s.mesh, vec![part; n])?;
    // nccl-tests convention: the all-gather's output buffer.
    s.rec.comm(
        CommKind::Etp,
        "all_gather",
        n,
        got.iter().map(|g| g.len() * 4).sum(),
        t,
    );
    let per = mine.len();
    let mut counts = Vec::with_capacity(n);
    let mut bodies = Vec::with_capacity(n);
    for g in &got {
        let (body, tail) = g.split_at(g.len() - per);
        counts.push(tail.iter().map(|&x| x as usize).collect::<Vec<usize>>());
        bodies.push(body);
    }
    Ok((by_expert(&bodies, &counts, hidden)?, counts))
}

/// Per local expert, the rows of every member in member order, from per-member
/// bodies laid out expert by expert with `counts[member][expert]` rows each (the
/// inverse of [`split_back`]).
pub(super) fn by_expert(bodies: &[&[f32]], counts: &[Vec<usize>], hidden: usize) -> R<Vec<Mat>> {
    let per = counts.first().map_or(0, Vec::len);
    (0..per)
        .map(|le| {
            let mut data = Vec::new();
            for (body, c) in bodies.iter().zip(counts) {
                let before: usize = c[..le].iter().sum();
                data.extend_from_slice(&body[before * hidden..(before + c[le]) * hidden]);
            }
            Mat::from_vec(data.len() / hidden, hidden, data)
        })
        .collect()
}

/// Expert-TP reduce-scatter, the transpose of [`etp_gather`]: each member gets the
/// sum over the group of the partial rows it gave.
pub(super) fn etp_reduce_scatter(
    s: &Shard,
    full: &[Mat],
    counts: &[Vec<usize>],
    hidden: usize,
) -> R<Vec<Mat>> {
    let n = s.etp.size();
    if n == 1 {
        return Ok(full.to_vec());
    }
    let parts = split_back(full, counts, hidden);
    let bytes = parts.iter().map(|p| p.len() * 4).sum();
    let t = s.rec.start();
    let got = s.etp.all_to_all(s.mesh, parts)?;
    s.rec.comm(CommKind::Etp, "reduce_scatter", n, bytes, t);
    let mine = &counts[s.etp.me];
    let mut out: Vec<Mat> = mine.iter().map(|&k| Mat::zeros(k, hidden)).collect();
    for g in &got {
        let mut off = 0;
        for (le, o) in out.iter_mut().enumerate() {
            let k = mine[le] * hidden;
            for (x, v) in o.data.iter_mut().zip(&g[off..off + k]) {
                *x += v;
            }
            off += k;
        }
    }
    Ok(out)
}

/// Per member, the rows each local expert computed for it, concatenated.
pub(super) fn split_back(outs: &[Mat], counts: &[Vec<usize>], hidden: usize) -> Vec<Vec<f32>> {
    let mut back = vec![Vec::new(); counts.len()];
    for (le, out) in outs.iter().enumerate() {
        let mut row = 0;
        for (m, c) in counts.iter().enumerate() {
            back[m].extend_from_slice(&out.data[row * hidden..(row + c[le]) * hidden]);
            row += c[le];
        }
    }
    back
}

pub(super) fn ep_all_to_all(s: &Shard, parts: Vec<Vec<f32>>) -> R<Vec<Vec<f32>>> {
    if s.ep.size() == 1 {
        return Ok(parts);
    }
    let bytes = parts.iter().map(|p| p.len() * 4).sum();
    let t = s.rec.start();
    let out = s.ep.all_to_all(s.mesh, parts)?;
    s.rec
        .comm(CommKind::Ep, "all_to_all", s.ep.size(), bytes, t);
    Ok(out)
}

/// The `k` largest logits (ties to the lower index) with softmax gates over them.
pub fn top_k(logits: &[f32], k: usize) -> Vec<(usize, f32)> {
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    idx.truncate(k);
    let mx = idx
        .iter()
        .map(|&i| logits[i])
        .fold(f32::NEG_INFINITY, f32::max);
    let z: f32 = idx.iter().map(|&i| (logits[i] - mx).exp()).sum();
    idx.into_iter()
        .map(|i| (i, (logits[i] - mx).exp() / z))
        .collect()
}

pub(super) fn moe_backward(
    s: &Shard,
    d: &Dims,
    p: &LayerParams,
    layer: usize,
    m: &MoeSaved,
    dout: &Mat,
    wjobs: &mut Vec<WJob>,
) -> R<Mat> {
    let (a, b) = moe_slice(s, dout);
    let dys = dout.rows_range(a, b);
    let per = d.experts / s.ep.size();
    let mut parts: Vec<Vec<f32>> = vec![Vec::new(); s.ep.size()];
    for (owner, part) in parts.iter_mut().enumerate() {
        for le in 0..per {
            for (t, r) in m.routes.iter().enumerate() {
                if let Some(&(_, g)) = r.iter().find(|&&(e, _)| e == owner * per + le) {
                    part.extend(dys.row(t).iter().map(|v| g * v));
                }
            }
        }
    }
    let got = ep_all_to_all(s, parts)?;
    let bodies: Vec<&[f32]> = got.iter().map(Vec::as_slice).collect();
    let mine = by_expert(&bodies, &m.counts, d.hidden)?;
    // Expert TP: the output's reduce-scatter transposes to an all-gather of the
    // gradient, the input's all-gather to a reduce-scatter of the partial input
    // gradients.
    let (gathered, _) = etp_gather(s, &mine, d.hidden)?;
    let mut partial = Vec::new();
    for (le, dy) in gathered.into_iter().enumerate() {
        let (w1, w2) = &p.experts[le];
        let (xr, h) = &m.rows[le];
        let mut act = h.clone();
        act.data.iter_mut().for_each(|z| *z = super::silu(*z));
        let mut dh = gemm(s, "moe_experts", &dy, false, w2, true);
        for (g, hv) in dh.data.iter_mut().zip(&h.data) {
            *g *= super::silu_grad(*hv);
        }
        wjobs.push(WJob {
            layer,
            slot: 100 + 2 * le + 1,
            class: "moe_experts",
            a: act,
            g: dy,
        });
        partial.push(gemm(s, "moe_experts", &dh, false, w1, true));
        wjobs.push(WJob {
            layer,
            slot: 100 + 2 * le,
            class: "moe_experts",
            a: xr.clone(),
            g: dh,
        });
    }
    let douts = etp_reduce_scatter(s, &partial, &m.etp_counts, d.hidden)?;
    let back = split_back(&douts, &m.counts, d.hidden);
    let returned = ep_all_to_all(s, back)?;
    let mut dx = Mat::zeros(dys.rows, d.hidden);
    for (owner, ret) in returned.iter().enumerate() {
        let mut i = 0;
        for le in 0..per {
            for (t, r) in m.routes.iter().enumerate() {
                if r.iter().any(|&(e, _)| e == owner * per + le) {
                    for (x, v) in dx
                        .row_mut(t)
                        .iter_mut()
                        .zip(&ret[i * d.hidden..(i + 1) * d.hidden])
                    {
                        *x += v;
                    }
                    i += 1;
                }
            }
        }
    }
    if s.sp || s.tp_n() == 1 {
        Ok(dx)
    } else {
        gather_rows(s, s.tp, CommKind::Tp, &dx)
    }
}
