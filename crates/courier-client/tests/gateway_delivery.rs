//! Two clients attached to one real gateway daemon (`start_gateway` on 127.0.0.1:0), configured
//! with nothing but `transports.gateway`, exchange messages end to end both ways.

mod support;

use std::sync::mpsc;

use courier_client::client::{Client, SendInput};
use courier_client::config::parse_protocol_config;
use courier_client::event::ClientEvent;
use courier_engine::Event;
use courier_relay::gateway::{GatewayAccess, GatewayToken};
use courier_relay::{start_gateway, GatewayConfig};
use serde_json::json;

async fn attached_client(address: &str, name: &str) -> (Client, mpsc::Receiver<ClientEvent>) {
    attached_client_with(json!({ "address": address }), name).await
}

/// A client configured with `gateway` as `transports.gateway`, once it is attached.
async fn attached_client_with(
    gateway: serde_json::Value,
    name: &str,
) -> (Client, mpsc::Receiver<ClientEvent>) {
    let config = parse_protocol_config(&json!({
        "appId": "gateway-e2e",
        "encryption": { "enabled": false },
        "storage": { "memory": true },
        "transports": { "gateway": gateway },
    }))
    .unwrap();
    let (client, events) = support::start(&config);
    support::wait_for(&events, &format!("{name} attached"), |e| {
        matches!(
            e,
            ClientEvent::GatewayStatusChanged {
                connected: true,
                attached: true
            }
        )
    })
    .await;
    (client, events)
}

/// `from` sends to `to`; `to` receives it over the gateway and `from` sees it delivered.
async fn exchange(
    (from, from_events): (&Client, &mpsc::Receiver<ClientEvent>),
    (to, to_events): (&Client, &mpsc::Receiver<ClientEvent>),
    text: &str,
) {
    let id = from
        .send(SendInput {
            recipient: to.local_address().to_owned(),
            content: text.to_owned(),
            ..Default::default()
        })
        .await
        .unwrap();
    let sender = from.local_address().to_owned();
    let received = support::wait_for(
        to_events,
        "the message",
        |e| matches!(e.engine(), Some(Event::MessageReceived { message, .. }) if message.id == id),
    )
    .await;
    let Some(Event::MessageReceived {
        message,
        sender: from_address,
        transport,
        ..
    }) = received.engine().cloned()
    else {
        unreachable!()
    };
    assert_eq!(message.content, text);
    assert_eq!(from_address, sender);
    assert_eq!(transport, "gateway");
    support::wait_for(from_events, "the delivery", |e| {
        matches!(e.engine(), Some(Event::MessageDelivered { message_id, transport, .. }) if *message_id == id && transport == "gateway")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_on_one_gateway_deliver_both_ways() {
    let gateway = start_gateway(GatewayConfig::new("127.0.0.1:0".parse().unwrap()))
        .await
        .unwrap();
    let address = gateway.local_addr().to_string();
    let (alice, alice_events) = attached_client(&address, "alice").await;
    let (bob, bob_events) = attached_client(&address, "bob").await;
    assert_eq!(alice.stats().carriers_up, 1);

    exchange((&alice, &alice_events), (&bob, &bob_events), "hello bob").await;
    exchange((&bob, &bob_events), (&alice, &alice_events), "hi alice").await;

    alice.stop().await;
    bob.stop().await;
    gateway.stop().await;
    // An honest gateway gives nothing to warn about.
    for events in [alice_events, bob_events] {
        let warned: Vec<_> = events
            .try_iter()
            .filter_map(|e| support::warning(&e))
            .collect();
        assert!(warned.is_empty(), "{warned:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_carrying_the_gateway_token_attach_and_deliver() {
    const TOKEN: &str = "a-shared-gateway-token";
    let mut config = GatewayConfig::new("127.0.0.1:0".parse().unwrap());
    config.access = GatewayAccess::Token(GatewayToken::new(TOKEN).unwrap());
    let gateway = start_gateway(config).await.unwrap();
    let address = gateway.local_addr().to_string();
    let transport = json!({ "address": address, "token": TOKEN });
    let (alice, alice_events) = attached_client_with(transport.clone(), "alice").await;
    let (bob, bob_events) = attached_client_with(transport, "bob").await;
    exchange((&alice, &alice_events), (&bob, &bob_events), "with a token").await;

    // Without it, the gateway refuses the attach and the client says so.
    let config = parse_protocol_config(&json!({
        "appId": "gateway-e2e",
        "encryption": { "enabled": false },
        "storage": { "memory": true },
        "transports": { "gateway": { "address": address } },
    }))
    .unwrap();
    let (eve, eve_events) = support::start(&config);
    support::wait_for(&eve_events, "the refusal", |e| {
        support::warning(e)
            .is_some_and(|(_, code, _)| code == "GATEWAY_ADDRESS_DECLARATION_REFUSED")
    })
    .await;
    assert_eq!(eve.stats().carriers_up, 0);
    eve.stop().await;
    alice.stop().await;
    bob.stop().await;
    gateway.stop().await;
}
