//! Both bus implementations against the one suite, plus the JetStream-specific
//! behaviours (heartbeats, the delivery limit).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
// A test reads top to bottom.
#![allow(clippy::too_many_lines)]

use std::time::Duration;

use flower_bus::conformance::msg;
use flower_bus::{Delivery, MemoryBus, NatsBus, NatsConfig, TaskQueue};

fn nats_url() -> String {
    std::env::var("FLOWER_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

/// A bus on its own stream and subjects, deleted afterwards.
struct ScratchBus(NatsBus);

impl ScratchBus {
    async fn new(ack_wait: Duration, max_attempts: u32) -> Self {
        let prefix = format!("flowertest_{}", uuid::Uuid::new_v4().simple());
        let mut config = NatsConfig::new(nats_url(), prefix);
        config.ack_wait = ack_wait;
        config.max_attempts = max_attempts;
        Self(NatsBus::connect(config).await.expect("NATS with JetStream on FLOWER_TEST_NATS_URL or 127.0.0.1:4222"))
    }
    async fn destroy(self) {
        self.0.destroy().await.unwrap();
    }
}

/// The suite, one test per check, against the in-process bus.
mod in_process {
    use super::*;

    async fn make() -> (MemoryBus, Duration) {
        (MemoryBus::new(), Duration::ZERO)
    }
    async fn teardown(_: MemoryBus) {}
    flower_bus::bus_conformance_tests!(make: make, teardown: teardown);
}

/// The suite, one test per check, each on a stream of its own.
mod nats_jetstream {
    use super::*;

    async fn make() -> (NatsBus, Duration) {
        (ScratchBus::new(Duration::from_secs(1), 5).await.0, Duration::from_secs(1))
    }
    async fn teardown(bus: NatsBus) {
        ScratchBus(bus).destroy().await;
    }
    flower_bus::bus_conformance_tests!(make: make, teardown: teardown);
}

#[tokio::test]
async fn heartbeats_keep_a_long_task_from_being_redelivered() {
    let bus = ScratchBus::new(Duration::from_secs(1), 3).await;
    bus.0.publish(msg()).await.unwrap();
    let held = bus.0.next().await.unwrap();
    // Hold it for three ack waits, beating every 300 ms; nobody else may get it.
    let competitor = tokio::time::timeout(Duration::from_secs(3), bus.0.next());
    let beating = async {
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_millis(300)).await;
            held.progress().await.unwrap();
        }
    };
    let (got, ()) = tokio::join!(competitor, beating);
    assert!(got.is_err(), "redelivered while its worker was alive and beating");
    held.ack().await.unwrap();
    bus.destroy().await;
}

#[tokio::test]
async fn the_delivery_past_the_limit_reaches_the_worker_to_terminate() {
    let bus = ScratchBus::new(Duration::from_secs(1), 2).await;
    let m = msg();
    bus.0.publish(m.clone()).await.unwrap();
    let mut seen = Vec::new();
    loop {
        let d: Box<dyn Delivery> = tokio::time::timeout(Duration::from_secs(10), bus.0.next()).await.unwrap().unwrap();
        seen.push(d.delivered());
        if d.delivered() > 2 {
            // What a worker does: record the failure without running, and drop it.
            d.term().await.unwrap();
            break;
        }
        d.nak(None).await.unwrap();
    }
    assert_eq!(seen, vec![1, 2, 3], "MaxDeliver is max_attempts + 1");
    bus.0.publish(msg()).await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(5), bus.0.next()).await.unwrap().unwrap();
    assert_ne!(next.message().task_id, m.task_id, "the terminated message is gone");
    next.ack().await.unwrap();
    bus.destroy().await;
}

/// A message whose last delivery is given back too is delivered no more: it
/// comes out as a dead letter (the server's advisory, kept in a stream of
/// its own), with the message still readable; settling it removes it from
/// the queue. Nothing else is a dead letter.
#[tokio::test]
async fn a_message_given_back_at_its_last_delivery_is_a_dead_letter() {
    // Naks redeliver at once; the ack wait only has to outlast the test (`held`).
    let bus = ScratchBus::new(Duration::from_secs(60), 1).await;
    let (kept, m) = (msg(), msg());
    bus.0.publish(kept.clone()).await.unwrap();
    let held = tokio::time::timeout(Duration::from_secs(10), bus.0.next()).await.unwrap().unwrap();
    bus.0.publish(m.clone()).await.unwrap();
    for expected in [1, 2] {
        let d = tokio::time::timeout(Duration::from_secs(10), bus.0.next()).await.unwrap().unwrap();
        assert_eq!((d.message().task_id, d.delivered()), (m.task_id, expected));
        d.nak(None).await.unwrap();
    }
    // A waiting consumer makes the server look at the message again: it is
    // past its limit, so the consumer gets nothing and the advisory goes out.
    let dead = tokio::select! {
        d = bus.0.next() => panic!("delivered past its limit: {:?}", d.map(|d| d.delivered())),
        dead = tokio::time::timeout(Duration::from_secs(20), bus.0.dead_letter()) => dead,
    };
    let dead = dead.expect("a dead letter within 20 s").unwrap();
    assert_eq!(dead.message().map(|t| t.task_id), Some(m.task_id));
    assert_eq!(dead.message().unwrap().body, m.body, "the whole message is readable");
    assert_eq!(dead.deliveries(), 2);
    // Still in the stream until settled (the consumer no longer counts it); then gone.
    let js = async_nats::jetstream::new(async_nats::connect(nats_url()).await.unwrap());
    let mut stream = js.get_stream(bus.0.config().stream_name()).await.unwrap();
    assert_eq!(stream.info().await.unwrap().state.messages, 2, "the held message and the dead one");
    assert_eq!(bus.0.lag().await.unwrap(), 1, "the held message only");
    dead.settle().await.unwrap();
    assert_eq!(stream.info().await.unwrap().state.messages, 1, "the held message only");
    held.ack().await.unwrap();
    assert_eq!(stream.info().await.unwrap().state.messages, 0);
    assert!(
        tokio::time::timeout(Duration::from_secs(1), bus.0.dead_letter()).await.is_err(),
        "one advisory, one dead letter"
    );
    bus.destroy().await;
}

/// The in-process queue has no delivery limit: it never gives up on a message.
#[tokio::test]
async fn the_in_process_queue_has_no_dead_letters() {
    let bus = MemoryBus::new();
    bus.publish(msg()).await.unwrap();
    for _ in 0..5 {
        bus.next().await.unwrap().nak(None).await.unwrap();
    }
    assert!(tokio::time::timeout(Duration::from_millis(200), bus.dead_letter()).await.is_err());
}

/// A worker slot that stops waiting (shutdown) leaves its pull request on
/// the server, which cannot be withdrawn there (server 2.9); only the
/// interest in its reply can be. The message published next must not go to
/// it: with an ack wait of a minute, a swallowed message would not come back
/// within this test. It reaches the next pull at once, a first delivery.
#[tokio::test]
async fn a_pull_given_up_keeps_no_message() {
    let bus = ScratchBus::new(Duration::from_secs(60), 3).await;
    assert!(tokio::time::timeout(Duration::from_millis(200), bus.0.next()).await.is_err(), "an empty queue");
    let m = msg();
    bus.0.publish(m.clone()).await.unwrap();
    let d = tokio::time::timeout(Duration::from_secs(5), bus.0.next()).await.expect("delivered at once").unwrap();
    assert_eq!((d.message(), d.delivered()), (&m, 1));
    d.ack().await.unwrap();
    bus.destroy().await;
}

/// Slots of one process waiting together, one of them giving up meanwhile:
/// every message still reaches a slot that waits, none is held back.
#[tokio::test]
async fn slots_waiting_together_each_get_a_message() {
    let bus = ScratchBus::new(Duration::from_secs(60), 3).await;
    let gives_up = tokio::time::timeout(Duration::from_millis(200), bus.0.next());
    let waits = [bus.0.next(), bus.0.next(), bus.0.next()];
    let publish = async {
        // Once the first slot gave up.
        assert!(gives_up.await.is_err(), "an empty queue");
        let sent = [msg(), msg(), msg()];
        for m in &sent {
            bus.0.publish(m.clone()).await.unwrap();
        }
        sent
    };
    let (sent, got) =
        tokio::join!(publish, tokio::time::timeout(Duration::from_secs(5), futures::future::join_all(waits)));
    let got: Vec<_> = got.expect("every waiting slot served").into_iter().map(|d| d.unwrap()).collect();
    let mut ids: Vec<_> = got.iter().map(|d| d.message().task_id).collect();
    let mut want: Vec<_> = sent.iter().map(|m| m.task_id).collect();
    ids.sort();
    want.sort();
    assert_eq!(ids, want);
    for d in got {
        d.ack().await.unwrap();
    }
    bus.destroy().await;
}

#[tokio::test]
async fn raw_round_trip_is_measured() {
    let bus = ScratchBus::new(Duration::from_secs(5), 3).await;
    let rtt = bus.0.raw_round_trip().await.unwrap();
    assert!(rtt > Duration::ZERO && rtt < Duration::from_secs(5), "{rtt:?}");
    bus.destroy().await;
}

/// A bus hearing only some notice kinds (a worker: cancels) is delivered no
/// other, while a bus hearing all gets every kind, in the order sent.
#[tokio::test]
async fn a_bus_hears_only_the_notice_kinds_it_asked_for() {
    use flower_bus::{Heard, Notice, NoticeKind, Notifier};
    let everything = ScratchBus::new(Duration::from_secs(1), 3).await;
    let mut config = everything.0.config().clone();
    config.hears = vec![NoticeKind::Cancel];
    let cancels_only = NatsBus::connect(config).await.unwrap();
    let (mut all, mut cancels) = (everything.0.subscribe(), cancels_only.subscribe());
    let job = flower_model::JobId::random();
    let task = flower_model::TaskId::random();
    let sent = [
        Notice::Events { job, seq: 3 },
        Notice::TaskDone { job, task, ended: None },
        Notice::TaskStreaming { job, task },
        Notice::Interrupt { job },
        Notice::Cancel { job },
    ];
    for n in &sent {
        cancels_only.notify(n.clone()).await.unwrap();
    }
    let within = Duration::from_secs(10);
    for n in &sent {
        let heard = tokio::time::timeout(within, all.recv()).await.expect("every kind is heard");
        assert_eq!(heard, Heard::Notice(n.clone()));
    }
    // The cancel was sent last: anything else would have come first.
    let first = tokio::time::timeout(within, cancels.recv()).await.expect("the cancel is heard");
    assert_eq!(first, Heard::Notice(Notice::Cancel { job }));
    drop(cancels_only);
    everything.destroy().await;
}
