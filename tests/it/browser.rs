//! The interactive HTML report driven in headless Chromium over the Chrome DevTools
//! Protocol (CDP) on `--remote-debugging-pipe`: Chromium reads commands from its fd 3
//! and writes answers and events to its fd 4, one JSON object per message, each
//! ended by a NUL byte. A small client here sends commands, waits for each answer
//! with a deadline (a reader thread feeds a channel, so nothing can hang) and keeps
//! every event, so that a test can assert the page logged no error and threw no
//! exception over its whole session.
//!
//! `cdp_harness_drives_a_fixture` proves the client (and the checks the report tests
//! use) on a small hand-written page; the report tests click, type and hover in
//! `sextant plan --report` output at 800 and 1600 px wide.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::io::{AsRawFd, FromRawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{chromium, sextant, stderr, TempDir};

/// The longest wait for one CDP answer or event.
const CALL_TIMEOUT: Duration = Duration::from_secs(15);
/// The longest wait for the page to react to a click, a key or the mouse.
const REACT_TIMEOUT: Duration = Duration::from_secs(5);

/// A pipe whose two ends are close-on-exec here, so that no other child, spawned
/// meanwhile by a test on another thread, inherits them (an inherited write end
/// would keep the reader from ever seeing the end of the file).
fn pipe() -> (File, File) {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into an array of two.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(rc, 0, "pipe2: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just opened by pipe2 and are owned by nothing else.
    unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) }
}

/// Headless Chromium and one CDP session on a page of it.
struct Browser {
    child: Child,
    to: Option<File>,
    from: Receiver<Value>,
    next_id: u64,
    /// Every event received so far, in order of arrival.
    events: Vec<Value>,
    /// The page session commands go to; `None` sends them to the browser.
    session: Option<String>,
    target: Option<String>,
    dir: TempDir,
}

impl Browser {
    /// Starts Chromium, or returns `None` (after printing a SKIPPED line) when it is
    /// not installed and SEXTANT_REQUIRE_BROWSER is not set.
    fn launch(test: &str) -> Option<Browser> {
        let Some(bin) = chromium() else {
            if std::env::var_os("SEXTANT_REQUIRE_BROWSER").is_some() {
                panic!("SEXTANT_REQUIRE_BROWSER is set but no Chromium is installed");
            }
            println!("SKIPPED {test}: Chromium is not installed (bash .ci/run installs Debian's chromium package)");
            return None;
        };
        let dir = TempDir::new(&format!("cdp-{test}"));
        let (cmd_r, cmd_w) = pipe();
        let (resp_r, resp_w) = pipe();
        let (cr, rw) = (cmd_r.as_raw_fd(), resp_w.as_raw_fd());
        let log = File::create(dir.path("chromium.log")).unwrap();
        let mut cmd = Command::new(bin);
        cmd.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--remote-debugging-pipe",
        ])
        .arg(format!("--user-data-dir={}", dir.path("profile").display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
        // SAFETY: between fork and exec the closure makes only async-signal-safe calls
        // (fcntl, dup2) on descriptors that are open until spawn returns, and allocates
        // nothing.
        unsafe {
            cmd.pre_exec(move || {
                // Copy both ends above fd 10 first: neither can then be overwritten by
                // the other's dup2, nor already be 3 or 4 (where dup2 would do nothing
                // and leave it close-on-exec). The copies close at exec.
                let a = libc::fcntl(cr, libc::F_DUPFD_CLOEXEC, 10);
                let b = libc::fcntl(rw, libc::F_DUPFD_CLOEXEC, 10);
                if a < 0 || b < 0 || libc::dup2(a, 3) < 0 || libc::dup2(b, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("Chromium starts");
        // Chromium holds its own copies; the write end of its answers must close here
        // for the reader to see the end when Chromium exits.
        drop(cmd_r);
        drop(resp_w);
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(resp_r);
            loop {
                let mut buf = Vec::new();
                match r.read_until(0, &mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
                if buf.last() == Some(&0) {
                    buf.pop();
                }
                let m = serde_json::from_slice(&buf).unwrap_or_else(|e| {
                    Value::String(format!(
                        "unparsable message ({e}): {}",
                        String::from_utf8_lossy(&buf)
                    ))
                });
                if tx.send(m).is_err() {
                    return;
                }
            }
        });
        Some(Browser {
            child,
            to: Some(cmd_w),
            from: rx,
            next_id: 0,
            events: Vec::new(),
            session: None,
            target: None,
            dir,
        })
    }

    /// The end of Chromium's stderr, for failure messages.
    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path("chromium.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    fn next_message(&mut self, deadline: Instant, what: &str) -> Result<Value, String> {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.from.recv_timeout(left) {
            Ok(Value::String(s)) => Err(format!("{what}: {s}")),
            Ok(m) => Ok(m),
            Err(RecvTimeoutError::Timeout) => Err(format!(
                "{what}: nothing from Chromium within {CALL_TIMEOUT:?}; its log ends:\n{}",
                self.log_tail()
            )),
            Err(RecvTimeoutError::Disconnected) => Err(format!(
                "{what}: Chromium closed its pipe; its log ends:\n{}",
                self.log_tail()
            )),
        }
    }

    /// Sends a command (to the page session when there is one) and returns its
    /// result, or the error Chromium answered, or why no answer came in time. Events
    /// that arrive meanwhile are kept.
    fn try_call(&mut self, method: &str, params: Value) -> Result<Value, String> {
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = json!({"id": id, "method": method, "params": params});
        if let Some(s) = &self.session {
            msg["sessionId"] = json!(s);
        }
        let mut bytes = serde_json::to_vec(&msg).unwrap();
        bytes.push(0);
        self.to
            .as_mut()
            .expect("pipe open")
            .write_all(&bytes)
            .map_err(|e| format!("{method}: writing to Chromium: {e}"))?;
        let deadline = Instant::now() + CALL_TIMEOUT;
        loop {
            let m = self.next_message(deadline, method)?;
            if m.get("id").and_then(Value::as_u64) == Some(id) {
                if let Some(e) = m.get("error") {
                    return Err(format!("{method}: Chromium answered {e}"));
                }
                return Ok(m.get("result").cloned().unwrap_or(Value::Null));
            }
            if m.get("method").is_some() {
                self.events.push(m);
            }
        }
    }

    fn call(&mut self, method: &str, params: Value) -> Value {
        self.try_call(method, params)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Waits for an event of the page session named `method`, among those received
    /// from index `since` on.
    fn wait_event(&mut self, method: &str, since: usize) -> Value {
        let mine = |m: &Value, session: &Option<String>| {
            m["method"] == method
                && m.get("sessionId").and_then(Value::as_str) == session.as_deref()
        };
        if let Some(m) = self.events[since..].iter().find(|m| mine(m, &self.session)) {
            return m.clone();
        }
        let deadline = Instant::now() + CALL_TIMEOUT;
        loop {
            let m = self
                .next_message(deadline, &format!("waiting for {method}"))
                .unwrap_or_else(|e| panic!("{e}"));
            if m.get("method").is_some() {
                self.events.push(m.clone());
                if mine(&m, &self.session) {
                    return m;
                }
            }
        }
    }

    /// Opens `url` in a fresh page `width` x `height` CSS pixels (device scale 1),
    /// closing the previous page, and waits for its load event.
    fn open(&mut self, url: &str, width: u32, height: u32) {
        self.session = None;
        if let Some(t) = self.target.take() {
            self.call("Target.closeTarget", json!({"targetId": t}));
        }
        let t = self.call("Target.createTarget", json!({"url": "about:blank"}));
        let target = t["targetId"].as_str().expect("targetId").to_string();
        let a = self.call(
            "Target.attachToTarget",
            json!({"targetId": target, "flatten": true}),
        );
        self.target = Some(target);
        self.session = Some(a["sessionId"].as_str().expect("sessionId").to_string());
        for m in ["Runtime.enable", "Log.enable", "Page.enable"] {
            self.call(m, json!({}));
        }
        self.call(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": width, "height": height, "deviceScaleFactor": 1, "mobile": false}),
        );
        let since = self.events.len();
        let nav = self.call("Page.navigate", json!({"url": url}));
        assert!(nav.get("errorText").is_none(), "navigating to {url}: {nav}");
        self.wait_event("Page.loadEventFired", since);
        // The load event of about:blank could in principle be the one seen: wait (with
        // a deadline) until the page is the one asked for, fully loaded.
        self.wait_for(
            "the page to load",
            &format!(
                "location.href === {} && document.readyState === 'complete' || location.href",
                json!(url)
            ),
        );
    }

    /// Evaluates a JavaScript expression in the page (awaiting a promise) and returns
    /// its value, or the exception it threw.
    fn try_eval(&mut self, expr: &str) -> Result<Value, String> {
        let r = self.try_call(
            "Runtime.evaluate",
            json!({"expression": expr, "returnByValue": true, "awaitPromise": true}),
        )?;
        if let Some(ex) = r.get("exceptionDetails") {
            let why = ex["exception"]["description"]
                .as_str()
                .or(ex["text"].as_str())
                .unwrap_or("?");
            return Err(format!("{why}\n  in: {expr}"));
        }
        Ok(r["result"].get("value").cloned().unwrap_or(Value::Null))
    }

    fn eval(&mut self, expr: &str) -> Value {
        self.try_eval(expr).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Polls `expr` until it is `true` (bounded by REACT_TIMEOUT); any other value
    /// says what is still wrong and ends up in the failure message.
    fn wait_for(&mut self, what: &str, expr: &str) {
        let deadline = Instant::now() + REACT_TIMEOUT;
        loop {
            let v = self.eval(expr);
            if v == Value::Bool(true) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "waited {REACT_TIMEOUT:?} for {what}; last: {v}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Moves the mouse to the viewport point (x, y), as a real pointer would.
    fn mouse_to(&mut self, x: f64, y: f64) {
        self.call(
            "Input.dispatchMouseEvent",
            json!({"type": "mouseMoved", "x": x, "y": y}),
        );
    }

    /// A PNG of the element `sel` at its page position.
    fn screenshot(&mut self, sel: &str) -> Vec<u8> {
        let r = self.eval(&format!(
            "(() => {{ const e = document.querySelector({s}); e.scrollIntoView({{block: 'center'}}); \
             const r = e.getBoundingClientRect(); \
             return [r.left + scrollX, r.top + scrollY, r.width, r.height]; }})()",
            s = json!(sel)
        ));
        let n = |i: usize| r[i].as_f64().unwrap();
        assert!(n(2) >= 1.0 && n(3) >= 1.0, "{sel} has no size: {r}");
        let shot = self.call(
            "Page.captureScreenshot",
            json!({"format": "png", "captureBeyondViewport": true,
                   "clip": {"x": n(0), "y": n(1), "width": n(2), "height": n(3), "scale": 1}}),
        );
        base64(shot["data"].as_str().expect("screenshot data"))
    }

    /// The errors the page reported over the whole session: exceptions, console
    /// errors and error log entries.
    fn errors(&self) -> Vec<String> {
        self.events
            .iter()
            .filter_map(|m| {
                let p = &m["params"];
                match m["method"].as_str()? {
                    "Runtime.exceptionThrown" => Some(format!(
                        "exception: {}",
                        p["exceptionDetails"]["exception"]["description"]
                            .as_str()
                            .or(p["exceptionDetails"]["text"].as_str())
                            .unwrap_or("?")
                    )),
                    "Runtime.consoleAPICalled" if p["type"] == "error" => {
                        Some(format!("console.error: {}", p["args"]))
                    }
                    "Log.entryAdded" if p["entry"]["level"] == "error" => Some(format!(
                        "log: {} {}",
                        p["entry"]["text"].as_str().unwrap_or("?"),
                        p["entry"]["url"].as_str().unwrap_or("")
                    )),
                    _ => None,
                }
            })
            .collect()
    }

    fn assert_no_errors(&self, context: &str) {
        let e = self.errors();
        assert!(
            e.is_empty(),
            "{context}: the page reported errors:\n{}",
            e.join("\n")
        );
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Closing the command pipe asks Chromium to quit with its helper processes;
        // a browser that does not within a second is killed.
        self.to = None;
        let deadline = Instant::now() + Duration::from_secs(1);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Decodes standard base64 (CDP's screenshots).
fn base64(s: &str) -> Vec<u8> {
    let val = |c: u8| -> u32 {
        (match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }) as u32
    };
    let digits: Vec<u8> = s.bytes().filter(|&c| c != b'=').collect();
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0, |n, (i, &c)| n | val(c) << (18 - 6 * i));
        out.push((n >> 16) as u8);
        if chunk.len() > 2 {
            out.push((n >> 8) as u8);
        }
        if chunk.len() > 3 {
            out.push(n as u8);
        }
    }
    out
}

/// (width, height, fraction of pixels that are not near-white) of a PNG.
fn ink(png_bytes: &[u8]) -> (u32, u32, f64) {
    let mut decoder = png::Decoder::new(std::io::Cursor::new(png_bytes));
    decoder.set_transformations(png::Transformations::EXPAND);
    let mut reader = decoder.read_info().expect("a PNG");
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    let channels = info.color_type.samples();
    let px = &buf[..info.buffer_size()];
    let total = px.len() / channels;
    let inked = px
        .chunks(channels)
        .filter(|p| p.iter().take(3).any(|&c| c < 200))
        .count();
    (info.width, info.height, inked as f64 / total as f64)
}

fn file_url(p: &Path) -> String {
    format!("file://{}", p.display())
}

// ---------------------------------------------------------------------------------
// Checks, each on the open page; the fixture test runs the generic ones too.

/// The `data-v` of every body row of `table` in the column whose header has
/// `data-key` = `key`, in row order.
fn column(b: &mut Browser, table: &str, key: &str) -> Vec<f64> {
    let v = b.eval(&format!(
        "(() => {{ const t = document.querySelector({t}); if (!t) return 'no ' + {t}; \
         const th = t.querySelector('thead th[data-key=' + JSON.stringify({k}) + ']'); \
         if (!th) return 'no header with data-key ' + {k} + '; keys: ' + \
           [...t.querySelectorAll('thead th[data-key]')].map(h => h.dataset.key).join(', '); \
         return [...t.tBodies[0].rows].map(r => {{ const c = r.cells[th.cellIndex]; \
           return c && c.hasAttribute('data-v') ? Number(c.dataset.v) : 'row ' + r.rowIndex + ' has no data-v in ' + {k}; }}); }})()",
        t = json!(table),
        k = json!(key)
    ));
    let rows = v
        .as_array()
        .unwrap_or_else(|| panic!("{table} column {key}: {v}"));
    rows.iter()
        .map(|x| {
            x.as_f64()
                .filter(|f| f.is_finite())
                .unwrap_or_else(|| panic!("{table} column {key}: {x}"))
        })
        .collect()
}

/// Every body row of `table`: its `rank` and its cells (text and `data-v`), in
/// row order.
fn rows(b: &mut Browser, table: &str, rank: &str) -> Vec<(f64, String)> {
    let ranks = column(b, table, rank);
    let cells = b.eval(&format!(
        "[...document.querySelector({t}).tBodies[0].rows].map(r => [...r.cells] \
           .map(c => c.textContent + '=' + c.getAttribute('data-v')).join(' | '))",
        t = json!(table)
    ));
    let cells = cells.as_array().unwrap();
    assert_eq!(cells.len(), ranks.len());
    ranks
        .into_iter()
        .zip(cells.iter().map(|c| c.as_str().unwrap().to_string()))
        .collect()
}

fn ascending(v: &[f64]) -> bool {
    v.windows(2).all(|w| w[0] <= w[1])
}

fn descending(v: &[f64]) -> bool {
    v.windows(2).all(|w| w[0] >= w[1])
}

fn click(b: &mut Browser, sel: &str) {
    let v = b.eval(&format!(
        "(() => {{ const e = document.querySelector({s}); if (!e) return false; e.click(); return true; }})()",
        s = json!(sel)
    ));
    assert_eq!(v, json!(true), "nothing matches {sel} to click");
}

/// `table` starts in rank order (its `rank` column reads 1, 2, ...); clicking the
/// header `key` sorts its rows by that column, a second click the other way; the
/// rows move whole (every row keeps its cells' text and values), and the second
/// click changes the order of the ranks.
fn check_sorting(b: &mut Browser, table: &str, rank: &str, key: &str, context: &str) {
    let before = rows(b, table, rank);
    assert!(
        before.len() >= 2,
        "{context}: {table} has {} rows",
        before.len()
    );
    let ranks: Vec<f64> = before.iter().map(|r| r.0).collect();
    let expect: Vec<f64> = (1..=ranks.len()).map(|i| i as f64).collect();
    assert_eq!(
        ranks, expect,
        "{context}: {table} does not start in rank order"
    );
    let values = column(b, table, key);
    assert!(
        values.iter().any(|&v| v != values[0]),
        "{context}: every row has the same {key}; sorting by it shows nothing"
    );
    let th = format!("{table} thead th[data-key=\"{key}\"]");
    let sorted = |b: &mut Browser, dir: Option<bool>| {
        let deadline = Instant::now() + REACT_TIMEOUT;
        loop {
            let v = column(b, table, key);
            let asc = ascending(&v);
            let desc = descending(&v);
            let ok = match dir {
                None => asc || desc,
                Some(true) => asc,
                Some(false) => desc,
            };
            if ok {
                return asc;
            }
            assert!(
                Instant::now() < deadline,
                "{context}: clicking {th} left {key} unsorted ({}): {v:?}",
                match dir {
                    None => "either way",
                    Some(true) => "ascending, after a descending click",
                    Some(false) => "descending, after an ascending click",
                }
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    click(b, &th);
    let first_asc = sorted(b, None);
    let once = rows(b, table, rank);
    click(b, &th);
    sorted(b, Some(!first_asc));
    let twice = rows(b, table, rank);
    let order = |r: &[(f64, String)]| r.iter().map(|x| x.0).collect::<Vec<_>>();
    assert_ne!(
        order(&once),
        order(&twice),
        "{context}: the second click on {key} did not reorder the rows"
    );
    let canon = |r: &[(f64, String)]| {
        let mut s: Vec<String> = r.iter().map(|x| x.1.clone()).collect();
        s.sort();
        s
    };
    assert_eq!(
        canon(&before),
        canon(&once),
        "{context}: sorting by {key} changed the rows themselves"
    );
    assert_eq!(canon(&before), canon(&twice), "{context}: {key} twice");
}

/// The element an expression finds, hovered with a real mouse move on a point of
/// its box (scrolled into view) where it is on top (the centre, else the nearest of
/// a 5 x 5 grid: a whisker or a label may cover the centre), shows `div#tip` with its `data-tip` text; moving
/// the mouse off every `[data-tip]` hides the tip again.
fn check_tip(b: &mut Browser, find: &str, context: &str) {
    let probe = b.eval(&format!(
        "(() => {{ const e = {find}; if (!e) return 'nothing found by: ' + {f}; \
         e.scrollIntoView({{block: 'center', inline: 'center'}}); const r = e.getBoundingClientRect(); \
         const at = (fx, fy) => {{ const x = r.left + r.width * fx, y = r.top + r.height * fy; \
           const hit = document.elementFromPoint(x, y); \
           return {{x, y, hits: !!hit && hit.closest('[data-tip]') === e, top: hit ? hit.outerHTML.slice(0, 120) : null}}; }}; \
         const fs = [0.5, 0.3, 0.7, 0.15, 0.85]; \
         const p = fs.flatMap(fy => fs.map(fx => at(fx, fy))).find(p => p.hits) || at(0.5, 0.5); \
         return {{...p, w: r.width, h: r.height, tip: e.getAttribute('data-tip')}}; }})()",
        f = json!(find)
    ));
    assert!(probe.is_object(), "{context}: {probe}");
    let what = format!("{context}: hovering {find} (tip {})", probe["tip"]);
    assert!(
        probe["w"].as_f64().unwrap() > 0.0 && probe["h"].as_f64().unwrap() > 0.0,
        "{what}: the element has no box: {probe}"
    );
    assert!(
        probe["tip"].as_str().is_some_and(|t| !t.trim().is_empty()),
        "{what}: no data-tip text"
    );
    assert_eq!(
        probe["hits"],
        json!(true),
        "{what}: the element is covered everywhere; at its centre by {}",
        probe["top"]
    );
    b.mouse_to(probe["x"].as_f64().unwrap(), probe["y"].as_f64().unwrap());
    let tip = json!(probe["tip"].as_str().unwrap());
    b.wait_for(
        &format!("{what} to show the tip"),
        &format!(
            "(() => {{ const t = document.getElementById('tip'); if (!t) return 'no div#tip'; \
             const s = getComputedStyle(t); \
             if (s.display === 'none' || s.visibility === 'hidden' || Number(s.opacity) === 0) return 'tip hidden'; \
             const norm = x => x.replace(/\\s+/g, ''); \
             if (!norm(t.textContent).includes(norm({tip}))) return 'tip says: ' + t.textContent; \
             const r = t.getBoundingClientRect(); \
             if (r.width === 0 || r.height === 0) return 'tip has no box'; \
             if (r.left < -1 || r.right > innerWidth + 1) return 'tip outside the window: ' + r.left + '..' + r.right + ' of ' + innerWidth; \
             return true; }})()"
        ),
    );
    // Off every [data-tip]: a corner of the window that is no tip carrier.
    let off = b.eval(
        "(() => { for (const [x, y] of [[2, 2], [innerWidth - 3, 2], [2, innerHeight - 3], [innerWidth - 3, innerHeight - 3]]) { \
           const e = document.elementFromPoint(x, y); \
           if (!e || (!e.closest('[data-tip]') && !e.closest('#tip'))) return [x, y]; } return null; })()",
    );
    assert!(
        off.is_array(),
        "{what}: every corner of the window carries a tip"
    );
    b.mouse_to(off[0].as_f64().unwrap(), off[1].as_f64().unwrap());
    b.wait_for(
        &format!("{what}: the tip to hide when the mouse leaves"),
        "(() => { const s = getComputedStyle(document.getElementById('tip')); \
           return s.display === 'none' || s.visibility === 'hidden' || Number(s.opacity) === 0 || 'tip still shown'; })()",
    );
}

/// A screenshot of `sel` that is not blank.
fn check_inked(b: &mut Browser, sel: &str, context: &str) -> f64 {
    let png = b.screenshot(sel);
    let (w, h, ink) = ink(&png);
    assert!(w > 0 && h > 0, "{context}: empty screenshot of {sel}");
    assert!(
        ink > 0.002,
        "{context}: the screenshot of {sel} ({w}x{h}) is blank ({:.3}% inked)",
        100.0 * ink
    );
    ink
}

/// The largest `[data-tip]` element (by box area) under `root`, as a JS expression.
fn largest_tip(root: &str, tag: &str) -> String {
    format!(
        "[...document.querySelectorAll({sel})].map(e => [e, e.getBoundingClientRect()])\
           .sort((p, q) => q[1].width * q[1].height - p[1].width * p[1].height).map(p => p[0])[0]",
        sel = json!(format!("{root} {tag}[data-tip]"))
    )
}

// ---------------------------------------------------------------------------------
// The report's checks.

/// The page is no wider than the window, and `table#ranked` fits or sits in a
/// horizontal scroll container that does.
fn check_no_overflow(b: &mut Browser, context: &str) {
    b.wait_for(
        &format!("{context}: the page to fit the window's width"),
        "(() => { const d = document.documentElement; \
           if (d.scrollWidth > innerWidth + 1) { \
             const name = e => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + (e.classList.length ? '.' + [...e.classList].join('.') : ''); \
             const out = e => e.getBoundingClientRect().right > innerWidth + 1; \
             const clipped = e => { for (let a = e.parentElement; a && a !== document.body; a = a.parentElement) \
               if (getComputedStyle(a).overflowX !== 'visible') return true; return false; }; \
             const culprits = [...document.body.querySelectorAll('*')].filter(e => out(e) && !out(e.parentElement) && !clipped(e)) \
               .slice(0, 4).map(e => name(e) + ' in ' + name(e.parentElement) + ' to ' + Math.round(e.getBoundingClientRect().right) + ' px'); \
             return 'page is ' + d.scrollWidth + ' px wide in a ' + innerWidth + ' px window: ' + culprits.join('; '); } \
           const t = document.querySelector('table#ranked'); if (!t) return 'no table#ranked'; \
           if (t.getBoundingClientRect().right <= innerWidth + 1) return true; \
           for (let e = t.parentElement; e && e !== document.body; e = e.parentElement) { \
             const o = getComputedStyle(e).overflowX; \
             if (o === 'auto' || o === 'scroll') \
               return e.getBoundingClientRect().right <= innerWidth + 1 || 'the scroll container of table#ranked overflows'; \
             if (o !== 'visible') return 'table#ranked is cut off (overflow-x: ' + o + '), not scrollable'; } \
           return 'table#ranked ends at ' + t.getBoundingClientRect().right + ' px, outside a ' + innerWidth + ' px window, and no scroll container holds it'; })()",
    );
}

/// With the filter set to `s`, the first row (which contains it) shows, every row
/// shown contains it (in its text or its data-desc, in any case), every row with it
/// in a cell shows, and some row hides unless all contain it.
fn filtered_on(b: &mut Browser, s: &str, context: &str) {
    b.wait_for(
        &format!("{context}: filtering on {s:?}"),
        &format!(
            "(() => {{ const s = {s}; const rows = [...document.querySelectorAll('table#ranked tbody tr')]; \
             const shown = r => !r.hidden && r.getClientRects().length > 0; \
             if (!shown(rows[0])) return 'the first row, which contains it, is hidden'; \
             let all = true; \
             for (const r of rows) {{ \
               const has = [r.textContent, r.innerText, r.getAttribute('data-desc') || ''].some(t => t.toLowerCase().includes(s.toLowerCase())); \
               const cell = [...r.cells].some(c => c.textContent.includes(s)); \
               all = all && has; \
               if (shown(r) && !has) return 'row ' + r.rowIndex + ' is shown without it: ' + r.textContent; \
               if (!shown(r) && cell) return 'row ' + r.rowIndex + ' is hidden with it in a cell'; }} \
             return all || rows.some(r => !shown(r)) || 'no row hides'; }})()",
            s = json!(s)
        ),
    );
}

fn check_filter(b: &mut Browser, context: &str) {
    let exists = b.eval("!!document.querySelector('input#ranked-filter')");
    assert_eq!(exists, json!(true), "{context}: no input#ranked-filter");
    // Visible rows, row 1's cells, and which rows contain each of them.
    const STATE: &str =
        "(() => { const rows = [...document.querySelectorAll('table#ranked tbody tr')]; \
        const shown = r => !r.hidden && r.getClientRects().length > 0; \
        return rows.map(r => shown(r)); })()";
    let all = b.eval(STATE);
    let n = all.as_array().unwrap().len();
    assert!(n >= 2, "{context}: table#ranked has {n} rows");
    assert!(
        all.as_array().unwrap().iter().all(|v| v == &json!(true)),
        "{context}: rows hidden before any filter: {all}"
    );
    let set = |b: &mut Browser, s: &str| {
        b.eval(&format!(
            "(() => {{ const i = document.querySelector('input#ranked-filter'); i.value = {s}; \
             i.dispatchEvent(new Event('input', {{bubbles: true}})); return true; }})()",
            s = json!(s)
        ));
    };
    // Nothing contains this: every row hides.
    set(b, "no plan has this text");
    b.wait_for(
        &format!("{context}: a filter that matches nothing to hide every row"),
        &format!(
            "(() => {{ const v = {STATE}; return v.every(x => !x) || JSON.stringify(v); }})()"
        ),
    );
    // The cell text of the first row that the fewest rows contain, which must single
    // out some rows but not all.
    let pick = b.eval(
        "(() => { const rows = [...document.querySelectorAll('table#ranked tbody tr')]; \
           const count = t => rows.filter(r => [...r.cells].some(c => c.textContent.includes(t))).length; \
           const texts = [...rows[0].cells].map(c => c.textContent.trim()).filter(t => t.length > 0) \
             .sort((a, b) => count(a) - count(b)); \
           return texts.length ? [texts[0], count(texts[0])] : 'the first row is empty'; })()",
    );
    let s = pick[0]
        .as_str()
        .unwrap_or_else(|| panic!("{context}: {pick}"))
        .to_string();
    assert!(
        pick[1].as_u64().unwrap() < n as u64,
        "{context}: every cell text of the first row is in every row: {pick}"
    );
    set(b, &s);
    filtered_on(b, &s, context);
    // The filter's placeholder promises "TP 8"-like filters: the first words of the
    // row's description (data-desc), where the report writes one.
    let desc = b.eval(
        "(() => { const d = document.querySelector('table#ranked tbody tr').getAttribute('data-desc'); \
           return d ? d.split(' ').slice(0, 2).join(' ') : null; })()",
    );
    if let Some(d) = desc.as_str() {
        set(b, d);
        filtered_on(b, d, context);
    }
    set(b, "");
    b.wait_for(
        &format!("{context}: clearing the filter to show every row"),
        &format!("(() => {{ const v = {STATE}; return (v.length === {n} && v.every(x => x)) || JSON.stringify(v); }})()"),
    );
}

fn check_scatter(b: &mut Browser, context: &str) {
    let v = b.eval(
        "(() => { const svg = document.querySelector('svg#scatter-zoom'); if (!svg) return 'no svg#scatter-zoom'; \
           svg.scrollIntoView({block: 'center'}); const s = svg.getBoundingClientRect(); \
           const ranks = [...svg.querySelectorAll('circle.plan[data-rank]')].map(c => c.dataset.rank); \
           const labels = [...svg.querySelectorAll('g.plan-label')].map(g => { const r = g.getBoundingClientRect(); \
             const st = getComputedStyle(g); \
             return {text: (g.querySelector('text') || {textContent: ''}).textContent.trim(), rect: !!g.querySelector('rect'), \
                     shown: st.display !== 'none' && st.visibility !== 'hidden' && Number(st.opacity) > 0, \
                     box: [r.left, r.top, r.right, r.bottom]}; }); \
           return {svg: [s.left, s.top, s.right, s.bottom], ranks, labels}; })()",
    );
    assert!(v.is_object(), "{context}: {v}");
    let ranks: Vec<String> = v["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().to_string())
        .collect();
    assert!(
        !ranks.is_empty(),
        "{context}: no circle.plan[data-rank] in svg#scatter-zoom"
    );
    let labels = v["labels"].as_array().unwrap();
    assert!(
        labels.len() >= ranks.len().min(5),
        "{context}: {} plan labels for {} plans",
        labels.len(),
        ranks.len()
    );
    let bx = |b: &Value| -> [f64; 4] { std::array::from_fn(|i| b[i].as_f64().unwrap()) };
    let svg = bx(&v["svg"]);
    let boxes: Vec<[f64; 4]> = labels.iter().map(|l| bx(&l["box"])).collect();
    for (l, r) in labels.iter().zip(&boxes) {
        assert!(
            l["rect"] == json!(true),
            "{context}: label without a rect: {l}"
        );
        let rank = l["text"].as_str().unwrap().trim_start_matches('#');
        assert!(
            ranks.iter().any(|x| x == rank),
            "{context}: label {l} names no plotted plan (ranks {ranks:?})"
        );
        assert!(l["shown"] == json!(true), "{context}: label hidden: {l}");
        assert!(
            r[2] - r[0] > 0.0 && r[3] - r[1] > 0.0,
            "{context}: label without a box: {l}"
        );
        assert!(
            r[0] >= svg[0] - 0.5
                && r[1] >= svg[1] - 0.5
                && r[2] <= svg[2] + 0.5
                && r[3] <= svg[3] + 0.5,
            "{context}: label {l} sticks out of the plot {svg:?}"
        );
    }
    for i in 0..boxes.len() {
        for j in i + 1..boxes.len() {
            let (p, q) = (boxes[i], boxes[j]);
            let dx = p[2].min(q[2]) - p[0].max(q[0]);
            let dy = p[3].min(q[3]) - p[1].max(q[1]);
            assert!(
                dx <= 0.5 || dy <= 0.5,
                "{context}: plan labels overlap by {dx:.1} x {dy:.1} px: {} and {}",
                labels[i],
                labels[j]
            );
        }
    }
    check_inked(b, "svg#scatter-zoom", context);
}

/// How many micro-batch labels of the timeline are shown; each must lie within the
/// pass under it (a label is drawn only where it fits).
fn shown_mb(b: &mut Browser, context: &str) -> u64 {
    let v = b.eval(
        "(() => { const s = document.querySelector('svg#timeline'); s.scrollIntoView({block: 'center'}); \
           let n = 0; const passes = [...s.querySelectorAll('rect[data-tip]')].map(p => p.getBoundingClientRect()); \
           for (const t of s.querySelectorAll('text.mb')) { \
             if (getComputedStyle(t).display === 'none' || t.getClientRects().length === 0) continue; \
             const r = t.getBoundingClientRect(); if (r.width === 0) continue; \
             const cx = r.left + r.width / 2, cy = r.top + r.height / 2; \
             const box = passes.find(p => p.left <= cx && cx <= p.right && p.top <= cy && cy <= p.bottom); \
             if (!box) return 'label ' + t.textContent + ' lies on no pass'; \
             if (r.width > box.width + 1) return 'label ' + t.textContent + ' is ' + r.width.toFixed(1) + ' px wide on a ' + box.width.toFixed(1) + ' px pass'; \
             n++; } \
           return n; })()",
    );
    v.as_u64()
        .unwrap_or_else(|| panic!("{context}: timeline labels: {v}"))
}

fn check_timeline(b: &mut Browser, context: &str) {
    let v = b.eval(
        "(() => { const s = document.querySelector('svg#timeline'); if (!s) return 'no svg#timeline'; \
           return [s.querySelectorAll('rect[data-tip]').length, s.querySelectorAll('text.mb').length, \
                   !!document.querySelector('#tl-zoom-in'), !!document.querySelector('#tl-zoom-out')]; })()",
    );
    assert!(v.is_array(), "{context}: {v}");
    assert!(
        v[0].as_u64().unwrap() >= 1,
        "{context}: no rect[data-tip] in svg#timeline"
    );
    assert!(
        v[1].as_u64().unwrap() >= 1,
        "{context}: no text.mb micro-batch label in svg#timeline"
    );
    assert!(
        v[2] == json!(true) && v[3] == json!(true),
        "{context}: no #tl-zoom-in / #tl-zoom-out: {v}"
    );
    let width = |b: &mut Browser| {
        b.eval("document.querySelector('svg#timeline').getBoundingClientRect().width")
            .as_f64()
            .unwrap()
    };
    let w0 = width(b);
    assert!(w0 > 0.0, "{context}: svg#timeline has no width");
    let before = shown_mb(b, context);
    // Zoom in until micro-batch labels fit (at most 10 clicks), each click wider,
    // with never fewer labels shown; then out as many clicks, back to the start.
    let mut widths = vec![w0];
    let mut shown = before;
    while shown == 0 && widths.len() <= 10 {
        let w = *widths.last().unwrap();
        click(b, "#tl-zoom-in");
        b.wait_for(
            &format!("{context}: #tl-zoom-in to widen svg#timeline beyond {w:.1} px"),
            &format!("(() => {{ const w = document.querySelector('svg#timeline').getBoundingClientRect().width; return w > {w} + 1 || w; }})()"),
        );
        widths.push(width(b));
        let now = shown_mb(b, context);
        assert!(
            now >= shown,
            "{context}: zooming in hid micro-batch labels ({shown} shown, then {now})"
        );
        shown = now;
        check_no_overflow(b, &format!("{context}, timeline zoomed in"));
    }
    assert!(
        shown >= 1,
        "{context}: no micro-batch label shown even zoomed in to {widths:?} px"
    );
    println!(
        "{context}: {shown} micro-batch labels shown at {} px",
        widths.last().unwrap().round()
    );
    while widths.len() > 1 {
        let w = widths.pop().unwrap();
        click(b, "#tl-zoom-out");
        b.wait_for(
            &format!("{context}: #tl-zoom-out to narrow svg#timeline below {w:.1} px"),
            &format!("(() => {{ const w = document.querySelector('svg#timeline').getBoundingClientRect().width; return w < {w} - 1 || w; }})()"),
        );
    }
    let back = width(b);
    assert!(
        (back - w0).abs() <= 1.0,
        "{context}: zooming in and out as often left the timeline {back:.1} px wide, not {w0:.1}"
    );
}

fn check_report_page(b: &mut Browser, context: &str) {
    check_no_overflow(b, context);
    check_sorting(b, "table#ranked", "rank", "mem", context);
    check_filter(b, context);
    check_scatter(b, context);
    check_tip(
        b,
        "document.querySelector('svg#scatter-zoom circle.plan')",
        context,
    );
    // The slowest cell of the whole space (drawn last), far from the ranked plans
    // that cover the fastest ones.
    check_tip(
        b,
        "[...document.querySelectorAll('svg#scatter-all rect.cell[data-tip]')].at(-1)",
        context,
    );
    check_tip(b, &largest_tip("svg#stage-memory", "rect"), context);
    check_tip(b, &largest_tip("svg#bars", "rect"), context);
    check_tip(b, &largest_tip("svg#timeline", "rect"), context);
    check_timeline(b, context);
    let sens = b.eval(
        "[...document.querySelectorAll('#sensitivity svg.sens')].map(s => { const r = s.getBoundingClientRect(); return r.width > 0 && r.height > 0; })",
    );
    let sens = sens.as_array().unwrap();
    assert!(
        sens.len() >= 2,
        "{context}: {} #sensitivity svg.sens",
        sens.len()
    );
    assert!(
        sens.iter().all(|s| s == &json!(true)),
        "{context}: a sensitivity chart has no box"
    );
    let sources = b.eval(
        "(() => { const d = document.querySelector('details#sources'); return d ? d.open : 'no details#sources'; })()",
    );
    assert_eq!(
        sources,
        json!(false),
        "{context}: details#sources should start collapsed"
    );
    b.assert_no_errors(context);
}

fn report_test(test: &str, args: &[&str]) {
    let Some(mut b) = Browser::launch(test) else {
        return;
    };
    let html = b.dir.path("report.html");
    let mut a = args.to_vec();
    a.extend(["--report", html.to_str().unwrap()]);
    let o = sextant(&a);
    assert!(o.status.success(), "{a:?}: {}", stderr(&o));
    let url = file_url(&html);
    for width in [800, 1600] {
        let t = Instant::now();
        b.open(&url, width, 1200);
        check_report_page(&mut b, &format!("{test} at {width} px"));
        println!(
            "{test} at {width} px: checked in {:.2} s",
            t.elapsed().as_secs_f64()
        );
    }
}

#[test]
fn dense_report_is_interactive_at_800_and_1600_px() {
    report_test(
        "dense_report_is_interactive_at_800_and_1600_px",
        &["plan", "--model", "70b", "--gpus", "128"],
    );
}

#[test]
fn moe_report_is_interactive_at_800_and_1600_px() {
    report_test(
        "moe_report_is_interactive_at_800_and_1600_px",
        &[
            "plan",
            "--model",
            "deepseek-v3",
            "--gpus",
            "1024",
            "--gpu",
            "h800",
        ],
    );
}

// ---------------------------------------------------------------------------------
// The harness itself, on a page it writes.

const FIXTURE: &str = r##"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>fixture</title>
<style>body{margin:20px}#tip{position:fixed;display:none;background:#ffe;border:1px solid #999}#blank{width:50px;height:40px;background:#fff}</style>
</head><body>
<table id="t"><thead><tr><th data-key="rank">#</th><th data-key="x">x</th><th>name</th></tr></thead><tbody>
<tr><td data-v="1">1</td><td data-v="30">30</td><td>alpha</td></tr>
<tr><td data-v="2">2</td><td data-v="10">10</td><td>beta</td></tr>
<tr><td data-v="3">3</td><td data-v="20">20</td><td>gamma</td></tr>
</tbody></table>
<svg id="s" width="200" height="100"><rect id="r" data-tip="hello from the rect" x="10" y="10" width="80" height="60" fill="#36c"/><rect id="quiet" x="110" y="10" width="80" height="60" fill="#c63"/></svg>
<div id="blank"></div>
<button id="boom">boom</button>
<div id="tip"></div>
<script>
const tip = document.getElementById('tip');
document.addEventListener('mouseover', e => { const t = e.target.closest('[data-tip]'); if (!t) return; tip.textContent = t.dataset.tip; tip.style.display = 'block'; tip.style.left = e.clientX + 8 + 'px'; tip.style.top = e.clientY + 8 + 'px'; });
document.addEventListener('mouseout', e => { if (e.target.closest('[data-tip]')) tip.style.display = 'none'; });
document.querySelectorAll('th[data-key]').forEach(th => th.addEventListener('click', () => { const b = th.closest('table').tBodies[0], i = th.cellIndex, d = th.dataset.dir = th.dataset.dir === 'a' ? 'd' : 'a'; [...b.rows].sort((p, q) => (p.cells[i].dataset.v - q.cells[i].dataset.v) * (d === 'a' ? 1 : -1)).forEach(r => b.appendChild(r)); }));
document.getElementById('boom').addEventListener('click', () => { setTimeout(() => { console.error('fixture console error'); throw new Error('fixture exception'); }, 0); });
</script></body></html>
"##;

#[test]
fn cdp_harness_drives_a_fixture() {
    let start = Instant::now();
    let Some(mut b) = Browser::launch("cdp_harness_drives_a_fixture") else {
        return;
    };
    let page = b.dir.path("fixture.html");
    std::fs::write(&page, FIXTURE).unwrap();
    b.open(&file_url(&page), 800, 600);
    // The window has the size asked for, and commands and evaluation round-trip.
    assert_eq!(b.eval("[innerWidth, innerHeight]"), json!([800, 600]));
    assert_eq!(b.eval("Promise.resolve(6 * 7)"), json!(42));
    let e = b.try_eval("(() => { throw new Error('thrown on purpose'); })()");
    assert!(
        e.as_ref().is_err_and(|e| e.contains("thrown on purpose")),
        "{e:?}"
    );
    let e = b.try_call("Nonexistent.method", json!({}));
    assert!(
        e.as_ref().is_err_and(|e| e.contains("Nonexistent.method")),
        "{e:?}"
    );
    b.assert_no_errors("fixture after load");

    // The generic checks pass on a page that does what they check ...
    check_sorting(&mut b, "table#t", "rank", "x", "fixture");
    check_tip(&mut b, "document.querySelector('#r')", "fixture");
    let inked = check_inked(&mut b, "svg#s", "fixture");
    assert!(
        inked > 0.3,
        "the fixture's two rects fill most of the svg: {inked}"
    );
    // ... and fail where it does not.
    let (w, h, blank) = ink(&b.screenshot("#blank"));
    assert_eq!(
        (w, h, blank),
        (50, 40, 0.0),
        "a white div screenshots blank"
    );
    let quiet = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        check_tip(&mut b, "document.querySelector('#quiet')", "fixture")
    }));
    assert!(
        quiet.is_err(),
        "an element without data-tip passed the tip check"
    );
    let unsorted = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        check_sorting(&mut b, "table#t", "rank", "nonexistent", "fixture")
    }));
    assert!(unsorted.is_err(), "a missing column passed the sort check");

    // Errors the page reports later, from a timer, are collected.
    click(&mut b, "#boom");
    let since = 0;
    b.wait_event("Runtime.exceptionThrown", since);
    b.wait_event("Runtime.consoleAPICalled", since);
    let errors = b.errors();
    assert!(
        errors.iter().any(|e| e.contains("fixture exception"))
            && errors.iter().any(|e| e.contains("fixture console error")),
        "{errors:?}"
    );

    // A second page at another width in the same browser.
    b.open(&file_url(&page), 1600, 1200);
    assert_eq!(b.eval("innerWidth"), json!(1600));
    check_sorting(&mut b, "table#t", "rank", "x", "fixture at 1600 px");

    // Dropping the client ends Chromium.
    let pid = b.child.id() as libc::pid_t;
    drop(b);
    // SAFETY: signal 0 only asks whether the process exists.
    let alive = unsafe { libc::kill(pid, 0) };
    assert_ne!(
        alive, 0,
        "Chromium (pid {pid}) still runs after the client was dropped"
    );
    println!(
        "cdp_harness_drives_a_fixture: {:.2} s",
        start.elapsed().as_secs_f64()
    );
}
