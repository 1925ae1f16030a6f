//! The HTML report: generated for a dense and an MoE search, checked structurally,
//! and rendered in headless Chromium.

use std::path::{Path, PathBuf};
use std::process::Command;

use sextant_reports::SECTIONS;

use crate::common::chromium;

fn sextant(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sextant"))
        .args(args)
        .output()
        .expect("binary runs")
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sextant-report-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

/// A small well-formedness check for the HTML and SVG the report emits: every
/// opened element is closed in order (void and self-closing elements aside).
fn balanced(html: &str) -> Result<(), String> {
    const VOID: &[&str] = &["meta", "br", "hr", "img", "link", "input"];
    let mut stack: Vec<String> = Vec::new();
    let mut rest = html;
    while let Some(i) = rest.find('<') {
        rest = &rest[i + 1..];
        let end = rest.find('>').ok_or("unterminated tag")?;
        let tag = &rest[..end];
        rest = &rest[end + 1..];
        if tag.starts_with('!') {
            continue;
        }
        // A script's text is not markup: skip to its end tag.
        if tag == "script" || tag.starts_with("script ") {
            let close = rest.find("</script>").ok_or("unclosed <script>")?;
            rest = &rest[close + "</script>".len()..];
            continue;
        }
        if let Some(name) = tag.strip_prefix('/') {
            let open = stack
                .pop()
                .ok_or_else(|| format!("</{name}> closes nothing"))?;
            if open != name.trim() {
                return Err(format!("</{name}> closes <{open}>"));
            }
            continue;
        }
        let name = tag
            .split(|c: char| c.is_whitespace() || c == '/')
            .next()
            .unwrap_or("")
            .to_string();
        if tag.ends_with('/') || VOID.contains(&name.as_str()) {
            continue;
        }
        stack.push(name);
    }
    if stack.is_empty() {
        Ok(())
    } else {
        Err(format!("unclosed: {stack:?}"))
    }
}

fn check_structure(html: &str) {
    assert!(html.starts_with("<!DOCTYPE html>") && html.trim_end().ends_with("</html>"));
    balanced(html).unwrap();
    for (id, title) in SECTIONS {
        assert!(
            html.contains(&format!("<section id=\"{id}\">")),
            "section {id} missing"
        );
        assert!(html.contains(title), "heading {title} missing");
    }
    // Every chart has content: at least a handful of drawn shapes.
    let svgs: Vec<&str> = html
        .split("<svg")
        .skip(1)
        .map(|s| &s[..s.find("</svg>").expect("closed svg")])
        .collect();
    assert!(svgs.len() >= 4, "expected 4 charts, found {}", svgs.len());
    for svg in svgs.iter().filter(|s| !s.contains("class=\"sens")) {
        let shapes = svg.matches("<rect").count()
            + svg.matches("<circle").count()
            + svg.matches("<polyline").count()
            + svg.matches("<path").count();
        // Every chart draws at least a background and one mark with a tooltip;
        // most draw many.
        let marks = svg.matches("data-tip=").count();
        assert!(
            shapes > 10 || (shapes >= 2 && marks >= 1),
            "a chart is (nearly) empty: {shapes} shapes, {marks} marks"
        );
    }
    // Self-contained: one inline script, nothing fetched from anywhere.
    assert_eq!(html.matches("<script").count(), 1, "one script");
    assert!(
        html.contains("<script>(function(){"),
        "the script is inline"
    );
    for bad in [
        "http://",
        "https://",
        "src=",
        "href=",
        "url(",
        "@import",
        "fetch(",
        "XMLHttpRequest",
        "import(",
        "eval(",
    ] {
        assert!(!html.contains(bad), "report contains '{bad}'");
    }
    // What the script drives (tests/it/browser.rs drives it in Chromium).
    for id in [
        "id=\"ranked\"",
        "id=\"ranked-filter\"",
        "id=\"tip\"",
        "id=\"bars\"",
        "id=\"stage-memory\"",
        "id=\"timeline\"",
        "id=\"tl-zoom-in\"",
        "id=\"sources\"",
    ] {
        assert!(html.contains(id), "report lacks {id}");
    }
    assert!(!html.contains("-0.0 ms"), "a negative zero is printed");
    // A searched plan's report zooms into the region that matters.
    if html.contains("valid configurations (shaded") && !html.contains("estimated, not searched") {
        assert!(html.contains("id=\"scatter-zoom\""), "no zoomed scatter");
    }
}

/// The 8B plan at TP 2 PP 2 on 8 GPUs, written to `<tag>-plan.json`, and its run
/// on 8 CPU ranks, `<tag>-run.json`.
fn executed_plan(tag: &str) -> (PathBuf, PathBuf) {
    let plan = tmp(&format!("{tag}-plan.json"));
    let run = tmp(&format!("{tag}-run.json"));
    for p in [&plan, &run] {
        let _ = std::fs::remove_file(p);
    }
    let p = plan.to_str().unwrap();
    let o = sextant(&[
        "estimate", "--model", "8b", "--gpus", "8", "--tp", "2", "--pp", "2", "--json", "--out", p,
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = sextant(&["exec", p, "--ranks", "8", "--out", run.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    (plan, run)
}

/// `report --run RUN.json` fills section 9 with each component predicted and
/// measured (the executor's run of the plan on 8 CPU ranks); a run of another
/// plan is refused in one line.
#[test]
fn report_with_a_measured_run_compares_components() {
    let (plan, run) = executed_plan("run");
    let html = tmp("run-report.html");
    let _ = std::fs::remove_file(&html);
    let p = plan.to_str().unwrap();
    let o = sextant(&[
        "report",
        p,
        "--run",
        run.to_str().unwrap(),
        "-o",
        html.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(&html).unwrap();
    check_structure(&text);
    let nine = &text[text.find("<section id=\"measured\">").unwrap()..];
    let nine = &nine[..nine.find("</section>").unwrap()];
    assert!(nine.contains("id=\"measured-chart\""), "{nine}");
    assert!(!nine.contains("No measured run"), "{nine}");
    for component in ["attention_proj", "mlp", "step"] {
        assert!(
            nine.contains(&format!(">{component}</td>")),
            "{component} missing: {nine}"
        );
    }
    // A run of a different plan: one line naming both files.
    let other = tmp("run-other.json");
    let _ = std::fs::remove_file(&other);
    let o = sextant(&[
        "estimate",
        "--model",
        "8b",
        "--gpus",
        "8",
        "--tp",
        "4",
        "--pp",
        "2",
        "--json",
        "--out",
        other.to_str().unwrap(),
    ]);
    assert!(o.status.success());
    let o = sextant(&[
        "report",
        other.to_str().unwrap(),
        "--run",
        run.to_str().unwrap(),
        "-o",
        tmp("run-other.html").to_str().unwrap(),
        "--force",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("was measured on a different plan"), "{err}");
    // A run of the same file's plan 2: the report is about plan 1.
    let (small, run2) = (tmp("run-small.json"), tmp("run-small-2.json"));
    for f in [&small, &run2] {
        let _ = std::fs::remove_file(f);
    }
    let s = small.to_str().unwrap();
    let o = sextant(&[
        "plan", "--model", "8b", "--gpus", "2", "--top", "3", "--out", s,
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = sextant(&[
        "exec",
        s,
        "--ranks",
        "2",
        "--plan",
        "2",
        "--out",
        run2.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = sextant(&[
        "report",
        s,
        "--run",
        run2.to_str().unwrap(),
        "-o",
        tmp("run-small.html").to_str().unwrap(),
        "--force",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("ran plan 2 of") && err.contains("the report is about plan 1"),
        "{err}"
    );
}

#[test]
fn dense_and_moe_reports_are_complete_and_self_contained() {
    for (label, args) in [
        ("dense", vec!["plan", "--model", "70b", "--gpus", "128"]),
        (
            "moe",
            vec![
                "plan",
                "--model",
                "mixtral-8x22b",
                "--gpus",
                "256",
                "--global-batch",
                "512",
            ],
        ),
    ] {
        let path = tmp(&format!("{label}.html"));
        let _ = std::fs::remove_file(&path);
        let mut a = args.clone();
        a.extend(["--report", path.to_str().unwrap()]);
        let o = sextant(&a);
        assert!(
            o.status.success(),
            "{label}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let html = std::fs::read_to_string(&path).unwrap();
        check_structure(&html);
        // The launch section is for the plan's target (megatron-lm by default).
        assert!(html.contains("<p>For megatron-lm ("), "{label}");
        if label == "moe" {
            assert!(
                html.contains("EP"),
                "MoE report shows no expert parallelism"
            );
        }
    }
}

/// A plan made for torchtitan shows torchtitan's configuration in the report, not
/// Megatron-LM's arguments (or their refusal).
#[test]
fn report_launch_section_follows_the_plan_target() {
    let path = tmp("torchtitan.html");
    let _ = std::fs::remove_file(&path);
    let o = sextant(&[
        "plan",
        "--model",
        "8b",
        "--gpus",
        "64",
        "--target",
        "torchtitan",
        "--loss",
        "compiled",
        "--report",
        path.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let html = std::fs::read_to_string(&path).unwrap();
    assert!(
        html.contains("<p>For torchtitan ("),
        "no torchtitan launch section"
    );
    assert!(html.contains("[compile]"));
    assert!(!html.contains("--loss native or te"));
}

#[test]
fn report_from_a_saved_plan_and_size_at_16384_gpus() {
    let plan = tmp("405b.json");
    let out = tmp("405b.html");
    let _ = std::fs::remove_file(&plan);
    let _ = std::fs::remove_file(&out);
    let o = sextant(&[
        "plan",
        "--model",
        "405b",
        "--gpus",
        "16384",
        "--out",
        plan.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = sextant(&[
        "report",
        plan.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let html = std::fs::read_to_string(&out).unwrap();
    check_structure(&html);
    let size = html.len();
    println!("405B on 16384 GPUs: report {size} bytes");
    assert!(size < 3 * 1024 * 1024, "report is {size} bytes, over 3 MB");
    // Existing output is not replaced without --force.
    let o = sextant(&[
        "report",
        plan.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    // A single estimate also makes a report.
    let est = tmp("est.json");
    let _ = std::fs::remove_file(&est);
    let o = sextant(&[
        "estimate",
        "--model",
        "8b",
        "--gpus",
        "8",
        "--tp",
        "2",
        "--global-batch",
        "64",
        "--out",
        est.to_str().unwrap(),
    ]);
    assert!(o.status.success());
    let est_html = tmp("est.html");
    let _ = std::fs::remove_file(&est_html);
    let o = sextant(&[
        "report",
        est.to_str().unwrap(),
        "-o",
        est_html.to_str().unwrap(),
        "--force",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    check_structure(&std::fs::read_to_string(&est_html).unwrap());
}

/// Fraction of pixels that are not near-white in a PNG.
fn ink(png_path: &Path) -> f64 {
    let decoder = png::Decoder::new(std::fs::File::open(png_path).unwrap());
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    let channels = info.color_type.samples();
    let px = &buf[..info.buffer_size()];
    let total = px.len() / channels;
    let inked = px
        .chunks(channels)
        .filter(|p| p.iter().take(3).any(|&c| c < 200))
        .count();
    inked as f64 / total as f64
}

#[test]
fn report_renders_in_headless_chromium() {
    let Some(browser) = chromium() else {
        if std::env::var_os("SEXTANT_REQUIRE_BROWSER").is_some() {
            panic!("SEXTANT_REQUIRE_BROWSER is set but no Chromium is installed");
        }
        println!("SKIPPED report_renders_in_headless_chromium: Chromium is not installed (bash .ci/run installs Debian's chromium package)");
        return;
    };
    let html = tmp("view.html");
    let _ = std::fs::remove_file(&html);
    let o = sextant(&[
        "plan",
        "--model",
        "70b",
        "--gpus",
        "128",
        "--report",
        html.to_str().unwrap(),
    ]);
    assert!(o.status.success());
    let shot = tmp("view.png");
    let _ = std::fs::remove_file(&shot);
    let profile = tmp("chromium-profile");
    let o = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            &format!("--user-data-dir={}", profile.display()),
            "--window-size=1000,3000",
            &format!("--screenshot={}", shot.display()),
            &format!("file://{}", html.display()),
        ])
        .output()
        .unwrap();
    assert!(
        shot.exists(),
        "no screenshot: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let ink = ink(&shot);
    println!(
        "screenshot {}: {:.1}% of pixels inked",
        shot.display(),
        100.0 * ink
    );
    assert!(
        ink > 0.03,
        "the rendered report looks blank ({:.2}% inked)",
        100.0 * ink
    );
}

/// `report` of a saved plan searches the space the plan file records: a plan
/// searched with `--tp 4,8 --recompute none` gets a sensitivity table of only those
/// TP values and that recomputation (the default space would add TP 1 and 2 and
/// selective and full recomputation).
#[test]
fn report_of_a_saved_plan_shows_the_space_it_searched() {
    let plan = tmp("restricted-plan.json");
    let html = tmp("restricted.html");
    let _ = std::fs::remove_file(&plan);
    let _ = std::fs::remove_file(&html);
    let (p, h) = (plan.to_str().unwrap(), html.to_str().unwrap());
    let o = sextant(&[
        "plan",
        "--model",
        "8b",
        "--gpus",
        "16",
        "--tp",
        "4,8",
        "--recompute",
        "none",
        "--out",
        p,
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = sextant(&["report", p, "-o", h]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(&html).unwrap();
    let held = &text[text.find("held at each value").expect("sensitivity table")..];
    let held = &held[..held.find("</table>").unwrap()];
    let values = |dim: &str| -> Vec<String> {
        let cell = format!("<td class=\"l\">{dim}</td><td>");
        held.match_indices(&cell)
            .map(|(i, _)| {
                let rest = &held[i + cell.len()..];
                rest[..rest.find('<').unwrap()].to_string()
            })
            .collect()
    };
    let mut tp = values("TP");
    tp.sort();
    assert_eq!(tp, ["4", "8"], "{held}");
    assert!(values("RC").iter().all(|v| v == "none"), "{held}");
    assert!(
        !held.contains("RC sel") && !held.contains("RC full"),
        "{held}"
    );
}

/// `compare`'s prediction is what `estimate` says of the configuration the executor
/// ran: the run's model (as executed, cut down) written as a model file and
/// estimated with the run's configuration gives the same step time, to rounding.
#[test]
fn compare_predicts_what_estimate_says_of_the_executed_plan() {
    let (plan, run) = executed_plan("cmp");
    let model = tmp("cmp-model.json");
    let _ = std::fs::remove_file(&model);
    let p = plan.to_str().unwrap();
    let o = sextant(&["compare", p, run.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let cmp: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let predicted = cmp["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["component"] == "step")
        .and_then(|r| r["predicted_secs"].as_f64())
        .expect("a predicted step");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&run).unwrap()).unwrap();
    std::fs::write(&model, serde_json::to_string(&r["model"]).unwrap()).unwrap();
    let c = &r["config"];
    let layers: Vec<String> = c["layout"]["layers"]
        .as_array()
        .expect("the executor records an explicit layout")
        .iter()
        .map(|x| x.to_string())
        .collect();
    let num = |v: &serde_json::Value| v.as_u64().expect("a whole number").to_string();
    let w = &r["workload"];
    let args = [
        "estimate".to_string(),
        "--model".into(),
        model.to_str().unwrap().into(),
        "--gpus".into(),
        num(&r["world_size"]),
        "--gpu".into(),
        r["profile"].as_str().unwrap().into(),
        "--tp".into(),
        num(&c["tp"]),
        "--pp".into(),
        num(&c["pp"]),
        "--mbs".into(),
        num(&c["mbs"]),
        "--seq".into(),
        num(&w["seq"]),
        "--global-batch".into(),
        num(&w["global_batch"]),
        "--zero".into(),
        c["zero"].as_str().unwrap().into(),
        "--recompute".into(),
        c["recompute"].as_str().unwrap().into(),
        "--layers-per-stage".into(),
        layers.join(","),
        "--json".into(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = sextant(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let est: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let step = est["plans"][0]["estimate"]["step_secs"].as_f64().unwrap();
    assert!(
        (step - predicted).abs() <= 1e-9 * step.abs(),
        "compare predicts {predicted} s, estimate {step} s"
    );
}
