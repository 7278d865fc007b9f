//! The one suite every bus implementation must pass (feature `testsuite`:
//! tests only). Each check is a public function given a fresh, isolated bus
//! and how long an unacknowledged delivery takes to come back;
//! [`bus_conformance_tests!`](crate::bus_conformance_tests) makes one test per
//! check, so one failing check does not hide the others. A new check is
//! listed in the macro too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use flower_model::{JobId, TaskId};

use crate::{Heard, Notice, Notifier, TaskMessage, TaskQueue};

/// A task message with every field set (the tests' and the suite's).
pub fn msg() -> TaskMessage {
    TaskMessage {
        job_id: JobId::random(),
        task_id: TaskId::random(),
        worker: "w".into(),
        epoch: 1,
        // A requeued task's count travels with it.
        base_attempt: 2,
        trace: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
        body: Some(crate::TaskBody {
            parent_session: flower_model::SessionId::random(),
            tool_use_id: "toolu_1".into(),
            description: "d".into(),
            mandate: "do the thing".into(),
        }),
        republish: 0,
        stream_notice: true,
    }
}

/// One `#[tokio::test]` per check, for one bus. `make` names an async
/// function returning `(bus, redelivery)`: a fresh, isolated bus and the
/// bound on the wait for an abandoned delivery; `teardown` an async function
/// given the bus back once its check passed. The calling crate needs `tokio`
/// with its `macros` feature.
#[macro_export]
macro_rules! bus_conformance_tests {
    (make: $make:path, teardown: $teardown:path $(,)?) => {
        $crate::bus_conformance_tests!(@each $make, $teardown;
            dedupe,
            settled_messages_stay_settled,
            naks_and_abandoned_deliveries_come_back,
            competing_consumers,
            lag_counts_waiting_and_in_flight,
            notices_fan_out,
        );
    };
    (@each $make:path, $teardown:path; $($check:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $check() {
                let (bus, redelivery) = $make().await;
                $crate::conformance::$check(&bus, redelivery).await;
                $teardown(bus).await;
            }
        )*
    };
}

async fn next_within<B: TaskQueue>(bus: &B, d: Duration) -> Box<dyn crate::Delivery> {
    tokio::time::timeout(d, bus.next()).await.expect("a delivery in time").unwrap()
}

pub async fn dedupe<B: TaskQueue>(bus: &B, _redelivery: Duration) {
    let m = msg();
    assert!(bus.publish(m.clone()).await.unwrap());
    assert!(!bus.publish(m.clone()).await.unwrap(), "the same dedupe id is dropped");
    let d = next_within(bus, Duration::from_secs(5)).await;
    assert_eq!(d.message(), &m, "payload round-trips");
    assert_eq!(d.delivered(), 1);
    d.ack().await.unwrap();
}

pub async fn settled_messages_stay_settled<B: TaskQueue>(bus: &B, _redelivery: Duration) {
    let (a, b, c) = (msg(), msg(), msg());
    bus.publish(a.clone()).await.unwrap();
    next_within(bus, Duration::from_secs(5)).await.ack().await.unwrap();
    bus.publish(b.clone()).await.unwrap();
    next_within(bus, Duration::from_secs(5)).await.term().await.unwrap();
    bus.publish(c.clone()).await.unwrap();
    let d = next_within(bus, Duration::from_secs(5)).await;
    assert_eq!(d.message(), &c, "acked and terminated messages are not delivered again");
    d.ack().await.unwrap();
}

pub async fn naks_and_abandoned_deliveries_come_back<B: TaskQueue>(bus: &B, redelivery: Duration) {
    let m = msg();
    bus.publish(m.clone()).await.unwrap();
    let d = next_within(bus, Duration::from_secs(5)).await;
    d.nak(None).await.unwrap();
    let d = next_within(bus, Duration::from_secs(5)).await;
    assert_eq!((d.message(), d.delivered()), (&m, 2), "a nak redelivers with the next attempt number");
    d.progress().await.unwrap();
    drop(d);
    let d = next_within(bus, redelivery + Duration::from_secs(5)).await;
    assert_eq!((d.message(), d.delivered()), (&m, 3), "an abandoned delivery comes back");
    d.ack().await.unwrap();
}

pub async fn competing_consumers<B: TaskQueue>(bus: &B, _redelivery: Duration) {
    let (m1, m2) = (msg(), msg());
    bus.publish(m1.clone()).await.unwrap();
    bus.publish(m2.clone()).await.unwrap();
    let (d1, d2) = tokio::join!(next_within(bus, Duration::from_secs(5)), next_within(bus, Duration::from_secs(5)));
    let mut got = vec![d1.message().task_id, d2.message().task_id];
    got.sort();
    let mut want = vec![m1.task_id, m2.task_id];
    want.sort();
    assert_eq!(got, want, "each message goes to one consumer");
    d1.ack().await.unwrap();
    d2.ack().await.unwrap();
}

pub async fn lag_counts_waiting_and_in_flight<B: TaskQueue>(bus: &B, _redelivery: Duration) {
    assert_eq!(bus.lag().await.unwrap(), 0, "an empty queue");
    bus.publish(msg()).await.unwrap();
    bus.publish(msg()).await.unwrap();
    assert_eq!(bus.lag().await.unwrap(), 2, "two waiting");
    let d = next_within(bus, Duration::from_secs(5)).await;
    assert_eq!(bus.lag().await.unwrap(), 2, "one waiting, one in flight");
    d.ack().await.unwrap();
    assert_eq!(bus.lag().await.unwrap(), 1, "an acked message leaves");
    let d = next_within(bus, Duration::from_secs(5)).await;
    d.term().await.unwrap();
    assert_eq!(bus.lag().await.unwrap(), 0, "a terminated message leaves");
}

pub async fn notices_fan_out<B: Notifier>(bus: &B, _redelivery: Duration) {
    let (mut s1, mut s2) = (bus.subscribe(), bus.subscribe());
    let job = JobId::random();
    let sent = [
        Notice::Events { job, seq: 7 },
        Notice::TaskDone { job, task: TaskId::random(), ended: None },
        Notice::TaskDone {
            job,
            task: TaskId::random(),
            ended: Some(Box::new(crate::TaskEnded {
                attempt: 2,
                state: flower_model::TaskState::Succeeded,
                report: Some("the report".into()),
                error: None,
                usage: flower_model::Usage { input_tokens: 3, output_tokens: 4, ..Default::default() },
                committed: false,
                changeset: false,
                workbench_untouched: true,
            })),
        },
        Notice::Cancel { job },
        Notice::Interrupt { job },
        Notice::TaskStreaming { job, task: TaskId::random() },
    ];
    for n in &sent {
        bus.notify(n.clone()).await.unwrap();
    }
    for s in [&mut s1, &mut s2] {
        for n in &sent {
            let heard = tokio::time::timeout(Duration::from_secs(5), s.recv()).await.expect("a notice in time");
            assert_eq!(heard, Heard::Notice(n.clone()));
        }
    }
}
