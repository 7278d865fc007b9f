//! The protocol-independent part of `flower mcp-serve`: reading tool
//! arguments into their types (every error names its field), job specs from
//! text or from an operator's template with a new goal, and artifact paths
//! that cannot leave the workbench's `artifacts/`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use flower_model::{JobSpec, SpecError};
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

/// A bad argument: the field and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ArgError {
    pub field: String,
    pub message: String,
}

impl ArgError {
    pub fn new(field: &str, message: impl Into<String>) -> Self {
        Self { field: field.to_string(), message: message.into() }
    }
}

/// The longest text argument taken (a spec, a message, an answer).
pub const MAX_TEXT: usize = 256 * 1024;

/// A call's arguments as `T`, checked first against `T`'s own schema (the
/// one the catalog shows, [`flower_agent::tool::schema_of`]): a field the
/// tool does not take is refused (a misspelt name must not be ignored); a
/// string must be one, without NUL, at most [`MAX_TEXT`] bytes, one of its
/// `enum` when it has one, and not blank when required; an integer must be
/// a whole number within its `minimum`/`maximum`; a boolean true or false.
/// `null` is an absent field. What is left (a missing field, a value out of
/// a type's range) serde refuses, naming the field.
pub fn parse<T: DeserializeOwned + JsonSchema>(args: &Map<String, Value>) -> Result<T, ArgError> {
    let schema = flower_agent::tool::schema_of::<T>();
    let empty = Map::new();
    let props = schema["properties"].as_object().unwrap_or(&empty);
    let required: Vec<&str> = schema["required"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    if let Some(unknown) = args.keys().find(|k| !props.contains_key(*k)) {
        let known: Vec<&str> = props.keys().map(String::as_str).collect();
        return Err(ArgError::new(
            &cut(unknown, 64),
            format!("not a parameter of this tool (it takes: {})", known.join(", ")),
        ));
    }
    let mut checked = Map::new();
    for (field, value) in args {
        if value.is_null() {
            continue;
        }
        let value = check(field, value, &props[field], required.contains(&field.as_str()))?;
        checked.insert(field.clone(), value);
    }
    flower_agent::tool::parse_args(Value::Object(checked)).map_err(|e| ArgError::new(&e.field, e.message))
}

/// One argument against its property's schema; a whole number given as a
/// float (`5.0`) comes back as an integer.
fn check(field: &str, v: &Value, schema: &Value, required: bool) -> Result<Value, ArgError> {
    match schema["type"].as_str() {
        Some("string") => {
            let s = match v {
                Value::String(s) => s,
                other => return Err(ArgError::new(field, format!("expected a string, got {}", type_name(other)))),
            };
            if s.contains('\0') {
                return Err(ArgError::new(field, "must not contain NUL"));
            }
            if s.len() > MAX_TEXT {
                return Err(ArgError::new(field, format!("{} bytes, more than the {MAX_TEXT} allowed", s.len())));
            }
            if let Some(choices) = schema["enum"].as_array()
                && !choices.contains(v)
            {
                let choices: Vec<&str> = choices.iter().filter_map(Value::as_str).collect();
                return Err(ArgError::new(field, format!("`{}` is not one of: {}", cut(s, 64), choices.join(", "))));
            }
            if required && s.trim().is_empty() {
                return Err(ArgError::new(field, "must not be empty"));
            }
            Ok(v.clone())
        }
        Some("integer") => {
            let min = schema["minimum"].as_u64().unwrap_or(0);
            let max = schema["maximum"].as_u64();
            let (range, whole) = match max {
                Some(max) => (format!("{min} to {max}"), format!("a whole number from {min} to {max}")),
                None => (format!("at least {min}"), format!("a whole number of at least {min}")),
            };
            let n = match v {
                Value::Number(n) => {
                    n.as_u64().or_else(|| n.as_f64().filter(|f| f.fract() == 0.0 && *f >= 0.0).map(|f| f as u64))
                }
                _ => None,
            };
            match n {
                Some(n) if n >= min && max.is_none_or(|max| n <= max) => Ok(Value::from(n)),
                Some(n) => Err(ArgError::new(field, format!("{n} is out of range ({range})"))),
                None => Err(ArgError::new(field, format!("expected {whole}, got {}", short(v)))),
            }
        }
        Some("boolean") if !v.is_boolean() => {
            Err(ArgError::new(field, format!("expected true or false, got {}", type_name(v))))
        }
        _ => Ok(v.clone()),
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn short(v: &Value) -> String {
    cut(&v.to_string(), 40)
}

/// At most `max` bytes of `s` (on a character boundary), marked when cut.
pub fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// A template: a spec file the operator named (`--template NAME=PATH`),
/// read at start. Its relative `scenario` and `workspace` resolve against
/// its own directory, as `flower run` resolves them.
#[derive(Clone, Debug)]
pub struct Template {
    pub name: String,
    pub path: PathBuf,
    /// The spec as a JSON value (the goal is replaced per job).
    doc: Map<String, Value>,
    /// What its goal says, shown in the tool's description.
    pub summary: String,
}

impl Template {
    /// Parse `NAME=PATH` and load the file, checking it is a valid spec.
    pub fn parse_flag(flag: &str) -> Result<Self, String> {
        let (name, path) = flag.split_once('=').ok_or_else(|| format!("`{flag}`: expected NAME=PATH"))?;
        let name = name.trim();
        if name.is_empty()
            || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            || name.len() > 64
        {
            return Err(format!("`{name}`: a template name is 1-64 letters, digits, `-` or `_`"));
        }
        Self::load(name, Path::new(path.trim()))
    }

    pub fn load(name: &str, path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let value = spec_value(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let Value::Object(doc) = value else { return Err(format!("{}: not a mapping", path.display())) };
        let path = path.canonicalize().map_err(|e| format!("{}: {e}", path.display()))?;
        let t = Self {
            name: name.to_string(),
            summary: doc.get("name").and_then(Value::as_str).unwrap_or(name).to_string(),
            path,
            doc,
        };
        // The template must make a valid spec with its own goal.
        let goal = t.doc.get("goal").and_then(Value::as_str).unwrap_or("a goal").to_string();
        t.with_goal(&goal, None).map_err(|e| format!("{}: {e}", t.path.display()))?;
        Ok(t)
    }

    /// The template's spec with `goal` in place of its own (and `name`, when given).
    pub fn with_goal(&self, goal: &str, name: Option<&str>) -> Result<JobSpec, SpecError> {
        let mut doc = self.doc.clone();
        doc.insert("goal".into(), Value::String(goal.to_string()));
        if let Some(n) = name {
            doc.insert("name".into(), Value::String(n.to_string()));
        }
        let spec = JobSpec::from_value(Value::Object(doc))?;
        resolve_paths(spec, self.path.parent().unwrap_or(Path::new("/")))
    }
}

/// The operator's templates by name.
pub type Templates = BTreeMap<String, Template>;

/// A spec's text (YAML or JSON) as a JSON value, without validating it.
fn spec_value(text: &str) -> Result<Value, SpecError> {
    if text.trim_start().starts_with('{') {
        return serde_json::from_str(text)
            .map_err(|e| SpecError { field: "(document)".into(), message: format!("not valid JSON: {e}") });
    }
    serde_yaml_ng::from_str(text)
        .map_err(|e| SpecError { field: "(document)".into(), message: format!("not valid YAML: {e}") })
}

/// A full spec given as text by a client: parsed and validated; relative
/// paths resolve against `base`, and every path must stay inside it (links
/// followed): a client must not make the server read what the operator did
/// not put there. Templates, the operator's own files, may name any path.
pub fn spec_from_text(text: &str, base: &Path) -> Result<JobSpec, SpecError> {
    let spec = resolve_paths(JobSpec::parse(text)?, base)?;
    let root = base.canonicalize().map_err(|e| SpecError {
        field: "(document)".into(),
        message: format!("the server's spec root {}: {e}", base.display()),
    })?;
    let inside = |field: &str, p: &Path| -> Result<(), SpecError> {
        match p.canonicalize() {
            Ok(real) if real.starts_with(&root) => Ok(()),
            _ => Err(SpecError {
                field: field.into(),
                message: format!(
                    "`{}` is outside the server's spec root {} (a spec sent by a client may only name paths inside it; \
                     use a template for others)",
                    p.display(),
                    root.display()
                ),
            }),
        }
    };
    if let Some(s) = &spec.scenario {
        inside("scenario", s)?;
    }
    if let Some(w) = &spec.workspace {
        inside("workspace", w)?;
    }
    Ok(spec)
}

/// Relative `scenario` / `workspace` against `dir`, which must name an existing file / directory.
pub fn resolve_paths(mut spec: JobSpec, dir: &Path) -> Result<JobSpec, SpecError> {
    if let Some(s) = &spec.scenario {
        let p = dir.join(s);
        if !p.is_file() {
            return Err(SpecError { field: "scenario".into(), message: format!("no such file: {}", p.display()) });
        }
        spec.scenario = Some(p);
    }
    if let Some(w) = &spec.workspace {
        let p = dir.join(w);
        if !p.is_dir() {
            return Err(SpecError {
                field: "workspace".into(),
                message: format!("no such directory: {}", p.display()),
            });
        }
        spec.workspace = Some(p);
    }
    Ok(spec)
}

/// Where artifacts live in a workbench.
pub const ARTIFACTS: &str = "artifacts/";

/// The workbench path of an artifact: `PATH` is relative to `artifacts/`
/// (`sizes.md`), or names it (`artifacts/sizes.md`). Refused: empty,
/// absolute, `.`/`..`/empty components, backslashes, control characters —
/// anything that could leave `artifacts/`.
pub fn artifact_path(path: &str) -> Result<String, ArgError> {
    let bad = |why: &str| Err(ArgError::new("path", format!("`{}`: {why}", cut(path, 200))));
    if path.trim().is_empty() {
        return bad("empty");
    }
    if path.len() > 1024 {
        return bad("longer than 1,024 bytes");
    }
    if path.starts_with('/') || path.starts_with('~') {
        return bad("absolute paths are refused: give a path beneath the job's artifacts/");
    }
    if path.contains('\\') || path.chars().any(char::is_control) {
        return bad("backslashes and control characters are refused");
    }
    let rel = path.strip_prefix(ARTIFACTS).unwrap_or(path);
    if rel.is_empty() {
        return bad("names the folder, not a file");
    }
    for part in rel.split('/') {
        match part {
            "" => return bad("empty path component"),
            "." | ".." => return bad("`.` and `..` are refused: the path must stay beneath artifacts/"),
            _ if part.len() > 255 => return bad("a component longer than 255 bytes"),
            _ => {}
        }
    }
    Ok(format!("{ARTIFACTS}{rel}"))
}

/// A MIME type for a file name (what an embedded resource carries).
pub fn mime_for(path: &str) -> &'static str {
    let ext = path.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase()).unwrap_or_default();
    match ext.as_str() {
        "md" => "text/markdown",
        "txt" | "log" | "tsv" => "text/plain",
        "csv" => "text/csv",
        "json" => "application/json",
        "html" | "htm" => "text/html",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "pdf" => "application/pdf",
        "zip" => "application/zip",
        "gz" => "application/gzip",
        _ => "application/octet-stream",
    }
}

/// Text is returned as text: valid UTF-8 without NUL.
pub fn as_text(bytes: &[u8]) -> Option<&str> {
    std::str::from_utf8(bytes).ok().filter(|s| !s.contains('\0'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    use crate::catalog::View;
    use serde::Deserialize;

    #[derive(Debug, Deserialize, JsonSchema)]
    struct One {
        job_id: String,
        #[schemars(range(min = 1, max = 10))]
        timeout_seconds: Option<u64>,
        raw: Option<bool>,
        view: Option<View>,
    }

    #[derive(Debug, Deserialize, JsonSchema)]
    #[allow(dead_code)]
    struct Missing {
        job_id: String,
        missing: String,
    }

    #[derive(Debug, Deserialize, JsonSchema)]
    #[allow(dead_code)]
    struct Narrow {
        #[schemars(range(min = 10, max = 20))]
        timeout_seconds: Option<u64>,
    }

    #[derive(Debug, Deserialize, JsonSchema)]
    #[allow(dead_code)]
    struct Two {
        job_id: String,
        #[schemars(range(min = 1, max = 5))]
        limit: Option<u64>,
        view: Option<View>,
        flag: Option<bool>,
        blank: String,
    }

    #[derive(Debug, Deserialize, JsonSchema)]
    #[allow(dead_code)]
    struct Three {
        text: Option<String>,
        #[schemars(range(min = 0, max = 9))]
        n: Option<u64>,
        #[schemars(range(min = 0, max = 9))]
        f: Option<u64>,
        spec: Option<String>,
    }

    fn err<T: DeserializeOwned + JsonSchema + std::fmt::Debug>(v: Value) -> ArgError {
        parse::<T>(&obj(v)).unwrap_err()
    }

    #[test]
    fn arguments_are_checked_and_errors_name_the_field() {
        let m = obj(json!({"job_id": "abc", "timeout_seconds": 5, "raw": true, "view": "pruned"}));
        let a: One = parse(&m).unwrap();
        assert_eq!(a.job_id, "abc");
        assert_eq!(a.timeout_seconds, Some(5));
        assert_eq!(a.raw, Some(true));
        assert_eq!(a.view, Some(View::Pruned));
        assert_eq!(err::<Missing>(json!({"job_id": "abc"})).field, "missing");
        assert!(err::<Narrow>(json!({"timeout_seconds": 5})).message.contains("out of range"));
        let a: One = parse(&obj(json!({"job_id": "abc", "timeout_seconds": 5.0, "view": null}))).unwrap();
        assert_eq!((a.timeout_seconds, a.view), (Some(5), None));

        let e = err::<Two>(json!({"job_id": 7}));
        assert_eq!((e.field.as_str(), e.message.as_str()), ("job_id", "expected a string, got a number"));
        assert_eq!(err::<Two>(json!({"limit": "ten"})).field, "limit");
        assert!(err::<Two>(json!({"view": "fancy"})).message.contains("not one of: raw, pruned"));
        assert_eq!(err::<Two>(json!({"flag": "yes"})).field, "flag");
        assert_eq!(err::<Two>(json!({"blank": "  "})).message, "must not be empty");
        assert_eq!(err::<Two>(json!({"limit": 6})).field, "limit");

        let e = err::<Missing>(json!({"jobid": "x"}));
        assert_eq!(e.field, "jobid");
        assert!(e.message.contains("job_id"));

        assert!(err::<Three>(json!({"text": "a\u{0}b"})).message.contains("NUL"));
        assert_eq!(err::<Three>(json!({"n": -1})).field, "n");
        assert_eq!(err::<Three>(json!({"f": 2.5})).field, "f");
        assert!(err::<Three>(json!({"spec": "x".repeat(MAX_TEXT + 1)})).message.contains("more than"));
    }

    #[test]
    fn artifact_paths_stay_beneath_artifacts() {
        assert_eq!(artifact_path("sizes.md").unwrap(), "artifacts/sizes.md");
        assert_eq!(artifact_path("artifacts/sizes.md").unwrap(), "artifacts/sizes.md");
        assert_eq!(artifact_path("sub/dir/x.bin").unwrap(), "artifacts/sub/dir/x.bin");
        assert_eq!(artifact_path("..notes").unwrap(), "artifacts/..notes", "a name starting with dots is a name");
        for bad in [
            "",
            "  ",
            "/etc/passwd",
            "~/x",
            "../notes/qa-log.md",
            "artifacts/../notes/brief.md",
            "a/./b",
            "a//b",
            "a/",
            "artifacts/",
            "a\\..\\b",
            "a\nb",
            "..",
        ] {
            let e = artifact_path(bad).unwrap_err();
            assert_eq!(e.field, "path", "{bad:?}");
        }
        assert!(artifact_path(&"x".repeat(2000)).unwrap_err().message.len() < 400, "the path is not echoed whole");
    }

    #[test]
    fn a_template_takes_the_new_goal_and_resolves_its_paths_against_its_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("data")).unwrap();
        std::fs::write(dir.path().join("scenario.yaml"), "roles: []\n").unwrap();
        let spec = "name: survey\ngoal: the old goal\nprovider: sim\nscenario: scenario.yaml\nworkspace: data\n\
                    coordinator: {name: lead}\nworkers:\n  w: {description: does it, tools: [Bash]}\n";
        let path = dir.path().join("job.yaml");
        std::fs::write(&path, spec).unwrap();
        let t = Template::parse_flag(&format!("survey={}", path.display())).unwrap();
        assert_eq!(t.name, "survey");
        let s = t.with_goal("count the files", None).unwrap();
        assert_eq!(s.goal, "count the files");
        assert_eq!(s.name, "survey");
        assert_eq!(s.scenario.as_deref(), Some(dir.path().canonicalize().unwrap().join("scenario.yaml").as_path()));
        assert!(s.workspace.unwrap().ends_with("data"));
        assert_eq!(t.with_goal("x", Some("renamed")).unwrap().name, "renamed");
        let e = t.with_goal("", None).unwrap_err();
        assert_eq!(e.field, "goal", "{e}");

        assert!(Template::parse_flag("no-equals-sign").unwrap_err().contains("NAME=PATH"));
        assert!(Template::parse_flag("bad name=x").unwrap_err().contains("template name"));
        assert!(Template::parse_flag(&format!("t={}", dir.path().join("none.yaml").display())).is_err());
        std::fs::write(dir.path().join("broken.yaml"), "name: x\ngoal: y\n").unwrap();
        let e = Template::parse_flag(&format!("t={}", dir.path().join("broken.yaml").display())).unwrap_err();
        assert!(e.contains("coordinator") || e.contains("workers"), "{e}");
    }

    #[test]
    fn a_spec_as_text_is_validated_naming_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let e = spec_from_text("name: x\ngoal: y\n", dir.path()).unwrap_err();
        assert!(e.field == "coordinator" || e.field == "workers", "{e}");
        let e = spec_from_text("{not json", dir.path()).unwrap_err();
        assert_eq!(e.field, "(document)");
        let spec = "name: x\ngoal: y\nprovider: sim\nscenario: nowhere.yaml\ncoordinator: {name: lead}\n\
                    workers:\n  w: {description: d, tools: [Bash]}\n";
        assert_eq!(spec_from_text(spec, dir.path()).unwrap_err().field, "scenario");
    }

    #[test]
    fn text_and_binary_are_told_apart() {
        assert_eq!(as_text(b"# table\n"), Some("# table\n"));
        assert_eq!(as_text(&[0x89, b'P', b'N', b'G']), None);
        assert_eq!(as_text(b"a\0b"), None);
        assert_eq!(mime_for("artifacts/x.PNG"), "image/png");
        assert_eq!(mime_for("artifacts/x"), "application/octet-stream");
    }

    #[test]
    fn a_client_spec_names_no_path_outside_the_spec_root() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("ws")).unwrap();
        std::fs::write(root.path().join("s.yaml"), "roles: []\n").unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("link")).unwrap();
        let spec = |extra: &str| {
            format!(
                "name: t\ngoal: g\nprovider: sim\nscenario: s.yaml\ncoordinator: {{name: c}}\nworkers:\n  w: {{description: d, tools: [Bash]}}\n{extra}"
            )
        };
        let ok = spec_from_text(&spec("workspace: ws\n"), root.path()).unwrap();
        assert!(ok.workspace.unwrap().ends_with("ws"));
        for (extra, field) in [
            (format!("workspace: {}\n", outside.path().display()), "workspace"),
            ("workspace: ..\n".to_string(), "workspace"),
            ("workspace: link\n".to_string(), "workspace"),
            ("workspace: /\n".to_string(), "workspace"),
        ] {
            let e = spec_from_text(&spec(&extra), root.path()).unwrap_err();
            assert_eq!(e.field, field, "{extra}: {e}");
            assert!(e.message.contains("outside the server's spec root"), "{e}");
        }
        let e =
            spec_from_text(&spec("").replace("scenario: s.yaml", "scenario: /etc/hostname"), root.path()).unwrap_err();
        assert_eq!(e.field, "scenario");
    }
}
