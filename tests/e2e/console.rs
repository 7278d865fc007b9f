//! The web console in a real browser: Debian's Chromium driven by its
//! ChromeDriver over the W3C WebDriver protocol (a few JSON calls, below),
//! against a coordinator serving the console on `--http-listen` with a
//! token. The test signs in, sees a submitted job appear in the list live,
//! opens it while it waits for its user, answers from the page, sees its
//! tasks appear live, opens a subagent's transcript and finds its denial
//! marker, cancels the job from the page, and checks the state through the
//! CLI. Screenshots go to `target/console-screenshots/`.
//!
//! `scripts/test` installs `chromium` and `chromium-driver` when missing;
//! without them this test fails saying so.

use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::cluster::{Cluster, Options};
use crate::support::repo;

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";
const TOKEN: &str = "console-s3cret";

/// One browser session through ChromeDriver.
struct Browser {
    http: reqwest::Client,
    base: String,
    driver: Child,
}

impl Drop for Browser {
    /// The driver leads a process group of its own: the browsers it started
    /// go with it, however the test ends.
    fn drop(&mut self) {
        let group = format!("-{}", self.driver.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

fn tool(names: &[&str]) -> String {
    names
        .iter()
        .find(|n| Command::new(n).arg("--version").output().is_ok_and(|o| o.status.success()))
        .unwrap_or_else(|| {
            panic!("{} not found: install Debian's chromium and chromium-driver (scripts/test does)", names[0])
        })
        .to_string()
}

impl Browser {
    async fn start() -> Self {
        // ChromeDriver wants the browser itself (Debian's /usr/bin/chromium is a wrapper script).
        let chromium = ["/usr/lib/chromium/chromium", "/usr/bin/chromium", "/usr/bin/chromium-browser"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .unwrap_or_else(|| {
                panic!("chromium not found: install Debian's chromium and chromium-driver (scripts/test does)")
            });
        let driver_bin = tool(&["chromedriver", "/usr/bin/chromedriver"]);
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let driver = Command::new(driver_bin)
            .process_group(0)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let http = reqwest::Client::new();
        let base = format!("http://127.0.0.1:{port}");
        let ready = Instant::now();
        loop {
            if let Ok(r) = http.get(format!("{base}/status")).send().await
                && let Ok(v) = r.json::<Value>().await
                && v["value"]["ready"] == true
            {
                break;
            }
            assert!(ready.elapsed() < Duration::from_secs(30), "chromedriver did not start");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut b = Self { http, base, driver };
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": chromium, "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,900"
            ]}
        }}});
        let r = b.call("POST", "/session", caps).await;
        let session = r["sessionId"].as_str().unwrap_or_else(|| panic!("no session: {r}")).to_string();
        b.base = format!("{}/session/{session}", b.base);
        b
    }

    async fn call(&self, method: &str, path: &str, body: Value) -> Value {
        let url = format!("{}{path}", self.base);
        let req = match method {
            "GET" => self.http.get(url),
            "DELETE" => self.http.delete(url),
            _ => self.http.post(url).json(&body),
        };
        let v: Value = req.send().await.unwrap().json().await.unwrap();
        v["value"].clone()
    }

    async fn goto(&self, url: &str) {
        self.call("POST", "/url", json!({"url": url})).await;
    }

    async fn find(&self, css: &str) -> Option<String> {
        let v = self.call("POST", "/element", json!({"using": "css selector", "value": css})).await;
        v[ELEMENT].as_str().map(str::to_string)
    }

    async fn find_all(&self, css: &str) -> Vec<String> {
        let v = self.call("POST", "/elements", json!({"using": "css selector", "value": css})).await;
        v.as_array()
            .map(|a| a.iter().filter_map(|e| e[ELEMENT].as_str().map(str::to_string)).collect())
            .unwrap_or_default()
    }

    /// The first element matching `css` whose text contains `text`, once the page shows it.
    async fn wait_for(&self, css: &str, text: &str) -> String {
        let start = Instant::now();
        loop {
            for el in self.find_all(css).await {
                if self.text(&el).await.contains(text) {
                    return el;
                }
            }
            if start.elapsed() > Duration::from_secs(60) {
                let shot = self.screenshot("failure").await;
                std::fs::write(shot.with_extension("html"), self.source().await).unwrap();
                panic!("no `{css}` with `{text}` on {} (screenshot: {})", self.url().await, shot.display());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn text(&self, el: &str) -> String {
        self.call("GET", &format!("/element/{el}/text"), Value::Null).await.as_str().unwrap_or_default().to_string()
    }

    async fn click(&self, el: &str) {
        self.call("POST", &format!("/element/{el}/click"), json!({})).await;
    }

    /// Click the first `css` element with `text`; again if a live refresh
    /// replaced it meanwhile (a stale element).
    async fn click_on(&self, css: &str, text: &str) {
        let start = Instant::now();
        loop {
            let el = self.wait_for(css, text).await;
            let r = self.call("POST", &format!("/element/{el}/click"), json!({})).await;
            if r.get("error").is_none() {
                return;
            }
            assert!(start.elapsed() < Duration::from_secs(30), "`{css}` `{text}` could not be clicked: {r}");
        }
    }

    /// The address of the first `css` link with `text` (read again if a live
    /// refresh replaced it meanwhile).
    async fn href(&self, css: &str, text: &str) -> String {
        let start = Instant::now();
        loop {
            let el = self.wait_for(css, text).await;
            let href = self.property(&el, "href").await;
            if href.starts_with("http") {
                return href;
            }
            assert!(start.elapsed() < Duration::from_secs(30), "`{css}` `{text}` has no address");
        }
    }

    async fn type_into(&self, el: &str, text: &str) {
        self.call("POST", &format!("/element/{el}/value"), json!({"text": text})).await;
    }

    /// An element's property (`href` resolves to the absolute URL).
    async fn property(&self, el: &str, name: &str) -> String {
        self.call("GET", &format!("/element/{el}/property/{name}"), Value::Null)
            .await
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    async fn url(&self) -> String {
        self.call("GET", "/url", Value::Null).await.as_str().unwrap_or_default().to_string()
    }

    async fn source(&self) -> String {
        self.call("GET", "/source", Value::Null).await.as_str().unwrap_or_default().to_string()
    }

    async fn screenshot(&self, name: &str) -> PathBuf {
        use base64::Engine;
        let png = self.call("GET", "/screenshot", Value::Null).await;
        let bytes = base64::engine::general_purpose::STANDARD.decode(png.as_str().unwrap()).unwrap();
        let dir = repo().join("target/console-screenshots");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, bytes).unwrap();
        path
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_console_in_a_browser_follows_answers_and_cancels_a_job() {
    let mut c =
        Cluster::start(Options { workers: 1, concurrency: 4, token: Some(TOKEN), console: true, ..Default::default() })
            .await;
    let console = c.coordinators[0].console_url();

    // Without the token: 401 and nothing of the jobs; a form post without the CSRF value is refused.
    let http = reqwest::Client::new();
    let r = http.get(format!("{console}/")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    let r = http.get(format!("{console}/")).bearer_auth("wrong").send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.text().await.unwrap().contains("Access token"));

    let b = Browser::start().await;
    b.goto(&format!("{console}/")).await;
    let field = b.find("#token").await.expect("the sign-in form");
    b.type_into(&field, TOKEN).await;
    b.click(&b.find("form button[type=submit]").await.unwrap()).await;
    b.wait_for("h1", "Jobs").await;

    // A job submitted now appears in the open list without a reload.
    let job = c.submit(&repo().join("tests/fixtures/distributed/console.yaml"));
    // (Live refreshes replace the rows and the task tree: follow a link by its address.)
    b.goto(&b.href("table#jobs a", "console-watch").await).await;
    b.wait_for("main.job .state", "waiting_for_user").await;
    b.wait_for("form.question", "Start the watch?").await;
    b.screenshot("1-waiting-for-the-user").await;

    // Answer from the page; the tasks then appear live.
    b.click_on("form.question button", "1. go").await;
    c.wait_for(
        "the page's answer",
        Duration::from_secs(30),
        &format!("SELECT count(*) = 1 FROM events WHERE job_id = '{job}' AND kind = 'question_answered'"),
    )
    .await;
    b.wait_for("li.task", "prober").await;
    b.wait_for("li.task", "watchman").await;
    b.wait_for("li.task .tstate", "running").await;
    b.wait_for("#events li", "task_started").await;
    b.screenshot("2-running-with-its-tasks").await;
    let answered: Value = serde_json::from_slice(&c.flower(&["status", &job, "--json"]).stdout).unwrap();
    assert_eq!(answered["questions"][0]["answer"], "go", "the page's answer was stored");

    // A subagent's transcript shows its denial.
    b.wait_for("li.task", "prober — probe the system").await;
    b.goto(&b.href("li.task a", "prober").await).await;
    let denied = b.wait_for(".marker-denied", "denied").await;
    assert_eq!(b.text(&denied).await, "denied: worker_tools", "the guard that denied it, named");
    b.screenshot("3-transcript-with-a-denial").await;
    assert!(b.source().await.contains("entry-tool_result"));

    // Cancel from the page.
    b.goto(&format!("{console}/jobs/{job}")).await;
    // A live refresh may swap the form out between finding the field and
    // typing into it (a filled field is never swapped): type until the
    // page's own field holds the words.
    let field = "form[action$=cancel] input[name=reason]";
    let mut tries = 0;
    loop {
        let reason = b.find(field).await.unwrap();
        b.type_into(&reason, "stopped from the browser").await;
        let shown = b.find(field).await.unwrap();
        if b.property(&shown, "value").await == "stopped from the browser" {
            break;
        }
        tries += 1;
        assert!(tries < 20, "the reason field never kept what was typed");
    }
    b.click_on("#cancel", "Cancel job").await;
    b.wait_for("main.job .state", "cancelled").await;
    b.screenshot("4-cancelled").await;
    c.wait_job(&job, "cancelled").await;
    let status: Value = serde_json::from_slice(&c.flower(&["status", &job, "--json"]).stdout).unwrap();
    assert_eq!(
        (status["state"].as_str(), status["reason"].as_str()),
        (Some("cancelled"), Some("stopped from the browser"))
    );

    let page = b.source().await;
    for shown in
        ["Model latency p50", "By role", "worker prober", "By model", "Context meter", "Task tree", "bar-queue"]
    {
        assert!(page.contains(shown), "the job page shows {shown}");
    }
    // The list filtered to a day: each figure beside the day before's.
    b.goto(&format!("{console}/?hours=24&state=cancelled")).await;
    b.wait_for(".insights .figure", "previous period").await;
    b.wait_for("table#jobs a", "console-watch").await;

    // A form post that is not the console's is refused, and changes nothing.
    let r = http
        .post(format!("{console}/jobs/{job}/interrupt"))
        .bearer_auth(TOKEN)
        .header("content-type", "application/x-www-form-urlencoded")
        .body("csrf=forged&message=hi")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    drop(b);
    c.stop().await;
}

/// `flower ui` over the embedded store: a finished demo run's pages, with
/// the simulator's cache audit kept beside the job; a token when set.
#[tokio::test(flavor = "multi_thread")]
async fn flower_ui_serves_the_embedded_store() {
    use std::io::BufRead;
    let home = crate::support::Home::new();
    let summary = home.run_job(&repo().join("examples/demo/job.yaml"), &[]);
    let job = summary["job_id"].as_str().unwrap().to_string();
    /// Stops the server however the test ends.
    struct Killed(Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut ui = Killed(
        home.cmd()
            .args(["ui", "--listen", "127.0.0.1:0", "--token", "ui-s3cret"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut first = String::new();
    std::io::BufReader::new(ui.0.stdout.take().unwrap()).read_line(&mut first).unwrap();
    let base =
        first.split_whitespace().find(|w| w.starts_with("http://")).expect(&first).trim_end_matches('/').to_string();

    let http = reqwest::Client::new();
    assert_eq!(http.get(format!("{base}/jobs/{job}")).send().await.unwrap().status(), 401);
    let page = http.get(format!("{base}/jobs/{job}")).bearer_auth("ui-s3cret").send().await.unwrap();
    assert_eq!(page.status(), 200);
    let csp = page.headers()["content-security-policy"].to_str().unwrap().to_string();
    assert!(csp.contains("script-src 'self'"), "{csp}");
    let page = page.text().await.unwrap();
    assert!(page.contains("state-succeeded") && page.contains("Task tree"), "the demo's job page");
    assert!(
        page.contains("Cache audit (simulator)") && page.contains("0 unexplained"),
        "the audit kept beside the job"
    );
    let artifact =
        http.get(format!("{base}/jobs/{job}/files/artifacts/sizes.md")).bearer_auth("ui-s3cret").send().await.unwrap();
    assert_eq!(artifact.status(), 200);
    assert!(artifact.text().await.unwrap().starts_with("# desc: per-file sizes"), "the workbench file, as text");
    let escape =
        http.get(format!("{base}/jobs/{job}/files/..%2F..%2Fflower.db")).bearer_auth("ui-s3cret").send().await.unwrap();
    assert!(escape.status().is_client_error(), "no path out of the workbench: {}", escape.status());
    let list =
        http.get(format!("{base}/?fragment=rows")).bearer_auth("ui-s3cret").send().await.unwrap().text().await.unwrap();
    assert!(list.contains(&job), "{list}");
    // The insights strip adds up the jobs' turns: cost by role and by model, latency and TTFT.
    let jobs =
        http.get(format!("{base}/?hours=24")).bearer_auth("ui-s3cret").send().await.unwrap().text().await.unwrap();
    for want in [
        "cost by role",
        "worker counter",
        "worker sizer",
        "cost by model",
        "claude-sonnet-4-5",
        "model latency (p50)",
        "time to first token (p50)",
        "previous: –",
    ] {
        assert!(jobs.contains(want), "{want}: {jobs}");
    }
    let coordinator_cost = jobs.split("<span class=\"key\">coordinator</span> <span class=\"num\">$").nth(1).unwrap();
    let cost: f64 = coordinator_cost.split('<').next().unwrap().parse().unwrap();
    assert!(cost > 0.0, "the coordinator's calls were priced: {cost}");
    // The strip's cost is its turns' costs, each at its own model: the sum of the by-model lines.
    let money = |text: &str| text.trim_start_matches('$').split('<').next().unwrap().parse::<f64>().unwrap();
    let strip = jobs.split("<div class=\"label\">cost (est.)</div>").next().unwrap();
    let total = money(strip.rsplit("<div class=\"value\">").next().unwrap());
    let by_model = jobs.split("aria-label=\"cost by model\">").nth(1).unwrap().split("</ul>").next().unwrap();
    let sum: f64 = by_model.split("<span class=\"num\">").skip(1).map(money).sum();
    assert!(total > 0.0 && (total - sum).abs() < 0.0002, "{total} vs {sum}");
    let ttft = jobs.split("time to first token (p50)").next().unwrap();
    assert!(!ttft.ends_with("<div class=\"value\">–</div><div class=\"label\">"), "a TTFT median: {jobs}");
}
