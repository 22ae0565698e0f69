//! Opening a relay connection: TCP and TLS, the WebSocket upgrade, `Authenticate` and its
//! answer, and the close frames the carrier writes.

use super::*;

/// Connects and authenticates. `Ok(None)` when the client stopped meanwhile.
pub(super) async fn connect(
    settings: &RelaySettings,
    url: &str,
    rx: &mut mpsc::UnboundedReceiver<RelayOut>,
    driver: &DriverTx,
    presence: &mut PresenceWatch,
) -> Result<Option<(Ws, Authenticated)>, Loss> {
    let attempt = async {
        let token = settings.token.token(driver).await.map_err(Loss::NoToken)?;
        let config = WebSocketConfig::default()
            .max_message_size(Some(MAX_FRAME_BYTES))
            .max_frame_size(Some(MAX_FRAME_BYTES));
        let connector = settings.tls.clone().map(Connector::Rustls);
        let (mut ws, _) = timeout(
            CONNECT_TIMEOUT,
            tokio_tungstenite::connect_async_tls_with_config(
                url,
                Some(config),
                // Frames are small and latency-bound: Nagle would hold an ACK for tens of ms.
                true,
                connector,
            ),
        )
        .await
        .map_err(|_| Loss::Dropped("connect timed out".into()))?
        .map_err(|e| Loss::Dropped(format!("connect failed: {e}")))?;
        let hello = ClientFrame::Authenticate {
            token,
            client_capabilities: Some(vec![CAP_MAILBOX.to_owned()]),
        };
        ws.send(WsMessage::text(hello.encode()))
            .await
            .map_err(|e| Loss::Dropped(format!("write failed: {e}")))?;
        let auth = timeout(AUTH_TIMEOUT, await_authenticated(&mut ws))
            .await
            .map_err(|_| Loss::Dropped("no answer to Authenticate".into()))??;
        Ok((ws, auth))
    };
    tokio::pin!(attempt);
    loop {
        tokio::select! {
            result = &mut attempt => return result.map(Some),
            cmd = rx.recv() => match cmd {
                None | Some(RelayOut::Stop) => return Ok(None),
                Some(RelayOut::Reconnect) => return Err(Loss::Reconnect),
                Some(RelayOut::Hint(_) | RelayOut::TokenChanged) => {}
                Some(cmd) => refuse_while_down(cmd, driver, presence),
            },
        }
    }
}

pub(super) struct Authenticated {
    pub username: String,
    pub address_challenge: Option<String>,
    pub capabilities: Vec<String>,
    pub rate_limit: Option<courier_proto::RateLimitInfo>,
}

pub(super) async fn await_authenticated(ws: &mut Ws) -> Result<Authenticated, Loss> {
    while let Some(msg) = ws.next().await {
        let msg = match msg {
            Ok(msg) => msg,
            Err(e) => {
                if let Some(code) = close_code_for(&e) {
                    let _ = ws.send(close_message(code, "")).await;
                }
                return Err(Loss::Dropped(format!("read failed: {e}")));
            }
        };
        match msg {
            WsMessage::Text(text) => match RelayFrame::decode(text.as_str()) {
                Ok(RelayFrame::Authenticated {
                    username,
                    address_challenge,
                    capabilities,
                    rate_limit,
                    ..
                }) => {
                    return Ok(Authenticated {
                        username,
                        address_challenge,
                        capabilities: bounded_capabilities(capabilities),
                        rate_limit,
                    });
                }
                // The relay's words go into a diagnostic and the `auth_failed` event.
                Ok(RelayFrame::AuthError { reason }) => {
                    return Err(Loss::AuthRejected(courier_proto::quoted(&reason)))
                }
                _ => {}
            },
            WsMessage::Close(frame) => return Err(close_loss(frame.as_ref())),
            _ => {}
        }
    }
    Err(Loss::Dropped("closed before Authenticated".into()))
}

/// At most 64 tokens of at most 128 bytes (`docs/protocol.md#capabilities`); longer ones discarded,
/// extra ones ignored.
pub(super) fn bounded_capabilities(tokens: Vec<String>) -> Vec<String> {
    tokens
        .into_iter()
        .filter(|t| t.len() <= MAX_CAPABILITY_BYTES)
        .take(MAX_CAPABILITIES)
        .collect()
}

/// The close code a read error calls for (`docs/protocol.md#close-codes`): a message over 1 MiB, or
/// invalid UTF-8. Other errors leave nobody to tell.
pub(super) fn close_code_for(error: &WsError) -> Option<u16> {
    match error {
        WsError::Capacity(_) => Some(close::TOO_BIG),
        WsError::Utf8(_) => Some(close::INVALID_UTF8),
        _ => None,
    }
}

pub(super) fn close_message(code: u16, reason: &str) -> WsMessage {
    WsMessage::Close(Some(CloseFrame {
        code: CloseCode::from(code),
        reason: reason.into(),
    }))
}

pub(super) fn close_loss(frame: Option<&CloseFrame>) -> Loss {
    match frame.map(|f| u16::from(f.code)) {
        Some(close::SUPERSEDED) => Loss::Superseded("close_4000".into()),
        Some(close::AUTH_FAILED) => Loss::AuthRejected("rejected".into()),
        Some(code) => Loss::Dropped(format!("closed by relay ({code})")),
        None => Loss::Dropped("closed by relay".into()),
    }
}

pub(super) fn diagnostic(driver: &DriverTx, level: DiagnosticLevel, message: String) {
    report::diagnostic(driver, "courier_client::relay", level, message);
}
