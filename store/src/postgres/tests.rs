//! Plans of the store's statements on a fresh database, and the task columns its statements name.

use deadpool_postgres::ClientWrapper;

use super::PostgresStore;
use super::scratch::ScratchDatabase;
use super::tasks::{INSERT_TASKS, REQUIRED, TASK_COLS, TASK_COLUMNS, WRITE_TASKS};

/// The plan an `EXPLAIN …` prints, its lines joined.
async fn explained(c: &ClientWrapper, explain: &str) -> String {
    let lines: Vec<String> = c
        .simple_query(explain)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
            _ => None,
        })
        .collect();
    lines.join("\n")
}

/// The task writes of a claim and of a turn, and the read of a required
/// end, on the store's own connection of a fresh database (its tables
/// empty, never analyzed): planned once, generic from the first
/// execution, and keyed by the tasks' primary key, not a scan of the
/// table; a statement that must scan is not JIT-compiled.
#[tokio::test]
async fn task_statements_are_keyed_on_a_fresh_database() {
    let admin = std::env::var("FLOWER_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let db = ScratchDatabase::create(&admin).await.expect("Postgres for the test");
    let store = PostgresStore::connect(&db.url, 1).await.unwrap();
    let c = store.pool.get().await.unwrap();
    let id = "'{0190c3a0-0000-7000-8000-000000000001}'";
    let statements = [
        (
            "write_tasks",
            WRITE_TASKS.to_string(),
            format!("({id}, '{{x}}', '{{1}}', '{{NULL}}', '{{NULL}}', '{{NULL}}', '{{\"{{}}\"}}', '{{0}}')"),
        ),
        (
            "insert_tasks",
            INSERT_TASKS.to_string(),
            format!("({id}, {id}, {id}, '{{x}}', '{{x}}', '{{x}}', '{{x}}', '{{}}', 0)"),
        ),
        ("required", REQUIRED.to_string(), format!("({id})")),
    ];
    for (name, sql, args) in statements {
        c.batch_execute(&format!("PREPARE {name} AS {sql}")).await.unwrap();
        let plan = explained(&c, &format!("EXPLAIN EXECUTE {name}{args}")).await;
        assert!(plan.contains("Index") && !plan.contains("Seq Scan on tasks"), "{name}:\n{plan}");
        // Planned once, generic from its first execution on.
        let planned = c
            .query_one("SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = $1", &[&name])
            .await
            .unwrap();
        assert_eq!((planned.get::<_, i64>(0), planned.get::<_, i64>(1)), (1, 0), "{name}");
    }
    c.batch_execute("DEALLOCATE ALL").await.unwrap();
    // A statement with no index path still scans, and is not compiled.
    let counts = explained(&c, "EXPLAIN (ANALYZE) SELECT state, count(*) FROM jobs GROUP BY state").await;
    assert!(counts.contains("Seq Scan on jobs") && !counts.contains("JIT"), "{counts}");
    drop(c);
    drop(store);
    db.drop_now().await.unwrap();
}

#[test]
fn inserted_tasks_answer_the_task_columns_and_whether_created() {
    assert_eq!(TASK_COLS.split(',').count(), TASK_COLUMNS);
    let norm = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let cols = norm(TASK_COLS);
    // The insert's column list, its RETURNING and the snapshot's rows all name TASK_COLS.
    assert_eq!(norm(&INSERT_TASKS).matches(&cols).count(), 3, "{}", *INSERT_TASKS);
}
