//! The hostile-input suite: a corpus of bad requests against every RPC of a
//! running coordinator — bad and oversized ids, NUL bytes, undecodable
//! protobuf, bad job specs field by field, bad workspace and artifact paths,
//! bad tokens — each with the one status its kind of bad input gets. After the
//! corpus, the service is still healthy and nothing was written for a refused
//! request.
//!
//! The default run sends the corpus (several hundred requests). The heavy
//! version adds seeded random mutations of valid requests:
//! `cargo test -p flower-cli --test e2e -- --ignored hostile --nocapture`
//! (`FLOWER_HOSTILE_SEED` replays a run, `FLOWER_HOSTILE_CASES` sets how many).

use prost::Message;
use rand::{Rng, SeedableRng};
use tonic::Code;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::metadata::MetadataValue;

use crate::cluster::{Cluster, Options};
use crate::support::repo;
use flower_proto::v1 as pb;

const TOKEN: &str = "hostile-s3cret";

/// Request bytes as given, response bytes as received: the corpus speaks
/// protobuf on the wire, including what no client library would send.
#[derive(Default, Clone)]
struct Raw;

impl Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        bytes::BufMut::put_slice(dst, &item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        let n = bytes::Buf::remaining(src);
        Ok(Some(bytes::Buf::copy_to_bytes(src, n).to_vec()))
    }
}

#[derive(Clone, Copy, PartialEq, Debug)]
pub(crate) enum Rpc {
    Submit,
    Get,
    List,
    Watch,
    Cancel,
    Interrupt,
    GetTranscript,
    ListArtifacts,
    GetArtifact,
    GetContext,
    Answer,
    Aside,
    Continue,
    GetWorkflow,
}

pub(crate) const RPCS: [Rpc; 14] = [
    Rpc::Submit,
    Rpc::Get,
    Rpc::List,
    Rpc::Watch,
    Rpc::Cancel,
    Rpc::Interrupt,
    Rpc::GetTranscript,
    Rpc::ListArtifacts,
    Rpc::GetArtifact,
    Rpc::GetContext,
    Rpc::Answer,
    Rpc::Aside,
    Rpc::Continue,
    Rpc::GetWorkflow,
];

impl Rpc {
    fn path(self) -> &'static str {
        match self {
            Rpc::Submit => "/flower.v1.Flower/Submit",
            Rpc::Get => "/flower.v1.Flower/Get",
            Rpc::List => "/flower.v1.Flower/List",
            Rpc::Watch => "/flower.v1.Flower/Watch",
            Rpc::Cancel => "/flower.v1.Flower/Cancel",
            Rpc::Interrupt => "/flower.v1.Flower/Interrupt",
            Rpc::GetTranscript => "/flower.v1.Flower/GetTranscript",
            Rpc::ListArtifacts => "/flower.v1.Flower/ListArtifacts",
            Rpc::GetArtifact => "/flower.v1.Flower/GetArtifact",
            Rpc::GetContext => "/flower.v1.Flower/GetContext",
            Rpc::Answer => "/flower.v1.Flower/Answer",
            Rpc::Aside => "/flower.v1.Flower/Aside",
            Rpc::Continue => "/flower.v1.Flower/Continue",
            Rpc::GetWorkflow => "/flower.v1.Flower/GetWorkflow",
        }
    }

    fn streaming(self) -> bool {
        matches!(self, Rpc::Watch | Rpc::GetArtifact)
    }

    /// A request naming `job` (with the other fields valid).
    pub(crate) fn with_job(self, job: &str) -> Vec<u8> {
        let job_id = job.to_string();
        match self {
            Rpc::Submit | Rpc::List => unreachable!("no job id"),
            Rpc::Get => pb::GetRequest { job_id }.encode_to_vec(),
            Rpc::Watch => pb::WatchRequest { job_id, after_seq: 0 }.encode_to_vec(),
            Rpc::Cancel => pb::CancelRequest { job_id, reason: String::new() }.encode_to_vec(),
            Rpc::Interrupt => pb::InterruptRequest { job_id, message: "hello".into() }.encode_to_vec(),
            Rpc::GetTranscript => pb::GetTranscriptRequest { job_id, ..Default::default() }.encode_to_vec(),
            Rpc::ListArtifacts => pb::ListArtifactsRequest { job_id }.encode_to_vec(),
            Rpc::GetArtifact => pb::GetArtifactRequest { job_id, path: "artifacts/x.md".into() }.encode_to_vec(),
            Rpc::GetContext => pb::GetContextRequest { job_id }.encode_to_vec(),
            Rpc::Answer => pb::AnswerRequest { job_id, text: "CSV".into(), ..Default::default() }.encode_to_vec(),
            Rpc::Aside => pb::AsideRequest { job_id, question: "what now?".into() }.encode_to_vec(),
            Rpc::Continue => {
                pb::ContinueRequest { job_id, instruction: "also this".into(), ..Default::default() }.encode_to_vec()
            }
            Rpc::GetWorkflow => pb::GetWorkflowRequest { job_id }.encode_to_vec(),
        }
    }

    /// A well-formed request of this RPC (for the auth cases).
    pub(crate) fn valid(self) -> Vec<u8> {
        match self {
            Rpc::Submit => pb::SubmitRequest { spec: spec(), ..Default::default() }.encode_to_vec(),
            Rpc::List => pb::ListRequest { limit: 5, page_token: String::new(), ..Default::default() }.encode_to_vec(),
            other => other.with_job(&uuid::Uuid::new_v4().to_string()),
        }
    }
}

struct Case {
    label: String,
    rpc: Rpc,
    body: Vec<u8>,
    /// `authorization` header value; `None` sends none.
    auth: Option<String>,
    want: Code,
    /// The message must contain this (usually the field's name).
    says: Option<String>,
}

fn case(label: impl Into<String>, rpc: Rpc, body: Vec<u8>, want: Code, says: Option<&str>) -> Case {
    Case { label: label.into(), rpc, body, auth: Some(format!("Bearer {TOKEN}")), want, says: says.map(Into::into) }
}

fn spec() -> String {
    std::fs::read_to_string(repo().join("tests/fixtures/distributed/slow.yaml")).unwrap()
}

fn submit(spec: String) -> Vec<u8> {
    pb::SubmitRequest { spec, ..Default::default() }.encode_to_vec()
}

/// Job-spec mutations and the field each error must name.
fn spec_cases() -> Vec<(String, String, &'static str)> {
    let s = spec();
    let rt = |r: &str| format!("{s}runtime:\n{r}\n");
    let nul = "a\\0b";
    let mut out: Vec<(String, String, &'static str)> = vec![
        ("NUL in name".into(), s.replacen("name: slow\n", &format!("name: \"{nul}\"\n"), 1), "name"),
        ("NUL in goal".into(), s.replace("goal: Run one task longer than the ack wait.", &format!("goal: \"{nul}\"")), "goal"),
        ("NUL in coordinator name".into(), s.replace("name: slowpoke", &format!("name: \"{nul}\"")), "coordinator.name"),
        ("NUL in worker description".into(), s.replace("description: sleeps", &format!("description: \"{nul}\"")), "workers.sleeper.description"),
        ("NUL in worker name".into(), s.replace("  sleeper:", "  \"sl\\0eeper\":"), "workers"),
        ("1 MB name".into(), s.replacen("name: slow\n", &format!("name: {}\n", "n".repeat(1 << 20)), 1), "name"),
        ("300 KiB goal".into(), s.replace("goal: Run", &format!("goal: {} Run", "g".repeat(300 << 10))), "goal"),
        ("max_turns 2^32-1".into(), rt("  max_turns: 4294967295"), "runtime.max_turns"),
        ("worker_max_turns 2^32-1".into(), rt("  worker_max_turns: 4294967295"), "runtime.worker_max_turns"),
        ("concurrency 2^32-1".into(), rt("  concurrency: 4294967295"), "runtime.concurrency"),
        ("max_output_tokens 2^32-1".into(), rt("  max_output_tokens: 4294967295"), "runtime.max_output_tokens"),
        ("max_turns 2^40".into(), rt("  max_turns: 1099511627776"), "runtime.max_turns"),
        ("max_turns -1".into(), rt("  max_turns: -1"), "runtime.max_turns"),
        ("max_turns 0".into(), rt("  max_turns: 0"), "runtime.max_turns"),
        ("max_turns text".into(), rt("  max_turns: many"), "runtime.max_turns"),
        ("max_turns float".into(), rt("  max_turns: 1.5"), "runtime.max_turns"),
        ("bash_timeout 10y".into(), rt("  bash_timeout: 10y"), "runtime.bash_timeout"),
        ("bash_timeout 11m".into(), rt("  bash_timeout: 11m"), "runtime.bash_timeout"),
        ("bash_timeout 0s".into(), rt("  bash_timeout: 0s"), "runtime.bash_timeout"),
        ("bash_timeout text".into(), rt("  bash_timeout: forever"), "runtime.bash_timeout"),
        ("bash_output_limit 0".into(), rt("  bash_output_limit: 0 B"), "runtime.bash_output_limit"),
        ("bash_output_limit 1 EiB".into(), rt("  bash_output_limit: 1 EiB"), "runtime.bash_output_limit"),
        ("runtime []".into(), format!("{s}runtime: []\n"), "runtime"),
        ("runtime text".into(), format!("{s}runtime: fast\n"), "runtime"),
        ("unknown runtime field".into(), rt("  max_turn: 3"), "runtime.max_turn"),
        ("zero token budget".into(), rt("  budget: {max_tokens: 0}"), "runtime.budget.max_tokens"),
        ("zero cost budget".into(), rt("  budget: {max_cost_usd: 0}"), "runtime.budget.max_cost_usd"),
        ("negative cost budget".into(), rt("  budget: {max_cost_usd: -1}"), "runtime.budget.max_cost_usd"),
        ("zero deadline".into(), rt("  budget: {deadline: 0s}"), "runtime.budget.deadline"),
        ("duplicate tools".into(), s.replace("tools: [Bash]", "tools: [Bash, Bash]"), "workers.sleeper.tools[1]"),
        ("unknown tool".into(), s.replace("tools: [Bash]", "tools: [Bsh]"), "workers.sleeper.tools[0]"),
        ("tools not a list".into(), s.replace("tools: [Bash]", "tools: Bash"), "workers.sleeper.tools"),
        ("unknown top field".into(), format!("{s}colour: red\n"), "colour"),
        ("unknown worker field".into(), s.replace("description: sleeps", "description: sleeps\n    colour: red"), "workers.sleeper.colour"),
        ("no workers".into(), s.replace("workers:\n  sleeper:\n    description: sleeps\n    tools: [Bash]\n", "workers: {}\n"), "workers"),
        ("workers a list".into(), s.replace("workers:\n  sleeper:\n    description: sleeps\n    tools: [Bash]\n", "workers: []\n"), "workers"),
        ("unknown provider".into(), s.replace("provider: anthropic", "provider: openai"), "provider"),
        ("ftp base_url".into(), format!("{s}base_url: ftp://x\n"), "base_url"),
        ("scenario with anthropic".into(), format!("{s}scenario: x.yaml\n"), "scenario"),
        ("MCP server command".into(), format!("{s}mcp_servers:\n  evil:\n    command: [sh, -c, id]\n"), "mcp_servers.evil"),
        ("MCP env_from a service variable".into(), format!("{s}mcp_servers:\n  fx:\n    command: [flower, mcp-fixture]\n    env_from: {{DB: FLOWER_DATABASE_URL}}\n"), "mcp_servers.fx.env_from"),
        ("MCP token_env a service variable".into(), format!("{s}mcp_servers:\n  fx:\n    url: http://127.0.0.1:9/mcp\n    token_env: FLOWER_DATABASE_URL\n"), "mcp_servers.fx.token_env"),
        ("YAML bomb".into(), "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\ne: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]\ng: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]\nh: [*g, *g, *g, *g, *g, *g, *g, *g, *g]\n".into(), "(document)"),
        ("deep nesting".into(), format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)), "(document)"),
        ("a list".into(), "- a\n- b\n".into(), "(document)"),
        ("null".into(), "null".into(), "(document)"),
        ("a number".into(), "42".into(), "(document)"),
        ("broken JSON".into(), "{\"name\": ".into(), "(document)"),
        ("empty".into(), String::new(), "spec"),
        ("whitespace".into(), " \n\t ".into(), "spec"),
    ];
    out.push(("missing coordinator".into(), s.replace("coordinator:\n  name: slowpoke\n", ""), "coordinator"));
    out
}

/// Every case of the corpus; `job` is a finished job of the cluster.
fn corpus(job: &str, session: &str) -> Vec<Case> {
    use Code::*;
    let mut cases = Vec::new();
    // Authentication, on every RPC.
    for rpc in RPCS {
        for (label, auth) in [
            ("no token", None),
            ("wrong token", Some("Bearer nope".to_string())),
            ("lowercase scheme", Some(format!("bearer {TOKEN}"))),
            ("token with a trailing space", Some(format!("Bearer {TOKEN} "))),
            ("basic auth", Some("Basic dXNlcjpwYXNz".to_string())),
        ] {
            cases.push(Case {
                label: format!("{rpc:?}: {label}"),
                rpc,
                body: rpc.valid(),
                auth,
                want: Unauthenticated,
                says: None,
            });
        }
    }
    // Undecodable messages, on every RPC.
    let garbage: [(&str, Vec<u8>); 6] = [
        ("random bytes", vec![0xff; 16]),
        ("truncated varint", vec![0x0a, 0xff]),
        ("wrong wire type", vec![0x0b]),
        ("invalid UTF-8 in a string", vec![0x0a, 0x02, 0xc3, 0x28]),
        ("length past the end", vec![0x0a, 0x80, 0x80, 0x80, 0x80, 0x10]),
        ("group end without start", vec![0x0c]),
    ];
    for rpc in RPCS {
        for (label, body) in &garbage {
            cases.push(case(format!("{rpc:?}: {label}"), rpc, body.clone(), InvalidArgument, Some("decoded")));
        }
    }
    // Bad ids, on every RPC that takes a job id.
    let long = "a".repeat(10_000);
    let bad_ids: Vec<(&str, String)> = vec![
        ("empty id", String::new()),
        ("not an id", "not-an-id".into()),
        ("10,000-character id", long),
        ("NUL in an id", "a\0b".into()),
        ("path as an id", "../../etc/passwd".into()),
        ("blank id", " ".into()),
        ("bidi control", "\u{202e}abc".into()),
        ("short number", "123".into()),
        ("bad hex digit", "00000000-0000-0000-0000-00000000000g".into()),
        ("uuid with junk", format!("{}x", uuid::Uuid::new_v4())),
        ("uuid with NUL", format!("{}\0", uuid::Uuid::new_v4())),
        ("65-character id", "b".repeat(65)),
    ];
    for rpc in RPCS.into_iter().filter(|r| !matches!(r, Rpc::Submit | Rpc::List)) {
        for (label, id) in &bad_ids {
            cases.push(case(format!("{rpc:?}: {label}"), rpc, rpc.with_job(id), InvalidArgument, Some("job_id")));
        }
        let unknown = uuid::Uuid::new_v4().to_string();
        cases.push(case(format!("{rpc:?}: unknown job"), rpc, rpc.with_job(&unknown), NotFound, None));
    }
    // Job specs, field by field.
    for (label, text, field) in spec_cases() {
        cases.push(case(format!("Submit: {label}"), Rpc::Submit, submit(text), InvalidArgument, Some(field)));
    }
    let over = format!("{}# {}\n", spec(), "x".repeat(17 << 20));
    cases.push(case("Submit: 17 MiB spec", Rpc::Submit, submit(over), ResourceExhausted, Some("limit")));
    // Other Submit fields.
    let with = |key: &str, files: Vec<(&str, &[u8])>| {
        pb::SubmitRequest {
            spec: spec(),
            idempotency_key: key.to_string(),
            workspace: files
                .into_iter()
                .map(|(p, c)| pb::WorkspaceFile { path: p.to_string(), content: c.to_vec() })
                .collect(),
            ..Default::default()
        }
        .encode_to_vec()
    };
    for (label, key) in [
        ("NUL in idempotency key", "k\0".to_string()),
        ("1 MB idempotency key", "k".repeat(1 << 20)),
        ("257-byte idempotency key", "k".repeat(257)),
    ] {
        cases.push(case(
            format!("Submit: {label}"),
            Rpc::Submit,
            with(&key, vec![]),
            InvalidArgument,
            Some("idempotency_key"),
        ));
    }
    let long_path = "p".repeat(5000);
    let long_component = format!("a/{}", "c".repeat(300));
    type Files<'a> = Vec<(&'a str, &'a [u8])>;
    let paths: Vec<(&str, Files, &str)> = vec![
        ("parent escape", vec![("../x", b"x")], "workspace[0].path"),
        ("absolute path", vec![("/etc/x", b"x")], "workspace[0].path"),
        ("NUL in a path", vec![("a\0b", b"x")], "workspace[0].path"),
        ("5,000-character path", vec![(&long_path, b"x")], "workspace[0].path"),
        ("300-character component", vec![(&long_component, b"x")], "workspace[0].path"),
        ("empty path", vec![("", b"x")], "workspace[0].path"),
        ("double slash", vec![("a//b", b"x")], "workspace[0].path"),
        ("dot segment", vec![("./a", b"x")], "workspace[0].path"),
        ("trailing slash", vec![("a/", b"x")], "workspace[0].path"),
        ("dot", vec![(".", b"x")], "workspace[0].path"),
        ("a file and a path beneath it", vec![("zz", b"x"), ("zz/b", b"y")], "workspace[1].path"),
        ("the same path twice", vec![("a.txt", b"x"), ("a.txt", b"y")], "workspace[1].path"),
        ("beneath a file, deeper", vec![("d/e/f", b"x"), ("d", b"y")], "workspace[0].path"),
    ];
    for (label, files, field) in paths {
        cases.push(case(format!("Submit: {label}"), Rpc::Submit, with("", files), InvalidArgument, Some(field)));
    }
    // A finished job: what it refuses, and bad fields beside its valid id.
    let job_s = job.to_string();
    let interrupt = |m: String| pb::InterruptRequest { job_id: job_s.clone(), message: m }.encode_to_vec();
    cases.push(case(
        "Interrupt: empty message",
        Rpc::Interrupt,
        interrupt(String::new()),
        InvalidArgument,
        Some("message"),
    ));
    cases.push(case(
        "Interrupt: NUL in message",
        Rpc::Interrupt,
        interrupt("hi\0".into()),
        InvalidArgument,
        Some("message"),
    ));
    cases.push(case(
        "Interrupt: 300 KiB message",
        Rpc::Interrupt,
        interrupt("m".repeat(300 << 10)),
        InvalidArgument,
        Some("message"),
    ));
    cases.push(case(
        "Interrupt: a finished job",
        Rpc::Interrupt,
        interrupt("hi".into()),
        FailedPrecondition,
        Some("already"),
    ));
    let cont = |i: String, k: String| {
        pb::ContinueRequest { job_id: job_s.clone(), instruction: i, idempotency_key: k }.encode_to_vec()
    };
    for (label, i, k, field) in [
        ("empty instruction", String::new(), String::new(), "instruction"),
        ("blank instruction", " \n ".into(), String::new(), "instruction"),
        ("NUL in instruction", "a\0b".into(), String::new(), "instruction"),
        ("300 KiB instruction", "i".repeat(300 << 10), String::new(), "instruction"),
        ("NUL in idempotency key", "ok".into(), "k\0".into(), "idempotency_key"),
        ("257-byte idempotency key", "ok".into(), "k".repeat(257), "idempotency_key"),
    ] {
        cases.push(case(format!("Continue: {label}"), Rpc::Continue, cont(i, k), InvalidArgument, Some(field)));
    }
    let cancel = |r: String| pb::CancelRequest { job_id: job_s.clone(), reason: r }.encode_to_vec();
    cases.push(case("Cancel: NUL in reason", Rpc::Cancel, cancel("r\0".into()), InvalidArgument, Some("reason")));
    cases.push(case(
        "Cancel: 5,000-byte reason",
        Rpc::Cancel,
        cancel("r".repeat(5000)),
        InvalidArgument,
        Some("reason"),
    ));
    cases.push(case("Cancel: a finished job", Rpc::Cancel, cancel(String::new()), FailedPrecondition, Some("already")));
    let artifact = |p: String| pb::GetArtifactRequest { job_id: job_s.clone(), path: p }.encode_to_vec();
    for (label, p) in [
        ("empty path", String::new()),
        ("NUL in path", "artifacts/a\0b".into()),
        ("5,000-character path", "p".repeat(5000)),
        ("parent escape", "../../etc/passwd".into()),
        ("absolute path", "/etc/passwd".into()),
        ("double slash", "artifacts//x".into()),
    ] {
        cases.push(case(format!("GetArtifact: {label}"), Rpc::GetArtifact, artifact(p), InvalidArgument, Some("path")));
    }
    cases.push(case(
        "GetArtifact: no such file",
        Rpc::GetArtifact,
        artifact("artifacts/none.md".into()),
        NotFound,
        None,
    ));
    let transcript = |s: &str, after_seq: i64| {
        pb::GetTranscriptRequest { job_id: job_s.clone(), session_id: s.to_string(), after_seq, limit: 0 }
            .encode_to_vec()
    };
    for (label, s) in [
        ("session id NUL", "a\0".to_string()),
        ("10,000-character session id", "s".repeat(10_000)),
        ("session id not an id", "nope".into()),
    ] {
        cases.push(case(
            format!("GetTranscript: {label}"),
            Rpc::GetTranscript,
            transcript(&s, 0),
            InvalidArgument,
            Some("session_id"),
        ));
    }
    cases.push(case(
        "GetTranscript: unknown session",
        Rpc::GetTranscript,
        transcript(&uuid::Uuid::new_v4().to_string(), 0),
        NotFound,
        None,
    ));
    cases.push(case(
        "GetTranscript: negative cursor",
        Rpc::GetTranscript,
        transcript(session, -1),
        InvalidArgument,
        Some("after_seq"),
    ));
    cases.push(case(
        "Watch: negative cursor",
        Rpc::Watch,
        pb::WatchRequest { job_id: job_s.clone(), after_seq: -5 }.encode_to_vec(),
        InvalidArgument,
        Some("after_seq"),
    ));
    cases.push(case(
        "List: a page token",
        Rpc::List,
        pb::ListRequest { limit: 1, page_token: "x".into(), ..Default::default() }.encode_to_vec(),
        InvalidArgument,
        Some("page_token"),
    ));
    cases
}

/// Send one request; the status it got (`Ok` when accepted).
pub(crate) async fn send(
    channel: &tonic::transport::Channel,
    rpc: Rpc,
    body: Vec<u8>,
    auth: Option<&str>,
) -> tonic::Status {
    let mut grpc = tonic::client::Grpc::new(channel.clone()).max_decoding_message_size(64 << 20);
    grpc.ready().await.unwrap();
    let mut req = tonic::Request::new(body);
    if let Some(a) = auth
        && let Ok(v) = MetadataValue::try_from(a)
    {
        req.metadata_mut().insert("authorization", v);
    }
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(rpc.path());
    let result = if rpc.streaming() {
        match grpc.server_streaming(req, path, Raw).await {
            Ok(resp) => {
                let mut stream = resp.into_inner();
                loop {
                    match stream.message().await {
                        Ok(Some(_)) => continue,
                        Ok(None) => break Ok(()),
                        Err(s) => break Err(s),
                    }
                }
            }
            Err(s) => Err(s),
        }
    } else {
        grpc.unary(req, path, Raw).await.map(|_| ())
    };
    result.err().unwrap_or_else(|| tonic::Status::ok(""))
}

async fn counts(c: &Cluster) -> (i64, i64, i64) {
    let pg = c.pg().await;
    let one = |q: &'static str| {
        let pg = &pg;
        async move { pg.query_one(q, &[]).await.unwrap().get::<_, i64>(0) }
    };
    (
        one("SELECT count(*) FROM jobs").await,
        one("SELECT count(*) FROM events").await,
        one("SELECT count(*) FROM entries").await,
    )
}

async fn healthy(channel: &tonic::transport::Channel) {
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    let h = health.check(tonic_health::pb::HealthCheckRequest { service: String::new() }).await.unwrap().into_inner();
    assert_eq!(h.status, tonic_health::pb::health_check_response::ServingStatus::Serving as i32);
}

/// A cluster with one finished job: (cluster, channel, job, a session of it).
async fn start() -> (Cluster, tonic::transport::Channel, String, String) {
    let mut c = Cluster::start(Options { workers: 1, token: Some(TOKEN), ..Default::default() }).await;
    let job = c.submit(&repo().join("tests/fixtures/distributed/slow.yaml"));
    c.wait_job(&job, "succeeded").await;
    let pg = c.pg().await;
    let session: String = pg
        .query_one(&format!("SELECT id::text FROM sessions WHERE job_id = '{job}' LIMIT 1"), &[])
        .await
        .unwrap()
        .get(0);
    let channel = tonic::transport::Channel::from_shared(c.server()).unwrap().connect().await.unwrap();
    (c, channel, job, session)
}

fn check_message(label: &str, s: &tonic::Status, c: &Cluster) {
    assert!(s.message().len() <= 1024, "{label}: a {}-byte message echoes the input", s.message().len());
    assert!(!s.message().contains(&c.objects_dir()), "{label}: the message shows a server path: {}", s.message());
    assert!(!s.message().contains("postgres://"), "{label}: {}", s.message());
}

/// Acceptance: every case of the corpus gets its status; the service stays
/// healthy; nothing is written for a refused request.
#[tokio::test(flavor = "multi_thread")]
async fn hostile_inputs_get_their_status_and_write_nothing() {
    let (c, channel, job, session) = start().await;
    let before = counts(&c).await;
    let cases = corpus(&job, &session);
    assert!(cases.len() >= 300, "the corpus has {} cases", cases.len());
    let mut wrong = Vec::new();
    for k in &cases {
        let s = send(&channel, k.rpc, k.body.clone(), k.auth.as_deref()).await;
        check_message(&k.label, &s, &c);
        let said = k.says.as_ref().is_none_or(|w| s.message().contains(w.as_str()));
        if s.code() != k.want || !said {
            wrong.push(format!("{}: want {:?} ({:?}), got {:?}: {}", k.label, k.want, k.says, s.code(), s.message()));
        }
    }
    assert!(wrong.is_empty(), "{} of {} cases got the wrong status:\n{}", wrong.len(), cases.len(), wrong.join("\n"));
    healthy(&channel).await;
    assert_eq!(counts(&c).await, before, "refused requests wrote nothing (jobs, events, entries)");
    println!("hostile corpus: {} requests, every status as listed", cases.len());
    c.stop().await;
}

/// Watch on a finished job whose cursor is at or past its end ends at once.
#[tokio::test(flavor = "multi_thread")]
async fn watch_ends_at_once_past_the_end_of_a_finished_job() {
    let (c, channel, job, _) = start().await;
    let pg = c.pg().await;
    let last: i64 =
        pg.query_one(&format!("SELECT max(seq) FROM events WHERE job_id = '{job}'"), &[]).await.unwrap().get(0);
    let mut api = pb::flower_client::FlowerClient::new(channel.clone());
    for after_seq in [last, last + 1000] {
        let mut req = tonic::Request::new(pb::WatchRequest { job_id: job.clone(), after_seq });
        req.metadata_mut().insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
        // Well inside the server's 2 s re-read: an end that comes from a re-read fails this.
        let ended = tokio::time::timeout(std::time::Duration::from_millis(1500), async {
            let mut stream = api.watch(req).await.unwrap().into_inner();
            stream.message().await.unwrap()
        })
        .await
        .expect("the stream ended at once");
        assert!(ended.is_none(), "no event past the end");
    }
    c.stop().await;
}

/// gRPC reflection is served in v1 and v1alpha, behind the same token.
#[tokio::test(flavor = "multi_thread")]
async fn reflection_speaks_v1alpha_too() {
    use tonic_reflection::pb::v1alpha::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1alpha::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1alpha::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1alpha::{ServerReflectionRequest, ServerReflectionResponse};
    let (c, channel, _, _) = start().await;
    let ask = |token: Option<&str>| {
        let mut req = tonic::Request::new(tokio_stream::iter(vec![ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        }]));
        if let Some(t) = token {
            req.metadata_mut().insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        req
    };
    let mut client = ServerReflectionClient::new(channel.clone());
    let e = client.server_reflection_info(ask(None)).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "the same auth as the API");
    let mut stream = client.server_reflection_info(ask(Some(TOKEN))).await.unwrap().into_inner();
    let reply: ServerReflectionResponse = stream.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = reply.message_response else { panic!("{reply:?}") };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(names.contains(&"flower.v1.Flower".to_string()), "{names:?}");
    c.stop().await;
}

/// Heavy: the corpus plus seeded random mutations of valid requests; no
/// mutation may get INTERNAL, UNKNOWN or UNAVAILABLE, the service stays
/// healthy, and jobs are written only for accepted submits.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "heavy: run with --ignored hostile"]
async fn hostile_inputs_heavy_random_mutations() {
    let seed: u64 = std::env::var("FLOWER_HOSTILE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random);
    let n: usize = std::env::var("FLOWER_HOSTILE_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(5000);
    println!("hostile seed: {seed} (FLOWER_HOSTILE_SEED={seed} replays it), {n} mutations");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (c, channel, job, session) = start().await;
    let base: Vec<(Rpc, Vec<u8>)> = corpus(&job, &session)
        .into_iter()
        .filter(|k| k.auth.as_deref() == Some(&format!("Bearer {TOKEN}")) && k.body.len() < 64 << 10)
        .map(|k| (k.rpc, k.body))
        .chain(RPCS.into_iter().map(|r| (r, r.valid())))
        .collect();
    let before = counts(&c).await;
    let mut accepted = 0i64;
    let auth = format!("Bearer {TOKEN}");
    for i in 0..n {
        let (rpc, mut body) = base[rng.random_range(0..base.len())].clone();
        for _ in 0..rng.random_range(1..4) {
            match rng.random_range(0..4) {
                0 if !body.is_empty() => {
                    let at = rng.random_range(0..body.len());
                    body[at] ^= 1 << rng.random_range(0..8);
                }
                1 if !body.is_empty() => body.truncate(rng.random_range(0..body.len())),
                2 => {
                    let at = rng.random_range(0..=body.len());
                    body.insert(at, rng.random());
                }
                _ => body.extend((0..rng.random_range(1..8)).map(|_| rng.random::<u8>())),
            }
        }
        let s = send(&channel, rpc, body, Some(&auth)).await;
        check_message(&format!("mutation {i} of {rpc:?}"), &s, &c);
        assert!(
            !matches!(s.code(), Code::Internal | Code::Unknown | Code::Unavailable),
            "mutation {i} of {rpc:?}: {:?}: {}",
            s.code(),
            s.message()
        );
        // A submit, or a continue of the finished job, creates a job.
        if matches!(rpc, Rpc::Submit | Rpc::Continue) && s.code() == Code::Ok {
            accepted += 1;
        }
    }
    healthy(&channel).await;
    let after = counts(&c).await;
    assert!(after.0 - before.0 <= accepted, "jobs were written only for accepted submits and continues");
    println!("{n} mutations: {accepted} submits accepted, no internal error, still serving");
    c.stop().await;
}
