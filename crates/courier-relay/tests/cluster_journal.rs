//! The cluster mode's journal in JetStream (`docs/cluster.md`), against real `nats-server`
//! processes on loopback started by the tests (`common/nats.rs`).

mod common;

use async_nats::jetstream::{self, stream};
use common::nats::NatsCluster;

/// The harness itself: a three-server cluster keeps serving a replicated stream with one server
/// SIGKILLed, and the server comes back and catches up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicated_stream_keeps_serving_with_one_of_three_servers_killed() {
    let mut cluster = NatsCluster::start(3).await;
    let client = async_nats::connect(cluster.urls()).await.unwrap();
    let js = jetstream::new(client);
    let stream = js
        .create_stream(stream::Config {
            name: "harness".into(),
            subjects: vec!["harness.>".into()],
            num_replicas: 3,
            ..Default::default()
        })
        .await
        .unwrap();
    js.publish("harness.a", "one".into())
        .await
        .unwrap()
        .await
        .unwrap();
    cluster.kill(1);
    js.publish("harness.a", "two".into())
        .await
        .unwrap()
        .await
        .unwrap();
    cluster.restart(1).await;
    let last = stream
        .get_last_raw_message_by_subject("harness.a")
        .await
        .unwrap();
    assert_eq!(&last.payload[..], b"two");
    assert_eq!(last.sequence, 2);
}
