//! The crate graph is the architecture (docs/design.md, section 1): these
//! rules are read from `cargo metadata`, so an edge that breaks one fails here.
//! - `coordinator` and `worker` never depend on each other;
//! - only `runtime` and `cli` depend on `sim` (tests may, as dev-dependencies);
//! - `proto` and `model` depend on no I/O crate;
//! - the front-ends (`console`, `mcp`) are adapters over the application
//!   layer: never on `worker`, `sim` or `runtime`, and never on a store
//!   backend's driver.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// A test reads top to bottom.
#![allow(clippy::too_many_lines)]

use serde_json::Value;

/// Crates that do I/O: a leaf crate must not depend on them directly.
const IO_CRATES: &[&str] = &[
    "tokio",
    "tokio-postgres",
    "postgres",
    "deadpool-postgres",
    "sqlx",
    "rusqlite",
    "object_store",
    "async-nats",
    "reqwest",
    "hyper",
    "axum",
];

fn metadata() -> Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(out.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The front-ends: adapters over the application layer (`flower_coordinator::app`).
const FRONT_ENDS: &[&str] = &["flower-console", "flower-mcp"];

/// What a front-end never depends on: the roles' hands, the simulator, the
/// wiring, and the stores' drivers.
const BEHIND_THE_APP: &[&str] =
    &["flower-worker", "flower-sim", "flower-runtime", "tokio-postgres", "deadpool-postgres", "rusqlite", "async-nats"];

/// (package, dependency) pairs, dev-dependencies left out.
fn edges(meta: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for p in meta["packages"].as_array().unwrap() {
        for d in p["dependencies"].as_array().unwrap() {
            if d["kind"].as_str() == Some("dev") {
                continue;
            }
            out.push((p["name"].as_str().unwrap().to_string(), d["name"].as_str().unwrap().to_string()));
        }
    }
    out
}

/// Every broken rule, named.
fn violations(meta: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for (from, to) in edges(meta) {
        let (f, t) = (from.as_str(), to.as_str());
        if matches!((f, t), ("flower-coordinator", "flower-worker") | ("flower-worker", "flower-coordinator")) {
            out.push(format!("{f} → {t}: the roles never import each other (the runtime wires them)"));
        }
        if FRONT_ENDS.contains(&f) && BEHIND_THE_APP.contains(&t) {
            out.push(format!("{f} → {t}: a front-end goes through the application layer"));
            continue;
        }
        if t == "flower-sim" && !matches!(f, "flower-runtime" | "flower-cli") {
            out.push(format!("{f} → {t}: only runtime and cli depend on the simulator"));
        }
        if matches!(f, "flower-proto" | "flower-model") && IO_CRATES.contains(&t) {
            out.push(format!("{f} → {t}: {f} does no I/O"));
        }
    }
    out
}

#[test]
fn the_crate_graph_keeps_its_rules() {
    let meta = metadata();
    let names: Vec<&str> = meta["packages"].as_array().unwrap().iter().filter_map(|p| p["name"].as_str()).collect();
    for c in [
        "flower-coordinator",
        "flower-worker",
        "flower-runtime",
        "flower-proto",
        "flower-model",
        "flower-console",
        "flower-mcp",
    ] {
        assert!(names.contains(&c), "{c} is a workspace member: {names:?}");
    }
    assert_eq!(violations(&meta), Vec::<String>::new());
}

#[test]
fn a_forbidden_edge_is_caught() {
    let meta = metadata();
    for (from, to) in [
        ("flower-coordinator", "flower-worker"),
        ("flower-worker", "flower-coordinator"),
        ("flower-coordinator", "flower-sim"),
        ("flower-agent", "flower-sim"),
        ("flower-model", "tokio"),
        ("flower-proto", "object_store"),
        ("flower-console", "flower-sim"),
        ("flower-console", "flower-worker"),
        ("flower-mcp", "flower-runtime"),
        ("flower-mcp", "rusqlite"),
    ] {
        let mut bad = meta.clone();
        let pkg = bad["packages"].as_array_mut().unwrap().iter_mut().find(|p| p["name"] == from).unwrap();
        pkg["dependencies"].as_array_mut().unwrap().push(serde_json::json!({"name": to, "kind": null}));
        let found = violations(&bad);
        assert_eq!(found.len(), 1, "{from} → {to}: {found:?}");
        assert!(found[0].starts_with(&format!("{from} → {to}")), "{found:?}");
    }
    // A test may use the simulator.
    let mut dev = meta.clone();
    let pkg = dev["packages"].as_array_mut().unwrap().iter_mut().find(|p| p["name"] == "flower-worker").unwrap();
    pkg["dependencies"].as_array_mut().unwrap().push(serde_json::json!({"name": "flower-sim", "kind": "dev"}));
    assert_eq!(violations(&dev), Vec::<String>::new());
}
